"""The trainer's checkpoints: what a run saves of itself, and ``resume`` back into a ``TrainState``.

The format (file names, markers, digests, reading and writing) is ``tablefree.checkpoint``'s; this module
decides what of a run goes into it (``save``) and how a run continues from it (``resume``: the newest checkpoint
that loads, a damaged newer one set aside with the reason said).
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tablefree.checkpoint import sharded
from tablefree.checkpoint.layout import (
    COMPLETE_MARKER,
    META_FILE,
    SHARDED_DIR,
    TRAIN_STATE_FILE,
    CheckpointError,
    incomplete_checkpoints,
    staging_dir,
)
from tablefree.checkpoint.training import (
    full_state,
    load_for_resume,
    load_newest,
    read_meta,
    rng_state,
    save_checkpoint,
    set_aside,
)
from tablefree.data.loader import Dataset, TokenLoader
from tablefree.fileio import writing
from tablefree.train.optimizer import reapply_implementation
from tablefree.train.parallelize import DistInfo, barrier
from tablefree.train.recipe import Plan
from tablefree.train.state import TrainState


@dataclass(frozen=True)
class Resumed:
    """Where a run resumed from, and the state it resumed with."""

    checkpoint: Path
    state: TrainState


def resume(
    run_dir: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    loader: TokenLoader,
    dataset: Dataset,
    run_plan: Plan,
    info: DistInfo,
) -> Resumed | None:
    """Restore the newest checkpoint that loads into ``model``, ``optimizer``, the random generators and
    ``loader``; a damaged newer one is skipped (and set aside) with the reason said. None when the run has no
    checkpoint yet; a CheckpointError when none loads."""
    try:
        found = load_newest(
            run_dir, lambda checkpoint: restore(checkpoint, model, optimizer, loader, dataset, run_plan)
        )
    except CheckpointError as error:
        raise CheckpointError(f"--resume: {error}") from None
    if found is None:
        return None
    checkpoint, state, skipped = found
    if info.is_main:
        for partial in incomplete_checkpoints(run_dir):
            if partial.name > checkpoint.name:
                print(
                    f"--resume: ignored {partial.name}: no {COMPLETE_MARKER} marker (an incomplete checkpoint)"
                )
    barrier()  # every process has loaded before rank 0 moves anything
    if info.is_main:
        for damaged, error in skipped:
            print(f"--resume: skipped {damaged.name}: {error}", flush=True)
            print(f"--resume: {damaged.name} moved to {set_aside(damaged)}", flush=True)
    return Resumed(checkpoint, state)


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


def save(
    run_dir: Path,
    state: TrainState,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    loader: TokenLoader,
    config: dict[str, Any],
    meta: dict[str, Any],
    tokenizer_path: Path | None,
    keep_last: int,
    shard: bool,
    info: DistInfo,
    keep_steps: Sequence[int] = (),
) -> Path | None:
    """A checkpoint of ``state``'s step (a collective: every process calls it; rank 0 writes the step
    directory, each rank its shards when ``shard``); the checkpoints of ``keep_steps`` are never pruned.
    Returns its path on the main process."""
    if shard:  # every rank writes its shards into the staging directory first
        staging = staging_dir(run_dir, state.step)
        if info.is_main:
            shutil.rmtree(staging, ignore_errors=True)  # left over from a process killed while saving
        barrier()
        sharded.save_sharded(staging, model, optimizer)
        model_state, optim_state = None, {"in": SHARDED_DIR}
    else:
        model_state, optim_state = full_state(model, optimizer)
    path = None
    if info.is_main:
        train_state = {
            **state.state_dict(),
            "optimizer": optim_state,
            "rng": rng_state(),
            "loader": loader.state_dict(),
        }
        with writing(staging_dir(run_dir, state.step)):  # a full disk: one line naming the file
            path = save_checkpoint(
                run_dir,
                state.step,
                model_state,
                train_state,
                config,
                meta,
                tokenizer_path,
                keep_last=keep_last,
                keep_steps=keep_steps,
            )
    barrier()
    return path
