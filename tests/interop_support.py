"""Helpers for the interoperability tests: a real byte-level BPE tokenizer and small checkpoints."""

from __future__ import annotations

from pathlib import Path

import torch

from tablefree.checkpoint.model_dir import save_model
from tablefree.data.tokenizer import tokenizer_hash, train_tokenizer_from_texts
from tablefree.model import TablefreeLM, build_model
from tablefree.model_config import ModelConfig

REPO = Path(__file__).resolve().parents[1]


def repo_texts() -> list[str]:
    """English-ish text that ships with the project (docs and module docstrings), for offline tokenizers."""
    files = sorted((REPO / "docs").glob("*.md")) + sorted((REPO / "src" / "tablefree").rglob("*.py"))
    return [path.read_text(encoding="utf-8") for path in files]


def make_tokenizer(path: Path, vocab_size: int = 512, texts: list[str] | None = None) -> Path:
    """Train our byte-level BPE (tablefree.data.tokenizer) and save it as ``path``."""
    train_tokenizer_from_texts(texts or repo_texts(), vocab_size, path)
    return path


def randomize(model: TablefreeLM, seed: int, std: float = 0.15) -> TablefreeLM:
    """Give every parameter, norm gains included, distinct random values (so a swapped or misplaced weight
    changes the output) at a scale where logits are far from uniform."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            param.copy_(1.0 + 0.3 * noise if name.endswith("norm.weight") else std * noise)
    return model


def make_checkpoint(
    directory: Path, config: ModelConfig, tokenizer_path: Path | None, seed: int = 0, meta: dict | None = None
) -> TablefreeLM:
    """A randomized model saved as a complete checkpoint (with the tokenizer and its hash, as training does)."""
    model = randomize(build_model(config, seed=seed), seed)
    meta = {"step": 0, "tokens_seen": 0, **(meta or {})}
    if tokenizer_path is not None:
        meta["tokenizer_hash"] = tokenizer_hash(tokenizer_path)
    save_model(directory, model, meta=meta, tokenizer_path=tokenizer_path)
    return model.eval()
