"""Benchmark tasks as declarative records: the shipped YAML files, a user's task file, and the checks that name
the file and the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from tablefree import build_model, preset
from tablefree.checkpoint.model_dir import save_model
from tablefree.data.tokenizer import tokenizer_hash
from tablefree.evaluate import TASKS, EvalSpec, load_docs, read_task_file, run_eval
from tablefree.evaluate.task_record import build_requests
from tablefree.evaluate.tasks import RECORDS_DIR, SHIPPED, parse_task_names, parse_tasks

REPO = Path(__file__).resolve().parents[1]

# PIQA written as a user would, with templates only, over a JSON-lines copy that holds the label
PIQA_BY_HAND = """\
name: my_piqa
output_type: multiple_choice
data: [{path: piqa.jsonl}]
fields: {goal: str, sol1: str, sol2: str, label: int}
doc_to_text: "Question: {{goal}}\\nAnswer:"
doc_to_choice: ["{{ sol1 }}", "{{sol2}}"]
doc_to_target: "{{label}}"
metrics: [acc, acc_norm, acc_bytes]
"""


def _write_piqa_copy(directory: Path, shared_data: Path, limit: int) -> Path:
    records = [doc.fields for doc in load_docs(TASKS["piqa"], shared_data / "eval", limit=limit)]
    (directory / "piqa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    path = directory / "task.yaml"
    path.write_text(PIQA_BY_HAND, encoding="utf-8")
    return path


def test_every_shipped_record_is_listed_and_packaged():
    assert sorted(p.stem for p in RECORDS_DIR.glob("*.yaml")) == sorted(SHIPPED)
    pattern = RECORDS_DIR.relative_to(REPO / "src" / "tablefree").as_posix() + "/*.yaml"
    assert f'"{pattern}"' in (REPO / "pyproject.toml").read_text()  # the wheel carries them
    assert list(TASKS) == list(SHIPPED)


def test_a_template_task_builds_the_same_requests_as_the_shipped_one(shared_data, tmp_path):
    task = read_task_file(_write_piqa_copy(tmp_path, shared_data, 300))
    assert task.files == (str(tmp_path / "piqa.jsonl"),)  # relative to the task file
    ours = load_docs(task, limit=300)
    shipped = load_docs(TASKS["piqa"], shared_data / "eval", limit=300)
    assert len(ours) == 300
    for mine, theirs in zip(ours, shipped, strict=True):
        assert build_requests(task, mine.fields) == build_requests(TASKS["piqa"], theirs.fields)


def test_targets_choices_and_nested_fields(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text(
        "name: t\noutput_type: multiple_choice\ndata: [{path: d.jsonl}]\n"
        "fields: {q: str, opts: dict, answer: [int, str]}\n"
        'doc_to_text: "{{q}} ({{opts.n}} options, first {{opts.text.0}}):"\n'
        'doc_to_choice: "{{opts.text}}"\ndoc_to_target: "{{answer}}"\n',
        encoding="utf-8",
    )
    task = read_task_file(path)
    doc = {"q": "Pick", "opts": {"n": 2, "text": ["red", "blue"]}, "answer": "blue"}
    requests = build_requests(task, doc)
    assert requests.pairs == [
        ("Pick (2 options, first red):", " red"),
        ("Pick (2 options, first red):", " blue"),
    ]
    assert requests.gold == 1  # a target that is a choice's text
    assert build_requests(task, {**doc, "answer": " 0 "}).gold == 0  # a whole number is an index
    assert build_requests(task, {**doc, "answer": 1}).gold == 1
    with pytest.raises(ValueError, match=r"\{\{opts.text\}\} must be a non-empty list of strings"):
        build_requests(task, {**doc, "opts": {"n": 2, "text": "red"}})


def test_a_user_task_runs_through_run_eval_beside_the_shipped_one(shared_data, tmp_path):
    task_file = _write_piqa_copy(tmp_path, shared_data, 12)
    checkpoint = _tiny_checkpoint(tmp_path)
    results = run_eval(
        EvalSpec(
            checkpoint, ["piqa", str(task_file)], data_dir=shared_data / "eval", limit=12, bootstrap_iters=0
        )
    )
    shipped, mine = results["tasks"]["piqa"], results["tasks"]["my_piqa"]
    assert mine["n"] == shipped["n"] == 12
    assert mine["metrics"] == shipped["metrics"]
    assert mine["lm_eval_task"] is None and shipped["lm_eval_task"] == "piqa"


@pytest.mark.parametrize(
    ("edit", "field", "message"),
    [
        (("output_type: multiple_choice", "output_type: generate_until"), "output_type", "expected one of"),
        (('doc_to_text: "Question', 'doc_to_text: "{{question}}'), "doc_to_text", "'fields' does not list"),
        (("doc_to_choice:", "colour: red\ndoc_to_choice:"), None, "unknown field 'colour'"),
        (("data: [{path: piqa.jsonl}]", "data: [{path: p, url: 'http://x'}]"), "data[0]", "only the shipped"),
        (
            ("metrics: [acc, acc_norm, acc_bytes]", "metrics: [acc, perplexity]"),
            "metrics",
            "expected distinct",
        ),
        (("metrics:", "headline: f1\nmetrics:"), "headline", "expected one of the task's metrics"),
        (
            ('doc_to_target: "{{label}}"', "doc_to_target: {function: eval}"),
            "doc_to_target",
            "unknown function",
        ),
        (('doc_to_target: "{{label}}"', "doc_to_target: -1"), "doc_to_target", "choice index >= 0"),
        (("label: int", "label: integer"), "fields.label", "expected one of str, int"),
        (("name: my_piqa", "name: lambada_openai"), "name", "already a shipped task's name"),
        (('"{{sol2}}"', '"{{sol2}"'), "doc_to_choice", "outside a '{{field}}' placeholder"),
        (("doc_to_choice", "doc_to_choices"), None, "unknown field 'doc_to_choices'"),
    ],
)
def test_a_bad_field_is_named_with_its_file(tmp_path, edit, field, message):
    path = tmp_path / "task.yaml"
    text = PIQA_BY_HAND.replace(*edit)
    assert text != PIQA_BY_HAND
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match="^" + str(path).replace(".", r"\.") + ": ") as caught:
        parse_tasks(str(path))
    assert message in str(caught.value)
    if field is not None:
        assert f"field {field!r}" in str(caught.value)


def test_task_files_are_refused_where_only_names_are_taken(tmp_path):
    with pytest.raises(ValueError, match="runs with `tablefree eval --tasks`"):
        parse_task_names("piqa,mine.yaml")
    with pytest.raises(FileNotFoundError, match="task file not found"):
        parse_tasks(str(tmp_path / "missing.yaml"))
    one, two = tmp_path / "a.yaml", tmp_path / "b.yaml"
    one.write_text(PIQA_BY_HAND, encoding="utf-8")
    two.write_text(PIQA_BY_HAND, encoding="utf-8")
    with pytest.raises(ValueError, match="two tasks cannot share a name"):
        parse_tasks(f"{one},{two}")


def test_a_user_tasks_missing_data_is_named_without_a_download_hint(tmp_path):
    path = tmp_path / "task.yaml"
    path.write_text(PIQA_BY_HAND, encoding="utf-8")
    (task,) = parse_tasks(str(path))
    with pytest.raises(FileNotFoundError, match=r"my_piqa \(.*task.yaml\): .*piqa.jsonl") as caught:
        load_docs(task)
    assert "download-evals" not in str(caught.value)


def _tiny_checkpoint(root: Path) -> Path:
    text = "".join(p.read_text(encoding="utf-8") for p in sorted((REPO / "src").rglob("*.py")))[:20_000]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([text], trainer=trainer)
    tokenizer.save(str(root / "tok.json"))
    config = preset(
        "tiny",
        vocab_size=tokenizer.get_vocab_size(),
        d_model=16,
        n_layers=1,
        n_heads=2,
        d_ff=32,
        max_seq_len=256,
        interface="canonical",
    )
    meta = {"step": 1, "tokens_seen": 0, "tokenizer_hash": tokenizer_hash(tokenizer)}
    model = build_model(config, seed=0).eval()
    return save_model(root / "step_00000001", model, meta=meta, tokenizer_path=root / "tok.json")


def test_the_documented_example_is_a_valid_task(tmp_path):
    text = (REPO / "docs" / "evaluation.md").read_text(encoding="utf-8")
    example = text.split("## Adding a task", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "task.yaml"
    path.write_text(example, encoding="utf-8")
    task = read_task_file(path)
    requests = build_requests(task, {"question": "Why?", "choices": ["a", "b", "c"], "answer": 2})
    assert requests.pairs[2] == ("Question: Why?\nAnswer:", " c") and requests.gold == 2
    assert task.headline == "acc_norm"
