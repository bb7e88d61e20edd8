"""Distributed setup and the ``parallelize`` step: DDP or FSDP2, torch.compile and activation checkpointing,
all applied from outside the model (as torchtitan does), so ``tablefree.model`` never knows about them.

Launch under ``torchrun`` (or ``python -m torch.distributed.run``): the process group is initialised from
its environment variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), with NCCL on GPUs and
gloo on CPUs. Without those variables the run is a single process.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.nn.parallel import DistributedDataParallel

from tablefree.device import resolve_device

try:  # FSDP2 moved from the _composable namespace to torch.distributed.fsdp in torch 2.6
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
except ImportError:  # torch 2.4 / 2.5
    from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard

try:  # public DTensor API since torch 2.5
    from torch.distributed.tensor import DTensor, distribute_tensor
except ImportError:  # torch 2.4
    from torch.distributed._tensor import DTensor, distribute_tensor

# Wrappers that parallelize() puts around blocks add these to parameter names; init seeds use the plain names.
WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.")


@dataclass(frozen=True)
class DistInfo:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return dist.is_available() and dist.is_initialized()


def init_distributed(requested_device: str = "auto", force_process_group: bool = False) -> DistInfo:
    """Initialise the process group from torchrun's environment (or do nothing for a single process).

    ``force_process_group`` makes a one-process group, which FSDP2 needs even on a single device.
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    device = resolve_device(requested_device, local_rank=local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if (world_size > 1 or force_process_group) and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        rendezvous: dict = {}
        if world_size == 1 and "MASTER_PORT" not in os.environ:
            # a private single-process group: an in-memory store, no port that another process could take first
            rendezvous = {"store": dist.HashStore(), "rank": 0, "world_size": 1}
        if device.type == "cuda":
            dist.init_process_group(backend, device_id=device, **rendezvous)
        else:
            dist.init_process_group(backend, **rendezvous)
    return DistInfo(rank=rank, local_rank=local_rank, world_size=world_size, device=device)


def parallelize(
    model: nn.Module,
    info: DistInfo,
    *,
    parallel: str = "ddp",
    compile: bool = False,
    activation_checkpointing: bool = False,
    param_dtype: torch.dtype | None = None,
    seed: int = 0,
) -> nn.Module:
    """Apply activation checkpointing, compile, then DDP or FSDP2, in that order (torchtitan's order).

    Returns the module to call for training. With FSDP2 the model is sharded in place and returned as is;
    with DDP (world size > 1) it is wrapped. ``param_dtype`` is FSDP2's compute dtype (bf16 mixed precision,
    gradients reduced in fp32); with DDP or one process, mixed precision is autocast's job instead.

    A model built on the meta device (``build_model(..., device="meta")``, what the trainer does for FSDP2) is
    materialised here, after sharding: each rank allocates only its shards on ``info.device`` and fills them
    with the weights an unsharded ``build_model(config, seed)`` on that device would have (``materialize``).
    """
    blocks = model.layers
    if activation_checkpointing:
        for index, block in enumerate(blocks):
            blocks[index] = checkpoint_wrapper(block, preserve_rng_state=False)
    if compile:
        # Per block, like torchtitan: every block has the same graph, so it compiles once and is reused.
        for block in blocks:
            block.compile()
    if parallel == "fsdp":
        policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
        for block in blocks:
            fully_shard(block, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
        if is_on_meta(model):
            materialize(model, info.device, seed)
        return model
    if is_on_meta(model):
        materialize(model, info.device, seed)
    if info.world_size > 1:
        device_ids = [info.device.index] if info.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=device_ids)
    return model


def is_on_meta(model: nn.Module) -> bool:
    return any(p.device.type == "meta" for p in model.parameters())


@torch.no_grad()
def materialize(model: nn.Module, device: torch.device, seed: int) -> None:
    """Allocate a meta-device model's parameters and buffers on ``device`` (only the local shards of FSDP2's
    DTensor parameters) and initialise them as ``build_model(config, seed, device)`` would.

    Each full parameter is drawn by the model's own ``init_tensor`` (per-name seeded, so the same on every rank)
    and each rank keeps its shard of it: one full tensor at a time is ever allocated (the largest is the V×d
    head). The fixed buffers of the input interface are recomputed from its options (``reset_fixed_state``).
    """
    model.to_empty(device=device)
    init_tensor = model.init_tensor
    for name, param in model.named_parameters():
        name = unwrapped_name(name)
        if isinstance(param, DTensor):
            full = torch.empty(param.shape, dtype=param.dtype, device=device)
            init_tensor(name, full, seed)
            param.to_local().copy_(local_shard(full, param))
        else:
            init_tensor(name, param, seed)
    model.input.reset_fixed_state()


def unwrapped_name(name: str) -> str:
    for prefix in WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


def local_shard(full: torch.Tensor, like: DTensor) -> torch.Tensor:
    """This rank's piece of ``full`` under ``like``'s mesh and placements (computed locally: every rank holds
    the same ``full``, so nothing is sent)."""
    try:
        return distribute_tensor(full, like.device_mesh, like.placements, src_data_rank=None).to_local()
    except TypeError:  # torch < 2.7 has no src_data_rank: scatter rank 0's copy (the same values)
        return distribute_tensor(full, like.device_mesh, like.placements).to_local()


def all_reduce_mean(value: torch.Tensor) -> torch.Tensor:
    """Mean over processes (a no-op for one process)."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        value = value.clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        value /= dist.get_world_size()
    return value


def any_rank(flag: bool, device: torch.device) -> bool:
    """True on every process when ``flag`` is true on any (so all agree to stop, save or raise)."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        tensor = torch.tensor([1.0 if flag else 0.0], device=device)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return bool(tensor.item() > 0)
    return flag


def barrier() -> None:
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def destroy_distributed() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
