from __future__ import annotations

import gzip
import json
import re

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
    # The only junk: control characters in text (C0 but whitespace, DEL, C1), dropped and counted per file.
    # Ulysses holds 21 U+0081, each in a doubly encoded "ā" ("prÄ\x81l"), counted here from the bytes.
    control = re.compile("[\x00-\x08\x0e-\x1f\x7f-\x9f]")
    expected_control = {
        name: len(control.findall(data.decode("utf-8")))
        for name, data in raw.items()
        if name not in expected_fallback and control.search(data.decode("utf-8"))
    }
    assert expected_control == {"literature/james.joyce/ulysses.txt": 21}
    assert {(j.file, j.kind) for j in summary.junk} == {(name, "control-chars") for name in expected_control}
    assert all(j.detail.startswith(f"{expected_control[j.file]} NUL/control") for j in summary.junk)


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
        "café and an undefined CP1252 byte \n",  # as Latin-1, 0x81 is a C1 control: dropped and counted
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
        ("d_latin1.txt", None, "control-chars"),
    }
    text = summary.format()
    assert "g_docs.jsonl:2: invalid-json" in text and "encoding fallbacks (CP1252/Latin-1): 2 files" in text
    assert list(corpus.documents(start=9)) == docs[9:]


def test_utf8_with_a_few_bad_bytes_stays_utf8_and_names_each_line(tmp_path) -> None:
    """Issue 12: one 0xFF byte in a UTF-8 book used to turn every ’ into â€™ (the file read as CP1252)."""
    lines = [f"It’s line {i}, isn’t it — “quoted”.\n" for i in range(400)]
    data = bytearray("".join(lines).encode("utf-8"))
    position = data.index(b"line 123,")
    data[position:position] = b"\xff"
    (tmp_path / "book.txt").write_bytes(bytes(data))
    corpus = Corpus(tmp_path)
    summary = corpus.scan()
    assert [f.encoding for f in summary.files] == ["utf-8"]
    assert list(corpus.documents()) == ["".join(lines)]  # the bad byte dropped, every ’ intact
    assert [(j.line, j.kind, j.detail) for j in summary.junk] == [
        (124, "invalid-utf8", "1 byte(s) not UTF-8 dropped: ff")
    ]
    # Many bad lines: the first ten are named, the rest summed up.
    bad = "".join(lines).encode("utf-8").replace(b"line 1", b"line \xfe1")
    (tmp_path / "book.txt").write_bytes(bad)
    summary = Corpus(tmp_path).scan()
    named = [j for j in summary.junk if j.line is not None]
    assert len(named) == 10 and named[0].line == 2
    rest = len(re.findall(rb"line \xfe1", bad)) - 10
    assert [j.detail for j in summary.junk if j.line is None] == [
        f"{rest} more byte(s) not UTF-8 dropped on {rest} more lines"
    ]


def test_a_mostly_legacy_file_with_some_utf8_is_read_as_legacy_and_reported(tmp_path) -> None:
    (tmp_path / "mixed.txt").write_bytes("caf\xe9 cr\xe8me br\xfbl\xe9e\n".encode("latin-1") + "’\n".encode())
    corpus = Corpus(tmp_path)
    summary = corpus.scan()
    assert [f.encoding for f in summary.files] == ["cp1252"]
    assert list(corpus.documents()) == ["café crème brûlée\nâ€™\n"]
    assert [(j.kind, j.detail.split(",")[0]) for j in summary.junk] == [
        ("mixed-encoding", "4 bytes are not UTF-8")
    ]


def test_utf16_only_when_the_whole_file_is_utf16(tmp_path) -> None:
    text = "Ünïcödé text\nsecond line ✓\n"
    (tmp_path / "a_le.txt").write_bytes(text.encode("utf-16"))  # with its byte-order mark
    (tmp_path / "b_be.txt").write_bytes(b"\xfe\xff" + text.encode("utf-16-be"))
    (tmp_path / "c_ff_fe_then_utf8.txt").write_bytes(b"\xff\xfe" + text.encode("utf-8"))
    (tmp_path / "d_ff_fe_then_ascii.txt").write_bytes(b"\xff\xfeplain ascii text\n")
    (tmp_path / "e_latin1.txt").write_bytes(b"\xff\xfe" + "caf\xe9 au lait!\n".encode("latin-1"))  # even
    corpus = Corpus(tmp_path)
    summary = corpus.scan()
    assert [f.encoding for f in summary.files] == ["utf-16", "utf-16", "utf-8", "utf-8", "latin-1"]
    docs = list(corpus.documents())
    assert docs[:4] == [text, text, text, "plain ascii text\n"]
    assert docs[4] == "ÿþcafé au lait!\n"  # no UTF-8 in it: a legacy file, read whole
    junk = {(j.file, j.line, j.kind, j.detail) for j in summary.junk}
    assert junk == {
        (name, 1, "invalid-utf8", "2 byte(s) not UTF-8 dropped: ff fe")
        for name in ("c_ff_fe_then_utf8.txt", "d_ff_fe_then_ascii.txt")
    }


def test_nul_and_control_characters_are_dropped_and_counted(tmp_path) -> None:
    (tmp_path / "a.txt").write_bytes(
        b"clean line\nwith a NUL\x00 here\nand a bell\x07 and DEL\x7f\n" + b"x" * 200
    )
    records = [
        {"text": "escaped NUL \u0000 and lone surrogate \ud800 gone"},
        {"text": "emoji 😀 kept"},
    ]
    (tmp_path / "b.jsonl").write_text(
        "\n".join(json.dumps(r, ensure_ascii=True) for r in records) + "\n", encoding="utf-8"
    )
    corpus = Corpus(tmp_path)
    summary = corpus.scan()
    assert list(corpus.documents()) == [
        "clean line\nwith a NUL here\nand a bell and DEL\n" + "x" * 200,
        "escaped NUL  and lone surrogate  gone",
        "emoji 😀 kept",
    ]
    junk = {(j.file, j.kind, j.detail) for j in summary.junk}
    assert junk == {
        ("a.txt", "control-chars", "3 NUL/control characters dropped (first on line 2)"),
        ("b.jsonl", "control-chars", "1 NUL/control characters dropped"),
        ("b.jsonl", "invalid-unicode", "1 lone surrogate characters dropped"),
    }


def test_deep_nesting_and_huge_integers_in_jsonl_are_named_junk(tmp_path) -> None:
    lines = [
        json.dumps({"text": "first"}),
        "[" * 100_000 + "]" * 100_000,
        '{"text": "x", "n": ' + "9" * 5000 + "}",
        json.dumps({"text": "last"}),
    ]
    (tmp_path / "d.jsonl").write_text("\n".join(lines) + "\n")
    corpus = Corpus(tmp_path)
    summary = corpus.scan()
    assert list(corpus.documents()) == ["first", "last"]
    assert [(j.line, j.kind) for j in summary.junk] == [(2, "invalid-json"), (3, "invalid-json")]
    assert summary.junk[0].detail == "nested too deeply" and "4300" in summary.junk[1].detail


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


def test_the_package_works_without_zstandard_and_pyarrow_until_such_a_file_is_read(tmp_path) -> None:
    """Issue 11: the GPU image has no zstandard. Blocking both optional codecs, the CLI imports and reads
    text; a .zst file is an error naming the file."""
    import subprocess
    import sys

    (tmp_path / "a.txt").write_text("plain text\n")
    (tmp_path / "b.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(b'{"text": "x"}\n'))
    script = f"""
import sys
sys.modules["zstandard"] = None  # import zstandard now raises ImportError
sys.modules["pyarrow"] = None
import tablefree.cli
from tablefree.data.corpus import Corpus, CorpusError
print(list(Corpus({str(tmp_path / "a.txt")!r}).documents()))
try:
    Corpus({str(tmp_path)!r}).scan()
except CorpusError as error:
    print("error:", error)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "['plain text\\n']",
        "error: b.jsonl.zst: reading .zst files needs the zstandard package (pip install zstandard)",
    ]
