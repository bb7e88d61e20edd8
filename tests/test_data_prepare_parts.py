"""`data prepare --part I/N` + `data merge` give the dataset a single `data prepare` gives, byte for byte, on
the first source of the embedded default corpus (the language reference topics) split into files."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tablefree.data.parts import LOCK_FILE
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


# Sections of 2,000 characters: the longer topics lend one, the others go to val whole or not at all.
SETTINGS = dict(
    split_rule="keyed-hash",
    val_fraction=0.1,
    val_documents=5,
    val_section_chars=2_000,
    shard_tokens=20_000,
    workers=1,
    progress=False,
)


def dataset_files(directory: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(directory.iterdir()) if path.is_file()}


def opened_files(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the corpus files opened from now on (every read of a corpus file goes through open_regular)."""
    from tablefree.data import corpus, decoding, sources

    opened: list[str] = []

    def recording(path: Path):
        opened.append(Path(path).name)
        return sources.open_regular(path)

    monkeypatch.setattr(corpus, "open_regular", recording)
    monkeypatch.setattr(decoding, "open_regular", recording)
    return opened


@pytest.mark.parametrize("cap", [10_000_000, 3_000])
def test_parts_merge_to_the_single_run_byte_for_byte(
    corpus: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cap: int
) -> None:
    """Issue 41: each part reads only its own files; the merge reads none; merged = single, byte for byte, with
    validation documents whole and in sections, and with the cap leaving some out (cap 3,000 tokens)."""
    files, tokenizer = corpus
    settings = {**SETTINGS, "val_max_tokens": cap}
    single = prepare_dataset(files, tmp_path / "single", tokenizer=tokenizer, **settings)
    assert len(single["splits"]["train"]["shards"]) >= 3  # shards that cross the parts' boundaries
    validation = single["validation"]
    assert validation["sections"] >= 1 and validation["documents"] - validation["sections"] >= 1
    assert (validation["dropped_documents"] > 0) == (cap == 3_000)
    assert single["settings"]["split_rule"] == "keyed-hash"
    merged_dir = tmp_path / "merged"
    opened = opened_files(monkeypatch)
    records = []
    for i in (3, 1, 2):
        opened.clear()
        records.append(prepare_dataset(files, merged_dir, tokenizer=tokenizer, part=(i, 3), **settings))
        assert sorted(set(opened)) == sorted(info["file"] for info in records[-1]["pieces"])  # its own only
    names = [[info["file"] for info in r["pieces"]] for r in records]
    assert sorted(map(len, names)) == [1, 1, 2]  # disjoint groups of files, all of them
    assert sorted(name for group in names for name in group) == sorted(p.name for p in files.glob("*.jsonl"))
    opened.clear()
    merged = prepare_dataset(files, merged_dir, tokenizer=tokenizer, merge=True, **settings)
    assert opened == []  # the merge reads no corpus file
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
        ValueError, match=r"1-of-2/part.json: part 1/2 field settings.seed: the part's 0, this merge's 1; "
    ):
        prepare_dataset(files, out, tokenizer=tokenizer, merge=True, **{**SETTINGS, "seed": 1})
    assert sorted(p.name for p in out.iterdir()) == [PARTS_DIR]  # a refused merge writes nothing
    prepare_dataset(files, out, tokenizer=tokenizer, merge=True, **SETTINGS)
    with pytest.raises(ValueError, match=r"the dataset is complete already"):
        prepare_dataset(files, out, tokenizer=tokenizer, part=(1, 2), **SETTINGS)
    out = tmp_path / "other"
    with pytest.raises(ValueError, match=r"give the tokenizer \(--tokenizer\)"):
        prepare_dataset(files, out, part=(2, 2), **SETTINGS)
    with pytest.raises(
        ValueError,
        match=r"5 parts, but the corpus splits into 4 pieces \(4 files: .*\): it allows at most 4 parts",
    ):
        prepare_dataset(files, out, tokenizer=tokenizer, part=(1, 5), **SETTINGS)
    with pytest.raises(ValueError, match=r"part 1/2: parts need --split-rule keyed-hash .*'plan' rule plans"):
        prepare_dataset(files, out, tokenizer=tokenizer, part=(1, 2), **{**SETTINGS, "split_rule": "plan"})


def test_every_merge_mismatch_names_the_part_the_field_and_both_values(
    corpus: tuple[Path, Path], tmp_path: Path
) -> None:
    """Issue 35: every mismatch gave one generic line. Each names the part, the field and both values."""
    files, tokenizer = corpus
    out = tmp_path / "out"
    for i in (1, 2):
        prepare_dataset(files, out, tokenizer=tokenizer, part=(i, 2), **SETTINGS)
    where = r"parts/1-of-2/part\.json: part 1/2 field "
    cases = [
        ({"shard_tokens": 30_000}, r"settings\.shard_tokens: the part's 20000, this merge's 30000"),
        ({"val_documents": 6}, r"settings\.val_documents: the part's 5, this merge's 6"),
        ({"gutenberg": True}, r"settings\.gutenberg: the part's False, this merge's True"),
    ]
    for change, field in cases:
        with pytest.raises(ValueError, match=where + field):
            prepare_dataset(files, out, tokenizer=tokenizer, merge=True, **{**SETTINGS, **change})
    other = tmp_path / "other-tokenizer.json"
    train_tokenizer_from_texts(["another corpus, another tokenizer"] * 50, 300, other)
    with pytest.raises(ValueError, match=where + r"tokenizer_hash: the part's [0-9a-f]{16}…, this merge's "):
        prepare_dataset(files, out, tokenizer=other, merge=True, **SETTINGS)
    changed = tmp_path / "changed"
    shutil.copytree(files, changed)
    with open(changed / "3.jsonl", "a", encoding="utf-8") as handle:
        handle.write(json.dumps({"text": "one more document"}) + "\n")
    with pytest.raises(
        ValueError,
        match=r"2-of-2/part\.json: part 2/2 field pieces\[0\]: the part read 3\.jsonl of ([\d,]+) bytes \(spans "
        r"0-1 of 1\), this merge's corpus gives it 3\.jsonl of (?!\1)[\d,]+ bytes \(spans 0-1 of 1\) \(another "
        r"corpus, or files changed since\); ",
    ):
        prepare_dataset(changed, out, tokenizer=tokenizer, merge=True, **SETTINGS)
    assert sorted(p.name for p in out.iterdir()) == [PARTS_DIR]  # each refused merge wrote nothing


@pytest.mark.parametrize(
    "damage, message",
    [
        (
            "flip",
            r"2-of-2/train\.tokens: part 2/2 field splits\.train\.sha256: the file's is [0-9a-f]{16}…, ",
        ),
        ("truncate", r"2-of-2/val\.tokens: part 2/2 field splits\.val\.tokens: the file holds \d+ bytes, "),
        ("delete", r"2-of-2/train\.tokens: part 2/2's train tokens are missing"),
        ("record", r"2-of-2/part\.json: field 'splits\.val\.starts' must be a list; the part is damaged"),
        ("items", r"2-of-2/part\.json: field 'splits\.val\.items' must give one record per document; "),
        ("count", r"2-of-2/part\.json: field 'splits\.train\.tokens' must be a count .*, not -1; "),
    ],
)
def test_a_damaged_part_is_refused_before_the_merge_writes_anything(
    corpus: tuple[Path, Path], tmp_path: Path, damage: str, message: str
) -> None:
    """Issue 35: a damaged part made `data merge` write tokenizer.json before refusing. Every part is checked
    first: a refusal leaves the directory as it was, and the part prepared again merges."""
    files, tokenizer = corpus
    out = tmp_path / "out"
    for i in (1, 2):
        prepare_dataset(files, out, tokenizer=tokenizer, part=(i, 2), **SETTINGS)
    part = out / PARTS_DIR / "2-of-2"
    if damage == "flip":
        data = bytearray((part / "train.tokens").read_bytes())
        data[10] ^= 1
        (part / "train.tokens").write_bytes(bytes(data))
    elif damage == "truncate":
        (part / "val.tokens").write_bytes((part / "val.tokens").read_bytes()[:-2])
    elif damage == "delete":
        (part / "train.tokens").unlink()
    else:
        record = json.loads((part / "part.json").read_text())
        if damage == "record":
            record["splits"]["val"]["starts"] = "0"
        elif damage == "items":
            record["splits"]["val"]["items"].append({"file": "2.jsonl"})
        else:
            record["splits"]["train"]["tokens"] = -1
        (part / "part.json").write_text(json.dumps(record))
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    with pytest.raises(ValueError, match=message):
        prepare_dataset(files, out, tokenizer=tokenizer, merge=True, **SETTINGS)
    assert (
        sorted(p.relative_to(out) for p in out.rglob("*")) == before
    )  # no tokenizer.json, no shard, no journal
    prepare_dataset(files, out, tokenizer=tokenizer, part=(2, 2), **SETTINGS)
    merged = prepare_dataset(files, out, tokenizer=tokenizer, merge=True, **SETTINGS)
    single = prepare_dataset(files, tmp_path / "single", tokenizer=tokenizer, **SETTINGS)
    merged.pop("created"), single.pop("created")
    assert merged == single


_HOLD_LOCK = """
import fcntl, os, sys, time
handle = open(sys.argv[1], "a+")
fcntl.flock(handle, fcntl.LOCK_EX)
handle.seek(0)
handle.truncate()
handle.write(f"{os.getpid()}\\n")
handle.flush()
print("holding", flush=True)
time.sleep(120)
"""


def test_two_processes_preparing_one_part_the_second_is_refused_naming_it(
    corpus: tuple[Path, Path], tmp_path: Path
) -> None:
    """Issue 35: two processes preparing the same --part at once ended in a raw file-not-found. The part is
    locked while it is prepared (an flock: released when its process exits, however it exits); a second process
    is refused in one line naming the part, the holder and the way out, and touches nothing of the part."""
    files, tokenizer = corpus
    out = tmp_path / "out"
    first = prepare_dataset(files, out, tokenizer=tokenizer, part=(1, 2), **SETTINGS)
    part = out / PARTS_DIR / "1-of-2"
    finished = {p.name: p.read_bytes() for p in part.iterdir() if p.name != LOCK_FILE}
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_LOCK, str(part / LOCK_FILE)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline() == "holding\n"
        with pytest.raises(
            ValueError,
            match=rf"1-of-2: part 1/2 is being prepared by another process now \(pid {holder.pid}; lock .*\.lock\); "
            r"wait for it to finish, or stop it and run `data prepare --part 1/2` again",
        ):
            prepare_dataset(files, out, tokenizer=tokenizer, part=(1, 2), **SETTINGS)
        # the refused process wrote nothing
        assert {p.name: p.read_bytes() for p in part.iterdir() if p.name != LOCK_FILE} == finished
    finally:
        holder.kill()
        holder.wait()
    again = prepare_dataset(files, out, tokenizer=tokenizer, part=(1, 2), **SETTINGS)  # no stale lock
    assert again == first


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
