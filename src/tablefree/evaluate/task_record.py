"""A benchmark task as a declarative record (a YAML file) over the one scoring engine.

The shipped tasks are the files in ``evaluate/task_records/`` (mirroring lm-evaluation-harness 0.4.13); a user's
task is the same kind of file, run with ``tablefree eval --tasks path/to/task.yaml``. The fields, with the
names lm-eval's task YAML uses where they mean the same (docs/evaluation.md, "Adding a task"):

* ``name``; ``output_type``: ``multiple_choice`` (one request per choice) or ``loglikelihood`` (one request,
  scored by greedy match and perplexity); ``multiple_input: true`` for WinoGrande's partial scoring (the choices
  are contexts, ``doc_to_text`` the gold index, ``doc_to_target`` the shared continuation);
* ``data``: the files, ``[{path: ...}]``, the first holding the documents as JSON lines; a shipped task's paths
  are under the eval data directory, with the ``url`` and ``sha256`` that ``data download-evals`` uses; a user's
  are relative to the task file (or absolute);
* ``fields``: each field a record must have and its JSON type (``str``, ``int``, ``float``, ``bool``, ``list``,
  ``dict``, or a list of them);
* ``doc_to_text``, ``doc_to_choice``, ``doc_to_target``: a template (``"Question: {{goal}}\\nAnswer:"``; a
  ``{{field}}`` or ``{{field.key}}`` is replaced by the record's value), ``doc_to_choice`` also a list of
  templates, ``doc_to_target`` also an integer (the gold choice's index); or ``{function: NAME}``, a function
  of ``task_functions.DOC_FUNCTIONS``. A multiple-choice target that reads as a whole number is the gold
  choice's index, any other text the choice it equals (as lm-eval);
* ``check`` (a name from ``task_functions.CHECKS``), ``reader`` (``task_functions.READERS``), ``metrics``,
  ``headline``, ``target_delimiter`` (``" "``), ``aliases``, and ``lm_eval: {task, yaml, split, doc}`` (the
  lm-eval task it mirrors, for the parity tests and ``lm-eval-tasks``).

Every field is checked when the file is read, and an error names the file and the field.

``build_requests`` then does what lm-eval's ``ConfigurableTask.construct_requests`` does:

* multiple choice: context = doc_to_text(doc), one request per choice with continuation
  ``target_delimiter + choice`` (``" "`` everywhere; COPA's choices already start with a space, so its
  continuations start with two, exactly as in lm-eval);
* multiple input: one context per option and the same continuation; gold = doc_to_text(doc);
* loglikelihood: one request (doc_to_text(doc), doc_to_target(doc)).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tablefree.config_parsing import load_yaml
from tablefree.evaluate import task_functions

OUTPUT_TYPES = ("multiple_choice", "loglikelihood")
METRICS = {"multiple_choice": ("acc", "acc_norm", "acc_bytes"), "loglikelihood": ("acc", "perplexity")}
JSON_TYPES: dict[str, type] = {
    "str": str,
    "int": int,
    "float": float,
    "bool": bool,
    "list": list,
    "dict": dict,
}
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*)\s*\}\}")
_WHOLE_NUMBER = re.compile(r"[0-9]+")


@dataclass(frozen=True)
class Doc:
    """One benchmark record with where it came from (for error messages and per-example output)."""

    index: int  # doc_id: position in the file(s), from 0
    where: str  # "file:line"
    fields: dict[str, Any]


@dataclass(frozen=True)
class DataFile:
    """One file of a task: where it lives and, for a shipped task, where it is downloaded from."""

    path: str  # a shipped task's: relative to the eval data directory; a user's: absolute
    url: str | None = None
    sha256: str | None = None  # of the file as stored (for a parquet source: of the converted JSON lines)
    parquet: bool = False  # the URL serves parquet, converted to JSON lines by `data download-evals`


@dataclass(frozen=True)
class Task:
    name: str
    data: tuple[DataFile, ...]  # the first holds the documents
    schema: dict[str, type | tuple[type, ...]]  # required fields and their JSON types
    output_type: str  # "multiple_choice" | "loglikelihood"
    doc_to_text: Callable[[dict], Any]
    doc_to_target: Callable[[dict], Any]
    lm_eval_task: str | None = None  # lm-eval's task name
    lm_eval_yaml: str | None = None  # lm-eval's task config, relative to lm_eval/tasks
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
    source: str = ""  # the task file it was read from

    @property
    def files(self) -> tuple[str, ...]:
        """The data files' paths relative to the eval data directory (a user's task: absolute)."""
        return tuple(f.path for f in self.data)

    @property
    def downloadable(self) -> bool:
        """Every file has a URL (``data download-evals`` fetches it)."""
        return all(f.url is not None for f in self.data)


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


# ------------------------------------------------------------------------------------------------------------
# Templates: "{{field}}" and "{{field.key}}" / "{{field.0}}" replaced by the record's value


def _lookup(doc: dict, path: str) -> Any:
    value: Any = doc
    for key in path.split("."):
        if isinstance(value, dict) and key in value:
            value = value[key]
        elif isinstance(value, list) and key.isdigit() and int(key) < len(value):
            value = value[int(key)]
        else:
            raise ValueError(f"the record has no {path!r} (template {{{{{path}}}}})")
    return value


def _as_text(value: Any, path: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise ValueError(f"{{{{{path}}}}} is {type(value).__name__}, not text or a number")


def _template(text: str) -> Callable[[dict], str]:
    pieces = _PLACEHOLDER.split(text)  # literal, path, literal, path, ..., literal

    def render(doc: dict) -> str:
        return "".join(
            piece if position % 2 == 0 else _as_text(_lookup(doc, piece), piece)
            for position, piece in enumerate(pieces)
        )

    return render


def _whole_placeholder(text: str) -> str | None:
    match = _PLACEHOLDER.fullmatch(text)
    return match.group(1) if match else None


# ------------------------------------------------------------------------------------------------------------
# Reading a task file


class _Fields:
    """The record being read, with errors that name the file and the field."""

    def __init__(self, path: Path, record: dict[str, Any]):
        self.path, self.record = path, record

    def error(self, field: str, message: str) -> ValueError:
        return ValueError(f"{self.path}: field {field!r}: {message}")

    def get(self, field: str, kind: type | tuple[type, ...], default: Any = ..., what: str = "") -> Any:
        if field not in self.record:
            if default is ...:
                raise ValueError(f"{self.path}: missing field {field!r} ({what or _kind_name(kind)})")
            return default
        value = self.record[field]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            raise self.error(field, f"expected {what or _kind_name(kind)}, got {_describe(value)}")
        return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(
        {"str": "text", "dict": "a mapping", "list": "a list"}.get(k.__name__, k.__name__) for k in kinds
    )


def _describe(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:59] + '…'}"


_FIELDS = (
    "name",
    "output_type",
    "multiple_input",
    "data",
    "fields",
    "doc_to_text",
    "doc_to_choice",
    "doc_to_target",
    "check",
    "reader",
    "metrics",
    "headline",
    "target_delimiter",
    "aliases",
    "lm_eval",
)


def read_task_file(path: str | Path, *, shipped: bool = False) -> Task:
    """The task a YAML record describes, every field checked (errors name the file and the field).

    ``shipped``: the file is one of the package's own records, whose data paths are under the eval data
    directory and carry their download URL and sha256; a user's data paths are relative to the file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"task file not found: {path}")
    fields = _Fields(path, load_yaml(path))
    unknown = [key for key in fields.record if key not in _FIELDS]
    if unknown:
        raise ValueError(
            f"{path}: unknown field{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
            f"expected some of {', '.join(_FIELDS)}"
        )
    name = fields.get("name", str)
    if not NAME_PATTERN.fullmatch(name):
        raise fields.error("name", f"expected letters, digits, '_', '.' or '-', got {name!r}")
    output_type = fields.get("output_type", str)
    if output_type not in OUTPUT_TYPES:
        raise fields.error("output_type", f"expected one of {', '.join(OUTPUT_TYPES)}, got {output_type!r}")
    multiple_input = fields.get("multiple_input", bool, False)
    if multiple_input and output_type != "multiple_choice":
        raise fields.error("multiple_input", "only a multiple_choice task has several inputs")
    schema = _read_schema(fields)
    text = _read_doc_function(fields, "doc_to_text", schema, ("template",))
    if output_type == "multiple_choice":
        choice = _read_doc_function(fields, "doc_to_choice", schema, ("template", "list"))
    elif "doc_to_choice" in fields.record:
        raise fields.error("doc_to_choice", "a loglikelihood task has no choices; leave it out")
    else:
        choice = None
    target_forms = ("template", "index") if output_type == "multiple_choice" and not multiple_input else ()
    target = _read_doc_function(fields, "doc_to_target", schema, ("template", *target_forms))
    allowed = METRICS[output_type]
    metrics = tuple(fields.get("metrics", list, list(allowed[:2]), what="a list of metric names"))
    bad = [m for m in metrics if m not in allowed]
    if bad or not metrics or len(set(metrics)) != len(metrics):
        raise fields.error(
            "metrics", f"expected distinct names from {', '.join(allowed)}, got {list(metrics)}"
        )
    headline = fields.get("headline", str, metrics[0])
    if headline not in metrics:
        raise fields.error(
            "headline", f"expected one of the task's metrics {', '.join(metrics)}, got {headline!r}"
        )
    lm_eval = _read_lm_eval(fields)
    aliases = fields.get("aliases", list, [], what="a list of names")
    if not all(isinstance(a, str) and NAME_PATTERN.fullmatch(a) for a in aliases):
        raise fields.error("aliases", f"expected a list of names, got {aliases!r}")
    return Task(
        name=name,
        data=_read_data(fields, shipped),
        schema=schema,
        output_type=output_type,
        doc_to_text=text,
        doc_to_target=target,
        doc_to_choice=choice,
        check=_named(fields, "check", task_functions.CHECKS),
        metrics=metrics,
        headline=headline,
        target_delimiter=fields.get("target_delimiter", str, " "),
        multiple_input=multiple_input,
        reader=_named(fields, "reader", task_functions.READERS),
        aliases=tuple(aliases),
        source=str(path),
        **lm_eval,
    )


def _read_schema(fields: _Fields) -> dict[str, type | tuple[type, ...]]:
    declared = fields.get("fields", dict, what="a mapping of field name to JSON type")
    if not declared:
        raise fields.error("fields", "expected at least one field a record must have")
    schema: dict[str, type | tuple[type, ...]] = {}
    for key, kind in declared.items():
        names = kind if isinstance(kind, list) else [kind]
        if not isinstance(key, str) or not names or not all(n in JSON_TYPES for n in names):
            raise fields.error(
                f"fields.{key}", f"expected one of {', '.join(JSON_TYPES)} (or a list of them), got {kind!r}"
            )
        types = tuple(JSON_TYPES[n] for n in names)
        schema[key] = types[0] if len(types) == 1 else types
    return schema


def _read_doc_function(
    fields: _Fields, field: str, schema: dict[str, Any], forms: tuple[str, ...]
) -> Callable[[dict], Any]:
    """A doc_to_* field: ``{function: NAME}``, or a template (a list of them, an index) as ``forms`` allow."""
    what = " or ".join(
        {"template": "a template", "list": "a list of templates", "index": "a choice index"}[f] for f in forms
    )
    value = fields.get(field, object, what=f"{what} or {{function: NAME}}")
    if isinstance(value, dict):
        if set(value) != {"function"} or not isinstance(value["function"], str):
            raise fields.error(field, f"expected {{function: NAME}}, got {value!r}")
        return _named(fields, field, task_functions.DOC_FUNCTIONS, value["function"])
    if isinstance(value, str) and "template" in forms:
        _check_placeholders(fields, field, value, schema)
        whole = _whole_placeholder(value)
        if field == "doc_to_choice":
            if whole is None:
                raise fields.error(field, "a single template must name one list field, as '{{choices}}'")
            return lambda doc: _choice_list(_lookup(doc, whole), whole)
        render = _template(value)
        if "index" in forms:  # a multiple-choice target: a whole number is the gold choice's index
            if whole is not None:
                return lambda doc: _target(_lookup(doc, whole), whole)
            return lambda doc: _target(render(doc), value)
        return render
    if isinstance(value, list) and "list" in forms:
        if not value or not all(isinstance(item, str) for item in value):
            raise fields.error(field, f"expected a non-empty list of templates, got {value!r}")
        for item in value:
            _check_placeholders(fields, field, item, schema)
        renders = [_template(item) for item in value]
        return lambda doc: [render(doc) for render in renders]
    if isinstance(value, int) and not isinstance(value, bool) and "index" in forms:
        if value < 0:
            raise fields.error(field, f"expected a choice index >= 0, got {value}")
        return lambda doc: value
    raise fields.error(field, f"expected {what} or {{function: NAME}}, got {_describe(value)}")


def _check_placeholders(fields: _Fields, field: str, template: str, schema: dict[str, Any]) -> None:
    left = _PLACEHOLDER.sub("", template)
    if "{{" in left or "}}" in left:
        raise fields.error(field, f"{template!r}: a '{{{{' or '}}}}' outside a '{{{{field}}}}' placeholder")
    for path in _PLACEHOLDER.findall(template):
        if path.split(".")[0] not in schema:
            raise fields.error(
                field, f"{{{{{path}}}}} names field {path.split('.')[0]!r}, which 'fields' does not list"
            )


def _choice_list(value: Any, path: str) -> list[str]:
    if not isinstance(value, list) or not value or not all(isinstance(item, str) for item in value):
        raise ValueError(f"{{{{{path}}}}} must be a non-empty list of strings, got {_describe(value)}")
    return list(value)


def _target(value: Any, template: str) -> int | str:
    """A multiple-choice target: an int is the gold index, a whole number's text too, other text a choice."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        return int(value) if _WHOLE_NUMBER.fullmatch(value.strip()) else value
    raise ValueError(f"{template}: the target is {_describe(value)}, not a choice index or text")


def _named(fields: _Fields, field: str, table: dict[str, Any], name: str | None = None) -> Any:
    if name is None:
        name = fields.get(field, str, None, what="a name")
        if name is None:
            return None
    if name not in table:
        raise fields.error(field, f"unknown function {name!r}; expected one of {', '.join(table)}")
    return table[name]


def _read_data(fields: _Fields, shipped: bool) -> tuple[DataFile, ...]:
    entries = fields.get("data", list, what="a list of {path: ...}")
    if not entries:
        raise fields.error("data", "expected at least one file")
    allowed = ("path", "url", "sha256", "parquet") if shipped else ("path",)
    files = []
    for position, entry in enumerate(entries):
        where = f"data[{position}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("path"), str) or not entry["path"]:
            raise fields.error(where, f"expected a mapping with a 'path', got {entry!r}")
        unknown = [key for key in entry if key not in allowed]
        if unknown:
            hint = "" if shipped else " (only the shipped tasks are downloaded, by data download-evals)"
            raise fields.error(where, f"unknown key(s) {unknown}; expected {', '.join(allowed)}{hint}")
        if shipped:
            sha256 = entry.get("sha256")
            if not isinstance(entry.get("url"), str) or not re.fullmatch(r"[0-9a-f]{64}", str(sha256)):
                raise fields.error(where, "a shipped task's file needs its url and sha256 (64 hex digits)")
            parquet = entry.get("parquet", False)
            if not isinstance(parquet, bool):
                raise fields.error(f"{where}.parquet", f"expected true or false, got {parquet!r}")
            files.append(DataFile(entry["path"], entry["url"], sha256, parquet))
        else:
            files.append(DataFile(str((fields.path.parent / entry["path"]).absolute())))
    return tuple(files)


def _read_lm_eval(fields: _Fields) -> dict[str, Any]:
    section = fields.get("lm_eval", dict, None, what="a mapping {task, yaml, split, doc}")
    if section is None:
        return {}
    unknown = [key for key in section if key not in ("task", "yaml", "split", "doc")]
    if unknown or not isinstance(section.get("task"), str) or not isinstance(section.get("yaml"), str):
        raise fields.error("lm_eval", f"expected {{task: NAME, yaml: PATH, split, doc}}, got {section!r}")
    split = section.get("split", "validation")
    if split not in ("validation", "test"):
        raise fields.error("lm_eval.split", f"expected validation or test, got {split!r}")
    doc = section.get("doc")
    return {
        "lm_eval_task": section["task"],
        "lm_eval_yaml": section["yaml"],
        "lm_eval_split": split,
        "lm_eval_doc": None
        if doc is None
        else _named(fields, "lm_eval.doc", task_functions.LM_EVAL_DOCS, doc),
    }
