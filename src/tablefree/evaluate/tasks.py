"""The zero-shot tasks, one small declarative definition each, mirroring lm-evaluation-harness 0.4.13.

A task names its data files (laid out as in ``shared/data/eval``), the fields each record must have, and
lm-eval's ``doc_to_text`` / ``doc_to_choice`` / ``doc_to_target`` (ported line for line from the task's YAML
and ``utils.py``; tests compare them with lm-eval's own functions on the real records). ``build_requests`` and
``tablefree.evaluate.metrics`` then do what lm-eval's ``ConfigurableTask.construct_requests`` and
``process_results`` do:

* multiple choice: context = doc_to_text(doc), one request per choice with continuation
  ``target_delimiter + choice`` (``" "`` everywhere; COPA's choices already start with a space, so its
  continuations start with two, exactly as in lm-eval);
* multiple input (WinoGrande's partial scoring): one context per option (the sentence up to the blank with the
  option filled in) and the same continuation, the rest of the sentence; gold = doc_to_text(doc);
* loglikelihood (LAMBADA): one request (all but the last space-separated word, " " + the last word).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENV_EVAL_DATA = "TABLEFREE_EVAL_DATA"
DEFAULT_EVAL_DATA = Path("~/.cache/tablefree/eval")


@dataclass(frozen=True)
class Doc:
    """One benchmark record with where it came from (for error messages and per-example output)."""

    index: int  # doc_id: position in the file(s), from 0
    where: str  # "file:line"
    fields: dict[str, Any]


@dataclass(frozen=True)
class Task:
    name: str
    files: tuple[str, ...]  # relative to the eval data directory; the first holds the documents
    schema: dict[str, type | tuple[type, ...]]  # required fields and their JSON types
    output_type: str  # "multiple_choice" | "loglikelihood"
    doc_to_text: Callable[[dict], Any]
    doc_to_target: Callable[[dict], Any]
    doc_to_choice: Callable[[dict], list[str]] | None = None
    check: Callable[[dict], None] | None = None  # raises ValueError on a bad label or field
    metrics: tuple[str, ...] = ("acc", "acc_norm")  # as lm-eval's metric_list (plus acc_bytes)
    headline: str = "acc"
    target_delimiter: str = " "
    multiple_input: bool = False  # doc_to_choice gives contexts, doc_to_text the gold index (WinoGrande)
    reader: Callable[[list[Path]], list[tuple[str, dict]]] | None = None  # default: JSON lines of files[0]
    lm_eval_task: str = ""


# ------------------------------------------------------------------------------------------------------------
# Readers


def read_jsonl(path: Path) -> list[tuple[str, dict]]:
    """(``file:line``, record) for each non-empty line; a bad line is an error naming file and line."""
    records = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{where}: malformed JSON ({error.msg} at column {error.colno})") from None
            if not isinstance(record, dict):
                raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
            records.append((where, record))
    return records


def read_piqa(paths: list[Path]) -> list[tuple[str, dict]]:
    """PIQA's official layout: ``valid.jsonl`` and ``valid-labels.lst`` (one 0/1 label a line, aligned)."""
    records = read_jsonl(paths[0])
    labels = paths[1].read_text(encoding="utf-8").splitlines()
    while labels and not labels[-1].strip():
        labels.pop()
    if len(labels) != len(records):
        raise ValueError(f"{paths[1]}: {len(labels)} labels for {len(records)} records in {paths[0]}")
    out = []
    for number, (label, (where, record)) in enumerate(zip(labels, records, strict=True), start=1):
        if label.strip() not in ("0", "1"):
            raise ValueError(f"{paths[1]}:{number}: label must be 0 or 1, got {label!r}")
        out.append((where, {**record, "label": int(label)}))
    return out


def _check_type(where: str, record: dict, schema: dict[str, type | tuple[type, ...]]) -> None:
    for name, kind in schema.items():
        if name not in record:
            raise ValueError(f"{where}: missing field {name!r}")
        value = record[name]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            expected = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            raise ValueError(f"{where}: field {name!r} must be {expected}, got {value!r}")


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


# ------------------------------------------------------------------------------------------------------------
# HellaSwag (lm_eval/tasks/hellaswag: utils.preprocess, utils.process_docs)


def hellaswag_preprocess(text: str) -> str:
    text = text.strip()
    # Brackets are artifacts of the WikiHow part of HellaSwag.
    text = text.replace(" [title]", ". ")
    text = re.sub("\\[.*?\\]", "", text)
    return text.replace("  ", " ")


def _hellaswag_query(doc: dict) -> str:
    ctx = doc["ctx_a"] + " " + doc["ctx_b"].capitalize()
    return hellaswag_preprocess(doc["activity_label"] + ": " + ctx)


def _hellaswag_check(doc: dict) -> None:
    _require(all(isinstance(e, str) for e in doc["endings"]), "field 'endings' must be a list of strings")
    label = doc["label"]
    _require(
        isinstance(label, int) or (isinstance(label, str) and label.strip().isdigit()),
        f"field 'label' must be an integer, got {label!r}",
    )
    _require(
        0 <= int(label) < len(doc["endings"]), f"label {label} out of range for {len(doc['endings'])} endings"
    )


HELLASWAG = Task(
    name="hellaswag",
    files=("hellaswag_val.jsonl",),
    schema={"activity_label": str, "ctx_a": str, "ctx_b": str, "endings": list, "label": (int, str)},
    output_type="multiple_choice",
    doc_to_text=_hellaswag_query,
    doc_to_choice=lambda doc: [hellaswag_preprocess(ending) for ending in doc["endings"]],
    doc_to_target=lambda doc: int(doc["label"]),
    check=_hellaswag_check,
    metrics=("acc", "acc_norm", "acc_bytes"),
    headline="acc_norm",
    lm_eval_task="hellaswag",
)

# ------------------------------------------------------------------------------------------------------------
# PIQA (lm_eval/tasks/piqa/piqa.yaml)

PIQA = Task(
    name="piqa",
    files=("piqa/valid.jsonl", "piqa/valid-labels.lst"),
    schema={"goal": str, "sol1": str, "sol2": str},
    output_type="multiple_choice",
    doc_to_text=lambda doc: f"Question: {doc['goal']}\nAnswer:",
    doc_to_choice=lambda doc: [doc["sol1"], doc["sol2"]],
    doc_to_target=lambda doc: doc["label"],
    metrics=("acc", "acc_norm", "acc_bytes"),
    headline="acc",
    reader=read_piqa,
    lm_eval_task="piqa",
)

# ------------------------------------------------------------------------------------------------------------
# LAMBADA, OpenAI version (lm_eval/tasks/lambada/lambada_openai.yaml)


def lambada_split(text: str) -> tuple[str, str]:
    """(context, target): all but the last space-separated word, and " " + that word (punctuation included)."""
    words = text.split(" ")
    return " ".join(words[:-1]), " " + words[-1]


LAMBADA = Task(
    name="lambada",
    files=("lambada_test.jsonl",),
    schema={"text": str},
    output_type="loglikelihood",
    doc_to_text=lambda doc: lambada_split(doc["text"])[0],
    doc_to_target=lambda doc: lambada_split(doc["text"])[1],
    check=lambda doc: _require(doc["text"] != "", "field 'text' is empty"),
    metrics=("acc", "perplexity"),
    headline="acc",
    lm_eval_task="lambada_openai",
)

# ------------------------------------------------------------------------------------------------------------
# ARC (lm_eval/tasks/arc/arc_easy.yaml, arc_challenge.yaml)

_CHOICES_SCHEMA = {"text": list, "label": list}


def _check_choices(doc: dict, answer_key: str) -> None:
    choices = doc["choices"]
    _require(isinstance(choices, dict), f"field 'choices' must be an object, got {choices!r}")
    _check_type("choices", choices, _CHOICES_SCHEMA)
    _require(len(choices["text"]) == len(choices["label"]), "choices.text and choices.label differ in length")
    _require(all(isinstance(t, str) for t in choices["text"]), "choices.text must be a list of strings")
    _require(
        answer_key in choices["label"],
        f"answerKey {answer_key!r} is not one of the labels {choices['label']}",
    )


def _arc(name: str, file: str, headline: str) -> Task:
    return Task(
        name=name,
        files=(file,),
        schema={"question": str, "choices": dict, "answerKey": str},
        output_type="multiple_choice",
        doc_to_text=lambda doc: f"Question: {doc['question']}\nAnswer:",
        doc_to_choice=lambda doc: list(doc["choices"]["text"]),
        doc_to_target=lambda doc: doc["choices"]["label"].index(doc["answerKey"]),
        check=lambda doc: _check_choices(doc, doc["answerKey"]),
        metrics=("acc", "acc_norm", "acc_bytes"),
        headline=headline,
        lm_eval_task=name,
    )


ARC_EASY = _arc("arc_easy", "extra/arc_easy_validation.jsonl", "acc")
ARC_CHALLENGE = _arc("arc_challenge", "extra/arc_challenge_validation.jsonl", "acc_norm")

# ------------------------------------------------------------------------------------------------------------
# WinoGrande, partial scoring (lm_eval/tasks/winogrande/preprocess_winogrande.py)


def _winogrande_check(doc: dict) -> None:
    _require("_" in doc["sentence"], "field 'sentence' has no '_' blank")
    _require(doc["answer"] in ("1", "2"), f'field \'answer\' must be "1" or "2", got {doc["answer"]!r}')


def _winogrande_choices(doc: dict) -> list[str]:
    blank = doc["sentence"].index("_")
    return [doc["sentence"][:blank] + option for option in (doc["option1"], doc["option2"])]


WINOGRANDE = Task(
    name="winogrande",
    files=("extra/winogrande_xl_validation.jsonl",),
    schema={"sentence": str, "option1": str, "option2": str, "answer": str},
    output_type="multiple_choice",
    doc_to_text=lambda doc: {"1": 0, "2": 1}[doc["answer"]],
    doc_to_choice=_winogrande_choices,
    doc_to_target=lambda doc: doc["sentence"][doc["sentence"].index("_") + 1 :].strip(),
    check=_winogrande_check,
    metrics=("acc",),
    headline="acc",
    multiple_input=True,
    lm_eval_task="winogrande",
)

# ------------------------------------------------------------------------------------------------------------
# OpenBookQA (lm_eval/tasks/openbookqa/openbookqa.yaml)

OPENBOOKQA = Task(
    name="openbookqa",
    files=("extra/openbookqa_validation.jsonl",),
    schema={"question_stem": str, "choices": dict, "answerKey": str},
    output_type="multiple_choice",
    doc_to_text=lambda doc: doc["question_stem"],
    doc_to_choice=lambda doc: list(doc["choices"]["text"]),
    doc_to_target=lambda doc: doc["choices"]["label"].index(doc["answerKey"].lstrip()),
    check=lambda doc: _check_choices(doc, doc["answerKey"].lstrip()),
    metrics=("acc", "acc_norm", "acc_bytes"),
    headline="acc_norm",
    lm_eval_task="openbookqa",
)

# ------------------------------------------------------------------------------------------------------------
# SciQ (lm_eval/tasks/sciq/sciq.yaml): the correct answer is always the 4th choice

SCIQ = Task(
    name="sciq",
    files=("extra/sciq_validation.jsonl",),
    schema={
        "question": str,
        "distractor1": str,
        "distractor2": str,
        "distractor3": str,
        "correct_answer": str,
        "support": str,
    },
    output_type="multiple_choice",
    doc_to_text=lambda doc: f"{doc['support'].lstrip()}\nQuestion: {doc['question']}\nAnswer:",
    doc_to_choice=lambda doc: [
        doc["distractor1"],
        doc["distractor2"],
        doc["distractor3"],
        doc["correct_answer"],
    ],
    doc_to_target=lambda doc: 3,
    metrics=("acc", "acc_norm", "acc_bytes"),
    headline="acc",
    lm_eval_task="sciq",
)

# ------------------------------------------------------------------------------------------------------------
# BoolQ (lm_eval/tasks/super_glue/boolq/default.yaml). Our file is the official BoolQ release, whose boolean
# ``answer`` is SuperGLUE's ``label`` (0 = False = "no", 1 = True = "yes").

BOOLQ = Task(
    name="boolq",
    files=("extra/boolq_validation.jsonl",),
    schema={"question": str, "passage": str, "answer": bool},
    output_type="multiple_choice",
    doc_to_text=lambda doc: f"{doc['passage']}\nQuestion: {doc['question']}?\nAnswer:",
    doc_to_choice=lambda doc: ["no", "yes"],
    doc_to_target=lambda doc: int(doc["answer"]),
    metrics=("acc",),
    headline="acc",
    lm_eval_task="boolq",
)

# ------------------------------------------------------------------------------------------------------------
# COPA (lm_eval/tasks/super_glue/copa/utils.py)


def _copa_connect(choice: str) -> str:
    return " " + choice[0].lower() + choice[1:]


def _copa_text(doc: dict) -> str:
    connector = {"cause": "because", "effect": "therefore"}[doc["question"]]
    return doc["premise"].strip()[:-1] + f" {connector}"  # drops the premise's final period


def _copa_check(doc: dict) -> None:
    _require(
        doc["question"] in ("cause", "effect"),
        f"field 'question' must be cause or effect, got {doc['question']!r}",
    )
    _require(doc["label"] in (0, 1), f"field 'label' must be 0 or 1, got {doc['label']!r}")
    _require(doc["choice1"] != "" and doc["choice2"] != "", "empty choice")


COPA = Task(
    name="copa",
    files=("extra/copa_validation.jsonl",),
    schema={"premise": str, "choice1": str, "choice2": str, "question": str, "label": int},
    output_type="multiple_choice",
    doc_to_text=_copa_text,
    doc_to_choice=lambda doc: [_copa_connect(doc["choice1"]), _copa_connect(doc["choice2"])],
    doc_to_target=lambda doc: _copa_connect(doc["choice1"] if doc["label"] == 0 else doc["choice2"]),
    check=_copa_check,
    metrics=("acc",),
    headline="acc",
    lm_eval_task="copa",
)

TASKS: dict[str, Task] = {
    task.name: task
    for task in (
        HELLASWAG,
        PIQA,
        LAMBADA,
        ARC_EASY,
        ARC_CHALLENGE,
        WINOGRANDE,
        OPENBOOKQA,
        SCIQ,
        BOOLQ,
        COPA,
    )
}


# ------------------------------------------------------------------------------------------------------------
# Loading


def eval_data_dir(data_dir: str | Path | None = None) -> Path:
    """``data_dir``, else $TABLEFREE_EVAL_DATA, else ~/.cache/tablefree/eval."""
    chosen = data_dir or os.environ.get(ENV_EVAL_DATA) or DEFAULT_EVAL_DATA
    return Path(chosen).expanduser()


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; expected one of {sorted(TASKS)} or 'validation'")
    return TASKS[name]


def task_files(task: Task, data_dir: str | Path | None = None) -> list[Path]:
    """The task's data files, each checked to exist (the error says how to get them)."""
    root = eval_data_dir(data_dir)
    paths = [root / name for name in task.files]
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(
                f"{task.name}: data file {path} not found. Get the evaluation data with "
                f"`tablefree data download-evals DIR` and pass --eval-data DIR (or set {ENV_EVAL_DATA}); "
                f"files are laid out as {', '.join(task.files)} under DIR"
            )
    return paths


def load_docs(task: Task, data_dir: str | Path | None = None, limit: int | None = None) -> list[Doc]:
    """The task's documents, validated: a bad record is an error naming its file and line."""
    paths = task_files(task, data_dir)
    records = (task.reader or (lambda p: read_jsonl(p[0])))(paths)
    if not records:
        raise ValueError(f"{paths[0]}: no records")
    docs = []
    for index, (where, record) in enumerate(records[:limit] if limit is not None else records):
        _check_type(where, record, task.schema)
        if task.check is not None:
            try:
                task.check(record)
            except ValueError as error:
                raise ValueError(f"{where}: {error}") from None
        docs.append(Doc(index, where, record))
    return docs


# ------------------------------------------------------------------------------------------------------------
# Requests (lm-eval's construct_requests)


@dataclass(frozen=True)
class DocRequests:
    """The (context, continuation) strings of one document, its choices (for length normalisation) and gold."""

    pairs: list[tuple[str, str]]
    choices: list[str]
    gold: int | None  # None for loglikelihood tasks


def build_requests(task: Task, doc: dict) -> DocRequests:
    if task.output_type == "loglikelihood":
        return DocRequests([(task.doc_to_text(doc), task.doc_to_target(doc))], [], None)
    choices = task.doc_to_choice(doc)
    if task.multiple_input:
        continuation = task.target_delimiter + task.doc_to_target(doc)
        return DocRequests([(context, continuation) for context in choices], choices, task.doc_to_text(doc))
    context = task.doc_to_text(doc)
    pairs = [(context, task.target_delimiter + choice) for choice in choices]
    gold = task.doc_to_target(doc)
    if isinstance(gold, str):  # a target given as the choice's text: its first index, as lm-eval does
        gold = choices.index(gold)
    return DocRequests(pairs, choices, gold)
