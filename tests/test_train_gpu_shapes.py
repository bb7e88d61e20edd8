"""The exact ``paper-1.7b`` layer shapes (d=2048, 32 heads, SwiGLU 8192, V=49,152), one layer, trained for 2
steps through the trainer on the CPU with the GPU run's settings: seq 2048, micro-batch 1, bf16 autocast,
torch.compile and activation checkpointing. What fails at these shapes fails here, not on a lent GPU."""

from __future__ import annotations

import math
import resource

import pytest

from tablefree.model_config import preset
from tablefree.train.trainer import train
from train_helpers import make_dataset, micro_config

pytestmark = pytest.mark.slow

PAPER = preset("paper-1.7b")
SEQ = 2048


def test_paper_layer_shapes_train_two_steps_with_bf16_compile_and_checkpointing(tmp_path) -> None:
    data_dir = make_dataset(
        tmp_path / "data",
        vocab_size=PAPER.vocab_size,
        train_tokens=4 * (SEQ + 1),
        val_tokens=SEQ + 1,
        shards=1,
    )
    config = micro_config(
        data_dir,
        **{
            "model.preset": "paper-1.7b",
            "model.interface.name": "canonical",  # no V×d table: keeps the test's memory down
            "model.n_layers": 1,
            "model.d_model": "null",  # the preset's shapes, not micro_config's
            "model.n_heads": "null",
            "model.d_ff": "null",
            "model.max_seq_len": "null",
        },
        seq_len=SEQ,
        micro_batch=1,
        batch_tokens=SEQ,
        budget="2 steps",
        precision="bf16",
        compile=True,
        activation_checkpointing=True,
        device="cpu",
        val_batches=1,
        checkpoint_format="none",  # a 1.8 GB checkpoint would only cost time here
        **{"schedule.warmup_steps": 1},
    )
    summary = train(config, tmp_path / "run")

    model = summary["params"]
    assert summary["completed"] and summary["step"] == 2 and summary["precision"] == "bf16"
    assert model["attention"] == 4 * PAPER.d_model * PAPER.n_heads * PAPER.head_dim  # wq wk wv wo, 32 heads
    assert model["mlp"] == 3 * PAPER.d_model * PAPER.d_ff  # SwiGLU 2048 -> 8192
    assert model["head"] == PAPER.d_model * PAPER.vocab_size  # 49,152
    assert summary["tokens_seen"] == 2 * SEQ
    assert math.isfinite(summary["final_train_loss"]) and math.isfinite(summary["final_val_loss_estimate"])
    # an untrained model predicts about uniformly over V: the loss starts near ln V, and stays there
    assert abs(summary["final_train_loss"] - math.log(PAPER.vocab_size)) < 1.5
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9
    assert peak_gb < 8, f"peak resident memory {peak_gb:.1f} GB"
