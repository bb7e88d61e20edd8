"""``benchmarks/rehearse.sh`` at tiny width on the CPU: configs/paper-1.7b.yaml itself (the model shape shrunk,
the budget cut) on real prepared data with a V = 49,152 tokenizer: FSDP2 over 2 processes with sharded
checkpoints, ``kill -9``, resumed on 2 processes and then on 1 (resharded), the losses equal to the
uninterrupted run's; the sharded checkpoint exported (and loaded by transformers), evaluated and generated from."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def test_the_rehearsal_of_the_paper_config_passes_every_step(tmp_path, shared_data) -> None:
    out = tmp_path / "out"
    env = dict(os.environ, PYTHON=sys.executable, OMP_NUM_THREADS="1")
    corpus = shared_data / "corpus" / "gutenberg-mix"
    command = [
        "bash", "benchmarks/rehearse.sh", "--tokenizer-corpus", str(corpus / "quotations"),
        "--corpus", str(corpus / "holidays"), str(out),
    ]  # fmt: skip
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    record = json.loads((out / "rehearsal.json").read_text())
    assert record["ok"] and record["config"] == "configs/paper-1.7b.yaml" and record["processes"] == 2
    phases = {phase["phase"]: phase for phase in record["phases"]}
    assert all(phase["status"] == "ok" for phase in phases.values())
    assert phases["data"]["vocab_size"] == 49_152
    assert list(phases) == [
        "data", "reference", "killed after step 4 (2 processes)", "resumed on 2 processes, killed after step 8",
        "resumed on 1 process (resharded) to the end", "losses", "export", "eval", "generate",
    ]  # fmt: skip
    losses = phases["losses"]["losses"]
    assert losses["steps"] == 12 and losses["exact_steps"] == 8 and losses["exactly_equal"]
    assert losses["max_relative_difference_after_resharding"] <= 1e-5
    assert losses["final_train_loss"] < losses["first_train_loss"]  # it trained
    assert phases["export"]["logits"]["ok"] and phases["export"]["logits"]["max_relative_difference"] <= 1e-5
    assert phases["eval"]["validation"]["val_loss"] > 0 and phases["generate"]["text"].strip()
    # every override the rehearsal made is recorded, and the model shape and budget are among them
    assert "budget=12 steps" in record["overrides"] and "model.d_model=128" in record["overrides"]
    assert sorted(p.name for p in out.iterdir()) == ["phases.jsonl", "rehearsal.json", "rehearsal.log"]
