"""Training checkpoints: model files per ``checkpoint.model_dir`` plus the state needed to resume exactly.

Layout of a run's checkpoints::

    checkpoints/step_00000100/
        model.safetensors   # full (unsharded) weights, names as in TablefreeLM
        config.json         # {"model": ..., "train": the resolved TrainConfig}
        tokenizer.json      # copied from the dataset
        meta.json           # step, tokens_seen, tokenizer_hash, data_dir, ...
        train_state.pt      # TrainState, optimizer (keyed by parameter name), RNG states, loader position
        COMPLETE            # written last: {"complete": true, "sha256": {file: digest, ...}}

A step directory is assembled under a hidden temporary name, marked COMPLETE, then renamed into place, so a
``step_*`` directory is always whole; old ones are renamed to a hidden name before they are deleted, so a kill
during pruning never leaves a ``step_*`` directory half gone. The sha256 of every file, recorded in COMPLETE,
is checked before a resume, so a checkpoint damaged after it was written (a truncated or altered file) is
found and skipped rather than loaded (``load_for_resume``); every such failure is a ``CheckpointError`` naming
the file. ``train_state.pt`` is written with ``torch.save`` and read only with
``torch.load(weights_only=True)``: tensors, numbers, strings and containers, never pickled code.

Model and optimizer state go through ``torch.distributed.checkpoint.state_dict`` with full state dicts, so the
same files come from (and load into) one process, DDP or FSDP2 at any world size.
"""

from __future__ import annotations

import os
import pickle
import random
import re
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
from safetensors.torch import load_file
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)

from tablefree.checkpoint import sharded
from tablefree.checkpoint.layout import (
    CHECKPOINTS_DIR,
    COMPLETE_MARKER,
    CONFIG_FILE,
    DAMAGED_PREFIX,
    META_FILE,
    MODEL_FILE,
    SHARDED_DIR,
    STEP_PREFIX,
    TRAIN_STATE_FILE,
    CheckpointError,
    complete_checkpoints,
    first_line,
    is_complete,
    is_sharded,
    staging_dir,
    step_dir_name,
)
from tablefree.checkpoint.model_dir import save_model_files
from tablefree.checkpoint.verify import (
    check_finite,
    check_weights_header,
    expected_tensors,
    file_digests,
    read_json_object,
    verify_digests,
)
from tablefree.fileio import write_json_atomic

T = TypeVar("T")
# Fault injection for the kill-loop test: the process SIGKILLs itself half way through writing this step's
# checkpoint (model files written, train state and COMPLETE not yet).
KILL_DURING_SAVE_ENV = "TABLEFREE_FAULT_KILL_DURING_SAVE"
# What train_state.pt must hold, and of which type, to be resumed from.
TRAIN_STATE_FIELDS = {"step": int, "tokens_seen": int, "optimizer": dict, "rng": dict, "loader": dict}


def full_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Full, unsharded model and optimizer state on CPU, keyed by parameter name (a collective under FSDP2:
    every process must call it)."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_state, optim_state = get_state_dict(model, optimizer, options=options)
    return model_state, optim_state


def rng_state() -> dict[str, Any]:
    """Every random generator's state, as tensors and plain values (loadable with weights_only=True)."""
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": [np_name, torch.from_numpy(np_keys.astype(np.int64)), np_pos, np_has_gauss, np_gauss],
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    name, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    model_state: dict[str, torch.Tensor] | None,
    train_state: dict[str, Any],
    config: dict[str, Any],
    meta: dict[str, Any],
    tokenizer_path: str | Path | None,
    keep_last: int = 0,
    keep_steps: Sequence[int] = (),
) -> Path:
    """Write a complete step directory (call on the main process only) and prune old ones. ``model_state``
    None: a sharded checkpoint, whose model and optimizer shards every process has already written into
    ``staging_dir`` (``checkpoint.sharded.save_sharded``)."""
    root = Path(run_dir) / CHECKPOINTS_DIR
    root.mkdir(parents=True, exist_ok=True)
    final = root / step_dir_name(step)
    tmp = staging_dir(run_dir, step)
    if model_state is not None:
        shutil.rmtree(tmp, ignore_errors=True)  # left over from a process killed while saving
    save_model_files(tmp, model_state, config, meta, tokenizer_path)
    if int(os.environ.get(KILL_DURING_SAVE_ENV, "0")) == step:
        os.kill(os.getpid(), 9)
    torch.save(train_state, tmp / TRAIN_STATE_FILE)
    write_json_atomic(tmp / COMPLETE_MARKER, {"complete": True, "sha256": file_digests(tmp)})
    if final.exists():  # the same step saved again (e.g. a resumed run stopped at once)
        remove_dir(final)
    tmp.rename(final)
    prune_checkpoints(run_dir, keep_last, keep_steps)
    return final


def remove_dir(directory: Path) -> None:
    """Rename to a hidden name, then delete: a kill half way leaves only a hidden leftover, never a damaged
    ``step_*`` directory that still looks complete."""
    doomed = directory.with_name(f".{directory.name}.deleting")
    shutil.rmtree(doomed, ignore_errors=True)
    directory.rename(doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def prune_checkpoints(run_dir: str | Path, keep_last: int, keep_steps: Sequence[int] = ()) -> None:
    """Delete all but the newest ``keep_last`` complete checkpoints (0 keeps all; those of ``keep_steps`` are
    always kept), incomplete ones, and hidden leftovers of saves or deletions a killed process did not finish."""
    root = Path(run_dir) / CHECKPOINTS_DIR
    for stale in root.glob(f".{STEP_PREFIX}*"):
        if stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)
    for stale in root.glob(f"{STEP_PREFIX}*"):
        if stale.is_dir() and not is_complete(stale):
            shutil.rmtree(stale, ignore_errors=True)
    if keep_last > 0:
        kept = {step_dir_name(step) for step in keep_steps}
        for old in complete_checkpoints(run_dir)[:-keep_last]:
            if old.name not in kept:
                remove_dir(old)


def load_train_state(directory: str | Path) -> dict[str, Any]:
    """``train_state.pt`` of a checkpoint, unpickled with ``weights_only=True``: anything but tensors and plain
    data (a pickled object whose ``__reduce__`` would run code) is refused before it can run. A missing,
    unreadable or incomplete file is a CheckpointError naming it."""
    path = Path(directory) / TRAIN_STATE_FILE
    if not path.exists():
        raise CheckpointError(f"{path}: missing; {directory} is a model checkpoint without training state")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        raise CheckpointError(
            f"{path}: refused to load: it holds something other than tensors and plain data ({first_line(error)})"
        ) from None
    except Exception as error:  # torch reports truncation and corruption with many exception types
        raise CheckpointError(f"{path}: unreadable ({type(error).__name__}: {first_line(error)})") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: expected a dict of training state, found {type(state).__name__}")
    for name, kind in TRAIN_STATE_FIELDS.items():
        if not isinstance(state.get(name), kind) or isinstance(state.get(name), bool):
            found = "nothing" if name not in state else type(state[name]).__name__
            raise CheckpointError(f"{path}: field {name!r} should be a {kind.__name__}, found {found}")
    if state["step"] < 0 or state["tokens_seen"] < 0:
        raise CheckpointError(f"{path}: step and tokens_seen must be >= 0")
    named = re.fullmatch(r"step_(\d+)", Path(directory).name)
    if named and int(named.group(1)) != state["step"]:
        raise CheckpointError(
            f"{path}: holds step {state['step']}, but its directory is {Path(directory).name}"
        )
    return state


def load_model_state(directory: str | Path) -> dict[str, torch.Tensor]:
    """The weights of a checkpoint; an unreadable file is a CheckpointError naming it."""
    path = Path(directory) / MODEL_FILE
    if not path.exists():
        raise CheckpointError(f"{path}: missing")
    try:
        return load_file(str(path), device="cpu")
    except Exception as error:  # safetensors raises its own SafetensorError, or OSError
        raise CheckpointError(f"{path}: unreadable ({type(error).__name__}: {first_line(error)})") from None


def read_meta(directory: str | Path) -> dict[str, Any]:
    return read_json_object(Path(directory) / META_FILE)


def non_finite_parameters(model: torch.nn.Module) -> list[str]:
    """Names of parameters holding NaN or inf; under FSDP2 each process checks its own shards (no gather)."""
    poisoned = []
    for name, parameter in model.named_parameters():
        local = parameter.to_local() if hasattr(parameter, "to_local") else parameter
        if local.is_floating_point() and not bool(torch.isfinite(local.detach()).all()):
            poisoned.append(name)
    return poisoned


def restore(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    model_state: dict[str, torch.Tensor],
    optim_state: dict[str, Any],
) -> None:
    """Load full model and optimizer state into a (possibly sharded or wrapped) model on every process."""
    options = StateDictOptions(full_state_dict=True, strict=True)
    set_state_dict(
        model, optimizer, model_state_dict=model_state, optim_state_dict=optim_state, options=options
    )


def load_for_resume(
    directory: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    loader: Any,
    tokenizer_hash: str | None = None,
) -> dict[str, Any]:
    """Check a checkpoint whole (digests, fields, finite weights, and the tokenizer when ``tokenizer_hash`` is
    given), then restore the model, optimizer, random generators and loader from it; returns the train state.
    A damaged checkpoint is a CheckpointError naming the file; another tokenizer is a plain ValueError."""
    verify_digests(directory)
    meta = read_meta(directory)
    if tokenizer_hash is not None and meta.get("tokenizer_hash") != tokenizer_hash:
        raise ValueError(
            f"--resume: {directory / META_FILE}: the checkpoint's tokenizer {meta.get('tokenizer_hash')!r} "
            f"differs from the dataset's {tokenizer_hash!r}"
        )
    state = load_train_state(directory)
    if is_sharded(directory):
        restore_sharded(directory, model, optimizer, state)
    else:
        restore_full(directory, model, optimizer, state)
    path = directory / TRAIN_STATE_FILE
    try:
        set_rng_state(state["rng"])
    except Exception as error:
        raise CheckpointError(
            f"{path}: field 'rng' is not a set of generator states ({first_line(error)})"
        ) from None
    try:
        loader.load_state_dict(state["loader"])
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as error:
        raise CheckpointError(f"{path}: field 'loader' does not fit this run ({first_line(error)})") from None
    return state


def restore_sharded(
    directory: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]
) -> None:
    """Each process reads its own shards of the model and optimizer (the files' digests are already checked)."""
    check_loader_state(state["loader"], directory / TRAIN_STATE_FILE)
    try:
        sharded.load_sharded(directory, model, optimizer)
    except Exception as error:
        raise CheckpointError(
            f"{directory / SHARDED_DIR}: does not fit this model and optimizer "
            f"({type(error).__name__}: {first_line(error)})"
        ) from None
    poisoned = non_finite_parameters(model)
    if poisoned:
        raise CheckpointError(
            f"{directory / SHARDED_DIR}: non-finite weights (NaN or inf) in {', '.join(poisoned[:3])}"
        )


def restore_full(
    directory: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]
) -> None:
    """model.safetensors and the optimizer in train_state.pt, checked against the model before loading."""
    # names, shapes and dtypes from the header first: weights re-saved in another dtype are refused, not cast
    check_weights_header(
        directory / MODEL_FILE, expected_tensors(get_model_state_dict(model)), directory / CONFIG_FILE
    )
    model_state = load_model_state(directory)
    expected = expected_shapes(model)
    check_model_state(model_state, expected, directory / MODEL_FILE)
    path = directory / TRAIN_STATE_FILE
    check_optimizer_state(state, expected, optimizer, path)
    check_loader_state(state["loader"], path)
    check_finite(model_state, directory / MODEL_FILE)
    try:
        restore(model, optimizer, model_state, state["optimizer"])
    except Exception as error:
        raise CheckpointError(
            f"{directory / MODEL_FILE} / {TRAIN_STATE_FILE}: do not fit this model and optimizer "
            f"({type(error).__name__}: {first_line(error)})"
        ) from None


def load_newest(
    run_dir: str | Path, load: Callable[[Path], T]
) -> tuple[Path, T, list[tuple[Path, CheckpointError]]] | None:
    """``load`` the newest complete checkpoint for which it raises no CheckpointError, walking back from the
    newest: (that checkpoint, what ``load`` returned, the (checkpoint, error) pairs skipped on the way).
    None when the run has no checkpoint; a CheckpointError naming each one when none loads."""
    skipped: list[tuple[Path, CheckpointError]] = []
    for checkpoint in reversed(complete_checkpoints(run_dir)):
        try:
            return checkpoint, load(checkpoint), skipped
        except CheckpointError as error:
            skipped.append((checkpoint, error))
    if not skipped:
        return None
    reasons = "\n".join(f"  {checkpoint.name}: {error}" for checkpoint, error in skipped)
    raise CheckpointError(f"no checkpoint in {Path(run_dir) / CHECKPOINTS_DIR} can be loaded:\n{reasons}")


def expected_shapes(model: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    """Name -> full shape of every tensor the model's state holds, under the names checkpoints use (no
    wrapper prefixes). Reads the (possibly sharded) state without gathering it: DTensors know their shape."""
    return {name: tuple(tensor.shape) for name, tensor in get_model_state_dict(model).items()}


def check_model_state(
    state: dict[str, torch.Tensor], expected: dict[str, tuple[int, ...]], path: Path
) -> None:
    """The weights must be exactly the model's tensors, each of the model's shape."""
    missing, unexpected = sorted(expected.keys() - state.keys()), sorted(state.keys() - expected.keys())
    if missing or unexpected:
        raise CheckpointError(
            f"{path}: does not hold this model's tensors"
            + (f"; missing {', '.join(missing[:3])}" if missing else "")
            + (f"; unexpected {', '.join(unexpected[:3])}" if unexpected else "")
        )
    for name, shape in expected.items():
        if tuple(state[name].shape) != shape:
            raise CheckpointError(
                f"{path}: {name} has shape {tuple(state[name].shape)}, the model's is {shape}"
            )


def check_optimizer_state(
    train_state: dict[str, Any],
    expected: dict[str, tuple[int, ...]],
    optimizer: torch.optim.Optimizer,
    path: Path,
) -> None:
    """The optimizer state must cover this optimizer's parameters (by name), with moments of their shapes:
    set_state_dict accepts less, and the run would go on with reset moments or fail steps later."""
    optim = train_state["optimizer"]
    groups, per_param = optim.get("param_groups"), optim.get("state")
    if not isinstance(groups, list) or not isinstance(per_param, dict):
        raise CheckpointError(f"{path}: field 'optimizer' lacks its 'state' or 'param_groups'")
    if len(groups) != len(optimizer.param_groups) or not all(
        isinstance(g, dict) and isinstance(g.get("params"), list) for g in groups
    ):
        raise CheckpointError(f"{path}: the optimizer's parameter groups do not match this run's")
    names = [name for group in groups for name in group["params"]]
    if (
        len(names) != sum(len(g["params"]) for g in optimizer.param_groups)
        or not set(names) <= expected.keys()
    ):
        raise CheckpointError(f"{path}: the optimizer's parameters are not this model's")
    updated = train_state["step"] > train_state.get("skipped_steps", 0)
    for name in names:
        moments = per_param.get(name)
        if moments is None:
            if updated:
                raise CheckpointError(f"{path}: no optimizer state for {name}")
            continue
        if not isinstance(moments, dict):
            raise CheckpointError(f"{path}: optimizer state of {name} is not a mapping")
        for key, value in moments.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0 and tuple(value.shape) != expected[name]:
                raise CheckpointError(
                    f"{path}: optimizer {key} of {name} has shape {tuple(value.shape)}, the parameter's is "
                    f"{expected[name]}"
                )


LOADER_FIELDS = ("seq_len", "seed", "world_size", "batch_size", "position")


def check_loader_state(state: dict[str, Any], path: Path) -> None:
    for name in LOADER_FIELDS:
        value = state.get(name)
        if (
            not isinstance(value, int)
            or isinstance(value, bool)
            or value < (1 if name in ("world_size", "batch_size", "seq_len") else 0)
        ):
            raise CheckpointError(
                f"{path}: loader field {name!r} should be a non-negative count, found {value!r}"
            )


def set_aside(checkpoint: Path) -> Path:
    """Move a damaged checkpoint out of the ``step_*`` set (so pruning never counts it as a kept checkpoint)
    and keep it for inspection; returns where it went."""
    target = checkpoint.with_name(f"{DAMAGED_PREFIX}{checkpoint.name}")
    shutil.rmtree(target, ignore_errors=True)
    checkpoint.rename(target)
    return target
