"""TokenLoader throughput for paper-1.7b-sized batches, and its memory.

    python benchmarks/loader.py [--tokens 200_000_000] [--seq-len 2048] [--batch-size 8] [--steps 400]

Writes a synthetic dataset of uniformly random uint16 tokens (V = 49,152, paper-1.7b's vocabulary) in
100M-token shards to a temporary directory, then times ``TokenLoader.batch`` in random-window and sequential
mode, reporting batches/s and tokens/s, and the process's anonymous RSS (RssAnon: memory that is not the
memory-mapped shards' page cache) before and after, which must not grow with the number of batches.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from tablefree.data.loader import TokenLoader
from tablefree.data.shards import write_shard

VOCAB = 49_152
SHARD_TOKENS = 100_000_000


def rss_anon_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def make_dataset(directory: Path, tokens: int) -> None:
    rng = np.random.default_rng(0)
    shards = []
    for index, start in enumerate(range(0, tokens, SHARD_TOKENS)):
        count = min(SHARD_TOKENS, tokens - start)
        name = f"train_{index:06d}.bin"
        write_shard(directory / name, rng.integers(0, VOCAB, count, dtype=np.uint16), VOCAB)
        shards.append({"file": name, "tokens": count})
    (directory / "manifest.json").write_text(json.dumps({"splits": {"train": {"shards": shards}}}))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=200_000_000)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=400)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        make_dataset(Path(tmp), args.tokens)
        for shuffle in (True, False):
            loader = TokenLoader.from_dir(tmp, "train", args.seq_len, args.batch_size, shuffle=shuffle)
            loader.batch(0)
            before = rss_anon_mb()
            start = time.perf_counter()
            for step in range(args.steps):
                inputs, targets = loader.batch(step)
            seconds = time.perf_counter() - start
            after = rss_anon_mb()
            rate = args.steps / seconds
            mode = "random windows" if shuffle else "sequential    "
            print(
                f"{mode}: {rate:8.1f} batches/s = {rate * args.batch_size * args.seq_len / 1e6:6.2f} M tokens/s "
                f"(batch {args.batch_size} x {args.seq_len}); RssAnon {before:.0f} -> {after:.0f} MB "
                f"over {args.steps} batches"
            )
        assert inputs.shape == targets.shape == (args.batch_size, args.seq_len)


if __name__ == "__main__":
    main()
