"""Nothing poisoned, nothing lost: non-finite steps, damaged checkpoints, a locked run directory (issue 12)."""

from __future__ import annotations

import copy
import fcntl
import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from tablefree import model as model_module
from tablefree.checkpoint import layout
from tablefree.checkpoint.model_dir import load_model
from tablefree.checkpoint.verify import file_digests
from tablefree.train import trainer
from tablefree.train.resume import RunDirInUseError
from tablefree.train.trainer import NonFiniteLossError, train
from train_helpers import make_dataset, micro_config, train_losses


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("reliability") / "data")


def strict_records(path) -> list[dict]:
    """JSON lines parsed strictly: a bare NaN or Infinity (not JSON) fails."""

    def refuse(constant: str):
        raise AssertionError(f"{path}: bare {constant} in the file")

    return [json.loads(line, parse_constant=refuse) for line in path.read_text().splitlines()]


def test_nan_gradient_norm_stops_before_the_update_and_no_poisoned_checkpoint(data_dir, tmp_path) -> None:
    # the recipe: at step 3 the loss is finite but the gradient norm is NaN
    run_dir = tmp_path / "run"
    config = micro_config(
        data_dir,
        budget="6 steps",
        checkpoint_every=1,
        keep_last=1,
        **{"optim.lr": 1e6, "schedule.warmup_steps": 0},
    )
    with pytest.raises(NonFiniteLossError, match=r"step 3: the gradient norm is nan.*step_00000002"):
        train(config, run_dir)
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == ["step_00000002"]
    weights = load_file(str(layout.latest_checkpoint(run_dir) / "model.safetensors"))
    assert all(torch.isfinite(t).all() for t in weights.values())
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stop_reason"] == "non-finite gradient norm at step 3" and summary["step"] == 2
    strict_records(run_dir / "metrics.jsonl")


def test_a_non_finite_step_read_later_still_applies_no_update_after_it(
    monkeypatch, data_dir, tmp_path
) -> None:
    """With log_every 4 the NaN of step 3 is read at step 4: steps 3 and 4 must both have left the weights alone
    (the device-side flag sticks), and nothing after step 2 is saved."""
    seen = {}
    real_read = trainer.Trainer.read_steps

    def read_and_keep(self):
        seen[self.state.step] = ([e.step for e in self.state.pending], copy.deepcopy(self.model.state_dict()))
        return real_read(self)

    monkeypatch.setattr(trainer.Trainer, "read_steps", read_and_keep)
    run_dir = tmp_path / "run"
    config = micro_config(
        data_dir,
        budget="6 steps",
        log_every=4,
        checkpoint_every=2,
        keep_last=1,
        **{"optim.lr": 1e6, "schedule.warmup_steps": 0},
    )
    with pytest.raises(NonFiniteLossError, match=r"step 3: the gradient norm is nan.*step_00000002"):
        train(config, run_dir)
    assert [steps for steps, _ in seen.values()] == [[1, 2], [3, 4]]  # step 2 read for its checkpoint
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == ["step_00000002"]
    at_step_2, at_step_4 = seen[2][1], seen[4][1]
    assert all(torch.equal(at_step_4[name], at_step_2[name]) for name in at_step_2)
    assert json.loads((run_dir / "summary.json").read_text())["step"] == 2


def test_skip_mode_skips_the_update_and_keeps_the_files_valid_json(monkeypatch, data_dir, tmp_path) -> None:
    calls = {"n": 0}
    real_loss = model_module.chunked_next_token_loss

    def loss(hidden, head_weight, targets, reduction="mean", chunk_tokens=None):  # micro-step 5: step 3
        calls["n"] += 1
        value = real_loss(hidden, head_weight, targets, reduction, chunk_tokens)
        return value * float("nan") if calls["n"] == 5 else value

    monkeypatch.setattr(model_module, "chunked_next_token_loss", loss)
    run_dir = tmp_path / "run"
    summary = train(micro_config(data_dir, budget="5 steps", on_nonfinite="skip"), run_dir)
    assert summary["completed"] and summary["skipped_steps"] == 1 and summary["step"] == 5
    records = strict_records(run_dir / "metrics.jsonl")
    skipped = [r for r in records if "skipped_update" in r]
    assert [r["step"] for r in skipped] == [3] and skipped[0]["loss"] is None
    assert sorted(train_losses(run_dir)) == [1, 2, 4, 5]
    model, _ = load_model(run_dir)
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_non_finite_weights_are_never_written(monkeypatch, data_dir, tmp_path) -> None:
    real_save = trainer.Trainer.save

    def save_after_poisoning(self):  # weights gone non-finite by the time of the save
        with torch.no_grad():
            self.model.head.weight[0, 0] = float("inf")
        return real_save(self)

    monkeypatch.setattr(trainer.Trainer, "save", save_after_poisoning)
    run_dir = tmp_path / "run"
    with pytest.raises(
        NonFiniteLossError, match=r"step 2: non-finite weights .* in head.weight; no checkpoint"
    ):
        train(micro_config(data_dir, budget="4 steps", checkpoint_every=2), run_dir)
    assert layout.complete_checkpoints(run_dir) == []
    assert not list((run_dir / "checkpoints").glob(".step_*"))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stop_reason"] == "non-finite weights at step 2"


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["truncate_train_state", "truncate_weights", "nan_weights_old_format"])
def test_resume_falls_back_past_a_damaged_newest_checkpoint(damage, data_dir, tmp_path, capsys) -> None:
    reference = tmp_path / "reference"
    config = micro_config(data_dir, budget="6 steps", checkpoint_every=2, keep_last=0)
    train(config, reference)
    run_dir = tmp_path / "run"
    train(micro_config(data_dir, budget="4 steps", checkpoint_every=2, keep_last=0), run_dir)
    newest = layout.latest_checkpoint(run_dir)
    assert newest.name == "step_00000004"
    if damage == "truncate_train_state":
        path = newest / layout.TRAIN_STATE_FILE
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif damage == "truncate_weights":
        path = newest / "model.safetensors"
        path.write_bytes(path.read_bytes()[:100])
    else:  # a NaN-poisoned checkpoint whose digests agree (recorded after the damage): the NaN check catches it
        path = newest / "model.safetensors"
        weights = load_file(str(path))
        weights["head.weight"][0, 0] = float("nan")
        from safetensors.torch import save_file

        save_file(weights, str(path), metadata={"format": "pt"})
        (newest / "COMPLETE").write_text(json.dumps({"complete": True, "sha256": file_digests(newest)}))
    capsys.readouterr()
    summary = train(config, run_dir, resume=True, allow_change=["budget"])
    out = capsys.readouterr().out
    assert f"--resume: skipped step_00000004: {path}" in out
    assert "resumed from" in out and "step_00000002 (step 2" in out
    assert (run_dir / "checkpoints" / "damaged-step_00000004").is_dir()  # kept aside, out of pruning's way
    assert summary["completed"] and train_losses(run_dir) == train_losses(reference)


def test_resume_with_every_checkpoint_damaged_names_each(data_dir, tmp_path) -> None:
    run_dir = tmp_path / "run"
    train(micro_config(data_dir, budget="4 steps", checkpoint_every=2, keep_last=0), run_dir)
    for checkpoint in layout.complete_checkpoints(run_dir):
        (checkpoint / layout.TRAIN_STATE_FILE).write_bytes(b"")
    with pytest.raises(layout.CheckpointError, match=r"no checkpoint .* can be loaded") as caught:
        train(micro_config(data_dir, budget="4 steps", checkpoint_every=2, keep_last=0), run_dir, resume=True)
    assert str(caught.value).count("train_state.pt") == 2


def test_a_run_directory_is_locked_while_training_and_freed_when_its_holder_dies(data_dir, tmp_path) -> None:
    run_dir = tmp_path / "run"
    config = micro_config(data_dir, budget="2 steps")
    train(config, run_dir)
    with open(run_dir / ".lock", "a+") as held:  # another training process holds the lock
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(RunDirInUseError, match=r"is in use by another training process"):
            train(config, run_dir, resume=True)
    # a holder killed with SIGKILL takes its lock with it
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, sys, time; f = open(sys.argv[1], 'a+'); fcntl.flock(f, fcntl.LOCK_EX); "
            "print('locked', flush=True); time.sleep(600)",
            str(run_dir / ".lock"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "locked"
    holder.kill()
    holder.wait()
    summary = train(micro_config(data_dir, budget="3 steps"), run_dir, resume=True, allow_change=["budget"])
    assert summary["completed"] and summary["step"] == 3


def test_a_run_that_fails_before_writing_anything_leaves_no_directory(data_dir, tmp_path) -> None:
    """issue 25: a failed `train` left a directory holding only its `.lock` file."""
    run_dir = tmp_path / "run"
    with pytest.raises(FileNotFoundError, match=r"manifest\.json not found"):
        train(micro_config(tmp_path / "no-such-data"), run_dir)
    assert not run_dir.exists()
    run_dir.mkdir()  # a directory the user made is left in place
    with pytest.raises(FileNotFoundError):
        train(micro_config(tmp_path / "no-such-data"), run_dir)
    assert run_dir.is_dir() and list(run_dir.iterdir()) == []


def test_a_damaged_dataset_is_refused_before_training(data_dir, tmp_path) -> None:
    import shutil

    damaged = tmp_path / "data"
    shutil.copytree(data_dir, damaged)
    shard = damaged / "train_000000.bin"
    data = bytearray(shard.read_bytes())
    data[-2] ^= 0x01  # one token id changed: sizes and header still right
    shard.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"train_000000.bin does not match the sha256 in the manifest"):
        train(micro_config(damaged, budget="2 steps"), tmp_path / "run")
    assert not (tmp_path / "run" / "checkpoints").exists()
