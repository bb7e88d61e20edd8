"""``TrainState``: everything the training loop carries from step to step (torchtitan's ``TrainState``), and
``NonFiniteLossError``, how the loop and the checkpointer stop a run whose numbers went NaN or infinite."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import torch

from tablefree.checkpoint.layout import CheckpointError
from tablefree.compat import train_state_keys


class NonFiniteLossError(ValueError):
    """The training loss or gradient norm became NaN or infinite, and the run stopped before updating the
    model; or the weights did, and no checkpoint was written."""

    def __init__(self, message: str, stop_reason: str = "non-finite loss") -> None:
        super().__init__(message)
        self.stop_reason = stop_reason


@dataclass
class PendingStep:
    """A step whose loss and gradient norm are still on the device: they are read for a batch of steps at once
    (``Trainer.read_steps``), so the hot loop does not wait for the device every step."""

    step: int
    tokens: int
    loss: torch.Tensor
    grad_norm: torch.Tensor
    lr: float
    seconds: float


@dataclass
class TrainState:
    """What the loop carries from step to step. The fields up to ``skipped_steps`` are what a checkpoint's
    ``train_state.pt`` restores besides the optimizer, the random generators and the loader position; the
    rest (``SAVED = False``) live only while the process runs."""

    step: int = 0  # optimizer steps done
    tokens_seen: int = 0
    wall_time_s: float = 0.0  # across resumes
    train_time_s: float = 0.0  # training steps only (no validation, no checkpointing), across resumes
    last_train_loss: float | None = None
    last_val_loss_estimate: float | None = None
    best_val_loss_estimate: float | None = None
    skipped_steps: int = 0  # updates skipped for a non-finite loss or gradient norm (on_nonfinite: skip)
    # not saved: steps whose numbers are still on the device, and the sticky non-finite flag (on_nonfinite: stop)
    pending: list[PendingStep] = field(default_factory=list, metadata={"saved": False})
    halted: torch.Tensor | None = field(default=None, metadata={"saved": False})

    @classmethod
    def saved_fields(cls) -> list[str]:
        return [f.name for f in fields(cls) if f.metadata.get("saved", True)]

    def state_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.saved_fields()}

    @classmethod
    def from_state_dict(cls, saved: dict[str, Any], where: str = "train state") -> TrainState:
        """The saved fields this version knows (``compat`` maps older names); a field of the wrong type is a
        CheckpointError naming ``where``."""
        saved = train_state_keys(saved)
        values = {name: saved[name] for name in cls.saved_fields() if name in saved}
        for name, value in values.items():
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            integer = name in ("step", "tokens_seen", "skipped_steps")
            if not (number and (not integer or isinstance(value, int))) and not (
                value is None and not integer
            ):
                raise CheckpointError(f"{where}: field {name!r} has the wrong type ({value!r})")
        return cls(**values)
