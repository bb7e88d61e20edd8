"""Reading a corpus file's bytes as text: decompression (gzip, zstd) under a bound on how far a file may expand,
encoding detection in one streaming pass (:func:`sniff_stream`), decoding, and dropping (and counting) the
characters that do not belong in text (:class:`BadCharacters`). The rules are in the docstring of
:mod:`tablefree.data.corpus`.
"""

from __future__ import annotations

import codecs
import gzip
import io
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass

from tablefree.data.sources import CorpusError, Junk, SourceFile, open_regular

READ_BLOCK = 1 << 20
SNIFF_BYTES = 8192
KINDS = {".txt": "txt", ".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet"}
COMPRESSIONS = {".gz": "gz", ".zst": "zst", ".zstd": "zst"}
# Bytes that Windows-1252 leaves undefined: a file holding them is decoded as Latin-1.
_CP1252_UNDEFINED = re.compile(rb"[\x81\x8d\x8f\x90\x9d]")
_C1_BYTES = re.compile(rb"[\x80-\x9f]")
# Control characters that do not occur in text (everything below 0x20 except \t \n \v \f \r and ESC).
_BINARY_BYTES = re.compile(rb"[\x00-\x08\x0e-\x1a\x1c-\x1f]")
# A compressed file may expand to at most this many times the compressed bytes read so far, plus
# EXPANSION_ALLOWANCE: text compresses 3-5x (gzip, zstd), so a file past it is a decompression bomb
# (a few megabytes that expand to gigabytes of one letter), refused before it is read for minutes.
DEFAULT_MAX_EXPANSION = 100.0
EXPANSION_ALLOWANCE = 1 << 20


def open_decompressed(source: SourceFile, max_expansion: float = DEFAULT_MAX_EXPANSION) -> io.BufferedIOBase:
    """A binary stream of the file's (decompressed) bytes. Reading a compressed file past ``max_expansion``
    times the compressed bytes read (plus ``EXPANSION_ALLOWANCE``) raises a :class:`CorpusError` naming it."""
    if max_expansion <= 0:
        raise ValueError(f"max_expansion must be positive, got {max_expansion}")
    raw = open_regular(source.path)
    if source.compression is None:
        return raw
    try:
        stream = _GzipStream(raw) if source.compression == "gz" else _ZstdStream(raw, _zstandard(source))
    except BaseException:
        raw.close()
        raise
    return io.BufferedReader(_ExpansionBound(stream, raw, source, max_expansion), READ_BLOCK)


class _ExpansionBound(io.RawIOBase):
    """The decompressed bytes of ``stream``, refused once they exceed ``max_expansion`` times the compressed
    bytes read from ``raw`` so far, plus EXPANSION_ALLOWANCE: a bomb is refused after a few megabytes."""

    def __init__(self, stream: io.IOBase, raw: io.BufferedReader, source: SourceFile, max_expansion: float):
        self.stream, self.raw, self.source, self.max_expansion = stream, raw, source, max_expansion
        self.expanded = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        size = self.stream.readinto(buffer)
        self.expanded += size
        # the compressed bytes decompressed so far: zstd counts them (the file's position is its read-ahead);
        # gzip reads ahead at most 128 KiB
        compressed = self.stream.consumed if isinstance(self.stream, _ZstdStream) else self.raw.tell()
        if self.expanded > self.max_expansion * compressed + EXPANSION_ALLOWANCE:
            raise CorpusError(
                f"{self.source.rel}: its {self.source.compression} data expands more than "
                f"{self.max_expansion:g} times ({self.expanded:,} bytes out of its first {compressed:,} "
                f"compressed bytes, of {self.source.path.stat().st_size:,}): a decompression bomb, or text far more repetitive than "
                "a corpus; not read. If the file is sound, raise the bound: --max-expansion RATIO "
                "(Python: max_expansion=)"
            )
        return size

    def close(self) -> None:
        try:
            self.stream.close()
        finally:
            super().close()


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


# zstd writes at most 128 KiB per block and a block takes at least 4 bytes (its header and one byte to repeat), so
# one compressed byte expands to at most 32 KiB: feeding ZSTD_FEED_BYTES at a time bounds one decompression call's
# output at ZSTD_FEED_BYTES × 32 KiB + 128 KiB, about 4 MiB, whatever the file holds.
ZSTD_MAX_BLOCK = 128 << 10
ZSTD_FEED_BYTES = 128


def zstd_output_bound(feed_bytes: int = ZSTD_FEED_BYTES) -> int:
    """The most bytes one decompression call over ``feed_bytes`` compressed bytes can return."""
    return feed_bytes * (ZSTD_MAX_BLOCK // 4) + ZSTD_MAX_BLOCK


class _ZstdStream(io.RawIOBase):
    """Decompressed bytes of a zstd file of one or more frames. Unlike zstandard's stream reader, which
    returns a truncated file's partial data as if it were whole, it raises an OSError when the file ends
    inside a frame. The decompressor is fed ``ZSTD_FEED_BYTES`` at a time, so memory stays bounded
    (``zstd_output_bound``) however far the data expands, and ``consumed`` counts the compressed bytes
    decompressed so far (the expansion bound's denominator, not what was read ahead)."""

    def __init__(self, raw: io.BufferedIOBase, zstandard) -> None:
        self.raw, self.zstandard = raw, zstandard
        self.frame = None  # the decompressor of the frame being read
        self.pending = b""
        self.chunk, self.offset = memoryview(b""), 0  # compressed bytes read, and how many were fed
        self.consumed = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self.pending:
            if self.offset == len(self.chunk):
                self.chunk, self.offset = memoryview(self.raw.read(READ_BLOCK)), 0
                if not self.chunk:
                    if self.frame is not None:
                        raise OSError("truncated zstd data: the file ends inside a frame")
                    return 0
            if self.frame is None:
                self.frame = self.zstandard.ZstdDecompressor().decompressobj()
            piece = self.chunk[self.offset : self.offset + ZSTD_FEED_BYTES]
            self.offset += len(piece)
            self.pending = self.frame.decompress(piece)
            if self.frame.eof:
                unused = len(self.frame.unused_data)  # the next frame's first bytes: fed again to a new one
                self.offset -= unused
                self.frame = None
            else:
                unused = 0
            self.consumed += len(piece) - unused
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


def decompression_errors() -> tuple[type[BaseException], ...]:
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


def sniff_stream(
    source: SourceFile,
    max_expansion: float = DEFAULT_MAX_EXPANSION,
    on_read: Callable[[int], object] | None = None,
) -> tuple[str, Junk | None]:
    """Stream a file once: its encoding, or ("junk", why) for a binary or empty file. Memory stays O(block).

    UTF-8 when every byte is UTF-8, and also when a few are not (dropped and reported by line when read): after a
    UTF-8 byte-order mark, or when they are fewer than the valid non-ASCII characters, or when most of
    them do not read as text in Windows-1252 either (``_stray_bytes``).
    UTF-16 only after a UTF-16 byte-order mark, when the whole file decodes as UTF-16 and holds the NUL bytes
    UTF-16 text always has (FF FE followed by UTF-8 is UTF-8 with two bad bytes). Otherwise Windows-1252, or Latin-1
    when a byte that Windows-1252 leaves undefined occurs. ``on_read(n)`` is told each block's size (progress)."""
    with open_decompressed(source, max_expansion) as stream:
        head = stream.read(SNIFF_BYTES)
        if on_read is not None:
            on_read(len(head))
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
            if on_read is not None:
                on_read(len(block))
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
    U+DC80-U+DCFF (surrogateescape) for :meth:`BadCharacters.drop` to drop and report."""
    if encoding in ("utf-8", "utf-8-sig"):
        while encoding == "utf-8-sig" and data.startswith(codecs.BOM_UTF8):  # no mark enters the text
            data = data[len(codecs.BOM_UTF8) :]
        return data.decode("utf-8", errors="surrogateescape")
    return data.decode(encoding)


class BadCharacters:
    """Counts what :meth:`drop` dropped in one file, and turns it into junk items: bytes
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


def _hex(raw: bytes, limit: int = 16) -> str:
    return raw[:limit].hex(" ") + (" …" if len(raw) > limit else "")
