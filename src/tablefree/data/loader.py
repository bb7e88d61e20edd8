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

import json
from pathlib import Path

import numpy as np
import torch

from tablefree.data.shards import open_shard

MANIFEST = "manifest.json"


def read_manifest(data_dir: str | Path) -> dict:
    """The dataset manifest; its presence marks a completely prepared dataset."""
    path = Path(data_dir) / MANIFEST
    if not path.exists():
        raise FileNotFoundError(
            f"{path} not found: {data_dir} is not a prepared dataset (run `tablefree data prepare CORPUS --out {data_dir}`)"
        )
    return json.loads(path.read_text(encoding="utf-8"))


def split_shards(data_dir: str | Path, split: str) -> list[Path]:
    """The shard files of one split, in order, as listed by the manifest."""
    manifest = read_manifest(data_dir)
    splits = manifest.get("splits", {})
    if split not in splits:
        raise ValueError(f"{Path(data_dir) / MANIFEST}: no split {split!r}; it has {sorted(splits)}")
    return [Path(data_dir) / shard["file"] for shard in splits[split]["shards"]]


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
    ) -> None:
        if not shards:
            raise ValueError("TokenLoader needs at least one shard")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside [0, world_size={world_size})")
        self.seq_len, self.batch_size = seq_len, batch_size
        self.seed, self.rank, self.world_size, self.shuffle = seed, rank, world_size, shuffle
        self.paths = [Path(p) for p in shards]
        self._tokens = [open_shard(p) for p in self.paths]
        per_shard = np.array([max(0, (len(t) - 1) // seq_len) for t in self._tokens], dtype=np.int64)
        self.num_chunks = int(per_shard.sum())
        if self.num_chunks == 0:
            raise ValueError(
                f"shards {[str(p) for p in self.paths]} hold fewer than seq_len+1={seq_len + 1} tokens"
            )
        self._chunk_starts = np.concatenate(([0], np.cumsum(per_shard)))
        self.position = 0  # next micro-step

    @classmethod
    def from_dir(
        cls, data_dir: str | Path, split: str, seq_len: int, batch_size: int, **kwargs
    ) -> TokenLoader:
        return cls(split_shards(data_dir, split), seq_len, batch_size, **kwargs)

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
