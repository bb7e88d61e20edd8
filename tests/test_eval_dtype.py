"""Evaluation precision (``run_eval(dtype=...)``, ``tablefree eval --dtype``): bf16 scores track fp32 on the
real benchmark files, and a prediction may change only where fp32 itself nearly ties."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from tablefree import build_model, preset
from tablefree.checkpoint.model_dir import save_model
from tablefree.cli import main as cli_main
from tablefree.data.tokenizer import tokenizer_hash
from tablefree.evaluate import EvalSpec, run_eval

REPO = Path(__file__).resolve().parents[1]
# A flipped prediction is a near-tie when fp32's two log-likelihoods differ by less than this (nats). bf16
# autocast perturbs each summed log-likelihood by about 0.01-0.05 nats on these short continuations.
NEAR_TIE_NATS = 0.25


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    text = "".join(p.read_text(encoding="utf-8") for p in sorted((REPO / "src").rglob("*.py")))[:40_000]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([text], trainer=trainer)
    config = preset("tiny", vocab_size=400, d_model=64, n_layers=2, n_heads=2, d_ff=128, max_seq_len=256)
    model = build_model(config, seed=0).eval()
    root = tmp_path_factory.mktemp("eval_dtype")
    tokenizer.save(str(root / "tok.json"))
    meta = {"step": 0, "tokens_seen": 0, "tokenizer_hash": tokenizer_hash(tokenizer)}
    return save_model(root / "step_00000000", model, meta=meta, tokenizer_path=root / "tok.json")


def scores(checkpoint: Path, shared_data: Path, dtype: str, out: Path) -> tuple[dict, dict]:
    results = run_eval(
        EvalSpec(
            checkpoint,
            ["hellaswag", "piqa"],
            data_dir=shared_data / "eval",
            limit=20,
            dtype=dtype,
            examples_out=out,
            bootstrap_iters=0,
        )
    )
    records = [json.loads(line) for line in out.read_text().splitlines()]
    return results, {(r["task"], r["doc_id"]): r["loglikelihoods"] for r in records}


def argmax(values: list[float]) -> int:
    return max(range(len(values)), key=values.__getitem__)


def test_bf16_evaluation_tracks_fp32_and_flips_only_near_ties(checkpoint, shared_data, tmp_path) -> None:
    fp32_results, fp32 = scores(checkpoint, shared_data, "fp32", tmp_path / "fp32.jsonl")
    bf16_results, bf16 = scores(checkpoint, shared_data, "bf16", tmp_path / "bf16.jsonl")
    assert (fp32_results["dtype"], bf16_results["dtype"]) == ("fp32", "bf16")
    assert fp32.keys() == bf16.keys() and len(fp32) == 40
    deltas = [abs(a - b) for key in fp32 for a, b in zip(fp32[key], bf16[key], strict=True)]
    assert max(deltas) > 0  # bf16 really ran
    for key in fp32:
        assert bf16[key] == pytest.approx(fp32[key], rel=0.02, abs=0.1), key
        a, b = argmax(fp32[key]), argmax(bf16[key])
        if a != b:  # a flip: fp32 must nearly tie between the two choices
            assert abs(fp32[key][a] - fp32[key][b]) < NEAR_TIE_NATS, key


def test_eval_dtype_option(checkpoint, shared_data, tmp_path, capsys) -> None:
    out = tmp_path / "results.json"
    args = [
        "eval",
        str(checkpoint),
        "--tasks",
        "piqa",
        "--limit",
        "2",
        "--eval-data",
        str(shared_data / "eval"),
    ]
    assert cli_main([*args, "--dtype", "auto", "--out", str(out), "--bootstrap-iters", "0"]) == 0
    results = json.loads(out.read_text())
    assert results["dtype"] in ("fp32", "bf16") and results["dtype_reason"].startswith("auto")
    with pytest.raises(SystemExit):
        cli_main([*args, "--dtype", "fp16"])
    with pytest.raises(ValueError, match="dtype"):
        run_eval(EvalSpec(checkpoint, ["piqa"], data_dir=shared_data / "eval", limit=1, dtype="half"))
    assert torch.get_default_dtype() == torch.float32
