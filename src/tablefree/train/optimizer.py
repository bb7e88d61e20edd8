"""The optimizer of a run: AdamW with weight decay on matrices only, fused where that is safe, else foreach."""

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
    implementation, _ = adamw_implementation(decay + no_decay)
    return torch.optim.AdamW(groups, lr=optim.lr, betas=tuple(optim.betas), eps=optim.eps, **implementation)


def adamw_implementation(params: list[torch.Tensor]) -> tuple[dict[str, bool], str]:
    """AdamW's keyword arguments for ``params``, and why. Fused (one kernel over all tensors, and the only path
    that skips a non-finite update on the device) on CUDA and for fp32 CPU parameters; FSDP2's sharded
    parameters under gloo take the same path as on GPUs, so its tests rehearse the device-side skip there.
    Elsewhere, and where fused leaks, foreach (multi-tensor kernels): ``fused=False`` alone would also turn
    torch's own foreach choice off and leave the per-tensor Python loop. Over FSDP2 shards on torch 2.12 foreach
    grows DTensor's sharding cache every step too, so only the per-tensor loop is left there."""
    on_cuda = any(p.device.type == "cuda" for p in params)
    fp32_cpu = all(p.dtype == torch.float32 and p.device.type == "cpu" for p in params)
    sharded = any(hasattr(p, "full_tensor") for p in params)  # DTensor shards under FSDP2
    version = torch.__version__.split("+")[0]
    if not fused_adamw_is_safe(sharded, torch.__version__):
        if foreach_grows_over_dtensors(torch.__version__):
            return {"fused": False, "foreach": False}, (
                f"over FSDP2 shards on torch {version} fused AdamW leaks host memory and foreach grows DTensor's "
                "sharding cache every step"
            )
        return {
            "fused": False,
            "foreach": True,
        }, f"fused AdamW leaks host memory over FSDP2 shards on torch {version}"
    if not (on_cuda or fp32_cpu):
        return {"fused": False, "foreach": True}, "fused needs CUDA or fp32 CPU parameters"
    return {"fused": True}, "one kernel over all tensors; a non-finite step is skipped on the device"


def foreach_grows_over_dtensors(torch_version: str) -> bool:
    """True on torch 2.12, where AdamW's foreach ops over DTensors miss DTensor's sharding-propagation cache and
    add entries every step (NVIDIA-NeMo/Automodel#2888; the cache key held the step-varying scalars,
    pytorch/pytorch#178276). On 2.10-2.11 the foreach path stays flat (pytorch/pytorch#188174)."""
    major, minor = (int(part) for part in torch_version.split("+")[0].split(".")[:2])
    return (major, minor) == (2, 12)


def reapply_implementation(optimizer: torch.optim.Optimizer) -> None:
    """Set the AdamW path chosen for this process again after a state dict was loaded: a saved state carries its
    own ``fused``/``foreach`` flags in the param groups, so a run saved where fused was safe would otherwise take
    the leaking fused path when resumed under FSDP2 on torch 2.10-2.12 (or fail, fused on fp64 parameters)."""
    implementation, _ = adamw_implementation([p for g in optimizer.param_groups for p in g["params"]])
    for group in optimizer.param_groups:
        group["fused"] = implementation.get("fused", False)
        group["foreach"] = implementation.get("foreach", False)


def describe_optimizer(optimizer: torch.optim.Optimizer) -> str:
    """The AdamW path the steps take (read from the param groups), and why it was chosen."""
    groups = optimizer.param_groups
    path = (
        "fused"
        if all(g.get("fused") for g in groups)
        else "foreach"
        if all(g.get("foreach") for g in groups)
        else "per-tensor loop"
    )
    _, reason = adamw_implementation([p for g in groups for p in g["params"]])
    return f"AdamW {path} ({reason})"


def fused_adamw_is_safe(sharded: bool, torch_version: str) -> bool:
    """False where the fused AdamW leaks host memory: over DTensor (FSDP2) parameters in torch 2.10-2.12 it keeps
    one DTensorSpec per parameter tensor per step (pytorch/pytorch#188174, #181761; torchtitan#3790: tens of GB
    over a long run). Not seen in 2.13. Those runs use the foreach path (``adamw_implementation``)."""
    major, minor = (int(part) for part in torch_version.split("+")[0].split(".")[:2])
    return not (sharded and (2, 10) <= (major, minor) < (2, 13))
