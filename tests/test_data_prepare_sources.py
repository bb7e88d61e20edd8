"""Issue 41: sources as users hold them (a `datasets` save_to_disk folder, parquet with a chosen column, jsonl,
.gz, .zst) prepare directly and split into parts that merge to the single run byte for byte; the keyed-hash rule
keeps nothing per document; datasets prepared with the seeded plan keep their rule named."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from tablefree.data.corpus import Corpus, CorpusError
from tablefree.data.documents import KEYED_HASH_RULE, split_rule_name
from tablefree.data.prepare import prepare_dataset
from tablefree.data.tokenizer import train_tokenizer_from_texts


def texts(count: int, words: int = 60) -> list[str]:
    return [
        " ".join(f"word{(i * 7 + j) % 97} of text {i}" for j in range(words)) + "\n" for i in range(count)
    ]


SETTINGS = dict(
    split_rule="keyed-hash",
    val_fraction=0.1,
    shard_tokens=5_000,
    workers=1,
    progress=False,
    val_max_tokens=2_000,
)


def merged_equals_single(
    corpus: Path | list[Path], tokenizer: Path, tmp_path: Path, parts: int, **options
) -> dict:
    single = prepare_dataset(corpus, tmp_path / "single", tokenizer=tokenizer, **SETTINGS, **options)
    for i in range(1, parts + 1):
        prepare_dataset(
            corpus, tmp_path / "merged", tokenizer=tokenizer, part=(i, parts), **SETTINGS, **options
        )
    merged = prepare_dataset(
        corpus, tmp_path / "merged", tokenizer=tokenizer, merge=True, **SETTINGS, **options
    )
    for name in [p.name for p in (tmp_path / "single").iterdir()]:
        if name != "manifest.json":
            assert (tmp_path / "merged" / name).read_bytes() == (tmp_path / "single" / name).read_bytes(), (
                name
            )
    single.pop("created"), merged.pop("created")
    assert merged == single
    return single


def test_a_save_to_disk_folder_prepares_directly_and_splits_into_parts(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    documents = texts(120)
    folder = tmp_path / "saved"
    datasets.Dataset.from_dict({"id": list(range(120)), "text": documents}).save_to_disk(folder, num_shards=3)
    reader = Corpus(folder)
    summary = reader.scan()
    assert [f.file for f in summary.files] == [f"data-0000{i}-of-00003.arrow" for i in range(3)]
    assert summary.junk == []  # dataset_info.json and state.json are the folder's metadata, not junk
    assert list(reader.documents()) == documents
    tokenizer = tmp_path / "tokenizer.json"
    train_tokenizer_from_texts(documents, 300, tokenizer)
    manifest = merged_equals_single(folder, tokenizer, tmp_path, parts=3)
    assert manifest["corpus"]["documents"] == 120 and manifest["validation"]["documents"] >= 1


def test_a_dataset_dict_folder_is_refused_naming_its_splits(tmp_path: Path) -> None:
    """Read whole, a DatasetDict's save_to_disk folder was one corpus: its test split went into training."""
    datasets = pytest.importorskip("datasets")
    folder = tmp_path / "saved"
    split = {
        name: datasets.Dataset.from_dict({"text": [f"{name} text {i}" for i in range(4)]})
        for name in ("train", "test")
    }
    datasets.DatasetDict(split).save_to_disk(folder)
    for corpus in (folder, tmp_path):  # the folder itself, or a directory holding it
        with pytest.raises(CorpusError) as refused:
            Corpus(corpus)
        message = str(refused.value)
        assert message.startswith(
            f"{folder}: a `datasets` DatasetDict folder (dataset_dict.json) holding the splits"
        )
        assert "test, train" in message and f"give the split wanted, e.g. {folder / 'train'}" in message
    with pytest.raises(CorpusError, match="DatasetDict folder"):
        prepare_dataset(folder, tmp_path / "out", vocab_size=300, **SETTINGS)
    assert list(Corpus(folder / "train").documents()) == [f"train text {i}" for i in range(4)]


def test_a_dataset_folder_without_the_text_column_names_the_columns_it_has(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    folder = tmp_path / "saved"
    datasets.Dataset.from_dict({"id": [1, 2], "content": ["a b c", "d e f"]}).save_to_disk(folder)
    with pytest.raises(
        CorpusError, match=r"no column 'text' \(its columns: 'id', 'content'; choose one with --text-field"
    ):
        prepare_dataset(folder, tmp_path / "out", vocab_size=300, **{**SETTINGS, "split_rule": "plan"})
    assert list(Corpus(folder, text_field="content").documents()) == ["a b c", "d e f"]


def test_parquet_with_a_chosen_column_jsonl_gz_and_zst_merge_to_the_single_run(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    zstandard = pytest.importorskip("zstandard")
    documents = texts(200)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    pq.write_table(
        pa.table({"url": ["u"] * 80, "body": documents[:80]}), corpus / "a.parquet", row_group_size=20
    )
    lines = [json.dumps({"body": text}) + "\n" for text in documents[80:]]
    (corpus / "b.jsonl.gz").write_bytes(gzip.compress("".join(lines[:60]).encode()))
    (corpus / "c.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress("".join(lines[60:]).encode()))
    tokenizer = tmp_path / "tokenizer.json"
    train_tokenizer_from_texts(documents, 300, tokenizer)
    manifest = merged_equals_single(corpus, tokenizer, tmp_path, parts=3, text_field="body")
    assert [s["file"] for s in manifest["sources"]] == ["a.parquet", "b.jsonl.gz", "c.jsonl.zst"]
    assert manifest["corpus"]["documents"] == 200


def test_the_keyed_hash_rule_keeps_nothing_per_document_and_is_named(tmp_path: Path) -> None:
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts(300)), encoding="utf-8")
    reader = Corpus(corpus, lengths=False)
    reader.scan()
    assert reader.document_chars == []  # the plan's per-document lengths are not kept
    manifest = prepare_dataset(corpus, tmp_path / "hash", vocab_size=300, **SETTINGS)
    assert split_rule_name(manifest["settings"]) == KEYED_HASH_RULE == manifest["settings"]["split_rule"]
    record = manifest["validation"]
    assert record["rule"].startswith("keyed-hash: ") and record["max_tokens"] == 2_000
    # the cap: the documents that started after val held 2,000 tokens are left out, and counted
    assert record["tokens"] - record["items"][-1]["tokens"] < 2_000 <= record["tokens"]
    assert record["dropped_documents"] > 0
    assert manifest["splits"]["train"]["documents"] + record["documents"] + record["dropped_documents"] == 300
    plan = prepare_dataset(corpus, tmp_path / "plan", vocab_size=300, **{**SETTINGS, "split_rule": "plan"})
    assert plan["settings"]["split_rule"].startswith("documents: ")  # as every dataset prepared before
    assert split_rule_name(plan["settings"]) == "plan"
    assert "val_max_tokens" not in plan["settings"]  # the plan's settings (and fingerprints) are unchanged


def test_a_large_plan_run_is_told_of_the_keyed_hash_rule(
    capsys, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tablefree.data import prepare

    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts(60)), encoding="utf-8")
    settings = {**SETTINGS, "split_rule": "plan", "vocab_size": 300}
    prepare_dataset(corpus, tmp_path / "small", **settings)
    assert "note:" not in capsys.readouterr().err
    monkeypatch.setattr(prepare, "PLAN_NOTE_DOCUMENTS", 59)  # 60 documents: a large corpus, here
    prepare_dataset(corpus, tmp_path / "large", **settings)
    assert (
        "note: 60 documents: for a corpus this large pass --split-rule keyed-hash" in capsys.readouterr().err
    )
    prepare_dataset(corpus, tmp_path / "keyed", **{**settings, "split_rule": "keyed-hash"})
    assert "note:" not in capsys.readouterr().err


def test_verify_names_the_split_rule_of_new_and_old_manifests(capsys, tmp_path: Path) -> None:
    """A plan dataset records only a description of its plan in settings.split_rule (as every dataset before the
    keyed hash did, fingerprints unchanged): `data verify` names the rule all the same."""
    from tablefree.cli import main

    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts(60)), encoding="utf-8")
    common = ["--vocab-size", "300", "--workers", "1", "--no-progress"]
    for rule in ("plan", "keyed-hash"):
        assert (
            main(
                ["data", "prepare", str(corpus), "--out", str(tmp_path / rule), "--split-rule", rule, *common]
            )
            == 0
        )
        assert f"\nsplit rule: {rule}\n" in capsys.readouterr().out
        assert main(["data", "verify", str(tmp_path / rule)]) == 0
        assert f"MB, split rule {rule}; checked sizes, headers" in capsys.readouterr().out
    manifest_path = tmp_path / "plan" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    assert manifest["settings"]["split_rule"].startswith("documents: ")  # the old form
    for settings, named in (
        (
            {**manifest["settings"], "split_rule": "hash: blake2b(seed:index) / 2^64 < val_fraction"},
            ", split rule hub-index-hash;",
        ),
        (None, " MB; checked"),  # adopted shards record no rule, and none is named
    ):
        manifest_path.write_text(json.dumps({**manifest, "settings": settings}))
        assert main(["data", "verify", str(tmp_path / "plan")]) == 0
        assert named in capsys.readouterr().out


def test_the_cli_prepares_parts_merges_them_and_says_what_it_cannot_split(capsys, tmp_path: Path) -> None:
    from tablefree.cli import main

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for k in range(3):
        lines = (json.dumps({"text": text}) + "\n" for text in texts(40)[k::3])
        (corpus / f"{k}.jsonl").write_text("".join(lines), encoding="utf-8")
    tokenizer = tmp_path / "tokenizer.json"
    train_tokenizer_from_texts(texts(40), 300, tokenizer)
    common = ["--out", str(tmp_path / "d"), "--tokenizer", str(tokenizer), "--workers", "1", "--no-progress"]
    keyed = [*common, "--split-rule", "keyed-hash", "--val-fraction", "0.3", "--val-max-tokens", "700"]
    assert main(["data", "prepare", str(corpus), *keyed, "--part", "1/4"]) != 0
    assert "4 parts, but the corpus splits into 3 pieces (3 files: " in (error := capsys.readouterr().err)
    assert "): it allows at most 3 parts" in error
    assert main(["data", "prepare", str(corpus), *common, "--part", "1/2"]) != 0
    assert "part 1/2: parts need --split-rule keyed-hash" in capsys.readouterr().err
    for i in (1, 2):
        assert main(["data", "prepare", str(corpus), *keyed, "--part", f"{i}/2"]) == 0
    assert main(["data", "merge", str(corpus), *keyed]) == 0
    out = capsys.readouterr().out
    manifest = json.loads((tmp_path / "d" / "manifest.json").read_text())
    dropped = manifest["validation"]["dropped_documents"]
    assert dropped > 0
    assert f"the validation cap (--val-max-tokens 700) left out {dropped} more validation documents" in out


@pytest.mark.parametrize("crash_after", [1, 2, 3])
def test_an_interrupted_keyed_hash_run_resumes_to_the_same_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, crash_after: int
) -> None:
    """The journal keeps the val records and the cap's count: a resumed run, killed before, at or after the cap,
    gives the uninterrupted run's dataset byte for byte."""
    from tablefree.data.writer import SplitWriter

    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts(300)), encoding="utf-8")
    settings = {**SETTINGS, "vocab_size": 300, "shard_tokens": 700}
    complete = prepare_dataset(corpus, tmp_path / "complete", **settings)
    assert complete["validation"]["dropped_documents"] > 0 and len(complete["splits"]["val"]["shards"]) >= 3
    original, written = SplitWriter._write, []

    def crash(self, on_shard):  # killed when val has written crash_after shards: before, at and after the cap
        if self.split == "val" and len(written) >= crash_after:
            raise KeyboardInterrupt
        if self.split == "val":
            written.append(self.fill)
        original(self, on_shard)

    monkeypatch.setattr(SplitWriter, "_write", crash)
    with pytest.raises(KeyboardInterrupt):
        prepare_dataset(corpus, tmp_path / "resumed", **settings)
    monkeypatch.setattr(SplitWriter, "_write", original)
    resumed = prepare_dataset(corpus, tmp_path / "resumed", **settings)
    for path in (tmp_path / "complete").iterdir():
        if path.name != "manifest.json":
            assert (tmp_path / "resumed" / path.name).read_bytes() == path.read_bytes(), path.name
    complete.pop("created"), resumed.pop("created")
    assert resumed == complete


def test_a_compare_configs_dataset_block_selects_the_rule_and_the_cap(tmp_path: Path) -> None:
    """The `dataset:` block is parsed into the same PrepareSpec the CLI builds (split_rule, val_max_tokens)."""
    import yaml

    from tablefree.compare import load_compare_config
    from tablefree.sweep.dataset import prepare_data

    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts(300)), encoding="utf-8")
    dataset = {"dir": str(tmp_path / "data"), "corpus": str(corpus), "vocab_size": 300, "val_fraction": 0.1}
    dataset |= {"split_rule": "keyed-hash", "val_max_tokens": 2_000, "workers": 1}
    config = {
        "train_config": str(Path(__file__).parents[1] / "configs" / "tiny.yaml"),
        "dataset": dataset,
        "interfaces": ["learned", "canonical"],
        "seeds": [0],
        "out": str(tmp_path / "sweep"),
    }
    (tmp_path / "compare.yaml").write_text(yaml.safe_dump(config))
    prepare_data(load_compare_config(tmp_path / "compare.yaml"), log=lambda line: None)
    manifest = json.loads((tmp_path / "data" / "manifest.json").read_text())
    assert (
        manifest["settings"]["split_rule"] == "keyed-hash" and manifest["settings"]["val_max_tokens"] == 2_000
    )
    assert manifest["validation"]["dropped_documents"] > 0
    (tmp_path / "compare.yaml").write_text(
        yaml.safe_dump({**config, "dataset": {**dataset, "split_rule": "x"}})
    )
    with pytest.raises(ValueError, match=r"dataset: split_rule: expected one of keyed-hash, plan, got 'x'"):
        load_compare_config(tmp_path / "compare.yaml")
