"""How `data prepare` scales across jobs: one run against N parts run one after another, then the merge.

Parts are planned over spans (``tablefree.data.spans``: whole files, parquet row groups, byte ranges of an
uncompressed ``.jsonl``), so one large file splits; each part's share of the tokens and of the CPU is printed.
Each job (the single run, every part, the merge) runs in a child process of its own with one tokenizing worker,
so its CPU time and peak RSS are the kernel's (``os.wait4``), not a sum over shared threads. Reported per N: the
parts' CPU time together against the single run's, the largest part's share (balance by bytes), the merge's share,
tokens per CPU-second, and the wall time projected for 100B tokens on 64 cores from those rates (64 parts on one
core each, the largest part setting the pace, then the merge). With ``--memory CORPUS...`` it also reports the
single run's peak RSS on each corpus (a 10x larger one shows whether memory grows with the corpus).

    python benchmarks/prepare_scaling.py ../shared/data/corpus/gutenberg-mix --tokenizer tok.json \
        --parts 2,4,8 --memory /tmp/corpus-10x --json /tmp/prepare_scaling.json

Run it on one core (``taskset -c 1``): the numbers are CPU time, and a busy machine slows the wall clock only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tablefree.data.spans import DEFAULT_SPAN_BYTES

JOB = """
import json, sys
from tablefree.data.prepare import PrepareSpec, merge_parts, prepare_part, prepare_single
corpus, out, tokenizer, shard_tokens, what, rule, span_bytes = sys.argv[1:8]
spec = PrepareSpec(corpus=(corpus,), tokenizer=tokenizer, split_rule=rule, workers=1, progress=False,
                   shard_tokens=int(shard_tokens), span_bytes=int(span_bytes))
if what == "startup":
    json.dump({"tokens": 0, "bytes": 0}, sys.stdout)
    sys.exit(0)
if what == "single":
    result = prepare_single(spec, out)
elif what == "merge":
    result = merge_parts(spec, out)
else:
    i, n = map(int, what.split("/"))
    result = prepare_part(spec, out, (i, n))
tokens = sum(split["tokens"] for split in result["splits"].values())
# a part's pieces may share a file with its neighbours: its bytes are its spans' (a whole file's: the file's)
pieces = result.get("pieces", [])
json.dump({"tokens": tokens, "bytes": sum(s["bytes"] for s in result.get("sources", [])),
           "pieces": [[p["file"], p["spans"]] for p in pieces]}, sys.stdout)
"""


def run_job(
    corpus: str,
    out: Path,
    tokenizer: str,
    shard_tokens: int,
    what: str,
    rule: str = "keyed-hash",
    span_bytes: int = DEFAULT_SPAN_BYTES,
) -> dict:
    """One job in a child process: its wall time, CPU time and peak RSS (the kernel's rusage of that child)."""
    start = time.perf_counter()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            JOB,
            corpus,
            str(out),
            tokenizer,
            str(shard_tokens),
            what,
            rule,
            str(span_bytes),
        ],
        stdout=subprocess.PIPE,
        env=env,
    )
    output = child.stdout.read()
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode:
        raise SystemExit(f"job {what} failed (exit {child.returncode})")
    return {
        "job": what,
        "wall_s": time.perf_counter() - start,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "peak_rss_mb": usage.ru_maxrss / 1024,  # KiB on Linux
        **json.loads(output),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("corpus")
    parser.add_argument(
        "--tokenizer", required=True, help="tokenizer.json (train one with `tokenizer train`)"
    )
    parser.add_argument("--parts", default="2,4,8")
    parser.add_argument("--shard-tokens", type=int, default=10_000_000)
    parser.add_argument(
        "--span-bytes",
        type=int,
        default=DEFAULT_SPAN_BYTES,
        help="an uncompressed .jsonl's spans (parts split one by them; parquet by row groups)",
    )
    parser.add_argument(
        "--memory", nargs="*", default=[], help="more corpora: the single run's peak RSS on each"
    )
    parser.add_argument(
        "--memory-rules", default="keyed-hash", help="split rules of the memory runs (or plan too)"
    )
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="prepare-scaling-"))
    results: dict = {"load_before": os.getloadavg()[0], "runs": {}, "memory": []}
    try:
        # A process's fixed cost (interpreter, imports): the merge's share and the projection leave it out.
        startup = run_job(args.corpus, work / "startup", args.tokenizer, args.shard_tokens, "startup")
        results["startup"] = startup
        print(
            f"startup (imports only): {startup['cpu_s']:.2f} CPU s, peak RSS {startup['peak_rss_mb']:.0f} MB"
        )
        single = run_job(
            args.corpus,
            work / "single",
            args.tokenizer,
            args.shard_tokens,
            "single",
            span_bytes=args.span_bytes,
        )
        results["single"] = single
        print(
            f"single: {single['tokens']:,} tokens, {single['cpu_s']:.1f} CPU s, {single['wall_s']:.1f} s wall, "
            f"{single['tokens'] / single['cpu_s'] / 1e6:.3f}M tokens/CPU-s, peak RSS {single['peak_rss_mb']:.0f} MB"
        )
        for n in map(int, args.parts.split(",")):
            out = work / f"parts-{n}"
            parts = [
                run_job(
                    args.corpus,
                    out,
                    args.tokenizer,
                    args.shard_tokens,
                    f"{i}/{n}",
                    span_bytes=args.span_bytes,
                )
                for i in range(1, n + 1)
            ]
            merge = run_job(
                args.corpus, out, args.tokenizer, args.shard_tokens, "merge", span_bytes=args.span_bytes
            )
            identical = all(
                (out / p.name).read_bytes() == p.read_bytes()
                for p in (work / "single").iterdir()
                if p.name != "manifest.json"
            )
            part_cpu = sum(p["cpu_s"] for p in parts)
            largest = max(p["cpu_s"] for p in parts)
            rate = single["tokens"] / (part_cpu + merge["cpu_s"])
            merge_work = max(
                merge["cpu_s"] - startup["cpu_s"], 0.0
            )  # the merge less its process's fixed cost
            # 100B tokens on 64 cores: 64 parts at once, the largest (as unbalanced as here) setting the pace,
            # then the merge, one process, at its per-token rate here (it reads and writes the tokens once).
            tokenize_h = 100e9 / (single["tokens"] / part_cpu) / 64 * (largest / (part_cpu / n)) / 3600
            merge_h = 100e9 * merge_work / single["tokens"] / 3600
            row = {
                "parts": parts,
                "merge": merge,
                "identical_to_single": identical,
                "parts_cpu_over_single": part_cpu / single["cpu_s"],
                "largest_part_over_single": largest / single["cpu_s"],
                "balance_limit": 1.5 / n,
                "largest_part_tokens_share": max(p["tokens"] for p in parts) / single["tokens"],
                "part_tokens_shares": [p["tokens"] / single["tokens"] for p in parts],
                "merge_share": merge["cpu_s"] / (part_cpu + merge["cpu_s"]),
                "merge_share_less_startup": merge_work / (part_cpu + merge["cpu_s"]),
                "tokens_per_cpu_s": rate,
                "projected_100b_64_cores_h": tokenize_h + merge_h,
                "projected_merge_h": merge_h,
            }
            results["runs"][n] = row
            print(
                f"{n} parts: CPU {row['parts_cpu_over_single']:.3f}x the single run's, largest part "
                f"{row['largest_part_over_single']:.3f} of it (limit 1.5/{n} = {1.5 / n:.3f}), merge "
                f"{100 * row['merge_share']:.2f}% ({merge['cpu_s']:.2f} CPU s; "
                f"{100 * row['merge_share_less_startup']:.2f}% less the startup), {rate / 1e6:.3f}M tokens/CPU-s, "
                f"byte-identical: {identical}; 100B tokens on 64 cores: {tokenize_h + merge_h:.2f} h "
                f"(merge {merge_h:.2f} h); peak RSS of a part {max(p['peak_rss_mb'] for p in parts):.0f} MB"
            )
            for i, p in enumerate(parts, start=1):  # the piece planner's balance, part by part
                print(
                    f"  part {i}/{n}: {p['tokens'] / single['tokens']:.3f} of the tokens, "
                    f"{p['cpu_s'] / single['cpu_s']:.3f} of the single run's CPU; pieces {p['pieces']}"
                )
            shutil.rmtree(out)
        for rule in args.memory_rules.split(","):
            for corpus in args.memory:
                job = run_job(corpus, work / "memory", args.tokenizer, args.shard_tokens, "single", rule)
                results["memory"].append({"corpus": corpus, "rule": rule, **job})
                print(
                    f"{rule} {corpus}: {job['bytes'] / 1e6:.0f} MB, {job['tokens']:,} tokens, peak RSS "
                    f"{job['peak_rss_mb']:.0f} MB ({job['cpu_s']:.0f} CPU s)"
                )
                shutil.rmtree(work / "memory")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    results["load_after"] = os.getloadavg()[0]
    print(f"load average {results['load_before']:.2f} before, {results['load_after']:.2f} after")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
