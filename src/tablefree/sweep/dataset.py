"""The dataset a sweep trains on: prepared from ``dataset.corpus`` when the directory has none yet, checked to be
the one the config names when it has, and recorded as the runs used it (``dataset_as_used``, in
``compare.yaml``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tablefree.config_parsing import to_dict
from tablefree.data.loader import read_manifest
from tablefree.data.prepare import PrepareSpec, prepare_single
from tablefree.sweep.config import CompareConfig, base_recipe


def prepare_data(config: CompareConfig, log=print) -> None:
    """Prepare ``dataset.corpus`` into ``dataset.dir`` unless that holds a complete dataset already, in which case
    the dataset must be the one the config names (its corpus and vocabulary): a sweep never trains on a corpus
    other than the one it records."""
    spec = config.dataset
    if not spec.dir:
        return
    if (Path(spec.dir) / "manifest.json").exists():
        check_prepared_dataset(config)
        return
    if not spec.corpus:
        raise FileNotFoundError(
            f"dataset.dir {spec.dir} holds no prepared dataset (no manifest.json): prepare one with "
            f"`tablefree data prepare CORPUS --out {spec.dir}`, or name the corpus in the same command "
            f"(dataset.corpus=CORPUS) to have compare prepare it"
        )
    chosen = {
        "vocab_size": spec.vocab_size,
        "val_fraction": spec.val_fraction,
        "val_documents": spec.val_documents,
        "val_section_chars": spec.val_section_chars,
        "val_max_tokens": spec.val_max_tokens,
        "split_rule": spec.split_rule,
    }
    log(f"preparing {spec.corpus} into {spec.dir}")
    prepare = PrepareSpec(
        corpus=(spec.corpus,),
        tokenizer=spec.tokenizer,
        workers=spec.workers,
        text_field=spec.text_field,
        gutenberg=spec.gutenberg,
        **{k: v for k, v in chosen.items() if v is not None},
    )
    prepare_single(prepare, spec.dir)


def check_prepared_dataset(config: CompareConfig) -> None:
    """A prepared ``dataset.dir`` must come from ``dataset.corpus`` and have ``dataset.vocab_size`` when those are
    set (a local corpus: the manifest records its resolved paths)."""
    spec = config.dataset
    manifest = read_manifest(spec.dir)
    paths = (manifest.get("corpus") or {}).get("paths")
    if spec.corpus and paths is not None and str(Path(spec.corpus).resolve()) not in paths:
        raise ValueError(
            f"dataset.dir {spec.dir} was prepared from {', '.join(paths)}, not dataset.corpus {spec.corpus}; "
            f"point dataset.dir at a new directory to prepare {spec.corpus} there, or drop dataset.corpus"
        )
    if spec.vocab_size is not None and manifest.get("vocab_size") not in (None, spec.vocab_size):
        raise ValueError(
            f"dataset.dir {spec.dir} has a vocabulary of {manifest['vocab_size']}, dataset.vocab_size says "
            f"{spec.vocab_size}; point dataset.dir at a new directory or set dataset.vocab_size={manifest['vocab_size']}"
        )


def dataset_as_used(config: CompareConfig) -> dict[str, Any]:
    """The dataset as the runs use it, from its manifest: directory, sources, tokenizer hash, vocabulary, and
    per split its tokens, documents and shard sha256s; the preparation settings only when the sweep prepared
    it (``prepared_by_sweep``), never an unused default."""
    directory = config.dataset.dir or base_recipe(config)["data"]["dir"]
    if not (Path(directory) / "manifest.json").exists():
        return {"dir": directory}  # not prepared yet: nothing is known about it
    manifest = read_manifest(directory)
    used: dict[str, Any] = {
        "dir": directory,
        "sources": [_source_name(source) for source in manifest.get("sources") or []],
        "corpus": [os.path.relpath(path) for path in (manifest.get("corpus") or {}).get("paths") or []]
        or None,
        "tokenizer_hash": manifest.get("tokenizer_hash"),
        "vocab_size": manifest.get("vocab_size"),
        "created": manifest.get("created"),
        "splits": {
            split: {
                "tokens": info.get("tokens"),
                "documents": info.get("documents"),
                "sha256": {shard["file"]: shard.get("sha256") for shard in info["shards"]},
            }
            for split, info in manifest["splits"].items()
        },
    }
    if config.dataset.corpus:
        spec = {k: v for k, v in to_dict(config.dataset).items() if v not in (None, "", False)}
        used["prepared_by_sweep"] = {k: v for k, v in spec.items() if k != "dir"}
    return used


def _source_name(source: Any) -> Any:
    """A manifest's source entry, short: a local file's name, sha256 (or, read in spans, span_sha256) and
    documents, or the hub/adopted record."""
    if isinstance(source, dict) and "file" in source and "sha256" in source:
        return {k: source[k] for k in ("file", "sha256", "span_sha256", "documents") if k in source}
    return source
