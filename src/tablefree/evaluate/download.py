"""Download the zero-shot evaluation sets into the layout ``tablefree eval`` reads, verifying every file.

HellaSwag, PIQA and LAMBADA come from their official locations, byte for byte. The seven extra sets come from the
Hugging Face hub's parquet files at pinned revisions (there is no official single-file JSONL for them) and are
converted to JSONL, one ``json.dumps(row)`` per line; the *converted* file is what the sha256 check covers, so a
changed upstream file or conversion is caught either way.

Every file is written to a temporary name, checked against its known sha256 and only then renamed into place.
``base_url`` points at a mirror that serves the files under their relative paths (``hellaswag_val.jsonl``,
``piqa/valid.jsonl``, ``extra/arc_easy_validation.jsonl``, ...), already converted.
"""

from __future__ import annotations

import hashlib
import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tablefree.evaluate.tasks import TASKS, parse_task_names
from tablefree.fileio import write_bytes_atomic


@dataclass(frozen=True)
class EvalFile:
    task: str
    path: str  # relative path in the evaluation data directory
    url: str
    sha256: str
    parquet: bool = False  # the URL serves parquet, converted to JSONL here


# Derived from the task records (tablefree.evaluate.tasks.TASKS), which hold each file's path, URL and sha256.
EVAL_FILES = tuple(
    EvalFile(task.name, f.path, f.url, f.sha256, f.parquet) for task in TASKS.values() for f in task.data
)
EVAL_TASKS = tuple(TASKS)


def download_evals(
    out_dir: str | Path,
    tasks: list[str] | None = None,
    *,
    base_url: str | None = None,
    urls: dict[str, str] | None = None,
    force: bool = False,
    timeout: float = 60.0,
) -> list[Path]:
    """Download (and verify) the evaluation files of ``tasks`` (default: all) into ``out_dir``; return their
    paths. ``tasks``: names as ``tablefree eval --tasks`` takes them (a comma list or a list; aliases such as
    ``lambada_openai`` accepted). Files already present with the right sha256 are kept unless ``force``.
    ``base_url``: a mirror of the directory layout. ``urls``: per-file overrides, keyed by relative path."""
    tasks = parse_task_names(tasks) if tasks else None
    out_dir = Path(out_dir)
    done = []
    for entry in EVAL_FILES:
        if tasks and entry.task not in tasks:
            continue
        target = out_dir / entry.path
        if not force and target.exists() and sha256_of(target.read_bytes()) == entry.sha256:
            done.append(target)
            continue
        url, parquet = entry.url, entry.parquet
        if base_url:
            url, parquet = f"{base_url.rstrip('/')}/{entry.path}", False
        if urls and entry.path in urls:
            url = urls[entry.path]
            parquet = url.endswith(".parquet")
        data = fetch(url, timeout)
        if parquet:
            data = parquet_to_jsonl(data, url)
        actual = sha256_of(data)
        if actual != entry.sha256:
            raise ValueError(
                f"{url}: sha256 mismatch for {entry.path}: got {actual}, expected {entry.sha256} "
                "(a corrupted or changed file; nothing was written)"
            )
        target.parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(target, data)
        done.append(target)
    return done


def fetch(url: str, timeout: float) -> bytes:
    request = urllib.request.Request(url, headers={"User-Agent": "tablefree"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.read()
    except urllib.error.HTTPError as error:
        raise FileNotFoundError(f"{url}: HTTP {error.code} {error.reason}") from error
    except (urllib.error.URLError, TimeoutError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise FileNotFoundError(f"{url}: cannot download ({reason}); use --base-url for a mirror") from error


def parquet_to_jsonl(data: bytes, where: str) -> bytes:
    """The rows of a parquet file as JSONL, ``json.dumps(row)`` per line (the layout of the eval directory)."""
    try:
        rows = pq.read_table(pa.BufferReader(data)).to_pylist()
    except Exception as error:
        raise ValueError(f"{where}: not a parquet file ({error})") from error
    return "".join(json.dumps(row) + "\n" for row in rows).encode("utf-8")


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
