"""Run as a one-process gloo FSDP2 job by tests/test_adamw_paths.py: AdamW over DTensor shards on the path
``adamw_implementation`` picks for the torch version given (only the choice sees that version; the kernels are
this torch's), and the growth of live DTensorSpec objects between step 5 and step 25, printed as JSON."""

from __future__ import annotations

import gc
import json
import sys

import torch

from tablefree import build_model
from tablefree.model import next_token_loss
from tablefree.model_config import preset
from tablefree.train import optimizer as adamw
from tablefree.train.parallelize import destroy_distributed, init_distributed, parallelize


def live_specs() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o).__name__ == "DTensorSpec")


def main(torch_version: str) -> None:
    info = init_distributed("cpu", force_process_group=True)
    config = preset("tiny", n_layers=2, d_model=32, n_heads=2, d_ff=64, vocab_size=97, max_seq_len=16)
    model = parallelize(build_model(config, seed=0, device="meta"), info, parallel="fsdp", seed=0)
    params = list(model.parameters())
    real_version = torch.__version__
    torch.__version__ = torch_version  # what the choice reads
    implementation, reason = adamw.adamw_implementation(params)
    optimizer = torch.optim.AdamW(params, lr=1e-3, **implementation)
    path = adamw.describe_optimizer(optimizer)
    torch.__version__ = real_version
    generator = torch.Generator().manual_seed(0)
    counts = {}
    for step in range(1, 26):
        ids = torch.randint(0, 97, (2, 17), generator=generator)
        next_token_loss(model(ids[:, :-1]), ids[:, 1:]).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step in (5, 25):
            counts[step] = live_specs()
    dtensor_params = sum(hasattr(p, "full_tensor") for p in params)
    print(
        json.dumps(
            {
                "implementation": implementation,
                "describe": path,
                "reason": reason,
                "dtensor_params": dtensor_params,
                "spec_growth": counts[25] - counts[5],
            }
        )
    )
    destroy_distributed()


if __name__ == "__main__":
    main(sys.argv[1])
