"""The GPU benchmark script rehearsed on the CPU: ``benchmarks/gpu.sh --dry-run`` runs every section at toy size
with ``python3`` semantics (``$PYTHON``), no ``../shared`` and no ``zstandard``; and ``tablefree.cli`` imports on
a machine without the optional codecs (the GPU image lacks zstandard)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BLOCK_ZSTANDARD = "import sys; sys.modules['zstandard'] = None; "


def test_the_cli_imports_and_prints_help_without_zstandard() -> None:
    code = (
        BLOCK_ZSTANDARD
        + "import tablefree.cli; sys.argv = ['tablefree', 'train', '--help']; tablefree.cli.main()"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "--run-dir" in result.stdout


@pytest.mark.slow
def test_gpu_script_dry_run_runs_every_section_on_the_cpu(tmp_path) -> None:
    """Run from a copy of the working tree's benchmarks and sources with ../shared out of reach, as on the
    GPU machine; zstandard is blocked in every Python the script starts (sitecustomize)."""
    tree = tmp_path / "tree"
    for part in ("benchmarks", "src"):
        shutil.copytree(REPO / part, tree / part, ignore=shutil.ignore_patterns("__pycache__"))
    block = tmp_path / "block"
    block.mkdir()
    (block / "sitecustomize.py").write_text(BLOCK_ZSTANDARD + "\n")
    env = dict(os.environ, PYTHON=sys.executable, PYTHONPATH=str(block), OMP_NUM_THREADS="2")
    out = tmp_path / "out"
    result = subprocess.run(
        ["bash", "benchmarks/gpu.sh", "--dry-run", str(out)],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "all sections ok" in result.stdout
    train = json.loads((out / "train.json").read_text())
    assert set(train["runs"]) == {"learned", "canonical"}
    for figures in train["runs"].values():
        assert figures["tokens_per_s_median"] > 0 and figures["peak_memory_gb"] > 0
    # the run directories (and their checkpoints) are gone
    assert not [p for p in out.rglob("*.safetensors")]
    evaluation = json.loads((out / "eval.json").read_text())
    assert evaluation["documents"] == 24 and evaluation["agreement_tablefree_vs_naive"]["documents"] == 12


def test_gpu_script_stops_up_front_without_a_gpu(tmp_path) -> None:
    """Without --dry-run on a machine with no CUDA, the preflight refuses before any section runs."""
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    env = dict(os.environ, PYTHON=sys.executable)
    result = subprocess.run(
        ["bash", "benchmarks/gpu.sh", str(tmp_path / "out")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1
    assert "no CUDA device" in result.stdout and "preflight failed" in result.stdout
    assert not (tmp_path / "out" / "train.txt").exists()
