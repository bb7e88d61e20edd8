"""Tokenization throughput: ``prepare_dataset`` with 1 and 2 workers against raw ``Tokenizer.encode_batch``.

    python benchmarks/tokenize.py [--corpus ../shared/data/corpus/gutenberg-mix] [--vocab-size 8192]

All figures are MB/s of UTF-8 text (the decoded documents), measured in one run on the same text. ``prepare``
is timed end to end: scanning and hashing the sources, tokenizing, writing shards and the manifest. The raw
baseline is ``encode_batch`` over the same documents with tokenizers' own thread pool (all cores), and also
with one thread. The goal is prepare ≥ 0.8× the raw encode_batch speed.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __name__ != "__main__":
    # This file's name shadows the standard library's ``tokenize``: when a sibling script (benchmarks/x.py puts
    # this folder on sys.path) imports it, e.g. through inspect or linecache, become the real module.
    import sysconfig

    _STDLIB_TOKENIZE = Path(sysconfig.get_paths()["stdlib"]) / "tokenize.py"
    exec(compile(_STDLIB_TOKENIZE.read_bytes(), str(_STDLIB_TOKENIZE), "exec"), globals())
else:  # and when run as a script, keep this folder off the import path for the same reason
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse
import os
import resource
import subprocess
import tempfile
import time

REPO = Path(__file__).resolve().parents[1]


_RAW = """
import resource, sys, time
from tablefree.data.corpus import Corpus
from tablefree.data.prepare import PIECE_CHARS
from tablefree.data.tokenizer import load_tokenizer, split_points
tok = load_tokenizer(sys.argv[1])
texts = list(Corpus(sys.argv[2]).documents())
if sys.argv[3] == "pieces":
    texts = [t[a:b] for t in texts for a, b in zip([0, *split_points(t, PIECE_CHARS)], [*split_points(t, PIECE_CHARS), len(t)])]
cpu = resource.getrusage(resource.RUSAGE_SELF)
start = time.perf_counter()
tok.encode_batch(texts, add_special_tokens=False)
wall = time.perf_counter() - start
end = resource.getrusage(resource.RUSAGE_SELF)
print(wall, end.ru_utime + end.ru_stime - cpu.ru_utime - cpu.ru_stime)
"""

_PREPARE = """
import sys, time
from tablefree.data.prepare import prepare_dataset
start = time.perf_counter()
prepare_dataset(sys.argv[2], sys.argv[3], tokenizer=sys.argv[1], workers=int(sys.argv[4]), progress=False)
print(time.perf_counter() - start)
"""


def measure(code: str, *args: str, threads: str = "true") -> tuple[float, float]:
    """(wall seconds, CPU seconds of the process and its children) of a fresh process (tokenizers fixes its
    thread pool once per process). Wall time is the one the script reports itself, so imports don't count."""
    env = dict(os.environ, TOKENIZERS_PARALLELISM=threads)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.check_output([sys.executable, "-c", code, *args], env=env, text=True).split()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return float(out[0]), float(out[1]) if len(out) > 1 else cpu


def run_benchmark() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--corpus", type=Path, default=REPO.parent / "shared/data/corpus/gutenberg-mix")
    parser.add_argument("--vocab-size", type=int, default=8192)
    parser.add_argument(
        "--tokenizer", type=Path, help="tokenizer.json to use (trained and saved here if missing)"
    )
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()

    from tablefree.data.corpus import Corpus
    from tablefree.data.tokenizer import train_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        tokenizer_path = args.tokenizer or Path(tmp) / "tokenizer.json"
        if not tokenizer_path.exists():
            start = time.perf_counter()
            train_tokenizer(args.corpus, args.vocab_size, tokenizer_path)
            print(f"trained a {args.vocab_size}-token BPE in {time.perf_counter() - start:.1f} s")
        megabytes = sum(len(doc.encode("utf-8")) for doc in Corpus(args.corpus).documents()) / 1e6
        print(f"corpus: {args.corpus} ({megabytes:.1f} MB of UTF-8 text), {os.cpu_count()} CPUs")
        print(f"{'':40s} {'wall MB/s':>10s} {'MB per CPU-s':>13s}")
        rows = {}

        def report(name: str, wall: float, cpu: float) -> None:
            rows[name] = (megabytes / wall, megabytes / cpu)
            print(f"{name:40s} {rows[name][0]:10.2f} {rows[name][1]:13.2f}")

        tok, corpus = str(tokenizer_path), str(args.corpus)
        report("raw encode_batch, documents, all cores", *measure(_RAW, tok, corpus, "docs"))
        report("raw encode_batch, documents, 1 thread", *measure(_RAW, tok, corpus, "docs", threads="false"))
        report("raw encode_batch, our pieces, all cores", *measure(_RAW, tok, corpus, "pieces"))
        report(
            "raw encode_batch, our pieces, 1 thread", *measure(_RAW, tok, corpus, "pieces", threads="false")
        )
        for workers in args.workers:
            out = str(Path(tmp) / f"w{workers}")
            report(f"data prepare, {workers} worker(s)", *measure(_PREPARE, tok, corpus, out, str(workers)))
        for workers in args.workers:
            speed = rows[f"data prepare, {workers} worker(s)"][0]
            print(
                f"prepare {workers} worker(s) / raw all cores: {speed / rows['raw encode_batch, documents, all cores'][0]:.2f}x "
                f"(documents), {speed / rows['raw encode_batch, our pieces, all cores'][0]:.2f}x (pieces)"
            )
    print(f"load average (1, 5, 15 min): {os.getloadavg()}")


if __name__ == "__main__":
    run_benchmark()
