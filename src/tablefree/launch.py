"""Runs as SLURM jobs: a job array through submitit, or the same array as a plain ``sbatch`` script.

This module knows nothing about what a run is. It is handed callables (``tablefree.sweep.slurm.run_job`` bound
to a run) and resources, and owns the scheduler side: the executor, the jobs record, the queue's view, the
rendezvous of a multi-node job and preemption.

Preemption and time limits: SLURM sends ``PREEMPT_SIGNAL`` (USR2, submitit's choice) ``signal_delay_s``
before it stops a job. The trainer takes it as a stop request (``train.trainer.STOP_SIGNALS``): it saves a
checkpoint and returns; the run's function then raises ``Preempted``, and ``Preemptible`` hands over to
submitit's own handler, which requeues the job (``scontrol requeue``) and exits. The requeued job calls the
same function, which resumes from the checkpoint. submitit's handler alone would requeue at once, before the
trainer has saved; the trainer's handler replaces it while the run trains, so the requeue waits for the save.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tablefree.fileio import read_json, write_json_atomic, write_text_atomic

PREEMPT_SIGNAL = signal.SIGUSR2
JOBS_FILE = "jobs.json"  # {run name: scheduler job id}, in the jobs folder
REQUEUE_EXIT_CODE = 75  # EX_TEMPFAIL: `compare --only RUN` was preempted; the sbatch script requeues on it
EXECUTORS = ("slurm", "local")
ACTIVE_STATES = {"PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "SUSPENDED"}


SUBMITIT_TIME_MIN = 24 * 60  # the job time limit submitit asks for when launch.slurm.time_min is unset


@dataclass
class SlurmSpec:
    """Per-run resources and the scheduler's settings (``launch.slurm`` in a compare config)."""

    folder: str = ""  # submitit's job files and logs; empty: OUT/slurm (on a filesystem every node sees)
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    nodes: int = 1  # one task per node, each starting one torchrun (launch.nproc_per_node processes)
    gpus_per_node: int = 0
    cpus_per_task: int | None = None
    mem_gb: float | None = None
    # per job; None: the script asks for no limit (the partition's default applies), submitit for 24 h
    time_min: int | None = None
    array_parallelism: int = 256  # array tasks running at once
    signal_delay_s: int = 120  # USR2 this long before the time limit: the run saves and the job requeues
    max_timeouts: int = 3  # requeues after reaching the time limit (preemptions requeue without limit)
    port: int = 29500  # multi-node rendezvous: port + SLURM_JOB_ID % 1000 on the first node
    setup: list[str] = field(
        default_factory=list
    )  # shell lines before srun, e.g. "source .venv/bin/activate"
    sbatch: dict[str, Any] = field(default_factory=dict)  # extra sbatch options, e.g. {constraint: a100}
    # the python command on the nodes; None: submitit uses this interpreter, an sbatch script the `python3` of
    # the environment it runs in (its PATH after the setup lines), so it moves with the script
    python: str | None = None
    executor: str = "slurm"  # slurm; local: submitit's local executor, the tasks on this machine (testing)

    def __post_init__(self) -> None:
        if self.executor not in EXECUTORS:
            raise ValueError(f"launch.slurm.executor: expected one of {EXECUTORS}, got {self.executor!r}")
        for key in ("nodes", "time_min", "array_parallelism"):
            if getattr(self, key) is not None and getattr(self, key) < 1:
                raise ValueError(f"launch.slurm.{key}: expected a positive integer, got {getattr(self, key)}")
        if self.gpus_per_node < 0 or self.signal_delay_s < 0 or self.max_timeouts < 0:
            raise ValueError("launch.slurm: gpus_per_node, signal_delay_s and max_timeouts must be >= 0")


class Preempted(Exception):
    """Raised by a run's function when its training stopped on ``PREEMPT_SIGNAL`` after saving."""


def _submitit():
    try:
        import submitit
    except ImportError:
        raise ImportError(
            "launch.backend: slurm needs submitit: pip install 'tablefree[slurm]' (or use --emit-sbatch FILE "
            "for a plain sbatch script)"
        ) from None
    return submitit


class Preemptible:
    """A callable for submitit that requeues its job when the call raises ``Preempted``.

    submitit treats a callable with a ``checkpoint`` method as checkpointable (``helpers.Checkpointable``):
    on the preemption signal it pickles what ``checkpoint`` returns and requeues. Here the signal reaches
    the trainer first; once the run has saved, ``__call__`` invokes submitit's handler itself.
    """

    def __init__(self, function: Callable[..., Any], *args: Any) -> None:
        self.function, self.args = function, args

    def __call__(self) -> Any:
        try:
            return self.function(*self.args)
        except Preempted as stopped:
            handler = signal.getsignal(PREEMPT_SIGNAL)
            if not callable(handler):  # not under submitit (the sbatch script requeues on the exit code)
                raise
            print(f"{stopped}: checkpoint saved, requeueing", flush=True)
            handler(PREEMPT_SIGNAL, None)  # submitit: checkpoint(), scontrol requeue, exit (rank 0 only)
            return None

    def checkpoint(self) -> Any:
        """The same call again: the run resumes from the checkpoint its training saved."""
        return _submitit().helpers.DelayedSubmission(self)


def submit(
    spec: SlurmSpec, folder: Path, name: str, tasks: dict[str, Callable[[], Any]], log=print
) -> dict[str, str]:
    """Submit ``tasks`` ({run name: callable}) as one job array; returns and records {run name: job id}."""
    if not tasks:
        return {}
    submitit = _submitit()
    folder.mkdir(parents=True, exist_ok=True)
    executor = submitit.AutoExecutor(
        folder=folder / "%j", cluster=spec.executor, slurm_max_num_timeout=spec.max_timeouts
    )
    parameters: dict[str, Any] = dict(
        name=name,
        nodes=spec.nodes,
        tasks_per_node=1,  # several tasks on a node would share its GPUs: one torchrun per node instead
        timeout_min=SUBMITIT_TIME_MIN if spec.time_min is None else spec.time_min,  # submitit's own is 5 min
        slurm_array_parallelism=spec.array_parallelism,
        slurm_signal_delay_s=spec.signal_delay_s,
        slurm_setup=list(spec.setup),
        slurm_additional_parameters=dict(spec.sbatch),
    )
    optional = {
        "gpus_per_node": spec.gpus_per_node or None,
        "cpus_per_task": spec.cpus_per_task,
        "mem_gb": spec.mem_gb,
        "slurm_partition": spec.partition,
        "slurm_account": spec.account,
        "slurm_qos": spec.qos,
        "slurm_python": spec.python,
    }
    parameters.update({key: value for key, value in optional.items() if value is not None})
    executor.update_parameters(**parameters)
    names = list(tasks)
    with executor.batch():
        jobs = [executor.submit(Preemptible(tasks[run])) for run in names]
    submitted = {run: str(job.job_id) for run, job in zip(names, jobs, strict=True)}
    record = {**(read_json(folder / JOBS_FILE, default=None) or {}), **submitted}
    write_json_atomic(folder / JOBS_FILE, record)
    log(f"submitted {len(submitted)} runs ({spec.executor}): jobs {', '.join(submitted.values())}")
    log(f"logs: {folder}/<job id>/*.out, *.err; each run's own files are in its run directory")
    return submitted


def recorded_jobs(folder: Path) -> dict[str, str]:
    """{run name: job id} of every submission recorded in ``folder``."""
    return read_json(folder / JOBS_FILE, default=None) or {}


def queue_states(spec: SlurmSpec) -> dict[str, str]:
    """{job id: state} of this user's jobs in the SLURM queue (array tasks one by one); {} off SLURM
    (the local executor has no queue to ask)."""
    if spec.executor != "slurm":
        return {}
    command = ["squeue", "--me", "--noheader", "--array", "--format=%i|%T"]
    try:
        listing = subprocess.run(command, check=True, capture_output=True, text=True, timeout=60).stdout
    except FileNotFoundError:
        raise FileNotFoundError(
            "launch.backend: slurm, but squeue is not on PATH (not a SLURM login node?)"
        ) from None
    except subprocess.CalledProcessError as error:
        raise RuntimeError(f"{' '.join(command)} failed: {error.stderr.strip()}") from None
    states = {}
    for line in listing.splitlines():
        job, _, state = line.strip().partition("|")
        states[job] = state
    return states


def node_rank() -> int:
    """This task's node within its job (0 outside SLURM)."""
    return int(os.environ.get("SLURM_NODEID", "0"))


def rendezvous_args(nodes: int, port: int) -> list[str]:
    """torchrun's arguments for one node of this job: ``--standalone`` on one node; on several, the first
    node of ``SLURM_JOB_NODELIST`` is the master and ``SLURM_NODEID`` the node's rank."""
    if nodes == 1:
        return ["--standalone"]
    hosts = subprocess.run(
        ["scontrol", "show", "hostnames", os.environ["SLURM_JOB_NODELIST"]],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    job = int(os.environ.get("SLURM_ARRAY_JOB_ID") or os.environ["SLURM_JOB_ID"])
    task = int(os.environ.get("SLURM_ARRAY_TASK_ID") or 0)
    return [
        f"--nnodes={nodes}",
        f"--node_rank={node_rank()}",
        f"--master_addr={hosts[0]}",
        f"--master_port={port + (job + task) % 1000}",
    ]


@contextlib.contextmanager
def preemption_signal_for_children() -> Iterator[None]:
    """Ignore ``PREEMPT_SIGNAL`` here while a child (torchrun) trains: SLURM signals every process of the
    job step, torchrun would die of it, and the workers catch it themselves (they inherit the ignore and
    the trainer installs its handler)."""
    previous = signal.signal(PREEMPT_SIGNAL, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(PREEMPT_SIGNAL, previous)


def sbatch_script(spec: SlurmSpec, name: str, folder: Path, commands: list[str], chdir: Path) -> str:
    """A plain ``sbatch`` array script: task i runs ``commands[i]`` (one line per run) in ``chdir``; a command
    that exits with ``REQUEUE_EXIT_CODE`` (preempted after saving) requeues its task."""
    options: dict[str, Any] = {
        "job-name": name,
        "chdir": str(chdir),
        "array": f"0-{len(commands) - 1}%{min(len(commands), spec.array_parallelism)}",
        "nodes": spec.nodes,
        "ntasks-per-node": 1,
        "time": spec.time_min,
        "signal": f"{PREEMPT_SIGNAL.name.removeprefix('SIG')}@{spec.signal_delay_s}",
        "requeue": None,
        "open-mode": "append",
        "output": f"{folder}/%A_%a.out",
        "error": f"{folder}/%A_%a.err",
        "gpus-per-node": spec.gpus_per_node or None,
        "cpus-per-task": spec.cpus_per_task,
        "mem": None if spec.mem_gb is None else f"{int(spec.mem_gb * 1024)}M",
        "partition": spec.partition,
        "account": spec.account,
        "qos": spec.qos,
    }
    options.update(spec.sbatch)
    lines = ["#!/bin/bash"]
    for key, value in options.items():
        if value is True or (value is None and key == "requeue"):
            lines.append(f"#SBATCH --{key}")
        elif value is not None and value is not False:
            lines.append(f"#SBATCH --{key}={value}")
    lines += ["", python_header(spec), *spec.setup, "", "RUNS=("]
    lines += [f"  {shlex.quote(command)}" for command in commands]
    lines += [
        ")",
        'srun bash -c "${RUNS[$SLURM_ARRAY_TASK_ID]}"',
        "code=$?",
        f"if [ $code -eq {REQUEUE_EXIT_CODE} ]; then",
        '  scontrol requeue "${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"',
        "fi",
        "exit $code",
        "",
    ]
    return "\n".join(lines)


def write_sbatch(path: Path, script: str) -> None:
    write_text_atomic(path, script)
    path.chmod(0o755)


# An sbatch script's python when the config names none: found on the job's PATH when it runs, not the absolute
# path of the interpreter that wrote the script (another machine's, or a virtual environment since removed).
SBATCH_DEFAULT_PYTHON = "python3"


def python_command(spec: SlurmSpec) -> str:
    """The python an sbatch script runs: ``launch.slurm.python``, else ``python3`` from the job's environment."""
    return spec.python or SBATCH_DEFAULT_PYTHON


def python_header(spec: SlurmSpec) -> str:
    """The script's comment saying which python it runs and where that choice came from."""
    if spec.python:
        return f"# python: {spec.python} (launch.slurm.python in the config)"
    return (
        f"# python: {SBATCH_DEFAULT_PYTHON} from the environment the job runs in (its PATH after the setup "
        "lines below); set launch.slurm.python to name another"
    )
