"""Resume never changes a run behind the user's back (issue 15), through the command line as typed."""

from __future__ import annotations

import json
import signal

import pytest

from tablefree.checkpoint import layout
from tablefree.checkpoint.verify import file_digests
from tablefree.cli import main
from tablefree.train import trainer
from tablefree.train.recipe import lr_at
from tablefree.train.resume import CHANGES_FILE, recorded_config
from train_helpers import make_dataset, micro_config, train_losses, write_config

pytestmark = pytest.mark.slow  # each test trains (in-process, a second or two per run)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume-rules")
    data_dir = make_dataset(root / "data")
    config = write_config(root / "config.yaml", micro_config(data_dir, budget="3 steps"))
    return root, data_dir, config


def tablefree(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["train", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def trained_run(setup, tmp_path, capsys, *extra: str):
    _, _, config = setup
    run_dir = tmp_path / "run"
    code, _, err = tablefree(capsys, "--config", str(config), "--run-dir", str(run_dir), *extra)
    assert code == 0, err
    return run_dir


def test_a_changed_recipe_is_refused_naming_each_field_then_allowed_and_recorded(
    setup, tmp_path, capsys
) -> None:
    run_dir = trained_run(setup, tmp_path, capsys)
    original = (run_dir / "config.yaml").read_text()

    code, _, err = tablefree(capsys, "--resume", "--run-dir", str(run_dir), "optim.lr=1e-2", "budget=5 steps")
    assert code == 1
    assert "optim.lr: 0.003 recorded, 0.01 now" in err and "budget: '3 steps' recorded, '5 steps' now" in err
    assert "--allow-change budget --allow-change optim.lr" in err and "Traceback" not in err
    assert (run_dir / "config.yaml").read_text() == original and not (run_dir / CHANGES_FILE).exists()

    code, out, err = tablefree(
        capsys,
        "--resume",
        "--run-dir",
        str(run_dir),
        "optim.lr=1e-2",
        "budget=5 steps",
        "--allow-change",
        "optim.lr",
        "--allow-change",
        "budget",
    )
    assert code == 0, err
    assert "optim.lr changed from 0.003 to 0.01 after step 3" in out
    assert (run_dir / "config.yaml").read_text() == original  # the original recipe is never overwritten
    history = json.loads((run_dir / CHANGES_FILE).read_text())
    assert [(h["field"], h["from"], h["to"], h["after_step"]) for h in history] == [
        ("budget", "3 steps", "5 steps", 3),
        ("optim.lr", 0.003, 0.01, 3),
    ]
    assert recorded_config(run_dir)["optim"]["lr"] == 0.01
    records = map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
    lrs = {r["step"]: r["lr"] for r in records if "lr" in r}
    schedule = micro_config(setup[1]).schedule
    assert lrs[4] == lr_at(4, 5, 0.01, schedule) != lr_at(4, 5, 0.003, schedule)  # the change took effect
    # the recorded recipe now includes the changes: resuming as typed before needs no permission again
    code, _, err = tablefree(
        capsys, "--resume", "--run-dir", str(run_dir), "budget=6 steps", "--allow-change", "budget"
    )
    assert code == 0, err
    assert max(train_losses(run_dir)) == 6


def test_resume_with_nothing_to_resume_says_where_it_looked(tmp_path, capsys) -> None:
    typo = tmp_path / "runs" / "typo"
    code, _, err = tablefree(capsys, "--resume", "--run-dir", str(typo))
    assert code == 1 and "nothing to resume" in err and f"{typo} does not exist" in err
    assert f"{typo}/checkpoints/step_*/COMPLETE" in err
    assert not typo.exists()  # nothing was created either


def test_a_different_interface_names_the_field_not_two_dicts(setup, tmp_path, capsys) -> None:
    run_dir = trained_run(setup, tmp_path, capsys)
    code, _, err = tablefree(capsys, "--resume", "--run-dir", str(run_dir), "model.interface=affine")
    assert code == 1
    assert "model.interface.name: 'learned' recorded, 'affine' now" in err
    assert "cannot change within a run" in err and "d_model" not in err


def test_a_different_dataset_is_named_as_such(setup, tmp_path, capsys) -> None:
    run_dir = trained_run(setup, tmp_path, capsys)
    other = make_dataset(tmp_path / "other", vocab_size=64)
    code, _, err = tablefree(capsys, "--resume", "--run-dir", str(run_dir), f"data.dir={other}")
    assert code == 1
    assert f"the dataset {other}" in err and "not tokenized like the one this run was trained on" in err
    assert f"data.dir={setup[1]}" in err and "vocab_size" not in err


def test_a_partial_checkpoint_left_by_a_kill_is_removed_at_the_next_save(setup, tmp_path, capsys) -> None:
    run_dir = trained_run(setup, tmp_path, capsys)
    leftover = run_dir / "checkpoints" / ".step_00000082.tmp"
    leftover.mkdir()
    (leftover / "model.safetensors").write_bytes(b"half")
    code, _, err = tablefree(
        capsys, "--resume", "--run-dir", str(run_dir), "budget=4 steps", "--allow-change", "budget"
    )
    assert code == 0, err
    assert not leftover.exists()
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == ["step_00000003", "step_00000004"]


def test_an_interrupted_run_prints_no_missing_numbers(monkeypatch, setup, tmp_path, capsys) -> None:
    real_lr_at = trainer.lr_at

    def interrupting_lr_at(step, *args):
        if step == 2:
            signal.raise_signal(signal.SIGINT)  # as Ctrl-C during step 2
        return real_lr_at(step, *args)

    monkeypatch.setattr(trainer, "lr_at", interrupting_lr_at)
    run_dir = tmp_path / "run"
    code, out, err = tablefree(capsys, "--config", str(setup[2]), "--run-dir", str(run_dir))
    assert code == 0, err
    assert "stopped by SIGINT after step 2; checkpoint saved" in out
    assert "None" not in out and "val loss" not in out
    assert "stopped (stopped by SIGINT): step 2/3" in out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["final_val_loss_estimate"] is None and not summary["completed"]
    assert layout.latest_checkpoint(run_dir).name == "step_00000002"


def test_a_tokenizer_mismatch_in_the_newest_checkpoint_falls_back_to_the_intact_older_one(
    setup, tmp_path, capsys
) -> None:
    """Issue 26: a newest checkpoint recording another tokenizer (digests made consistent) failed the resume
    outright instead of being skipped, like any other damage, for the intact checkpoint before it."""
    run_dir = trained_run(setup, tmp_path, capsys)
    more = ("--resume", "--run-dir", str(run_dir), "--allow-change", "budget")
    assert tablefree(capsys, *more, "budget=4 steps")[0] == 0
    newest = run_dir / "checkpoints" / "step_00000004"
    meta = json.loads((newest / "meta.json").read_text())
    (newest / "meta.json").write_text(json.dumps({**meta, "tokenizer_hash": "0" * 64}))
    (newest / "COMPLETE").write_text(json.dumps({"complete": True, "sha256": file_digests(newest)}))
    code, out, err = tablefree(capsys, *more, "budget=5 steps")
    assert code == 0, err
    assert "--resume: skipped step_00000004: " in out and "tokenizer" in out


def test_a_full_disk_is_one_line_and_the_run_resumes_identically(setup, tmp_path, capsys) -> None:
    """Issue 26: a full disk during training was a raw OSError traceback. On a real small tmpfs (root only) it is
    one line naming the mount and the file; once space is freed, --resume ends with the uninterrupted weights."""
    import os
    import subprocess

    disk = tmp_path / "disk"
    disk.mkdir()
    if (
        os.geteuid() != 0
        or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=96k", "tmpfs", str(disk)]).returncode
    ):
        pytest.skip("mounting a small tmpfs needs root")
    try:
        _, _, config = setup
        code, _, err = tablefree(capsys, "--config", str(config), "--run-dir", str(disk / "run"))
        assert code == 1
        (line,) = [line for line in err.splitlines() if "error" in line]
        assert line.startswith(
            f"tablefree train: error: no space left on {disk} while writing {disk}/run/"
        ), err
        subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)
        code, _, err = tablefree(
            capsys, "--resume-if-present", "--config", str(config), "--run-dir", str(disk / "run")
        )
        assert code == 0, err
        reference = trained_run(setup, tmp_path, capsys)
        final = "checkpoints/step_00000003/model.safetensors"
        assert (disk / "run" / final).read_bytes() == (reference / final).read_bytes()
    finally:
        subprocess.run(["umount", str(disk)], check=True)
