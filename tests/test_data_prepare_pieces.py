"""Issue 41: a part smaller than a file. One parquet file splits by row groups, one uncompressed .jsonl by byte
ranges (a span owns the lines that start in it), a hub dataset by its data files; each way, the parts merge to
the single keyed-hash run byte for byte, and a part count beyond the pieces is refused naming how many there are."""

from __future__ import annotations

import gzip
import itertools
import json
from pathlib import Path

import pytest

from tablefree.data.corpus import Corpus
from tablefree.data.prepare import PARTS_DIR, HubSource, prepare_dataset
from tablefree.data.spans import DEFAULT_SPAN_BYTES
from tablefree.data.tokenizer import train_tokenizer_from_texts

SETTINGS = dict(
    split_rule="keyed-hash",
    val_fraction=0.1,
    val_documents=5,
    val_section_chars=2_000,
    shard_tokens=3_000,
    workers=1,
    progress=False,
)


def texts(count: int, words: int = 40) -> list[str]:
    return [" ".join(f"w{(i * 7 + j) % 53} t{i}" for j in range(words)) + "\n" for i in range(count)]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pieces") / "tokenizer.json"
    train_tokenizer_from_texts(texts(200), 300, path)
    return path


def merged_and_single(
    corpus, tokenizer: Path, tmp_path: Path, parts: int, **options
) -> tuple[list[dict], dict]:
    """The parts' records and the single run's manifest, after checking the merge gives the single run's bytes."""
    settings = {**SETTINGS, **options}
    single = prepare_dataset(corpus, tmp_path / "single", tokenizer=tokenizer, **settings)
    records = [
        prepare_dataset(corpus, tmp_path / "merged", tokenizer=tokenizer, part=(i, parts), **settings)
        for i in range(1, parts + 1)
    ]
    merged = prepare_dataset(corpus, tmp_path / "merged", tokenizer=tokenizer, merge=True, **settings)
    assert not (tmp_path / "merged" / PARTS_DIR).exists()
    names = sorted(p.name for p in (tmp_path / "single").iterdir())
    assert sorted(p.name for p in (tmp_path / "merged").iterdir()) == names
    for name in names:
        if name != "manifest.json":
            assert (tmp_path / "merged" / name).read_bytes() == (tmp_path / "single" / name).read_bytes(), (
                name
            )
    single.pop("created"), merged.pop("created")
    assert merged == single  # shards, validation starts and items, sources (span digests), junk, settings
    return records, single


def part_tokens(record: dict) -> int:
    return sum(split["tokens"] for split in record["splits"].values())


def test_one_parquet_file_splits_by_row_groups_balanced_and_merges_to_the_single_run(
    tokenizer: Path, tmp_path: Path
) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    documents = texts(240)
    documents[17] = ""  # a junk row: positions count it, in the single run and in the parts
    path = tmp_path / "one.parquet"
    pq.write_table(pa.table({"id": list(range(240)), "text": documents}), path, row_group_size=20)
    records, single = merged_and_single(path, tokenizer, tmp_path, parts=3)
    assert [[p["spans"] for p in r["pieces"]] for r in records] == [[[0, 4, 12]], [[4, 8, 12]], [[8, 12, 12]]]
    (source,) = single["sources"]
    assert source["spans"] == 12 and source["sha256"] is None and len(source["span_sha256"]) == 64
    assert single["corpus"]["junk"] == {"empty": 1} and single["validation"]["documents"] >= 1
    total = sum(map(part_tokens, records))
    assert max(map(part_tokens, records)) <= 1.5 * total / 3  # the balance goal


def test_one_jsonl_file_splits_by_byte_ranges_and_merges_to_the_single_run(
    tokenizer: Path, tmp_path: Path
) -> None:
    lines = [json.dumps({"text": text}) + "\n" for text in texts(150)]
    lines[40] = "\n"  # blank: no document, no junk
    lines[90] = "{not json\n"  # junk, named by its byte offset
    path = tmp_path / "one.jsonl"
    path.write_text("".join(lines), encoding="utf-8")
    data = path.read_bytes()
    starts = [0, *(i + 1 for i, byte in enumerate(data[:-1]) if byte == ord("\n"))]
    span_bytes = starts[
        7
    ]  # the first span ends exactly where line 7 starts; the other ends fall inside lines
    assert sum(end % span_bytes == 0 for end in starts) >= 1 and len(data) // span_bytes >= 12
    whole = Corpus(path)
    whole.scan()
    spanned = Corpus(path, span_bytes=span_bytes, lengths=False)
    spanned.scan()
    located = list(spanned.located_documents())
    assert [text for _, _, text in located] == list(whole.documents())  # every line once, none twice
    assert [position for _, position, _ in located] == [s for k, s in enumerate(starts) if k not in (40, 90)]
    assert [str(j) for j in spanned.summary.junk] == [
        f"one.jsonl: invalid-json: line at byte {starts[90]:,}: Expecting property name enclosed in double quotes: "
        "line 1 column 2 (char 1)"
    ]
    records, single = merged_and_single(path, tokenizer, tmp_path, parts=3, span_bytes=span_bytes)
    assert all(r["pieces"][0]["spans"][0] > 0 for r in records[1:])  # parts of one file, none of it whole
    total = sum(map(part_tokens, records))
    assert max(map(part_tokens, records)) <= 1.5 * total / 3
    assert single["settings"]["span_bytes"] == span_bytes
    assert "a .jsonl line's byte offset" in single["settings"]["position"]


def test_junk_keeps_the_first_items_of_each_file_and_kind_and_counts_all_the_same_way_in_parts(
    tokenizer: Path, tmp_path: Path
) -> None:
    """At 100M documents with 1% bad lines every junk item was a million objects in memory and in the manifest: the
    first MAX_JUNK_ITEMS of each file and kind are kept (by position, whichever part read them), all are counted."""
    from tablefree.data.sources import MAX_JUNK_ITEMS

    lines = [json.dumps({"text": text}) + "\n" for text in texts(150)]
    bad = [*range(3, 60, 5), *range(60, 150, 2)]  # invalid lines in every span, denser in the later ones
    for k in bad:
        lines[k] = "{not json\n"
    lines[10] = json.dumps({"body": "no text field"}) + "\n"
    path = tmp_path / "one.jsonl"
    path.write_text("".join(lines), encoding="utf-8")
    starts = [0, *itertools.accumulate(len(line.encode()) for line in lines)]
    span_bytes = len(path.read_bytes()) // 10
    reader = Corpus(path, span_bytes=span_bytes, lengths=False)
    summary = reader.scan()
    invalid = [j for j in summary.junk if j.kind == "invalid-json"]
    assert len(invalid) == MAX_JUNK_ITEMS < len(bad)
    assert [j.detail.split(":")[0] for j in invalid] == [
        f"line at byte {starts[k]:,}" for k in bad[:MAX_JUNK_ITEMS]
    ]
    assert summary.junk_log.counts == {"one.jsonl": {"invalid-json": len(bad), "missing-field": 1}}
    report = summary.as_dict()
    assert report["junk"] == {"invalid-json": len(bad), "missing-field": 1}
    assert len(report["junk_items"]) == MAX_JUNK_ITEMS + 1
    assert f"... and {len(bad) + 1 - 20} more" in summary.format(max_junk=20)
    records, single = merged_and_single(path, tokenizer, tmp_path, parts=3, span_bytes=span_bytes)
    per_part = [r["junk_counts"]["one.jsonl"]["invalid-json"] for r in records]
    # the first part keeps all it found, the second its first MAX_JUNK_ITEMS; the merge joins the first's with the
    # second's first few, as the single run keeps them
    assert per_part[0] < MAX_JUNK_ITEMS < per_part[1]
    assert sum(j["kind"] == "invalid-json" for j in records[1]["junk"]) == MAX_JUNK_ITEMS
    assert single["corpus"]["junk"] == report["junk"]  # and the merged manifest equals the single one
    assert single["corpus"]["junk_by_file"] == report["junk_by_file"]
    assert single["corpus"]["junk_items"] == report["junk_items"]


def test_a_compressed_file_weighs_its_text_not_its_compressed_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A .gz or .zst file weighed by its compressed bytes was under-weighed 3-5x beside .jsonl and parquet, and its
    part given 3-5x the text of the others."""
    zstandard = pytest.importorskip("zstandard")
    from tablefree.data import spans
    from tablefree.data.prepare import PrepareSpec
    from tablefree.data.sources import list_sources
    from tablefree.data.spans import NOMINAL_EXPANSION, file_spans

    text = "".join(json.dumps({"text": t}) + "\n" for t in texts(400)).encode()
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.jsonl.gz").write_bytes(gzip.compress(text))
    (corpus / "b.jsonl").write_bytes(text[: len(text) // 2])
    (corpus / "c.jsonl").write_bytes(text[len(text) // 2 :])
    (corpus / "d.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(text))
    streamed = zstandard.ZstdCompressor().compressobj()  # a stream that does not record its length
    (corpus / "e.jsonl.zst").write_bytes(streamed.compress(text) + streamed.flush())
    # two members: the trailer gives the last one's length, less than the file's bytes, so it is not the file's
    (corpus / "f.jsonl.gz").write_bytes(gzip.compress(text[:-100]) + gzip.compress(text[-100:]))
    sources, _ = list_sources(corpus)
    weights = {s.rel: [span.weight for span in file_spans(s, DEFAULT_SPAN_BYTES, "text")] for s in sources}
    assert len(text) / 3 > (corpus / "a.jsonl.gz").stat().st_size  # compressed 3x or more, as text is
    assert weights["a.jsonl.gz"] == weights["d.jsonl.zst"] == [len(text)]  # the lengths gzip and zstd record
    for name in ("e.jsonl.zst", "f.jsonl.gz"):  # no length recorded for the whole file: an estimate
        assert weights[name] == [NOMINAL_EXPANSION * (corpus / name).stat().st_size]
    # cut in two, the .gz file's text is one part's and the two halves the other's (by compressed bytes the .gz
    # and a half would have been one part, with three quarters of the text)
    files = [str(corpus / name) for name in ("a.jsonl.gz", "b.jsonl", "c.jsonl")]
    spec = PrepareSpec(corpus=tuple(files), split_rule="keyed-hash")
    weighed: list[str] = []
    estimate = spans.uncompressed_estimate
    monkeypatch.setattr(
        spans, "uncompressed_estimate", lambda s, size: weighed.append(s.rel) or estimate(s, size)
    )
    listing = spec.reader()
    plan = spec.plan(listing, 2)
    assert weighed == ["a.jsonl.gz"]  # the plan cuts the listing's spans: each file's metadata is read once
    assert [[listing.listed[p.file].rel for p in part] for part in plan] == [
        ["a.jsonl.gz"],
        ["b.jsonl", "c.jsonl"],
    ]
    assert spec.plan(spec.reader(), 2) == plan  # the same inputs, the same parts


def test_merge_refuses_parts_keyed_by_the_old_position(tokenizer: Path, tmp_path: Path) -> None:
    """Parts prepared before the position was recorded keyed .jsonl documents by their number in the file: their
    split differs, so the merge names the field."""
    path = tmp_path / "one.jsonl"
    path.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts(30)), encoding="utf-8")
    out = tmp_path / "out"
    for i in (1, 2):
        prepare_dataset(path, out, tokenizer=tokenizer, part=(i, 2), span_bytes=1_000, **SETTINGS)
    record_path = out / PARTS_DIR / "1-of-2" / "part.json"
    record = json.loads(record_path.read_text())
    del record["settings"]["position"], record["settings"]["span_bytes"]
    record_path.write_text(json.dumps(record))
    with pytest.raises(
        ValueError, match=r"part 1/2 field settings\.position: the part's None, this merge's "
    ):
        prepare_dataset(path, out, tokenizer=tokenizer, merge=True, span_bytes=1_000, **SETTINGS)


def test_hub_data_files_split_into_parts_and_merge_to_the_single_run(tokenizer: Path, tmp_path: Path) -> None:
    pytest.importorskip("datasets")
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    documents = texts(90)
    files = []
    for k in range(3):
        path = tmp_path / f"data-{k}.parquet"
        pq.write_table(pa.table({"text": documents[k * 30 : (k + 1) * 30]}), path)
        files.append(str(path))
    hub = HubSource("parquet", data_files=files)
    records, single = merged_and_single(None, tokenizer, tmp_path, parts=3, hub=hub)
    assert [[p["file"] for p in r["pieces"]] for r in records] == [[f] for f in files]  # its own file each
    assert single["splits"]["train"]["documents"] + single["validation"]["documents"] >= 90
    assert {item["file"] for item in single["validation"]["items"]} <= set(files)
    with pytest.raises(ValueError, match=r"give them with --hub-data-files"):
        prepare_dataset(
            None, tmp_path / "x", tokenizer=tokenizer, part=(1, 2), hub=HubSource("parquet"), **SETTINGS
        )


def test_too_many_parts_names_how_many_pieces_the_corpus_allows(tokenizer: Path, tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    pq.write_table(pa.table({"text": texts(40)}), corpus / "a.parquet", row_group_size=10)  # 4 row groups
    (corpus / "b.jsonl").write_text(json.dumps({"text": "one"}) + "\n", encoding="utf-8")  # 1 span
    with pytest.raises(
        ValueError,
        match=r"6 parts, but the corpus splits into 5 pieces \(2 files: .*\): it allows at most 5 parts",
    ):
        prepare_dataset(corpus, tmp_path / "out", tokenizer=tokenizer, part=(1, 6), **SETTINGS)
    assert not (tmp_path / "out").exists()  # refused before anything is written
