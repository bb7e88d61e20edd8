"""`data prepare --part I/N` + `data merge` give the dataset a single `data prepare` gives, byte for byte, on
the first source of the embedded default corpus (the language reference topics) split into files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tablefree.data.prepare import PARTS_DIR, prepare_dataset
from tablefree.data.tokenizer import train_tokenizer_from_texts


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Four JSONL files of unequal size, and a 512-token BPE trained on them."""
    from pydoc_data.topics import topics

    root = tmp_path_factory.mktemp("parts")
    names = sorted(topics)
    groups = [names[:10], names[10:40], names[40:45], names[45:]]
    directory = root / "corpus"
    directory.mkdir()
    for number, group in enumerate(groups):
        lines = "".join(json.dumps({"text": topics[name]}) + "\n" for name in group)
        (directory / f"{number}.jsonl").write_text(lines, encoding="utf-8")
    tokenizer = root / "tokenizer.json"
    train_tokenizer_from_texts((topics[name] for name in names), 512, tokenizer)
    return directory, tokenizer


SETTINGS = dict(val_fraction=0.1, val_documents=5, shard_tokens=20_000, workers=1, progress=False)


def dataset_files(directory: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(directory.iterdir()) if path.is_file()}


def test_parts_merge_to_the_single_run_byte_for_byte(corpus: tuple[Path, Path], tmp_path: Path) -> None:
    files, tokenizer = corpus
    single = prepare_dataset(files, tmp_path / "single", tokenizer=tokenizer, **SETTINGS)
    assert len(single["splits"]["train"]["shards"]) >= 3  # shards that cross the parts' boundaries
    merged_dir = tmp_path / "merged"
    records = [
        prepare_dataset(files, merged_dir, tokenizer=tokenizer, part=(i, 3), **SETTINGS) for i in (3, 1, 2)
    ]
    assert sorted(len(r["files"]) for r in records) == [1, 1, 2]  # disjoint groups of files, all of them
    assert sorted(f for r in records for f in r["files"]) == sorted(p.name for p in files.glob("*.jsonl"))
    merged = prepare_dataset(files, merged_dir, tokenizer=tokenizer, merge=True, **SETTINGS)
    assert not (merged_dir / PARTS_DIR).exists()
    expected, got = dataset_files(tmp_path / "single"), dataset_files(merged_dir)
    assert sorted(got) == sorted(expected)
    for name in expected:
        if name != "manifest.json":
            assert got[name] == expected[name], name
    single.pop("created"), merged.pop("created")
    assert merged == single  # shards, hashes, validation starts and items, counts, settings
    written = json.loads(got["manifest.json"])
    written.pop("created")
    assert written == single


def test_merge_refuses_missing_or_foreign_parts(corpus: tuple[Path, Path], tmp_path: Path) -> None:
    files, tokenizer = corpus
    out = tmp_path / "out"
    prepare_dataset(files, out, tokenizer=tokenizer, part=(1, 2), **SETTINGS)
    with pytest.raises(ValueError, match=r"parts of 2 expected, missing \[2\]"):
        prepare_dataset(files, out, tokenizer=tokenizer, merge=True, **SETTINGS)
    prepare_dataset(files, out, tokenizer=tokenizer, part=(2, 2), **SETTINGS)
    with pytest.raises(
        ValueError, match=r"1-of-2/part.json: prepared from other inputs, settings or tokenizer"
    ):
        prepare_dataset(files, out, tokenizer=tokenizer, merge=True, **{**SETTINGS, "seed": 1})
    assert sorted(p.name for p in out.iterdir()) == [PARTS_DIR]  # a refused merge writes nothing
    prepare_dataset(files, out, tokenizer=tokenizer, merge=True, **SETTINGS)
    with pytest.raises(ValueError, match=r"the dataset is complete already"):
        prepare_dataset(files, out, tokenizer=tokenizer, part=(1, 2), **SETTINGS)
    out = tmp_path / "other"
    with pytest.raises(ValueError, match=r"give the tokenizer \(--tokenizer\)"):
        prepare_dataset(files, out, part=(2, 2), **SETTINGS)
    with pytest.raises(ValueError, match=r"5 parts, but the corpus has only 4 files"):
        prepare_dataset(files, out, tokenizer=tokenizer, part=(1, 5), **SETTINGS)


@pytest.mark.slow
def test_parts_run_as_an_array_through_the_launcher(corpus: tuple[Path, Path], tmp_path: Path) -> None:
    """The parts as array tasks (submitit's local executor: the same calls a SLURM array makes), then merged."""
    import functools
    import time

    from tablefree import launch

    files, tokenizer = corpus
    out = tmp_path / "array"
    tasks = {
        f"part-{i}": functools.partial(
            prepare_dataset, files, out, tokenizer=tokenizer, part=(i, 2), **SETTINGS
        )
        for i in (1, 2)
    }
    launch.submit(
        launch.SlurmSpec(executor="local"), tmp_path / "jobs", "prepare", tasks, log=lambda *_: None
    )
    deadline = time.monotonic() + 120
    while len(list((out / PARTS_DIR).glob("*/part.json"))) < 2:
        assert time.monotonic() < deadline, "the array's parts did not finish"
        time.sleep(0.1)
    merged = prepare_dataset(files, out, tokenizer=tokenizer, merge=True, **SETTINGS)
    single = prepare_dataset(files, tmp_path / "single", tokenizer=tokenizer, **SETTINGS)
    merged.pop("created"), single.pop("created")
    assert merged == single
