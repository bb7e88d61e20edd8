"""Deliberate compatibility with files written by earlier versions: every old name still read, in one place.

Each entry says what was renamed; readers map old to new here and nowhere else.
"""

from __future__ import annotations

from typing import Any

# train_state.pt: the in-training validation estimate was ``val_loss`` before it was named apart from the
# evaluation's val_loss (keys ``schedule`` and ``world_size`` of older checkpoints are simply not read).
TRAIN_STATE_KEYS = {"last_val_loss": "last_val_loss_estimate", "best_val_loss": "best_val_loss_estimate"}
# metrics.jsonl and summary.json: the same rename; newest name first.
ESTIMATE_KEYS = ("val_loss_estimate", "val_loss")
FINAL_ESTIMATE_KEYS = ("final_val_loss_estimate", "final_val_loss")
# Interface options: an interface's own seed was ``affine_seed`` in ``affine`` and ``projected``.
INTERFACE_OPTION_KEYS = {"affine_seed": "seed"}


def train_state_keys(saved: dict[str, Any]) -> dict[str, Any]:
    """A saved train state with its keys under their current names."""
    return {TRAIN_STATE_KEYS.get(key, key): value for key, value in saved.items()}


def interface_option_keys(options: dict[str, Any], where: str) -> dict[str, Any]:
    """Interface options (a config's mapping) with old option names mapped to the current ones; an old and a
    new name given together with different values is an error naming both."""
    renamed = dict(options)
    for old, new in INTERFACE_OPTION_KEYS.items():
        if old not in renamed:
            continue
        value = renamed.pop(old)
        if new in renamed and renamed[new] != value:
            raise ValueError(
                f"{where}: {old!r} is the old name of {new!r}; give one of them ({old}={value!r}, "
                f"{new}={renamed[new]!r})"
            )
        renamed[new] = value
    return renamed
