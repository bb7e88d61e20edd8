from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tablefree.cli import main
from tablefree.data.loader import TokenLoader, split_shards
from tablefree.data.prepare import STATE_FILE, HubSource, prepare_dataset, verify_dataset_tokenizer
from tablefree.data.shards import open_shard, read_header
from tablefree.data.tokenizer import eot_id, load_tokenizer, tokenizer_hash, train_tokenizer_from_texts

WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "eta",
    "theta",
    "iota",
    "kappa",
    "lambda",
    "mu",
    "nu",
    "xi",
    "omicron",
    "pi",
    "rho",
    "sigma",
]


def synthetic_docs(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    docs = []
    for i in range(n):
        words = rng.choice(WORDS, size=int(rng.integers(5, 60)))
        lines = [" ".join(words[j : j + 8]) for j in range(0, len(words), 8)]
        docs.append(f"Document {i}: café ✓\n" + "\n".join(lines) + "\n")
    return docs


@pytest.fixture(scope="module")
def jsonl_corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    docs = synthetic_docs(400)
    with open(root / "docs.jsonl", "w", encoding="utf-8") as out:
        for i, doc in enumerate(docs):
            out.write(json.dumps({"text": doc}) + "\n")
            if i == 7:
                out.write("{broken json\n")
    return root, docs


@pytest.fixture(scope="module")
def tokenizer_path(jsonl_corpus, tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    train_tokenizer_from_texts(jsonl_corpus[1], 300, path)
    return path


def split_documents(data_dir, split: str, eot: int, tokenizer) -> list[str]:
    """Decode a split's token stream back into documents (each starts with EOT)."""
    stream = np.concatenate([np.asarray(open_shard(p)) for p in split_shards(data_dir, split)])
    assert stream[0] == eot
    bounds = [*np.flatnonzero(stream == eot).tolist(), len(stream)]
    return [tokenizer.decode(stream[a + 1 : b].tolist()) for a, b in itertools.pairwise(bounds)]


def test_prepare_round_trip_split_and_manifest(jsonl_corpus, tmp_path) -> None:
    root, docs = jsonl_corpus
    out = tmp_path / "data"
    manifest = prepare_dataset(
        root, out, vocab_size=300, val_fraction=0.1, workers=1, shard_tokens=3000, progress=False
    )
    assert json.loads((out / "manifest.json").read_text()) == manifest
    tokenizer = load_tokenizer(out / "tokenizer.json")  # trained here, on the training documents only
    assert manifest["version"] == 1 and manifest["tokenizer_file"] == "tokenizer.json"
    assert manifest["tokenizer_hash"] == tokenizer_hash(out / "tokenizer.json")
    assert manifest["vocab_size"] == 300 and manifest["eot_id"] == eot_id(tokenizer)
    train = split_documents(out, "train", manifest["eot_id"], tokenizer)
    val = split_documents(out, "val", manifest["eot_id"], tokenizer)
    # Exact round trip of every document, each in exactly one split, none lost or repeated.
    assert sorted(train + val) == sorted(docs)
    assert not set(train) & set(val)
    assert len(val) == round(0.1 * len(docs)) == manifest["splits"]["val"]["documents"]
    assert len(train) == manifest["splits"]["train"]["documents"]
    assert train == [d for d in docs if d in set(train)]  # corpus order kept
    for split in ("train", "val"):
        info = manifest["splits"][split]
        assert info["tokens"] == sum(s["tokens"] for s in info["shards"])
        for i, shard in enumerate(info["shards"]):
            path = out / shard["file"]
            assert shard["file"] == f"{split}_{i:06d}.bin"
            assert read_header(path) == (1, shard["tokens"])
            assert hashlib.sha256(path.read_bytes()).hexdigest() == shard["sha256"]
        assert all(s["tokens"] == 3000 for s in info["shards"][:-1])
    assert [s["file"] for s in manifest["sources"]] == ["docs.jsonl"]
    assert manifest["sources"][0]["sha256"] == hashlib.sha256((root / "docs.jsonl").read_bytes()).hexdigest()
    assert manifest["corpus"]["junk"] == {"invalid-json": 1}
    assert manifest["corpus"]["junk_items"][0]["line"] == 9
    assert not (out / STATE_FILE).exists()
    loader = TokenLoader.from_dir(out, "train", seq_len=64, batch_size=4)
    inputs, targets = loader.batch(0)
    assert inputs.shape == targets.shape == (4, 64)
    assert int(inputs.max()) < manifest["vocab_size"]
    # Re-running on a complete dataset returns its manifest and rewrites nothing.
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    assert (
        prepare_dataset(
            root, out, vocab_size=300, val_fraction=0.1, workers=1, shard_tokens=3000, progress=False
        )
        == manifest
    )
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before


def test_workers_and_seeds(jsonl_corpus, tokenizer_path, tmp_path) -> None:
    root, _ = jsonl_corpus
    kwargs = dict(tokenizer=tokenizer_path, val_fraction=0.05, shard_tokens=2000, progress=False)
    one = prepare_dataset(root, tmp_path / "w1", workers=1, **kwargs)
    two = prepare_dataset(root, tmp_path / "w2", workers=2, **kwargs)
    assert one["splits"] == two["splits"]  # byte-identical shards (sha256) whatever the worker count
    assert (
        one["tokenizer_hash"]
        == tokenizer_hash(tokenizer_path)
        == tokenizer_hash(tmp_path / "w1/tokenizer.json")
    )
    other = prepare_dataset(root, tmp_path / "s1", workers=1, seed=1, **kwargs)
    assert other["splits"]["val"]["shards"] != one["splits"]["val"]["shards"]


def test_tokenizer_mismatch_is_an_error(jsonl_corpus, tokenizer_path, tmp_path) -> None:
    root, docs = jsonl_corpus
    out = tmp_path / "data"
    prepare_dataset(root, out, tokenizer=tokenizer_path, workers=1, shard_tokens=5000, progress=False)
    other = train_tokenizer_from_texts(docs[:50], 280)
    with pytest.raises(ValueError, match="tokenizer mismatch"):
        prepare_dataset(root, out, tokenizer=other, workers=1, shard_tokens=5000, progress=False)
    with pytest.raises(ValueError, match="tokenizer mismatch"):
        verify_dataset_tokenizer(out, other)
    verify_dataset_tokenizer(out, tokenizer_path)
    with pytest.raises(ValueError, match="other inputs or settings"):
        prepare_dataset(root, out, tokenizer=tokenizer_path, workers=1, shard_tokens=4000, progress=False)


def test_uint32_shards_for_large_vocabularies(tmp_path) -> None:
    tokenizer = train_tokenizer_from_texts(synthetic_docs(50), 300)
    tokenizer.add_special_tokens([f"<extra_{i}>" for i in range(70_000)])
    text = "alpha <extra_69999> beta\n"
    (tmp_path / "a.txt").write_text(text)
    (tmp_path / "b.txt").write_text("gamma delta\n")
    manifest = prepare_dataset(tmp_path, tmp_path / "out", tokenizer=tokenizer, workers=1, progress=False)
    assert manifest["vocab_size"] > 65_536 and manifest["shard_format"]["version"] == 2
    shards = split_shards(tmp_path / "out", "train") + split_shards(tmp_path / "out", "val")
    tokens = np.concatenate([open_shard(p) for p in shards])
    assert tokens.dtype == np.uint32 and tokenizer.token_to_id("<extra_69999>") in tokens.tolist()


_PREPARE_SCRIPT = """
import sys, time
import tablefree.data.prepare as prepare
import tablefree.data.writer as writer
write_shard = writer.write_shard
def slow_write_shard(*args, **kwargs):  # slow storage, so that the kill lands midway on any machine
    write_shard(*args, **kwargs)
    time.sleep(0.02)
writer.write_shard = slow_write_shard
prepare.prepare_dataset(sys.argv[1], sys.argv[2], tokenizer=sys.argv[3], workers=1, shard_tokens=500,
                val_fraction=0.2, progress=False)
"""


def test_kill_midway_then_resume_is_byte_identical(jsonl_corpus, tokenizer_path, tmp_path) -> None:
    root, _ = jsonl_corpus
    kwargs = dict(tokenizer=tokenizer_path, workers=1, shard_tokens=500, val_fraction=0.2, progress=False)
    reference = prepare_dataset(root, tmp_path / "reference", **kwargs)
    out = tmp_path / "killed"
    process = subprocess.Popen(
        [sys.executable, "-c", _PREPARE_SCRIPT, str(root), str(out), str(tokenizer_path)]
    )
    state = out / STATE_FILE
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and process.poll() is None:
            if state.exists():
                journal = json.loads(state.read_text())
                if len(journal["splits"]["train"]["shards"]) >= 3:
                    break
            time.sleep(0.005)
        assert process.poll() is None, "prepare finished before it could be killed; make the corpus larger"
        os.kill(process.pid, signal.SIGKILL)
    finally:
        process.wait()
    assert process.returncode == -signal.SIGKILL
    assert not (out / "manifest.json").exists()
    journal = json.loads(state.read_text())
    written = journal["splits"]["train"]["shards"]
    total = len(reference["splits"]["train"]["shards"])
    assert 3 <= len(written) < total
    # Damage a finished shard too: the resumed run must notice and redo it and everything after it.
    (out / written[1]["file"]).write_bytes(b"\0" * 1024)
    resumed = prepare_dataset(root, out, **kwargs)
    assert resumed["splits"] == reference["splits"]
    for split in ("train", "val"):
        names = sorted(p.name for p in out.glob(f"{split}_*.bin"))
        assert names == [s["file"] for s in reference["splits"][split]["shards"]]
    assert not list(out.glob(".*.tmp.*")) and not state.exists()


def test_hub_stream_code_path_on_local_parquet(jsonl_corpus, tokenizer_path, tmp_path) -> None:
    pytest.importorskip("datasets")
    _, docs = jsonl_corpus
    path = tmp_path / "data.parquet"
    pq.write_table(pa.table({"text": docs[:60], "id": list(range(60))}), path)
    source = HubSource("parquet", data_files=str(path))
    manifest = prepare_dataset(
        None,
        tmp_path / "out",
        tokenizer=tokenizer_path,
        hub=source,
        val_fraction=0.2,
        workers=1,
        max_documents=50,
        progress=False,
    )
    counts = {s: manifest["splits"][s]["documents"] for s in ("train", "val")}
    assert counts["train"] + counts["val"] == 50 and counts["val"] > 0
    tokenizer = load_tokenizer(tokenizer_path)
    got = split_documents(tmp_path / "out", "train", manifest["eot_id"], tokenizer)
    got += split_documents(tmp_path / "out", "val", manifest["eot_id"], tokenizer)
    assert sorted(got) == sorted(docs[:50])
    assert manifest["sources"][0]["hub"]["name"] == "parquet"


def test_prepare_verb(jsonl_corpus, tokenizer_path, tmp_path, capsys) -> None:
    root, _ = jsonl_corpus
    out = tmp_path / "data"
    argv = ["data", "prepare", str(root), "--tokenizer", str(tokenizer_path), "--out", str(out)]
    assert main([*argv, "--workers", "1", "--shard-tokens", "4000", "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "invalid-json" in printed and "docs.jsonl:9" in printed
    manifest = json.loads((out / "manifest.json").read_text())
    assert f"train: {manifest['splits']['train']['documents']:,} documents" in printed
    assert f"validation: {manifest['validation']['documents']} documents" in printed
    assert main([*argv, "--workers", "1", "--strict", "--no-progress", "--overwrite"]) == 1
    assert "docs.jsonl:9: invalid-json" in capsys.readouterr().err


def test_adopt_llmc_shards(tokenizer_path, tmp_path, capsys) -> None:
    """Shards written the way llm.c / modded-nanogpt write them (header by hand, EOT before each document)."""
    tokenizer = load_tokenizer(tokenizer_path)
    eot = eot_id(tokenizer)
    docs = synthetic_docs(30, seed=3)
    stream = [t for d in docs for t in [eot, *tokenizer.encode(d, add_special_tokens=False).ids]]
    for name, part in (
        ("fineweb_train_000001.bin", stream[:1500]),
        ("fineweb_val_000000.bin", stream[1500:]),
    ):
        header = np.zeros(256, dtype="<i4")
        header[:3] = (20240520, 1, len(part))
        (tmp_path / name).write_bytes(header.tobytes() + np.asarray(part, dtype="<u2").tobytes())
    argv = ["data", "adopt", str(tmp_path), "--tokenizer", str(tokenizer_path)]
    assert main([*argv, "--train", "fineweb_train_*.bin", "--val", "fineweb_val_*.bin"]) == 0
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["tokenizer_hash"] == tokenizer_hash(tokenizer_path)
    assert manifest["splits"]["train"]["tokens"] + manifest["splits"]["val"]["tokens"] == len(stream)
    assert manifest["splits"]["train"]["documents"] + manifest["splits"]["val"]["documents"] == len(docs)
    loader = TokenLoader.from_dir(tmp_path, "train", seq_len=100, batch_size=2, shuffle=False)
    inputs, _ = loader.batch(0)
    assert inputs[0].tolist() == stream[:100]
    assert main([*argv, "--train", "nothing_*.bin"]) == 1
    assert "no shard matches" in capsys.readouterr().err


def test_crash_between_shard_and_journal(jsonl_corpus, tokenizer_path, tmp_path, monkeypatch) -> None:
    """A crash after a shard is renamed into place but before the journal records it."""
    import tablefree.data.prepare as prepare

    root, _ = jsonl_corpus
    kwargs = dict(tokenizer=tokenizer_path, workers=1, shard_tokens=700, val_fraction=0.2, progress=False)
    reference = prepare_dataset(root, tmp_path / "reference", **kwargs)
    real_write = prepare.write_json_atomic
    calls = []

    def crash_on_second_journal(path, data):
        calls.append(path.name)
        if path.name == STATE_FILE and calls.count(STATE_FILE) == 2:
            raise KeyboardInterrupt  # stands in for the kill: the first shard exists, unjournalled
        real_write(path, data)

    monkeypatch.setattr(prepare, "write_json_atomic", crash_on_second_journal)
    with pytest.raises(KeyboardInterrupt):
        prepare_dataset(root, tmp_path / "out", **kwargs)
    monkeypatch.setattr(prepare, "write_json_atomic", real_write)
    assert (tmp_path / "out/train_000000.bin").exists()
    assert json.loads((tmp_path / "out" / STATE_FILE).read_text())["splits"]["train"]["shards"] == []
    assert prepare_dataset(root, tmp_path / "out", **kwargs)["splits"] == reference["splits"]


def test_tokenizer_without_exact_cut_points_gets_whole_documents(tmp_path, monkeypatch) -> None:
    """A tokenizer with a normalizer (as many hub tokenizers have) is never fed pieces; it still round-trips."""
    from tokenizers import normalizers

    import tablefree.data.tokenizing as tokenizing
    from tablefree.data.tokenizer import is_split_safe

    monkeypatch.setattr(tokenizing, "PIECE_CHARS", 500)
    docs = [d * 10 for d in synthetic_docs(6, seed=5)]  # several pieces long each
    tokenizer = train_tokenizer_from_texts(docs, 300)
    tokenizer.normalizer = normalizers.NFC()
    assert not is_split_safe(tokenizer)
    for i, doc in enumerate(docs):
        (tmp_path / f"{i}.txt").write_text(doc)
    manifest = prepare_dataset(tmp_path, tmp_path / "out", tokenizer=tokenizer, workers=1, progress=False)
    got = split_documents(tmp_path / "out", "train", manifest["eot_id"], tokenizer)
    got += split_documents(tmp_path / "out", "val", manifest["eot_id"], tokenizer)
    assert sorted(got) == sorted(docs)


# -- the validation split: enough documents for a document-level bootstrap ---------------------------------


def test_plan_validation_sections_of_long_books_from_different_sources() -> None:
    from tablefree.data.documents import VAL_MAX_SHARE, plan_validation

    rng = np.random.default_rng(5)
    lengths = rng.integers(6_000, 4_000_000, size=57)  # like gutenberg-mix: 57 books, 6 KB to 4 MB
    plan = plan_validation(lengths, val_fraction=0.005, min_documents=20, section_chars=80_000, seed=0)
    assert plan.units == 20 and plan.sources == 20  # 20 documents, each from another book
    held = sum(int(lengths[d]) for d in plan.whole) + 80_000 * sum(len(r) for r in plan.sections.values())
    assert held <= VAL_MAX_SHARE * lengths.sum()
    for doc, ranges in plan.sections.items():
        assert all(0 < a < b <= lengths[doc] for a, b in ranges)
    assert plan_validation(lengths, 0.005, 20, 80_000, seed=1).sections != plan.sections  # the seed matters
    assert plan_validation(lengths, 0.0, 20, 80_000).units == 0
    # Few books: shorter sections, several per book, each book keeping at least half of its text for
    # training, and never more than VAL_MAX_SHARE of the text (here it allows 10 of the 20 asked for).
    few = plan_validation([50_000] * 4, val_fraction=0.005, min_documents=20, section_chars=80_000)
    assert few.units == 10 and few.sources == 4 and few.section_chars == 2_000
    assert all(len(r) * few.section_chars <= 25_000 for r in few.sections.values())
    more = plan_validation([50_000] * 4, val_fraction=0.3, min_documents=20, section_chars=80_000)
    assert more.units == 20 and more.sources == 4 and more.section_chars == 3_000
    # Long documents first: a few long books among many short documents lend sections, and no short
    # document is lost to training whole.
    mixed = plan_validation([500] * 100 + [300_000] * 25, val_fraction=0.005, min_documents=20)
    assert mixed.units == 20 and not mixed.whole and min(mixed.sections) >= 100
    # Many short documents: whole documents, as many as asked.
    short = plan_validation([500] * 1000, val_fraction=0.05, min_documents=20)
    assert len(short.whole) == 50 and not short.sections


def test_validation_sections_round_trip_and_document_bounds(tmp_path) -> None:
    from tablefree.data.loader import document_bounds, validation_documents

    rng = np.random.default_rng(2)
    books = []
    for b in range(6):
        lines = [" ".join(rng.choice(WORDS, size=int(rng.integers(3, 12)))) for _ in range(1000)]
        books.append(f"Book {b}\n" + "\n".join(lines) + "\n")
        (tmp_path / f"book{b}.txt").write_text(books[-1], encoding="utf-8")
    out = tmp_path / "data"
    manifest = prepare_dataset(
        tmp_path,
        out,
        vocab_size=300,
        workers=1,
        val_fraction=0.2,
        val_documents=20,
        val_section_chars=2_000,
        progress=False,
    )
    record = manifest["validation"]
    assert record["documents"] == manifest["splits"]["val"]["documents"] == 20
    assert record["source_documents"] == 6 and record["sections"] == 20
    tokenizer = load_tokenizer(out / "tokenizer.json")
    train = split_documents(out, "train", manifest["eot_id"], tokenizer)
    val = split_documents(out, "val", manifest["eot_id"], tokenizer)
    # Every book is exactly its training pieces interleaved with its held-out sections, cut at line starts.
    items = validation_documents(out)
    assert [item["tokens"] for item in items] == [len(tokenizer.encode(v).ids) + 1 for v in val]
    for b, book in enumerate(books):
        k = sum(item["file"] == f"book{b}.txt" for item in items)
        pieces, sections = train[: k + 1], val[:k]
        train, val = train[k + 1 :], val[k:]
        assert all(p.endswith("\n") for p in pieces[:-1])
        assert "".join(p + s for p, s in zip(pieces, [*sections, ""], strict=True)) == book
    assert not train and not val
    # The boundaries API gives each document's token range of the val stream.
    bounds = document_bounds(out, "val")
    stream = np.concatenate([np.asarray(open_shard(p)) for p in split_shards(out, "val")])
    assert bounds.tolist() == [*np.flatnonzero(stream == manifest["eot_id"]).tolist(), len(stream)]
    assert [item["start"] for item in items] == bounds[:-1].tolist()
    # A manifest whose starts or records do not fit is refused by the typed reader, naming the file and field.
    path = out / "manifest.json"
    for damage, field, expected in (
        (
            lambda m: m["splits"]["val"].update(document_starts=[1, 5]),
            "splits.val.document_starts",
            "must begin at 0",
        ),
        (
            lambda m: m["splits"]["val"]["document_starts"].__setitem__(1, 2.5),
            "splits.val.document_starts[1]",
            "must be a count",
        ),
        (lambda m: m["validation"]["items"].pop(), "validation.items", "must list the 20 documents"),
        (
            lambda m: m["validation"]["items"][3].update(start=7),
            "validation.items[3]",
            f"must have start {items[3]['start']}",
        ),
        (lambda m: m["validation"]["items"][4].pop("tokens"), "validation.items[4].tokens", "is missing"),
        (lambda m: m["splits"]["val"].pop("document_starts"), "splits.val.document_starts", "is missing"),
    ):
        broken = json.loads(json.dumps(manifest))
        damage(broken)
        path.write_text(json.dumps(broken))
        for read in (validation_documents, lambda d: document_bounds(d, "val")):
            with pytest.raises(ValueError, match=rf"manifest\.json: field '{re.escape(field)}' {expected}"):
                read(out)


def test_damaged_journal_or_manifest_is_an_error_naming_the_file(
    jsonl_corpus, tokenizer_path, tmp_path
) -> None:
    root, _ = jsonl_corpus
    out = tmp_path / "data"
    out.mkdir()
    kwargs = dict(tokenizer=tokenizer_path, workers=1, progress=False)
    (out / STATE_FILE).write_text('{"fingerprint": "x",\n "splits": [')
    with pytest.raises(ValueError, match=r"\.prepare-state\.json: malformed JSON \(.* at line 2\)"):
        prepare_dataset(root, out, **kwargs)
    (out / STATE_FILE).write_text(
        json.dumps({"fingerprint": "x", "tokenizer_hash": "y", "splits": {"train": 1}})
    )
    with pytest.raises(ValueError, match=r"\.prepare-state\.json: field 'splits\.train' must be an object"):
        prepare_dataset(root, out, **kwargs)
    (out / STATE_FILE).write_text(json.dumps({"fingerprint": "x", "tokenizer_hash": "y", "splits": {}}))
    with pytest.raises(ValueError, match=r"\.prepare-state\.json: field 'splits' must hold train and val"):
        prepare_dataset(root, out, **kwargs)
    (out / STATE_FILE).unlink()
    manifest = prepare_dataset(root, out, **kwargs)
    (out / "manifest.json").write_text(json.dumps(manifest)[:-20])
    with pytest.raises(ValueError, match=r"manifest\.json: malformed JSON"):
        prepare_dataset(root, out, **kwargs)


def test_gutenberg_mix_validation_is_20_sections_of_20_books(shared_data) -> None:
    from tablefree.data.corpus import Corpus
    from tablefree.data.documents import LocalDocuments

    corpus = Corpus(shared_data / "corpus/gutenberg-mix", gutenberg=True)
    docs = LocalDocuments(corpus, corpus.scan(), val_fraction=0.005, seed=0)
    items = docs.validation_items()
    assert len(items) == 20 and not any(item["whole"] for item in items)
    assert len({item["file"] for item in items}) == 20  # 20 different books
    assert docs.counts == {"train": 57 + 20, "val": 20}  # each sectioned book is two training documents
    assert 20 * 80_000 / sum(docs.lengths) < 0.05  # under 5% of the text held out
