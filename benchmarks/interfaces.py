"""The three input interfaces side by side: forward+backward time and peak memory of the input interface alone
and of the whole model, and the training-memory difference of dropping the V×d table.

    python benchmarks/interfaces.py                    # small preset, V=8192, batch 8 × 512, CPU
    python benchmarks/interfaces.py --device cuda --preset paper-1.7b --batch 4 --seq-len 2048

Time: median over ``--repeats`` runs after warm-up. Memory: on CUDA, ``max_memory_allocated`` above the
memory held before the measured call; on CPU, the peak resident-set growth sampled every 0.2 ms by a
background thread; the script re-executes itself with ``MALLOC_MMAP_THRESHOLD_=65536`` so glibc mmaps every
large tensor and returns it on free, and RSS follows tensor memory (figures are approximate). Optimizer-state memory is counted exactly from the tensors after one AdamW step: for a fixed
code the model lacks the table's parameters (4·V·d bytes in fp32), their gradients (4·V·d) and both Adam
moments (8·V·d), so the saving is 12·V·d bytes of gradients plus optimizer state, 16·V·d with the weights.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable

import torch

from tablefree.model import build_model
from tablefree.model_config import preset

INTERFACES = ("learned", "canonical", "affine")


def rss_bytes() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * 4096


def peak_memory(fn: Callable[[], object], device: torch.device) -> int:
    """Peak memory growth (bytes) while ``fn`` runs."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated(device) - before
    before, peak, done = rss_bytes(), [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss_bytes())
            time.sleep(0.0002)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    fn()
    done.set()
    thread.join()
    return max(0, max(peak[0], rss_bytes()) - before)


def median_time(fn: Callable[[], object], device: torch.device, repeats: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def training_state_bytes(model: torch.nn.Module) -> dict[str, int]:
    """Bytes of trainable parameters, their gradients and AdamW's state after one step."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, model.config.vocab_size, (1, 8), device=model.head.weight.device)
    model.loss(ids, ids).backward()
    optimizer.step()
    params = [p for p in model.parameters() if p.requires_grad]
    moments = [t for state in optimizer.state.values() for k, t in state.items() if k != "step"]
    return {
        "params": sum(p.numel() * p.element_size() for p in params),
        "grads": sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None),
        "adam_moments": sum(t.numel() * t.element_size() for t in moments),
    }


def main() -> None:
    if os.environ.get("MALLOC_MMAP_THRESHOLD_") is None:  # a fixed threshold: freed tensors leave the RSS
        os.execve(
            sys.executable, [sys.executable, *sys.argv], {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
        )
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="small")
    parser.add_argument("--vocab", type=int, default=None, help="default: the preset's")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)

    overrides = {"vocab_size": args.vocab} if args.vocab else {}
    rows = []
    for name in INTERFACES:
        config = preset(args.preset, interface=name, max_seq_len=max(args.seq_len, 16), **overrides)
        model = build_model(config, seed=0, device=device).to(dtype)
        ids = torch.randint(0, config.vocab_size, (args.batch, args.seq_len), device=device)
        grad_out = torch.randn(args.batch, args.seq_len, config.d_model, device=device, dtype=dtype)

        def interface_step(model=model, ids=ids, grad_out=grad_out) -> None:
            out = model.input(ids)
            if out.requires_grad:  # the learned table gets a gradient; fixed codes have nothing to train
                out.backward(grad_out.to(out.dtype))
                model.zero_grad(set_to_none=True)

        def model_step(model=model, ids=ids) -> None:
            model.loss(ids, ids).backward()
            model.zero_grad(set_to_none=True)

        row = {
            "interface": name,
            "input_s": median_time(interface_step, device, args.repeats),
            "input_peak_mb": peak_memory(interface_step, device) / 1e6,
            "model_s": median_time(model_step, device, args.repeats),
            "model_peak_mb": peak_memory(model_step, device) / 1e6,
        }
        state = training_state_bytes(build_model(config, seed=0, device=device))
        row.update({f"{k}_mb": v / 1e6 for k, v in state.items()})
        row["grads_plus_adam_mb"] = (state["grads"] + state["adam_moments"]) / 1e6
        rows.append(row)
        del model

    tokens = args.batch * args.seq_len
    print(
        f"{args.preset} (V={config.vocab_size}, d={config.d_model}), batch {args.batch} × {args.seq_len}, {device}, {args.dtype}"
    )
    print(
        f"{'interface':<10} {'input fwd+bwd':>14} {'input peak':>11} {'model fwd+bwd':>14} {'model tok/s':>12} {'model peak':>11} {'grads+Adam':>11} {'params':>9}"
    )
    for r in rows:
        print(
            f"{r['interface']:<10} {1e3 * r['input_s']:>11.2f} ms {r['input_peak_mb']:>8.1f} MB "
            f"{1e3 * r['model_s']:>11.1f} ms {tokens / r['model_s']:>12.0f} {r['model_peak_mb']:>8.1f} MB "
            f"{r['grads_plus_adam_mb']:>8.2f} MB {r['params_mb']:>6.2f} MB"
        )
    learned, canonical = rows[0], rows[1]
    expected = 12 * config.vocab_size * config.d_model / 1e6
    saved = learned["grads_plus_adam_mb"] - canonical["grads_plus_adam_mb"]
    print(
        f"grads + Adam state saved by a fixed code: {saved:.2f} MB (12·V·d = {expected:.2f} MB); "
        f"with the weights: {saved + learned['params_mb'] - canonical['params_mb']:.2f} MB (16·V·d = {16 * config.vocab_size * config.d_model / 1e6:.2f} MB)"
    )


if __name__ == "__main__":
    main()
