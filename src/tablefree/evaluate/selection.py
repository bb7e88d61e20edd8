"""The selection split: the training windows a run set aside (``data.select_every``), scored after training.

A learning-rate grid picks each interface's rate on this loss, never on the validation split that gives the
verdict, so the choice and the comparison use disjoint text. The windows are the training loader's own
(``TokenLoader(..., holdout_every=k, heldout=True)``), read in order, each scored once.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from tablefree.data.loader import TokenLoader

# The least selection split a rate is chosen on. Tokens within a window share text, so the window is the unit
# that varies, and a mean over few of them follows the passages drawn more than the rate: over 32 windows the t
# quantile of an interval is 4% above its large-sample value (t_31 = 2.04 against 1.96), over 8 it is 20% above
# (t_7 = 2.36). The token floor, 32 windows of the tiny recipe's 256 tokens, keeps short windows from counting
# as much text as long ones.
MIN_SELECTION_WINDOWS = 32
MIN_SELECTION_TOKENS = 8192


def selection_split_shortfall(windows: int, tokens: int) -> str | None:
    """Why a selection split of ``windows`` windows and ``tokens`` tokens is too small to choose a rate on
    (None when it is not): the minimum it misses."""
    missing = []
    if windows < MIN_SELECTION_WINDOWS:
        missing.append(f"{windows:,} windows, fewer than {MIN_SELECTION_WINDOWS}")
    if tokens < MIN_SELECTION_TOKENS:
        missing.append(f"{tokens:,} tokens, fewer than {MIN_SELECTION_TOKENS:,}")
    return "; ".join(missing) or None


@torch.inference_mode()
def selection_metrics(
    model: torch.nn.Module, data_dir: str, seq_len: int, select_every: int, batch_size: int = 32
) -> dict:
    """``{"selection_loss", "windows", "tokens", "select_every"}``: the mean next-token loss (nats/token) over
    every window that training with ``data.select_every=select_every`` held out of ``data_dir``'s train split."""
    loader = TokenLoader.from_dir(
        data_dir,
        "train",
        seq_len=seq_len,
        batch_size=batch_size,
        shuffle=False,
        holdout_every=select_every,
        heldout=True,
    )
    device = next(model.parameters()).device
    windows = loader.num_chunks
    total = 0.0
    for step in range(math.ceil(windows / batch_size)):
        inputs, targets = loader.batch(step)
        keep = min(batch_size, windows - step * batch_size)  # the last batch wraps around: drop the repeats
        logits = model(inputs[:keep].to(device))
        total += float(
            F.cross_entropy(
                logits.float().flatten(0, 1), targets[:keep].to(device).flatten(), reduction="sum"
            )
        )
    tokens = windows * seq_len
    return {
        "selection_loss": total / tokens,
        "windows": windows,
        "tokens": tokens,
        "select_every": select_every,
        "data_dir": str(data_dir),
    }
