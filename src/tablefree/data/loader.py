"""The training loader: (input, target) int64 windows from memory-mapped shards.

Each split is cut into non-overlapping chunks of ``seq_len + 1`` tokens (inputs and their shifted targets);
chunks never cross a shard boundary. Chunks are addressed by a global *slot* number: micro-step m of a run
with world size W and per-rank batch B uses slots [m·B·W, (m+1)·B·W), and rank r takes the r-th block of B.
So ranks get disjoint data, and a run with the same global batch sees the same samples per optimizer step
whatever its world size. Slot s maps to chunk ``perm_e(s mod N)`` in epoch e = s // N, where ``perm_e`` is a
seeded pseudo-random permutation (``shuffle=True``, the "random windows" mode) or the identity (a sequential
pass). The permutation is a Feistel network, so it needs O(1) memory however large N is.

The loader's only state is the next micro-step number, so a resumed run sees exactly the batches it would have
seen: ``state_dict()`` / ``load_state_dict()``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tablefree.data.records import MANIFEST, read_manifest, read_manifest_documents
from tablefree.data.shards import open_shard, read_header
from tablefree.data.verify import DatasetCheck, verify_dataset


@dataclass(frozen=True)
class Dataset:
    """A prepared dataset: its directory and its manifest, read once (``Dataset.open``)."""

    directory: Path
    manifest: dict

    @classmethod
    def open(cls, directory: str | Path) -> Dataset:
        return cls(Path(directory), read_manifest(directory))

    @property
    def vocab_size(self) -> int:
        return int(self.manifest["vocab_size"])

    @property
    def tokenizer_hash(self) -> str | None:
        return self.manifest.get("tokenizer_hash")

    @property
    def tokenizer_path(self) -> Path:
        return self.directory / self.manifest.get("tokenizer_file", "tokenizer.json")

    def verify(self, hashes: bool | str = True) -> DatasetCheck:
        return verify_dataset(self.directory, hashes, manifest=self.manifest)

    def loader(self, split: str, seq_len: int, batch_size: int, **kwargs: Any) -> TokenLoader:
        return TokenLoader.from_dir(
            self.directory, split, seq_len, batch_size, manifest=self.manifest, **kwargs
        )


def split_shards(data_dir: str | Path, split: str) -> list[Path]:
    """The shard files of one split, in order, as listed by the manifest."""
    return [
        Path(data_dir) / shard["file"]
        for shard in _split_info(read_manifest(data_dir), data_dir, split)["shards"]
    ]


COUNT_CHUNK = 1 << 24  # tokens per bincount: bounded memory on large shards


def token_counts(data_dir: str | Path, vocab_size: int, split: str = "train") -> np.ndarray:
    """How often each id in [0, vocab_size) occurs in a prepared dataset's split (int64)."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for path in split_shards(data_dir, split):
        tokens = open_shard(path)
        for start in range(0, len(tokens), COUNT_CHUNK):
            chunk = np.asarray(tokens[start : start + COUNT_CHUNK])
            if chunk.size and int(chunk.max()) >= vocab_size:
                raise ValueError(
                    f"{path}: token id {int(chunk.max())} is outside the model's [0, {vocab_size})"
                )
            counts += np.bincount(chunk, minlength=vocab_size)
    return counts


def _split_info(manifest: dict, data_dir: str | Path, split: str) -> dict:
    splits = manifest["splits"]
    if split not in splits:
        raise ValueError(f"{Path(data_dir) / MANIFEST}: no split {split!r}; it has {sorted(splits)}")
    return splits[split]


def split_windows(manifest: dict, data_dir: str | Path, split: str, seq_len: int) -> int:
    """The windows of ``seq_len + 1`` tokens a split's ``TokenLoader`` reads, from the manifest's shard sizes."""
    return sum(
        shard_windows(shard["tokens"], seq_len) for shard in _split_info(manifest, data_dir, split)["shards"]
    )


def shard_windows(tokens: int, seq_len: int) -> int:
    """The windows of ``seq_len + 1`` tokens (inputs and their next-token targets) a shard of ``tokens`` holds."""
    return max(0, (tokens - 1) // seq_len)


def document_bounds(data_dir: str | Path, split: str = "val") -> np.ndarray:
    """Document boundaries of a split's token stream (its shards concatenated in order): an int64 array
    ``b`` of N + 1 offsets, document j being tokens ``[b[j], b[j+1])`` (its first token is the EOT that
    precedes it). For per-document validation losses: a target token at stream position p belongs to the
    document j with ``b[j] <= p < b[j+1]``. Read from the manifest (``splits.val.document_starts``, recorded
    by ``data prepare``); otherwise (train, adopted or older datasets) found as the EOT positions, which is
    the same unless a document's text holds the literal end-of-text string."""
    manifest = read_manifest(data_dir)
    return _document_bounds(data_dir, manifest, split)


def _document_bounds(data_dir: str | Path, manifest: dict, split: str) -> np.ndarray:
    info = _split_info(manifest, data_dir, split)
    total = sum(shard["tokens"] for shard in info["shards"])
    starts = read_manifest_documents(manifest, Path(data_dir) / MANIFEST).splits[split].document_starts
    if starts is None:
        if "eot_id" not in manifest:
            raise ValueError(f"{Path(data_dir) / MANIFEST}: no eot_id, so documents cannot be found")
        offsets, starts = 0, []
        for path in split_shards(data_dir, split):
            tokens = open_shard(path)
            starts += (np.flatnonzero(tokens == manifest["eot_id"]) + offsets).tolist()
            offsets += len(tokens)
        if starts and starts[0] != 0:
            raise ValueError(
                f"{Path(data_dir) / MANIFEST}: the {split!r} stream does not begin with the end-of-text token "
                f"(eot_id {manifest['eot_id']}), so its documents cannot be found"
            )
    return np.asarray([*starts, total], dtype=np.int64)


def validation_documents(data_dir: str | Path) -> list[dict]:
    """The validation documents recorded by ``data prepare``: per document its ``start`` and ``tokens`` in
    the val stream and, for a local corpus, its source ``file``, ``document_in_file`` and ``whole`` or the
    ``planned_chars`` of a held-out section. Datasets without the record get ``start``/``tokens`` only."""
    manifest = read_manifest(data_dir)
    bounds = _document_bounds(data_dir, manifest, "val")  # checks validation.items against the starts
    if manifest.get("validation") is None:
        return [{"start": int(a), "tokens": int(b - a)} for a, b in itertools.pairwise(bounds)]
    return manifest["validation"]["items"]


class TokenLoader:
    def __init__(
        self,
        shards: list[str | Path],
        seq_len: int,
        batch_size: int,
        *,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        shuffle: bool = True,
        holdout_every: int = 0,
        heldout: bool = False,
    ) -> None:
        """``holdout_every=k`` sets every k-th window aside (the selection split): the loader yields the others,
        or with ``heldout=True`` only those set aside."""
        if not shards:
            raise ValueError("TokenLoader needs at least one shard")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside [0, world_size={world_size})")
        self.seq_len, self.batch_size = seq_len, batch_size
        self.seed, self.rank, self.world_size, self.shuffle = seed, rank, world_size, shuffle
        self.paths = [Path(p) for p in shards]
        self._tokens = [open_shard(p) for p in self.paths]
        per_shard = np.array([shard_windows(len(t), seq_len) for t in self._tokens], dtype=np.int64)
        self.num_chunks = int(per_shard.sum())
        if self.num_chunks == 0:
            raise ValueError(
                f"shards {[str(p) for p in self.paths]} hold fewer than seq_len+1={seq_len + 1} tokens"
            )
        if holdout_every < 0 or holdout_every == 1 or (heldout and not holdout_every):
            raise ValueError(f"holdout_every: expected 0 or k >= 2 (heldout needs k), got {holdout_every}")
        self.holdout_every, self.heldout = holdout_every, heldout
        if holdout_every:  # windows k-1, 2k-1, ... are set aside; the loader numbers the ones it yields
            set_aside = self.num_chunks // holdout_every
            self.num_chunks = set_aside if heldout else self.num_chunks - set_aside
            if self.num_chunks == 0:
                raise ValueError(
                    f"holdout_every={holdout_every}: shards {[str(p) for p in self.paths]} hold too few "
                    f"windows of {seq_len + 1} tokens to set any aside"
                )
        self._chunk_starts = np.concatenate(([0], np.cumsum(per_shard)))
        self.position = 0  # next micro-step

    @classmethod
    def from_dir(
        cls,
        data_dir: str | Path,
        split: str,
        seq_len: int,
        batch_size: int,
        manifest: dict | None = None,
        **kwargs,
    ) -> TokenLoader:
        """The loader of a prepared dataset's split; each shard's size is checked against the manifest
        (:func:`verify_dataset` checks the sha256 too). ``manifest``: the dataset's, already read."""
        manifest = read_manifest(data_dir) if manifest is None else manifest
        shards = _split_info(manifest, data_dir, split)["shards"]
        paths = [Path(data_dir) / shard["file"] for shard in shards]
        for path, shard in zip(paths, shards, strict=True):
            if not path.exists():
                raise FileNotFoundError(
                    f"{path}: shard listed in {Path(data_dir) / MANIFEST} is missing; prepare the dataset again"
                )
            _, count = read_header(path)
            if count != shard["tokens"]:
                raise ValueError(
                    f"{path}: holds {count:,} tokens, {Path(data_dir) / MANIFEST} says {shard['tokens']:,}: "
                    "the shard was replaced or the manifest edited; prepare the dataset again"
                )
        return cls(paths, seq_len, batch_size, **kwargs)

    def slots(self, micro_step: int) -> np.ndarray:
        """Global slot numbers used by this rank at ``micro_step``."""
        first = (micro_step * self.world_size + self.rank) * self.batch_size
        return np.arange(first, first + self.batch_size, dtype=np.int64)

    def chunks(self, slots: np.ndarray) -> np.ndarray:
        epochs, within = np.divmod(slots, self.num_chunks)
        if not self.shuffle:
            return within
        out = np.empty_like(within)
        for epoch in np.unique(epochs):
            chosen = epochs == epoch
            out[chosen] = feistel_permutation(
                within[chosen], self.num_chunks, key=_epoch_key(self.seed, int(epoch))
            )
        return out

    def batch(self, micro_step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The (inputs, targets) batch of ``micro_step`` for this rank, each (batch_size, seq_len) int64."""
        rows = [self._window(int(c)) for c in self.chunks(self.slots(micro_step))]
        data = torch.from_numpy(np.stack(rows).astype(np.int64))
        return data[:, :-1], data[:, 1:]

    def _window(self, chunk: int) -> np.ndarray:
        if self.holdout_every:  # the loader's window number -> the window's place in the shards
            k = self.holdout_every
            chunk = chunk * k + k - 1 if self.heldout else chunk + chunk // (k - 1)
        shard = int(np.searchsorted(self._chunk_starts, chunk, side="right") - 1)
        start = (chunk - int(self._chunk_starts[shard])) * self.seq_len
        return self._tokens[shard][start : start + self.seq_len + 1]

    def __iter__(self) -> TokenLoader:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        batch = self.batch(self.position)
        self.position += 1
        return batch

    def state_dict(self) -> dict[str, int]:
        return {
            "position": self.position,
            "seed": self.seed,
            "world_size": self.world_size,
            "batch_size": self.batch_size,
            "seq_len": self.seq_len,
        }

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Restore the position. A different (world size × batch) is allowed when the global batch is unchanged."""
        if state["seq_len"] != self.seq_len or state["seed"] != self.seed:
            raise ValueError("loader state: seq_len and seed must match the checkpoint's")
        saved_global = state["world_size"] * state["batch_size"]
        here_global = self.world_size * self.batch_size
        if (state["position"] * saved_global) % here_global:
            raise ValueError(
                f"loader state: {state['position']} micro-steps of {saved_global} samples cannot be resumed "
                f"with {here_global} samples per micro-step"
            )
        self.position = state["position"] * saved_global // here_global


_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _epoch_key(seed: int, epoch: int) -> int:
    return (seed * 0x9E3779B97F4A7C15 + epoch * 0xBF58476D1CE4E5B9 + 1) & 0xFFFFFFFFFFFFFFFF


def _mix(values: np.ndarray, key: int) -> np.ndarray:
    """splitmix64 finaliser of (values ^ key): a well-mixed 64-bit hash, vectorised."""
    with np.errstate(over="ignore"):
        z = (values ^ np.uint64(key)) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def feistel_permutation(indices: np.ndarray, n: int, key: int, rounds: int = 4) -> np.ndarray:
    """A keyed pseudo-random bijection on [0, n), applied to ``indices`` (a Feistel network on the next even
    number of bits, with cycle-walking back into range)."""
    bits = max(2, (n - 1).bit_length())
    bits += bits % 2
    half = np.uint64(bits // 2)
    low_mask = np.uint64((1 << (bits // 2)) - 1)

    def permute(x: np.ndarray) -> np.ndarray:
        left, right = x >> half, x & low_mask
        for r in range(rounds):
            left, right = right, left ^ (_mix(right, (key + r) & 0xFFFFFFFFFFFFFFFF) & low_mask)
        return (left << half) | right

    values = np.asarray(indices, dtype=np.uint64)
    out = permute(values)
    outside = out >= np.uint64(n)
    while outside.any():  # cycle-walking: every point of [0, n) comes back into range
        out[outside] = permute(out[outside])
        outside = out >= np.uint64(n)
    return out.astype(np.int64)
