"""``run_eval``: score a checkpoint on zero-shot tasks and the validation split; the results JSON and table."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tablefree.checkpoint.layout import META_FILE
from tablefree.checkpoint.model_dir import load_model
from tablefree.checkpoint.tokenizer import checked_tokenizer
from tablefree.cpu_memory import keep_freed_memory
from tablefree.data.tokenizer import eot_id
from tablefree.evaluate.engine import encode_pairs, loglikelihoods
from tablefree.evaluate.metrics import aggregate, multiple_choice_scores
from tablefree.evaluate.spec import EvalSpec
from tablefree.evaluate.task_record import Doc, DocRequests, Task, build_requests
from tablefree.evaluate.tasks import check_task_files, eval_data_dir, load_docs, parse_tasks, task_files
from tablefree.evaluate.validation import check_validation_tokenizer, format_coverage, validation_metrics
from tablefree.fileio import read_json, sha256_file, write_json_atomic, write_text_atomic
from tablefree.precision import choose_precision

VALIDATION = "validation"
LM_EVAL_SEMANTICS = "lm-evaluation-harness 0.4.13"


def run_eval(spec: EvalSpec) -> dict[str, Any]:
    """Evaluate ``spec.checkpoint`` on ``spec.tasks`` (``EvalSpec`` says what each field means); returns the
    results dict, which ``spec.out`` also writes as JSON (a partial results file lists the tasks still to do
    under ``"pending"``).

    Everything that can be checked before scoring is checked first: task names, the limit, that the output
    paths can be written, that every data file is present (all missing files in one error), every benchmark
    record that will be scored (the first ``limit`` of each file; PIQA's labels must still match its records line
    for line), and that every continuation fits the model's context (naming the file and line of any that does
    not). The results record the precision chosen and why.
    """
    checkpoint, tasks, data_dir, limit, batch_size = (
        spec.checkpoint,
        spec.tasks,
        spec.data_dir,
        spec.limit,
        spec.batch_size,
    )
    device, examples_out, val_data, tokenizer, out = (
        spec.device,
        spec.examples_out,
        spec.val_data,
        spec.tokenizer,
        spec.out,
    )
    bootstrap_iters, progress, dtype, verify = spec.bootstrap_iters, spec.progress, spec.dtype, spec.verify
    selected = parse_tasks(tasks, extra=(VALIDATION,))
    names = [item if isinstance(item, str) else item.name for item in selected]
    if VALIDATION in names and val_data is None:
        raise ValueError(
            "the validation task needs a prepared dataset directory (val_data=DIR / --val-data DIR)"
        )
    check_output_paths(out=out, examples_out=examples_out)
    benchmarks = [item for item in selected if not isinstance(item, str)]
    check_task_files(benchmarks, data_dir)  # every missing file at once, before the model is loaded
    prepared = {task.name: prepare_task(task, data_dir, limit) for task in benchmarks}

    model, directory = load_model(checkpoint, device, verify=verify)
    tok, tok_hash = checked_tokenizer(directory, tokenizer)
    if VALIDATION in names:  # before the precision is measured: a wrong dataset fails at once
        check_validation_tokenizer(val_data, tok_hash)
    dtype_choice = choose_precision(dtype, next(model.parameters()).device)
    memory_choice = keep_freed_memory(next(model.parameters()).device)  # process-wide (tablefree.cpu_memory)
    forward_dtype = torch.bfloat16 if dtype_choice.value == "bf16" else None
    if tok.get_vocab_size(with_added_tokens=True) > model.config.vocab_size:
        raise ValueError(
            f"tokenizer has {tok.get_vocab_size(with_added_tokens=True)} tokens, "
            f"more than the model's vocab_size {model.config.vocab_size}"
        )
    encoded = {name: encode_task(p, tok, model.config.max_seq_len) for name, p in prepared.items()}
    results: dict[str, Any] = {
        "tasks": {},
        "checkpoint": str(directory),
        "step": read_json(directory / META_FILE, default={}).get("step"),
        "tokenizer_hash": tok_hash,
        "git_commit": git_commit(),
        "model": {"interface": model.config.interface.name, "max_seq_len": model.config.max_seq_len},
        "eval_data": str(eval_data_dir(data_dir)),
        "limit": limit,
        "batch_size": batch_size,
        "device": str(next(model.parameters()).device),
        "dtype": dtype_choice.value,
        "dtype_reason": dtype_choice.reason,
        "memory": memory_choice.reason,
        "bootstrap_iters": bootstrap_iters,
        "semantics": LM_EVAL_SEMANTICS,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }
    examples: list[dict[str, Any]] = []
    for position, name in enumerate(names):
        if name == VALIDATION:
            with forward_autocast(model, forward_dtype):
                entry = validation_metrics(
                    model, tok, str(val_data), tok_hash, batch_size=batch_size, limit=limit
                )
        else:
            entry, records = score_task(
                model,
                prepared[name],
                encoded[name],
                batch_size,
                bootstrap_iters,
                progress=progress,
                dtype=forward_dtype,
            )
            examples.extend(records)
        results["tasks"][name] = entry
        pending = names[position + 1 :]
        _write_outputs(out, examples_out, {**results, "pending": pending} if pending else results, examples)
    return results


def forward_autocast(model: torch.nn.Module, dtype: torch.dtype | None):
    """bf16 autocast on the model's device for ``dtype=torch.bfloat16``; nothing otherwise."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(next(model.parameters()).device.type, dtype=dtype)


def _write_outputs(
    out: str | Path | None,
    examples_out: str | Path | None,
    results: dict[str, Any],
    examples: list[dict[str, Any]],
) -> None:
    if examples_out is not None:
        write_jsonl_atomic(examples_out, examples)
    if out is not None:
        write_json_atomic(out, results)


def check_output_paths(**paths: str | Path | None) -> None:
    """Each given output path can be written: its directory exists and is writable, and it is no directory.
    Checked before any work, so a finished evaluation is never lost to a typo in ``--out``."""
    seen: dict[Path, str] = {}
    for option, path in paths.items():
        if path is None:
            continue
        path = Path(path)
        flag = "--" + option.replace("_", "-")
        if path.is_dir():
            raise ValueError(f"{flag} {path}: is a directory; give a file name")
        parent = path.parent
        if not parent.is_dir():
            raise FileNotFoundError(f"{flag} {path}: directory {parent} does not exist; create it first")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise ValueError(f"{flag} {path}: directory {parent} is not writable")
        key = path.resolve()
        if key in seen:
            raise ValueError(f"{flag} and {seen[key]} are the same file {path}")
        seen[key] = flag


@dataclass(frozen=True)
class PreparedTask:
    """A task's validated documents and their (context, continuation) strings, ready to tokenize."""

    task: Task
    docs: list[Doc]
    requests: list[DocRequests]
    data_sha256: dict[str, str]


def prepare_task(task: Task, data_dir: str | Path | None = None, limit: int | None = None) -> PreparedTask:
    """Read and validate a task's files (errors name the file and line) and build its requests."""
    paths = task_files(task, data_dir)
    docs = load_docs(task, data_dir, limit)
    requests = []
    for doc in docs:
        try:
            requests.append(build_requests(task, doc.fields))
        except (ValueError, KeyError, IndexError, TypeError) as error:
            raise ValueError(f"{doc.where}: cannot build the {task.name} prompt ({error!r})") from None
    sha = {name: sha256_file(path) for name, path in zip(task.files, paths, strict=True)}
    return PreparedTask(task, docs, requests, sha)


def encode_task(prepared: PreparedTask, tokenizer, max_len: int) -> list[tuple[list[int], list[int]]]:
    """Token ids of every request, checked to fit ``max_len``: a continuation longer than the model's context
    cannot be scored (lm-eval 0.4.13 asserts against it too), so the error names each such document and says
    what would fit."""
    pairs = [pair for requests in prepared.requests for pair in requests.pairs]
    token_requests = encode_pairs(tokenizer, pairs, prefix_token_id(tokenizer))
    too_long, position = [], 0
    for doc, requests in zip(prepared.docs, prepared.requests, strict=True):
        lengths = [len(cont) for _, cont in token_requests[position : position + len(requests.pairs)]]
        position += len(requests.pairs)
        if min(lengths) == 0:
            raise ValueError(f"{doc.where}: a continuation of {prepared.task.name} encodes to no tokens")
        if max(lengths) > max_len:
            too_long.append((doc, max(lengths)))
    if too_long:
        raise ValueError(_too_long_message(prepared.task, too_long, max_len))
    return token_requests


def _too_long_message(task: Task, too_long: list[tuple[Doc, int]], max_len: int) -> str:
    first, length = too_long[0]
    longest = max(n for _, n in too_long)
    others = f" (and {len(too_long) - 1} more; the longest is {longest} tokens)" if len(too_long) > 1 else ""
    fixes = [
        f"evaluate a model with a context of at least {longest} tokens (model.max_seq_len)",
        f"leave {task.name} out of --tasks",
    ]
    if first.index > 0:
        fixes.append(f"--limit {first.index} (the documents before this one fit)")
    return (
        f"{first.where}: {task.name} document {first.index} has a continuation of {length} tokens, longer than "
        f"the model's context of {max_len} tokens{others}. lm-eval 0.4.13 refuses such a request too. "
        f"Nothing was scored. Fix: {'; or '.join(fixes)}"
    )


def score_task(
    model: torch.nn.Module,
    prepared: PreparedTask,
    token_requests: list[tuple[list[int], list[int]]],
    batch_size: int = 32,
    bootstrap_iters: int = 100_000,
    *,
    progress: bool = False,
    dtype: torch.dtype | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(result entry, per-example records) of a prepared and encoded task (``dtype``: see ``loglikelihoods``)."""
    task = prepared.task
    scores = iter(loglikelihoods(model, token_requests, batch_size, progress=progress, dtype=dtype))
    records = []
    for doc, requests in zip(prepared.docs, prepared.requests, strict=True):
        lls, greedy = zip(*(next(scores) for _ in requests.pairs), strict=True)
        record: dict[str, Any] = {"task": task.name, "doc_id": doc.index, "loglikelihoods": list(lls)}
        if task.output_type == "loglikelihood":
            target = requests.pairs[0][1]
            record.update(pred=None, gold=target, greedy=greedy[0], acc=int(greedy[0]))
        else:
            record.update(gold=requests.gold, greedy=list(greedy))
            record.update(multiple_choice_scores(lls, requests.choices, requests.gold))
        records.append(record)
    metrics, stderr = {}, {}
    for metric in task.metrics:
        if metric == "perplexity":
            values = [r["loglikelihoods"][0] for r in records]
        else:
            values = [r[metric] for r in records]
        metrics[metric], stderr[metric] = aggregate(metric, values, bootstrap_iters)
    entry = {
        "metrics": metrics,
        "stderr": stderr,
        "n": len(records),
        "headline": task.headline,
        "higher_is_better": {m: m != "perplexity" for m in task.metrics},
        "lm_eval_task": task.lm_eval_task,
        "data_sha256": prepared.data_sha256,
    }
    return entry, records


def evaluate_task(
    model: torch.nn.Module,
    tokenizer,
    task: Task,
    data_dir: str | Path | None = None,
    limit: int | None = None,
    batch_size: int = 32,
    bootstrap_iters: int = 100_000,
    *,
    progress: bool = False,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(result entry, per-example records) of one task: ``prepare_task``, ``encode_task``, ``score_task``."""
    prepared = prepare_task(task, data_dir, limit)
    token_requests = encode_task(prepared, tokenizer, model.config.max_seq_len)
    return score_task(model, prepared, token_requests, batch_size, bootstrap_iters, progress=progress)


# ------------------------------------------------------------------------------------------------------------
# Tokenizer checks


def prefix_token_id(tokenizer) -> int:
    """The token lm-eval conditions on when a context is empty: EOT."""
    return eot_id(tokenizer)


def git_commit() -> str | None:
    """The tablefree source tree's git commit, when it is a git checkout."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return commit or None


def write_jsonl_atomic(path: str | Path, records: list[dict[str, Any]]) -> None:
    write_text_atomic(path, "".join(json.dumps(record) + "\n" for record in records))


# ------------------------------------------------------------------------------------------------------------
# Printed table


def format_results(results: dict[str, Any]) -> str:
    """A fixed-width table: task, metric (* = headline), value, ± stderr, n."""
    lines = [f"{'task':<14} {'metric':<15} {'value':>10} {'± stderr':>10} {'n':>7}"]
    lines.append("-" * len(lines[0]))
    for name, entry in results["tasks"].items():
        for metric, value in entry["metrics"].items():
            err = entry["stderr"].get(metric)
            mark = "*" if metric == entry.get("headline") else " "
            err_text = _number(err) if err is not None else "n/a"
            lines.append(
                f"{name:<14} {metric + mark:<15} {_number(value):>10} {err_text:>10} {entry['n']:>7}"
            )
    lines.append("* the task's headline metric (the one the comparison report tests)")
    lines += [note for entry in results["tasks"].values() if (note := format_coverage(entry))]
    return "\n".join(lines)


def _number(value: float) -> str:
    return f"{value:.4f}" if abs(value) < 1e4 else f"{value:.4g}"
