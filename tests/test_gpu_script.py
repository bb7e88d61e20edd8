"""The GPU benchmark script rehearsed on the CPU: ``benchmarks/gpu.sh --dry-run`` runs every section at toy size
with ``python3`` semantics (``$PYTHON``), no ``../shared`` and no ``zstandard``; and ``tablefree.cli`` imports on
a machine without the optional codecs (the GPU image lacks zstandard)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
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


def copied_tree(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A copy of the working tree's benchmarks and sources with ../shared out of reach, as on the GPU machine, and
    an environment that blocks zstandard in every Python the script starts (sitecustomize)."""
    tree = tmp_path / "tree"
    for part in ("benchmarks", "configs", "src"):
        shutil.copytree(REPO / part, tree / part, ignore=shutil.ignore_patterns("__pycache__"))
    block = tmp_path / "block"
    block.mkdir()
    (block / "sitecustomize.py").write_text(BLOCK_ZSTANDARD + "\n")
    env = dict(
        os.environ,
        PYTHON=sys.executable,
        PYTHONPATH=str(block),
        OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"),  # one under `make test`'s workers
        TABLEFREE_PEAK_FLOPS_CACHE=str(tmp_path / "peak_flops.json"),
    )
    return tree, env


def strict_json(path: Path) -> dict:
    def refuse(constant: str) -> None:
        raise AssertionError(f"{path}: bare {constant} (not strict JSON)")

    return json.loads(path.read_text(), parse_constant=refuse)


def check_what_comes_back(out: Path) -> None:
    """What a GPU machine returns: at most 8 files, 16 MiB each, two folders deep; the script promises 6 at most."""
    entries = list(out.rglob("*"))
    assert all(entry.is_file() for entry in entries), entries  # no folders, no scratch left behind
    assert len(entries) <= 6, entries
    assert all(entry.stat().st_size < 16 * 2**20 for entry in entries)


@pytest.mark.slow
def test_gpu_script_dry_run_runs_every_section_on_the_cpu(tmp_path) -> None:
    tree, env = copied_tree(tmp_path)
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
    check_what_comes_back(out)
    assert sorted(p.name for p in out.iterdir()) == [
        "gpu.log", "rehearsal.json", "results.json", "short_run_metrics.jsonl"
    ]  # fmt: skip
    results = strict_json(out / "results.json")
    assert [(s["name"], s["status"]) for s in results["script"]["sections"]] == [
        (name, "ok") for name in ("train", "data", "rehearse", "short", "eval")
    ]
    rehearsal = results["rehearsal"]  # configs/paper-1.7b.yaml, tiny, on 1 process here
    assert (
        rehearsal["ok"] and rehearsal["config"] == "configs/paper-1.7b.yaml" and rehearsal["shape"] == "tiny"
    )
    assert [p["phase"] for p in rehearsal["phases"]][-4:] == ["losses", "export", "eval", "generate"]
    assert rehearsal["phases"][-4]["losses"]["exactly_equal"]
    assert rehearsal == strict_json(out / "rehearsal.json")
    train = results["train"]
    assert set(train["runs"]) == {"learned", "canonical"}
    for figures in train["runs"].values():
        assert figures["tokens_per_s_median"] > 0 and figures["peak_memory_gb"] > 0
        assert figures["trainer_peak_flops"] == pytest.approx(
            train["matmul_ceiling_tflops"] * 1e12, rel=1e-12
        )  # one ceiling for all MFU
        assert (
            figures["mfu_vs_datasheet"] is None and figures["mfu_vs_datasheet_reason"]
        )  # a CPU has no datasheet
        assert figures["header"]["optimizer"].startswith("AdamW")
    assert results["short_run"]["step"] == 20 and results["short_run"]["final_train_loss"] is not None
    metrics = [json.loads(line) for line in (out / "short_run_metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in metrics if "train_loss" in r] == [5, 10, 15, 20]
    assert (
        results["eval"]["documents"] == 24
        and results["eval"]["agreement_tablefree_vs_naive"]["documents"] == 12
    )
    assert "=== eval: ok" in (out / "gpu.log").read_text()


@pytest.mark.slow
def test_gpu_script_keeps_its_deadline_when_a_section_hangs(tmp_path) -> None:
    """The hanging section is stopped at its share, the next still runs, and the whole keeps the deadline."""
    tree, env = copied_tree(tmp_path)
    out = tmp_path / "out"
    started = time.monotonic()
    result = subprocess.run(
        ["bash", "benchmarks/gpu.sh", "--dry-run", "--deadline", "60", "--only", "train,data", str(out)],
        cwd=tree,
        env=dict(env, TABLEFREE_GPU_SH_HANG="train"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    elapsed = time.monotonic() - started
    assert result.returncode == 1, result.stdout[-4000:]
    assert elapsed < 60 + 5, elapsed
    check_what_comes_back(out)
    sections = {s["name"]: s for s in strict_json(out / "results.json")["script"]["sections"]}
    assert sections["train"]["status"].startswith("stopped: out of its") and sections["train"]["seconds"] < 50
    # the next section still ran, in what was left (on a loaded CPU its few seconds may not be enough)
    assert sections["data"]["status"] == "ok" or sections["data"]["status"].startswith("stopped"), sections
    assert (
        sections["data"]["share_s"] >= 5 and sections["train"]["seconds"] + sections["data"]["seconds"] < 60
    )
    assert set(sections) == {"train", "data"}  # --only: short and eval were not run
    assert "sections not ok: train" in (out / "gpu.log").read_text()


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
    results = strict_json(tmp_path / "out" / "results.json")
    assert [s["name"] for s in results["script"]["sections"]] == ["preflight"]


@pytest.mark.slow
def test_train_gpu_falls_back_to_eager_when_compiling_fails(tmp_path) -> None:
    """No C++ compiler for inductor: the compiled FSDP2 attempt fails, the eager one measures, and the next
    interface starts from the attempt that worked."""
    out = tmp_path / "train.json"
    env = dict(
        os.environ,
        PYTHONPATH=str(REPO / "src"),
        CXX=str(tmp_path / "no-such-compiler"),
        TABLEFREE_PEAK_FLOPS_CACHE=str(tmp_path / "peak_flops.json"),
    )
    command = [
        sys.executable, str(REPO / "benchmarks" / "train_gpu.py"), "--device", "cpu", "--preset", "tiny",
        "--micro-batch", "2", "--seq-len", "64", "--steps", "3", "--warmup", "1", "--log-every", "1",
        "--out", str(out),
    ]  # fmt: skip
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    runs = strict_json(out)["runs"]
    learned = runs["learned"]
    assert [(a["compile"], a["status"]) for a in learned["attempts"]] == [(True, "failed"), (False, "ok")]
    assert "cannot run here" in " ".join(learned["attempts"][0]["output_tail"])
    assert (
        learned["compile"] is False and learned["parallel"] == "fsdp" and learned["tokens_per_s_median"] > 0
    )
    assert [(a["compile"], a["status"]) for a in runs["canonical"]["attempts"]] == [(False, "ok")]
