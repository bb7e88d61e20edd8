from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from tablefree.data.loader import TokenLoader, feistel_permutation
from tablefree.data.shards import open_shard, read_header, write_shard


def make_dataset(tmp_path, sizes=(1000, 777, 1500), vocab=5000):
    rng = np.random.default_rng(0)
    shards = []
    for i, size in enumerate(sizes):
        path = tmp_path / f"train_{i:06d}.bin"
        write_shard(path, rng.integers(0, vocab, size), vocab)
        shards.append({"file": path.name, "tokens": size})
    (tmp_path / "manifest.json").write_text(json.dumps({"splits": {"train": {"shards": shards}}}))
    return tmp_path


def test_shard_round_trip_and_llmc_header(tmp_path) -> None:
    tokens = np.arange(1000) % 65_536
    write_shard(tmp_path / "a.bin", tokens, 65_536)
    header = np.fromfile(tmp_path / "a.bin", dtype="<i4", count=256)
    assert header[:3].tolist() == [20240520, 1, 1000]
    assert (tmp_path / "a.bin").stat().st_size == 1024 + 2000
    assert np.array_equal(open_shard(tmp_path / "a.bin"), tokens)
    write_shard(tmp_path / "b.bin", np.array([70_000, 3]), 100_000)
    assert read_header(tmp_path / "b.bin") == (2, 2)
    assert open_shard(tmp_path / "b.bin").tolist() == [70_000, 3]


def test_truncated_shard_is_detected(tmp_path) -> None:
    write_shard(tmp_path / "a.bin", np.arange(100), 1000)
    data = (tmp_path / "a.bin").read_bytes()
    (tmp_path / "a.bin").write_bytes(data[:-10])
    with pytest.raises(ValueError, match="does not match"):
        read_header(tmp_path / "a.bin")
    (tmp_path / "c.bin").write_bytes(b"\0" * 2000)
    with pytest.raises(ValueError, match="not a token shard"):
        read_header(tmp_path / "c.bin")


@pytest.mark.parametrize("n", [1, 2, 3, 10, 97, 1000, 4097])
def test_feistel_is_a_permutation(n: int) -> None:
    out = feistel_permutation(np.arange(n), n, key=42)
    assert sorted(out.tolist()) == list(range(n))
    if n > 10:
        assert out.tolist() != list(range(n))


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("world", [1, 2, 4])
def test_ranks_get_disjoint_data_covering_the_global_batch(tmp_path, shuffle: bool, world: int) -> None:
    data = make_dataset(tmp_path)
    global_batch = 4
    single = TokenLoader.from_dir(data, "train", 16, global_batch, seed=3, shuffle=shuffle)
    loaders = [
        TokenLoader.from_dir(
            data, "train", 16, global_batch // world, seed=3, rank=r, world_size=world, shuffle=shuffle
        )
        for r in range(world)
    ]
    seen = set()
    for step in range(single.num_chunks // global_batch):
        chunks = [c for loader in loaders for c in loader.chunks(loader.slots(step)).tolist()]
        assert len(set(chunks)) == len(chunks)
        assert sorted(chunks) == sorted(single.chunks(single.slots(step)).tolist())
        assert not seen & set(chunks)
        seen |= set(chunks)


def test_batches_are_windows_with_shifted_targets_and_resume(tmp_path) -> None:
    data = make_dataset(tmp_path)
    loader = TokenLoader.from_dir(data, "train", 16, 3, seed=1)
    x, y = next(loader)
    assert x.shape == (3, 16) and x.dtype.is_floating_point is False
    assert np.array_equal(x[:, 1:].numpy(), y[:, :-1].numpy())
    batches = [next(loader) for _ in range(5)]
    resumed = TokenLoader.from_dir(data, "train", 16, 3, seed=1)
    resumed.load_state_dict(TokenLoader.from_dir(data, "train", 16, 3, seed=1).state_dict() | {"position": 1})
    for x_expected, _ in batches:
        assert np.array_equal(next(resumed)[0].numpy(), x_expected.numpy())


def test_resume_across_world_sizes(tmp_path) -> None:
    data = make_dataset(tmp_path)
    two = TokenLoader.from_dir(data, "train", 16, 2, seed=1, rank=0, world_size=2)
    two.position = 3
    one = TokenLoader.from_dir(data, "train", 16, 4, seed=1)
    one.load_state_dict(two.state_dict())
    assert one.position == 3
    with pytest.raises(ValueError, match="seed"):
        TokenLoader.from_dir(data, "train", 16, 4, seed=2).load_state_dict(two.state_dict())


def test_missing_manifest_says_how_to_prepare(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="tablefree data prepare"):
        TokenLoader.from_dir(tmp_path, "train", 16, 2)


def test_loader_checks_shard_sizes_against_the_manifest(tmp_path) -> None:
    data = make_dataset(tmp_path)
    manifest = json.loads((data / "manifest.json").read_text())
    manifest["splits"]["train"]["shards"][1]["tokens"] = 700  # a shard that is not the one recorded
    (data / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=r"train_000001\.bin: holds 777 tokens, .*manifest\.json says 700"):
        TokenLoader.from_dir(data, "train", seq_len=16, batch_size=2)
    (data / "train_000001.bin").unlink()
    with pytest.raises(FileNotFoundError, match=r"train_000001\.bin: shard listed in .* is missing"):
        TokenLoader.from_dir(data, "train", seq_len=16, batch_size=2)


def test_verify_dataset_finds_overwritten_tokens_and_the_verb_exits_1(tmp_path, capsys) -> None:
    from tablefree.cli import main
    from tablefree.data.loader import verify_dataset
    from tablefree.fileio import sha256_file

    data = make_dataset(tmp_path)
    manifest = json.loads((data / "manifest.json").read_text())
    manifest["vocab_size"] = 5000
    for shard in manifest["splits"]["train"]["shards"]:
        shard["sha256"] = sha256_file(data / shard["file"])
    (data / "manifest.json").write_text(json.dumps(manifest))
    assert verify_dataset(data).ok and main(["data", "verify", str(data)]) == 0
    assert "3 shards, 3,277 tokens" in capsys.readouterr().out
    # 2% of one shard's tokens overwritten in place: same size, so only the hash can tell.
    path = data / "train_000002.bin"
    raw = bytearray(path.read_bytes())
    raw[1024 : 1024 + 60] = bytes(60)
    path.write_bytes(bytes(raw))
    assert verify_dataset(data, hashes=False).ok
    check = verify_dataset(data, hashes="auto")  # small: hashed
    assert check.hashed and check.problems == [
        f"train: {path} does not match the sha256 in the manifest (damaged or replaced)"
    ]
    assert main(["data", "verify", str(data)]) == 1
    assert "1 problem(s)" in capsys.readouterr().out
    path.write_bytes(bytes(raw[:-4]))  # truncated
    assert "size" in verify_dataset(data, hashes=False).problems[0]


def test_malformed_manifest_names_the_file_and_line_or_field(tmp_path) -> None:
    from tablefree.data.loader import read_manifest

    data = make_dataset(tmp_path)
    good = (data / "manifest.json").read_text()
    (data / "manifest.json").write_text(good[: len(good) // 2])
    with pytest.raises(ValueError, match=r"manifest\.json: malformed JSON \(.* at line 1\)"):
        read_manifest(data)
    bad = json.loads(good)
    bad["splits"]["train"]["shards"][0]["tokens"] = "1000"
    (data / "manifest.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=r"manifest\.json: field 'splits\.train\.shards\[0\]\.tokens'"):
        read_manifest(data)
    bad["splits"]["train"]["shards"][0] = {"file": "../../etc/passwd", "tokens": 3}
    (data / "manifest.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=r"field 'splits\.train\.shards\[0\]\.file'"):
        read_manifest(data)


def test_a_raw_corpus_as_data_dir_suggests_another_output_directory(tmp_path, monkeypatch) -> None:
    """Issue 15: the hint used to say `data prepare … --out` the corpus directory itself."""
    from tablefree.data.loader import read_manifest

    corpus = tmp_path / "books"
    corpus.mkdir()
    (corpus / "a.txt").write_text("text\n")
    with pytest.raises(FileNotFoundError) as error:
        read_manifest(corpus)
    message = str(error.value)
    assert f"tablefree data prepare {corpus} --out data/books`" in message
    assert "point data.dir at data/books" in message
    monkeypatch.chdir(tmp_path)  # a corpus that is itself at data/books: another name
    (tmp_path / "data").mkdir()
    shutil.copytree(corpus, tmp_path / "data" / "books")
    with pytest.raises(FileNotFoundError, match=r"--out data/books-prepared`"):
        read_manifest("data/books")
    with pytest.raises(FileNotFoundError, match=r"run `tablefree data prepare CORPUS --out"):
        read_manifest(tmp_path / "empty")
