"""Reading raw text corpora: files, encodings and junk.

A corpus is one or more paths; directories are read recursively in sorted order, following links to files and
directories. Only regular files are opened: every other entry found is named as junk with the reason (a
dangling link, a link loop, a FIFO, device or socket, an unreadable file or directory, a file or directory
reached a second time through a link), never skipped without a word and never read from. Supported files:

- ``.txt`` — one document per file;
- ``.jsonl`` — one JSON object per line, the document in a named field (``text_field``, default ``"text"``);
- ``.parquet`` — one document per row, in a named string column (``text_field``);

``.txt`` and ``.jsonl`` may also be compressed: ``.txt.gz``, ``.jsonl.zst`` and so on.

Encodings are detected per file: UTF-8 (with or without a byte-order mark), also when a few bytes are not
UTF-8 (those bytes are dropped and reported by line): always after a UTF-8 byte-order mark, and otherwise when
they are fewer than its valid non-ASCII characters, or when most of them do not read as text in
Windows-1252 either (a symbol between two letters, ``wh€ale``; an undefined byte; see ``_stray_bytes``): a
pure-ASCII book with a stray byte is UTF-8 with one bad byte, not Windows-1252; UTF-16 after a
UTF-16 byte-order mark, only when the whole file decodes as UTF-16 and holds the NUL bytes UTF-16 text has;
otherwise the file is decoded as Windows-1252, or as ISO-8859-1 (Latin-1) when it holds bytes that CP1252 leaves
undefined. The two agree on every byte outside 0x80–0x9F, so a file without such bytes is reported as
``latin-1``. Files that needed a fallback are counted in the summary. A byte-order mark never enters the text. NUL and other control characters (C0 but
tab, newline, VT, form feed and CR; DEL; C1) and lone surrogates are dropped from the text and counted per file.

Junk is counted and named, never silently dropped (the first ``MAX_JUNK_ITEMS`` items of each file and kind are
named, every one is counted: :class:`tablefree.data.sources.JunkLog`): binary files, empty files and documents, unreadable
(corrupt) compressed files, invalid JSON lines (a key twice in one object among them), records without the text field (or with a non-string one),
files of unsupported types, bytes that are not UTF-8, control characters, JSON nested too deeply or with
integers over Python's 4,300-digit limit. With ``strict=True`` the first piece of junk raises a ``ValueError`` that
names the file and line. Blank lines in JSONL files are not junk.

A compressed file that expands more than ``max_expansion`` (default 100) times the compressed bytes read, plus
1 MiB, is refused with a ``CorpusError`` naming it (a decompression bomb; text compresses 3-5x).

Use :class:`Corpus`: ``scan()`` makes one pass (sha256 of every file, encodings, document counts, junk) and
``documents()`` yields the valid documents in a fixed order. Finding the files is :mod:`tablefree.data.sources`;
decompressing and decoding them, :mod:`tablefree.data.decoding`.
"""

from __future__ import annotations

import codecs
import hashlib
import io
import json
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tqdm import tqdm

from tablefree.data.decoding import (
    DEFAULT_MAX_EXPANSION,
    SNIFF_BYTES,
    BadCharacters,
    decode_bytes,
    decompression_errors,
    looks_binary,
    open_decompressed,
    sniff_stream,
)
from tablefree.data.sources import CorpusError, Junk, JunkLog, SourceFile, list_sources, open_regular
from tablefree.data.spans import Piece, Span, file_spans
from tablefree.fileio import no_duplicate_keys

__all__ = [
    "Corpus",
    "CorpusError",
    "CorpusSummary",
    "FileInfo",
    "Junk",
    "JunkError",
    "JunkLog",
    "PieceInfo",
    "compose_files",
    "strip_gutenberg",
]


@dataclass
class FileInfo:
    file: str
    sha256: str | None  # None for a file that could not be read, and for one read in spans (span_sha256)
    bytes: int
    encoding: str | None  # None for junk files and parquet (UTF-8 by specification)
    documents: int
    spans: int | None = None  # read in spans (tablefree.data.spans): how many it has
    span_sha256: str | None = None  # sha256 over its spans' sha256 digests, in order: what parts can compose

    def record(self) -> dict:
        """The manifest's record: the span fields only for a file read in spans (older records stay as they were,
        and so do their fingerprints)."""
        record = asdict(self)
        if self.spans is None:
            del record["spans"], record["span_sha256"]
        return record


@dataclass
class PieceInfo:
    """What reading spans [first, end) of a file's ``count`` found (``spans``: [first, end, count]; None: the whole
    file, read without spans, whose ``sha256`` is given): a part's record of its share of a file."""

    file: str
    bytes: int
    encoding: str | None
    documents: int
    sha256: str | None = None
    spans: list[int] | None = None
    span_sha256: list[str] = field(default_factory=list)


def compose_files(pieces: Sequence[PieceInfo]) -> list[FileInfo]:
    """The files that consecutive pieces of each make (a file's pieces must follow each other in span order)."""
    files: list[FileInfo] = []
    digests: list[list[str]] = []
    for piece in pieces:
        if piece.spans is None:
            files.append(FileInfo(piece.file, piece.sha256, piece.bytes, piece.encoding, piece.documents))
            digests.append([])
            continue
        first, _, count = piece.spans
        if first and files and files[-1].file == piece.file and files[-1].spans == count:
            files[-1].documents += piece.documents
            digests[-1] += piece.span_sha256
        else:
            files.append(FileInfo(piece.file, None, piece.bytes, piece.encoding, piece.documents, count))
            digests.append(list(piece.span_sha256))
    for info, spans in zip(files, digests, strict=True):
        if info.spans is not None:
            info.span_sha256 = hashlib.sha256(b"".join(bytes.fromhex(d) for d in spans)).hexdigest()
    return files


@dataclass
class CorpusSummary:
    files: list[FileInfo] = field(default_factory=list)
    junk_log: JunkLog = field(default_factory=JunkLog)
    pieces: list[PieceInfo] = field(default_factory=list)  # what was read of each file (a part: its share)

    @property
    def junk(self) -> list[Junk]:
        """The junk items kept: the first ``MAX_JUNK_ITEMS`` of each file and kind (``junk_log`` counts them all)."""
        return self.junk_log.items

    @property
    def documents(self) -> int:
        return sum(f.documents for f in self.files)

    @property
    def bytes(self) -> int:
        return sum(f.bytes for f in self.files)

    @property
    def encodings(self) -> dict[str, int]:
        return dict(sorted(Counter(f.encoding for f in self.files if f.encoding).items()))

    @property
    def fallback_files(self) -> list[str]:
        return [f.file for f in self.files if f.encoding in ("cp1252", "latin-1")]

    def as_dict(self) -> dict:
        return {
            "files": len(self.files),
            "documents": self.documents,
            "bytes": self.bytes,
            "encodings": self.encodings,
            "encoding_fallbacks": len(self.fallback_files),
            "fallback_files": self.fallback_files,
            **self.junk_log.as_dict(),
        }

    def format(self, max_junk: int = 20) -> str:
        """A human summary: counts, encodings, fallbacks and the junk (first ``max_junk`` named)."""
        lines = [
            f"{len(self.files)} files, {self.documents:,} documents, {self.bytes / 1e6:.1f} MB",
            "encodings: " + ", ".join(f"{name} {n}" for name, n in self.encodings.items()),
            f"encoding fallbacks (CP1252/Latin-1): {len(self.fallback_files)} files"
            + _named(self.fallback_files),
        ]
        if self.junk:
            lines.append("junk: " + ", ".join(f"{kind} {n:,}" for kind, n in self.junk_log.by_kind().items()))
            lines += [f"  {j}" for j in self.junk[:max_junk]]
            if len(self.junk_log) > max_junk:
                lines.append(
                    f"  ... and {len(self.junk_log) - max_junk:,} more (--json counts them by file and kind)"
                )
        else:
            lines.append("junk: none")
        return "\n".join(lines)


class JunkError(CorpusError):
    """Raised in strict mode; the message names the file and line."""


def _unreadable_file(source: SourceFile, error: OSError) -> Junk:
    return Junk(source.rel, None, "unreadable", f"cannot be read ({error.strerror or error}): not read")


def _sha256(source: SourceFile, start: int = 0, end: int | None = None) -> str:
    """The sha256 of the file's bytes [start, end) (end None: to its end)."""
    digest = hashlib.sha256()
    with open_regular(source.path) as handle:
        handle.seek(start)
        left = end - start if end is not None else None
        while block := handle.read(1 << 24 if left is None else min(1 << 24, left)):
            digest.update(block)
            if left is not None:
                left -= len(block)
    return digest.hexdigest()


def _whole(spans: Sequence[Span]) -> bool:
    return len(spans) == 1 and spans[0].whole


def _numbered(items: Iterator[str | Junk]) -> Iterator[tuple[int, str] | Junk]:
    """A whole file's documents with their positions: their numbers among its valid documents."""
    position = 0
    for item in items:
        if isinstance(item, Junk):
            yield item
        else:
            yield position, item
            position += 1


# Project Gutenberg boilerplate: the text starts after the START line (or the old "small print" end) and ends
# before the END line. Without markers the text is kept whole.
_GUTENBERG_START = re.compile(
    r"^(\*{3}\s*START OF (THE|THIS) PROJECT GUTENBERG E-?BOOK.*|\*END\*THE SMALL PRINT!.*)$",
    re.IGNORECASE | re.MULTILINE,
)
_GUTENBERG_END = re.compile(
    r"^(\*{3}\s*END OF (THE|THIS) PROJECT GUTENBERG E-?BOOK.*|End of (the )?Project Gutenberg'?s? .*)$",
    re.IGNORECASE | re.MULTILINE,
)


def strip_gutenberg(text: str) -> str:
    """The text between Project Gutenberg's START and END marker lines (either may be absent)."""
    start = _GUTENBERG_START.search(text)
    if start:
        text = text[start.end() :]
    end = _GUTENBERG_END.search(text)
    if end:
        text = text[: end.start()]
    return text.strip("\n\r") + "\n" if (start or end) else text


class Corpus:
    """A corpus of text files (see the module docstring for formats, encodings and junk).

    ``scan()`` must run before ``documents(start)`` is asked for a start other than 0; ``scan()`` fills
    :attr:`summary` and per-file document counts, so the i-th valid document has a stable global index.

    ``span_bytes`` (the keyed-hash rule): uncompressed ``.jsonl`` and parquet files are read in spans
    (:mod:`tablefree.data.spans`), each on its own, so that a part may read some spans of a file; ``pieces``: the
    spans of which files to read (a part's share; None: all of every file).
    """

    def __init__(
        self,
        paths: str | Path | Sequence[str | Path],
        *,
        text_field: str = "text",
        strict: bool = False,
        gutenberg: bool = False,
        max_expansion: float = DEFAULT_MAX_EXPANSION,
        span_bytes: int | None = None,
        pieces: Sequence[Piece] | None = None,
        lengths: bool = True,
    ) -> None:
        if max_expansion <= 0:
            raise ValueError(f"max_expansion must be positive, got {max_expansion}")
        if span_bytes is not None and span_bytes < 1:
            raise ValueError(f"span_bytes must be positive, got {span_bytes}")
        self.paths = [Path(paths)] if isinstance(paths, (str, Path)) else [Path(p) for p in paths]
        self.text_field, self.strict, self.gutenberg = text_field, strict, gutenberg
        self.max_expansion, self.span_bytes = max_expansion, span_bytes
        self.listed, unsupported = list_sources(
            self.paths
        )  # every corpus file, before ``pieces`` picks a share
        if pieces is None:
            spans = [file_spans(source, span_bytes, text_field) for source in self.listed]
            pieces = [Piece(i, 0, len(file), len(file), _whole(file)) for i, file in enumerate(spans)]
        else:  # a part reads its own spans; the listing's junk is the first part's to report
            spans = {p.file: file_spans(self.listed[p.file], span_bytes, text_field) for p in pieces}
            if pieces and (pieces[0].file, pieces[0].first) != (0, 0):
                unsupported = []
        self.pieces = list(pieces)
        self.sources = [self.listed[p.file] for p in self.pieces]
        self.spans = [spans[p.file][p.first : p.end] for p in self.pieces]
        self.summary: CorpusSummary | None = None
        self._encodings: dict[str, str | None] = {}
        # characters of each valid document, in order (filled by scan() when ``lengths``: the seeded validation
        # plan needs them; nothing else keeps a number per document)
        self.keep_lengths = lengths
        self.document_chars: list[int] = []
        self._pending_junk = unsupported
        for junk in unsupported:
            self._junk(junk, None)

    # -- scanning ---------------------------------------------------------------------------------------

    def scan(self, progress: bool = False) -> CorpusSummary:
        """One pass over every file (or span): sha256, size, encoding, valid document count and junk.
        ``progress``: a bar on stderr counting the (decompressed) bytes read, with the file being read."""
        summary = CorpusSummary()
        for junk in self._pending_junk:
            summary.junk_log.add(junk)
        self.document_chars = []
        bar = tqdm(desc="scanning", unit="B", unit_scale=True, unit_divisor=1000, disable=not progress)
        try:
            for number, (source, piece, spans) in enumerate(
                zip(self.sources, self.pieces, self.spans, strict=True), start=1
            ):
                bar.set_postfix_str(f"file {number}/{len(self.sources)} {source.rel}", refresh=False)
                if _whole(spans):
                    info = self._scan_file(source, summary.junk_log, bar.update)
                    summary.pieces.append(
                        PieceInfo(info.file, info.bytes, info.encoding, info.documents, info.sha256)
                    )
                else:
                    summary.pieces.append(
                        self._scan_spans(source, piece, spans, summary.junk_log, bar.update)
                    )
        finally:
            bar.close()
        if not self.sources:
            skipped = "".join(f"; {junk}" for junk in summary.junk[:3])
            raise ValueError(
                f"no .txt/.jsonl/.parquet files found under {', '.join(map(str, self.paths))}{skipped}"
            )
        summary.files = compose_files(summary.pieces)
        self.summary = summary
        return summary

    def _scan_file(self, source: SourceFile, found: JunkLog, on_read) -> FileInfo:
        info = FileInfo(source.rel, None, 0, None, 0)
        try:
            info.sha256, info.bytes = _sha256(source), source.path.stat().st_size
        except OSError as error:  # a mode-000 file, say: said, and not read again by documents()
            self._junk(_unreadable_file(source, error), found)
            self._encodings[source.rel] = info.encoding = "junk"
        else:
            info.encoding = self._file_encoding(source, found, on_read)
        if info.encoding == "junk":
            info.encoding = None
            return info
        for item in self._file_documents(source, info.encoding):
            if isinstance(item, Junk):
                self._junk(item, found)
            else:
                info.documents += 1
                if self.keep_lengths:
                    self.document_chars.append(len(item))
        return info

    def _scan_spans(
        self, source: SourceFile, piece: Piece, spans: list[Span], found: JunkLog, on_read
    ) -> PieceInfo:
        """Spans of a file, each read alone: its bytes' sha256 and its documents (a file that cannot be read is
        junk once, in its first span)."""
        info = PieceInfo(source.rel, 0, "utf-8", 0, spans=[piece.first, piece.end, piece.count])
        try:
            info.bytes = source.path.stat().st_size
            for span in spans:
                info.span_sha256.append(_sha256(source, span.start, span.end))
                on_read(span.end - span.start)
        except OSError as error:
            if piece.first == 0:
                self._junk(_unreadable_file(source, error), found)
            info.encoding, info.span_sha256 = None, []
            self._encodings[source.rel] = "junk"
            return info
        for span in spans:
            for item in self._span_documents(source, span):
                if isinstance(item, Junk):
                    self._junk(item, found)
                else:
                    info.documents += 1
        return info

    def file_document_ranges(self) -> list[tuple[int, int]]:
        """[first, end) global document indices of each source file (after ``scan()``)."""
        if self.summary is None:
            raise RuntimeError("Corpus.scan() must run first")
        ranges, start = [], 0
        for info in self.summary.files:
            ranges.append((start, start + info.documents))
            start += info.documents
        return ranges

    # -- reading ----------------------------------------------------------------------------------------

    def documents(self, start: int = 0) -> Iterator[str]:
        """The valid documents in order, from global index ``start``. Files wholly before ``start`` are not
        read. Junk is skipped (it was reported by ``scan()``; in strict mode it raises)."""
        return (text for _, _, text in self.located_documents(start))

    def located_documents(self, start: int = 0) -> Iterator[tuple[str, int, str]]:
        """``documents(start)`` with where each comes from: (file, its position in that file, text). The position
        is what the keyed-hash rule keys a document by: in a file read in spans, a ``.jsonl`` line's byte offset or
        a parquet row's index (junk rows counted), which a span knows alone; otherwise the document's number
        among the file's valid documents."""
        if start and self.summary is None:
            raise RuntimeError("Corpus.scan() must run before documents(start > 0)")
        ranges = self.file_document_ranges() if self.summary is not None else None
        index = 0
        for i, (source, spans) in enumerate(zip(self.sources, self.spans, strict=True)):
            if ranges is not None:
                first, end = ranges[i]
                if end <= start or first == end:
                    index = end
                    continue
            if _whole(spans):
                encoding = self._encodings.get(source.rel) or self._file_encoding(source, None)
                if encoding == "junk":
                    continue
                items = _numbered(self._file_documents(source, encoding))
            elif self._encodings.get(source.rel) == "junk":
                continue
            else:
                items = (item for span in spans for item in self._span_documents(source, span))
            for item in items:
                if isinstance(item, Junk):
                    self._junk(item, None)
                    continue
                if index >= start:
                    yield source.rel, *item
                index += 1

    def __iter__(self) -> Iterator[str]:
        return self.documents()

    def _junk(self, junk: Junk, found: JunkLog | None) -> None:
        if self.strict:
            raise JunkError(f"{junk} (strict mode; run without --strict to skip and report junk)")
        if found is not None:
            found.add(junk)

    def _file_encoding(self, source: SourceFile, found: JunkLog | None, on_read=None) -> str:
        """The file's text encoding, or "junk" after reporting a binary, empty or unreadable file."""
        if source.kind in ("parquet", "arrow"):
            encoding = "utf-8"  # parquet and Arrow strings are UTF-8 by specification
            try:
                with open_regular(source.path) as handle:
                    _columnar_schema(source, handle)  # reads and checks the footer or the stream's schema
            except OSError as error:
                self._junk(_unreadable_file(source, error), found)
                encoding = "junk"
            except Exception as error:
                self._junk(Junk(source.rel, None, "unreadable", f"not a {source.kind} file ({error})"), found)
                encoding = "junk"
            self._encodings[source.rel] = encoding
            return encoding
        try:
            encoding, problem = sniff_stream(source, self.max_expansion, on_read)
        except decompression_errors() as error:
            if source.compression is None or getattr(error, "filename", None) == str(source.path):
                problem = _unreadable_file(source, error)  # opening or reading the file itself failed
            else:
                problem = Junk(source.rel, None, "unreadable", f"corrupt {source.compression} data ({error})")
            encoding = "junk"
        if problem is not None:
            self._junk(problem, found)
        self._encodings[source.rel] = encoding
        return encoding

    def _read_all(self, source: SourceFile) -> bytes:
        with open_decompressed(source, self.max_expansion) as stream:
            return stream.read()

    def _file_documents(self, source: SourceFile, encoding: str) -> Iterator[str | Junk]:
        if source.kind == "txt":
            yield from self._txt_documents(source, encoding)
        elif source.kind == "jsonl":
            yield from self._jsonl_documents(source, encoding)
        elif source.kind == "arrow":
            yield from self._arrow_documents(source)
        else:
            yield from self._parquet_documents(source)

    def _clean(self, text: str) -> str:
        return strip_gutenberg(text) if self.gutenberg else text

    def _txt_documents(self, source: SourceFile, encoding: str) -> Iterator[str | Junk]:
        bad = BadCharacters(source.rel)
        text, items = bad.drop(decode_bytes(self._read_all(source), encoding), 1)
        yield from items
        yield from bad.summary()
        text = self._clean(text)
        if text.strip():
            yield text
        else:
            yield Junk(source.rel, None, "empty", "no text after removing boilerplate and bad characters")

    def _jsonl_documents(self, source: SourceFile, encoding: str) -> Iterator[str | Junk]:
        bad = BadCharacters(source.rel)
        errors = "surrogateescape" if encoding.startswith("utf-8") else "strict"
        with io.TextIOWrapper(
            open_decompressed(source, self.max_expansion), encoding=encoding, errors=errors, newline="\n"
        ) as lines:
            for line_no, line in enumerate(lines, start=1):
                line, items = bad.drop(line, line_no)
                yield from items
                if not line.strip():
                    continue
                yield self._json_text(line, source.rel, line_no, bad)
        yield from bad.summary()

    def _json_text(self, line: str, file: str, line_no: int | None, bad: BadCharacters) -> str | Junk:
        """The document of one JSON line, or the junk it is."""
        try:
            record = json.loads(line, object_pairs_hook=no_duplicate_keys)
        except RecursionError:
            return Junk(file, line_no, "invalid-json", "nested too deeply")
        except ValueError as error:  # also integers over Python's 4,300-digit limit
            return Junk(file, line_no, "invalid-json", _short(str(error)))
        return self._record_text(record, file, line_no, bad)

    def _record_text(self, record: object, file: str, line: int | None, bad: BadCharacters) -> str | Junk:
        if not isinstance(record, dict) or self.text_field not in record:
            return Junk(file, line, "missing-field", f"no field {self.text_field!r}")
        text = record[self.text_field]
        if text is None:
            return Junk(file, line, "missing-field", f"field {self.text_field!r} is null")
        if not isinstance(text, str):
            return Junk(
                file, line, "bad-field", f"field {self.text_field!r} is {type(text).__name__}, not a string"
            )
        text, _ = bad.drop(text, None, decoded=False)  # a JSON string holds escaped characters, not bytes
        text = self._clean(text)
        if not text.strip():
            return Junk(file, line, "empty", f"field {self.text_field!r} holds no text")
        return text

    def _arrow_documents(self, source: SourceFile) -> Iterator[str | Junk]:
        bad = BadCharacters(source.rel)
        row = 0
        try:
            with open_regular(source.path) as handle:
                schema, batches = _arrow_batches(handle)
                if self.text_field not in schema.names:  # one schema for the whole dataset: the user's choice
                    raise CorpusError(f"{source.path}: {_no_column(self.text_field, schema)}")
                for batch in batches:
                    for value in batch.column(self.text_field).to_pylist():
                        row += 1
                        yield self._record_text({self.text_field: value}, source.rel, row, bad)
        except CorpusError:
            raise
        except Exception as error:  # pyarrow's own errors for damaged data
            yield Junk(
                source.rel,
                row + 1,
                "unreadable",
                f"corrupt Arrow data after row {row} ({_short(str(error))})",
            )
        yield from bad.summary()

    def _parquet_documents(self, source: SourceFile) -> Iterator[str | Junk]:
        # pyarrow is imported where Parquet or Arrow is read: every verb loads this module, few read columns
        import pyarrow.parquet as pq

        bad = BadCharacters(source.rel)
        row = 0
        try:
            with open_regular(source.path) as handle:
                parquet = pq.ParquetFile(handle, page_checksum_verification=True)
                if self.text_field not in parquet.schema_arrow.names:
                    yield Junk(
                        source.rel, None, "missing-field", _no_column(self.text_field, parquet.schema_arrow)
                    )
                    return
                for batch in parquet.iter_batches(columns=[self.text_field], batch_size=4096):
                    for value in batch.column(0).to_pylist():
                        row += 1
                        yield self._record_text({self.text_field: value}, source.rel, row, bad)
                if row != parquet.metadata.num_rows:  # a damaged page header can shorten a column silently
                    yield Junk(
                        source.rel,
                        None,
                        "unreadable",
                        f"read {row} rows, the file's metadata says {parquet.metadata.num_rows}: damaged pages",
                    )
        except Exception as error:  # pyarrow raises its own errors (ArrowInvalid, OSError) for corrupt data
            yield Junk(
                source.rel,
                row + 1,
                "unreadable",
                f"corrupt parquet data after row {row} ({_short(str(error))})",
            )
        yield from bad.summary()

    def _span_documents(self, source: SourceFile, span: Span) -> Iterator[tuple[int, str] | Junk]:
        """One span's documents with their positions (a ``.jsonl`` line's byte offset, a parquet row's index)."""
        if source.kind == "jsonl":
            yield from self._jsonl_span(source, span)
        else:
            yield from self._parquet_span(source, span)

    def _jsonl_span(self, source: SourceFile, span: Span) -> Iterator[tuple[int, str] | Junk]:
        """The lines that start in the span's bytes, read as UTF-8 (JSON Lines' encoding: a span cannot see the
        rest of the file to detect another; a UTF-8 byte-order mark is dropped). Junk is named by the line's
        byte offset (a span does not know line numbers), and a span whose first 8 KiB are binary is junk."""
        where = f"bytes {span.start:,}-{span.end:,}"
        bad = BadCharacters(source.rel)
        if span.start == span.end == 0:
            yield Junk(source.rel, None, "empty", "no text")
            return
        with open_regular(source.path) as handle:
            handle.seek(span.start)
            if looks_binary(handle.read(min(SNIFF_BYTES, span.end - span.start))):
                yield Junk(source.rel, None, "binary", f"{where}: mostly NUL or control bytes: not text")
                return
            offset = span.start
            handle.seek(max(offset - 1, 0))
            if offset:  # the line that starts at the span's start is its own when the byte before ends a line
                offset += len(handle.readline()) - 1
            while offset < span.end:
                line = handle.readline()
                if not line:
                    break
                at, offset = offset, offset + len(line)
                if at == 0 and line.startswith(codecs.BOM_UTF8):
                    line = line[len(codecs.BOM_UTF8) :]
                text, items = bad.drop(line.decode("utf-8", errors="surrogateescape"), None)
                for junk in items:
                    yield Junk(source.rel, None, junk.kind, f"line at byte {at:,}: {junk.detail}")
                if not text.strip():
                    continue
                item = self._json_text(text, source.rel, None, bad)
                if isinstance(item, Junk):
                    yield Junk(item.file, None, item.kind, f"line at byte {at:,}: {item.detail}")
                else:
                    yield at, item
        yield from _in_span(bad.summary(), where)

    def _parquet_span(self, source: SourceFile, span: Span) -> Iterator[tuple[int, str] | Junk]:
        """One row group's rows, numbered as in the file (the footer gives its first row's index)."""
        # pyarrow is imported where Parquet or Arrow is read: every verb loads this module, few read columns
        import pyarrow.parquet as pq

        bad = BadCharacters(source.rel)
        row = span.first_row
        try:
            with open_regular(source.path) as handle:
                parquet = pq.ParquetFile(handle, page_checksum_verification=True)
                if self.text_field not in parquet.schema_arrow.names:
                    if span.row_group == 0:  # said once, by the file's first span
                        yield Junk(
                            source.rel,
                            None,
                            "missing-field",
                            _no_column(self.text_field, parquet.schema_arrow),
                        )
                    return
                batches = parquet.iter_batches(
                    row_groups=[span.row_group], columns=[self.text_field], batch_size=4096
                )
                for batch in batches:
                    for value in batch.column(0).to_pylist():
                        row += 1
                        item = self._record_text({self.text_field: value}, source.rel, row, bad)
                        yield item if isinstance(item, Junk) else (row - 1, item)
                expected = parquet.metadata.row_group(span.row_group).num_rows
                if row - span.first_row != expected:
                    yield Junk(
                        source.rel,
                        None,
                        "unreadable",
                        f"row group {span.row_group}: read {row - span.first_row} rows, the file's metadata says "
                        f"{expected}: damaged pages",
                    )
        except Exception as error:  # pyarrow raises its own errors (ArrowInvalid, OSError) for corrupt data
            yield Junk(
                source.rel,
                row + 1,
                "unreadable",
                f"corrupt parquet data after row {row} ({_short(str(error))})",
            )
        yield from _in_span(bad.summary(), f"row group {span.row_group}")


def _in_span(items: list[Junk], where: str) -> Iterator[Junk]:
    """A span's summary items, saying which span they sum up."""
    for junk in items:
        yield Junk(junk.file, junk.line, junk.kind, f"{where}: {junk.detail}")


def _columnar_schema(source: SourceFile, handle):
    """The Arrow schema of a parquet file or of an Arrow IPC file (``datasets`` writes the stream format)."""
    import pyarrow.parquet as pq

    if source.kind == "parquet":
        return pq.ParquetFile(handle, page_checksum_verification=True).schema_arrow
    return _arrow_batches(handle)[0]


def _arrow_batches(handle) -> tuple:
    """(schema, record batches) of an Arrow IPC stream (what ``datasets``' save_to_disk writes) or IPC file."""
    import pyarrow as pa

    try:
        reader = pa.ipc.open_stream(handle)
        return reader.schema, iter(reader)
    except pa.ArrowInvalid:
        handle.seek(0)
        file = pa.ipc.open_file(handle)
        return file.schema, (file.get_batch(i) for i in range(file.num_record_batches))


def _no_column(name: str, schema) -> str:
    return f"no column {name!r} (its columns: {', '.join(map(repr, schema.names))}; choose one with --text-field)"


def _named(files: list[str], limit: int = 5) -> str:
    """ ": a, b, c and 2 more" (nothing for no files)."""
    if not files:
        return ""
    more = f" and {len(files) - limit} more" if len(files) > limit else ""
    return ": " + ", ".join(files[:limit]) + more


def _short(message: str, limit: int = 200) -> str:
    return message if len(message) <= limit else message[:limit] + "…"
