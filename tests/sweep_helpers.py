"""A toy sweep for the launcher tests (tests/test_launch.py, tests/test_slurm_cluster.py): a real
byte-level BPE dataset from the language reference that ships with Python, and a 2 x 2 compare config."""

from __future__ import annotations

import json
from pathlib import Path

from tablefree.config_parsing import from_dict
from tablefree.sweep.config import CompareConfig

RECIPE = {
    "model": {"preset": "tiny", "d_model": 32, "n_layers": 1, "n_heads": 2, "d_ff": 64},
    "budget": "8 steps",
    "batch_tokens": 512,
    "micro_batch": 8,
    "seq_len": 64,
    "optim": {"lr": 2e-3},
    "schedule": {"name": "cosine", "warmup_steps": 2},
    "log_every": 1,
    "val_every": 1000,
    "val_batches": 2,
    "checkpoint_every": 1000,
}

# the branched-budget toy recipe (tests/test_compare_branch.py, tests/test_sweep_trips.py): wsd, pinned arithmetic
BRANCH_RECIPE = {
    "model": {"preset": "tiny", "d_model": 32, "n_layers": 1, "n_heads": 2, "d_ff": 64, "max_seq_len": 32},
    "batch_tokens": 256,
    "micro_batch": 8,
    "seq_len": 32,
    "optim": {"lr": 3e-3},
    "schedule": {"name": "wsd", "warmup_steps": 2, "decay_fraction": 0.25},
    "compile": False,
    "precision": "fp32",
    "log_every": 1,
    "val_every": 4,
    "val_batches": 2,
}


def topics_dataset(root: Path) -> Path:
    from pydoc_data.topics import topics

    from tablefree.data.prepare import prepare_dataset

    corpus = root / "topics.jsonl"
    corpus.write_text(
        "".join(json.dumps({"text": topics[k]}) + "\n" for k in sorted(topics)), encoding="utf-8"
    )
    prepare_dataset(corpus, root / "topics-512", vocab_size=512, val_fraction=0.1, workers=1, progress=False)
    return root / "topics-512"


def config(dataset: Path, out: Path, backend: str = "slurm", **recipe) -> CompareConfig:
    data = {
        "name": "toy",
        "train": {**RECIPE, **recipe},
        "dataset": {"dir": str(dataset)},
        "interfaces": ["learned", "canonical"],
        "seeds": [0, 1],
        "eval": {"tasks": ["validation"], "val_limit": 4},
        "launch": {"backend": backend, "slurm": {"executor": "local", "signal_delay_s": 30}},
        "out": str(out),
        "bootstrap": 200,
    }
    return from_dict(CompareConfig, data)


def logged_step(run_dir: Path, step: int) -> bool:
    """Whether the run in ``run_dir`` has logged optimizer step ``step`` (the toy recipes log every step; a
    training process holds there under $TABLEFREE_FAULT_HOLD_AFTER_STEP until its stop signal arrives)."""
    metrics = run_dir / "metrics.jsonl"
    return metrics.exists() and any(
        json.loads(line).get("step") == step for line in metrics.read_text().splitlines() if line.strip()
    )
