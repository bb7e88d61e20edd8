"""Each entry point's one typed spec: defaults, the checks made when it is built, and reading it from YAML."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from tablefree.analysis import AnalyzeSpec
from tablefree.config_parsing import from_dict
from tablefree.evaluate import EvalSpec
from tablefree.generate import GenerateSpec
from tablefree.scaling import ScalingReportSpec


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: EvalSpec("run", limit=0), "limit must be a positive number"),
        (lambda: EvalSpec("run", dtype="half"), "dtype: expected auto, fp32 or bf16"),
        (lambda: EvalSpec("run", batch_size=0), "batch_size: expected a positive integer"),
        (lambda: EvalSpec("run", bootstrap_iters=-1), "bootstrap_iters: expected 0"),
        (lambda: AnalyzeSpec("run", split="tokens"), "split: expected types or positions"),
        (lambda: AnalyzeSpec("run", positions=0), "positions must be a positive number"),
        (lambda: AnalyzeSpec("run", embedding_tokens=5), "embedding_tokens must be at least 20"),
        (lambda: GenerateSpec("hi", temperature=-1.0), "temperature must be >= 0"),
        (lambda: GenerateSpec("hi", top_p=1.5), r"top_p must lie in \(0, 1\]"),
        (lambda: ScalingReportSpec(confidence=1.0), "confidence: expected a level between 0 and 1"),
        (lambda: ScalingReportSpec(n_boot=0), "n_boot: expected a positive number"),
    ],
)
def test_a_spec_refuses_a_bad_value_when_built(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_defaults_are_the_command_lines():
    spec = EvalSpec("run")
    assert (spec.tasks, spec.limit, spec.batch_size, spec.dtype, spec.verify) == (
        ("hellaswag", "piqa", "lambada"),
        None,
        32,
        "auto",
        True,
    )
    assert AnalyzeSpec("run").split == "types" and GenerateSpec("").max_new_tokens == 128


def test_a_spec_reads_from_yaml_with_its_field_named():
    text = "checkpoint: runs/x\ntasks: [piqa, validation]\nlimit: 50\nval_data: data/mine\n"
    spec = from_dict(EvalSpec, yaml.safe_load(text), where="eval.yaml")
    assert spec == EvalSpec("runs/x", ["piqa", "validation"], limit=50, val_data="data/mine")
    with pytest.raises(ValueError, match=r"eval.yaml: unknown field\(s\) \['limits'\]"):
        from_dict(EvalSpec, {"checkpoint": "x", "limits": 5}, where="eval.yaml")
    with pytest.raises(ValueError, match=r"eval\.yaml: limit must be a positive number"):
        from_dict(EvalSpec, {"checkpoint": "x", "limit": 0}, where="eval.yaml")


def test_the_scaling_spec_is_the_reports_recorded_arguments():
    spec = ScalingReportSpec(pairs=[("learned", "canonical")], predict_at=[1e9], n_boot=20, unigram=5.3)
    assert ScalingReportSpec(**dataclasses.asdict(spec)) == spec
