"""The zero-shot tasks: one record per benchmark, mirroring lm-evaluation-harness 0.4.13.

A ``Task`` is the single source of truth for a benchmark. It carries

* its name (``tablefree eval --tasks``, ``data download-evals --tasks``, ``lm-eval-tasks --tasks``, results
  JSON) and its ``aliases`` (lm-eval's name where it differs, e.g. ``lambada_openai``), accepted everywhere;
* its data files (``DataFile``: the path under the eval data directory, the official URL, the sha256, and
  whether the URL serves parquet), from which ``tablefree.evaluate.download`` builds its downloads;
* lm-eval's task name, YAML (under ``lm_eval/tasks``) and split, from which
  ``tablefree.evaluate.lm_eval_adapter`` writes its local task definitions;
* the fields each record must have, and lm-eval's ``doc_to_text`` / ``doc_to_choice`` / ``doc_to_target``
  (ported line for line from the task's YAML and ``utils.py``; tests compare them with lm-eval's own functions
  on the real records).

``build_requests`` and ``tablefree.evaluate.metrics`` then do what lm-eval's
``ConfigurableTask.construct_requests`` and ``process_results`` do:

* multiple choice: context = doc_to_text(doc), one request per choice with continuation
  ``target_delimiter + choice`` (``" "`` everywhere; COPA's choices already start with a space, so its
  continuations start with two, exactly as in lm-eval);
* multiple input (WinoGrande's partial scoring): one context per option (the sentence up to the blank with the
  option filled in) and the same continuation, the rest of the sentence; gold = doc_to_text(doc);
* loglikelihood (LAMBADA): one request (all but the last space-separated word, " " + the last word).

Adding a task is adding one ``Task`` to ``TASKS`` (docs/evaluation.md, "Adding a task").
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tablefree.fileio import DuplicateKeyError, no_duplicate_keys

ENV_EVAL_DATA = "TABLEFREE_EVAL_DATA"
DEFAULT_EVAL_DATA = Path("~/.cache/tablefree/eval")
ALL = "all"
_HF = "https://huggingface.co/datasets"


@dataclass(frozen=True)
class Doc:
    """One benchmark record with where it came from (for error messages and per-example output)."""

    index: int  # doc_id: position in the file(s), from 0
    where: str  # "file:line"
    fields: dict[str, Any]


@dataclass(frozen=True)
class DataFile:
    """One file of a task: where it lives under the eval data directory and where it is downloaded from."""

    path: str  # relative to the eval data directory
    url: str
    sha256: str  # of the file as stored (for a parquet source: of the converted JSON lines)
    parquet: bool = False  # the URL serves parquet, converted to JSON lines by `data download-evals`


@dataclass(frozen=True)
class Task:
    name: str
    data: tuple[DataFile, ...]  # the first holds the documents
    schema: dict[str, type | tuple[type, ...]]  # required fields and their JSON types
    output_type: str  # "multiple_choice" | "loglikelihood"
    doc_to_text: Callable[[dict], Any]
    doc_to_target: Callable[[dict], Any]
    lm_eval_task: str  # lm-eval's task name
    lm_eval_yaml: str  # lm-eval's task config, relative to lm_eval/tasks
    lm_eval_split: str = "validation"  # the split our file holds
    doc_to_choice: Callable[[dict], list[str]] | None = None
    check: Callable[[dict], None] | None = None  # raises ValueError on a bad label or field
    metrics: tuple[str, ...] = ("acc", "acc_norm")  # as lm-eval's metric_list (plus acc_bytes)
    headline: str = "acc"
    target_delimiter: str = " "
    multiple_input: bool = False  # doc_to_choice gives contexts, doc_to_text the gold index (WinoGrande)
    # (paths, limit) -> the first ``limit`` (all if None) (file:line, record) pairs; default: JSON lines of data[0]
    reader: Callable[[list[Path], int | None], list[tuple[str, dict]]] | None = None
    lm_eval_doc: Callable[[dict], dict] | None = None  # our record -> the record lm-eval's YAML expects
    aliases: tuple[str, ...] = ()  # other names accepted for this task (lm_eval_task is always one)

    @property
    def files(self) -> tuple[str, ...]:
        """The data files' paths relative to the eval data directory."""
        return tuple(f.path for f in self.data)


# ------------------------------------------------------------------------------------------------------------
# Readers: every problem is a ValueError naming the file (and the line), never a raw traceback

_FOREIGN_BOMS = {
    b"\xff\xfe\x00\x00": "UTF-32",
    b"\x00\x00\xfe\xff": "UTF-32",
    b"\xff\xfe": "UTF-16",
    b"\xfe\xff": "UTF-16",
}
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def read_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of each non-blank line of a UTF-8 file (a UTF-8 byte-order mark is skipped)."""
    try:
        data = path.read_bytes()
    except OSError as error:
        raise ValueError(f"{path}: cannot read ({error.strerror or error})") from None
    for bom, encoding in _FOREIGN_BOMS.items():
        if data.startswith(bom):
            raise ValueError(f"{path}: starts with a {encoding} byte-order mark; evaluation files are UTF-8")
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    lines = []
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        try:
            lines.append((number, raw.decode("utf-8")))
        except UnicodeDecodeError as error:
            raise ValueError(
                f"{path}:{number}: invalid UTF-8 (byte 0x{raw[error.start]:02x} at byte {error.start + 1} of "
                "the line); evaluation files are UTF-8"
            ) from None
    return lines


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not valid JSON")


def parse_json_line(line: str, where: str) -> dict:
    """One JSON object; malformed JSON, NaN, absurd numbers, nesting and a key twice are errors naming
    ``where``."""
    try:
        record = json.loads(line, parse_constant=_no_constant, object_pairs_hook=no_duplicate_keys)
    except json.JSONDecodeError as error:
        raise ValueError(f"{where}: malformed JSON ({error.msg} at column {error.colno})") from None
    except DuplicateKeyError as error:
        raise ValueError(f"{where}: {error} (a key may appear once; which value is meant?)") from None
    except RecursionError:
        raise ValueError(f"{where}: JSON nested too deeply") from None
    except ValueError as error:  # integers over sys.get_int_max_str_digits() digits, NaN, Infinity
        raise ValueError(f"{where}: unreadable JSON value ({str(error).split(';')[0]})") from None
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
    if _SURROGATE_ESCAPE.search(line) and _has_lone_surrogate(record):
        raise ValueError(f"{where}: a \\u escape encodes half of a UTF-16 surrogate pair, not a character")
    return record


def _has_lone_surrogate(value: Any) -> bool:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False
    if isinstance(value, dict):
        return any(_has_lone_surrogate(k) or _has_lone_surrogate(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_lone_surrogate(v) for v in value)
    return False


def read_jsonl(path: Path, limit: int | None = None) -> list[tuple[str, dict]]:
    """(``file:line``, record) for each non-blank line, or the first ``limit`` of them (only those are parsed:
    a run of 300 documents does not pay for a 10,000-line file); a bad line is an error naming file and line."""
    return _parse_lines(path, read_lines(path)[:limit])


def _parse_lines(path: Path, lines: list[tuple[int, str]]) -> list[tuple[str, dict]]:
    return [(f"{path}:{number}", parse_json_line(line, f"{path}:{number}")) for number, line in lines]


def read_piqa(paths: list[Path], limit: int | None = None) -> list[tuple[str, dict]]:
    """PIQA's official layout: ``valid.jsonl`` and ``valid-labels.lst`` (one 0/1 label a line, aligned)."""
    lines = read_lines(paths[0])
    labels = read_lines(paths[1])
    if len(labels) != len(lines):
        raise ValueError(f"{paths[1]}: {len(labels)} labels for {len(lines)} records in {paths[0]}")
    records = _parse_lines(paths[0], lines[:limit])
    out = []
    for (number, label), (where, record) in zip(labels[:limit], records, strict=True):
        if label.strip() not in ("0", "1"):
            raise ValueError(f"{paths[1]}:{number}: label must be 0 or 1, got {label[:40]!r}")
        out.append((where, {**record, "label": int(label)}))
    return out


def _check_type(where: str, record: dict, schema: dict[str, type | tuple[type, ...]]) -> None:
    for name, kind in schema.items():
        if name not in record:
            raise ValueError(f"{where}: missing field {name!r}")
        value = record[name]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        # JSON true/false are bool, which Python also counts as int: an int field never takes them
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            expected = " or ".join(k.__name__ for k in kinds)
            raise ValueError(f"{where}: field {name!r} must be {expected}, got {_short(value)}")


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value) if not isinstance(value, int) or abs(value) < 10**limit else "a huge integer"
    return text if len(text) <= limit else text[: limit - 1] + "…"


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
        isinstance(label, int) or re.fullmatch(r"\s*[0-9]{1,9}\s*", label) is not None,
        f"field 'label' must be an integer, got {_short(label)}",
    )
    _require(
        0 <= int(label) < len(doc["endings"]),
        f"label {_short(label)} out of range for {len(doc['endings'])} endings",
    )


HELLASWAG = Task(
    name="hellaswag",
    data=(
        DataFile(
            "hellaswag_val.jsonl",
            "https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl",
            "dc1be2fa1bef56aab8e92a5be597a617e363b09239fa66822939d7fb7a8da4ec",
        ),
    ),
    schema={"activity_label": str, "ctx_a": str, "ctx_b": str, "endings": list, "label": (int, str)},
    output_type="multiple_choice",
    doc_to_text=_hellaswag_query,
    doc_to_choice=lambda doc: [hellaswag_preprocess(ending) for ending in doc["endings"]],
    doc_to_target=lambda doc: int(doc["label"]),
    check=_hellaswag_check,
    metrics=("acc", "acc_norm", "acc_bytes"),
    headline="acc_norm",
    lm_eval_task="hellaswag",
    lm_eval_yaml="hellaswag/hellaswag.yaml",
)

# ------------------------------------------------------------------------------------------------------------
# PIQA (lm_eval/tasks/piqa/piqa.yaml)

PIQA = Task(
    name="piqa",
    data=(
        DataFile(
            "piqa/valid.jsonl",
            "https://yonatanbisk.com/piqa/data/valid.jsonl",
            "93503cc97c679e459b065c3d13e848282e44b2a25213985bed3e5d458abef72d",
        ),
        DataFile(
            "piqa/valid-labels.lst",
            "https://yonatanbisk.com/piqa/data/valid-labels.lst",
            "b4192dc3a2a0363d9d60ccf79800cbbe2f32ebb17726efdde6970e0b8131bceb",
        ),
    ),
    schema={"goal": str, "sol1": str, "sol2": str},
    output_type="multiple_choice",
    doc_to_text=lambda doc: f"Question: {doc['goal']}\nAnswer:",
    doc_to_choice=lambda doc: [doc["sol1"], doc["sol2"]],
    doc_to_target=lambda doc: doc["label"],
    metrics=("acc", "acc_norm", "acc_bytes"),
    headline="acc",
    reader=read_piqa,
    lm_eval_task="piqa",
    lm_eval_yaml="piqa/piqa.yaml",
)

# ------------------------------------------------------------------------------------------------------------
# LAMBADA, OpenAI version (lm_eval/tasks/lambada/lambada_openai.yaml)


def lambada_split(text: str) -> tuple[str, str]:
    """(context, target): all but the last space-separated word, and " " + that word (punctuation included)."""
    words = text.split(" ")
    return " ".join(words[:-1]), " " + words[-1]


LAMBADA = Task(
    name="lambada",
    data=(
        DataFile(
            "lambada_test.jsonl",
            "https://openaipublic.blob.core.windows.net/gpt-2/data/lambada_test.jsonl",
            "4aa8d02cd17c719165fc8a7887fddd641f43fcafa4b1c806ca8abc31fabdb226",
        ),
    ),
    schema={"text": str},
    output_type="loglikelihood",
    doc_to_text=lambda doc: lambada_split(doc["text"])[0],
    doc_to_target=lambda doc: lambada_split(doc["text"])[1],
    check=lambda doc: _require(doc["text"] != "", "field 'text' is empty"),
    metrics=("acc", "perplexity"),
    headline="acc",
    lm_eval_task="lambada_openai",
    lm_eval_yaml="lambada/lambada_openai.yaml",
    lm_eval_split="test",
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
        f"answerKey {_short(answer_key)} is not one of the labels {_short(choices['label'])}",
    )


def _hub_file(path: str, url: str, sha256: str) -> tuple[DataFile, ...]:
    """A file converted from a Hugging Face hub parquet at a pinned revision (there is no official JSONL)."""
    return (DataFile(path, f"{_HF}/{url}", sha256, parquet=True),)


def _arc(name: str, data: tuple[DataFile, ...], headline: str) -> Task:
    return Task(
        name=name,
        data=data,
        schema={"question": str, "choices": dict, "answerKey": str},
        output_type="multiple_choice",
        doc_to_text=lambda doc: f"Question: {doc['question']}\nAnswer:",
        doc_to_choice=lambda doc: list(doc["choices"]["text"]),
        doc_to_target=lambda doc: doc["choices"]["label"].index(doc["answerKey"]),
        check=lambda doc: _check_choices(doc, doc["answerKey"]),
        metrics=("acc", "acc_norm", "acc_bytes"),
        headline=headline,
        lm_eval_task=name,
        lm_eval_yaml=f"arc/{name}.yaml",
    )


ARC_EASY = _arc(
    "arc_easy",
    _hub_file(
        "extra/arc_easy_validation.jsonl",
        "allenai/ai2_arc/resolve/210d026faf9955653af8916fad021475a3f00453/ARC-Easy/validation-00000-of-00001.parquet",
        "b35645919a17e969df8cd9c3af371a6edb5cd7f92ba04d8c65ee24ddab5a7a60",
    ),
    "acc",
)
ARC_CHALLENGE = _arc(
    "arc_challenge",
    _hub_file(
        "extra/arc_challenge_validation.jsonl",
        "allenai/ai2_arc/resolve/210d026faf9955653af8916fad021475a3f00453/ARC-Challenge/validation-00000-of-00001.parquet",
        "91042aabebf8aa801b045b025ddb420ccf66bb079c6a95f30c35cfd7962590cb",
    ),
    "acc_norm",
)

# ------------------------------------------------------------------------------------------------------------
# WinoGrande, partial scoring (lm_eval/tasks/winogrande/preprocess_winogrande.py)


def _winogrande_check(doc: dict) -> None:
    _require("_" in doc["sentence"], "field 'sentence' has no '_' blank")
    _require(doc["answer"] in ("1", "2"), f'field \'answer\' must be "1" or "2", got {_short(doc["answer"])}')


def _winogrande_choices(doc: dict) -> list[str]:
    blank = doc["sentence"].index("_")
    return [doc["sentence"][:blank] + option for option in (doc["option1"], doc["option2"])]


WINOGRANDE = Task(
    name="winogrande",
    data=_hub_file(
        "extra/winogrande_xl_validation.jsonl",
        "allenai/winogrande/resolve/01e74176c63542e6b0bcb004dcdea22d94fb67b5/winogrande_xl/validation-00000-of-00001.parquet",
        "34f0a22749f3986249b0629ff05ae298ebb2b14f93ac8499aa673626548626c7",
    ),
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
    lm_eval_yaml="winogrande/default.yaml",
)

# ------------------------------------------------------------------------------------------------------------
# OpenBookQA (lm_eval/tasks/openbookqa/openbookqa.yaml)

OPENBOOKQA = Task(
    name="openbookqa",
    data=_hub_file(
        "extra/openbookqa_validation.jsonl",
        "allenai/openbookqa/resolve/388097ea7776314e93a529163e0fea805b8a6454/main/validation-00000-of-00001.parquet",
        "90adcc55f4724ec367585978363aa451628d18093b6c827b2fd295128cd61e87",
    ),
    schema={"question_stem": str, "choices": dict, "answerKey": str},
    output_type="multiple_choice",
    doc_to_text=lambda doc: doc["question_stem"],
    doc_to_choice=lambda doc: list(doc["choices"]["text"]),
    doc_to_target=lambda doc: doc["choices"]["label"].index(doc["answerKey"].lstrip()),
    check=lambda doc: _check_choices(doc, doc["answerKey"].lstrip()),
    metrics=("acc", "acc_norm", "acc_bytes"),
    headline="acc_norm",
    lm_eval_task="openbookqa",
    lm_eval_yaml="openbookqa/openbookqa.yaml",
)

# ------------------------------------------------------------------------------------------------------------
# SciQ (lm_eval/tasks/sciq/sciq.yaml): the correct answer is always the 4th choice

SCIQ = Task(
    name="sciq",
    data=_hub_file(
        "extra/sciq_validation.jsonl",
        "allenai/sciq/resolve/2c94ad3e1aafab77146f384e23536f97a4849815/data/validation-00000-of-00001.parquet",
        "b0775c6e2e0547aa670400d59d2ffdeaa8c1e8f7e099ee35cd39b33daeefdb42",
    ),
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
    lm_eval_yaml="sciq/sciq.yaml",
)

# ------------------------------------------------------------------------------------------------------------
# BoolQ (lm_eval/tasks/super_glue/boolq/default.yaml). Our file is the official BoolQ release, whose boolean
# ``answer`` is SuperGLUE's ``label`` (0 = False = "no", 1 = True = "yes").

BOOLQ = Task(
    name="boolq",
    data=_hub_file(
        "extra/boolq_validation.jsonl",
        "google/boolq/resolve/35b264d03638db9f4ce671b711558bf7ff0f80d5/data/validation-00000-of-00001.parquet",
        "0ad1d6a17b5524d7f8eeea3bcb9a823556785a890f26e3d88bef40245bedc5f2",
    ),
    schema={"question": str, "passage": str, "answer": bool},
    output_type="multiple_choice",
    doc_to_text=lambda doc: f"{doc['passage']}\nQuestion: {doc['question']}?\nAnswer:",
    doc_to_choice=lambda doc: ["no", "yes"],
    doc_to_target=lambda doc: int(doc["answer"]),
    metrics=("acc",),
    headline="acc",
    lm_eval_task="boolq",
    lm_eval_yaml="super_glue/boolq/default.yaml",
    lm_eval_doc=lambda doc: {**doc, "label": int(doc["answer"])},
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
        f"field 'question' must be cause or effect, got {_short(doc['question'])}",
    )
    _require(doc["label"] in (0, 1), f"field 'label' must be 0 or 1, got {_short(doc['label'])}")
    _require(doc["choice1"] != "" and doc["choice2"] != "", "empty choice")


COPA = Task(
    name="copa",
    data=_hub_file(
        "extra/copa_validation.jsonl",
        "aps/super_glue/resolve/5234c61e804e85e5994b14b002fa9ec34487bcfb/copa/validation-00000-of-00001.parquet",
        "fbec30f4988f13714e8f51752cdcf1294ac237d4fb948353b7a55c5d0c0ee077",
    ),
    schema={"premise": str, "choice1": str, "choice2": str, "question": str, "label": int},
    output_type="multiple_choice",
    doc_to_text=_copa_text,
    doc_to_choice=lambda doc: [_copa_connect(doc["choice1"]), _copa_connect(doc["choice2"])],
    doc_to_target=lambda doc: _copa_connect(doc["choice1"] if doc["label"] == 0 else doc["choice2"]),
    check=_copa_check,
    metrics=("acc",),
    headline="acc",
    lm_eval_task="copa",
    lm_eval_yaml="super_glue/copa/default.yaml",
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


# The names every command accepts: each task's own name and its aliases (lm-eval's name where it differs).
TASK_ALIASES: dict[str, str] = {
    alias: task.name
    for task in TASKS.values()
    for alias in (*task.aliases, task.lm_eval_task)
    if alias != task.name
}


# ------------------------------------------------------------------------------------------------------------
# Names, limits and files


def get_task(name: str) -> Task:
    """The task called ``name`` (or one of its aliases)."""
    task = TASKS.get(TASK_ALIASES.get(name, name))
    if task is None:
        raise ValueError(f"unknown task {name!r}; expected one of {', '.join(TASKS)} or 'validation'")
    return task


def parse_task_names(spec: str | Sequence[str], extra: Iterable[str] = ()) -> list[str]:
    """Canonical task names from a comma list (or a list of names): aliases resolved, duplicates dropped,
    ``all`` = every task. ``extra`` names (e.g. ``validation``) are accepted as they are. The one parser of
    ``eval --tasks``, ``data download-evals --tasks`` and ``lm-eval-tasks --tasks``."""
    items = spec.split(",") if isinstance(spec, str) else [part for item in spec for part in item.split(",")]
    names = [item.strip() for item in items if item.strip()]
    if not names:
        raise ValueError(f"no tasks given; expected a comma list of {', '.join(TASKS)}, or {ALL}")
    extra = tuple(extra)
    out: list[str] = []
    unknown = []
    for name in names:
        if name == ALL:
            out.extend(TASKS)
        elif name in extra:
            out.append(name)
        elif name in TASKS or name in TASK_ALIASES:
            out.append(TASK_ALIASES.get(name, name))
        else:
            unknown.append(name)
    if unknown:
        aliases = ", ".join(f"{a} (= {n})" for a, n in TASK_ALIASES.items())
        raise ValueError(
            f"unknown task{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; expected a "
            "comma list of "
            f"{', '.join([*TASKS, *extra])}, or {ALL} (aliases: {aliases})"
        )
    return list(dict.fromkeys(out))


def parse_limit(text: str | int | None) -> int | None:
    """A ``--limit``: a positive number of documents, or ``all`` / None for the full sets. 0 is refused (it
    would score nothing); the same rule holds for every command that takes a document limit."""
    if text is None or (isinstance(text, str) and text.strip().lower() in (ALL, "none", "null")):
        return None
    try:
        value = int(text)
    except (TypeError, ValueError):
        raise ValueError(f"limit must be a positive number of documents or 'all', got {text!r}") from None
    if value < 1:
        raise ValueError(
            f"limit must be a positive number of documents, got {value}; leave it out (or say 'all') "
            "for the full sets"
        )
    return value


def eval_data_dir(data_dir: str | Path | None = None) -> Path:
    """``data_dir``, else $TABLEFREE_EVAL_DATA, else ~/.cache/tablefree/eval."""
    chosen = data_dir or os.environ.get(ENV_EVAL_DATA) or DEFAULT_EVAL_DATA
    return Path(chosen).expanduser()


def download_command(root: Path, names: Sequence[str]) -> str:
    """The command that fetches (and verifies) the files of ``names`` into ``root``."""
    return f"tablefree data download-evals {root} --tasks {','.join(names)}"


def check_task_files(
    tasks: Sequence[Task],
    data_dir: str | Path | None = None,
    point_at: str = "data_dir=DIR / --eval-data DIR",
) -> None:
    """Every data file of every task is present; otherwise ONE error listing all missing files and the
    command that fetches them; ``point_at`` is how the caller names the directory (compare: eval.data_dir=DIR)."""
    root = eval_data_dir(data_dir)
    missing = [(task, root / name) for task in tasks for name in task.files if not (root / name).is_file()]
    if not missing:
        return
    names = list(dict.fromkeys(task.name for task, _ in missing))
    listing = "\n".join(f"  {task.name}: {path}" for task, path in missing)
    raise FileNotFoundError(
        f"{len(missing)} evaluation data file(s) missing under {root}:\n{listing}\n"
        f"Fetch them (sha256-verified) with: {download_command(root, names)}\n"
        f"(or pass {point_at} / set {ENV_EVAL_DATA} to where they are)"
    )


def task_files(task: Task, data_dir: str | Path | None = None) -> list[Path]:
    """The task's data files, each checked to exist (the error says how to get them)."""
    check_task_files([task], data_dir)
    root = eval_data_dir(data_dir)
    return [root / name for name in task.files]


def load_docs(task: Task, data_dir: str | Path | None = None, limit: int | None = None) -> list[Doc]:
    """The task's documents, validated: a bad record is an error naming its file and line."""
    paths = task_files(task, data_dir)
    records = (task.reader or (lambda p, n: read_jsonl(p[0], n)))(paths, limit)
    if not records:
        raise ValueError(f"{paths[0]}: no records")
    docs = []
    for index, (where, record) in enumerate(records[:limit]):  # a reader returns at most that many
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
