"""``compare --emit-sbatch``: the script runs the python of the environment it is launched in (found on PATH
when the job runs), not the absolute path of the interpreter that wrote it; ``launch.slurm.python`` overrides
it, and the script's header says which."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from sweep_helpers import config, topics_dataset
from tablefree.sweep.slurm import emit_sbatch


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return topics_dataset(tmp_path_factory.mktemp("data"))


def emitted(dataset: Path, tmp_path: Path, python: str | None) -> tuple[str, list[str]]:
    """(the script, its run lines) for a toy sweep with ``launch.slurm.python`` set to ``python``."""
    sweep = config(dataset, tmp_path / "sweep")
    sweep.launch.slurm.python = python
    sweep.launch.slurm.setup = ["source .venv/bin/activate"]
    emit_sbatch(sweep, tmp_path / "sweep.sbatch", log=lambda *_: None)
    script = (tmp_path / "sweep.sbatch").read_text()
    runs = [shlex.split(line)[0] for line in script.split("RUNS=(\n")[1].split("\n)")[0].splitlines()]
    return script, runs


def test_the_script_takes_python_from_the_environment_it_runs_in(dataset, tmp_path) -> None:
    script, runs = emitted(dataset, tmp_path, None)
    assert sys.executable not in script
    assert all(run.startswith("python3 -m tablefree.cli compare ") for run in runs)
    header = "# python: python3 from the environment the job runs in"
    assert header in script and script.index(header) < script.index("source .venv/bin/activate")
    # as a task runs its line: the python3 first on the job's PATH is the one that runs
    shim = tmp_path / "env" / "bin"
    shim.mkdir(parents=True)
    (shim / "python3").write_text('#!/bin/sh\necho "the environment\'s python: $*"\n')
    (shim / "python3").chmod(0o755)
    result = subprocess.run(
        ["bash", "-c", runs[0]], env={"PATH": f"{shim}:/usr/bin:/bin"}, capture_output=True, text=True
    )
    assert result.returncode == 0 and result.stdout.startswith("the environment's python: -m tablefree.cli")


def test_an_explicit_python_overrides_it_and_the_header_says_so(dataset, tmp_path) -> None:
    script, runs = emitted(dataset, tmp_path, "/opt/cluster-env/bin/python")
    assert all(run.startswith("/opt/cluster-env/bin/python -m tablefree.cli compare ") for run in runs)
    assert "# python: /opt/cluster-env/bin/python (launch.slurm.python in the config)" in script
