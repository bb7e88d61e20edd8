"""Checking a prepared dataset against its manifest (``tablefree data verify``, and training before it starts).

Only the manifest, the shard headers and (with hashes) the shards' and tokenizer's bytes are read: no torch, so
``tablefree data verify`` starts as fast as the other ``data`` verbs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tablefree.data.documents import split_rule_name
from tablefree.data.records import read_manifest
from tablefree.data.shards import open_shard, read_header
from tablefree.data.tokenizer import tokenizer_hash
from tablefree.fileio import sha256_file

AUTO_HASH_BYTES = 2 << 30  # verify_dataset(hashes="auto") hashes datasets up to 2 GiB (about a second per GB)


@dataclass
class DatasetCheck:
    """What :func:`verify_dataset` checked and found."""

    data_dir: Path
    shards: int = 0
    tokens: int = 0
    bytes: int = 0
    hashed: bool = False
    split_rule: str | None = None  # by name (documents.split_rule_name); None for adopted shards
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def format(self) -> str:
        what = "sizes, headers, sha256 and token ids" if self.hashed else "sizes and headers"
        rule = f", split rule {self.split_rule}" if self.split_rule else ""
        head = (
            f"{self.data_dir}: {self.shards} shards, {self.tokens:,} tokens, {self.bytes / 1e6:.1f} MB{rule}; "
            f"checked {what}"
        )
        if self.ok:
            return f"{head}: ok"
        return "\n".join([f"{head}: {len(self.problems)} problem(s)", *(f"  {p}" for p in self.problems)])


def verify_dataset(
    data_dir: str | Path, hashes: bool | str = True, manifest: dict | None = None
) -> DatasetCheck:
    """Check a prepared dataset against its manifest: every shard present, its header valid and its token
    count the manifest's; with ``hashes`` also each shard's sha256, its token ids below ``vocab_size``, and
    the tokenizer file's hash. ``hashes="auto"``: only when the shards total at most ``AUTO_HASH_BYTES``
    (cheap enough before a long run). Problems are collected, not raised (a malformed manifest raises).
    ``manifest``: the dataset's, already read (``Dataset``)."""
    data_dir = Path(data_dir)
    manifest = read_manifest(data_dir) if manifest is None else manifest
    check = DatasetCheck(data_dir, split_rule=split_rule_name(manifest.get("settings")))
    files = [(name, shard) for name, split in manifest["splits"].items() for shard in split["shards"]]
    sizes = {}
    for name, shard in files:
        path = data_dir / shard["file"]
        try:
            _, count = read_header(path)
        except (OSError, ValueError) as error:
            check.problems.append(f"{name}: {error}")
            continue
        if count != shard["tokens"]:
            check.problems.append(
                f"{name}: {path} holds {count:,} tokens, the manifest says {shard['tokens']:,}"
            )
        sizes[path] = path.stat().st_size
    check.shards, check.bytes = len(files), sum(sizes.values())
    check.tokens = sum(shard["tokens"] for _, shard in files)
    check.hashed = hashes is True or (hashes == "auto" and check.bytes <= AUTO_HASH_BYTES)
    if check.hashed:
        check.problems += _hash_problems(data_dir, manifest, files, sizes)
    return check


def _hash_problems(data_dir: Path, manifest: dict, files: list, sizes: dict) -> list[str]:
    problems = []
    vocab = manifest.get("vocab_size")
    for name, shard in files:
        path = data_dir / shard["file"]
        if path not in sizes:
            continue  # already reported
        if "sha256" in shard and sha256_file(path) != shard["sha256"]:
            problems.append(f"{name}: {path} does not match the sha256 in the manifest (damaged or replaced)")
        tokens = open_shard(path)
        if vocab is not None and len(tokens) and int(tokens.max()) >= vocab:
            problems.append(f"{name}: {path} holds token id {int(tokens.max())}, outside vocab_size {vocab}")
    tokenizer_file = manifest.get("tokenizer_file")
    if tokenizer_file and "tokenizer_hash" in manifest:
        path = data_dir / tokenizer_file
        try:
            if tokenizer_hash(path) != manifest["tokenizer_hash"]:
                problems.append(f"tokenizer: {path} is not the tokenizer the manifest records")
        except (OSError, ValueError) as error:
            problems.append(f"tokenizer: {error}")
    return problems
