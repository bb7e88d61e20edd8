"""The benchmark tasks: the shipped records, names, limits, files and documents.

A task is a declarative record (``task_record.py``; the shipped ones are the YAML files in
``evaluate/task_records/``, mirroring lm-evaluation-harness 0.4.13) over the one scoring engine. This module
holds the registry (``TASKS``, their aliases), the one parser of ``--tasks`` (``parse_tasks``: names, ``all``,
and a user's task files), where the data files are (``eval_data_dir``, ``check_task_files``) and the reading of
a task's documents (``load_docs``).

Adding a task is writing one record (docs/evaluation.md, "Adding a task"); shipping it is adding its file to
``task_records/`` and its name to ``SHIPPED``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from tablefree.evaluate.records import check_fields, read_jsonl
from tablefree.evaluate.task_record import Doc, Task, read_task_file

ENV_EVAL_DATA = "TABLEFREE_EVAL_DATA"
DEFAULT_EVAL_DATA = Path("~/.cache/tablefree/eval")
ALL = "all"
RECORDS_DIR = Path(__file__).resolve().parent / "task_records"
# The shipped tasks, in the order ``all`` runs them; each is RECORDS_DIR / f"{name}.yaml".
SHIPPED = (
    "hellaswag",
    "piqa",
    "lambada",
    "arc_easy",
    "arc_challenge",
    "winogrande",
    "openbookqa",
    "sciq",
    "boolq",
    "copa",
)
TASK_FILE_SUFFIXES = (".yaml", ".yml")

TASKS: dict[str, Task] = {
    name: read_task_file(RECORDS_DIR / f"{name}.yaml", shipped=True) for name in SHIPPED
}


# The names every command accepts: each task's own name and its aliases (lm-eval's name where it differs).
TASK_ALIASES: dict[str, str] = {
    alias: task.name
    for task in TASKS.values()
    for alias in (*task.aliases, task.lm_eval_task)
    if alias is not None and alias != task.name
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
    """Canonical names of shipped tasks from a comma list (or a list of names): aliases resolved, duplicates
    dropped, ``all`` = every shipped task. ``extra`` names (e.g. ``validation``) are accepted as they are. The
    parser of ``data download-evals --tasks`` and ``lm-eval-tasks --tasks``, which take no task files."""
    return [item if isinstance(item, str) else item.name for item in _parse(spec, extra, files=False)]


def parse_tasks(spec: str | Sequence[str], extra: Iterable[str] = ()) -> list[Task | str]:
    """``parse_task_names`` for ``eval --tasks``, which also takes a user's task files (an item ending in
    .yaml or .yml): a ``Task`` for each task, the name itself for each ``extra`` name, in the order given."""
    return _parse(spec, extra, files=True)


def _parse(spec: str | Sequence[str], extra: Iterable[str], files: bool) -> list[Task | str]:
    items = spec.split(",") if isinstance(spec, str) else [part for item in spec for part in item.split(",")]
    names = [item.strip() for item in items if item.strip()]
    if not names:
        raise ValueError(f"no tasks given; expected a comma list of {', '.join(TASKS)}, or {ALL}")
    extra = tuple(extra)
    out: list[Task | str] = []
    unknown = []
    for name in names:
        if name == ALL:
            out.extend(TASKS.values())
        elif name in extra:
            out.append(name)
        elif name in TASKS or name in TASK_ALIASES:
            out.append(TASKS[TASK_ALIASES.get(name, name)])
        elif name.endswith(TASK_FILE_SUFFIXES):
            if not files:
                raise ValueError(f"{name}: a task file runs with `tablefree eval --tasks`; here only names")
            out.append(_user_task(name, extra))
        else:
            unknown.append(name)
    if unknown:
        aliases = ", ".join(f"{a} (= {n})" for a, n in TASK_ALIASES.items())
        raise ValueError(
            f"unknown task{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; expected a "
            "comma list of "
            f"{', '.join([*TASKS, *extra])}, or {ALL} (aliases: {aliases})"
            + (", or task files (.yaml)" if files else "")
        )
    unique: dict[str, Task | str] = {}
    for item in out:
        name = item if isinstance(item, str) else item.name
        if name in unique and unique[name] is not item:
            first = unique[name]
            raise ValueError(
                f"{getattr(item, 'source', name)}: task {name!r} is also "
                f"{getattr(first, 'source', None) or 'given by name'}; two tasks cannot share a name"
            )
        unique[name] = item
    return list(unique.values())


def _user_task(path: str, extra: tuple[str, ...]) -> Task:
    task = read_task_file(path)
    taken = [n for n in (task.name, *task.aliases) if n in TASKS or n in TASK_ALIASES or n in (ALL, *extra)]
    if taken:
        raise ValueError(
            f"{path}: field 'name': {taken[0]!r} is already a shipped task's name; give the task its own name"
        )
    return task


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
    # a user's task file names its data by path: nothing to download, so those are listed on their own
    own = "".join(f"  {t.name} ({t.source}): {path}\n" for t, path in missing if not t.downloadable)
    shipped = [(task, path) for task, path in missing if task.downloadable]
    message = f"{len(missing) - len(shipped)} data file(s) of task files missing:\n{own}" if own else ""
    if shipped:
        names = list(dict.fromkeys(task.name for task, _ in shipped))
        listing = "\n".join(f"  {task.name}: {path}" for task, path in shipped)
        message += (
            f"{len(shipped)} evaluation data file(s) missing under {root}:\n{listing}\n"
            f"Fetch them (sha256-verified) with: {download_command(root, names)}\n"
            f"(or pass {point_at} / set {ENV_EVAL_DATA} to where they are)"
        )
    raise FileNotFoundError(message.rstrip("\n"))


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
        check_fields(where, record, task.schema)
        if task.check is not None:
            try:
                task.check(record)
            except ValueError as error:
                raise ValueError(f"{where}: {error}") from None
        docs.append(Doc(index, where, record))
    return docs
