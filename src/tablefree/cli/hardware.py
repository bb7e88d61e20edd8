"""``tablefree hardware``: what ``precision: auto`` and ``compile: auto`` choose here, and the measured matmul
ceilings MFU is reported against (Python API: ``tablefree.hardware.peak_flops``,
``tablefree.precision.choose_precision``)."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

import torch


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "hardware",
        help="the device's precision choice and measured matmul ceilings (cached per machine)",
        description="Show what precision: auto and compile: auto pick on this device and why, and the measured "
        "fp32 and bf16 matmul ceilings that training reports MFU against (cached in "
        "~/.cache/tablefree/peak_flops.json, or $TABLEFREE_PEAK_FLOPS_CACHE). Python API: "
        "tablefree.hardware.peak_flops(device, dtype), tablefree.precision.choose_precision('auto', device).",
    )
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--threads", type=int, help="torch threads to measure with (default: torch's own)")
    parser.add_argument("--remeasure", action="store_true", help="measure again instead of reading the cache")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tablefree import hardware
    from tablefree.device import resolve_device
    from tablefree.precision import choose_precision, compiler_available

    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"--threads: expected a positive number, got {args.threads}")
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device, local_rank=0)
    ceilings = [
        hardware.peak_flops(device, dtype, remeasure=args.remeasure)
        for dtype in (torch.float32, torch.bfloat16)
    ]
    choice = choose_precision("auto", device)
    can_compile, compiler = compiler_available(device)
    if args.json:
        print(
            json.dumps(
                {
                    "device": hardware.device_name(device),
                    "threads": torch.get_num_threads(),
                    "precision_auto": asdict(choice),
                    "compiler": {"available": can_compile, "detail": compiler},
                    "ceilings": [asdict(c) for c in ceilings],
                },
                indent=2,
            )
        )
        return 0
    print(f"device: {hardware.device_name(device)}, {torch.get_num_threads()} threads")
    for ceiling in ceilings:
        print(f"  {ceiling.dtype} matmul ceiling: {ceiling.describe()} ({ceiling.source})")
    print(f"precision: auto -> {choice.value} ({choice.reason})")
    print(f"compile: {'available' if can_compile else 'unavailable'} ({compiler})")
    print(f"cache: {hardware.cache_path()}")
    return 0
