"""Tokenizing the document stream: tasks of about ``TASK_CHARS`` characters encoded in worker processes (or in
this one), their tokens handed in stream order to one writer per split (:class:`TokenSink`).

Each document becomes ``[EOT] + tokens(document)``. A long document is encoded in pieces cut by
:func:`tablefree.data.tokenizer.split_points` when that gives exactly the tokens of the whole
(:func:`tablefree.data.tokenizer.is_split_safe`), so one book does not hold up a worker.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
from collections import deque
from collections.abc import Iterator
from typing import Protocol

import numpy as np
from tokenizers import Tokenizer
from tqdm import tqdm

from tablefree.data.tokenizer import eot_id, is_split_safe, split_points

TASK_CHARS = 1 << 20  # text per worker task
PIECE_CHARS = (
    1 << 16
)  # long documents are encoded in pieces of about this size (when exact; see tokenizer.py)


class TokenSink(Protocol):
    """One split's writer, as the tokenizing loop feeds it (``SplitWriter``, ``PartWriter``)."""

    dtype: np.dtype
    resume_doc: int
    done: bool
    documents: int

    def wants(self, doc: int) -> bool: ...

    def add(self, doc: int, tokens: np.ndarray, first: bool, on_shard, where: dict | None = None) -> None: ...


_worker_tokenizer: Tokenizer | None = None
_worker_eot = 0
_worker_dtype = np.dtype(np.uint16)


def _init_worker(tokenizer_json: str, eot: int, dtype: str) -> None:
    global _worker_tokenizer, _worker_eot, _worker_dtype
    _worker_tokenizer, _worker_eot, _worker_dtype = Tokenizer.from_str(tokenizer_json), eot, np.dtype(dtype)


def _encode_task(task: tuple[list[str], list[bool]]) -> tuple[np.ndarray, np.ndarray, int]:
    """Encode a task's pieces (one thread): their concatenated tokens, each piece's token count (an EOT is
    prepended to every piece that starts a document), and the UTF-8 bytes encoded."""
    pieces, firsts = task
    arrays, lengths, nbytes = [], [], 0
    for text, first in zip(pieces, firsts, strict=True):
        ids = _worker_tokenizer.encode(text, add_special_tokens=False).ids
        if first:
            ids.insert(0, _worker_eot)
        arrays.append(np.asarray(ids, dtype=_worker_dtype))
        lengths.append(len(ids))
        nbytes += len(text.encode("utf-8"))
    tokens = np.concatenate(arrays) if arrays else np.empty(0, _worker_dtype)
    return tokens, np.asarray(lengths, dtype=np.int64), nbytes


class _InProcess:
    """The single-worker path: tasks are encoded in this process (no pool)."""

    def __init__(self, tokenizer_json: str, eot: int, dtype: str) -> None:
        _init_worker(tokenizer_json, eot, dtype)

    def apply_async(self, func, args):  # mirrors multiprocessing.pool.Pool
        result = func(*args)
        return _Done(result)

    def close(self) -> None:
        pass

    def terminate(self) -> None:
        pass

    def join(self) -> None:
        pass


class _Done:
    def __init__(self, value) -> None:
        self.value = value

    def get(self):
        return self.value


def _make_pool(workers: int, tokenizer: Tokenizer, eot: int, dtype: np.dtype):
    args = (tokenizer.to_str(), eot, dtype.str)
    if workers <= 1:
        return _InProcess(*args)
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    # Workers are single-threaded; telling tokenizers so before forking also silences its fork warning.
    previous = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        return multiprocessing.get_context(method).Pool(workers, initializer=_init_worker, initargs=args)
    finally:
        if previous is None:
            del os.environ["TOKENIZERS_PARALLELISM"]
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = previous


def _tasks(docs, writers: dict[str, TokenSink], split_safe: bool) -> Iterator[tuple[list, list, list]]:
    """Tasks of about TASK_CHARS characters: (pieces, first-piece flags, (doc, split) per piece). Documents
    whose split already has them in shards are skipped without tokenizing."""
    active = [w.resume_doc for w in writers.values() if not w.done]
    if not active:
        return
    start = max(0, min(active))
    pieces, firsts, owners, size = [], [], [], 0
    for doc, (text, split, where) in enumerate(docs.stream(start), start=start):
        if not writers[split].wants(doc):
            continue
        cuts = [0, *split_points(text, PIECE_CHARS), len(text)] if split_safe else [0, len(text)]
        for i, (a, b) in enumerate(itertools.pairwise(cuts)):
            pieces.append(text[a:b])
            firsts.append(i == 0)
            owners.append((doc, split, where))
            size += b - a
            if size >= TASK_CHARS:
                yield pieces, firsts, owners
                pieces, firsts, owners, size = [], [], [], 0
    if pieces:
        yield pieces, firsts, owners


def tokenize_documents(
    docs, tok: Tokenizer, writers: dict[str, TokenSink], workers: int, journal, progress: bool
) -> None:
    """Encode the documents of ``docs`` (``stream(start)``: text, split, where) that a split's writer still
    wants, in ``workers`` processes, and hand each piece's tokens to its split's writer in stream order;
    ``journal`` is called after each shard a writer writes."""
    eot = eot_id(tok)
    dtype = writers["train"].dtype
    pool = _make_pool(workers, tok, eot, dtype)
    bar = tqdm(desc="tokenizing", unit="B", unit_scale=True, unit_divisor=1000, disable=not progress)
    pending: deque = deque()
    documents = tokens = 0
    try:
        for task in _tasks(docs, writers, is_split_safe(tok)):
            pending.append((pool.apply_async(_encode_task, ((task[0], task[1]),)), task[1], task[2]))
            while len(pending) > 2 * workers:
                documents, tokens = _consume(pending.popleft(), writers, journal, bar, documents, tokens)
        while pending:
            documents, tokens = _consume(pending.popleft(), writers, journal, bar, documents, tokens)
        pool.close()
    except BaseException:
        pool.terminate()
        raise
    finally:
        pool.join()
        bar.close()


def _consume(
    item, writers: dict[str, TokenSink], journal, bar, documents: int, tokens: int
) -> tuple[int, int]:
    result, firsts, owners = item
    ids, lengths, nbytes = result.get()
    offset = 0
    for length, first, (doc, split, where) in zip(lengths.tolist(), firsts, owners, strict=True):
        writers[split].add(doc, ids[offset : offset + length], first, journal, where)
        offset += length
    documents += sum(firsts)
    tokens += offset
    bar.update(nbytes)
    bar.set_postfix(docs=f"{documents:,}", tokens=f"{tokens:,}", refresh=False)
    return documents, tokens
