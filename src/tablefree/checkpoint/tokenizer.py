"""A checkpoint's tokenizer: the one whose hash its ``meta.json`` records (eval, export, generate, analyze and
the lm-eval adapter all read it through :func:`checked_tokenizer`)."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

from tablefree.checkpoint.layout import META_FILE, TOKENIZER_FILE
from tablefree.data.tokenizer import load_tokenizer, tokenizer_hash
from tablefree.fileio import read_json


def checked_tokenizer(directory: Path, tokenizer: str | Path | None = None) -> tuple[Tokenizer, str]:
    """(tokenizer, its hash) for a checkpoint directory: the one whose hash the checkpoint recorded (eval, export,
    generate, analyze and the lm-eval adapter all use this); one that differs from that record, or from the
    checkpoint's own tokenizer.json, is refused with one line."""
    meta = read_json(directory / META_FILE) if (directory / META_FILE).exists() else {}
    if not isinstance(meta, dict):
        raise ValueError(f"{directory / META_FILE}: expected a JSON object, got {type(meta).__name__}")
    recorded = meta.get("tokenizer_hash")
    own_file = directory / TOKENIZER_FILE
    if tokenizer is None and not own_file.exists():
        raise FileNotFoundError(f"{directory}: no {TOKENIZER_FILE} in the checkpoint; pass --tokenizer PATH")
    source = own_file if tokenizer is None else tokenizer
    tok = load_tokenizer(str(source))
    digest = tokenizer_hash(tok)
    if recorded is not None and digest != recorded:
        raise ValueError(
            f"tokenizer {source} (sha256 {digest[:12]}…) does not match the tokenizer_hash "
            f"{recorded[:12]}… recorded in {directory / META_FILE}; refusing to use it"
        )
    if tokenizer is not None and own_file.exists():
        own = tokenizer_hash(load_tokenizer(str(own_file)))
        if own != digest:
            raise ValueError(
                f"tokenizer {source} (sha256 {digest[:12]}…) differs from the checkpoint's own "
                f"{own_file} ({own[:12]}…); refusing to use it"
            )
    return tok, digest
