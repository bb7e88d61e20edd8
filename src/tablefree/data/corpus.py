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

Junk is counted and named, never silently dropped: binary files, empty files and documents, unreadable
(corrupt) compressed files, invalid JSON lines (a key twice in one object among them), records without the text field (or with a non-string one),
files of unsupported types, bytes that are not UTF-8, control characters, JSON nested too deeply or with
integers over Python's 4,300-digit limit. With ``strict=True`` the first piece of junk raises a ``ValueError`` that
names the file and line. Blank lines in JSONL files are not junk.

Use :class:`Corpus`: ``scan()`` makes one pass (sha256 of every file, encodings, document counts, junk) and
``documents()`` yields the valid documents in a fixed order.
"""

from __future__ import annotations

import codecs
import errno
import gzip
import hashlib
import io
import json
import os
import re
import stat
import zlib
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tqdm import tqdm

from tablefree.fileio import no_duplicate_keys

READ_BLOCK = 1 << 20
SNIFF_BYTES = 8192
KINDS = {".txt": "txt", ".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet"}
COMPRESSIONS = {".gz": "gz", ".zst": "zst", ".zstd": "zst"}
# Bytes that Windows-1252 leaves undefined: a file holding them is decoded as Latin-1.
_CP1252_UNDEFINED = re.compile(rb"[\x81\x8d\x8f\x90\x9d]")
_C1_BYTES = re.compile(rb"[\x80-\x9f]")
# Control characters that do not occur in text (everything below 0x20 except \t \n \v \f \r and ESC).
_BINARY_BYTES = re.compile(rb"[\x00-\x08\x0e-\x1a\x1c-\x1f]")


@dataclass(frozen=True)
class SourceFile:
    path: Path
    rel: str  # path relative to the corpus root it was found under: names the file in manifests and errors
    kind: str  # "txt", "jsonl" or "parquet"
    compression: str | None  # None, "gz" or "zst"


@dataclass
class Junk:
    """One piece of junk: a file (line ``None``) or a line/row of a file that was skipped, and why."""

    file: str
    line: int | None
    kind: str
    detail: str

    def __str__(self) -> str:
        where = self.file if self.line is None else f"{self.file}:{self.line}"
        return f"{where}: {self.kind}: {self.detail}"


@dataclass
class FileInfo:
    file: str
    sha256: str | None  # None for a file that could not be read
    bytes: int
    encoding: str | None  # None for junk files and parquet (UTF-8 by specification)
    documents: int


@dataclass
class CorpusSummary:
    files: list[FileInfo] = field(default_factory=list)
    junk: list[Junk] = field(default_factory=list)

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
            "junk": dict(sorted(Counter(j.kind for j in self.junk).items())),
            "junk_items": [asdict(j) for j in self.junk],
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
            counts = Counter(j.kind for j in self.junk)
            lines.append("junk: " + ", ".join(f"{kind} {n}" for kind, n in sorted(counts.items())))
            lines += [f"  {j}" for j in self.junk[:max_junk]]
            if len(self.junk) > max_junk:
                lines.append(f"  ... and {len(self.junk) - max_junk} more")
        else:
            lines.append("junk: none")
        return "\n".join(lines)


class CorpusError(ValueError):
    """A corpus that cannot be read as asked; the message names the file (and line where there is one)."""


class JunkError(CorpusError):
    """Raised in strict mode; the message names the file and line."""


def list_sources(paths: str | Path | Sequence[str | Path]) -> tuple[list[SourceFile], list[Junk]]:
    """The corpus files under ``paths`` (directories recursively, sorted, links followed), and the junk found
    on the way: unsupported files and every entry that is not read, with the reason."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    walk = _Walk()
    for root in map(Path, paths):
        if not root.exists() and not root.is_symlink():
            raise FileNotFoundError(f"corpus path not found: {root}")
        # files of a directory are named relative to it; a file given directly, by its name
        walk.visit(root, "" if root.is_dir() else root.name, frozenset())
    return walk.files, walk.junk


class _Walk:
    """One listing of a corpus: the regular files found, and the junk (with its reason) for the rest."""

    def __init__(self) -> None:
        self.files: list[SourceFile] = []
        self.junk: list[Junk] = []
        self.seen: dict[tuple[int, int], str] = {}  # (device, inode) of each file and directory listed

    def visit(self, path: Path, rel: str, ancestors: frozenset[tuple[int, int]]) -> None:
        """List ``path``, named ``rel`` in the summary ("": a corpus root directory, named by its path)."""
        name = rel or str(path)
        try:
            info = path.stat()  # follows links
        except OSError as error:
            self.junk.append(_unreachable(path, name, error))
            return
        key = (info.st_dev, info.st_ino)
        if stat.S_ISDIR(info.st_mode):
            if key in ancestors:
                self.junk.append(
                    Junk(name, None, "link-loop", "a link back to a directory above it: not read")
                )
            elif key in self.seen:
                self.junk.append(
                    Junk(name, None, "duplicate", f"the directory {self.seen[key]} again: not read twice")
                )
            else:
                self.seen[key] = name
                self._directory(path, rel, ancestors | {key})
        elif not stat.S_ISREG(info.st_mode):
            kind = _file_kind(info.st_mode)
            self.junk.append(Junk(name, None, "not-regular", f"{kind}, not a regular file: not read"))
        elif key in self.seen:
            self.junk.append(Junk(rel, None, "duplicate", f"the file {self.seen[key]} again: not read twice"))
        else:
            self.seen[key] = rel
            kind, compression = file_type(path)
            if kind is None:
                self.junk.append(Junk(rel, None, "unsupported", f"not .txt/.jsonl/.parquet ({path.name})"))
            else:
                self.files.append(SourceFile(path, rel, kind, compression))

    def _directory(self, path: Path, rel: str, ancestors: frozenset[tuple[int, int]]) -> None:
        try:
            names = sorted(entry.name for entry in os.scandir(path))
        except OSError as error:
            detail = f"directory not listed ({error.strerror or error})"
            self.junk.append(Junk(rel or str(path), None, "unreadable", detail))
            return
        for name in names:  # sorted names at every level: the order of the sorted relative paths
            self.visit(path / name, f"{rel}/{name}" if rel else name, ancestors)


def _unreachable(path: Path, rel: str, error: OSError) -> Junk:
    if error.errno == errno.ELOOP:
        return Junk(rel, None, "link-loop", "links that lead back to each other: not read")
    if path.is_symlink() and isinstance(error, FileNotFoundError):
        return Junk(
            rel, None, "dangling-link", f"a link to {os.readlink(path)}, which does not exist: not read"
        )
    return Junk(rel, None, "unreadable", f"cannot be read ({error.strerror or error})")


def _file_kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "a socket" if stat.S_ISSOCK(mode) else "a special file"


def open_regular(path: Path) -> io.BufferedReader:
    """``path`` opened for reading, refused unless it is a regular file: a FIFO or a device (or a link to one,
    such as /dev/zero) would block the open or never end. O_NONBLOCK makes opening a FIFO return at once."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, f"{_file_kind(mode)}, not a regular file", str(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _unreadable_file(source: SourceFile, error: OSError) -> Junk:
    return Junk(source.rel, None, "unreadable", f"cannot be read ({error.strerror or error}): not read")


def _sha256(source: SourceFile) -> str:
    digest = hashlib.sha256()
    with open_regular(source.path) as handle:
        while block := handle.read(1 << 24):
            digest.update(block)
    return digest.hexdigest()


def file_type(path: Path) -> tuple[str | None, str | None]:
    suffixes = [s.lower() for s in path.suffixes]
    compression = COMPRESSIONS.get(suffixes[-1]) if suffixes else None
    if compression:
        suffixes = suffixes[:-1]
    kind = KINDS.get(suffixes[-1]) if suffixes else None
    if kind == "parquet" and compression:
        return None, None  # parquet compresses internally
    return kind, compression


def open_decompressed(source: SourceFile) -> io.BufferedIOBase:
    """A binary stream of the file's (decompressed) bytes."""
    if source.compression == "zst":
        zstandard = _zstandard(source)
        return io.BufferedReader(_ZstdStream(open_regular(source.path), zstandard), READ_BLOCK)
    raw = open_regular(source.path)
    return _GzipStream(raw) if source.compression == "gz" else raw


class _GzipStream(gzip.GzipFile):
    """A gzip stream over an open file, which it closes (GzipFile leaves a file it was given open)."""

    def __init__(self, raw: io.BufferedReader) -> None:
        super().__init__(fileobj=raw, mode="rb")
        self._source_file = raw

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._source_file.close()


class _ZstdStream(io.RawIOBase):
    """Decompressed bytes of a zstd file of one or more frames. Unlike zstandard's stream reader, which
    returns a truncated file's partial data as if it were whole, it raises an OSError when the file ends
    inside a frame."""

    def __init__(self, raw: io.BufferedIOBase, zstandard) -> None:
        self.raw, self.zstandard = raw, zstandard
        self.frame = None  # the decompressor of the frame being read
        self.pending, self.leftover = b"", b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self.pending:
            chunk, self.leftover = self.leftover or self.raw.read(READ_BLOCK), b""
            if not chunk:
                if self.frame is not None:
                    raise OSError("truncated zstd data: the file ends inside a frame")
                return 0
            if self.frame is None:
                self.frame = self.zstandard.ZstdDecompressor().decompressobj()
            self.pending = self.frame.decompress(chunk)
            if self.frame.eof:
                self.leftover, self.frame = self.frame.unused_data, None
        size = min(len(buffer), len(self.pending))
        buffer[:size] = self.pending[:size]
        self.pending = self.pending[size:]
        return size

    def close(self) -> None:
        self.raw.close()
        super().close()


def _zstandard(source: SourceFile):
    """The optional ``zstandard`` module, imported only when a .zst file is read (it is not in every image)."""
    try:
        import zstandard
    except ImportError as error:
        raise CorpusError(
            f"{source.rel}: reading .zst files needs the zstandard package (pip install zstandard)"
        ) from error
    return zstandard


def _decompression_errors() -> tuple[type[BaseException], ...]:
    """What a corrupt compressed stream raises (zstandard's error only when zstandard is installed)."""
    errors: tuple[type[BaseException], ...] = (OSError, EOFError, zlib.error)
    try:
        import zstandard
    except ImportError:
        return errors
    return (*errors, zstandard.ZstdError)


# What reading drops from text, and counts: bytes that are not UTF-8 in a UTF-8 file (decoded with
# surrogateescape, they become U+DC80-U+DCFF), control characters (C0 but tab, LF, VT, FF, CR; DEL; C1) and lone
# surrogates (a JSON string may spell one with an escape; no encoder accepts them).
_ESCAPED_BYTES = re.compile("[\udc80-\udcff]+")
_CONTROL = re.compile("[\x00-\x08\x0e-\x1f\x7f-\x9f]")
_SURROGATES = re.compile("[\ud800-\udfff]")
# _CONTROL in UTF-8, as two searches: one character class scans far faster than an alternation
_C0_BYTES = re.compile(b"[\x00-\x08\x0e-\x1f\x7f]")
_C1_UTF8 = re.compile(b"\xc2[\x80-\x9f]")
MAX_LINE_REPORTS = 10  # per file and kind; the rest are summed up in one more item


@dataclass
class _Sniffed:
    """What one streaming pass over a file's bytes found."""

    invalid: int = 0  # bytes that are not UTF-8
    multibyte: int = 0  # non-ASCII characters that are valid UTF-8
    stray: int = 0  # of the invalid bytes, those that do not read as text in Windows-1252 either
    nul: bool = False
    has_text: bool = False
    c1: bool = False
    undefined: bool = False
    utf16: bool = False  # the whole file decodes as UTF-16 (after a UTF-16 byte-order mark)


def sniff_stream(source: SourceFile) -> tuple[str, Junk | None]:
    """Stream a file once: its encoding, or ("junk", why) for a binary or empty file. Memory stays O(block).

    UTF-8 when every byte is UTF-8, and also when a few are not (dropped and reported by line when read): after a
    UTF-8 byte-order mark, or when they are fewer than the valid non-ASCII characters, or when most of
    them do not read as text in Windows-1252 either (``_stray_bytes``).
    UTF-16 only after a UTF-16 byte-order mark, when the whole file decodes as UTF-16 and holds the NUL bytes
    UTF-16 text always has (FF FE followed by UTF-8 is UTF-8 with two bad bytes). Otherwise Windows-1252, or Latin-1
    when a byte that Windows-1252 leaves undefined occurs."""
    with open_decompressed(source) as stream:
        head = stream.read(SNIFF_BYTES)
        if looks_binary(head):
            return "junk", Junk(source.rel, None, "binary", "mostly NUL or control bytes: not text")
        bom16 = head.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE))
        bom8 = head.startswith(codecs.BOM_UTF8)
        found = _Sniffed(utf16=bom16)
        utf8 = codecs.getincrementaldecoder("utf-8")(errors="surrogateescape")
        utf16 = codecs.getincrementaldecoder("utf-16")() if bom16 else None
        block = head[len(codecs.BOM_UTF8) :] if bom8 else head
        while block:
            found.has_text = found.has_text or bool(block.strip())
            _count_utf8(utf8.decode(block), found)
            if found.utf16:
                try:
                    utf16.decode(block)
                except UnicodeDecodeError:
                    found.utf16 = False
            found.nul = found.nul or b"\x00" in block
            found.c1 = found.c1 or bool(_C1_BYTES.search(block))
            found.undefined = found.undefined or bool(_CP1252_UNDEFINED.search(block))
            block = stream.read(READ_BLOCK)
        _count_utf8(utf8.decode(b"", final=True), found)
        if found.utf16:
            try:
                utf16.decode(b"", final=True)
            except UnicodeDecodeError:
                found.utf16 = False
    if not found.has_text:
        return "junk", Junk(source.rel, None, "empty", "no text")
    encoding = _choose_encoding(found, bom8, bom16)
    if encoding in ("cp1252", "latin-1") and found.multibyte:
        return encoding, Junk(
            source.rel,
            None,
            "mixed-encoding",
            f"{found.invalid} bytes are not UTF-8, so the file is read as {encoding}; its {found.multibyte} "
            "UTF-8 characters come out as two to four characters each",
        )
    return encoding, None


def _count_utf8(text: str, found: _Sniffed) -> None:
    if text.isascii():
        return
    try:
        text.encode("utf-8")  # fails exactly when surrogateescape kept a byte that is not UTF-8
        invalid = 0
    except UnicodeEncodeError:
        invalid = 0
        for run in _ESCAPED_BYTES.finditer(text):
            invalid += len(run.group())
            found.stray += _stray_bytes(text, run.start(), run.end())
    found.invalid += invalid
    found.multibyte += len(text) - len(text.encode("ascii", "ignore")) - invalid


def _stray_bytes(text: str, start: int, end: int) -> int:
    """How many of the bytes that are not UTF-8 in ``text[start:end]`` (kept by surrogateescape) do not read
    as text in Windows-1252: an undefined byte, a symbol between two letters (``wh€ale``), an
    uppercase letter right after a lowercase one (``whÉale``). Legacy text reads as text: ``Laocoön``,
    ``IRENÉ``, ``don’t``, ``“quoted”``, ``£5``."""
    legacy = bytes(ord(c) - 0xDC00 for c in text[start:end]).decode("cp1252", errors="replace")
    before, after = text[start - 1 : start] or " ", text[end : end + 1] or " "
    context = (before if before.isascii() else " ") + legacy + (after if after.isascii() else " ")
    stray = 0
    for i, char in enumerate(legacy, start=1):
        previous, following = context[i - 1], context[i + 1]
        if char.isalpha():
            stray += char.isupper() and previous.islower()
        elif char in "’'":
            continue
        else:
            stray += char == "\ufffd" or (previous.isalpha() and following.isalpha())
    return stray


def _choose_encoding(found: _Sniffed, bom8: bool, bom16: bool) -> str:
    invalid = found.invalid - (2 if bom16 else 0)  # the two bytes of a UTF-16 mark are never UTF-8
    # Real UTF-16 text has NUL bytes (every newline, space and ASCII character has one); FF FE before 8-bit
    # text without them may still decode as UTF-16, as gibberish.
    if bom16 and found.utf16 and found.nul:
        return "utf-16"
    # A UTF-8 byte-order mark declares UTF-8; without one, a few bytes that are not UTF-8 among more valid UTF-8
    # characters, or bytes that mostly do not read as legacy text either, are damage to drop and report
    if bom8 or invalid <= found.multibyte or 2 * found.stray > invalid:
        return "utf-8-sig" if bom8 else "utf-8"
    return "cp1252" if found.c1 and not found.undefined else "latin-1"


def decode_bytes(data: bytes, encoding: str) -> str:
    """Decode with an encoding chosen by :func:`sniff_stream`: UTF-8 keeps bytes that are not UTF-8 as
    U+DC80-U+DCFF (surrogateescape) for :func:`drop_bad_characters` to drop and report."""
    if encoding in ("utf-8", "utf-8-sig"):
        while encoding == "utf-8-sig" and data.startswith(codecs.BOM_UTF8):  # no mark enters the text
            data = data[len(codecs.BOM_UTF8) :]
        return data.decode("utf-8", errors="surrogateescape")
    return data.decode(encoding)


class _BadCharacters:
    """Counts what :func:`drop_bad_characters` dropped in one file, and turns it into junk items: bytes
    that are not UTF-8 per line (the first MAX_LINE_REPORTS lines, then a sum), control characters and lone
    surrogates per file."""

    def __init__(self, file: str) -> None:
        self.file = file
        self.byte_lines: list[Junk] = []
        self.more_byte_lines = self.more_bytes = 0
        self.control = self.surrogates = 0
        self.control_lines: list[int] = []

    def drop(self, text: str, first_line: int | None, decoded: bool = True) -> tuple[str, list[Junk]]:
        """``text`` without the bad characters; junk items for its bytes that were not UTF-8 (line numbers
        from ``first_line``). ``decoded``: ``text`` comes from bytes decoded with surrogateescape (False for a
        JSON string, whose U+DC80-U+DCFF can only be escapes). The common case, clean text, costs one UTF-8
        encode and one bytes search (a str regex over non-ASCII text is several times slower)."""
        items = []
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:  # surrogates: bytes kept by surrogateescape, or lone ones from JSON
            if decoded and _ESCAPED_BYTES.search(text):
                items = self._drop_bytes(text, first_line)
                text = _ESCAPED_BYTES.sub("", text)
            text, count = _SURROGATES.subn("", text)
            self.surrogates += count
            data = text.encode("utf-8")
        if _C0_BYTES.search(data) or (b"\xc2" in data and _C1_UTF8.search(data)):
            control = _CONTROL.search(text)
            if len(self.control_lines) < 3 and first_line is not None:
                self.control_lines.append(first_line + text.count("\n", 0, control.start()))
            text, count = _CONTROL.subn("", text)
            self.control += count
        return text, items

    def _drop_bytes(self, text: str, first_line: int | None) -> list[Junk]:
        by_line: dict[int | None, bytearray] = {}
        for match in _ESCAPED_BYTES.finditer(text):
            line = None if first_line is None else first_line + text.count("\n", 0, match.start())
            by_line.setdefault(line, bytearray()).extend(ord(c) - 0xDC00 for c in match.group())
        items = []
        for line, raw in by_line.items():
            if len(self.byte_lines) < MAX_LINE_REPORTS:
                detail = f"{len(raw)} byte(s) not UTF-8 dropped: {_hex(raw)}"
                junk = Junk(self.file, line, "invalid-utf8", detail)
                self.byte_lines.append(junk)
                items.append(junk)
            else:
                self.more_byte_lines += 1
                self.more_bytes += len(raw)
        return items

    def summary(self) -> list[Junk]:
        """The items that sum up the file (call once, after its last document)."""
        items = []
        if self.more_byte_lines:
            items.append(
                Junk(
                    self.file,
                    None,
                    "invalid-utf8",
                    f"{self.more_bytes} more byte(s) not UTF-8 dropped on {self.more_byte_lines} more lines",
                )
            )
        if self.control:
            lines = (
                f" (first on line {', '.join(map(str, self.control_lines))})" if self.control_lines else ""
            )
            items.append(
                Junk(
                    self.file, None, "control-chars", f"{self.control} NUL/control characters dropped{lines}"
                )
            )
        if self.surrogates:
            items.append(
                Junk(
                    self.file, None, "invalid-unicode", f"{self.surrogates} lone surrogate characters dropped"
                )
            )
        return items


def looks_binary(head: bytes) -> bool:
    """True when the first bytes of a file are not text: more than 5% NUL or other control bytes (a few are
    dropped and counted when the text is read). A UTF-16 byte-order mark exempts the NULs of UTF-16."""
    if head.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return False
    controls = len(_BINARY_BYTES.findall(head))
    return controls > 0.05 * max(1, len(head))


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
    """

    def __init__(
        self,
        paths: str | Path | Sequence[str | Path],
        *,
        text_field: str = "text",
        strict: bool = False,
        gutenberg: bool = False,
    ) -> None:
        self.paths = [Path(paths)] if isinstance(paths, (str, Path)) else [Path(p) for p in paths]
        self.text_field, self.strict, self.gutenberg = text_field, strict, gutenberg
        self.sources, unsupported = list_sources(self.paths)
        self.summary: CorpusSummary | None = None
        self._encodings: dict[str, str | None] = {}
        # characters of each valid document, in order (filled by scan(); the validation plan needs them)
        self.document_chars: list[int] = []
        self._pending_junk = unsupported
        for junk in unsupported:
            self._junk(junk, None)

    # -- scanning ---------------------------------------------------------------------------------------

    def scan(self, progress: bool = False) -> CorpusSummary:
        """One pass over every file: sha256, size, encoding, valid document count and junk."""
        summary = CorpusSummary(junk=list(self._pending_junk))
        self.document_chars = []
        for source in tqdm(self.sources, desc="scanning", unit="file", disable=not progress):
            info = FileInfo(source.rel, None, 0, None, 0)
            try:
                info.sha256, info.bytes = _sha256(source), source.path.stat().st_size
            except OSError as error:  # a mode-000 file, say: said, and not read again by documents()
                self._junk(_unreadable_file(source, error), summary.junk)
                self._encodings[source.rel] = info.encoding = "junk"
            else:
                info.encoding = self._file_encoding(source, summary.junk)
            if info.encoding != "junk":
                for item in self._file_documents(source, info.encoding):
                    if isinstance(item, Junk):
                        self._junk(item, summary.junk)
                    else:
                        info.documents += 1
                        self.document_chars.append(len(item))
            else:
                info.encoding = None
            summary.files.append(info)
        if not self.sources:
            skipped = "".join(f"; {junk}" for junk in summary.junk[:3])
            raise ValueError(
                f"no .txt/.jsonl/.parquet files found under {', '.join(map(str, self.paths))}{skipped}"
            )
        self.summary = summary
        return summary

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
        if start and self.summary is None:
            raise RuntimeError("Corpus.scan() must run before documents(start > 0)")
        ranges = self.file_document_ranges() if self.summary is not None else None
        index = 0
        for i, source in enumerate(self.sources):
            if ranges is not None:
                first, end = ranges[i]
                if end <= start or first == end:
                    index = end
                    continue
            encoding = self._encodings.get(source.rel) or self._file_encoding(source, None)
            if encoding == "junk":
                continue
            for item in self._file_documents(source, encoding):
                if isinstance(item, Junk):
                    self._junk(item, None)
                    continue
                if index >= start:
                    yield item
                index += 1

    def __iter__(self) -> Iterator[str]:
        return self.documents()

    def _junk(self, junk: Junk, found: list[Junk] | None) -> None:
        if self.strict:
            raise JunkError(f"{junk} (strict mode; run without --strict to skip and report junk)")
        if found is not None:
            found.append(junk)

    def _file_encoding(self, source: SourceFile, found: list[Junk] | None) -> str:
        """The file's text encoding, or "junk" after reporting a binary, empty or unreadable file."""
        if source.kind == "parquet":
            encoding = "utf-8"  # parquet strings are UTF-8 by specification
            try:
                import pyarrow.parquet as pq

                with open_regular(source.path) as handle:
                    pq.ParquetFile(handle, page_checksum_verification=True).schema_arrow  # noqa: B018 - reads and checks the footer
            except OSError as error:
                self._junk(_unreadable_file(source, error), found)
                encoding = "junk"
            except Exception as error:
                self._junk(Junk(source.rel, None, "unreadable", f"not a parquet file ({error})"), found)
                encoding = "junk"
            self._encodings[source.rel] = encoding
            return encoding
        try:
            encoding, problem = sniff_stream(source)
        except _decompression_errors() as error:
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
        with open_decompressed(source) as stream:
            return stream.read()

    def _file_documents(self, source: SourceFile, encoding: str) -> Iterator[str | Junk]:
        if source.kind == "txt":
            yield from self._txt_documents(source, encoding)
        elif source.kind == "jsonl":
            yield from self._jsonl_documents(source, encoding)
        else:
            yield from self._parquet_documents(source)

    def _clean(self, text: str) -> str:
        return strip_gutenberg(text) if self.gutenberg else text

    def _txt_documents(self, source: SourceFile, encoding: str) -> Iterator[str | Junk]:
        bad = _BadCharacters(source.rel)
        text, items = bad.drop(decode_bytes(self._read_all(source), encoding), 1)
        yield from items
        yield from bad.summary()
        text = self._clean(text)
        if text.strip():
            yield text
        else:
            yield Junk(source.rel, None, "empty", "no text after removing boilerplate and bad characters")

    def _jsonl_documents(self, source: SourceFile, encoding: str) -> Iterator[str | Junk]:
        bad = _BadCharacters(source.rel)
        errors = "surrogateescape" if encoding.startswith("utf-8") else "strict"
        with io.TextIOWrapper(
            open_decompressed(source), encoding=encoding, errors=errors, newline="\n"
        ) as lines:
            for line_no, line in enumerate(lines, start=1):
                line, items = bad.drop(line, line_no)
                yield from items
                if not line.strip():
                    continue
                try:
                    record = json.loads(line, object_pairs_hook=no_duplicate_keys)
                except RecursionError:
                    yield Junk(source.rel, line_no, "invalid-json", "nested too deeply")
                    continue
                except ValueError as error:  # also integers over Python's 4,300-digit limit
                    yield Junk(source.rel, line_no, "invalid-json", _short(str(error)))
                    continue
                yield self._record_text(record, source.rel, line_no, bad)
        yield from bad.summary()

    def _record_text(self, record: object, file: str, line: int | None, bad: _BadCharacters) -> str | Junk:
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

    def _parquet_documents(self, source: SourceFile) -> Iterator[str | Junk]:
        import pyarrow.parquet as pq

        bad = _BadCharacters(source.rel)
        row = 0
        try:
            with open_regular(source.path) as handle:
                parquet = pq.ParquetFile(handle, page_checksum_verification=True)
                if self.text_field not in parquet.schema_arrow.names:
                    yield Junk(source.rel, None, "missing-field", f"no column {self.text_field!r}")
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


def _named(files: list[str], limit: int = 5) -> str:
    """ ": a, b, c and 2 more" (nothing for no files)."""
    if not files:
        return ""
    more = f" and {len(files) - limit} more" if len(files) > limit else ""
    return ": " + ", ".join(files[:limit]) + more


def _hex(raw: bytes, limit: int = 16) -> str:
    return raw[:limit].hex(" ") + (" …" if len(raw) > limit else "")


def _short(message: str, limit: int = 200) -> str:
    return message if len(message) <= limit else message[:limit] + "…"
