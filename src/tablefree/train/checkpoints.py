"""The trainer's checkpoints: ``Checkpointer``, built once per run, decides when to save, saves, and resumes.

The format (file names, markers, digests, reading and writing) is ``tablefree.checkpoint``'s; this module
decides what of a run goes into it and when (``Checkpointer.should_save``, ``Checkpointer.save``) and how a run
continues from it (``Checkpointer.resume``: the newest checkpoint that loads, a damaged newer one set aside with
the reason said). As torchtitan's ``CheckpointManager``: everything that stays fixed within the run (where, how
often, which steps are kept, the model and optimizer, the recipe, the dataset's tokenizer) is given once, and
``save`` takes only the ``TrainState`` of the step.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from tablefree.checkpoint import sharded
from tablefree.checkpoint.layout import (
    COMPLETE_MARKER,
    META_FILE,
    SHARDED_DIR,
    TRAIN_STATE_FILE,
    CheckpointError,
    incomplete_checkpoints,
    latest_checkpoint,
    staging_dir,
)
from tablefree.checkpoint.training import (
    full_state,
    load_for_resume,
    load_newest,
    non_finite_parameters,
    read_meta,
    rng_state,
    save_checkpoint,
    set_aside,
)
from tablefree.config_parsing import to_dict
from tablefree.data.loader import Dataset, TokenLoader
from tablefree.fileio import writing
from tablefree.model_config import ModelConfig
from tablefree.train.optimizer import reapply_implementation
from tablefree.train.parallelize import DistInfo, any_rank, barrier
from tablefree.train.recipe import Plan, TrainConfig
from tablefree.train.state import NonFiniteLossError, TrainState


@dataclass(frozen=True)
class Resumed:
    """Where a run resumed from, and the state it resumed with."""

    checkpoint: Path
    state: TrainState


def restore(
    checkpoint: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    loader: TokenLoader,
    dataset: Dataset,
    run_plan: Plan,
) -> TrainState:
    """Restore a run's model, optimizer, RNG and loader from ``checkpoint``; its TrainState. A damaged
    checkpoint is a CheckpointError naming the file (``resume`` then tries the one before)."""
    recorded = read_meta(checkpoint).get("tokenizer_hash")
    if (
        recorded != dataset.tokenizer_hash
    ):  # damage to skip, like any other (the dataset check vouched for one)
        raise CheckpointError(
            f"{checkpoint / META_FILE}: tokenizer {str(recorded)[:12]}…, not the dataset's "
            f"{str(dataset.tokenizer_hash)[:12]}…"
        )
    saved = load_for_resume(checkpoint, model, optimizer, loader, tokenizer_hash=dataset.tokenizer_hash)
    reapply_implementation(optimizer)  # the saved param groups carry the saving process's fused/foreach flags
    where = checkpoint / TRAIN_STATE_FILE
    state = TrainState.from_state_dict(saved, where=str(where))
    # batch_tokens never changes within a run, so these three numbers must agree
    if state.tokens_seen != state.step * run_plan.tokens_per_step:
        raise CheckpointError(
            f"{where}: {state.tokens_seen} tokens seen in {state.step} steps of {run_plan.tokens_per_step} tokens"
        )
    if loader.position != state.step * run_plan.grad_accum:
        raise CheckpointError(
            f"{where}: the loader is at micro-step {loader.position}, not at step {state.step}'s "
            f"{state.step * run_plan.grad_accum}"
        )
    return state


class Checkpointer:
    """A run's checkpoints: when to save (``should_save``), ``save``, and ``resume``. Built once from the resolved
    recipe; ``model`` is the bare model (named in messages), ``train_model`` what the loop trains (DDP, FSDP2 or
    compiled), whose state is saved."""

    def __init__(
        self,
        *,
        run_dir: Path,
        config: TrainConfig,
        model_config: ModelConfig,
        dataset: Dataset,
        model: torch.nn.Module,
        train_model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        loader: TokenLoader,
        run_plan: Plan,
        info: DistInfo,
    ) -> None:
        self.run_dir, self.dataset, self.plan, self.info = run_dir, dataset, run_plan, info
        self.model, self.train_model, self.optimizer, self.loader = model, train_model, optimizer, loader
        self.every, self.steps = config.checkpoint_every, config.checkpoint_steps
        self.keep_last = config.keep_last
        # checkpoint_format none (benchmarks): a large model's checkpoint is not worth its write
        self.enabled = config.checkpoint_format != "none"
        self.shard = config.checkpoint_format == "sharded" or (
            config.checkpoint_format == "auto" and config.parallel == "fsdp" and info.world_size > 1
        )
        self.config = {"model": to_dict(model_config), "train": to_dict(config)}  # config.json
        self.run_meta = {  # meta.json's fields that hold for every step of the run
            "tokenizer_hash": dataset.tokenizer_hash,
            "data_dir": str(dataset.directory),
            "interface": model_config.interface.name,
            "seed": config.seed,
        }
        self.tokenizer = dataset.tokenizer_path if dataset.tokenizer_path.exists() else None
        self.saved_step = -1  # the step of the last save in this process (-1: none yet)

    def should_save(self, step: int) -> bool:
        """A checkpoint after this step: every ``checkpoint_every`` steps, and at each of ``checkpoint_steps``."""
        return bool(self.every and step % self.every == 0) or step in self.steps

    def save(self, state: TrainState) -> Path | None:
        """A checkpoint of ``state``'s step (a collective: every process calls it; rank 0 writes the step
        directory, each rank its shards when sharded); the checkpoints of ``checkpoint_steps`` are never pruned.
        Non-finite weights are refused (``NonFiniteLossError``) before anything is written. Returns the path on
        the main process; None there too with ``checkpoint_format: none``."""
        if not self.enabled:
            self.saved_step = state.step
            return None
        poisoned = non_finite_parameters(self.model)  # each rank checks its own shards
        if any_rank(bool(poisoned), self.info.device):
            last = latest_checkpoint(self.run_dir)
            raise NonFiniteLossError(
                f"step {state.step}: non-finite weights (NaN or inf) in {', '.join(poisoned[:3]) or 'the model'}; "
                "no checkpoint written. "
                + (f"The last good checkpoint is {last}." if last else "No checkpoint was saved yet."),
                stop_reason=f"non-finite weights at step {state.step}",
            )
        if self.shard:  # every rank writes its shards into the staging directory first
            staging = staging_dir(self.run_dir, state.step)
            if self.info.is_main:
                shutil.rmtree(staging, ignore_errors=True)  # left over from a process killed while saving
            barrier()
            sharded.save_sharded(staging, self.train_model, self.optimizer)
            model_state, optim_state = None, {"in": SHARDED_DIR}
        else:
            model_state, optim_state = full_state(self.train_model, self.optimizer)
        path = None
        if self.info.is_main:
            train_state = {
                **state.state_dict(),
                "optimizer": optim_state,
                "rng": rng_state(),
                "loader": self.loader.state_dict(),
            }
            meta = {
                "step": state.step,
                "tokens_seen": state.tokens_seen,
                **self.run_meta,
                "train_loss": state.last_train_loss,
                "val_loss_estimate": state.last_val_loss_estimate,
            }
            with writing(staging_dir(self.run_dir, state.step)):  # a full disk: one line naming the file
                path = save_checkpoint(
                    self.run_dir,
                    state.step,
                    model_state,
                    train_state,
                    self.config,
                    meta,
                    self.tokenizer,
                    keep_last=self.keep_last,
                    keep_steps=self.steps,
                )
        barrier()
        self.saved_step = state.step
        return path

    def resume(self) -> Resumed | None:
        """Restore the newest checkpoint that loads into the model, the optimizer, the random generators and the
        loader; a damaged newer one is skipped (and set aside) with the reason said. None when the run has no
        checkpoint yet; a CheckpointError when none loads."""
        try:
            found = load_newest(
                self.run_dir,
                lambda checkpoint: restore(
                    checkpoint, self.train_model, self.optimizer, self.loader, self.dataset, self.plan
                ),
            )
        except CheckpointError as error:
            raise CheckpointError(f"--resume: {error}") from None
        if found is None:
            return None
        checkpoint, state, skipped = found
        if self.info.is_main:
            for partial in incomplete_checkpoints(self.run_dir):
                if partial.name > checkpoint.name:
                    print(
                        f"--resume: ignored {partial.name}: no {COMPLETE_MARKER} marker (an incomplete checkpoint)"
                    )
        barrier()  # every process has loaded before rank 0 moves anything
        if self.info.is_main:
            for damaged, error in skipped:
                print(f"--resume: skipped {damaged.name}: {error}", flush=True)
                print(f"--resume: {damaged.name} moved to {set_aside(damaged)}", flush=True)
        return Resumed(checkpoint, state)
