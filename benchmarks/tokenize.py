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
import subprocess
import tempfile
import time

REPO = Path(__file__).resolve().parents[1]


def raw_encode_seconds(tokenizer_path: Path, corpus: Path, threads: str) -> float:
    """Seconds for encode_batch over all documents, in a fresh process (tokenizers fixes its thread pool once)."""
    code = f"""
import time
from tablefree.data.corpus import Corpus
from tablefree.data.tokenizer import load_tokenizer
tok = load_tokenizer({str(tokenizer_path)!r})
docs = list(Corpus({str(corpus)!r}).documents())
start = time.perf_counter()
tok.encode_batch(docs, add_special_tokens=False)
print(time.perf_counter() - start)
"""
    env = dict(os.environ, TOKENIZERS_PARALLELISM=threads)
    return float(subprocess.check_output([sys.executable, "-c", code], env=env, text=True).strip())


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
    from tablefree.data.prepare import prepare_dataset
    from tablefree.data.tokenizer import train_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        tokenizer_path = args.tokenizer or Path(tmp) / "tokenizer.json"
        if not tokenizer_path.exists():
            start = time.perf_counter()
            train_tokenizer(args.corpus, args.vocab_size, tokenizer_path)
            print(f"trained a {args.vocab_size}-token BPE in {time.perf_counter() - start:.1f} s")
        megabytes = sum(len(doc.encode("utf-8")) for doc in Corpus(args.corpus).documents()) / 1e6
        print(f"corpus: {args.corpus} ({megabytes:.1f} MB of UTF-8 text), cpus: {os.cpu_count()}")

        raw = {
            threads: megabytes / raw_encode_seconds(tokenizer_path, args.corpus, threads)
            for threads in ("true", "false")
        }
        print(f"raw encode_batch, all cores : {raw['true']:6.2f} MB/s")
        print(f"raw encode_batch, 1 thread  : {raw['false']:6.2f} MB/s")
        for workers in args.workers:
            start = time.perf_counter()
            manifest = prepare_dataset(
                args.corpus,
                Path(tmp) / f"w{workers}",
                tokenizer=tokenizer_path,
                workers=workers,
                progress=False,
            )
            seconds = time.perf_counter() - start
            tokens = sum(split["tokens"] for split in manifest["splits"].values())
            speed = megabytes / seconds
            print(
                f"data prepare, {workers} worker(s): {speed:6.2f} MB/s ({tokens:,} tokens in {seconds:.1f} s) "
                f"= {speed / raw['true']:.2f}x raw all-core, {speed / raw['false']:.2f}x raw 1-thread"
            )
    print(f"load average: {os.getloadavg()}")


if __name__ == "__main__":
    run_benchmark()
