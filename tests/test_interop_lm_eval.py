"""Parity with lm-evaluation-harness: ``tablefree eval``, lm-eval with our adapter, and lm-eval's own ``hf``
backend on the exported directory agree on the same checkpoint and the same 100 examples of HellaSwag, PIQA
and LAMBADA, loaded through local task definitions that include lm-eval's official task YAMLs."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import pytest

# Nothing may download: set before lm-eval / datasets read their configuration.
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # lm-eval's hf backend imports it
lm_eval = pytest.importorskip("lm_eval")

from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.api.registry import get_model  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402

from interop_support import make_checkpoint, make_tokenizer  # noqa: E402
from tablefree.checkpoint.layout import resolve_checkpoint  # noqa: E402
from tablefree.checkpoint.model_dir import read_model_config  # noqa: E402
from tablefree.cli import main  # noqa: E402
from tablefree.data.tokenizer import load_tokenizer  # noqa: E402
from tablefree.device import resolve_device  # noqa: E402
from tablefree.evaluate import EvalSpec, run_eval  # noqa: E402
from tablefree.evaluate.lm_eval_adapter import TablefreeLMEval, write_local_tasks  # noqa: E402
from tablefree.export import export_hf  # noqa: E402
from tablefree.model_config import ModelConfig, from_dict  # noqa: E402

N = 100  # examples per task
TOLERANCE = 1e-4  # per-example log-likelihood
# Our task name -> the local lm-eval task that mirrors it.
TASKS = {"hellaswag": "parity_hellaswag", "piqa": "parity_piqa", "lambada": "parity_lambada"}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, shared_data) -> Path:
    """A tiny affine-interface GQA model trained for a few dozen steps by ``tablefree.train`` on real text."""
    from tablefree.data.prepare import prepare_dataset
    from tablefree.train.recipe import TrainConfig
    from tablefree.train.trainer import train

    root = tmp_path_factory.mktemp("parity")
    corpus = shared_data / "corpus" / "gutenberg-mix" / "holidays" / "christmas"
    prepare_dataset(
        corpus, root / "data", vocab_size=2048, val_fraction=0.2, workers=1, gutenberg=True, progress=False
    )
    model = dict(preset="tiny", interface={"name": "affine"}, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2)
    config = {
        "model": {**model, "d_ff": 128, "max_seq_len": 256},
        "data": {"dir": str(root / "data")},
        "budget": "30 steps",
        "seq_len": 64,
        "batch_tokens": 512,
        "micro_batch": 8,
        "optim": {"lr": 4e-3},
        "schedule": {"warmup_steps": 3},
        "device": "cpu",
        "precision": "fp32",
        "log_every": 30,
        "val_batches": 1,
    }
    train(from_dict(TrainConfig, config), root / "run")
    return resolve_checkpoint(root / "run")


@pytest.fixture(scope="module")
def hf_dir(checkpoint, tmp_path_factory) -> Path:
    return export_hf(checkpoint, tmp_path_factory.mktemp("export") / "hf")


@pytest.fixture(scope="module")
def task_manager(tmp_path_factory, shared_data) -> TaskManager:
    """Local lm-eval tasks (``write_local_tasks``): lm-eval's official YAML (prompts, choices, targets,
    metrics, HellaSwag's preprocessing) with the data swapped for the first N records of the shared files."""
    root = tmp_path_factory.mktemp("lm_eval_tasks")
    names = write_local_tasks(root, shared_data / "eval", list(TASKS), limit=N, prefix="parity_")
    assert names == TASKS
    return TaskManager(include_path=str(root), include_defaults=False)


def _lm_eval(
    model: str, model_args: dict, task_manager: TaskManager, tasks: dict = TASKS, limit: int = N
) -> dict:
    """Per task: aggregate metrics and per-example log-likelihoods, greedy flags, acc, acc_norm."""
    results = lm_eval.simple_evaluate(
        model=model,
        model_args=model_args,
        tasks=list(tasks.values()),
        task_manager=task_manager,
        batch_size=32,
        device="cpu",
        limit=limit,
        log_samples=True,
        bootstrap_iters=0,
    )
    per_task = {}
    for ours, name in tasks.items():
        samples = {s["doc_id"]: s for s in results["samples"][name]}
        per_task[ours] = {
            "metrics": results["results"][name],
            "loglikelihoods": {i: [r[0] for r in s["filtered_resps"]] for i, s in samples.items()},
            "greedy": {i: [r[1] for r in s["filtered_resps"]] for i, s in samples.items()},
            "acc": {i: s["acc"] for i, s in samples.items()},
            "acc_norm": {i: s.get("acc_norm") for i, s in samples.items()},
        }
    return per_task


def _tablefree_eval(checkpoint: Path, data_dir: Path, tasks: list[str], limit: int, scratch: Path) -> dict:
    """The same, from ``run_eval`` and its per-example records."""
    examples = scratch / "examples.jsonl"
    ours = run_eval(
        EvalSpec(  # fp32 like the other two scorers: `auto` is bf16 on CPUs with fast native bf16
            checkpoint,
            tasks,
            data_dir=data_dir,
            limit=limit,
            examples_out=examples,
            bootstrap_iters=0,
            dtype="fp32",
        )
    )
    records = [json.loads(line) for line in examples.read_text().splitlines()]
    per_task = {}
    for task in tasks:
        rows = {r["doc_id"]: r for r in records if r["task"] == task}
        per_task[task] = {
            "metrics": ours["tasks"][task]["metrics"],
            "loglikelihoods": {i: r["loglikelihoods"] for i, r in rows.items()},
            "greedy": {
                i: r["greedy"] if isinstance(r["greedy"], list) else [r["greedy"]] for i, r in rows.items()
            },
            "acc": {i: r["acc"] for i, r in rows.items()},
            "acc_norm": {i: r.get("acc_norm") for i, r in rows.items()},
        }
    return per_task


@pytest.fixture(scope="module")
def three_ways(checkpoint, hf_dir, task_manager, shared_data, tmp_path_factory) -> dict:
    scratch = tmp_path_factory.mktemp("ours")
    return {
        "tablefree eval": _tablefree_eval(checkpoint, shared_data / "eval", list(TASKS), N, scratch),
        "lm-eval tablefree": _lm_eval("tablefree", {"checkpoint": str(checkpoint)}, task_manager),
        # float64 log-softmax: in fp32, a sum of ~300 log-probs near -1300 (a long PIQA solution) has a resolution
        # of 1.2e-4 (one ulp), coarser than the tolerance; we sum in float64 too.
        "lm-eval hf": _lm_eval(
            "hf", {"pretrained": str(hf_dir), "dtype": "float32", "softmax_dtype": "float64"}, task_manager
        ),
    }


@pytest.mark.slow
@pytest.mark.parametrize("task", list(TASKS))
def test_per_example_loglikelihoods_agree(three_ways, task):
    reference = three_ways["tablefree eval"][task]["loglikelihoods"]
    assert sorted(reference) == list(range(N))
    values = [ll for lls in reference.values() for ll in lls]
    assert max(values) - min(values) > 1.0  # predictions are not degenerate
    for scorer, results in three_ways.items():
        theirs = results[task]["loglikelihoods"]
        assert theirs.keys() == reference.keys(), scorer
        for doc_id, lls in reference.items():
            assert len(theirs[doc_id]) == len(lls), (scorer, doc_id)
            for ours, other in zip(lls, theirs[doc_id], strict=True):
                assert abs(ours - other) <= TOLERANCE, (scorer, task, doc_id, ours, other)


@pytest.mark.slow
@pytest.mark.parametrize("task", list(TASKS))
def test_accuracies_are_identical(three_ways, task):
    reference = three_ways["tablefree eval"][task]
    metrics = ["acc", "acc_norm"] if task != "lambada" else ["acc"]
    for scorer, results in three_ways.items():
        for metric in metrics:
            assert results[task][metric] == reference[metric], (scorer, task, metric)
        assert results[task]["greedy"] == reference["greedy"], (scorer, task)
        aggregate = results[task]["metrics"]
        for metric in metrics:
            value = aggregate.get(metric, aggregate.get(f"{metric},none"))
            assert value == pytest.approx(sum(reference[metric].values()) / N, abs=1e-12), (scorer, metric)


EXTRA_TASKS = ("arc_easy", "arc_challenge", "winogrande", "openbookqa", "sciq", "boolq", "copa")


@pytest.mark.slow
def test_other_tasks_match_lm_eval_official_configs(checkpoint, shared_data, tmp_path):
    """The other seven tasks of ``tablefree eval`` against lm-eval's official YAMLs (through the adapter, which
    scores with the same engine, so any difference is in prompts, choices, targets or metrics)."""
    limit = 25
    tasks = write_local_tasks(
        tmp_path / "tasks", shared_data / "eval", EXTRA_TASKS, limit=limit, prefix="extra_"
    )
    manager = TaskManager(include_path=str(tmp_path / "tasks"), include_defaults=False)
    theirs = _lm_eval("tablefree", {"checkpoint": str(checkpoint)}, manager, tasks, limit)
    ours = _tablefree_eval(checkpoint, shared_data / "eval", list(EXTRA_TASKS), limit, tmp_path)
    for task in EXTRA_TASKS:
        assert theirs[task]["acc"] == ours[task]["acc"], task
        if None not in theirs[task]["acc_norm"].values():  # lm-eval reports it for this task
            assert theirs[task]["acc_norm"] == ours[task]["acc_norm"], task
        assert (
            theirs[task]["loglikelihoods"].keys() == ours[task]["loglikelihoods"].keys() == set(range(limit))
        )
        for doc_id, lls in ours[task]["loglikelihoods"].items():
            other = theirs[task]["loglikelihoods"][doc_id]
            assert len(other) == len(lls), (task, doc_id)
            assert all(abs(a - b) <= TOLERANCE for a, b in zip(lls, other, strict=True)), (task, doc_id)


def test_local_tasks_from_a_relative_dir_hold_absolute_paths(shared_data, tmp_path, monkeypatch):
    import yaml

    monkeypatch.chdir(tmp_path)
    names = write_local_tasks("rel", shared_data / "eval", "lambada_openai,piqa", limit=3)
    assert names == {"lambada": "tablefree_lambada", "piqa": "tablefree_piqa"}  # one name per task
    config = yaml.safe_load((tmp_path / "rel/tablefree_lambada.yaml").read_text())
    data = Path(config["dataset_kwargs"]["data_files"]["test"])
    assert data.is_absolute() and data == tmp_path / "rel/tablefree_lambada.jsonl" and data.is_file()
    assert Path(config["dataset_kwargs"]["cache_dir"]).is_absolute()
    assert Path(config["include"]).is_file() and config["include"].endswith("lambada/lambada_openai.yaml")
    piqa = [json.loads(line) for line in (tmp_path / "rel/tablefree_piqa.jsonl").read_text().splitlines()]
    assert len(piqa) == 3 and {r["label"] for r in piqa} <= {0, 1}


def test_lm_eval_cli_gets_the_engines_batch_size_unless_one_is_given(monkeypatch):
    from tablefree.evaluate import lm_eval_adapter
    from tablefree.evaluate.lm_eval_adapter import DEFAULT_BATCH_SIZE, run_cli

    seen = []
    monkeypatch.setattr(lm_eval_adapter, "cli_evaluate", lambda: seen.append(list(sys.argv)))
    base = ["run", "--model", "tablefree", "--tasks", "t"]
    run_cli([*base, "--model_args", "checkpoint=c"])
    run_cli([*base, "--model_args", "checkpoint=c,batch_size=5"])  # lm-eval refuses it in both places
    run_cli([*base, "--model_args", "checkpoint=c", "--batch_size", "3"])
    run_cli(["run", "--model", "hf", "--model_args", "pretrained=p"])  # other models: lm-eval's own default
    assert seen == [
        ["lm-eval", *base, "--model_args", "checkpoint=c", "--batch_size", str(DEFAULT_BATCH_SIZE)],
        ["lm-eval", *base, "--model_args", "checkpoint=c", "--batch_size", "5"],
        ["lm-eval", *base, "--model_args", "checkpoint=c", "--batch_size", "3"],
        ["lm-eval", "run", "--model", "hf", "--model_args", "pretrained=p"],
    ]


def test_adapter_is_registered():
    assert get_model("tablefree") is TablefreeLMEval


def test_device_falls_back_to_cpu_without_cuda(monkeypatch):
    import torch

    def adapter_device(requested):  # what TablefreeLMEval resolves its device argument with
        return str(resolve_device(requested, fallback_to_cpu=True))

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert adapter_device("cuda:0") == "cpu"  # lm-eval's CLI default
    assert adapter_device(None) == "cpu"
    assert adapter_device("cpu") == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert adapter_device("cuda:1") == "cuda:1"
    assert adapter_device(None) == "cuda"


def test_adapter_refuses_a_tokenizer_other_than_the_checkpoints(tmp_path):
    """As `tablefree eval` does: scores from another tokenizer's ids would be meaningless."""
    config = ModelConfig(vocab_size=300, d_model=32, n_layers=1, n_heads=2, d_ff=64, max_seq_len=32)
    own = make_tokenizer(tmp_path / "own.json", vocab_size=300, texts=["alpha beta gamma " * 50])
    other = make_tokenizer(tmp_path / "other.json", vocab_size=300, texts=["delta epsilon zeta " * 50])
    make_checkpoint(tmp_path / "ck", config, own)
    assert TablefreeLMEval(checkpoint=str(tmp_path / "ck")).tokenizer.to_str() == load_tokenizer(own).to_str()
    with pytest.raises(ValueError, match="does not match the tokenizer_hash"):
        TablefreeLMEval(checkpoint=str(tmp_path / "ck"), tokenizer=str(other))


def test_adapter_verifies_the_checkpoint_unless_told_not_to(tmp_path, capsys):
    """The lm-eval adapter reads through load_model: altered weights are refused; `verify=False` skips
    the digests and the finiteness check, and says so."""
    from safetensors.torch import load_file, save_file

    from tablefree.checkpoint.layout import CheckpointError

    config = ModelConfig(vocab_size=300, d_model=32, n_layers=1, n_heads=2, d_ff=64, max_seq_len=32)
    own = make_tokenizer(tmp_path / "own.json", vocab_size=300, texts=["alpha beta gamma " * 50])
    make_checkpoint(tmp_path / "ck", config, own)
    weights_path = tmp_path / "ck" / "model.safetensors"
    weights = load_file(str(weights_path))
    weights["head.weight"][0, 0] = float("nan")
    save_file(weights, str(weights_path), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"model\.safetensors: damaged after it was written"):
        TablefreeLMEval(checkpoint=str(tmp_path / "ck"))
    capsys.readouterr()
    adapter = get_model("tablefree").create_from_arg_string(f"checkpoint={tmp_path / 'ck'},verify=False")
    assert adapter.model.head.weight.isnan().any() and "--no-verify" in capsys.readouterr().err


@pytest.fixture(scope="module")
def adapters(checkpoint, hf_dir):
    from lm_eval.models.huggingface import HFLM

    ours = TablefreeLMEval(checkpoint=str(checkpoint), batch_size=4)
    hf = HFLM(pretrained=str(hf_dir), dtype="float32", softmax_dtype="float64", device="cpu", batch_size=4)
    return ours, hf


@pytest.mark.slow
def test_rolling_loglikelihood_matches_hf_backend(adapters, shared_data):
    ours, hf = adapters
    texts = [json.loads(line)["text"] for line in (shared_data / "eval" / "lambada_test.jsonl").open()][:6]
    texts.append(" ".join(texts))  # longer than the 256-token context: several windows
    assert len(ours.tok_encode(texts[-1])) > 2 * ours.max_length
    requests = [Instance("loglikelihood_rolling", {}, (text,), i) for i, text in enumerate(texts)]
    for mine, theirs in zip(
        ours.loglikelihood_rolling(requests), hf.loglikelihood_rolling(requests), strict=True
    ):
        assert abs(mine - theirs) <= TOLERANCE


@pytest.mark.slow
def test_generate_until_matches_hf_backend(checkpoint, tmp_path):
    """Greedy generation through both backends. The few-step model only emits newlines, so this uses a
    randomized model (varied, confident predictions) with the same tokenizer."""
    from lm_eval.models.huggingface import HFLM

    config = read_model_config(checkpoint)
    make_checkpoint(tmp_path / "ck", config, checkpoint / "tokenizer.json", seed=5)
    export_hf(tmp_path / "ck", tmp_path / "hf")
    ours = TablefreeLMEval(checkpoint=str(tmp_path / "ck"), batch_size=4)
    hf = HFLM(pretrained=str(tmp_path / "hf"), dtype="float32", device="cpu", batch_size=4)
    contexts = ["Marley was dead: to begin with.", "The Spirit", "Scrooge said, \u201c"]
    kwargs = {"until": ["\n\n", " the"], "max_gen_toks": 40, "do_sample": False}
    requests = [
        Instance("generate_until", {}, (context, dict(kwargs)), i) for i, context in enumerate(contexts)
    ]
    mine, theirs = ours.generate_until(requests), hf.generate_until(requests)
    assert mine == theirs
    assert len({text for text in mine}) == len(mine) and all(mine)


@pytest.mark.slow
def test_cli_writes_local_tasks_and_runs_lm_eval_with_the_adapter(
    checkpoint, shared_data, tmp_path, three_ways, monkeypatch
):
    tasks, out = tmp_path / "tasks", tmp_path / "lm_eval_out"
    monkeypatch.chdir(tmp_path)  # a relative DIR: the task files must still work from elsewhere
    argv = ["lm-eval-tasks", "tasks", "--eval-data", str(shared_data / "eval"), "--tasks", "lambada"]
    assert main([*argv, "--limit", "20", "--prefix", "cli_"]) == 0
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    argv = [
        "lm-eval",
        "--model",
        "tablefree",
        "--model_args",
        f"checkpoint={checkpoint}",
        "--tasks",
        "cli_lambada",
    ]
    argv += ["--include_path", str(tasks), "--output_path", str(out), "--device", "cpu"]
    assert main(argv) == 0
    (results_file,) = out.rglob("results_*.json")
    written = json.loads(results_file.read_text())
    assert str(written["config"]["batch_size"]) == "32"  # the engine's default, not lm-eval's CLI default 1
    results = written["results"]["cli_lambada"]
    expected = three_ways["tablefree eval"]["lambada"]
    assert results["acc,none"] == pytest.approx(sum(expected["acc"][i] for i in range(20)) / 20)
    mean_loglik = sum(expected["loglikelihoods"][i][0] for i in range(20)) / 20
    assert results["perplexity,none"] == pytest.approx(math.exp(-mean_loglik), rel=1e-6)
