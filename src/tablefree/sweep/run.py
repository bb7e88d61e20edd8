"""One run of the sweep, the same under either executor: train it (in this process, or under torchrun), evaluate
it (``eval.json``, the per-example records, the selection split's loss) and keep its ``status.json``; a failure
is recorded in the run directory, not raised, so one failed run does not sink the sweep."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import time
import traceback
from typing import Any

from tablefree.checkpoint.model_dir import load_model
from tablefree.evaluate import EvalSpec, run_eval
from tablefree.evaluate.selection import selection_metrics
from tablefree.fileio import read_json, write_json_atomic, write_text_atomic
from tablefree.rundir import RUN_FILES
from tablefree.sweep.branching import start_branch
from tablefree.sweep.config import CompareConfig, EvalSection
from tablefree.sweep.plan import RunPlan
from tablefree.sweep.record import write_yaml_atomic
from tablefree.train import trainer


def execute_run(config: CompareConfig, run: RunPlan, state: str, prefix: str, log) -> str:
    """Train (unless trained) and evaluate one run; a failure is recorded, not raised (KeyboardInterrupt is)."""
    run.directory.mkdir(parents=True, exist_ok=True)
    status = read_json(run.directory / RUN_FILES["status"], default=None) or {}
    status.update(state="running", started=_now(), error=None)
    write_json_atomic(run.directory / RUN_FILES["status"], status)
    (run.directory / RUN_FILES["error"]).unlink(missing_ok=True)
    try:
        if state != "trained":
            if run.branch is not None and start_branch(run):
                log(f"{prefix}: branched from {run.branch.trunk} at step {run.branch.step}")
            log(f"{prefix}: training")
            started = time.perf_counter()
            train_run(config, run)
            status["train_call_s"] = time.perf_counter() - started
        log(f"{prefix}: evaluating {', '.join(config.eval.tasks)}")
        started = time.perf_counter()
        evaluate_run(config, run)
        status.update(state="done", eval_wall_s=time.perf_counter() - started, finished=_now())
        write_json_atomic(run.directory / RUN_FILES["status"], status)
        log(f"{prefix}: done")
        return "done"
    except KeyboardInterrupt:
        status.update(state="interrupted", finished=_now())
        write_json_atomic(run.directory / RUN_FILES["status"], status)
        raise
    except Exception as error:  # a failed run must not sink the sweep
        message = f"{type(error).__name__}: {error}"
        write_text_atomic(run.directory / RUN_FILES["error"], traceback.format_exc())
        status.update(state="failed", error=message, finished=_now())
        write_json_atomic(run.directory / RUN_FILES["status"], status)
        log(f"{prefix}: FAILED ({message}); traceback in {run.directory / RUN_FILES['error']}")
        return "failed"


def train_run(config: CompareConfig, run: RunPlan) -> dict[str, Any]:
    """Train (or resume) one run, in this process or under torchrun; returns its summary."""
    if config.launch.nproc_per_node >= 1:
        summary = _train_with_torchrun(config, run)
    else:
        summary = trainer.train(run.train_config, run.directory, resume="auto")
    if not summary.get("completed"):
        reason = summary.get("stop_reason", "unknown")
        if str(reason).startswith("stopped by"):  # SIGINT/SIGTERM: the user stops the sweep
            raise KeyboardInterrupt(reason)
        raise RuntimeError(f"training did not complete: {reason}")
    return summary


def _train_with_torchrun(config: CompareConfig, run: RunPlan) -> dict[str, Any]:
    recipe_path = run.directory / "recipe.yaml"
    write_yaml_atomic(recipe_path, run.recipe)
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={config.launch.nproc_per_node}",
        *config.launch.torchrun_args,
        "-m",
        "tablefree.cli",
        "train",
        "--config",
        str(recipe_path),
        "--run-dir",
        str(run.directory),
        "--resume-if-present",
    ]
    log_path = run.directory / "train.log"
    with open(log_path, "a", encoding="utf-8") as log_file:
        log_file.write(f"$ {' '.join(command)}\n")
        log_file.flush()
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert process.stdout is not None
        for line in process.stdout:  # tee: the user sees progress, the run keeps the log
            sys.stdout.write(line)
            log_file.write(line)
        code = process.wait()
    summary = read_json(run.directory / RUN_FILES["summary"], default=None)
    if code != 0 and not (summary and str(summary.get("stop_reason", "")).startswith("stopped by")):
        raise RuntimeError(f"torchrun exited with status {code}; see {log_path}")
    if summary is None:
        raise RuntimeError(f"torchrun wrote no summary.json; see {log_path}")
    return summary


def evaluate_run(config: CompareConfig, run: RunPlan) -> dict[str, Any]:
    """Evaluate a trained run with ``tablefree.evaluate.run_eval`` (validation and benchmarks have their own
    limits); writes ``eval.json`` and the benchmarks' per-example records, which feed the paired bootstrap."""
    section = config.eval
    common: dict[str, Any] = dict(
        data_dir=section.data_dir,
        batch_size=section.batch_size,
        device=section.device,  # load_model resolves "auto"
        dtype=section.dtype,
        val_data=run.train_config.data.dir,
        progress=sys.stderr.isatty(),
    )
    benchmarks = [task for task in section.tasks if task != "validation"]
    results: dict[str, Any] = {"tasks": {}}
    if "validation" in section.tasks:
        results = run_eval(EvalSpec(run.directory, ["validation"], limit=section.val_limit, **common))
    if benchmarks:
        scored = run_eval(
            EvalSpec(
                run.directory,
                benchmarks,
                limit=section.limit,
                examples_out=run.directory / RUN_FILES["examples"],
                **common,
            )
        )
        results = {**scored, "tasks": {**results["tasks"], **scored["tasks"]}}
    else:
        write_text_atomic(run.directory / RUN_FILES["examples"], "")
    results.update(limit=section.limit, val_limit=section.val_limit)
    if run.select_every:
        write_json_atomic(run.directory / RUN_FILES["selection"], score_selection(run, section))
    write_json_atomic(run.directory / RUN_FILES["eval"], results)
    return results


def score_selection(run: RunPlan, spec: EvalSection) -> dict[str, Any]:
    """The run's final model on the training windows it held out (``data.select_every``), cut at the recipe's
    ``seq_len`` as the trainer cut them (not the model's ``max_seq_len``, which may be longer)."""
    model, checkpoint = load_model(run.directory, device=spec.device)
    model.eval()
    result = selection_metrics(
        model,
        run.train_config.data.dir,
        run.train_config.seq_len or model.config.max_seq_len,
        run.select_every,
        spec.batch_size,
    )
    return {**result, "checkpoint": os.path.relpath(checkpoint, run.directory)}


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
