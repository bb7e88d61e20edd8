"""Which text goes to which split: the document stream of a prepared dataset and its validation split.

Two rules for a local corpus (``settings.split_rule`` of a manifest names which one made it):

- ``keyed-hash`` (:class:`KeyedHashDocuments`): each document decides alone, from a keyed hash of its file and
  its position in that file, whether it goes to ``val`` (whole, or one section of a long document). A part of
  the corpus applies it without reading the rest, and nothing is kept per document.
- ``plan`` (:class:`LocalDocuments`, the rule of every dataset prepared before the keyed hash): a seeded plan of
  whole documents and sections of long ones over all documents' lengths (:func:`plan_validation`).

A streamed hub dataset (:class:`HubDocuments`, N unknown) hashes each document's index with the seed; under the
keyed-hash rule, its data files are streamed one by one (:class:`HubFiles`) and each document is keyed by its data
file and row, so parts can split it by data files. Each gives
the stream of documents in a fixed order: ``stream(start)`` yields (text, split, where) from stream index
``start``, ``where`` being the validation document's record (its file and place; None for train).
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from tablefree.data.corpus import Corpus, CorpusSummary, Junk, JunkLog

SPLITS = ("train", "val")
PLAN_RULE = "plan"  # the seeded plan over all documents (plan_validation)
KEYED_HASH_RULE = "keyed-hash"  # a keyed hash of each document's file and position (KeyedHashDocuments)
SPLIT_RULES = (KEYED_HASH_RULE, PLAN_RULE)
# What the keyed-hash rule keys a document by besides its file (``settings.position`` of its datasets; datasets and
# parts prepared before it was recorded keyed every document by its number among its file's valid documents, which
# a part holding a later span of a file cannot know).
HUB_POSITION = (
    "a row's index in its data file (rows without text counted)"  # the keyed-hash rule on a hub dataset
)
KEYED_HASH_POSITION = (
    "a .jsonl line's byte offset and a parquet row's index (junk rows counted) in its file (files read in spans); "
    "the document's number among its file's valid documents in other files"
)
# The keyed-hash rule's cap on the validation split: validation documents that start after the split holds this
# many tokens are left out of both splits. A full validation pass over 10M tokens costs about a third of training
# on 10M tokens (forward only): 0.003% of a 100B-token run, where val_fraction 0.005 alone would hold ~500M tokens.
DEFAULT_VAL_MAX_TOKENS = 10_000_000


@dataclass(frozen=True)
class HubSource:
    """A Hugging Face ``datasets`` dataset, streamed (``pip install 'tablefree[hub]'``). For a local test,
    ``name="parquet"`` or ``"json"`` with ``data_files``."""

    name: str
    config: str | None = None
    split: str = "train"
    data_files: str | list[str] | None = None
    revision: str | None = None

    def as_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v is not None}


# The validation split may take at most this share of the corpus text (or val_fraction, if larger).
VAL_MAX_SHARE = 0.10
DEFAULT_VAL_DOCUMENTS = 20  # enough documents for a document-level (cluster) bootstrap
DEFAULT_VAL_SECTION_CHARS = 80_000  # about 20k tokens of English text with a byte-level BPE
MIN_VAL_SECTION_CHARS = 2_000


@dataclass
class ValidationPlan:
    """Which text of a local corpus is held out for validation.

    A document shorter than two sections goes to ``val`` whole (``whole``); a longer one gives ``sections``:
    contiguous character ranges held out as validation documents of their own, the text around them staying in
    ``train`` as separate documents. Every range is planned before any text is read again; when the text is
    read, each end moves forward to the next line start (at most ``snap`` characters on), so a section starts
    and ends at a line boundary, and the pieces around it are never empty."""

    whole: set[int] = field(default_factory=set)
    sections: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    section_chars: int = 0
    snap: int = 0

    @property
    def units(self) -> int:
        return len(self.whole) + sum(len(r) for r in self.sections.values())

    @property
    def sources(self) -> int:
        return len(self.whole) + len(self.sections)

    def pieces(self, doc: int) -> int:
        """How many documents of the stream source document ``doc`` becomes."""
        return 1 + 2 * len(self.sections.get(doc, ()))


def plan_validation(
    lengths: Sequence[int],
    val_fraction: float,
    min_documents: int = DEFAULT_VAL_DOCUMENTS,
    section_chars: int = DEFAULT_VAL_SECTION_CHARS,
    seed: int = 0,
) -> ValidationPlan:
    """Plan the validation split of documents of ``lengths`` characters (see :class:`ValidationPlan`).

    The split gets ``max(min_documents, round(val_fraction · N))`` validation documents when the corpus
    allows, within ``max(val_fraction, VAL_MAX_SHARE)`` of its text: documents are visited in a seeded random
    order, long documents first, one unit per source document (so the units come from different sources),
    then, only if more are needed, further sections of the long documents. A section is ``section_chars`` long, or shorter when
    that many sections would not fit (never under ``MIN_VAL_SECTION_CHARS``). At most half of a document is
    held out. With ``val_fraction`` 0 nothing is; with N ≥ 2 documents at least one unit is."""
    lengths = np.asarray(lengths, dtype=np.int64)
    n = len(lengths)
    if val_fraction == 0 or n == 0 or int(lengths.sum()) == 0:
        return ValidationPlan()
    target = max(min_documents, round(val_fraction * n), 1)
    budget = max(val_fraction, VAL_MAX_SHARE) * float(lengths.sum())
    size = max(min(section_chars, int(budget // target)), MIN_VAL_SECTION_CHARS)
    capacity = lengths // (2 * size)  # sections a document can give, keeping at least half of it in train
    # Seeded order, long documents first: a section of a long book costs training a small part of it, a short
    # document held out whole costs all of it.
    order = sorted(np.random.default_rng(seed).permutation(n).tolist(), key=lambda d: capacity[d] == 0)
    whole: set[int] = set()
    counts: dict[int, int] = {}
    used, units, round_ = 0, 0, 0
    while units < target:
        added = False
        for doc in map(int, order):
            if units >= target:
                break
            if capacity[doc] == 0:
                fits = round_ == 0 and used + lengths[doc] <= budget and len(whole) < n - 1
                if fits:
                    whole.add(doc)
                    used, units, added = used + int(lengths[doc]), units + 1, True
            elif counts.get(doc, 0) == round_ < capacity[doc] and used + size <= budget:
                counts[doc] = round_ + 1
                used, units, added = used + size, units + 1, True
        if not added:
            break
        round_ += 1
    if units == 0 and n >= 2:  # a tiny corpus: hold out one document rather than none
        first = int(order[0])
        if capacity[first]:
            counts[first] = 1
        else:
            whole.add(first)
    snap = min(2_000, size // 10)
    margin = snap + 1
    placement = np.random.default_rng([seed, 1])
    sections = {}
    for doc in sorted(counts):
        k, length = counts[doc], int(lengths[doc])
        ranges = []
        for j in range(k):  # one section in each of k equal segments: they never overlap
            lo, hi = j * length // k, (j + 1) * length // k
            start = int(placement.integers(lo + margin, hi - size - margin + 1))
            ranges.append((start, start + size))
        sections[doc] = ranges
    return ValidationPlan(whole, sections, size, snap)


def _snap(text: str, position: int, limit: int) -> int:
    """``position`` moved forward to the next line start, if one is within ``limit`` characters."""
    newline = text.find("\n", position, position + limit)
    return position if newline == -1 else newline + 1


class LocalDocuments:
    """The documents of local files as the stream of the split: source documents, with validation
    sections cut out of long ones (:func:`plan_validation`). Index i of the stream is a "document" of
    the dataset; ``split_of(i)`` says where it goes."""

    def __init__(
        self,
        corpus: Corpus,
        summary: CorpusSummary,
        val_fraction: float,
        seed: int,
        val_documents: int = DEFAULT_VAL_DOCUMENTS,
        val_section_chars: int = DEFAULT_VAL_SECTION_CHARS,
    ) -> None:
        self.corpus, self.summary = corpus, summary
        self.lengths = list(corpus.document_chars)
        self.plan = plan_validation(self.lengths, val_fraction, val_documents, val_section_chars, seed)
        pieces = np.array([self.plan.pieces(d) for d in range(len(self.lengths))], dtype=np.int64)
        self.first_unit = np.concatenate(
            ([0], np.cumsum(pieces))
        )  # stream index of each source's first piece
        n_val = self.plan.units
        total = int(self.first_unit[-1])
        self.counts = {"train": total - n_val, "val": n_val}
        self.rule = PLAN_RULE
        self.description = (
            f"documents: {len(self.plan.whole)} whole, {n_val - len(self.plan.whole)} sections of "
            f"{self.plan.section_chars} characters from {len(self.plan.sections)} documents "
            f"(seeded plan, {len(self.lengths)} source documents)"
        )

    def stream(self, start: int) -> Iterator[tuple[str, str, dict | None]]:
        for index, text in enumerate(self.documents(start), start=start):
            yield text, self.split_of(index), None

    def source_of(self, index: int) -> tuple[int, int]:
        """(source document, piece number within it) of stream document ``index``."""
        doc = int(np.searchsorted(self.first_unit, index, side="right") - 1)
        return doc, index - int(self.first_unit[doc])

    def split_of(self, index: int) -> str:
        doc, piece = self.source_of(index)
        if doc in self.plan.whole or piece % 2 == 1:
            return "val"
        return "train"

    def documents(self, start: int) -> Iterator[str]:
        first_doc, _ = self.source_of(start) if start else (0, 0)
        index = int(self.first_unit[first_doc])
        for doc, text in enumerate(self.corpus.documents(first_doc), start=first_doc):
            for piece in self._pieces(doc, text):
                if index >= start:
                    yield piece
                index += 1

    def _pieces(self, doc: int, text: str) -> list[str]:
        ranges = self.plan.sections.get(doc)
        if not ranges:
            return [text]
        if len(text) != self.lengths[doc]:
            raise RuntimeError(
                f"document {doc} changed while it was being prepared ({len(text)} characters, "
                f"{self.lengths[doc]} when scanned)"
            )
        cuts = [0]
        for a, b in self.cut_ranges(doc, text):
            cuts += [a, b]
        cuts.append(len(text))
        return [text[a:b] for a, b in itertools.pairwise(cuts)]

    def cut_ranges(self, doc: int, text: str) -> list[tuple[int, int]]:
        """The held-out character ranges of source document ``doc``, moved to line starts."""
        snap = self.plan.snap
        return [(_snap(text, a, snap), _snap(text, b, snap)) for a, b in self.plan.sections.get(doc, ())]

    def validation_items(self) -> list[dict]:
        """Each validation document in stream order: its source file, source document and character range
        (planned; each end is moved forward to a line start when cut), or ``whole``."""
        ranges = self.corpus.file_document_ranges()
        files = [info.file for info in self.summary.files]
        items = []
        for doc in sorted(self.plan.whole | set(self.plan.sections)):
            file_index = next(i for i, (a, b) in enumerate(ranges) if a <= doc < b)
            where = {"file": files[file_index], "document_in_file": doc - ranges[file_index][0]}
            if doc in self.plan.whole:
                items.append({**where, "whole": True, "chars": self.lengths[doc]})
            else:
                items += [
                    {**where, "whole": False, "planned_chars": [a, b]} for a, b in self.plan.sections[doc]
                ]
        return items


def split_rule_name(settings: dict | None) -> str | None:
    """The rule a manifest's ``settings`` name: ``keyed-hash``, ``plan`` (its datasets record a description of their
    plan, "documents: ...", as every dataset prepared before the keyed hash did, so fingerprints stay the same), or
    ``hub-index-hash`` (a streamed hub dataset); None for a dataset that records none (adopted shards)."""
    rule = (settings or {}).get("split_rule")
    if not isinstance(rule, str):
        return None
    if rule in SPLIT_RULES:
        return rule
    if isinstance(rule, str) and rule.startswith("hash:"):
        return "hub-index-hash"
    return PLAN_RULE


def validation_share(val_fraction: float, val_documents: int, section_chars: int, corpus_bytes: int) -> float:
    """The share of the text the keyed-hash rule holds out: ``val_fraction``, raised so that about
    ``val_documents`` sections of ``section_chars`` are expected in a small corpus (at most ``VAL_MAX_SHARE``).
    ``corpus_bytes`` is the corpus files' size on disk, which every part knows without reading a file."""
    if val_fraction == 0 or corpus_bytes <= 0:
        return 0.0
    return max(val_fraction, min(VAL_MAX_SHARE, val_documents * section_chars / corpus_bytes))


def keyed_unit(seed: int, file: str, position: int, purpose: str) -> float:
    """A number in [0, 1) fixed by the seed, the document's file and position in it, and what it is for."""
    message = f"{file}\0{position}\0{purpose}".encode()
    digest = hashlib.blake2b(message, key=str(seed).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2**64


class KeyedHashDocuments:
    """The documents of local files, each one's split decided alone (rule ``keyed-hash``): with
    u = keyed_unit(seed, file, position), a document shorter than two sections goes to ``val`` whole when
    u < share; a longer one gives one section of ``section_chars`` (at a keyed offset, its ends moved to line
    starts) when u < share × length / section_chars, the text around it staying in ``train`` as two documents.
    Each document thus holds out ``share`` of its text on average; nothing is kept per document."""

    def __init__(
        self,
        corpus: Corpus | HubFiles,
        share: float,
        section_chars: int,
        seed: int,
        position: str = KEYED_HASH_POSITION,
    ) -> None:
        self.corpus, self.share, self.section_chars, self.seed = corpus, share, section_chars, seed
        self.snap = min(2_000, section_chars // 10)
        self.counts = None  # not known before the stream is read
        self.rule = KEYED_HASH_RULE
        self.description = (
            f"keyed-hash: blake2b keyed by the seed over (file, document position) < {share:.6g} (of the text): "
            f"short documents whole, long ones one section of {section_chars} characters; position: {position}"
        )

    @property
    def junk(self) -> JunkLog:
        """What a hub stream skipped (a local corpus's junk is in its scan's summary)."""
        return getattr(self.corpus, "junk", JunkLog())

    def stream(self, start: int) -> Iterator[tuple[str, str, dict | None]]:
        index = 0
        for file, position, text in self.corpus.located_documents():
            for piece in self._pieces(file, position, text):
                if index >= start:
                    yield piece
                index += 1

    def _pieces(self, file: str, position: int, text: str) -> list[tuple[str, str, dict | None]]:
        size, length = self.section_chars, len(text)
        u = keyed_unit(self.seed, file, position, "split")
        where = {"file": file, "document_in_file": position}
        if length < 2 * size:
            if u < self.share:
                return [(text, "val", {**where, "whole": True, "chars": length})]
            return [(text, "train", None)]
        if u >= self.share * length / size:
            return [(text, "train", None)]
        margin = self.snap + 1
        start = margin + int(
            keyed_unit(self.seed, file, position, "offset") * (length - size - 2 * margin + 1)
        )
        a, b = _snap(text, start, self.snap), _snap(text, start + size, self.snap)
        item = {**where, "whole": False, "planned_chars": [start, start + size]}
        return [(text[:a], "train", None), (text[a:b], "val", item), (text[b:], "train", None)]


def hub_data_files(source: HubSource) -> list[str]:
    """The data files of a hub source, in the order given: what the keyed-hash rule keys its documents by and
    parts split it by (each entry one unit, a glob pattern included). Refused when none are given: resolving them
    from the dataset's builder may reach the network, so they are asked for."""
    files = source.data_files
    if not files:
        raise ValueError(
            f"--hub {source.name}: the keyed-hash rule on a hub dataset keys each document by its data file, and "
            "parts split the dataset by them: give them with --hub-data-files (HubSource(data_files=[...]))"
        )
    return [files] if isinstance(files, str) else list(files)


class HubFiles:
    """Data files of a hub source (``files``: a part's share), each streamed on its own through ``datasets``,
    its documents located as (data file, row index in it): what :class:`KeyedHashDocuments` keys them by.
    ``max_documents`` stops after that many valid documents."""

    def __init__(
        self, source: HubSource, files: Sequence[str], text_field: str, max_documents: int | None = None
    ) -> None:
        self.source, self.files, self.text_field = source, list(files), text_field
        self.max_documents = max_documents
        self.junk = JunkLog()
        self.documents: dict[str, int] = {}  # valid documents read per data file

    def located_documents(self) -> Iterator[tuple[str, int, str]]:
        datasets = _datasets()
        self.junk, self.documents, count = JunkLog(), {}, 0
        for file in self.files:
            stream = datasets.load_dataset(
                self.source.name,
                self.source.config,
                split=self.source.split,
                data_files=[file],
                revision=self.source.revision,
                streaming=True,
            )
            self.documents[file] = 0
            for row, record in enumerate(stream):
                if self.max_documents is not None and count >= self.max_documents:
                    return
                text = record.get(self.text_field)
                if not isinstance(text, str) or not text.strip():
                    self.junk.add(Junk(file, row + 1, "missing-field", f"no text in {self.text_field!r}"))
                    continue
                yield file, row, text
                self.documents[file] += 1
                count += 1


def _datasets():
    """The optional ``datasets`` module (the ``hub`` extra), imported only when a hub dataset is streamed."""
    try:
        import datasets
    except ImportError as error:
        raise ValueError(
            "streaming a hub dataset needs the `hub` extra: pip install 'tablefree[hub]'"
        ) from error
    return datasets


class HubDocuments:
    """Documents streamed through ``datasets``; the split of document i hashes (seed, i)."""

    def __init__(
        self, source: HubSource, text_field: str, val_fraction: float, seed: int, max_documents: int | None
    ) -> None:
        self.source, self.text_field = source, text_field
        self.val_fraction, self.seed, self.max_documents = val_fraction, seed, max_documents
        self.counts = None
        self.junk = JunkLog()
        self.rule = self.description = "hash: blake2b(seed:index) / 2^64 < val_fraction"

    def split_of(self, index: int) -> str:
        digest = hashlib.blake2b(f"{self.seed}:{index}".encode(), digest_size=8).digest()
        return "val" if int.from_bytes(digest, "little") < self.val_fraction * 2**64 else "train"

    def stream(self, start: int) -> Iterator[tuple[str, str, dict | None]]:
        for index, text in enumerate(self.documents(start), start=start):
            yield text, self.split_of(index), None

    def documents(self, start: int) -> Iterator[str]:
        stream = _datasets().load_dataset(
            self.source.name,
            self.source.config,
            split=self.source.split,
            data_files=self.source.data_files,
            revision=self.source.revision,
            streaming=True,
        )
        index = 0
        for row, record in enumerate(stream, start=1):
            if self.max_documents is not None and index >= self.max_documents:
                return
            text = record.get(self.text_field)
            if not isinstance(text, str) or not text.strip():
                self.junk.add(Junk(self.source.name, row, "missing-field", f"no text in {self.text_field!r}"))
                continue
            if index >= start:
                yield text
            index += 1
