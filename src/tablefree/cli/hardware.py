"""``tablefree hardware``: what ``precision: auto`` and ``compile: auto`` choose here, and the measured matmul
ceilings MFU is reported against (Python API: ``tablefree.hardware.peak_flops``,
``tablefree.precision.choose_precision``)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

import torch

from tablefree import cpu_threads, hardware
from tablefree.device import resolve_device
from tablefree.precision import auto_may_pick_bf16, choose_precision, compiler_available


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "hardware",
        help="the device's precision choice and measured matmul ceilings (cached per machine)",
        description="Show what precision: auto and compile: auto pick on this device and why, the CPU threading "
        "a run uses, and the measured matmul ceilings that training reports MFU against (fp32, and bf16 where "
        "precision: auto may pick it; cached in ~/.cache/tablefree/peak_flops.json, or "
        "$TABLEFREE_PEAK_FLOPS_CACHE, keeping the best figure measured). Python API: "
        "tablefree.hardware.peak_flops(device, dtype), tablefree.precision.choose_precision('auto', device).",
    )
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--threads", type=int, help="torch threads to measure with (default: torch's own)")
    parser.add_argument(
        "--remeasure", action="store_true", help="measure again (the cache still keeps the best figure)"
    )
    parser.add_argument(
        "--bf16",
        action="store_true",
        help="also measure the bf16 ceiling where precision: auto never picks bf16 (slow where bf16 is emulated)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"--threads: expected a positive number, got {args.threads}")
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device, local_rank=0)

    def progress(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    may_pick_bf16, bf16_detail = auto_may_pick_bf16(device)
    dtypes = [torch.float32] + ([torch.bfloat16] if may_pick_bf16 or args.bf16 else [])
    ceilings = [
        hardware.peak_flops(device, dtype, remeasure=args.remeasure, progress=progress) for dtype in dtypes
    ]
    bf16_skipped = (
        None
        if torch.bfloat16 in dtypes
        else f"not measured: precision: auto never picks bf16 here ({bf16_detail}); --bf16 measures it"
    )
    choice = choose_precision("auto", device)
    can_compile, compiler = compiler_available(device)
    if args.json:
        print(
            json.dumps(
                {
                    "device": hardware.device_name(device),
                    "threads": torch.get_num_threads(),
                    "threading": cpu_threads.threading_choice(),
                    "precision_auto": asdict(choice),
                    "compiler": {"available": can_compile, "detail": compiler},
                    "ceilings": [{**asdict(c), "under_load": hardware.under_load(c)} for c in ceilings],
                    "bf16_ceiling_skipped": bf16_skipped,
                },
                indent=2,
                allow_nan=False,
            )
        )
        return 0
    print(f"device: {hardware.device_name(device)}")
    print(f"threads: {cpu_threads.describe()}")
    for ceiling in ceilings:
        print(f"  {ceiling.dtype} matmul ceiling: {ceiling.describe()} ({ceiling.source})")
    if bf16_skipped:
        print(f"  bf16 matmul ceiling: {bf16_skipped}")
    print(f"precision: auto -> {choice.value} ({choice.reason})")
    print(f"compile: {'available' if can_compile else 'unavailable'} ({compiler})")
    print(f"cache: {hardware.cache_path()}")
    return 0
