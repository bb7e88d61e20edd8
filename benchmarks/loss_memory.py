"""Peak memory of the loss at V = 49,152: the whole logits tensor (``next_token_loss`` of the head's output, what
training did before) against the chunked loss (``chunked_next_token_loss``, what it does now), forward and
backward, in fp32 and in bf16 (autocast, fp32 weights), for the tensors the loss makes beyond its inputs.

The peak is ``torch.distributed._tools.mem_tracker.MemTracker``'s (every tensor storage allocated inside, freed
when its last reference goes; the hidden states and the head's weight are tracked as external, so they are in
the total). ``--fake`` runs the same under ``FakeTensorMode``: nothing is computed or allocated, so it gives the
peak at the real shape (8 × 2048 tokens, d = 2048) in seconds; the default measures real tensors at a shape a
CPU computes in a minute (d does not change the logits' size).

    python benchmarks/loss_memory.py                                  # real tensors: 8192 tokens, d = 64
    python benchmarks/loss_memory.py --fake --tokens 16384 --d-model 2048   # paper-1.7b at micro-batch 8
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.mem_tracker import MemTracker

from tablefree.model import chunked_next_token_loss, loss_chunk_tokens, next_token_loss

GiB = 2**30


def peak_bytes(chunked: bool, tokens: int, d_model: int, vocab: int, bf16: bool, fake: bool) -> dict:
    """The loss's forward and backward once; its peak tracked memory in bytes and its wall time."""
    with FakeTensorMode() if fake else contextlib.nullcontext():
        generator = None if fake else torch.Generator().manual_seed(0)
        hidden = torch.randn(1, tokens, d_model, generator=generator, requires_grad=True)
        weight = (torch.randn(vocab, d_model, generator=generator) * 0.02).requires_grad_()
        targets = torch.randint(0, vocab, (1, tokens), generator=generator)
        tracker = MemTracker()
        tracker.track_external(hidden, weight)
        start = time.perf_counter()
        with tracker, torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            if chunked:
                loss = chunked_next_token_loss(hidden, weight, targets)
            else:
                loss = next_token_loss(F.linear(hidden, weight), targets)
            loss.backward()
        seconds = time.perf_counter() - start
    peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]
    inputs = 4 * (tokens * d_model + vocab * d_model)
    return {"peak_bytes": peak, "beyond_inputs_bytes": peak - inputs, "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8192, help="tokens in the batch (B × T)")
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=49_152)
    parser.add_argument("--fake", action="store_true", help="under FakeTensorMode: nothing computed")
    parser.add_argument("--json", default=None, help="also write the rows here")
    args = parser.parse_args()
    rows = []
    print(
        f"V={args.vocab} tokens={args.tokens} d={args.d_model} chunk={loss_chunk_tokens(args.vocab)} tokens "
        f"fake={args.fake} threads={torch.get_num_threads()} load={os.getloadavg()[0]:.1f} torch={torch.__version__}"
    )
    print(f"whole fp32 logits: {4 * args.tokens * args.vocab / GiB:.3f} GiB")
    for bf16 in (False, True):
        for chunked in (False, True):
            row = {
                "loss": "chunked" if chunked else "whole logits",
                "precision": "bf16 autocast" if bf16 else "fp32",
            }
            row.update(peak_bytes(chunked, args.tokens, args.d_model, args.vocab, bf16, args.fake))
            rows.append(row)
            print(
                f"{row['precision']:>13}  {row['loss']:>12}: peak {row['peak_bytes'] / GiB:7.3f} GiB, beyond the "
                f"inputs {row['beyond_inputs_bytes'] / GiB:7.3f} GiB ({row['seconds']:.1f} s)"
            )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"args": vars(args), "rows": rows}, handle, indent=2)


if __name__ == "__main__":
    main()
