"""Training throughput and peak memory of the `small` preset on CPU: our trainer with each interface and
precision, and a plain nanoGPT-style reference loop with the same shapes (no tablefree code), all in one run.

Variants: ``reference`` (fp32 eager), ``learned-fp32``, ``learned-bf16``, ``learned-auto`` (what
``precision: auto`` and ``compile: auto`` choose on this machine; the line "auto chose ..." says what),
``canonical-auto`` and ``affine-auto``; ``--compile`` adds ``learned-bf16-compile`` and ``learned-fp32-compile``
(each compiles for tens of seconds in its warm-up steps, which are not timed).

Each step is timed in wall-clock and in process CPU time; on a machine shared with other work, compare
tokens per CPU-second with ``--threads 1 --metric tokens_per_cpu_s``. Each variant runs in its own
subprocess (so peak RSS is its own), and the variants are interleaved over
``--rounds`` rounds; the best round counts, which is the fairest figure on a machine shared with other work.

    python benchmarks/train_throughput.py                      # small, 2 rounds
    python benchmarks/train_throughput.py --steps 4 --rounds 1 # quicker
    python benchmarks/train_throughput.py --preset tiny        # seq_len defaults to the preset's context

Goals: our `learned-fp32` >= 0.95x the reference and `canonical`/`affine` >= `learned` (issue 4);
`learned-auto` >= 3x `learned-fp32` (issue 11, reachable only where bf16 matmul is much faster than fp32).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

# variant -> (interface, trainer overrides); "reference" is the plain loop
VARIANTS = {
    "reference": ("", []),
    "learned-fp32": ("learned", ["precision=fp32", "compile=false"]),
    "learned-bf16": ("learned", ["precision=bf16", "compile=false"]),
    "learned-auto": ("learned", ["precision=auto", "compile=auto"]),
    "canonical-auto": ("canonical", ["precision=auto", "compile=auto"]),
    "affine-auto": ("affine", ["precision=auto", "compile=auto"]),
}
COMPILED_VARIANTS = {
    "learned-fp32-compile": ("learned", ["precision=fp32", "compile=true"]),
    "learned-bf16-compile": ("learned", ["precision=bf16", "compile=true"]),
}


# ----------------------------------------------------------------------------------------------------------
# The reference: a straightforward Llama-style LM (RMSNorm, RoPE, SwiGLU, SDPA, untied head) with an ordinary
# embedding table, written the way nanoGPT writes it.


class RefRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


class RefBlock(nn.Module):
    def __init__(self, d: int, heads: int, ff: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = RefRMSNorm(d), RefRMSNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        self.gate, self.up = nn.Linear(d, ff, bias=False), nn.Linear(d, ff, bias=False)
        self.down = nn.Linear(ff, d, bias=False)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(B, T, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


def rope(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class RefGPT(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, heads: int, ff: int, seq_len: int) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(RefBlock(d, heads, ff) for _ in range(layers))
        self.norm = RefRMSNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        hd = d // heads
        inv_freq = 1.0 / (10_000 ** (torch.arange(0, hd, 2).float() / hd))
        freqs = torch.outer(torch.arange(seq_len).float(), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets):
        x = self.wte(idx)
        T = idx.shape[1]
        for block in self.blocks:
            x = block(x, self.cos[:T], self.sin[:T])
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))


def run_reference(args: argparse.Namespace) -> dict:
    from tablefree.model_config import preset  # shapes only

    c = preset(args.preset)
    torch.manual_seed(0)
    model = RefGPT(args.vocab, c.d_model, c.n_layers, c.n_heads, c.d_ff, args.seq_len)
    decay = [p for p in model.parameters() if p.dim() >= 2 and p is not model.wte.weight]
    no_decay = [p for p in model.parameters() if p.dim() < 2 or p is model.wte.weight]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=1e-3,
        betas=(0.9, 0.95),
    )
    generator = torch.Generator().manual_seed(0)
    data = torch.randint(
        0, args.vocab, (args.steps + args.warmup, args.micro_batch, args.seq_len + 1), generator=generator
    )
    times, cpu_times = [], []
    for step in range(args.warmup + args.steps):
        start, cpu_start = time.perf_counter(), time.process_time()
        batch = data[step]
        loss = model(batch[:, :-1], batch[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss.item()
        times.append(time.perf_counter() - start)
        cpu_times.append(time.process_time() - cpu_start)
    return per_step_result(times[args.warmup :], cpu_times[args.warmup :], args.micro_batch * args.seq_len)


# ----------------------------------------------------------------------------------------------------------
# Ours: the real trainer, on a synthetic dataset with the same shapes.


def run_ours(args: argparse.Namespace, variant: str) -> dict:
    from tablefree.config_parsing import apply_overrides, from_dict
    from tablefree.train import metrics, trainer
    from tablefree.train.recipe import TrainConfig

    # CPU time per step: stamp process_time at every metrics record (log_every=1: one per step, written right
    # after the step's timer stops, so consecutive differences are the steps' CPU times).
    cpu_stamps = []
    write = metrics.MetricsLog.write

    def stamped_write(self, record):
        if "train_loss" in record:
            cpu_stamps.append(time.process_time())
        write(self, record)

    metrics.MetricsLog.write = stamped_write
    interface, variant_overrides = {**VARIANTS, **COMPILED_VARIANTS}[variant]

    with tempfile.TemporaryDirectory() as tmp:
        data_dir = make_synthetic_dataset(
            Path(tmp) / "data",
            args.vocab,
            tokens=(args.steps + args.warmup + 2) * args.micro_batch * (args.seq_len + 1),
        )
        overrides = [
            f"model.preset={args.preset}",
            f"model.interface.name={interface}",
            f"data.dir={data_dir}",
            f"budget={args.steps + args.warmup} steps",
            f"batch_tokens={args.micro_batch * args.seq_len}",
            f"micro_batch={args.micro_batch}",
            f"seq_len={args.seq_len}",
            "log_every=1",
            "val_batches=1",
            "keep_last=1",
            *variant_overrides,
        ]
        config = from_dict(TrainConfig, apply_overrides({}, overrides), where="benchmark")
        summary = trainer.train(config, Path(tmp) / "run")
        records = [
            json.loads(line) for line in (Path(tmp) / "run" / "metrics.jsonl").read_text().splitlines()
        ]
    per_token_s = [1.0 / r["tokens_per_s"] for r in records if "train_loss" in r]
    times = [t * args.micro_batch * args.seq_len for t in per_token_s]
    cpu_times = [b - a for a, b in itertools.pairwise(cpu_stamps)]  # steps 2..n
    result = per_step_result(
        times[args.warmup :], cpu_times[max(0, args.warmup - 1) :], args.micro_batch * args.seq_len
    )
    measured = [r for r in records if "train_loss" in r][args.warmup :]
    result.update(
        precision=summary["precision"],
        compiled=summary["compiled"],
        choice=f"{summary['precision']} ({summary['precision_reason']}); compile "
        f"{'on' if summary['compiled'] else 'off'} ({summary['compile_reason']})",
        mfu=statistics.median(r["mfu"] for r in measured),
        tflops=statistics.median(r["tflops"] for r in measured),
        ceiling_tflops=summary["peak_flops_per_device"] / 1e12,
        final_train_loss=summary["final_train_loss"],
    )
    return result


def placeholder_tokenizer(vocab: int):
    """A word-level tokenizer over ``t0 .. t{V-2}`` and ``<|endoftext|>``: the dataset check wants a real
    tokenizer.json of the manifest's vocabulary size; the synthetic ids are never decoded."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = {f"t{i}": i for i in range(vocab - 1)} | {"<|endoftext|>": vocab - 1}
    tokenizer = Tokenizer(models.WordLevel(words, unk_token="<|endoftext|>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tokenizer


def make_synthetic_dataset(directory: Path, vocab: int, tokens: int, val_tokens: int | None = None) -> Path:
    """A prepared dataset of uniform random ids (``val_tokens`` defaults to enough for a few val batches)."""
    import hashlib

    import numpy as np

    from tablefree.data.shards import write_shard
    from tablefree.data.tokenizer import tokenizer_hash

    directory.mkdir(parents=True)
    rng = np.random.default_rng(0)
    splits = {}
    if val_tokens is None:
        val_tokens = 4 * tokens // 100 + 4096
    for split, count in (("train", tokens), ("val", val_tokens)):
        shard = directory / f"{split}_000000.bin"
        write_shard(shard, rng.integers(0, vocab, count), vocab)
        digest = hashlib.sha256(shard.read_bytes()).hexdigest()  # the loader verifies it
        splits[split] = {
            "shards": [{"file": shard.name, "tokens": count, "sha256": digest}],
            "tokens": count,
            "documents": 1,
        }
    tokenizer = placeholder_tokenizer(vocab)
    tokenizer.save(str(directory / "tokenizer.json"))
    manifest = {
        "version": 1,
        "tokenizer_hash": tokenizer_hash(tokenizer),
        "tokenizer_file": "tokenizer.json",
        "vocab_size": vocab,
        "eot_id": vocab - 1,  # <|endoftext|> of the placeholder tokenizer
        "splits": splits,
        "sources": ["synthetic"],
    }
    (directory / "manifest.json").write_text(json.dumps(manifest))
    return directory


def per_step_result(times: list[float], cpu_times: list[float], tokens_per_step: int) -> dict:
    median, cpu_median = statistics.median(times), statistics.median(cpu_times)
    return {
        "tokens_per_s": tokens_per_step / median,
        "tokens_per_cpu_s": tokens_per_step / cpu_median,
        "step_s_median": median,
        "step_cpu_s_median": cpu_median,
        "steps": len(times),
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9,
    }


# ----------------------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="small")
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--seq-len", type=int, help="default: the preset's context (512 for small)")
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=6, help="measured steps per variant and round")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--compile", action="store_true", help="also time the compiled variants")
    parser.add_argument(
        "--variants", help="comma-separated subset of the variants (default: all; reference is always run)"
    )
    parser.add_argument(
        "--metric",
        default="tokens_per_s",
        choices=["tokens_per_s", "tokens_per_cpu_s"],
        help="what to compare: wall-clock tokens/s, or tokens per CPU-second (robust on a shared machine with "
        "--threads 1)",
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    all_variants = {**VARIANTS, **COMPILED_VARIANTS}
    parser.add_argument("--one", choices=all_variants, help=argparse.SUPPRESS)  # internal: run one variant
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.seq_len is None:
        from tablefree.model_config import preset

        args.seq_len = preset(args.preset).max_seq_len

    if args.one:
        result = run_reference(args) if args.one == "reference" else run_ours(args, args.one)
        print("RESULT " + json.dumps(result))
        return

    variants = list(VARIANTS) + (list(COMPILED_VARIANTS) if args.compile else [])
    if args.variants:
        wanted = args.variants.split(",")
        unknown = sorted(set(wanted) - set(all_variants))
        if unknown:
            parser.error(f"--variants: unknown {unknown}; expected some of {list(all_variants)}")
        variants = ["reference", *[v for v in wanted if v != "reference"]]

    best: dict[str, dict] = {}
    keys = ("preset", "vocab", "seq_len", "micro_batch", "steps", "warmup", "threads")
    passthrough = [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items() if k in keys]
    load_before = os.getloadavg()
    for round_index in range(args.rounds):
        for variant in variants:
            out = subprocess.run(
                [sys.executable, __file__, "--one", variant, *passthrough],
                capture_output=True,
                text=True,
            )
            if out.returncode != 0:
                sys.exit(f"variant {variant} failed:\n{out.stderr[-3000:]}")
            result = json.loads(
                next(line for line in out.stdout.splitlines() if line.startswith("RESULT "))[7:]
            )
            print(
                f"round {round_index + 1} {variant:<21} {result['tokens_per_s']:>8.0f} tok/s "
                f"{result['tokens_per_cpu_s']:>8.0f} tok/CPU-s  peak RSS {result['peak_rss_gb']:.2f} GB",
                flush=True,
            )
            if variant not in best or result[args.metric] > best[variant][args.metric]:
                best[variant] = result
    load_after = os.getloadavg()
    reference = best["reference"][args.metric]
    print(
        f"\n{args.preset}, micro_batch {args.micro_batch} x seq_len {args.seq_len}, V={args.vocab}, "
        f"{args.threads} threads, best of {args.rounds} by {args.metric}; load average "
        f"{load_before[0]:.2f} before, {load_after[0]:.2f} after"
    )
    if "learned-auto" in best:
        print(f"auto chose: {best['learned-auto']['choice']}")
    fp32 = best.get("learned-fp32", {}).get(args.metric)
    print(
        f"{'variant':<21} {'tokens/s':>9} {'tok/CPU-s':>10} {'vs reference':>13} {'vs fp32':>8} "
        f"{'TFLOP/s':>8} {'MFU':>6} {'peak RSS GB':>12}"
    )
    for variant in variants:
        r = best[variant]
        mfu = f"{100 * r['mfu']:>5.1f}%" if "mfu" in r else f"{'':>6}"
        tflops = f"{r['tflops']:>8.3f}" if "tflops" in r else f"{'':>8}"
        vs_fp32 = f"{r[args.metric] / fp32:>7.2f}x" if fp32 else f"{'':>8}"
        print(
            f"{variant:<21} {r['tokens_per_s']:>9.0f} {r['tokens_per_cpu_s']:>10.0f} "
            f"{r[args.metric] / reference:>12.3f}x {vs_fp32} {tflops} {mfu} {r['peak_rss_gb']:>12.2f}"
        )
    goals = {}
    if fp32:
        goals["learned-fp32 >= 0.95x reference"] = fp32 >= 0.95 * reference
    if "learned-auto" in best:
        learned = best["learned-auto"][args.metric]
        for interface in ("canonical", "affine"):
            if f"{interface}-auto" in best:
                goals[f"{interface}-auto >= learned-auto"] = best[f"{interface}-auto"][args.metric] >= learned
        if fp32:
            goals["learned-auto >= 3x learned-fp32"] = learned >= 3 * fp32
    for goal, met in goals.items():
        print(f"goal {goal}: {'met' if met else 'NOT met'}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "args": {k: str(v) for k, v in vars(args).items()},
                    "load_average": {"before": load_before, "after": load_after},
                    "best": best,
                    "goals": goals,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
