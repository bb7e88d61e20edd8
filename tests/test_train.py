"""The training loop in-process: matched runs across interfaces, the run-directory format, non-finite losses,
refusing pickled code, and resume safety checks."""

from __future__ import annotations

import json
import os
import pickle

import pytest
import torch
import yaml

from tablefree import model as model_module
from tablefree.checkpoint import layout, training
from tablefree.checkpoint.layout import resolve_checkpoint
from tablefree.checkpoint.model_dir import load_model
from tablefree.checkpoint.verify import file_digests
from tablefree.config_parsing import from_dict
from tablefree.train import state, trainer
from tablefree.train.recipe import TrainConfig
from tablefree.train.trainer import NonFiniteLossError, train
from train_helpers import make_dataset, micro_config, record_run, train_losses


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("train") / "data")


@pytest.mark.slow
def test_matched_init_and_data_order_across_interfaces(monkeypatch, data_dir, tmp_path) -> None:
    runs = {}
    for name in ("learned", "canonical", "affine"):
        config = micro_config(data_dir, budget="3 steps", **{"model.interface.name": name})
        runs[name], _ = record_run(monkeypatch, config, tmp_path / name)
    backbone = {k: v for k, v in runs["learned"]["init"].items() if not k.startswith("input.")}
    assert len(backbone) > 10
    for name in ("canonical", "affine"):
        other = {k: v for k, v in runs[name]["init"].items() if not k.startswith("input.")}
        assert other.keys() == backbone.keys()
        assert all(torch.equal(other[k], backbone[k]) for k in backbone)
        assert len(runs[name]["targets"]) == len(runs["learned"]["targets"]) == 6
        assert all(
            torch.equal(a, b) for a, b in zip(runs[name]["targets"], runs["learned"]["targets"], strict=True)
        )
    # and the seed matters for both
    reseeded, _ = record_run(
        monkeypatch, micro_config(data_dir, budget="3 steps", seed=1), tmp_path / "seed1"
    )
    assert not torch.equal(reseeded["init"]["head.weight"], runs["learned"]["init"]["head.weight"])
    assert not torch.equal(reseeded["targets"][0], runs["learned"]["targets"][0])


@pytest.mark.slow
def test_run_directory_format(data_dir, tmp_path) -> None:
    config = micro_config(data_dir, budget="6 steps", checkpoint_every=2, keep_last=2, val_every=3)
    run_dir = tmp_path / "run"
    summary = train(config, run_dir)
    # config.yaml is the resolved config and loads back as a TrainConfig
    saved = from_dict(TrainConfig, yaml.safe_load((run_dir / "config.yaml").read_text()), where="config.yaml")
    assert saved.model.vocab_size == 96 and saved.seq_len == 32 and saved.seed == 0
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train_records = [r for r in records if "train_loss" in r]
    assert [r["step"] for r in train_records] == [1, 2, 3, 4, 5, 6]
    assert {"step", "tokens", "train_loss", "lr", "tokens_per_s", "mfu", "grad_norm"} <= train_records[
        0
    ].keys()
    assert [r["tokens"] for r in train_records] == [256 * s for s in range(1, 7)]
    assert [r["step"] for r in records if "val_loss_estimate" in r] == [3, 6]
    assert all(
        r["val_windows"] == 2 * 4 for r in records if "val_loss_estimate" in r
    )  # val_batches × micro_batch
    assert train_records[-1]["train_loss"] < train_records[0]["train_loss"]
    on_disk = json.loads((run_dir / "summary.json").read_text())
    assert on_disk == json.loads(json.dumps(summary))
    assert summary["completed"] and summary["tokens_seen"] == 6 * 256 and summary["interface"] == "learned"
    assert summary["final_train_loss"] == train_records[-1]["train_loss"]
    assert summary["params"]["total_trainable"] == summary["params"]["non_embedding"] + 96 * 32
    assert summary["final_val_loss_estimate"] == records[-1]["val_loss_estimate"]
    assert summary["val_estimate_windows"] == 8
    for key in ("wall_time_s", "tokens_per_s", "seed"):
        assert key in summary
    # checkpoints: the last two kept, each complete and loadable by the evaluation side
    steps = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert steps == ["step_00000004", "step_00000006"]
    newest = resolve_checkpoint(run_dir)
    assert newest.name == "step_00000006"
    meta = json.loads((newest / "meta.json").read_text())
    manifest = json.loads((data_dir / "manifest.json").read_text())
    assert meta["step"] == 6 and meta["tokens_seen"] == 1536 and meta["data_dir"] == str(data_dir)
    assert meta["tokenizer_hash"] == manifest["tokenizer_hash"]
    assert (newest / "tokenizer.json").read_bytes() == (data_dir / "tokenizer.json").read_bytes()
    model, _ = load_model(run_dir)
    inputs = torch.randint(0, 96, (2, 16))
    assert model(inputs).shape == (2, 16, 96)
    # a fresh run must not overwrite it
    with pytest.raises(FileExistsError, match="--resume"):
        train(config, run_dir)


def test_the_loop_reads_validates_saves_and_logs_where_its_components_say(
    monkeypatch, data_dir, tmp_path
) -> None:
    """The read points are exactly the steps some component needs: a validation (every 5, not at the last: the
    end validates once), a checkpoint (every 4, and step 3 of checkpoint_steps, never pruned), a log line (every
    4, and the last)."""
    reads = []
    real_read = trainer.Trainer.read_steps

    def read(self):
        reads.append([entry.step for entry in self.state.pending])
        return real_read(self)

    monkeypatch.setattr(trainer.Trainer, "read_steps", read)
    run_dir = tmp_path / "run"
    config = micro_config(
        data_dir,
        budget="10 steps",
        log_every=4,
        val_every=5,
        checkpoint_every=4,
        checkpoint_steps=[3],
        keep_last=1,
    )
    train(config, run_dir)
    assert [steps for steps in reads if steps] == [[1, 2, 3], [4], [5], [6, 7, 8], [9, 10]]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "val_loss_estimate" in r] == [5, 10]  # 10: the end's
    assert [r["step"] for r in records if "train_loss" in r] == [4, 8, 10]
    assert [p.name for p in layout.complete_checkpoints(run_dir)] == ["step_00000003", "step_00000010"]
    assert training.read_meta(run_dir / "checkpoints" / "step_00000003")["step"] == 3


def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(monkeypatch, data_dir, tmp_path) -> None:
    calls = {"n": 0}
    real_loss = model_module.chunked_next_token_loss

    def loss(
        hidden, head_weight, targets, reduction="mean", chunk_tokens=None
    ):  # micro-steps 9 and 10 belong to optimizer step 5 (grad_accum 2)
        calls["n"] += 1
        value = real_loss(hidden, head_weight, targets, reduction, chunk_tokens)
        return value * float("nan") if calls["n"] >= 9 else value

    monkeypatch.setattr(model_module, "chunked_next_token_loss", loss)
    run_dir = tmp_path / "run"
    config = micro_config(data_dir, budget="8 steps", checkpoint_every=2)
    with pytest.raises(NonFiniteLossError, match=r"step 5: the training loss is nan.*step_00000004"):
        train(config, run_dir)
    last = layout.latest_checkpoint(run_dir)
    assert last.name == "step_00000004"
    assert training.load_train_state(last)["step"] == 4
    summary = json.loads((run_dir / "summary.json").read_text())
    assert not summary["completed"] and "step 5" in summary["stop_reason"] and summary["step"] == 4
    model, _ = load_model(run_dir)
    assert all(torch.isfinite(p).all() for p in model.parameters())


class WritesAFile:
    """A pickle payload that would create a file if unpickled."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def test_malicious_pickle_is_refused_and_never_runs(data_dir, tmp_path) -> None:
    run_dir = tmp_path / "run"
    train(micro_config(data_dir, budget="2 steps"), run_dir)
    checkpoint = layout.latest_checkpoint(run_dir)
    marker = tmp_path / "pwned"
    state = training.load_train_state(checkpoint)
    state["loader"] = WritesAFile(str(marker))
    with open(checkpoint / layout.TRAIN_STATE_FILE, "wb") as handle:
        pickle.dump(state, handle, protocol=2)
    # with its digest recorded, as an attacker who rewrote COMPLETE too would (else the digest refuses it)
    complete = {"complete": True, "sha256": training.file_digests(checkpoint)}
    (checkpoint / "COMPLETE").write_text(json.dumps(complete))
    with pytest.raises(ValueError, match="refused to load"):
        training.load_train_state(checkpoint)
    with pytest.raises(ValueError, match="refused to load"):
        train(micro_config(data_dir, budget="2 steps"), run_dir, resume=True)
    assert not marker.exists()


def test_resume_refuses_a_changed_experiment_or_tokenizer(data_dir, tmp_path) -> None:
    run_dir = tmp_path / "run"
    train(micro_config(data_dir, budget="2 steps"), run_dir)
    with pytest.raises(ValueError, match=r"(?s)different experiment.*seed: 0 recorded, 3 now"):
        train(micro_config(data_dir, budget="4 steps", seed=3), run_dir, resume=True)
    meta_path = layout.latest_checkpoint(run_dir) / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["tokenizer_hash"] = "0" * 64
    meta_path.write_text(json.dumps(meta))
    complete = {"complete": True, "sha256": training.file_digests(meta_path.parent)}
    (meta_path.parent / "COMPLETE").write_text(json.dumps(complete))  # a whole checkpoint, other tokenizer
    with pytest.raises(ValueError, match=r"is not tokenized like the one this run was trained on"):
        train(micro_config(data_dir, budget="2 steps"), run_dir, resume=True)


def test_resume_continues_in_process_and_extends_the_budget(data_dir, tmp_path) -> None:
    run_dir = tmp_path / "run"
    train(micro_config(data_dir, budget="3 steps", **{"schedule.name": "constant"}), run_dir)
    summary = train(
        micro_config(data_dir, budget="5 steps", **{"schedule.name": "constant"}),
        run_dir,
        resume=True,
        allow_change=["budget"],
    )
    assert summary["completed"] and summary["step"] == 5 and summary["tokens_seen"] == 5 * 256
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [s for s in steps] == [1, 2, 3, 3, 4, 5, 5]  # train 1-3, val 3, train 4-5, val 5


def test_train_state_is_explicit_and_old_checkpoints_still_resume(data_dir, tmp_path) -> None:
    run_dir = tmp_path / "run"
    train(micro_config(data_dir, budget="2 steps"), run_dir)
    path = layout.latest_checkpoint(run_dir) / layout.TRAIN_STATE_FILE
    saved = torch.load(path, weights_only=True)
    assert set(state.TrainState.saved_fields()) <= saved.keys()
    assert "schedule" not in saved and "world_size" not in saved  # never read, so no longer written
    assert (
        saved["step"] == 2 and saved["best_val_loss_estimate"] == saved["last_val_loss_estimate"] is not None
    )
    # a checkpoint written before the state was explicit carries both keys: it still resumes
    saved.update(schedule={"name": "cosine", "step": 2}, world_size=1)
    saved["last_val_loss"] = saved.pop("last_val_loss_estimate")  # the older name
    del saved["best_val_loss_estimate"], saved["skipped_steps"]
    torch.save(saved, path)
    (path.parent / "COMPLETE").write_text(json.dumps({"complete": True, "sha256": file_digests(path.parent)}))
    summary = train(micro_config(data_dir, budget="3 steps"), run_dir, resume=True, allow_change=["budget"])
    assert summary["completed"] and summary["step"] == 3


@pytest.mark.slow
def test_activation_checkpointing_changes_nothing_but_memory(data_dir, tmp_path) -> None:
    train(micro_config(data_dir, budget="3 steps"), tmp_path / "plain")
    train(micro_config(data_dir, budget="3 steps", activation_checkpointing=True), tmp_path / "ac")
    assert train_losses(tmp_path / "ac") == train_losses(tmp_path / "plain")
    # names in the checkpoint are the model's own, without the wrapper's prefix
    model, _ = load_model(tmp_path / "ac")
    assert "layers.0.attn.wq.weight" in model.state_dict()


def test_metrics_go_to_tensorboard_when_it_is_installed(monkeypatch, data_dir, tmp_path) -> None:
    import sys
    import types

    scalars = []

    class SummaryWriter:  # stands in for torch.utils.tensorboard.SummaryWriter
        def __init__(self, log_dir: str) -> None:
            self.log_dir = log_dir

        def add_scalar(self, tag: str, value: float, step: int) -> None:
            scalars.append((tag, step, value))

        def close(self) -> None:
            scalars.append(("closed", self.log_dir, None))

    monkeypatch.setitem(
        sys.modules, "torch.utils.tensorboard", types.SimpleNamespace(SummaryWriter=SummaryWriter)
    )
    train(micro_config(data_dir, budget="2 steps"), tmp_path / "run")
    losses = train_losses(tmp_path / "run")
    assert [(s, v) for tag, s, v in scalars if tag == "train_loss"] == list(losses.items())
    assert any(tag == "val_loss_estimate" for tag, _, _ in scalars)
    assert scalars[-1] == ("closed", str(tmp_path / "run" / "tensorboard"), None)


def test_truncate_metrics_forgives_only_a_torn_last_line(tmp_path) -> None:
    from tablefree.train.metrics import truncate_metrics

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n{"step": 3}\n{"ste')
    truncate_metrics(path, after_step=2)
    assert path.read_text() == '{"step": 1}\n{"step": 2}\n'
    path.write_text('{"step": 1}\n{"st\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"metrics\.jsonl:2"):
        truncate_metrics(path, after_step=5)
