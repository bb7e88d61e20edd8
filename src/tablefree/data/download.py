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

from tablefree.fileio import write_bytes_atomic

_HF = "https://huggingface.co/datasets"


@dataclass(frozen=True)
class EvalFile:
    task: str
    path: str  # relative path in the evaluation data directory
    url: str
    sha256: str
    parquet: bool = False  # the URL serves parquet, converted to JSONL here


EVAL_FILES = (
    EvalFile(
        "hellaswag",
        "hellaswag_val.jsonl",
        "https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl",
        "dc1be2fa1bef56aab8e92a5be597a617e363b09239fa66822939d7fb7a8da4ec",
    ),
    EvalFile(
        "piqa",
        "piqa/valid.jsonl",
        "https://yonatanbisk.com/piqa/data/valid.jsonl",
        "93503cc97c679e459b065c3d13e848282e44b2a25213985bed3e5d458abef72d",
    ),
    EvalFile(
        "piqa",
        "piqa/valid-labels.lst",
        "https://yonatanbisk.com/piqa/data/valid-labels.lst",
        "b4192dc3a2a0363d9d60ccf79800cbbe2f32ebb17726efdde6970e0b8131bceb",
    ),
    EvalFile(
        "lambada_openai",
        "lambada_test.jsonl",
        "https://openaipublic.blob.core.windows.net/gpt-2/data/lambada_test.jsonl",
        "4aa8d02cd17c719165fc8a7887fddd641f43fcafa4b1c806ca8abc31fabdb226",
    ),
    EvalFile(
        "arc_easy",
        "extra/arc_easy_validation.jsonl",
        f"{_HF}/allenai/ai2_arc/resolve/210d026faf9955653af8916fad021475a3f00453/ARC-Easy/validation-00000-of-00001.parquet",
        "b35645919a17e969df8cd9c3af371a6edb5cd7f92ba04d8c65ee24ddab5a7a60",
        parquet=True,
    ),
    EvalFile(
        "arc_challenge",
        "extra/arc_challenge_validation.jsonl",
        f"{_HF}/allenai/ai2_arc/resolve/210d026faf9955653af8916fad021475a3f00453/ARC-Challenge/validation-00000-of-00001.parquet",
        "91042aabebf8aa801b045b025ddb420ccf66bb079c6a95f30c35cfd7962590cb",
        parquet=True,
    ),
    EvalFile(
        "winogrande",
        "extra/winogrande_xl_validation.jsonl",
        f"{_HF}/allenai/winogrande/resolve/01e74176c63542e6b0bcb004dcdea22d94fb67b5/winogrande_xl/validation-00000-of-00001.parquet",
        "34f0a22749f3986249b0629ff05ae298ebb2b14f93ac8499aa673626548626c7",
        parquet=True,
    ),
    EvalFile(
        "openbookqa",
        "extra/openbookqa_validation.jsonl",
        f"{_HF}/allenai/openbookqa/resolve/388097ea7776314e93a529163e0fea805b8a6454/main/validation-00000-of-00001.parquet",
        "90adcc55f4724ec367585978363aa451628d18093b6c827b2fd295128cd61e87",
        parquet=True,
    ),
    EvalFile(
        "sciq",
        "extra/sciq_validation.jsonl",
        f"{_HF}/allenai/sciq/resolve/2c94ad3e1aafab77146f384e23536f97a4849815/data/validation-00000-of-00001.parquet",
        "b0775c6e2e0547aa670400d59d2ffdeaa8c1e8f7e099ee35cd39b33daeefdb42",
        parquet=True,
    ),
    EvalFile(
        "boolq",
        "extra/boolq_validation.jsonl",
        f"{_HF}/google/boolq/resolve/35b264d03638db9f4ce671b711558bf7ff0f80d5/data/validation-00000-of-00001.parquet",
        "0ad1d6a17b5524d7f8eeea3bcb9a823556785a890f26e3d88bef40245bedc5f2",
        parquet=True,
    ),
    EvalFile(
        "copa",
        "extra/copa_validation.jsonl",
        f"{_HF}/aps/super_glue/resolve/5234c61e804e85e5994b14b002fa9ec34487bcfb/copa/validation-00000-of-00001.parquet",
        "fbec30f4988f13714e8f51752cdcf1294ac237d4fb948353b7a55c5d0c0ee077",
        parquet=True,
    ),
)
EVAL_TASKS = tuple(dict.fromkeys(f.task for f in EVAL_FILES))


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
    paths. Files already present with the right sha256 are kept unless ``force``. ``base_url``: a mirror of the
    directory layout. ``urls``: per-file overrides, keyed by relative path."""
    unknown = sorted(set(tasks or ()) - set(EVAL_TASKS))
    if unknown:
        raise ValueError(f"unknown evaluation task(s) {unknown}; known: {', '.join(EVAL_TASKS)}")
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
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        rows = pq.read_table(pa.BufferReader(data)).to_pylist()
    except Exception as error:
        raise ValueError(f"{where}: not a parquet file ({error})") from error
    return "".join(json.dumps(row) + "\n" for row in rows).encode("utf-8")


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
