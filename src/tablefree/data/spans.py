"""A corpus file's *spans*: the pieces the keyed-hash rule reads it in, fixed by the file alone (never by how many
parts a preparation is cut into), so a part can own some spans of one large file and a single run, reading every
span, gives what the parts give together.

- an uncompressed ``.jsonl``: byte ranges of ``span_bytes`` (the last shorter); a span owns the lines that
  *start* inside it (the Hadoop/dolma rule: it seeks to its start, skips to the next line start, and reads past its
  end only to finish its last line);
- a parquet file: its row groups (byte ranges from the footer: the first from byte 0, the last to the file's end);
- every other file (compressed, ``.txt``, Arrow, a parquet file whose row groups are out of order): one span, the
  whole file. A ``datasets`` save_to_disk ``.arrow`` file is an Arrow IPC *stream*, whose record batches cannot be
  found without reading the ones before them.

A span's weight is the text bytes it holds, to balance parts: a byte range's length, a row group's uncompressed
text column, and for a compressed file an *estimate* of its decompressed length (:func:`uncompressed_estimate`: the
length its format records, else ``NOMINAL_EXPANSION`` times its size), since its compressed bytes would under-weigh
it 3-5x beside uncompressed files and parquet.

Only ``stat``, parquet footers and a compressed file's recorded length (gzip's last 4 bytes, zstd's frame header)
are read here: what every part and the merge may read of other parts' files, never their text.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from tablefree.data.sources import SourceFile, open_regular

DEFAULT_SPAN_BYTES = 1 << 25  # 32 MiB of a .jsonl: a part's smallest share of one; about 10 s of tokenizing
# Text compresses 3-5x (gzip, zstd): the expansion assumed for a compressed file that does not record its length.
NOMINAL_EXPANSION = 4
# A recorded length outside [1, this] times the compressed bytes is not the file's (the bound reading refuses past).
MAX_RECORDED_EXPANSION = 100
# The longest a zstd frame header is: magic, descriptor, window, dictionary id, size.
ZSTD_FRAME_HEADER_BYTES = 18


@dataclass(frozen=True)
class Span:
    """Bytes [start, end) of a file, how much text they weigh (for balancing parts), and for a parquet row
    group its number and the file's row index of its first row."""

    start: int
    end: int
    weight: int
    row_group: int | None = None
    first_row: int = 0
    whole: bool = False  # the whole file, read as it is without spans


@dataclass(frozen=True)
class Piece:
    """Spans [first, end) of listed file ``file`` (its index in the listing), of the ``count`` it has (``whole``:
    its one span is the whole file, read without spans)."""

    file: int
    first: int
    end: int
    count: int
    whole: bool = False


def spanned(source: SourceFile) -> bool:
    """Whether the keyed-hash rule reads ``source`` in more than one span when it is large enough."""
    return source.compression is None and source.kind in ("jsonl", "parquet")


def file_spans(source: SourceFile, span_bytes: int | None, text_field: str) -> list[Span]:
    """The spans of ``source`` (one whole-file span when ``span_bytes`` is None or the file does not split)."""
    try:
        size = source.path.stat().st_size
    except OSError:
        size = 0
    weight = size if source.compression is None else uncompressed_estimate(source, size)
    whole = [Span(0, size, weight, whole=True)]
    if span_bytes is None or not spanned(source):
        return whole
    if source.kind == "jsonl":
        spans = [
            Span(a, min(a + span_bytes, size), min(span_bytes, size - a)) for a in range(0, size, span_bytes)
        ]
        return spans or [Span(0, 0, 0)]  # an empty file: one empty span, which says so
    return _row_group_spans(source, size, text_field) or whole


def uncompressed_estimate(source: SourceFile, size: int) -> int:
    """An estimate of a compressed file's decompressed bytes (``size``: its bytes on disk), from the length its
    format records: a gzip file's ISIZE trailer (its last member's length mod 2^32, taken with the multiple of 2^32
    that brings it nearest ``NOMINAL_EXPANSION`` × size), a zstd file's first frame's content size. Exact for one
    gzip member or one zstd frame that records its size (what gzip, zstd and Python's libraries write for a whole
    file); a recorded length outside [1, ``MAX_RECORDED_EXPANSION``] × size (concatenated members or frames,
    a stream written without its size) gives ``NOMINAL_EXPANSION`` × size. Deterministic: a function of the file."""
    nominal = NOMINAL_EXPANSION * size
    try:
        with open_regular(source.path) as handle:
            if source.compression == "gz":
                magic = handle.read(2)
                handle.seek(max(size - 4, 0))
                trailer = handle.read(4)
                if magic != b"\x1f\x8b" or len(trailer) != 4:
                    return nominal
                isize = int.from_bytes(trailer, "little")
                length = isize + max(0, round((nominal - isize) / 2**32)) * 2**32
            else:
                # zstandard is imported where a .zst file is weighed or read: most corpora hold none
                import zstandard

                length = zstandard.frame_content_size(handle.read(ZSTD_FRAME_HEADER_BYTES))
    except Exception:
        # unreadable, not of its format, or zstandard missing: reading the file names what is wrong
        return nominal
    return length if size <= length <= MAX_RECORDED_EXPANSION * size else nominal


def _row_group_spans(source: SourceFile, size: int, text_field: str) -> list[Span] | None:
    """A parquet file's row groups as spans, from its footer; None when it has none or they are out of order
    (then it is read whole, and reading it reports what is wrong)."""
    # pyarrow is imported where parquet is read: every verb loads this module, few read parquet
    import pyarrow.parquet as pq

    try:
        with open_regular(source.path) as handle:
            metadata = pq.ParquetFile(handle).metadata
    except Exception:  # not parquet, or unreadable: the whole-file reader names it as junk
        return None
    names = [metadata.schema.column(i).path for i in range(metadata.num_columns)]
    column = names.index(text_field) if text_field in names else None
    starts, weights, rows = [], [], [0]
    for r in range(metadata.num_row_groups):
        group = metadata.row_group(r)
        offsets = []
        for c in range(group.num_columns):
            chunk = group.column(c)
            dictionary = chunk.dictionary_page_offset if chunk.has_dictionary_page else None
            offsets.append(dictionary if dictionary else chunk.data_page_offset)
        starts.append(min(offsets) if offsets else 0)
        weights.append(
            group.column(column).total_uncompressed_size if column is not None else group.total_byte_size
        )
        rows.append(rows[-1] + group.num_rows)
    bounds = [0, *starts[1:], size]
    if not starts or any(a >= b for a, b in itertools.pairwise(bounds)):
        return None
    return [Span(bounds[r], bounds[r + 1], weights[r], r, rows[r]) for r in range(metadata.num_row_groups)]


def plan_pieces(spans: Sequence[Sequence[Span]], n: int) -> list[list[Piece]]:
    """Each of ``n`` parts' pieces: contiguous runs of the spans of all files (the stream's order) whose largest
    weight is as small as contiguous runs allow (a binary search over the largest part's weight, filling parts
    greedily), each holding at least one span."""
    atoms = [(f, s) for f, file in enumerate(spans) for s in range(len(file))]
    weights = [spans[f][s].weight for f, s in atoms]
    if not 1 <= n <= len(atoms):
        raise ValueError(
            f"part: {n} parts, but the corpus splits into {len(atoms)} pieces ({len(spans)} files: parquet "
            f"files by row groups, uncompressed .jsonl files by spans of --span-bytes, every other file whole): "
            f"it allows at most {len(atoms)} parts"
        )

    def greedy(limit: int) -> list[int]:  # the cuts of parts filled up to ``limit`` each
        cuts, total = [0], 0
        for i, weight in enumerate(weights):
            if total + weight > limit and i > cuts[-1]:
                cuts.append(i)
                total = 0
            total += weight
        return cuts

    low, high = max(weights), sum(weights)
    while low < high:
        middle = (low + high) // 2
        low, high = (low, middle) if len(greedy(middle)) <= n else (middle + 1, high)
    cuts = greedy(low)
    while len(cuts) < n:  # fewer parts than asked: split a run's last span off (the largest cannot grow)
        bounds = [*cuts, len(atoms)]
        k = next(k for k in range(len(cuts)) if bounds[k + 1] - bounds[k] >= 2)
        cuts.insert(k + 1, bounds[k + 1] - 1)
    parts = []
    for a, b in itertools.pairwise([*cuts, len(atoms)]):
        pieces: list[Piece] = []
        for f, s in atoms[a:b]:
            if pieces and pieces[-1].file == f:
                last = pieces[-1]
                pieces[-1] = Piece(f, last.first, s + 1, last.count)
            else:
                pieces.append(Piece(f, s, s + 1, len(spans[f]), spans[f][s].whole))
        parts.append(pieces)
    return parts
