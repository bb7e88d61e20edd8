"""The Python behind the shipped task records: what a ``{{field}}`` template cannot say, ported line for line
from lm-evaluation-harness 0.4.13's task YAML and ``utils.py`` (tests compare them with lm-eval's own functions
on the real records).

A task record names these by key (``doc_to_text: {function: hellaswag_query}``, ``check: hellaswag``,
``reader: piqa``); a user's record may name them too. Records cannot bring code of their own: a task file is
data, and running one never runs code from it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tablefree.evaluate.records import check_fields, parse_lines, read_lines, short


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


def hellaswag_query(doc: dict) -> str:
    ctx = doc["ctx_a"] + " " + doc["ctx_b"].capitalize()
    return hellaswag_preprocess(doc["activity_label"] + ": " + ctx)


def hellaswag_endings(doc: dict) -> list[str]:
    return [hellaswag_preprocess(ending) for ending in doc["endings"]]


def hellaswag_check(doc: dict) -> None:
    _require(all(isinstance(e, str) for e in doc["endings"]), "field 'endings' must be a list of strings")
    label = doc["label"]
    _require(
        isinstance(label, int) or re.fullmatch(r"\s*[0-9]{1,9}\s*", label) is not None,
        f"field 'label' must be an integer, got {short(label)}",
    )
    _require(
        0 <= int(label) < len(doc["endings"]),
        f"label {short(label)} out of range for {len(doc['endings'])} endings",
    )


# ------------------------------------------------------------------------------------------------------------
# PIQA's official layout: valid.jsonl and valid-labels.lst


def read_piqa(paths: list[Path], limit: int | None = None) -> list[tuple[str, dict]]:
    """PIQA's official layout: ``valid.jsonl`` and ``valid-labels.lst`` (one 0/1 label a line, aligned)."""
    lines = read_lines(paths[0])
    labels = read_lines(paths[1])
    if len(labels) != len(lines):
        raise ValueError(f"{paths[1]}: {len(labels)} labels for {len(lines)} records in {paths[0]}")
    records = parse_lines(paths[0], lines[:limit])
    out = []
    for (number, label), (where, record) in zip(labels[:limit], records, strict=True):
        if label.strip() not in ("0", "1"):
            raise ValueError(f"{paths[1]}:{number}: label must be 0 or 1, got {label[:40]!r}")
        out.append((where, {**record, "label": int(label)}))
    return out


# ------------------------------------------------------------------------------------------------------------
# LAMBADA, OpenAI version (lm_eval/tasks/lambada/lambada_openai.yaml)


def lambada_split(text: str) -> tuple[str, str]:
    """(context, target): all but the last space-separated word, and " " + that word (punctuation included)."""
    words = text.split(" ")
    return " ".join(words[:-1]), " " + words[-1]


def lambada_check(doc: dict) -> None:
    _require(doc["text"] != "", "field 'text' is empty")


# ------------------------------------------------------------------------------------------------------------
# ARC and OpenBookQA: choices {text: [...], label: [...]} and an answerKey among the labels

_CHOICES_SCHEMA = {"text": list, "label": list}


def _check_choices(doc: dict, answer_key: str) -> None:
    choices = doc["choices"]
    _require(isinstance(choices, dict), f"field 'choices' must be an object, got {choices!r}")
    check_fields("choices", choices, _CHOICES_SCHEMA)
    _require(len(choices["text"]) == len(choices["label"]), "choices.text and choices.label differ in length")
    _require(all(isinstance(t, str) for t in choices["text"]), "choices.text must be a list of strings")
    _require(
        answer_key in choices["label"],
        f"answerKey {short(answer_key)} is not one of the labels {short(choices['label'])}",
    )


def answer_key_index(doc: dict) -> int:
    """The position of ``answerKey`` among ``choices.label`` (ARC)."""
    return doc["choices"]["label"].index(doc["answerKey"])


def answer_key_check(doc: dict) -> None:
    _check_choices(doc, doc["answerKey"])


def openbookqa_answer_index(doc: dict) -> int:
    """OpenBookQA's ``answerKey`` may carry leading spaces."""
    return doc["choices"]["label"].index(doc["answerKey"].lstrip())


def openbookqa_check(doc: dict) -> None:
    _check_choices(doc, doc["answerKey"].lstrip())


# ------------------------------------------------------------------------------------------------------------
# WinoGrande, partial scoring (lm_eval/tasks/winogrande/preprocess_winogrande.py)


def winogrande_check(doc: dict) -> None:
    _require("_" in doc["sentence"], "field 'sentence' has no '_' blank")
    _require(doc["answer"] in ("1", "2"), f'field \'answer\' must be "1" or "2", got {short(doc["answer"])}')


def winogrande_gold(doc: dict) -> int:
    return {"1": 0, "2": 1}[doc["answer"]]


def winogrande_contexts(doc: dict) -> list[str]:
    blank = doc["sentence"].index("_")
    return [doc["sentence"][:blank] + option for option in (doc["option1"], doc["option2"])]


def winogrande_rest(doc: dict) -> str:
    return doc["sentence"][doc["sentence"].index("_") + 1 :].strip()


# ------------------------------------------------------------------------------------------------------------
# SciQ (lm_eval/tasks/sciq/sciq.yaml: "{{support.lstrip()}}\nQuestion: {{question}}\nAnswer:")


def sciq_query(doc: dict) -> str:
    return f"{doc['support'].lstrip()}\nQuestion: {doc['question']}\nAnswer:"


# ------------------------------------------------------------------------------------------------------------
# BoolQ: our file is the official BoolQ release, whose boolean ``answer`` is SuperGLUE's ``label``
# (0 = False = "no", 1 = True = "yes").


def boolq_label(doc: dict) -> int:
    return int(doc["answer"])


def boolq_as_superglue(doc: dict) -> dict:
    return {**doc, "label": int(doc["answer"])}


# ------------------------------------------------------------------------------------------------------------
# COPA (lm_eval/tasks/super_glue/copa/utils.py)


def _copa_connect(choice: str) -> str:
    return " " + choice[0].lower() + choice[1:]


def copa_query(doc: dict) -> str:
    connector = {"cause": "because", "effect": "therefore"}[doc["question"]]
    return doc["premise"].strip()[:-1] + f" {connector}"  # drops the premise's final period


def copa_choices(doc: dict) -> list[str]:
    return [_copa_connect(doc["choice1"]), _copa_connect(doc["choice2"])]


def copa_target(doc: dict) -> str:
    return _copa_connect(doc["choice1"] if doc["label"] == 0 else doc["choice2"])


def copa_check(doc: dict) -> None:
    _require(
        doc["question"] in ("cause", "effect"),
        f"field 'question' must be cause or effect, got {short(doc['question'])}",
    )
    _require(doc["label"] in (0, 1), f"field 'label' must be 0 or 1, got {short(doc['label'])}")
    _require(doc["choice1"] != "" and doc["choice2"] != "", "empty choice")


# ------------------------------------------------------------------------------------------------------------
# The names a record may use, by role

# doc_to_text, doc_to_choice, doc_to_target: {function: NAME}
DOC_FUNCTIONS: dict[str, Callable[[dict], Any]] = {
    "hellaswag_query": hellaswag_query,
    "hellaswag_endings": hellaswag_endings,
    "lambada_context": lambda doc: lambada_split(doc["text"])[0],
    "lambada_last_word": lambda doc: lambada_split(doc["text"])[1],
    "answer_key_index": answer_key_index,
    "openbookqa_answer_index": openbookqa_answer_index,
    "winogrande_gold": winogrande_gold,
    "winogrande_contexts": winogrande_contexts,
    "winogrande_rest": winogrande_rest,
    "sciq_query": sciq_query,
    "boolq_label": boolq_label,
    "copa_query": copa_query,
    "copa_choices": copa_choices,
    "copa_target": copa_target,
}
# check: NAME (raises ValueError on a bad label or field, after the field types are checked)
CHECKS: dict[str, Callable[[dict], None]] = {
    "hellaswag": hellaswag_check,
    "lambada": lambada_check,
    "answer_key": answer_key_check,
    "openbookqa": openbookqa_check,
    "winogrande": winogrande_check,
    "copa": copa_check,
}
# reader: NAME ((paths, limit) -> the first ``limit`` (file:line, record) pairs); the default reads JSON lines
READERS: dict[str, Callable[[list[Path], int | None], list[tuple[str, dict]]]] = {"piqa": read_piqa}
# lm_eval: {doc: NAME}: our record -> the record lm-eval's YAML expects
LM_EVAL_DOCS: dict[str, Callable[[dict], dict]] = {"boolq_as_superglue": boolq_as_superglue}
