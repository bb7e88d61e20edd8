"""Helpers for the training tests: a small synthetic dataset in the agreed manifest format, micro recipes, the
`tablefree train` command line, and a recorded training run."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, models, pre_tokenizers

from tablefree.data.shards import write_shard
from tablefree.data.tokenizer import tokenizer_hash


def write_tokenizer(path: Path, vocab_size: int) -> str:
    """A word-level tokenizer over ``t0 .. t{V-2}`` plus ``<|endoftext|>``; returns its sha256 hash."""
    vocab = {f"t{i}": i for i in range(vocab_size - 1)}
    vocab["<|endoftext|>"] = vocab_size - 1
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<|endoftext|>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(path))
    return tokenizer_hash(tokenizer)


def markov_tokens(n: int, vocab_size: int, seed: int) -> np.ndarray:
    """A learnable stream: each token mostly follows a fixed successor of the previous one."""
    rng = np.random.default_rng(seed)
    successor = rng.permutation(vocab_size)
    tokens = np.empty(n, dtype=np.int64)
    tokens[0] = 0
    noise = rng.random(n) < 0.2
    random_tokens = rng.integers(0, vocab_size, n)
    for i in range(1, n):
        tokens[i] = random_tokens[i] if noise[i] else successor[tokens[i - 1]]
    return tokens


def make_dataset(
    directory: Path,
    vocab_size: int = 96,
    train_tokens: int = 40_000,
    val_tokens: int = 4_000,
    shards: int = 2,
) -> Path:
    """Write shards, tokenizer.json and manifest.json (last) into ``directory``; return it."""
    directory.mkdir(parents=True, exist_ok=True)
    token_hash = write_tokenizer(directory / "tokenizer.json", vocab_size)
    splits = {}
    for split, total, seed in (("train", train_tokens, 1), ("val", val_tokens, 2)):
        stream = markov_tokens(total, vocab_size, seed)
        entries = []
        for index, part in enumerate(np.array_split(stream, shards if split == "train" else 1)):
            name = f"{split}_{index:06d}.bin"
            write_shard(directory / name, part, vocab_size)
            digest = hashlib.sha256((directory / name).read_bytes()).hexdigest()
            entries.append({"file": name, "tokens": int(part.size), "sha256": digest})
        splits[split] = {"shards": entries, "tokens": int(total), "documents": 1}
    manifest = {
        "version": 1,
        "tokenizer_hash": token_hash,
        "tokenizer_file": "tokenizer.json",
        "vocab_size": vocab_size,
        "eot_id": vocab_size - 1,
        "splits": splits,
        "sources": ["synthetic markov chain"],
    }
    (directory / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return directory


def micro_config(data_dir: Path, **overrides):
    """A TrainConfig for a very small model that trains in a second or two on a CPU."""
    from tablefree.config_parsing import apply_overrides, from_dict
    from tablefree.train.recipe import TrainConfig

    data = {
        "model": {
            "preset": "tiny",
            "d_model": 32,
            "n_layers": 2,
            "n_heads": 2,
            "d_ff": 64,
            "max_seq_len": 32,
        },
        "data": {"dir": str(data_dir)},
        "budget": "8 steps",
        "batch_tokens": 256,
        "micro_batch": 4,
        "seq_len": 32,
        "optim": {"lr": 3e-3},
        "schedule": {"name": "cosine", "warmup_steps": 2},
        "log_every": 1,
        "val_batches": 2,
        # fp32 on every machine: `auto` picks bf16 on CPUs that multiply it natively and faster, and the tests
        # compare runs with each other and with hand computations to fp32 rounding
        "precision": "fp32",
    }
    data = apply_overrides(data, [f"{k}={v}" for k, v in overrides.items()])
    return from_dict(TrainConfig, data, where="test config")


def write_config(path: Path, config) -> Path:
    """Save a TrainConfig as YAML for the command line."""
    import yaml

    from tablefree.config_parsing import to_dict

    path.write_text(yaml.safe_dump(to_dict(config), sort_keys=False))
    return path


def train_command(config_path: Path, run_dir: Path, *extra: str) -> list[str]:
    """``tablefree train --config CONFIG --run-dir RUN_DIR EXTRA…`` as a subprocess command line."""
    return [
        sys.executable,
        "-m",
        "tablefree.cli",
        "train",
        "--config",
        str(config_path),
        "--run-dir",
        str(run_dir),
        *extra,
    ]


def record_run(monkeypatch, config, run_dir: Path) -> tuple[dict, dict]:
    """Train, capturing the freshly initialised weights, every micro-batch's targets and the logits' dtype.
    Ends with ``monkeypatch.undo()``, which also undoes the caller's own patches."""
    import torch.nn.functional as F

    from tablefree import model as model_module
    from tablefree.train import trainer

    captured = {"init": None, "targets": []}
    real_build, real_loss = trainer.build_model, model_module.chunked_next_token_loss

    def build_model(*args, **kwargs):
        model = real_build(*args, **kwargs)
        captured["init"] = {k: v.clone() for k, v in model.state_dict().items()}
        return model

    def loss(hidden, head_weight, targets, reduction="mean", chunk_tokens=None):
        if reduction == "mean":  # training; validation asks for per-token losses
            captured["targets"].append(targets.clone())
            # the dtype the head's logits get here (under autocast, its dtype), from one position
            captured.setdefault("logits_dtype", F.linear(hidden[:1, :1], head_weight).dtype)
        return real_loss(hidden, head_weight, targets, reduction, chunk_tokens)

    monkeypatch.setattr(trainer, "build_model", build_model)
    monkeypatch.setattr(model_module, "chunked_next_token_loss", loss)
    try:
        summary = trainer.train(config, run_dir)
    finally:
        monkeypatch.undo()
    return captured, summary


def cli_env(threads: int = 1) -> dict[str, str]:
    """Environment for training subprocesses: fixed thread count (bit-exact comparisons need the same one)."""
    import os

    env = dict(os.environ)
    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
    env.pop("TABLEFREE_FAULT_KILL_AFTER_STEP", None)
    return env


def train_losses(run_dir: Path) -> dict[int, float]:
    """step -> train_loss from a run's metrics.jsonl."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["train_loss"] for r in records if "train_loss" in r}
