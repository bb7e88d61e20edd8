"""The optimizer of a run: AdamW with weight decay on matrices only, fused where that is safe."""

from __future__ import annotations

import torch

from tablefree.train.recipe import TrainConfig


def build_optimizer(model: torch.nn.Module, config: TrainConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only: not on norm gains (1-D), nor on the learned input table
    unless ``optim.decay_embeddings``. Call after ``parallelize`` (FSDP2 replaces the parameters)."""
    optim = config.optim
    table = {id(p) for p in model.input.parameters()} if hasattr(model, "input") else set()
    decay, no_decay = [], []
    for parameter in model.parameters():
        if not parameter.requires_grad:
            continue
        is_table = id(parameter) in table
        if parameter.dim() >= 2 and (optim.decay_embeddings or not is_table):
            decay.append(parameter)
        else:
            no_decay.append(parameter)
    groups = [
        {"params": decay, "weight_decay": optim.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    # Fused (one kernel over all tensors) on CUDA, and on the CPU for fp32 parameters, where it is much faster
    # than the default per-tensor loop (docs/benchmarks.md). FSDP2's sharded parameters under gloo take the same
    # path as on GPUs, so its tests rehearse the device-side skip there.
    params = decay + no_decay
    on_cuda = any(p.device.type == "cuda" for p in params)
    fp32_cpu = all(p.dtype == torch.float32 and p.device.type == "cpu" for p in params)
    sharded = any(hasattr(p, "full_tensor") for p in params)  # DTensor shards under FSDP2
    fused = (on_cuda or fp32_cpu) and fused_adamw_is_safe(sharded, torch.__version__)
    return torch.optim.AdamW(groups, lr=optim.lr, betas=tuple(optim.betas), eps=optim.eps, fused=fused)


def fused_adamw_is_safe(sharded: bool, torch_version: str) -> bool:
    """False where the fused AdamW leaks host memory: over DTensor (FSDP2) parameters in torch 2.10-2.12 it keeps
    one DTensorSpec per parameter tensor per step (pytorch/pytorch#188174, #181761; torchtitan#3790: tens of GB
    over a long run). Not seen in 2.13. Those runs use the per-tensor loop, and read the non-finite flag each step."""
    major, minor = (int(part) for part in torch_version.split("+")[0].split(".")[:2])
    return not (sharded and (2, 10) <= (major, minor) < (2, 13))
