"""The in-training validation estimate: ``Validator`` decides when (``should_validate``) and computes it
(``estimate``) over ``windows`` windows spread over the val split.

The estimate is named ``val_loss_estimate`` everywhere (``train.metrics``): the evaluation over the whole
validation split (``tablefree eval``) is a different number.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import torch

from tablefree.data.loader import Dataset, TokenLoader
from tablefree.train.parallelize import DistInfo, all_reduce_mean
from tablefree.train.recipe import Plan, TrainConfig


class Validator:
    """When and over what the run estimates its validation loss: every ``val_every`` steps before the last
    (``val_every: 0``: never during the run; the trainer validates once at the end), over ``val_batches ×
    micro_batch`` windows at most. Built once; ``estimate`` takes the model as it is now."""

    def __init__(
        self,
        dataset: Dataset,
        config: TrainConfig,
        run_plan: Plan,
        info: DistInfo,
        model: torch.nn.Module,
        autocast: Any,
    ) -> None:
        self.every, self.batches = config.val_every, config.val_batches
        self.total_steps = run_plan.total_steps
        self.model, self.autocast, self.device = model, autocast, info.device
        # The windows are spread over the whole val split by a fixed permutation (seed 0, the same for every run,
        # so runs stay paired), not its first windows: those fall in one or two documents.
        self.loader = dataset.loader(
            "val",
            run_plan.seq_len,
            config.micro_batch,
            shuffle=True,
            seed=0,
            rank=info.rank,
            world_size=info.world_size,
        )
        self.windows = min(config.val_batches * config.micro_batch, self.loader.num_chunks)

    def should_validate(self, step: int) -> bool:
        """An estimate after this step: every ``val_every`` steps, but not at the last (the end validates)."""
        return bool(self.every and step % self.every == 0 and step < self.total_steps)

    def estimate(self) -> float:
        """The validation-loss estimate of the model now (a collective: every process calls it)."""
        with eager_for_validation():
            return validation_loss(self.model, self.loader, self.batches, self.device, self.autocast)


@torch.no_grad()
def validation_loss(
    model: torch.nn.Module,
    loader: TokenLoader,
    val_batches: int,
    device: torch.device,
    autocast: Any,
) -> float:
    """Mean loss over ``val_batches × micro_batch`` windows of the val split (the loader's order), whatever the world
    size (each process takes its slots; padding slots beyond the set are masked out)."""
    total = min(val_batches * loader.batch_size, loader.num_chunks)
    micro_steps = math.ceil(total / (loader.batch_size * loader.world_size))
    sums = torch.zeros(2, device=device, dtype=torch.float64)  # (sum of per-window losses, windows)
    model.eval()
    for micro_step in range(micro_steps):
        inputs, targets = loader.batch(micro_step)
        keep = torch.from_numpy(loader.slots(micro_step) < total).to(device)
        with autocast:  # the chunked loss: the whole batch's fp32 logits never exist
            per_token = model(inputs.to(device), targets=targets.to(device), reduction="none")
        per_window = per_token.mean(dim=1).double()
        sums += torch.stack([(per_window * keep).sum(), keep.sum().double()])
    model.train()
    sums = all_reduce_mean(sums)  # mean of sums = sums / world; the ratio is unchanged
    return float(sums[0] / sums[1])


def eager_for_validation() -> contextlib.AbstractContextManager:
    """Compiled blocks run eagerly inside: under no_grad a compiled block fails its grad-mode guard and compiles
    a second graph, so a run would compile twice for a few validation batches (torch >= 2.6; older torches
    recompile)."""
    set_stance = getattr(torch.compiler, "set_stance", None)
    return set_stance("force_eager") if set_stance is not None else contextlib.nullcontext()
