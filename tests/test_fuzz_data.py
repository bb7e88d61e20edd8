"""Fuzzing the data layer's readers (issue 12): corpus files, manifests and the prepare journal.

Every corrupted variant must end in one of three ways:

* **error**: the project's own error (``ValueError`` or ``FileNotFoundError``) naming the file, and the line
  where there is one;
* **skip**: a counted, reported skip of the whole file (junk items of the corpus summary; problems listed by
  ``verify_dataset``);
* **read, parts reported**: a correct read of the valid parts, every dropped line, byte or character counted
  and reported by file (and line);
* **read**: a correct read.

Nothing may be silently garbled: for corpus files the documents read are compared with an independent reference
reader written here (decode with the encoding the reader chose, after checking that choice against the bytes;
drop the bytes that are not UTF-8 and the control characters; parse each JSON line), and a sample goes all the
way through ``prepare_dataset`` and is decoded back from the shards. A manifest or journal variant that is
accepted must give exactly the dataset of the undamaged run.

Seeded; the outcome counts are printed with ``pytest -s`` and recorded in docs/reliability.md.
"""

from __future__ import annotations

import codecs
import gzip
import io
import itertools
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import zlib
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tablefree.data.corpus import Corpus, CorpusError, JunkError
from tablefree.data.loader import (
    TokenLoader,
    document_bounds,
    read_manifest,
    validation_documents,
    verify_dataset,
)
from tablefree.data.prepare import STATE_FILE, prepare_dataset
from tablefree.data.shards import open_shard
from tablefree.data.tokenizer import load_tokenizer, train_tokenizer_from_texts

zstandard = pytest.importorskip("zstandard")

CONTROL = re.compile("[\x00-\x08\x0e-\x1f\x7f-\x9f]")
SURROGATE = re.compile("[\ud800-\udfff]")
BINARY_BYTES = re.compile(rb"[\x00-\x08\x0e-\x1a\x1c-\x1f]")
UTF16_BOMS = (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)
OUTCOMES: dict[str, Counter] = {}

WORDS = [
    "the",
    "whale’s",
    "café",
    "naïve",
    "“quoted”",
    "✓",
    "😀",
    "über",
    "Straße",
    "—",
    "rôle",
    "Ærø",
    "東京",
    "sea",
    "ship",
]


def sentences(rng: random.Random, n: int) -> list[str]:
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) for _ in range(n)]


def base_txt(rng: random.Random) -> str:
    lines = sentences(rng, rng.randint(10, 40))
    lines[rng.randrange(len(lines))] += "\tand a tab\f"
    return "\n".join(lines) + "\n"


def base_jsonl(rng: random.Random) -> list[dict]:
    return [{"text": s, "id": i} for i, s in enumerate(sentences(rng, rng.randint(8, 25)))]


def jsonl_bytes(records: list) -> bytes:
    return "".join(
        (r if isinstance(r, str) else json.dumps(r, ensure_ascii=False)) + "\n" for r in records
    ).encode()


# -- mutations --------------------------------------------------------------------------------------------


def truncate(rng: random.Random, data: bytes) -> bytes:
    return data[: rng.randrange(len(data) + 1)]


def flip(rng: random.Random, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        if out:
            out[rng.randrange(len(out))] = rng.randrange(256)
    return bytes(out)


def insert(rng: random.Random, data: bytes, pool: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        out.insert(rng.randrange(len(out) + 1), rng.choice(pool))
    return bytes(out)


def non_utf8(rng, data):
    return insert(rng, data, bytes(range(0x80, 0x100)))


def controls(rng, data):
    return insert(rng, data, b"\x00\x01\x07\x08\x0e\x1b\x1f\x7f")


def wrong_bom(rng, data):
    bom = rng.choice([codecs.BOM_UTF8, *UTF16_BOMS, codecs.BOM_UTF32_LE, codecs.BOM_UTF8 * 2])
    return bom + data


def as_utf16(rng, data):
    text = data.decode("utf-8", "ignore")
    encoded = text.encode(rng.choice(["utf-16", "utf-16-le", "utf-16-be"]))
    return encoded if rng.random() < 0.7 else truncate(rng, encoded)


def as_latin1(rng, data):
    return data.decode("utf-8", "ignore").encode("cp1252", "ignore")


def empty_lines(rng, data):
    lines = data.split(b"\n")
    for _ in range(rng.randint(1, 4)):
        lines.insert(rng.randrange(len(lines) + 1), rng.choice([b"", b"   ", b"\t", b"\r"]))
    return b"\n".join(lines)


BYTE_MUTATIONS = [truncate, flip, non_utf8, controls, wrong_bom, as_utf16, as_latin1, empty_lines]


def record_mutation(rng: random.Random, records: list) -> tuple[list, str]:
    """Damage one JSONL record: delete its field, give it a wrong type, a huge number, deep nesting, escaped
    control characters or a lone surrogate."""
    records = list(records)
    i = rng.randrange(len(records))
    kind = rng.choice(["delete", "type", "huge", "nest", "escapes", "surrogate", "not-object", "partial"])
    if kind == "delete":
        records[i] = {k: v for k, v in records[i].items() if k != "text"}
    elif kind == "type":
        records[i] = {**records[i], "text": rng.choice([42, 1.5, None, True, ["a"], {"t": "x"}])}
    elif kind == "huge":
        records[i] = json.dumps(records[i])[:-1] + ', "n": ' + "7" * rng.choice([4000, 4301, 20000]) + "}"
    elif kind == "nest":
        depth = rng.choice([50, 5_000, 200_000])
        records[i] = '{"text": ' + "[" * depth + "]" * depth + "}"
    elif kind == "escapes":
        records[i] = '{"text": "bell\\u0007 nul\\u0000 del\\u007f c1\\u0085 ok"}'
    elif kind == "surrogate":
        records[i] = '{"text": "lone \\ud83d and \\udc00 pair \\ud83d\\ude00"}'
    elif kind == "not-object":
        records[i] = rng.choice(['"just a string"', "[1, 2]", "null", "3"])
    else:
        records[i] = json.dumps(records[i])[: rng.randrange(1, 20)]
    return records, kind


# -- the reference reader -----------------------------------------------------------------------------------


def clean(text: str) -> str:
    return SURROGATE.sub("", CONTROL.sub("", text))


def utf8_counts(body: bytes) -> tuple[int, int]:
    """(bytes that are not UTF-8, non-ASCII characters that are) of ``body``."""
    text = body.decode("utf-8", "ignore")
    return len(body) - len(text.encode("utf-8")), sum(ord(c) > 127 for c in text)


def stray_bytes(body: bytes) -> int:
    """Of the bytes that are not UTF-8, those that do not read as Windows-1252 text either (the documented
    rule): an undefined byte, a symbol between two letters, an uppercase letter right after a lowercase one."""
    text = body.decode("utf-8", "surrogateescape")
    escaped = [0xDC80 <= ord(c) <= 0xDCFF for c in text]
    legacy = [
        bytes([ord(c) - 0xDC00]).decode("cp1252", "replace") if bad else (c if c.isascii() else " ")
        for c, bad in zip(text, escaped, strict=True)
    ]
    stray = 0
    for i in (i for i, bad in enumerate(escaped) if bad):
        char, before = legacy[i], legacy[i - 1] if i else " "
        after = legacy[i + 1] if i + 1 < len(legacy) else " "
        if char.isalpha():
            stray += char.isupper() and before.islower()
        elif char != "’":
            stray += char == "\ufffd" or (before.isalpha() and after.isalpha())
    return stray


def check_encoding_choice(payload: bytes, encoding: str, kinds: set[str]) -> None:
    """The reader's encoding must follow its documented rule, checked here against the bytes."""
    bom8 = payload.startswith(codecs.BOM_UTF8)
    body = payload[3:] if bom8 else payload
    invalid, multibyte = utf8_counts(body)
    if payload.startswith(UTF16_BOMS):
        invalid -= 2
    utf8 = bom8 or invalid <= 0 or multibyte >= invalid or 2 * stray_bytes(body) > invalid
    if encoding == "utf-16":
        assert payload.startswith(UTF16_BOMS) and b"\x00" in payload
        payload.decode("utf-16")  # the whole file must decode
    elif encoding in ("utf-8", "utf-8-sig"):
        assert (encoding == "utf-8-sig") == bom8
        assert utf8
    else:
        assert encoding in ("cp1252", "latin-1") and not utf8
        assert not multibyte or "mixed-encoding" in kinds  # UTF-8 read as legacy text is reported


def reference_text(payload: bytes, encoding: str) -> str:
    if encoding in ("utf-8", "utf-8-sig"):
        body = payload[3:] if encoding == "utf-8-sig" else payload
        return body.decode("utf-8", "ignore")
    return payload.decode(encoding)


def bad_lines(payload: bytes, encoding: str) -> list[int]:
    """Lines holding bytes that are not UTF-8 (for a file read as UTF-8)."""
    if encoding not in ("utf-8", "utf-8-sig"):
        return []
    body = payload[3:] if encoding == "utf-8-sig" else payload
    found = []
    for number, line in enumerate(body.split(b"\n"), start=1):
        try:
            line.decode("utf-8")
        except UnicodeDecodeError:
            found.append(number)
    return found


def unique_keys(pairs: list[tuple[str, object]]) -> dict:
    keys = [key for key, _ in pairs]
    if len(set(keys)) < len(keys):
        raise ValueError(f"a key twice in {keys}")
    return dict(pairs)


def reference_jsonl(text: str) -> tuple[list[str], dict[int, str]]:
    docs, junk = [], {}
    for number, line in enumerate(text.split("\n"), start=1):
        line = clean(line)
        if not line.strip():
            continue
        try:
            record = json.loads(line, object_pairs_hook=unique_keys)
        except (ValueError, RecursionError):
            junk[number] = "invalid-json"
            continue
        if not isinstance(record, dict) or record.get("text") is None:
            junk[number] = "missing-field"
        elif not isinstance(record["text"], str):
            junk[number] = "bad-field"
        elif clean(record["text"]).strip():
            docs.append(clean(record["text"]))
        else:
            junk[number] = "empty"
    return docs, junk


def decompress(data: bytes, compression: str | None) -> bytes | None:
    """The payload of a (possibly damaged) compressed file, or None when it is not whole."""
    try:
        if compression == "gz":
            return gzip.decompress(data)
        if compression == "zst":
            frame = zstandard.ZstdDecompressor().decompressobj()
            out = frame.decompress(data)
            return out if frame.eof and not frame.unused_data else None
    except (OSError, EOFError, zlib.error, zstandard.ZstdError):
        return None
    return data


def looks_binary(payload: bytes) -> bool:
    head = payload[:8192]
    return not head.startswith(UTF16_BOMS) and len(BINARY_BYTES.findall(head)) > 0.05 * max(1, len(head))


def read_corpus_file(
    root: Path, name: str, data: bytes, kind: str, compression: str | None
) -> tuple[str, list]:
    """Write one corpus file, read it, and check the result against the reference. Returns the outcome and the
    documents read."""
    path = root / name
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    path.write_bytes(data)
    try:
        corpus = Corpus(root)
        summary = corpus.scan()
        docs = list(corpus.documents())
    except (ValueError, FileNotFoundError) as error:
        assert name in str(error), f"error does not name the file: {error}"
        return "error", []
    assert summary.documents == len(docs)
    info = summary.files[0]
    kinds = {j.kind for j in summary.junk}
    assert all(j.file == name for j in summary.junk)
    payload = decompress(data, compression)
    if info.encoding is None:  # the whole file skipped, and said why
        file_kinds = {j.kind for j in summary.junk if j.line is None}
        assert docs == [] and len(file_kinds) == 1
        (why,) = file_kinds
        if why == "unreadable":
            assert payload is None
        elif why == "binary":
            assert payload is not None and looks_binary(payload)
        else:
            assert why == "empty" and payload is not None
            assert not (payload[3:] if payload.startswith(codecs.BOM_UTF8) else payload).strip()
        return "skip", docs
    assert payload is not None, "read a compressed file that is not whole"
    check_encoding_choice(payload, info.encoding, kinds)
    text = reference_text(payload, info.encoding)
    if kind == "txt":
        if info.encoding == "utf-8-sig":
            text = text.lstrip("\ufeff")  # no byte-order mark enters the text, a doubled one neither
        expected = [clean(text)] if clean(text).strip() else []
        line_junk: dict[int, str] = {}
    else:
        expected, line_junk = reference_jsonl(text)
    assert docs == expected, "documents differ from the source's valid parts"
    reported = {j.line: j.kind for j in summary.junk if j.line is not None and j.kind != "invalid-utf8"}
    assert reported == line_junk
    bad = bad_lines(payload, info.encoding)
    assert [j.line for j in summary.junk if j.kind == "invalid-utf8" and j.line is not None] == bad[:10]
    return ("read" if not summary.junk else "read, parts reported"), docs


def record(name: str, outcomes: Counter) -> None:
    OUTCOMES[name] = outcomes
    total = sum(outcomes.values())
    print(f"\nfuzz {name}: {total} variants: " + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())))


# -- corpus files -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["txt", "jsonl"])
def test_fuzz_plain_corpus_files(kind, tmp_path) -> None:
    rng = random.Random(f"plain-{kind}")
    outcomes: Counter = Counter()
    for variant in range(160):
        if kind == "txt":
            data = base_txt(rng).encode()
            how = rng.choice(BYTE_MUTATIONS)
            data = how(rng, data)
            label = how.__name__
        else:
            records = base_jsonl(rng)
            if rng.random() < 0.5:
                records, label = record_mutation(rng, records)
                data = jsonl_bytes(records)
            else:
                how = rng.choice(BYTE_MUTATIONS)
                data, label = how(rng, jsonl_bytes(records)), how.__name__
        try:
            outcome, _ = read_corpus_file(tmp_path / "c", f"doc.{kind}", data, kind, None)
        except AssertionError as error:
            raise AssertionError(f"variant {variant} ({label}): {error}") from error
        outcomes[outcome] += 1
    record(f"corpus-{kind}", outcomes)
    assert sum(outcomes.values()) == 160 and outcomes["read"] and outcomes["read, parts reported"]


@pytest.mark.parametrize("compression", ["gz", "zst"])
def test_fuzz_compressed_corpus_files(compression, tmp_path) -> None:
    rng = random.Random(f"compressed-{compression}")
    outcomes: Counter = Counter()
    for variant in range(90):
        kind = rng.choice(["txt", "jsonl"])
        payload = base_txt(rng).encode() if kind == "txt" else jsonl_bytes(base_jsonl(rng))
        if rng.random() < 0.4:
            payload = rng.choice(BYTE_MUTATIONS)(rng, payload)
        if compression == "gz":
            data = gzip.compress(payload, mtime=0)
        else:
            data = zstandard.ZstdCompressor(write_checksum=rng.random() < 0.5).compress(payload)
        label = "payload"
        if rng.random() < 0.7:
            how = rng.choice([truncate, flip])
            data, label = how(rng, data), how.__name__
        try:
            outcome, _ = read_corpus_file(
                tmp_path / "c", f"doc.{kind}.{compression}", data, kind, compression
            )
        except AssertionError as error:
            raise AssertionError(f"variant {variant} ({label}): {error}") from error
        outcomes[outcome] += 1
    record(f"corpus-{compression}", outcomes)
    assert sum(outcomes.values()) == 90 and outcomes["skip"]


def test_fuzz_parquet_corpus_files(tmp_path) -> None:
    rng = random.Random("parquet")
    outcomes: Counter = Counter()
    for variant in range(80):
        values: list = sentences(rng, rng.randint(5, 30))
        label = "rows"
        column = "text"
        if rng.random() < 0.5:
            label = rng.choice(["null", "blank", "controls", "column", "ints"])
            i = rng.randrange(len(values))
            if label == "null":
                values[i] = None
            elif label == "blank":
                values[i] = rng.choice(["", "   ", "\n"])
            elif label == "controls":
                values[i] = "nul\x00 bell\x07 c1\x85 text"
            elif label == "column":
                column = "body"
        table = pa.table({column: list(range(len(values))) if label == "ints" else values})
        buffer = io.BytesIO()
        pq.write_table(table, buffer, write_page_checksum=True)
        data = buffer.getvalue()
        damaged = rng.random() < 0.6
        if damaged:
            how = rng.choice([truncate, flip])
            data, label = how(rng, data), how.__name__
        (tmp_path / "c").mkdir(exist_ok=True)
        path = tmp_path / "c" / "rows.parquet"
        path.write_bytes(data)
        try:
            corpus = Corpus(tmp_path / "c")
            summary = corpus.scan()
            docs = list(corpus.documents())
        except (ValueError, FileNotFoundError) as error:
            assert "rows.parquet" in str(error), f"variant {variant} ({label}): {error}"
            outcomes["error"] += 1
            continue
        assert summary.documents == len(docs)
        assert all(not CONTROL.search(d) and not SURROGATE.search(d) for d in docs)
        expected = (
            []
            if label in ("column", "ints")
            else [clean(v) for v in values if isinstance(v, str) and clean(v).strip()]
        )
        # damage found and reported for the file (unreadable pages, a column name changed in the footer):
        # the rows read before it are rows of the file
        unreadable = [
            j
            for j in summary.junk
            if j.kind == "unreadable" or (j.kind == "missing-field" and j.line is None)
        ]
        if unreadable and label not in ("column", "ints"):
            assert damaged and all(d in expected for d in docs), f"variant {variant} ({label})"
        else:  # page checksums and the row count catch every damage that reaches a row
            assert docs == expected, f"variant {variant} ({label}): rows changed silently"
        if unreadable or not summary.files[0].encoding:
            outcomes["skip"] += 1
        else:
            outcomes["read, parts reported" if summary.junk else "read"] += 1
    record("corpus-parquet", outcomes)
    assert sum(outcomes.values()) == 80 and outcomes["read"] and outcomes["skip"]


# -- end to end: what reaches the shards -------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory):
    rng = random.Random("tokenizer")
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    train_tokenizer_from_texts([base_txt(rng) for _ in range(20)], 300, path)
    return path


def shard_documents(data_dir: Path, tokenizer) -> list[str]:
    manifest = read_manifest(data_dir)
    texts = []
    for split in ("train", "val"):
        paths = [data_dir / s["file"] for s in manifest["splits"][split]["shards"]]
        if not paths:
            continue
        stream = np.concatenate([np.asarray(open_shard(p)) for p in paths])
        bounds = [*np.flatnonzero(stream == manifest["eot_id"]).tolist(), len(stream)]
        texts += [tokenizer.decode(stream[a + 1 : b].tolist()) for a, b in itertools.pairwise(bounds)]
    return texts


def test_fuzz_corpus_through_prepare_to_the_shards(tokenizer_file, tmp_path) -> None:
    """A sample of damaged files prepared into shards: decoded back, the documents are the reference's."""
    rng = random.Random("end-to-end")
    tokenizer = load_tokenizer(tokenizer_file)
    outcomes: Counter = Counter()
    for variant in range(40):
        kind = rng.choice(["txt", "jsonl"])
        if kind == "txt":
            payload = base_txt(rng).encode()
        else:
            payload = jsonl_bytes(record_mutation(rng, base_jsonl(rng))[0])
        how = rng.choice(BYTE_MUTATIONS)
        payload = how(rng, payload)
        compression = rng.choice([None, "gz"])
        data = gzip.compress(payload, mtime=0) if compression else payload
        name = f"doc.{kind}" + (".gz" if compression else "")
        outcome, docs = read_corpus_file(tmp_path / "c", name, data, kind, compression)
        out = tmp_path / f"d{variant}"
        try:
            prepare_dataset(
                tmp_path / "c", out, tokenizer=tokenizer_file, val_fraction=0.0, workers=1, progress=False
            )
        except ValueError as error:
            assert not docs and "no valid document" in str(error) and str(tmp_path / "c") in str(error)
            outcomes["error"] += 1
            continue
        assert shard_documents(out, tokenizer) == docs, f"variant {variant} ({how.__name__})"
        outcomes[outcome] += 1
    record("prepare-end-to-end", outcomes)
    assert sum(outcomes.values()) == 40


# -- manifests and the prepare journal ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def prepared(tokenizer_file, tmp_path_factory):
    """A small dataset, and the journal of the same preparation interrupted after its third shard."""
    rng = random.Random("prepared")
    root = tmp_path_factory.mktemp("corpus")
    for i in range(6):
        (root / f"book{i}.txt").write_text("".join(base_txt(rng) for _ in range(8)), encoding="utf-8")
    kwargs = dict(
        tokenizer=tokenizer_file,
        workers=1,
        shard_tokens=1500,
        val_section_chars=2_000,
        val_fraction=0.2,
        progress=False,
    )
    complete = tmp_path_factory.mktemp("complete")
    manifest = prepare_dataset(root, complete, **kwargs)
    interrupted = tmp_path_factory.mktemp("interrupted")
    from tablefree.data.writer import SplitWriter

    original, calls = SplitWriter._write, []

    def crash_after_three(self, on_shard):
        if len([c for c in calls if c]) >= 3:
            raise KeyboardInterrupt
        calls.append(True)
        original(self, on_shard)

    SplitWriter._write = crash_after_three
    try:
        with pytest.raises(KeyboardInterrupt):
            prepare_dataset(root, interrupted, **kwargs)
    finally:
        SplitWriter._write = original
    assert (interrupted / STATE_FILE).exists()
    return root, complete, manifest, interrupted, kwargs


def json_paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from json_paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from json_paths(value, (*prefix, i))


def mutate_json(rng: random.Random, text: str) -> tuple[bytes, str]:
    """A damaged JSON file: bytes truncated or flipped, a field deleted, a wrong type, a huge number, deep
    nesting, blank lines, bytes that are not UTF-8, or a byte-order mark."""
    kind = rng.choice(["truncate", "flip", "delete", "type", "huge", "nest", "blank", "non-utf8", "bom"])
    data = text.encode()
    if kind == "truncate":
        return truncate(rng, data), kind
    if kind == "flip":
        return flip(rng, data), kind
    if kind == "non-utf8":
        return non_utf8(rng, data), kind
    if kind == "bom":
        return rng.choice([codecs.BOM_UTF8 + data, text.encode("utf-16")]), kind
    if kind == "blank":
        return empty_lines(rng, data), kind
    tree = json.loads(text)
    path = rng.choice([p for p in json_paths(tree) if p])
    parent = tree
    for key in path[:-1]:
        parent = parent[key]
    last = path[-1]
    if kind == "delete":
        del parent[last]
        return json.dumps(tree, indent=2).encode(), f"{kind} {'.'.join(map(str, path))}"
    if kind == "type":
        parent[last] = rng.choice(["x", -1, 2.5, None, True, [], {}, 2**70])
        return json.dumps(tree, indent=2).encode(), f"{kind} {'.'.join(map(str, path))}"
    marker = "__HERE__"
    parent[last] = marker
    dumped = json.dumps(tree, indent=2)
    value = "9" * 5000 if kind == "huge" else "[" * 100_000 + "]" * 100_000
    return dumped.replace(f'"{marker}"', value).encode(), f"{kind} {'.'.join(map(str, path))}"


def use_dataset(data_dir: Path) -> str:
    """Everything that reads a prepared dataset; returns 'read' or 'skip' (problems reported by verify)."""
    read_manifest(data_dir)
    for split in ("train", "val"):
        loader = TokenLoader.from_dir(data_dir, split, seq_len=16, batch_size=2, shuffle=False)
        loader.batch(0)
    document_bounds(data_dir, "val")
    validation_documents(data_dir)
    check = verify_dataset(data_dir)
    return "read" if check.ok else "skip"


def test_fuzz_manifests(prepared, tmp_path) -> None:
    _, complete, manifest, _, _ = prepared
    text = (complete / "manifest.json").read_text()
    rng = random.Random("manifest")
    outcomes: Counter = Counter()
    work = tmp_path / "d"
    shutil.copytree(complete, work)
    for variant in range(150):
        data, label = mutate_json(rng, text)
        (work / "manifest.json").write_bytes(data)
        try:
            outcome = use_dataset(work)
        except (ValueError, FileNotFoundError) as error:
            message = str(error)
            assert "manifest.json" in message or ".bin" in message, f"variant {variant} ({label}): {message}"
            if "malformed JSON" in message and "nested" not in message and "digit" not in message:
                assert "line" in message, f"variant {variant} ({label}): {message}"
            outcomes["error"] += 1
            continue
        except Exception as error:
            raise AssertionError(f"variant {variant} ({label}): {type(error).__name__}: {error}") from error
        if outcome == "read":  # accepted: must read the dataset as the intact manifest does
            got = read_manifest(work)
            for split in ("train", "val"):
                assert [s["file"] for s in got["splits"][split]["shards"]] == [
                    s["file"] for s in manifest["splits"][split]["shards"]
                ], f"variant {variant} ({label})"
            assert document_bounds(work, "val").tolist() == [
                *manifest["splits"]["val"]["document_starts"],
                manifest["splits"]["val"]["tokens"],
            ], f"variant {variant} ({label})"
        outcomes[outcome] += 1
    record("manifest", outcomes)
    assert sum(outcomes.values()) == 150 and outcomes["error"] and outcomes["read"]


def test_fuzz_prepare_journal(prepared, tmp_path) -> None:
    root, _complete, manifest, interrupted, kwargs = prepared
    text = (interrupted / STATE_FILE).read_text()
    expected = {s["sha256"] for split in manifest["splits"].values() for s in split["shards"]}
    rng = random.Random("journal")
    outcomes: Counter = Counter()
    for variant in range(60):
        work = tmp_path / f"j{variant}"
        shutil.copytree(interrupted, work)
        data, label = mutate_json(rng, text)
        (work / STATE_FILE).write_bytes(data)
        try:
            got = prepare_dataset(root, work, **kwargs)
        except (ValueError, FileNotFoundError) as error:
            assert STATE_FILE in str(error), f"variant {variant} ({label}): {error}"
            outcomes["error"] += 1
            continue
        except Exception as error:
            raise AssertionError(f"variant {variant} ({label}): {type(error).__name__}: {error}") from error
        # accepted: the resumed dataset is exactly the uninterrupted one
        assert {s["sha256"] for split in got["splits"].values() for s in split["shards"]} == expected, (
            f"variant {variant} ({label})"
        )
        assert got["splits"]["val"]["document_starts"] == manifest["splits"]["val"]["document_starts"]
        assert verify_dataset(work).ok
        outcomes["read"] += 1
        shutil.rmtree(work)
    record("prepare-journal", outcomes)
    assert sum(outcomes.values()) == 60 and outcomes["error"] and outcomes["read"]


# -- issue 26: what a corpus directory holds besides files, stray bytes, a key twice --------------------------


@pytest.fixture
def watchdog():
    """Fail, rather than hang, when reading blocks (a FIFO opened for reading waits for a writer forever)."""

    def expire(signum, frame):
        raise AssertionError("reading the corpus hung")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(30)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def ascii_book(rng: random.Random, lines: int = 60) -> str:
    words = ["the", "whale", "sea", "ship", "captain", "deck", "rope", "storm", "harbour", "sail"]
    return "".join(
        " ".join(rng.choice(words) for _ in range(rng.randint(4, 12))) + "\n" for _ in range(lines)
    )


def make_entry(rng: random.Random, root: Path, outside: Path, name: str, kind: str) -> tuple[str | None, str]:
    """Create one entry ``name`` of ``kind`` under ``root``; returns (the junk kind the listing must report or
    None when the entry's books are read, what the entry is)."""
    path = root / name
    if kind == "fifo":
        os.mkfifo(path)
        return "not-regular", kind
    if kind == "dev-zero":
        path.symlink_to("/dev/zero")
        return "not-regular", kind
    if kind == "dangling":
        path.symlink_to(root / "no-such-book.txt")
        return "dangling-link", kind
    if kind == "loop":
        path.symlink_to(root / f"{name}.other")
        (root / f"{name}.other").symlink_to(path)
        return "link-loop", kind
    if kind == "ancestor":
        path.mkdir()
        (path / "up").symlink_to(root)
        return "link-loop", kind
    if kind == "linked-dir":
        target = outside / name
        target.mkdir(parents=True)
        (target / "linked.txt").write_text(ascii_book(rng, 5))
        path.symlink_to(target)
        return None, kind
    if kind == "same-file":
        path.symlink_to(root / "book.txt")
        return "duplicate", kind
    raise ValueError(kind)


ENTRY_KINDS = ["fifo", "dev-zero", "dangling", "loop", "ancestor", "linked-dir", "same-file"]


def test_fuzz_corpus_directories_name_every_entry_not_read(tmp_path, watchdog) -> None:
    """Issue 26: inside a corpus directory, dangling links, link loops, linked subdirectories, FIFOs and links to
    /dev/zero were skipped without a word, or hung the scan. Every entry is now read or named with its kind."""
    rng = random.Random("entries")
    outcomes: Counter = Counter()
    for variant in range(30):
        root, outside = tmp_path / f"c{variant}", tmp_path / f"outside{variant}"
        (root / "deep" / "er").mkdir(parents=True)
        outside.mkdir()
        (root / "book.txt").write_text(ascii_book(rng, 5))
        (root / "deep" / "er" / "inner.txt").write_text(ascii_book(rng, 5))
        expected_junk, expected_read = {}, {"book.txt", "deep/er/inner.txt"}
        for i in range(rng.randint(1, 4)):
            kind = rng.choice(ENTRY_KINDS)
            name = f"{rng.choice(['', 'deep/', 'deep/er/'])}{kind}{i}" + (
                ".txt" if rng.random() < 0.7 else ""
            )
            if kind in ("same-file", "loop") and not name.endswith(".txt"):
                name += ".txt"  # an unsupported suffix is reported as such before its target is looked at
            junk_kind, _ = make_entry(rng, root, outside, name, kind)
            if junk_kind is None:
                expected_read.add(f"{name}/linked.txt")
            else:
                expected_junk[name] = junk_kind
                if kind == "loop":
                    expected_junk[f"{name}.other"] = "link-loop"
            if kind == "ancestor":
                expected_junk[f"{name}/up"] = expected_junk.pop(name)
        corpus = Corpus(root)
        summary = corpus.scan()
        read = {info.file for info in summary.files if info.encoding}
        junk = {j.file: j.kind for j in summary.junk}
        unsupported = {name for name, kind in junk.items() if kind == "unsupported"}
        assert read == expected_read, f"variant {variant}"
        assert {k: v for k, v in junk.items() if k not in unsupported} == {
            k: v for k, v in expected_junk.items() if k not in unsupported
        }, f"variant {variant}"
        assert all(not k.endswith(".txt") for k in unsupported)
        assert len(list(corpus.documents())) == len(expected_read)
        outcomes.update(expected_junk.values())
        outcomes["read"] += len(expected_read)
    record("corpus-entries", outcomes)
    assert all(outcomes[kind] for kind in ("not-regular", "dangling-link", "link-loop", "duplicate"))


def run_cli(*args: str, as_user: bool = False, timeout: float = 60) -> subprocess.CompletedProcess:
    """``tablefree ARGS`` as a user starts it. ``as_user``: without root's right to read any file (the
    capabilities that bypass file permissions are dropped), so a mode-000 file is unreadable as for anyone."""
    command = [sys.executable, "-m", "tablefree.cli", *args]
    if as_user and os.geteuid() == 0:
        if not shutil.which("setpriv"):
            pytest.skip("running as root without setpriv: a mode-000 file is readable")
        command = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", *command]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout)


def error_lines(result: subprocess.CompletedProcess) -> list[str]:
    assert "Traceback" not in result.stderr, result.stderr
    return [line for line in result.stderr.splitlines() if "error" in line]


def test_unreadable_files_and_directories_are_named_not_raised(tmp_path, tokenizer_file) -> None:
    """Issue 26: a mode-000 corpus file ended `data prepare` in a raw PermissionError; an unreadable subdirectory
    was skipped without a word. (As root the test drops the capabilities that let root read anything.)"""
    root = tmp_path / "c"
    (root / "locked").mkdir(parents=True)
    rng = random.Random("unreadable")
    (root / "book.txt").write_text(ascii_book(rng))
    (root / "locked" / "hidden.txt").write_text(ascii_book(rng))
    (root / "secret.txt").write_text(ascii_book(rng))
    (root / "secret.txt").chmod(0)
    (root / "locked").chmod(0)
    try:
        scan = run_cli("data", "scan", str(root), as_user=True)
        out = tmp_path / "d"
        prepare = run_cli(
            "data", "prepare", str(root), "--out", str(out), "--tokenizer", str(tokenizer_file),
            "--val-fraction", "0", "--no-progress", as_user=True,
        )  # fmt: skip
        alone = run_cli(
            "data", "prepare", str(root / "secret.txt"), "--out", str(tmp_path / "e"), "--no-progress", as_user=True
        )  # fmt: skip
    finally:
        (root / "locked").chmod(0o755)
        (root / "secret.txt").chmod(0o644)
    for result in (scan, prepare):
        assert result.returncode == 0, result.stderr
        assert "Traceback" not in result.stderr
        assert "secret.txt: unreadable: cannot be read (Permission denied)" in result.stdout
        assert "locked: unreadable: directory not listed (Permission denied)" in result.stdout
    (error,) = error_lines(alone)
    assert alone.returncode == 1 and "secret.txt: no valid document" in error and "unreadable 1" in error


@pytest.mark.parametrize("entry", ["fifo", "dev-zero"])
def test_a_fifo_or_a_device_given_as_the_corpus_never_hangs(tmp_path, entry) -> None:
    """Issue 26: a FIFO or a link to /dev/zero given as the corpus hung `data prepare` and `data scan`."""
    path = tmp_path / "corpus.txt"
    os.mkfifo(path) if entry == "fifo" else path.symlink_to("/dev/zero")
    for verb in (["data", "scan"], ["data", "prepare", "--out", str(tmp_path / "d")]):
        result = run_cli(*verb, str(path), timeout=60)
        (error,) = error_lines(result)
        assert (
            result.returncode == 1 and "corpus.txt: not-regular: " in error and "not a regular file" in error
        )


def test_fuzz_stray_bytes_in_ascii_and_bom_books(tmp_path) -> None:
    """Issue 26: one stray byte in a pure-ASCII book made the whole file CP1252 (the byte became `€` mid-word);
    stray bytes in a UTF-8 book with a BOM did the same, and the BOM entered the text as `ï»¿`. The reference
    check holds the reader to its documented rule; the BOM never reaches a document."""
    rng = random.Random("stray")
    outcomes: Counter = Counter()
    for variant in range(80):
        book = ascii_book(rng, rng.randint(20, 200))
        bom = rng.random() < 0.4
        if bom and rng.random() < 0.5:
            book = book.replace("e", "é", 1)  # a UTF-8 character beside the stray bytes
        data = insert(rng, book.encode(), bytes(range(0x80, 0x100)))
        kind = rng.choice(["txt", "jsonl"])
        if kind == "jsonl":  # the stray bytes inside JSON strings
            data = b"".join(b'{"text": "' + line + b'"}\n' for line in data.split(b"\n") if line)
        data = codecs.BOM_UTF8 + data if bom else data
        try:
            outcome, docs = read_corpus_file(tmp_path / "c", f"book.{kind}", data, kind, None)
        except AssertionError as error:
            raise AssertionError(f"variant {variant}: {error}") from error
        assert not any("\ufeff" in doc or "ï»¿" in doc for doc in docs), f"variant {variant}"
        encoding = Corpus(tmp_path / "c").scan().files[0].encoding
        if bom:
            assert encoding == "utf-8-sig", f"variant {variant}"
        outcomes[f"{encoding}, {outcome}"] += 1
    # the issue's own case: a stray 0x80 mid-word in an ASCII book is dropped and reported, not read as €
    book = ascii_book(rng).replace("whale", "wh\x80ale", 1)
    (tmp_path / "c" / "book.txt").write_bytes(book.encode("latin-1"))
    (tmp_path / "c" / "book.jsonl").unlink(missing_ok=True)
    corpus = Corpus(tmp_path / "c")
    summary = corpus.scan()
    assert list(corpus.documents()) == [book.replace("\x80", "")] and summary.files[0].encoding == "utf-8"
    line = next(number for number, text in enumerate(book.split("\n"), start=1) if "\x80" in text)
    assert [str(j) for j in summary.junk] == [
        f"book.txt:{line}: invalid-utf8: 1 byte(s) not UTF-8 dropped: 80"
    ]
    record("corpus-stray-bytes", outcomes)
    assert any(k.startswith("utf-8,") for k in outcomes) and any(k.startswith("utf-8-sig") for k in outcomes)


def test_fuzz_jsonl_records_with_a_key_twice(tmp_path) -> None:
    """Issue 26: a `"text"` key written twice kept the last value and dropped the real text without a word."""
    rng = random.Random("duplicate-keys")
    outcomes: Counter = Counter()
    for variant in range(40):
        records = base_jsonl(rng)
        i = rng.randrange(len(records))
        key = rng.choice(["text", "text", "id"])
        second = json.dumps(rng.choice(["the real text?", "", 7, None]))
        first = json.dumps(records[i])
        records[i] = (
            first[:-1] + f', "{key}": {second}}}'
            if rng.random() < 0.5
            else f'{{"{key}": {second}, ' + first[1:]
        )
        outcome, _ = read_corpus_file(tmp_path / "c", "docs.jsonl", jsonl_bytes(records), "jsonl", None)
        summary = Corpus(tmp_path / "c").scan()
        assert [(j.line, j.kind) for j in summary.junk] == [(i + 1, "invalid-json")], f"variant {variant}"
        assert f"duplicate key '{key}'" in summary.junk[0].detail
        with pytest.raises(JunkError, match=rf"docs\.jsonl:{i + 1}: invalid-json: duplicate key"):
            Corpus(tmp_path / "c", strict=True).scan()
        outcomes[outcome] += 1
    record("corpus-duplicate-keys", outcomes)
    assert outcomes == Counter({"read, parts reported": 40})


@pytest.fixture
def small_disk(tmp_path):
    """A 64 KiB tmpfs: a real full disk (ENOSPC from the kernel), mounted as root, or the test is skipped."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if (
        os.geteuid() != 0
        or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)]).returncode
    ):
        pytest.skip("mounting a small tmpfs needs root")
    yield disk
    subprocess.run(["umount", str(disk)], check=True)


def test_a_full_disk_is_one_line_and_prepare_recovers_byte_identically(tmp_path, tokenizer_file, small_disk):
    """Issue 26: a full disk gave raw OSError tracebacks in `data prepare`; it is one line naming the mount and
    the file, no partial file stays, and once space is freed the same command finishes the identical dataset."""
    rng = random.Random("full-disk")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(4):
        (corpus / f"book{i}.txt").write_text(ascii_book(rng, 600))
    args = [
        "--tokenizer",
        str(tokenizer_file),
        "--val-fraction",
        "0",
        "--shard-tokens",
        "4096",
        "--no-progress",
    ]
    full = run_cli("data", "prepare", str(corpus), "--out", str(small_disk / "d"), *args)
    (error,) = error_lines(full)
    assert full.returncode == 1
    assert re.fullmatch(
        rf"tablefree data: error: no space left on {small_disk} while writing {small_disk}/d/\S+", error
    )
    assert not [p for p in (small_disk / "d").iterdir() if ".tmp." in p.name]
    subprocess.run(["mount", "-o", "remount,size=8m", str(small_disk)], check=True)
    assert run_cli("data", "prepare", str(corpus), "--out", str(small_disk / "d"), *args).returncode == 0
    assert run_cli("data", "prepare", str(corpus), "--out", str(tmp_path / "ref"), *args).returncode == 0
    for name in sorted(p.name for p in (tmp_path / "ref").iterdir() if p.suffix == ".bin"):
        assert (small_disk / "d" / name).read_bytes() == (tmp_path / "ref" / name).read_bytes()
    assert read_manifest(small_disk / "d")["splits"] == read_manifest(tmp_path / "ref")["splits"]


def bomb(compression: str, member_bytes: int, members: int) -> bytes:
    """``members`` compressed copies of ``member_bytes`` of one letter, as one multi-member (multi-frame) file:
    cheap to make however far it expands."""
    data = b"a" * member_bytes
    member = (
        gzip.compress(data, compresslevel=9, mtime=0)
        if compression == "gz"
        else zstandard.ZstdCompressor(level=19).compress(data)
    )
    return member * members


@pytest.mark.parametrize("compression", ["gz", "zst"])
def test_a_decompression_bomb_is_refused_in_one_line_naming_the_file(tmp_path, compression) -> None:
    """Issue 35: an 8.7 MB .gz that expands to 2 GB of one letter kept `data scan` silent for 60 s. A file that
    expands past the bound (100 times the compressed bytes read, plus 1 MiB) is refused in one line naming it
    and the option that raises the bound, long before it is read whole (here 2 GiB from about 2 MB); the scan
    shows its progress on stderr."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a-book.txt").write_text("A sound book.\n" * 50)
    path = corpus / f"one-letter.txt.{compression}"
    path.write_bytes(bomb(compression, 64 << 20, 32))  # 2 GiB of "a"
    for verb in (["data", "scan"], ["data", "prepare", "--out", str(tmp_path / "d"), "--vocab-size", "300"]):
        result = run_cli(*verb, str(corpus), timeout=90)
        (error,) = error_lines(result)
        assert result.returncode == 1, result.stderr
        assert (
            f"error: one-letter.txt.{compression}: its {compression} data expands more than 100 times"
            in error
        )
        assert "--max-expansion RATIO" in error
    assert "scanning:" in result.stderr and "file 2/2 one-letter.txt" in result.stderr  # the progress bar
    assert not (tmp_path / "d" / "manifest.json").exists()
    with pytest.raises(CorpusError, match=rf"one-letter\.txt\.{compression}: its {compression} data expands"):
        Corpus(corpus).scan()


@pytest.mark.parametrize("compression", ["gz", "zst"])
def test_the_expansion_bound_can_be_raised_and_a_sound_file_is_read_whole(tmp_path, compression) -> None:
    """The bound is an option: a file over 1000 times compressed (4 MiB of one letter) is refused by default and
    read whole with --max-expansion 1e6 (Python: max_expansion=1e6)."""
    path = tmp_path / f"repetitive.txt.{compression}"
    path.write_bytes(bomb(compression, 1 << 20, 4))
    with pytest.raises(CorpusError, match=r"raise the bound: --max-expansion RATIO"):
        Corpus(path).scan()
    corpus = Corpus(path, max_expansion=1e6)
    assert corpus.scan().documents == 1
    assert list(corpus.documents()) == ["a" * (4 << 20)]
    result = run_cli("data", "scan", str(path), "--max-expansion", "1e6", "--json", "--no-progress")
    assert result.returncode == 0 and json.loads(result.stdout)["documents"] == 1
    assert result.stderr == ""  # --no-progress: nothing on stderr
    with pytest.raises(ValueError, match=r"max_expansion must be positive, got 0"):
        Corpus(path, max_expansion=0)
