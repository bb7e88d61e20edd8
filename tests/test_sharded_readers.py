"""A sharded (FSDP2/DCP) checkpoint written by 2 processes under torchrun (gloo, CPU) is read as a full one by
every reader: export (loaded back by ``transformers``, logits equal to the consolidated model's in fp32, the
provenance hashing the shard files), eval, generate, analyze and the lm-eval adapter; a missing, truncated or
altered shard is refused by each of them, naming the file."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tablefree.checkpoint import layout
from tablefree.checkpoint.layout import MODEL_FILE, SHARDED_DIR, CheckpointError, is_sharded
from tablefree.checkpoint.model_dir import consolidate, empty_model, load_model, read_model_config
from tablefree.fileio import sha256_file
from train_helpers import cli_env, make_dataset, micro_config, write_config

pytestmark = pytest.mark.slow
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def sharded_run(tmp_path_factory) -> tuple[Path, Path]:
    """(run directory, dataset) of 4 FSDP2 steps on 2 processes, saved as a sharded checkpoint."""
    root = tmp_path_factory.mktemp("sharded-readers")
    data_dir = make_dataset(root / "data")
    manifest = json.loads((data_dir / "manifest.json").read_text())
    manifest["splits"]["val"]["document_starts"] = [0]  # one validation document, for eval and analyze
    (data_dir / "manifest.json").write_text(json.dumps(manifest))
    config = micro_config(data_dir, budget="4 steps", micro_batch=2, checkpoint_every=4)
    config_path = write_config(root / "config.yaml", config)
    run_dir = root / "run"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone",
        "-m", "tablefree.cli", "train", "--config", str(config_path), "--run-dir", str(run_dir),
        "parallel=fsdp", "checkpoint_format=sharded",
    ]  # fmt: skip
    result = subprocess.run(command, env=cli_env(), capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    final = layout.latest_checkpoint(run_dir)
    assert is_sharded(final) and not (final / MODEL_FILE).exists()
    return run_dir, data_dir


def consolidated_model(checkpoint: Path, tmp_path: Path) -> torch.nn.Module:
    """The model of ``consolidate``'s single file, in a copy of the checkpoint (the original stays sharded)."""
    copy = tmp_path / "consolidated"
    shutil.copytree(checkpoint, copy)
    model = empty_model(read_model_config(copy))
    model.load_state_dict(load_file(str(consolidate(copy))), strict=True)
    return model.eval()


def test_export_of_a_sharded_checkpoint_loads_in_transformers_with_the_consolidated_logits(
    sharded_run, tmp_path
) -> None:
    from tablefree.export import export_hf

    run_dir, _ = sharded_run
    checkpoint = layout.latest_checkpoint(run_dir)
    export_hf(run_dir, tmp_path / "hf")
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    model = consolidated_model(checkpoint, tmp_path)
    ids = torch.randint(0, model.config.vocab_size, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours, theirs, loaded = model(ids), hf(ids).logits, load_model(run_dir)[0](ids)
    assert ours.std() > 0.1  # trained a little: not all-equal logits
    assert torch.equal(loaded, ours)  # load_model reads the shards to the same weights
    assert (ours - theirs).abs().max() <= 1e-5 * ours.abs().max()

    recorded = json.loads((tmp_path / "hf" / "config.json").read_text())["tablefree"]
    files = {
        p.relative_to(checkpoint).as_posix(): sha256_file(p) for p in (checkpoint / SHARDED_DIR).iterdir()
    }
    assert recorded["source_weights_format"] == "dcp"
    assert recorded["source_weights_files"] == files and len(files) == 3  # .metadata and one file per rank
    listing = "".join(f"{digest}  {name}\n" for name, digest in sorted(files.items()))
    assert recorded["source_weights_sha256"] == hashlib.sha256(listing.encode()).hexdigest()
    assert recorded["source_weights_sha256"] in (tmp_path / "hf" / "README.md").read_text()


def read_with_every_reader(
    run_dir: Path, data_dir: Path, tmp_path: Path, capsys, verify: bool = True
) -> dict[str, object]:
    """Each reader's result on ``run_dir``, or the message of the CheckpointError it was refused with (for
    ``tablefree generate``, the command line's one-line error)."""
    from tablefree.analysis import AnalyzeSpec, run_analysis
    from tablefree.cli import main
    from tablefree.evaluate import EvalSpec, run_eval
    from tablefree.evaluate.lm_eval_adapter import TablefreeLMEval
    from tablefree.export import export_hf

    def generate() -> object:
        capsys.readouterr()
        no_verify = [] if verify else ["--no-verify"]
        code = main(
            [
                "generate",
                str(run_dir),
                "--prompt",
                "t1 t2",
                "--max-new-tokens",
                "4",
                "--seed",
                "0",
                *no_verify,
            ]
        )
        captured = capsys.readouterr()
        return captured.out if code == 0 else Refused(captured.err)

    readers = {
        "export": lambda: export_hf(run_dir, tmp_path / "hf", verify=verify),
        "eval": lambda: run_eval(
            EvalSpec(run_dir, ["validation"], val_data=data_dir, limit=2, verify=verify)
        ),
        "generate": generate,
        "analyze": lambda: run_analysis(AnalyzeSpec(run_dir, data=data_dir, positions=64, verify=verify)),
        "lm-eval": lambda: TablefreeLMEval(checkpoint=str(run_dir), verify=verify),
    }
    results: dict[str, object] = {}
    for name, read in readers.items():
        try:
            results[name] = read()
        except CheckpointError as error:
            results[name] = Refused(str(error))
    return results


class Refused(str):
    """The message a reader refused a checkpoint with."""


def test_every_reader_takes_a_sharded_checkpoint(sharded_run, tmp_path, capsys) -> None:
    run_dir, data_dir = sharded_run
    results = read_with_every_reader(run_dir, data_dir, tmp_path, capsys)
    assert not {name: result for name, result in results.items() if isinstance(result, Refused)}
    assert results["generate"].startswith("t1 t2") and len(results["generate"].split()) > 2
    assert results["eval"]["tasks"]["validation"]["tokens"] > 0
    assert results["analyze"]["interface"] == read_model_config(run_dir).interface.name
    assert results["lm-eval"].model.config == read_model_config(run_dir)


def damage(checkpoint: Path, how: str) -> Path:
    shard = checkpoint / SHARDED_DIR / "__1_0.distcp"
    if how == "missing":
        shard.unlink()
    elif how == "truncated":
        shard.write_bytes(shard.read_bytes()[:-8])
    else:  # altered: the same length, one byte changed
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0xFF
        shard.write_bytes(bytes(data))
    return shard


@pytest.mark.parametrize(
    "how, verify", [("missing", True), ("missing", False), ("truncated", False), ("altered", True)]
)
def test_every_reader_refuses_a_damaged_shard_naming_it(sharded_run, tmp_path, capsys, how, verify) -> None:
    """With the digests (verify) any change is found; without them (--no-verify) the structural check still
    finds a missing or truncated shard before DCP reads anything."""
    run_dir, data_dir = sharded_run
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    shard = damage(layout.latest_checkpoint(copy), how)
    results = read_with_every_reader(copy, data_dir, tmp_path, capsys, verify=verify)
    for name, result in results.items():
        assert isinstance(result, Refused), f"{name} read a checkpoint with a {how} shard"
        assert str(shard) in str(result), name
