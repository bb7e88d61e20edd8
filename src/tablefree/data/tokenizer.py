"""Tokenizers: training a byte-level BPE, loading any ``tokenizer.json``, and identifying a tokenizer exactly.

The fixed input codes make the token id the model's whole input, so a tokenizer is identified by the sha256 of
its canonical JSON (``Tokenizer.to_str()``): :func:`tokenizer_hash`. Datasets and checkpoints record that hash,
and a mismatch is an error (:func:`check_tokenizer`).

Our trained tokenizers are byte-level BPE (GPT-2 style: ByteLevel pre-tokenizer without a prefix space, the 256
byte symbols always in the vocabulary, no normalizer), so any text round-trips exactly, with ``<|endoftext|>`` as
id 0. Training is deterministic for a given corpus and settings.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from tablefree.data.corpus import Corpus, CorpusSummary
from tablefree.data.decoding import DEFAULT_MAX_EXPANSION
from tablefree.fileio import atomic_path

EOT = "<|endoftext|>"
# End-of-text tokens of other common tokenizers, tried after EOT by eot_id().
EOT_ALTERNATIVES = ("<|end_of_text|>", "</s>", "<eos>", "<|eos|>")
MIN_VOCAB = 256 + 1  # every byte, plus EOT
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def new_byte_level_bpe() -> Tokenizer:
    """An untrained byte-level BPE tokenizer with our settings."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def train_tokenizer_from_texts(
    texts: Iterable[str], vocab_size: int, out_path: str | Path | None = None, *, min_frequency: int = 2
) -> Tokenizer:
    """Train a byte-level BPE on an iterable of documents (:func:`train_tokenizer` reads them from a corpus)."""
    if vocab_size < MIN_VOCAB:
        raise ValueError(f"vocab_size must be at least {MIN_VOCAB} (256 bytes + {EOT}), got {vocab_size}")
    tokenizer = new_byte_level_bpe()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    if out_path is not None:
        save_tokenizer(tokenizer, out_path)
    return tokenizer


@dataclass
class TrainedTokenizer:
    """A tokenizer trained on a corpus, with what reading the corpus found (encodings, junk) and whether the
    corpus filled the vocabulary asked for."""

    tokenizer: Tokenizer
    summary: CorpusSummary
    requested: int
    min_frequency: int

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def shortfall(self) -> str | None:
        """A sentence when the corpus could not fill the vocabulary, else None."""
        if self.vocab_size >= self.requested:
            return None
        return (
            f"the corpus filled {self.vocab_size} of the {self.requested} tokens asked for: no more pairs occur "
            f"at least {self.min_frequency} times; train on more text, lower --min-frequency, or ask for "
            f"--vocab-size {self.vocab_size}"
        )


def train_tokenizer(
    sources: str | Path | Sequence[str | Path],
    vocab_size: int,
    out_path: str | Path | None = None,
    *,
    text_field: str = "text",
    strict: bool = False,
    gutenberg: bool = False,
    min_frequency: int = 2,
    max_expansion: float = DEFAULT_MAX_EXPANSION,
) -> TrainedTokenizer:
    """Train a byte-level BPE tokenizer with ``vocab_size`` entries (``<|endoftext|>`` included) on a corpus
    (files or directories, read by :class:`tablefree.data.corpus.Corpus`), and save it to ``out_path``. Returns
    the tokenizer (``.tokenizer``) with the corpus summary (junk by file and line, encodings) and whether the
    vocabulary was filled: a small corpus may fill fewer entries (``shortfall()`` says so)."""
    corpus = Corpus(
        sources, text_field=text_field, strict=strict, gutenberg=gutenberg, max_expansion=max_expansion
    )
    summary = corpus.scan()
    tokenizer = train_tokenizer_from_texts(
        corpus.documents(), vocab_size, out_path, min_frequency=min_frequency
    )
    return TrainedTokenizer(tokenizer, summary, vocab_size, min_frequency)


def save_tokenizer(tokenizer: Tokenizer, path: str | Path) -> None:
    """Write ``tokenizer.json`` atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        tokenizer.save(str(tmp))


def load_tokenizer(path_or_hub_id: str | Path) -> Tokenizer:
    """A tokenizer from a ``tokenizer.json`` file, a directory holding one, or a Hugging Face hub id
    (``org/name``; needs the ``hub`` extra and network access)."""
    path = Path(path_or_hub_id)
    if path.is_dir():
        path = path / "tokenizer.json"
    if path.is_file():
        try:
            return Tokenizer.from_file(str(path))
        except Exception as error:
            raise ValueError(f"{path}: not a Hugging Face tokenizer.json ({error})") from error
    name = str(path_or_hub_id)
    if not _HUB_ID.match(name) or name.endswith(".json"):
        raise FileNotFoundError(f"tokenizer file not found: {name}")
    return _load_from_hub(name)


def _load_from_hub(repo_id: str) -> Tokenizer:
    try:
        from huggingface_hub import hf_hub_download
    except ImportError as error:
        raise FileNotFoundError(
            f"tokenizer {repo_id!r} is not a local file, and loading it from the Hugging Face hub needs the "
            "`hub` extra (pip install 'tablefree[hub]')"
        ) from error
    try:
        local = hf_hub_download(repo_id, "tokenizer.json")
    except Exception as error:
        raise FileNotFoundError(
            f"tokenizer {repo_id!r} is not a local file, and fetching tokenizer.json from the Hugging Face hub "
            f"failed ({type(error).__name__}: {error})"
        ) from error
    return Tokenizer.from_file(local)


def tokenizer_hash(tokenizer_or_path: Tokenizer | str | Path) -> str:
    """sha256 (hex) of the tokenizer's canonical JSON, ``Tokenizer.to_str()``."""
    tokenizer = (
        tokenizer_or_path if isinstance(tokenizer_or_path, Tokenizer) else load_tokenizer(tokenizer_or_path)
    )
    return hashlib.sha256(tokenizer.to_str().encode("utf-8")).hexdigest()


def eot_id(tokenizer: Tokenizer) -> int:
    """The id of the end-of-text token (``<|endoftext|>``, else a common alternative such as ``</s>``)."""
    for token in (EOT, *EOT_ALTERNATIVES):
        token_id = tokenizer.token_to_id(token)
        if token_id is not None:
            return token_id
    raise ValueError(f"tokenizer has no end-of-text token (looked for {', '.join((EOT, *EOT_ALTERNATIVES))})")


def check_tokenizer(expected_hash: str, tokenizer: Tokenizer | str | Path, where: str) -> None:
    """Raise a ValueError when ``tokenizer`` is not the one whose hash ``where`` (a manifest, a checkpoint)
    records."""
    actual = tokenizer_hash(tokenizer)
    if actual != expected_hash:
        raise ValueError(
            f"tokenizer mismatch: {where} was made with tokenizer {expected_hash[:16]}…, "
            f"but the given tokenizer is {actual[:16]}…"
        )


def is_split_safe(tokenizer: Tokenizer) -> bool:
    """True when encoding a text in pieces cut by :func:`split_points` gives exactly the tokens of the whole:
    no normalizer, and GPT-2's byte-level pre-tokenizer without a prefix space (its regex never joins a
    newline to a following non-space character)."""
    spec = json.loads(tokenizer.to_str())
    pre = spec.get("pre_tokenizer") or {}
    return (
        spec.get("normalizer") is None
        and spec.get("model", {}).get("type") == "BPE"
        and not spec.get("model", {}).get("dropout")
        and pre.get("type") == "ByteLevel"
        and not pre.get("add_prefix_space", True)
        and pre.get("use_regex", True)
    )


# Unicode White_Space, the regex class \s of the byte-level pre-tokenizer.
_WHITESPACE = frozenset("\t\n\x0b\x0c\r \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000") | frozenset(
    map(chr, range(0x2000, 0x200B))
)


def split_points(text: str, piece_chars: int) -> Iterator[int]:
    """Cut positions about ``piece_chars`` apart: after a newline, at the last character of the whitespace run
    that contains it, when a non-space character follows.

    There the GPT-2 pre-tokenizer regex always splits: a whitespace run followed by a non-space becomes the
    pre-tokens (run minus its last character) and (last character + what follows), and a piece that ends with
    the run minus its last character yields that same pre-token. So encoding the pieces gives exactly the
    tokens of the whole (tested in tests/test_data_tokenizer.py)."""
    position, end = piece_chars, len(text)
    while True:
        newline = text.find("\n", position)
        if newline == -1:
            return
        after = newline + 1
        while after < end and text[after] in _WHITESPACE:
            after += 1
        if after >= end:
            return
        yield after - 1
        position = after - 1 + piece_chars
