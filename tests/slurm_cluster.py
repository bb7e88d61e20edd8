"""A one-node SLURM cluster on localhost for the tests: munged, slurmctld and slurmd (Debian's slurm-wlm and
munge), with a munge key, a generated slurm.conf and every state, spool and log file under one directory.
``one_node_cluster(dir)`` yields the environment that points SLURM's commands at it and stops every
daemon it started, also on failure."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")


class ClusterUnavailable(Exception):
    """SLURM cannot run here; the message is the exact error."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def slurm_conf(root: Path, cpus: int) -> str:
    host = socket.gethostname()
    return f"""\
ClusterName=tablefree-test
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire: a requeued job waits this long before it may start again (default 120 s)
AuthInfo=socket={root}/munge.socket,cred_expire=10
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
JobRequeue=1
KillWait=30
MinJobAge=600
NodeName=tablefree-node NodeHostname={host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=2000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


@contextlib.contextmanager
def one_node_cluster(root: Path, cpus: int = 2) -> Iterator[dict[str, str]]:
    missing = [name for name in (*DAEMONS, "sbatch", "squeue", "scontrol") if shutil.which(name) is None]
    if missing:
        raise ClusterUnavailable(f"not installed: {', '.join(missing)} (apt-get install slurm-wlm munge)")
    if os.geteuid() != 0:
        raise ClusterUnavailable("the test cluster runs its daemons as root (SlurmUser=root); not root here")
    for sub in ("state", "spool", "log"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    key = root / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    (root / "slurm.conf").write_text(slurm_conf(root, cpus))
    env = {**os.environ, "SLURM_CONF": str(root / "slurm.conf")}
    munged = ["munged", "--foreground", "--force", f"--socket={root}/munge.socket", f"--key-file={key}"]
    munged += [f"--{name}-file={root}/munge.{name}" for name in ("log", "pid", "seed")]
    commands = {
        "munged": munged,
        "slurmctld": ["slurmctld", "-D", "-i"],
        "slurmd": ["slurmd", "-D", "-N", "tablefree-node"],
    }
    started: list[subprocess.Popen] = []
    try:
        for name, command in commands.items():
            log = open(root / "log" / f"{name}.out", "w")  # noqa: SIM115 (the daemon keeps it)
            started.append(subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT))
            if name == "munged":
                _wait_for(lambda: (root / "munge.socket").exists(), 10, root, name, started[-1])
        _wait_for(lambda: _node_idle(env), 30, root, "slurmd", started[-1])
        yield {"SLURM_CONF": env["SLURM_CONF"]}
    finally:
        subprocess.run(["scancel", "--user=root"], env=env, capture_output=True, timeout=30)
        for process in reversed(started):  # only what this function started, by its own handle
            process.terminate()
        for process in reversed(started):
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _node_idle(env: dict[str, str]) -> bool:
    result = subprocess.run(["sinfo", "-h", "-o", "%t"], env=env, capture_output=True, text=True, timeout=30)
    return result.returncode == 0 and result.stdout.strip() == "idle"


def _wait_for(predicate, timeout_s: float, root: Path, name: str, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if process.poll() is not None or time.monotonic() > deadline:
            log = (root / "log" / f"{name}.out").read_text(errors="replace").strip().splitlines()
            raise ClusterUnavailable(
                f"{name} did not come up (exit {process.poll()}): {' | '.join(log[-5:])}"
            )
        time.sleep(0.2)
