from __future__ import annotations

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from tablefree.cli import main
from tablefree.data.corpus import Corpus, JunkError, strip_gutenberg

MIX = "corpus/gutenberg-mix"


def test_shared_corpus_encodings_match_the_bytes(shared_data) -> None:
    """Counts checked against the files themselves: a file needs a fallback exactly when it is not UTF-8."""
    root = shared_data / MIX
    files = sorted(root.rglob("*.txt"))
    raw = {p.relative_to(root).as_posix(): p.read_bytes() for p in files}

    def is_utf8(data: bytes) -> bool:
        try:
            data.decode("utf-8")
            return True
        except UnicodeDecodeError:
            return False

    expected_fallback = sorted(name for name, data in raw.items() if not is_utf8(data))
    expected_bom = sum(data.startswith(b"\xef\xbb\xbf") for data in raw.values())
    summary = Corpus(root).scan()
    assert summary.documents == len(files) == 57
    assert sorted(summary.fallback_files) == expected_fallback
    # The shared README says 8 ISO-8859-1 files; the bytes say 9 (none uses CP1252's 0x80-0x9F range).
    assert len(expected_fallback) == 9
    assert summary.encodings == {
        "latin-1": len(expected_fallback),
        "utf-8-sig": expected_bom,
        "utf-8": len(files) - expected_bom - len(expected_fallback),
    }
    assert summary.junk == []


def test_shared_subset_decodes_each_encoding(shared_data) -> None:
    root = shared_data / MIX
    paths = [
        root / "holidays/christmas/charles.dickens.christmas.carol.txt",  # ISO-8859-1
        root / "literature/childrens/The Wonderful Wizard of Oz by L Frank Baum.txt",  # UTF-8 with BOM
        root / "literature/herman.melville.moby.dick.or.the.whale.txt",  # UTF-8
    ]
    corpus = Corpus(paths)
    summary = corpus.scan()
    assert [f.encoding for f in summary.files] == ["latin-1", "utf-8-sig", "utf-8"]
    dickens, oz, moby = corpus.documents()
    assert "Laocoön" in dickens
    assert not oz.startswith("\ufeff") and "Dorothy" in oz
    assert moby == paths[2].read_text(encoding="utf-8")


def write_messy_corpus(root):
    root.mkdir()
    (root / "a_utf8.txt").write_text("Plain UTF-8 text — with a dash.\n", encoding="utf-8")
    (root / "b_bom.txt").write_bytes(b"\xef\xbb\xbfBOM text\n")
    (root / "c_cp1252.txt").write_bytes(b"\x93Smart quotes\x94 and caf\xe9\n")
    (root / "d_latin1.txt").write_bytes(b"caf\xe9 and an undefined CP1252 byte \x81\n")
    (root / "e_binary.txt").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)))
    (root / "f_empty.txt").write_bytes(b"  \n\n")
    lines = [
        json.dumps({"text": "first json doc"}),
        "{not json",
        json.dumps({"body": "no text field"}),
        "",
        json.dumps({"text": 42}),
        json.dumps({"text": "   "}),
        json.dumps({"text": "second json doc"}),
    ]
    (root / "g_docs.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (root / "h_docs.jsonl.gz").write_bytes(gzip.compress(b'{"text": "gz doc"}\n'))
    (root / "i_docs.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(b'{"text": "zst doc"}\n'))
    (root / "j_doc.txt.gz").write_bytes(gzip.compress(b"gzipped text file\n"))
    (root / "k_broken.txt.gz").write_bytes(b"\x1f\x8b\x08\x00garbage")
    pq.write_table(pa.table({"text": ["parquet one", None, "parquet two"]}), root / "l_rows.parquet")
    (root / "m_notes.csv").write_text("a,b\n")
    (root / "sub").mkdir()
    (root / "sub" / "n_nested.txt").write_text("nested file\n")


def test_messy_corpus_reads_documents_and_names_junk(tmp_path) -> None:
    root = tmp_path / "corpus"
    write_messy_corpus(root)
    corpus = Corpus(root)
    summary = corpus.scan()
    docs = list(corpus.documents())
    assert docs == [
        "Plain UTF-8 text — with a dash.\n",
        "BOM text\n",
        "“Smart quotes” and café\n",
        "café and an undefined CP1252 byte \x81\n",
        "first json doc",
        "second json doc",
        "gz doc",
        "zst doc",
        "gzipped text file\n",
        "parquet one",
        "parquet two",
        "nested file\n",
    ]
    assert summary.documents == len(docs)
    by_file = {f.file: f.encoding for f in summary.files}
    assert by_file["c_cp1252.txt"] == "cp1252" and by_file["d_latin1.txt"] == "latin-1"
    assert len(summary.fallback_files) == 2
    junk = {(j.file, j.line, j.kind) for j in summary.junk}
    assert junk == {
        ("m_notes.csv", None, "unsupported"),
        ("e_binary.txt", None, "binary"),
        ("f_empty.txt", None, "empty"),
        ("g_docs.jsonl", 2, "invalid-json"),
        ("g_docs.jsonl", 3, "missing-field"),
        ("g_docs.jsonl", 5, "bad-field"),
        ("g_docs.jsonl", 6, "empty"),
        ("k_broken.txt.gz", None, "unreadable"),
        ("l_rows.parquet", 2, "missing-field"),
    }
    text = summary.format()
    assert "g_docs.jsonl:2: invalid-json" in text and "encoding fallbacks (CP1252/Latin-1): 2 files" in text
    assert list(corpus.documents(start=9)) == docs[9:]


def test_strict_mode_names_file_and_line(tmp_path) -> None:
    root = tmp_path / "c"
    root.mkdir()
    (root / "docs.jsonl").write_text('{"text": "ok"}\n{"text": "ok"}\n{broken\n')
    with pytest.raises(JunkError, match=r"docs\.jsonl:3: invalid-json"):
        Corpus(root, strict=True).scan()
    (root / "docs.jsonl").unlink()
    (root / "blob.txt").write_bytes(b"\x00\x01\x02binary")
    with pytest.raises(JunkError, match=r"blob\.txt: binary"):
        Corpus(root, strict=True).scan()


def test_missing_corpus_path_is_an_error(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="corpus path not found"):
        Corpus(tmp_path / "nope")
    (tmp_path / "x.csv").write_text("1")
    with pytest.raises(ValueError, match=r"no \.txt/\.jsonl/\.parquet files"):
        Corpus(tmp_path).scan()


def test_strip_gutenberg_keeps_only_the_body() -> None:
    text = (
        "The Project Gutenberg eBook of X\nLicense blah\n"
        "*** START OF THE PROJECT GUTENBERG EBOOK X ***\n\nChapter 1\nBody text.\n\n"
        "*** END OF THE PROJECT GUTENBERG EBOOK X ***\nMore license\n"
    )
    assert strip_gutenberg(text) == "Chapter 1\nBody text.\n"
    old_footer = "Body.\n\nEnd of Project Gutenberg's Moby Dick, by Herman Melville\nlicense\n"
    assert strip_gutenberg(old_footer) == "Body.\n"
    assert strip_gutenberg("no markers at all\n") == "no markers at all\n"


def test_scan_verb_reports_junk(tmp_path, capsys) -> None:
    root = tmp_path / "corpus"
    write_messy_corpus(root)
    assert main(["data", "scan", str(root), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["documents"] == 12 and report["encoding_fallbacks"] == 2
    assert report["junk"]["invalid-json"] == 1
    assert main(["data", "scan", str(root), "--strict"]) == 1
    assert "strict mode" in capsys.readouterr().err
