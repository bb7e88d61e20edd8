"""Fuzzing resume: checkpoints truncated, with flipped bytes, missing files, missing fields, wrong types, huge
numbers, deep nesting or non-UTF-8 text. Each variant must end in one of three outcomes, and nothing else:

- a fallback to the older, intact checkpoint, with the skipped one's error naming its damaged file;
- the project's own error (CheckpointError, or ValueError for a checkpoint of another tokenizer) naming the file;
- a correct read: the restored weights and step are exactly the checkpoint's (the damage touched nothing used).

The readers of a model (``eval``, ``export``, ``generate``: ``checkpoint.model_dir.load_model``) are given
the damage of issue 26 at the end: each refuses a damaged checkpoint directory with one line naming the file,
and given the run directory falls back to the older checkpoint, saying so.

Seeded; about 300 variants in a few seconds (the model is tiny and nothing trains)."""

from __future__ import annotations

import json
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tablefree.checkpoint import layout, training
from tablefree.checkpoint.model_dir import load_model, read_model_config
from tablefree.checkpoint.verify import file_digests
from tablefree.data.loader import Dataset, TokenLoader
from tablefree.model import build_model
from tablefree.train.checkpoints import restore
from tablefree.train.optimizer import build_optimizer
from tablefree.train.recipe import plan
from tablefree.train.resume import nothing_to_resume, verify_dataset_matches_run
from tablefree.train.trainer import train
from train_helpers import make_dataset, micro_config

FILES = ("train_state.pt", "model.safetensors", "meta.json", "config.json", "tokenizer.json", "COMPLETE")
BYTE_DAMAGE = ("truncate", "flip", "delete", "empty", "append")
SEEDS_PER_CASE = 5


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A run with two checkpoints (steps 1 and 2), the weights of step 2, and a model to restore into."""
    root = tmp_path_factory.mktemp("fuzz")
    data_dir = make_dataset(root / "data")
    config = micro_config(data_dir, budget="2 steps", checkpoint_every=1, keep_last=0)
    run_dir = root / "run"
    train(config, run_dir)
    newest = layout.latest_checkpoint(run_dir)
    model = build_model(read_model_config(newest))
    optimizer = build_optimizer(model, config)
    loader = TokenLoader.from_dir(data_dir, "train", 32, 4, seed=0)
    # the same data for `eval --tasks validation`, which needs the documents' starts (one document here)
    val_dir = root / "val-data"
    shutil.copytree(data_dir, val_dir)
    manifest = json.loads((val_dir / "manifest.json").read_text())
    manifest["splits"]["val"]["document_starts"] = [0]
    (val_dir / "manifest.json").write_text(json.dumps(manifest))
    return {
        "run_dir": run_dir,
        "data_dir": data_dir,
        "val_dir": val_dir,
        "dataset": Dataset.open(data_dir),
        "model": model,
        "optimizer": optimizer,
        "loader": loader,
        "plan": plan(config, read_model_config(newest)),
        "weights": {
            2: load_file(str(newest / "model.safetensors")),
            1: load_file(str(newest.parent / "step_00000001" / "model.safetensors")),
        },
    }


def damage_bytes(path: Path, how: str, rng: random.Random) -> None:
    data = path.read_bytes()
    if how == "truncate":
        path.write_bytes(data[: rng.randrange(len(data))])
    elif how == "flip":
        buffer = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            buffer[rng.randrange(len(buffer))] ^= 1 << rng.randrange(8)
        if buffer == bytearray(data):
            buffer[0] ^= 0xFF
        path.write_bytes(bytes(buffer))
    elif how == "delete":
        path.unlink()
    elif how == "empty":
        path.write_bytes(b"")
    else:
        path.write_bytes(data + bytes(rng.randrange(256) for _ in range(rng.randint(1, 64))))


def edit_train_state(path: Path, how: str, rng: random.Random) -> None:
    state = torch.load(path, weights_only=True)
    field = rng.choice([*training.TRAIN_STATE_FIELDS, "wall_time_s", "last_train_loss"])
    if how == "missing_field":
        state.pop(field, None)
    elif how == "wrong_type":
        state[field] = rng.choice(["seven", [1, 2], None, {"a": 1}, True, 2.5])
    elif how == "huge_number":
        state[rng.choice(["step", "tokens_seen"])] = rng.choice([-1, 10**30 // 10**12, -(10**9)])
    elif how == "bad_loader":
        state["loader"] = rng.choice(
            [{}, {"seq_len": 32}, {**state["loader"], "position": "x"}, {**state["loader"], "world_size": 0}]
        )
    elif how == "bad_rng":
        state["rng"] = rng.choice([{}, {"torch": torch.zeros(3)}, {**state["rng"], "numpy": [1, 2]}])
    else:  # bad_optimizer
        optimizer = state["optimizer"]
        choice = rng.randrange(3)
        if choice == 0:
            optimizer.pop("state", None)
        elif choice == 1:
            name = rng.choice(sorted(optimizer["state"]))
            optimizer["state"][name]["exp_avg"] = torch.zeros(3, 3)
        else:
            optimizer["param_groups"] = []
    torch.save(state, path)


def edit_weights(path: Path, how: str, rng: random.Random) -> None:
    weights = load_file(str(path))
    name = rng.choice(sorted(weights))
    if how == "drop_tensor":
        del weights[name]
    elif how == "wrong_shape":
        weights[name] = torch.zeros(*(s + 1 for s in weights[name].shape))
    elif how == "nan_tensor":
        weights[name] = weights[name].clone()
        weights[name].view(-1)[rng.randrange(weights[name].numel())] = rng.choice(
            [float("nan"), float("inf")]
        )
    else:  # extra_tensor
        weights["extra.weight"] = torch.zeros(2)
    save_file(weights, str(path), metadata={"format": "pt"})


def edit_json(path: Path, how: str, rng: random.Random) -> None:
    if how == "deep_nesting":
        path.write_text("[" * 100_000 + "]" * 100_000)
    elif how == "not_utf8":
        path.write_bytes(b'{"step": 2, "tokenizer_hash": "\xff\xfe"}')
    elif how == "wrong_top_type":
        path.write_text(rng.choice(["[]", "7", '"text"', "null"]))
    else:  # huge_integer
        path.write_text('{"step": ' + "9" * 5000 + "}")


FIELD_EDITS = (
    [
        ("train_state.pt", edit_train_state, how)
        for how in ("missing_field", "wrong_type", "huge_number", "bad_loader", "bad_rng", "bad_optimizer")
    ]
    + [
        ("model.safetensors", edit_weights, how)
        for how in ("drop_tensor", "wrong_shape", "nan_tensor", "extra_tensor")
    ]
    + [
        (name, edit_json, how)
        for name in ("meta.json", "COMPLETE")
        for how in ("deep_nesting", "not_utf8", "wrong_top_type", "huge_integer")
    ]
)


def variants():
    """(case id, seed, which checkpoints to damage, how, whether COMPLETE keeps its digests)."""
    for name in FILES:
        for how in BYTE_DAMAGE:
            for seed in range(SEEDS_PER_CASE):
                yield f"{name}-{how}-{seed}", seed, name, how, True
    for name, _, how in FIELD_EDITS:
        for seed in range(SEEDS_PER_CASE):
            # a checkpoint whose digests were recorded after the damage: the readers themselves must catch it
            yield f"{name}-{how}-{seed}-no-digests", seed, name, how, False


CASES = list(variants())


def apply(checkpoint: Path, name: str, how: str, keep_digests: bool, rng: random.Random) -> None:
    edits = {(n, h): edit for n, edit, h in FIELD_EDITS}
    if (name, how) in edits:
        edits[name, how](checkpoint / name, how, rng)
    else:
        damage_bytes(checkpoint / name, how, rng)
    if not keep_digests and name != "COMPLETE":
        record_fresh_digests(checkpoint)


def record_fresh_digests(checkpoint: Path) -> None:
    """COMPLETE rewritten with the digests of the files as they now are: damage the digests cannot see."""
    (checkpoint / "COMPLETE").write_text(json.dumps({"complete": True, "sha256": file_digests(checkpoint)}))


def resume(run: dict, run_dir: Path):
    """What ``tablefree train --resume`` does with the checkpoints, before training: the dataset check, then
    the newest checkpoint that loads."""
    if not layout.complete_checkpoints(run_dir):  # as train() does first
        raise FileNotFoundError(nothing_to_resume(run_dir))
    verify_dataset_matches_run(run_dir, run["dataset"])
    return training.load_newest(
        run_dir,
        lambda c: restore(c, run["model"], run["optimizer"], run["loader"], run["dataset"], run["plan"]),
    )


def restored_exactly(run: dict, step: int, state) -> bool:
    weights = run["weights"][step]
    current = run["model"].state_dict()
    return state.step == step and all(torch.equal(current[k], weights[k]) for k in weights)


def names_a_file(message: str, checkpoint: Path) -> bool:
    return str(checkpoint) in message and any(name in message for name in FILES)


@pytest.mark.parametrize("all_damaged", [False, True], ids=["newest-damaged", "all-damaged"])
def test_every_damaged_checkpoint_falls_back_or_is_named(pristine, tmp_path, all_damaged) -> None:
    outcomes = {"fallback": 0, "error": 0, "correct read": 0}
    correct: list[str] = []
    cases = CASES if not all_damaged else CASES[:: max(1, len(CASES) // 60)]
    for case, _seed, name, how, keep_digests in cases:
        run_dir = tmp_path / case
        shutil.copytree(pristine["run_dir"] / "checkpoints", run_dir / "checkpoints")
        rng = random.Random(f"{case}-{all_damaged}")
        damaged = layout.complete_checkpoints(run_dir)
        for checkpoint in damaged if all_damaged else damaged[-1:]:
            apply(checkpoint, name, how, keep_digests, rng)
        newest = damaged[-1]
        with torch.no_grad():  # so that a partial restore cannot pass for a correct one
            for tensor in pristine["model"].state_dict().values():
                tensor.zero_()
        try:
            found = resume(pristine, run_dir)
        except (layout.CheckpointError, ValueError) as error:
            assert names_a_file(str(error), newest), f"{case}: {error}"
            outcomes["error"] += 1
            continue
        except FileNotFoundError as error:  # every COMPLETE marker deleted: nothing left to resume
            assert "nothing to resume" in str(error) and (name, how) == ("COMPLETE", "delete"), case
            outcomes["error"] += 1
            continue
        except Exception as error:  # the point: anything else is a bug
            pytest.fail(f"{case}: raw {type(error).__name__}: {error}")
        assert found is not None, case
        checkpoint, state, skipped = found
        if checkpoint == newest:
            assert restored_exactly(pristine, 2, state), f"{case}: loaded a damaged checkpoint as good"
            outcomes["correct read"] += 1
            correct.append(case)
        else:
            # (with every checkpoint damaged, the older one's damage may have touched nothing it needs)
            assert checkpoint.name == "step_00000001", case
            assert restored_exactly(pristine, 1, state), case
            if not layout.is_complete(newest):  # no COMPLETE marker: not a checkpoint at all
                assert skipped == [] and (name, how) == ("COMPLETE", "delete"), case
            else:
                assert [c for c, _ in skipped] == [newest] and names_a_file(str(skipped[0][1]), newest), case
            outcomes["fallback"] += 1
        shutil.rmtree(run_dir)
    print(f"{len(cases)} variants: {outcomes}; read correctly: {correct}")
    assert len(cases) >= (200 if not all_damaged else 50)
    assert outcomes["fallback" if not all_damaged else "error"] > len(cases) // 2


def test_the_trainer_sets_a_damaged_checkpoint_aside_and_says_why(pristine, tmp_path, capsys) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(pristine["run_dir"], run_dir)
    (run_dir / "checkpoints" / "step_00000002" / "train_state.pt").write_bytes(b"PK\x03\x04")
    capsys.readouterr()
    summary = train(
        micro_config(pristine["data_dir"], budget="2 steps", checkpoint_every=1, keep_last=0),
        run_dir,
        resume=True,
    )
    out = capsys.readouterr().out
    assert "--resume: skipped step_00000002:" in out and "train_state.pt: damaged after it was written" in out
    assert summary["completed"] and (run_dir / "checkpoints" / "damaged-step_00000002").is_dir()
    assert layout.has_checkpoints(run_dir)


# --- the readers of a model (issue 26): eval, export and generate verify what they read ---------------------


def flip_weight_byte(checkpoint: Path) -> None:
    """One bit of the last tensor byte flipped; COMPLETE's digests left as they were (stale)."""
    path = checkpoint / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))


def edit_header(path: Path, change) -> None:
    """Rewrite a safetensors header in place (same length, padded with spaces), the tensor bytes untouched."""
    data = path.read_bytes()
    length = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + length])
    change(header)
    text = json.dumps(header, separators=(",", ":")).encode()
    assert len(text) <= length
    path.write_bytes(data[:8] + text.ljust(length) + data[8 + length :])


def swap_offsets(checkpoint: Path) -> None:
    """Two tensors of the same shape and dtype trade places in the header (digests stale)."""

    def change(header: dict) -> None:
        by_shape: dict = {}
        for name, info in header.items():
            if name != "__metadata__":
                by_shape.setdefault((info["dtype"], tuple(info["shape"])), []).append(name)
        first, second = next(names for names in by_shape.values() if len(names) >= 2)[:2]
        header[first]["data_offsets"], header[second]["data_offsets"] = (
            header[second]["data_offsets"],
            header[first]["data_offsets"],
        )

    edit_header(checkpoint / "model.safetensors", change)


def link_to_older(checkpoint: Path) -> None:
    path = checkpoint / "model.safetensors"
    path.unlink()
    path.symlink_to(Path("..") / "step_00000001" / "model.safetensors")


def drop_digests(checkpoint: Path) -> None:
    (checkpoint / "COMPLETE").write_text('{"complete": true}')


def poison(value: float):
    def damage(checkpoint: Path) -> None:
        path = checkpoint / "model.safetensors"
        weights = load_file(str(path))
        weights["head.weight"][0, 0] = value
        save_file(weights, str(path), metadata={"format": "pt"})
        record_fresh_digests(checkpoint)

    return damage


def relabel_as_i32(checkpoint: Path) -> None:
    """A float tensor's dtype changed to I32 in the header (same size), digests recorded afterwards."""

    def change(header: dict) -> None:
        header["head.weight"]["dtype"] = "I32"

    edit_header(checkpoint / "model.safetensors", change)
    record_fresh_digests(checkpoint)


def resave_f16(checkpoint: Path) -> None:
    path = checkpoint / "model.safetensors"
    weights = {k: v.half() if v.is_floating_point() else v for k, v in load_file(str(path)).items()}
    save_file(weights, str(path), metadata={"format": "pt"})
    record_fresh_digests(checkpoint)


def claim_5tb(checkpoint: Path) -> None:
    path = checkpoint / "config.json"
    config = json.loads(path.read_text())
    config["model"].update(d_model=131072, n_heads=64, n_kv_heads=64, d_ff=1310720)  # 4.7 TB of fp32 weights
    path.write_text(json.dumps(config))
    record_fresh_digests(checkpoint)


def meta_as_list(checkpoint: Path) -> None:
    (checkpoint / "meta.json").write_text("[1, 2]")
    record_fresh_digests(checkpoint)


# case -> (damage, what the one-line refusal must say); each reproduced issue 26's failure on cee322e
READER_DAMAGE = {
    "flipped-byte": (flip_weight_byte, "model.safetensors: damaged after it was written"),
    "swapped-offsets": (swap_offsets, "model.safetensors: damaged after it was written"),
    "symlink-to-older": (link_to_older, "model.safetensors (a symbolic link to"),
    "complete-without-digests": (drop_digests, "COMPLETE: records no sha256 digests"),
    "nan": (poison(float("nan")), "model.safetensors: non-finite weights (NaN or inf) in head.weight"),
    "inf": (poison(float("inf")), "model.safetensors: non-finite weights (NaN or inf) in head.weight"),
    "f32-as-i32": (relabel_as_i32, "tensor 'head.weight' is I32, but the checkpoint's model holds F32"),
    "f16-resave": (resave_f16, "is F16, but the checkpoint's model holds F32"),
    "5tb-config": (claim_5tb, "(config.json describes a model of 4,673,027,702,784 bytes of weights"),
    "meta-list": (meta_as_list, "meta.json: expected a JSON object, found a JSON list"),
}
READERS = ("eval", "export", "generate")


def read_with(reader: str, target: Path, data_dir: Path, out: Path) -> None:
    """One reader's Python API, as its CLI verb calls it."""
    from tablefree.evaluate import EvalSpec, run_eval
    from tablefree.export import export_hf
    from tablefree.generate import GenerateSpec, generate

    if reader == "eval":
        run_eval(EvalSpec(target, ["validation"], val_data=data_dir, limit=1, batch_size=1, dtype="fp32"))
    elif reader == "export":
        export_hf(target, out / "export")
    else:
        from tablefree.data.tokenizer import load_tokenizer

        model, directory = load_model(target)
        generate(
            model, load_tokenizer(directory / "tokenizer.json"), GenerateSpec("a", max_new_tokens=1, seed=0)
        )


def cli(reader: str, target: Path, data_dir: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    args = {
        "eval": ["eval", str(target), "--tasks", "validation", "--val-data", str(data_dir), "--limit", "1"],
        "export": ["export", str(target), str(out / "export-cli")],
        "generate": ["generate", str(target), "--prompt", "a", "--max-new-tokens", "1", "--seed", "0"],
    }[reader]
    command = [sys.executable, "-m", "tablefree.cli", *args, *extra]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


@pytest.fixture()
def damaged_run(pristine, tmp_path, request):
    """A copy of the run whose newest checkpoint holds the case's damage."""
    run_dir = tmp_path / "run"
    shutil.copytree(pristine["run_dir"] / "checkpoints", run_dir / "checkpoints", symlinks=True)
    damage, expected = READER_DAMAGE[request.param]
    damage(run_dir / "checkpoints" / "step_00000002")
    return run_dir, expected, sorted(READER_DAMAGE).index(request.param)


@pytest.mark.slow
@pytest.mark.parametrize("damaged_run", sorted(READER_DAMAGE), indirect=True)
def test_every_reader_refuses_a_damaged_checkpoint_and_a_run_falls_back(
    pristine, damaged_run, tmp_path, capsys
) -> None:
    run_dir, expected, index = damaged_run
    newest = run_dir / "checkpoints" / "step_00000002"
    through_cli = READERS[index % len(READERS)]  # each reader's CLI is run for some of the cases
    for reader in READERS:
        if reader == through_cli:
            result = cli(reader, newest, pristine["val_dir"], tmp_path)
            assert result.returncode == 1, (reader, result.stdout, result.stderr)
            lines = result.stderr.strip().splitlines()
            assert len(lines) == 1 and "Traceback" not in result.stderr, (reader, result.stderr)
            assert lines[0].startswith(f"tablefree {reader}: error: {newest}"), lines[0]
            assert expected in lines[0], (reader, lines[0])
            continue
        with pytest.raises(layout.CheckpointError) as refused:
            read_with(reader, newest, pristine["val_dir"], tmp_path)
        message = str(refused.value)
        assert "\n" not in message and str(newest) in message and expected in message, (reader, message)

    # given the run directory, the older checkpoint is read instead, and stderr says which was skipped
    read_with("eval", run_dir, pristine["val_dir"], tmp_path)  # (the evaluation itself works on it)
    capsys.readouterr()
    model, directory = load_model(run_dir)
    err = capsys.readouterr().err
    assert directory.name == "step_00000001"
    assert all(torch.equal(model.state_dict()[k], v) for k, v in pristine["weights"][1].items())
    assert f"tablefree: skipped step_00000002, which fails verification: {newest}" in err and expected in err
    assert f"tablefree: using {directory}, the newest checkpoint that verifies" in err


def test_no_verify_skips_the_digests_and_says_so(pristine, tmp_path, capsys) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(pristine["run_dir"] / "checkpoints", run_dir / "checkpoints")
    newest = run_dir / "checkpoints" / "step_00000002"
    drop_digests(newest)
    with pytest.raises(layout.CheckpointError, match="records no sha256 digests"):
        load_model(newest)
    capsys.readouterr()
    model, directory = load_model(newest, verify=False)
    assert directory == newest and "--no-verify" in capsys.readouterr().err
    assert all(torch.equal(model.state_dict()[k], v) for k, v in pristine["weights"][2].items())
    from tablefree.cli import main

    for argv in (
        ["generate", str(newest), "--prompt", "a", "--max-new-tokens", "1", "--seed", "0"],
        ["export", str(newest), str(tmp_path / "export")],
        [
            "eval",
            str(newest),
            "--tasks",
            "validation",
            "--val-data",
            str(pristine["val_dir"]),
            "--limit",
            "1",
        ],
    ):
        assert main(argv) == 1 and "records no sha256 digests" in capsys.readouterr().err, argv
        assert main([*argv, "--no-verify"]) == 0, argv
        assert "--no-verify" in capsys.readouterr().err, argv
    meta_as_list(newest)  # the structural checks stay on: they cost nothing and prevent tracebacks
    with pytest.raises(layout.CheckpointError, match=r"meta\.json: expected a JSON object"):
        load_model(newest, verify=False)


def test_resume_refuses_weights_resaved_in_another_dtype(pristine, tmp_path) -> None:
    """F16 weights with fresh digests must not be cast silently into the fp32 run: resume skips them."""
    run_dir = tmp_path / "run"
    shutil.copytree(pristine["run_dir"] / "checkpoints", run_dir / "checkpoints")
    newest = run_dir / "checkpoints" / "step_00000002"
    resave_f16(newest)
    checkpoint, state, skipped = resume(pristine, run_dir)
    assert checkpoint.name == "step_00000001" and restored_exactly(pristine, 1, state)
    assert [c for c, _ in skipped] == [newest]
    assert "model.safetensors: tensor" in str(skipped[0][1]) and "is F16, but" in str(skipped[0][1])


def test_import_hf_refuses_non_finite_weights(pristine, tmp_path) -> None:
    from tablefree.export import export_hf, import_hf

    exported = export_hf(pristine["run_dir"], tmp_path / "hf")
    path = exported / "model.safetensors"
    weights = load_file(str(path))
    name = sorted(k for k, v in weights.items() if v.is_floating_point())[0]
    weights[name].view(-1)[0] = float("nan")
    save_file(weights, str(path), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=re.escape(f"{path}: non-finite weights (NaN or inf) in {name}")):
        import_hf(exported, tmp_path / "imported")
