"""Run under torchrun by tests/test_parallelize.py: build on the meta device, shard with FSDP2, materialise,
and write the gathered full weights and buffers (rank 0) for the test to compare with an unsharded build."""

from __future__ import annotations

import sys

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from tablefree import build_model
from tablefree.model_config import preset
from tablefree.train.parallelize import destroy_distributed, init_distributed, parallelize, unwrapped_name


def main(out_path: str, interface: str, seed: int) -> None:
    info = init_distributed("cpu", force_process_group=True)
    config = preset("tiny", interface=interface, n_layers=2, d_model=64, n_heads=2, d_ff=96, vocab_size=1001)
    model = build_model(config, seed=seed, device="meta")
    model = parallelize(model, info, parallel="fsdp", activation_checkpointing=True, seed=seed)
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    weights = get_model_state_dict(model, options=options)
    buffers = {unwrapped_name(name): b.clone() for name, b in model.named_buffers()}
    if info.is_main:
        torch.save({"weights": weights, "buffers": buffers}, out_path)
    destroy_distributed()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
