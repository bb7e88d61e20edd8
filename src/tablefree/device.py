"""``resolve_device``: a requested device (``auto``, ``cpu``, ``cuda``, ``cuda:1``, ``mps``) as a torch.device.

Training (``train.parallelize.init_distributed``, with torchrun's local rank), model loading
(``checkpoint.model_dir.load_model``), the lm-eval adapter (falling back to the CPU) and ``tablefree hardware``
call this one function, so ``auto`` and an absent backend mean the same everywhere.
"""

from __future__ import annotations

import logging

import torch

logger = logging.getLogger(__name__)


def resolve_device(
    requested: str | torch.device | None = "auto",
    *,
    local_rank: int | None = None,
    fallback_to_cpu: bool = False,
) -> torch.device:
    """``requested`` as a torch.device.

    ``auto`` (or None): CUDA when available, else the CPU. ``local_rank`` picks the GPU of a torchrun process
    when the request names none (``cuda`` becomes ``cuda:LOCAL_RANK``). A malformed name, or a backend absent on
    this machine, is a ValueError naming the device (not a deep torch traceback); with ``fallback_to_cpu`` an
    absent backend is a logged warning and the CPU instead (lm-eval's ``hf`` backend behaves so).
    """
    if requested is None or requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(requested)
    except (RuntimeError, TypeError):
        raise ValueError(f"device {requested!r}: not a torch device (e.g. cpu, cuda, cuda:1, mps)") from None
    available = {"cuda": torch.cuda.is_available, "mps": torch.backends.mps.is_available}
    if device.type in available and not available[device.type]():
        if fallback_to_cpu:
            logger.warning(
                "device %r requested but %s is not available; using the CPU", str(requested), device.type
            )
            return torch.device("cpu")
        name = "CUDA" if device.type == "cuda" else "MPS"
        raise ValueError(f"device {device}: {name} is not available on this machine (use cpu)")
    if device.type == "cuda" and device.index is None and local_rank is not None:
        device = torch.device("cuda", local_rank)
    return device
