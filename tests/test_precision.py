"""precision/compile auto decisions, bf16 training tracking fp32 on CPU, matched interfaces under bf16 and
compile, and the measured MFU ceiling (tablefree.precision, tablefree.hardware)."""

from __future__ import annotations

import json

import pytest
import torch

from tablefree import hardware, precision
from tablefree.precision import choose_compile, choose_precision
from tablefree.train.trainer import train
from train_helpers import make_dataset, micro_config, record_run, train_losses

CPU = torch.device("cpu")
REAL_PEAK_FLOPS = hardware.peak_flops


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("precision") / "data")


@pytest.fixture
def ceiling_cache(tmp_path, monkeypatch):
    """A private ceiling cache, so tests neither read nor write the user's."""
    path = tmp_path / "peak_flops.json"
    monkeypatch.setenv(hardware.CACHE_ENV, str(path))
    hardware.forget_ceilings_in_use()
    yield path
    hardware.forget_ceilings_in_use()


def fake_ceiling(flops: float, dtype: torch.dtype) -> hardware.Ceiling:
    return hardware.Ceiling(flops, "test cpu", hardware.dtype_name(dtype), 2, "measured", {"test": True})


# ----------------------------------------------------------------------------------------------------------
# precision: auto


@pytest.fixture
def cpu_with(monkeypatch):
    """Pretend the CPU has ``flags`` and these measured bf16/fp32 matmul rates."""

    def configure(flags: list[str], bf16_tflops: float = 2.0, fp32_tflops: float = 0.35) -> None:
        precision.cpu_native_bf16.cache_clear()
        monkeypatch.setattr(hardware, "cpu_bf16_flags", lambda: flags)
        rates = {torch.bfloat16: bf16_tflops * 1e12, torch.float32: fp32_tflops * 1e12}
        monkeypatch.setattr(
            hardware, "peak_flops", lambda device, dtype, **_: fake_ceiling(rates[dtype], dtype)
        )

    yield configure
    precision.cpu_native_bf16.cache_clear()


def test_auto_precision_is_bf16_only_with_native_and_faster_bf16(cpu_with) -> None:
    cpu_with(["avx512_bf16", "amx_bf16"], bf16_tflops=2.0, fp32_tflops=0.35)
    choice = choose_precision("auto", CPU)
    assert choice.value == "bf16"
    assert "avx512_bf16+amx_bf16" in choice.reason and "runtime check passed" in choice.reason

    cpu_with([])
    choice = choose_precision("auto", CPU)
    assert choice.value == "fp32" and "no native bf16" in choice.reason

    # advertised but slower than fp32 (a VM whose host hides AMX): auto must not take it
    cpu_with(["avx512_bf16"], bf16_tflops=0.16, fp32_tflops=0.29)
    choice = choose_precision("auto", CPU)
    assert choice.value == "fp32" and "not faster here" in choice.reason


def test_auto_precision_needs_the_runtime_check(cpu_with, monkeypatch) -> None:
    cpu_with(["avx512_bf16"])
    monkeypatch.setattr(hardware, "bf16_matmul_is_accurate", lambda device: False)
    choice = choose_precision("auto", CPU)
    assert choice.value == "fp32" and "runtime check" in choice.reason


def test_explicit_precision_is_kept_and_nonsense_refused() -> None:
    assert choose_precision("fp32", CPU).value == "fp32"
    assert choose_precision("bf16", CPU).value == "bf16"
    with pytest.raises(ValueError, match="precision"):
        choose_precision("fp16", CPU)


def test_the_runtime_check_really_multiplies() -> None:
    assert hardware.bf16_matmul_is_accurate(CPU) in (True, False)  # runs without raising on any CPU
    if torch.backends.mkldnn.is_available():  # a CPU torch build computes bf16 matmuls (natively or not)
        assert hardware.bf16_matmul_is_accurate(CPU)


# ----------------------------------------------------------------------------------------------------------
# compile: auto


def test_compile_auto_pays_only_for_long_runs_with_a_compiler(monkeypatch) -> None:
    monkeypatch.setattr(precision, "compiler_available", lambda device: (True, "C++ compiler g++"))
    assert choose_compile("auto", CPU, estimated_eager_s=10).value is False
    long_run = choose_compile("auto", CPU, estimated_eager_s=3600)
    assert long_run.value is True and "repays" in long_run.reason
    assert choose_compile(False, CPU, estimated_eager_s=3600).value is False
    assert choose_compile(True, CPU, estimated_eager_s=1).value is True

    monkeypatch.setattr(
        precision, "compiler_available", lambda device: (False, "no C++ compiler for inductor")
    )
    fallback = choose_compile("auto", CPU, estimated_eager_s=3600)
    assert fallback.value is False and "no C++ compiler" in fallback.reason and "eagerly" in fallback.reason
    with pytest.raises(ValueError, match=r"compile: true.*no C\+\+ compiler"):
        choose_compile(True, CPU, estimated_eager_s=3600)


def test_compile_setting_is_validated(data_dir) -> None:
    assert micro_config(data_dir).compile == "auto"
    assert micro_config(data_dir, compile="true").compile is True
    with pytest.raises(ValueError, match="compile"):
        micro_config(data_dir, compile="sometimes")


# ----------------------------------------------------------------------------------------------------------
# The measured ceiling


class FakeClock:
    """A clock that advances ``step`` seconds per reading."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def test_ceiling_is_computed_from_timed_matmuls() -> None:
    # every matmul "takes" 0.5 s of wall time and 0.5 s of CPU per thread: 2·n³ / 0.5 FLOP/s
    threads = torch.get_num_threads()
    ceiling = hardware.measure_ceiling(
        CPU, torch.float32, sizes=(64,), timer=FakeClock(0.5), cpu_timer=FakeClock(0.5 * threads)
    )
    assert ceiling.flops == pytest.approx(2 * 64**3 / 0.5)
    assert ceiling.source == "measured" and ceiling.dtype == "fp32" and ceiling.threads == threads
    # a slower clock gives a lower ceiling: the figure follows the timing, it is not a table entry
    slower = hardware.measure_ceiling(
        CPU, torch.float32, sizes=(64,), timer=FakeClock(1.0), cpu_timer=FakeClock(threads)
    )
    assert slower.flops == pytest.approx(ceiling.flops / 2)


def test_ceiling_is_measured_once_then_cached_with_provenance(ceiling_cache, monkeypatch) -> None:
    calls = []
    real_measure = hardware.measure_ceiling

    def measure(device, dtype, **kwargs):
        calls.append(dtype)
        return real_measure(device, dtype, sizes=(128,))

    monkeypatch.setattr(hardware, "measure_ceiling", measure)
    first = hardware.peak_flops(CPU, torch.float32)
    assert first.source == "measured" and calls == [torch.float32]
    record = json.loads(ceiling_cache.read_text())["records"][
        hardware.cache_key(first.device, "fp32", first.threads)
    ]
    assert record["flops"] == first.flops and record["provenance"]["tflops_by_size"]
    assert record["provenance"]["torch"] == torch.__version__ and record["provenance"]["measured_at"]

    hardware.forget_ceilings_in_use()  # as a new process would
    again = hardware.peak_flops(CPU, torch.float32)
    assert again.source == "cache" and again.flops == first.flops and len(calls) == 1
    hardware.peak_flops(CPU, torch.float32, remeasure=True)
    assert len(calls) == 2
    assert hardware.peak_flops(CPU, torch.float32, override=5e12).source == "override"
    assert len(calls) == 2

    ceiling_cache.write_text("{not json")  # a damaged cache is measured again, not an error
    hardware.forget_ceilings_in_use()
    assert hardware.peak_flops(CPU, torch.float32).source == "measured"


def test_training_reports_mfu_against_the_measured_ceiling(ceiling_cache, data_dir, tmp_path) -> None:
    summary = train(micro_config(data_dir, budget="3 steps", precision="fp32"), tmp_path / "run")
    records = json.loads(ceiling_cache.read_text())["records"]
    (key,) = [k for k in records if "| fp32 |" in k]
    assert summary["peak_flops_per_device"] == records[key]["flops"]
    assert summary["peak_flops_source"]["source"] == "measured"
    assert summary["mfu"] == pytest.approx(summary["tflops_per_device"] * 1e12 / records[key]["flops"])
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    step = next(r for r in metrics if "train_loss" in r)
    assert step["mfu"] == pytest.approx(step["tflops"] * 1e12 / records[key]["flops"])


# ----------------------------------------------------------------------------------------------------------
# bf16 training on CPU


def tiny_config(data_dir, **overrides):
    """The `tiny` preset's body (d=128, 4 layers) at a 64-token context: a few dozen steps take seconds."""
    return micro_config(
        data_dir,
        **{
            "model.d_model": 128,
            "model.n_layers": 4,
            "model.n_heads": 4,
            "model.d_ff": 384,
            "model.max_seq_len": 64,
            "seq_len": 64,
            "micro_batch": 4,
            "batch_tokens": 256,
            "budget": "24 steps",
            "optim.lr": 4e-3,
            "compile": "false",
            **overrides,
        },
    )


@pytest.mark.slow
def test_bf16_training_on_cpu_tracks_fp32(data_dir, tmp_path) -> None:
    fp32 = train(tiny_config(data_dir, precision="fp32"), tmp_path / "fp32")
    bf16 = train(tiny_config(data_dir, precision="bf16"), tmp_path / "bf16")
    assert (fp32["precision"], bf16["precision"]) == ("fp32", "bf16")
    a, b = train_losses(tmp_path / "fp32"), train_losses(tmp_path / "bf16")
    assert a.keys() == b.keys() and len(a) == 24
    assert a[24] < a[1] - 1.0  # it learned (4.6 -> 2.5), so tracking is not trivially two flat lines
    # Stated tolerance: each step's loss within 2% of fp32, and the final validation loss within 2% (measured:
    # at most 0.4% apart over the 24 steps).
    for step in a:
        assert b[step] == pytest.approx(a[step], rel=0.02), step
    assert bf16["final_val_loss_estimate"] == pytest.approx(fp32["final_val_loss_estimate"], rel=0.02)
    assert a != b  # bf16 really ran (autocast changes the rounding)


def assert_matched(monkeypatch, data_dir, tmp_path, **overrides) -> dict:
    runs, summaries = {}, {}
    for name in ("learned", "canonical", "affine"):
        config = micro_config(data_dir, budget="2 steps", **{"model.interface.name": name, **overrides})
        runs[name], summaries[name] = record_run(monkeypatch, config, tmp_path / name)
    backbone = {k: v for k, v in runs["learned"]["init"].items() if not k.startswith("input.")}
    assert len(backbone) > 10
    for name in ("canonical", "affine"):
        other = {k: v for k, v in runs[name]["init"].items() if not k.startswith("input.")}
        assert other.keys() == backbone.keys()
        assert all(torch.equal(other[k], backbone[k]) for k in backbone)
        assert all(v.dtype == torch.float32 for v in other.values())  # master weights stay fp32
        assert len(runs[name]["targets"]) == len(runs["learned"]["targets"]) == 4
        assert all(
            torch.equal(a, b) for a, b in zip(runs[name]["targets"], runs["learned"]["targets"], strict=True)
        )
    return {"runs": runs, "summaries": summaries}


def test_interfaces_stay_matched_under_bf16(monkeypatch, data_dir, tmp_path) -> None:
    result = assert_matched(monkeypatch, data_dir, tmp_path, precision="bf16")
    for name, summary in result["summaries"].items():
        assert summary["precision"] == "bf16", name
        assert result["runs"][name]["logits_dtype"] == torch.bfloat16, name  # autocast was on


@pytest.mark.slow
def test_interfaces_stay_matched_under_bf16_compile_and_checkpointing(
    monkeypatch, data_dir, tmp_path
) -> None:
    """The GPU run's settings together, at small shapes so that a CPU without native bf16 runs them too (the
    paper's shapes under them: tests/test_train_gpu_shapes.py)."""
    available, why = precision.compiler_available(CPU)
    if not available:
        pytest.skip(f"torch.compile cannot run here: {why}")
    gpu_settings = {"precision": "bf16", "compile": "true", "activation_checkpointing": "true"}
    result = assert_matched(monkeypatch, data_dir, tmp_path, **gpu_settings)
    for name, summary in result["summaries"].items():
        assert summary["compiled"] is True and summary["precision"] == "bf16", name
    # compiled bf16 computes the same model as eager bf16 (same first-step loss to bf16 precision)
    eager = train(
        micro_config(data_dir, budget="2 steps", **{**gpu_settings, "compile": "false"}), tmp_path / "eager"
    )
    compiled = train_losses(tmp_path / "learned")
    assert compiled[1] == pytest.approx(train_losses(tmp_path / "eager")[1], rel=0.01)
    assert eager["compiled"] is False


def test_hardware_command_reports_measured_ceilings(ceiling_cache, monkeypatch, capsys, cpu_with) -> None:
    from tablefree.cli import main

    cpu_with(["avx512_bf16"])
    monkeypatch.setattr(hardware, "peak_flops", REAL_PEAK_FLOPS)  # measured for real, at a small size
    monkeypatch.setitem(hardware.SIZES, "cpu", (64,))
    assert main(["hardware", "--device", "cpu", "--json"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert [c["dtype"] for c in report["ceilings"]] == ["fp32", "bf16"]
    assert all(c["source"] == "measured" and c["flops"] > 0 for c in report["ceilings"])
    assert "measuring the fp32 matmul ceiling" in captured.err  # progress, before each measurement
    assert report["threading"]["threads"] == torch.get_num_threads()
    assert report["precision_auto"]["value"] in ("fp32", "bf16") and report["precision_auto"]["reason"]
    assert ceiling_cache.exists()
    assert main(["hardware", "--device", "cpu", "--threads", "0"]) == 1  # a clear error, not a traceback


def test_hardware_skips_the_bf16_ceiling_where_auto_never_picks_bf16(
    ceiling_cache, monkeypatch, capsys
) -> None:
    """A CPU without native bf16 emulates it (minutes at full size): nothing measures it unless asked."""
    from tablefree.cli import main

    precision.cpu_native_bf16.cache_clear()
    monkeypatch.setattr(hardware, "cpu_bf16_flags", lambda: [])
    monkeypatch.setitem(hardware.SIZES, "cpu", (64,))
    measured = []
    real_measure = hardware.measure_ceiling
    monkeypatch.setattr(
        hardware,
        "measure_ceiling",
        lambda d, dtype, **k: measured.append(dtype) or real_measure(d, dtype, **k),
    )
    try:
        assert main(["hardware", "--device", "cpu"]) == 0
        out = capsys.readouterr().out
        assert measured == [torch.float32]
        assert "bf16 matmul ceiling: not measured: precision: auto never picks bf16 here" in out
        assert "--bf16 measures it" in out and "precision: auto -> fp32" in out
        assert main(["hardware", "--device", "cpu", "--bf16", "--json"]) == 0
        assert measured == [torch.float32, torch.bfloat16]
    finally:
        precision.cpu_native_bf16.cache_clear()


def test_a_dtype_too_slow_for_every_size_is_measured_by_its_pilot_alone() -> None:
    """Each matmul "takes" 1 s: the 256² pilot says a 512² measurement would take ~32 s, over the cap, so the
    pilot is the ceiling and 512 is said to be skipped (an emulated bf16 no longer costs tens of seconds)."""
    threads = torch.get_num_threads()
    ceiling = hardware.measure_ceiling(
        CPU, torch.float32, sizes=(512,), timer=FakeClock(1.0), cpu_timer=FakeClock(threads)
    )
    assert ceiling.provenance["sizes_skipped"] == [512] and ceiling.provenance["best_size"] == 256
    assert ceiling.flops == pytest.approx(2 * 256**3)
    fast = hardware.measure_ceiling(  # each matmul 1 µs: 512² is measured, the pilot only sized it
        CPU, torch.float32, sizes=(512,), timer=FakeClock(1e-6), cpu_timer=FakeClock(1e-6 * threads)
    )
    assert fast.provenance["sizes_skipped"] == [] and fast.provenance["best_size"] == 512


class SteppedClock(FakeClock):
    """``step`` seconds per reading for the first ``readings``, then ``later`` per reading."""

    def __init__(self, step: float, readings: int, later: float) -> None:
        super().__init__(step)
        self.left, self.later = readings, later

    def __call__(self) -> float:
        if self.left == 0:
            self.step = self.later
        self.left -= 1
        return super().__call__()


def test_a_size_whose_warm_up_passes_the_cap_is_measured_by_that_one_matmul() -> None:
    """An emulated dtype's rate falls with the size: the pilot (warm-up + 3 repeats, 8 readings) runs at 1 µs a
    matmul, so 512² looks cheap, but its warm-up "takes" 2 s, and 3 more would pass the 3 s cap: the warm-up is
    its measurement, said so, and nothing more is timed."""
    threads = torch.get_num_threads()
    timer, cpu_timer = SteppedClock(1e-6, 8, 2.0), SteppedClock(1e-6 * threads, 8, 2.0 * threads)
    ceiling = hardware.measure_ceiling(CPU, torch.float32, sizes=(512,), timer=timer, cpu_timer=cpu_timer)
    assert ceiling.provenance["sizes_skipped"] == [] and ceiling.provenance["sizes_from_one_matmul"] == [512]
    assert ceiling.provenance["best_size"] == 512 and ceiling.flops == pytest.approx(2 * 512**3 / 2.0)
    assert timer.now == pytest.approx(8e-6 + 2 * 2.0)  # the warm-up's two readings, no repeat
    assert (
        hardware.measure_ceiling(  # a steady clock: every size repeated, none from one matmul
            CPU, torch.float32, sizes=(512,), timer=FakeClock(1e-6), cpu_timer=FakeClock(1e-6 * threads)
        ).provenance["sizes_from_one_matmul"]
        == []
    )
    # not on an accelerator (here the meta device), whose first matmul can carry library start-up: repeated
    meta, clock = torch.device("meta"), FakeClock(2.0)
    assert hardware.matmul_seconds(meta, torch.float32, 64, min_seconds=0, max_seconds=3, timer=clock) == (
        2.0,
        3,
    )
    one = hardware.matmul_seconds(
        CPU, torch.float32, 64, min_seconds=0, max_seconds=3, timer=clock, cpu_timer=FakeClock(2.0 * threads)
    )
    assert one == (2.0, 1)  # the same clock on a CPU: its warm-up is the one sample


def test_a_slow_dtype_is_measured_at_the_smaller_sizes_only() -> None:
    """Each 64² matmul "takes" 1 s: a 128² one would take ~8 s, over the cap, so it is skipped and said so."""
    threads = torch.get_num_threads()
    ceiling = hardware.measure_ceiling(
        CPU, torch.float32, sizes=(64, 128), timer=FakeClock(1.0), cpu_timer=FakeClock(threads)
    )
    assert ceiling.provenance["sizes_skipped"] == [128] and ceiling.provenance["best_size"] == 64
    assert ceiling.flops == pytest.approx(2 * 64**3)
    assert hardware.format_flops(ceiling.flops) == "0.000524 GFLOP/s"  # not "0.00 TFLOP/s"
    assert hardware.format_flops(0.31e12) == "0.31 TFLOP/s"


def ceiling_record(flops: float, load: float, cores: int = 2, threads: int = 2) -> hardware.Ceiling:
    provenance = {"load_average": load, "logical_cores": cores, "measured_at": f"load {load}"}
    return hardware.Ceiling(flops, hardware.device_name(CPU), "fp32", threads, "measured", provenance)


def test_the_cache_keeps_the_best_figure_and_measures_again_after_a_loaded_one(
    ceiling_cache, monkeypatch
) -> None:
    """The issue's machine: 0.18 TFLOP/s cached at load 1.1 on 2 busy cores, about 0.31 idle."""
    threads = torch.get_num_threads()
    figures = iter([0.18e12, 0.31e12, 0.25e12])
    loads = {"now": 1.1}
    monkeypatch.setattr(hardware, "load_average", lambda: loads["now"])
    monkeypatch.setattr(
        hardware,
        "measure_ceiling",
        lambda device, dtype: ceiling_record(next(figures), loads["now"], threads=threads),
    )

    def fresh(**kwargs) -> hardware.Ceiling:
        hardware.forget_ceilings_in_use()  # as a new process would
        return hardware.peak_flops(CPU, torch.float32, **kwargs)

    first = fresh()
    assert first.flops == 0.18e12
    assert hardware.under_load(ceiling_record(0.18e12, 1.1, cores=2, threads=2))  # no core was free
    assert not hardware.under_load(ceiling_record(0.31e12, 0.2, cores=2, threads=2))
    assert not hardware.under_load(
        ceiling_record(0.3e12, 1.1, cores=16, threads=2)
    )  # the load had cores to spare
    monkeypatch.setattr(hardware, "under_load", lambda ceiling: ceiling.provenance["load_average"] > 0.5)
    assert fresh().source == "cache"  # still as loaded as then: measuring again would not do better
    loads["now"] = 0.1
    idle = fresh()
    assert idle.flops == 0.31e12 and idle.source == "measured"
    assert fresh().flops == 0.31e12 and fresh().source == "cache"  # idle now: no more measuring
    lower = fresh(remeasure=True)  # 0.25 measured: the best figure stays, the lower one is recorded beside it
    assert lower.flops == 0.31e12 and lower.provenance["latest_lower"]["flops"] == 0.25e12
    record = next(iter(json.loads(ceiling_cache.read_text())["records"].values()))
    assert record["flops"] == 0.31e12


def test_a_process_uses_one_ceiling_however_often_it_asks(ceiling_cache, monkeypatch) -> None:
    monkeypatch.setitem(hardware.SIZES, "cpu", (64,))
    first = hardware.peak_flops(CPU, torch.float32)
    ceiling_cache.unlink()  # even with the cache gone (or rewritten by another process)
    assert hardware.peak_flops(CPU, torch.float32) is first
