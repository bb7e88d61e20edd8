"""Fuzzing resume: checkpoints truncated, with flipped bytes, missing files, missing fields, wrong types, huge
numbers, deep nesting or non-UTF-8 text. Each variant must end in one of three outcomes, and nothing else:

- a fallback to the older, intact checkpoint, with the skipped one's error naming its damaged file;
- the project's own error (CheckpointError, or ValueError for a checkpoint of another tokenizer) naming the file;
- a correct read: the restored weights and step are exactly the checkpoint's (the damage touched nothing used).

Seeded; about 300 variants in a few seconds (the model is tiny and nothing trains)."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tablefree.checkpoint import layout, training
from tablefree.checkpoint.model_dir import read_model_config
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
    return {
        "run_dir": run_dir,
        "data_dir": data_dir,
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
            # a checkpoint whose digests were recorded after the damage (or that has none, as older versions
            # wrote): the readers themselves must catch it
            yield f"{name}-{how}-{seed}-no-digests", seed, name, how, False


CASES = list(variants())


def apply(checkpoint: Path, name: str, how: str, keep_digests: bool, rng: random.Random) -> None:
    if not keep_digests:
        (checkpoint / "COMPLETE").write_text('{"complete": true}')
    edits = {(n, h): edit for n, edit, h in FIELD_EDITS}
    if (name, how) in edits:
        edits[name, how](checkpoint / name, how, rng)
    else:
        damage_bytes(checkpoint / name, how, rng)


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
