"""The embedded default corpus: deterministic, real prose, several MB."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tablefree.demo import gather_default_corpus


@pytest.mark.slow  # gathers the corpus twice
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


@pytest.mark.slow
def test_demo_end_to_end_without_benchmark_data(tmp_path: Path, monkeypatch) -> None:
    from pydoc_data.topics import topics

    from tablefree import demo

    corpus = tmp_path / "topics.jsonl"
    corpus.write_text(
        "".join(json.dumps({"text": topics[k]}) + "\n" for k in sorted(topics)), encoding="utf-8"
    )
    toy = {
        **demo.DEMO_OVERRIDES,
        "model": {
            "d_model": 32,
            "n_layers": 1,
            "n_heads": 2,
            "d_ff": 64,
            "max_seq_len": 128,
        },
        "budget": "6 steps",
        "batch_tokens": 1024,
        "micro_batch": 8,
        "seq_len": 128,
        "schedule": {"name": "cosine", "warmup_steps": 2},
        "val_every": 3,
        "checkpoint_every": 3,
    }
    monkeypatch.setattr(demo, "DEMO_OVERRIDES", toy)
    monkeypatch.setattr(demo, "DEMO_VOCAB_SIZE", 512)
    monkeypatch.setenv("TABLEFREE_EVAL_DATA", str(tmp_path / "no-evals"))
    lines: list[str] = []
    result = demo.run_demo(corpus=corpus, out=tmp_path / "demo", seeds=[0, 1], log=lines.append)

    assert result["runs"] == {f"{i}-s{s}": "done" for i in ("learned", "canonical") for s in (0, 1)}
    # the shipped tiny recipe (package data), with the demo's changes
    recipe = json.loads(json.dumps(result["report"]["train_config"]))
    assert recipe["optim"]["lr"] == 2.0e-3 and recipe["batch_tokens"] == 1024 and recipe["seq_len"] == 128
    # + the few-seeds caveat, once (2 seeds), and one validation sentence per pair
    assert len(result["summary"]) == 3 + 1 + 1
    assert result["summary"][3].startswith("With 2 seeds nothing is called resolved")
    assert result["summary"][4].startswith("learned vs canonical: ")
    assert result["summary"][0].startswith("validation loss") and "canonical" in result["summary"][0]
    assert "canonical" in result["summary"][1] and "%" in result["summary"][1]
    markdown = (tmp_path / "demo" / "report.md").read_text()
    assert "Benchmarks not scored (hellaswag, piqa, lambada)" in markdown
    assert "tablefree data download-evals" in markdown
    assert next(line for line in lines if line.startswith("[")).startswith("[1] training a 512-token")
    # fp32 in training and evaluation whatever the machine: bf16 (which `auto` picks on some CPUs) moves the headline
    assert recipe["precision"] == "fp32"  # pinned, not `auto` resolving to fp32 on this machine
    summaries = [json.loads(p.read_text()) for p in sorted((tmp_path / "demo").rglob("summary.json"))]
    evaluations = [json.loads(p.read_text()) for p in sorted((tmp_path / "demo").rglob("eval.json"))]
    assert len(summaries) == len(evaluations) == 4
    assert {summary["precision"] for summary in summaries} == {"fp32"}
    assert {(e["dtype"], e["dtype_reason"]) for e in evaluations} == {("fp32", "as configured")}
    assert any("each, fp32; evaluating" in line for line in lines)


def test_demo_trains_the_interfaces_asked_for(tmp_path: Path, monkeypatch) -> None:
    """`tablefree demo --interfaces learned,canonical,affine` reaches run_demo; the default is the headline
    pair."""
    from tablefree import demo
    from tablefree.cli import main

    calls: list[dict] = []
    monkeypatch.setattr(
        demo, "run_demo", lambda **kw: calls.append(kw) or {"out": kw["out"], "summary": [], "failed": []}
    )
    assert main(["demo", "--interfaces", "learned,canonical,affine", "--out", str(tmp_path)]) == 0
    assert main(["demo", "--out", str(tmp_path)]) == 0
    assert [call["interfaces"] for call in calls] == [["learned", "canonical", "affine"], None]
    assert demo.DEMO_INTERFACES == ("learned", "canonical")
