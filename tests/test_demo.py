"""The embedded default corpus: deterministic, real prose, several MB."""

from __future__ import annotations

import json
from pathlib import Path

from tablefree.demo import gather_default_corpus


def test_default_corpus_is_deterministic_and_substantial(tmp_path: Path) -> None:
    first = gather_default_corpus(tmp_path / "a" / "docs.jsonl")
    second = gather_default_corpus(tmp_path / "b" / "docs.jsonl")
    assert first["sha256"] == second["sha256"]
    assert (tmp_path / "a" / "docs.jsonl").read_bytes() == (tmp_path / "b" / "docs.jsonl").read_bytes()
    assert set(first["sources"]) == {"python-topics", "python-stdlib", "torch"}
    assert first["text_bytes"] > 2_000_000, "the default corpus should be several MB of text"

    lines = (tmp_path / "a" / "docs.jsonl").read_text(encoding="utf-8").splitlines()
    documents = [json.loads(line) for line in lines]
    assert len(documents) == first["documents"]
    assert all(len(doc["text"]) >= 80 for doc in documents)
    sources = [doc["source"] for doc in documents]
    assert len(set(sources)) == len(sources)
    # Prose, not code: the most common words of English appear throughout.
    words = " ".join(doc["text"] for doc in documents[:200]).lower().split()
    assert words.count("the") > 0.02 * len(words)
    assert json.loads((tmp_path / "a" / "corpus.json").read_text())["sha256"] == first["sha256"]
