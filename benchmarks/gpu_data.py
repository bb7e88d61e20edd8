"""The data the GPU benchmarks need, generated on the machine itself (a GPU machine gets only the working tree:
no ``../shared``, no network).

* ``corpus/default.txt``: the embedded default corpus (``tablefree.demo.gather_default_corpus``: Python's and
  PyTorch's own documentation text, read from the installation), the text ``eval_speed.py`` trains its
  benchmark tokenizer on.
* ``eval/hellaswag_val.jsonl``: a HellaSwag-shaped validation set for *speed* measurements. Each of its
  10,042 documents has the word counts (activity label, ctx_a, ctx_b, four endings) and the label of the
  same document of the real set, recorded in ``benchmarks/data/hellaswag_val_profile.npz``; the words are runs
  of consecutive words of the corpus above. A randomly initialised model scores it at the same cost as the real
  set (the cost depends on the token counts, not on what the words say); its accuracy means nothing.

    python benchmarks/gpu_data.py make --out gpu-bench/data [--max-mb 4]
    python benchmarks/gpu_data.py profile ../shared/data/eval/hellaswag_val.jsonl   # rewrite the profile

The profile (about 40 KB) is derived from the real set by ``profile``; the real set itself is not carried.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np

PROFILE = Path(__file__).resolve().parent / "data" / "hellaswag_val_profile.npz"
FIELDS = ("activity_label", "ctx_a", "ctx_b", "ending0", "ending1", "ending2", "ending3")
WORD = re.compile(r"[A-Za-z][a-z]{0,14}[.,;]?")  # prose-like words (docstrings also hold code)


def write_profile(hellaswag: Path, out: Path = PROFILE) -> None:
    """Word counts per field and the label of every document of the real HellaSwag validation file."""
    counts, labels = [], []
    with hellaswag.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            doc = json.loads(line)
            if len(doc["endings"]) != 4:
                raise SystemExit(f"{hellaswag}:{number}: expected 4 endings, got {len(doc['endings'])}")
            texts = [doc["activity_label"], doc["ctx_a"], doc["ctx_b"], *doc["endings"]]
            counts.append([len(text.split()) for text in texts])
            labels.append(int(doc["label"]))
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out, counts=np.array(counts, dtype=np.uint8), labels=np.array(labels, dtype=np.uint8))
    print(f"{out}: {len(labels)} documents")


def make(out: Path, max_mb: float, seed: int = 0) -> None:
    """Write ``out/corpus/default.txt`` and ``out/eval/hellaswag_val.jsonl`` (atomically, each)."""
    from tablefree.demo import gather_default_corpus
    from tablefree.fileio import write_text_atomic

    corpus_jsonl = out / "corpus-src" / "default.jsonl"
    gather_default_corpus(corpus_jsonl)
    texts, size = [], 0
    with corpus_jsonl.open(encoding="utf-8") as handle:
        for line in handle:
            texts.append(json.loads(line)["text"])
            size += len(texts[-1])
            if size > max_mb * 1e6:
                break
    text = "\n\n".join(texts)
    for directory in ("corpus", "eval"):
        (out / directory).mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / "corpus" / "default.txt", text)
    words = WORD.findall(text)
    if len(words) < 10_000:
        raise SystemExit(f"{corpus_jsonl}: only {len(words)} words of text; expected a documentation corpus")

    profile = np.load(PROFILE)
    counts, labels = profile["counts"], profile["labels"]
    rng = np.random.default_rng(seed)

    def words_of(n: int) -> str:
        start = int(rng.integers(0, len(words) - n))
        return " ".join(words[start : start + n]) if n else ""

    lines = []
    for index, (row, label) in enumerate(zip(counts.tolist(), labels.tolist(), strict=True)):
        label_text, ctx_a, ctx_b, *endings = (words_of(max(n, 1 if i < 2 else 0)) for i, n in enumerate(row))
        doc = {
            "ind": index,
            "activity_label": label_text,
            "ctx_a": ctx_a,
            "ctx_b": ctx_b,
            "ctx": f"{ctx_a} {ctx_b}".strip(),
            "split": "val",
            "split_type": "synthetic",
            "label": int(label),
            "endings": [ending or "it" for ending in endings],
            "source_id": "synthetic~gpu_data.py",
        }
        lines.append(json.dumps(doc))
    write_text_atomic(out / "eval" / "hellaswag_val.jsonl", "\n".join(lines) + "\n")
    print(f"{out}: corpus {len(text) / 1e6:.1f} MB, {len(lines)} HellaSwag-shaped documents")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    make_parser = commands.add_parser("make", help="write corpus/ and eval/ under --out")
    make_parser.add_argument("--out", type=Path, required=True)
    make_parser.add_argument("--max-mb", type=float, default=4.0, help="corpus text to keep, in MB")
    profile_parser = commands.add_parser("profile", help="rewrite the profile from the real HellaSwag file")
    profile_parser.add_argument("hellaswag", type=Path)
    args = parser.parse_args()
    if args.command == "profile":
        write_profile(args.hellaswag)
    else:
        if not PROFILE.exists():
            sys.exit(f"{PROFILE}: missing; it is part of the repository (benchmarks/data/)")
        make(args.out, args.max_mb)


if __name__ == "__main__":
    main()
