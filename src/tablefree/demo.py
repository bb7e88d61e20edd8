"""``tablefree demo``: the whole experiment on the embedded default corpus, offline (docs/demo.md for its time).

The embedded default corpus is English documentation text that ships with every Python and PyTorch install
(see ``gather_default_corpus`` and docs/demo.md for exactly what is gathered).
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import sys
import sysconfig
import time
from collections.abc import Iterator
from importlib.resources import files
from pathlib import Path
from pydoc_data.topics import topics

import torch

from tablefree.compare import CompareConfig, run_sweep
from tablefree.config_parsing import from_dict, load_yaml
from tablefree.data.prepare import prepare_dataset
from tablefree.evaluate import get_task
from tablefree.evaluate.tasks import ENV_EVAL_DATA, eval_data_dir, task_files
from tablefree.fileio import atomic_path, write_json_atomic
from tablefree.report import verdict
from tablefree.report.comparison import few_seeds_sentence
from tablefree.report.markdown import summary_counts
from tablefree.sweep.config import deep_merge

MIN_DOCSTRING_CHARS = 80  # shorter docstrings ("Return self.") are boilerplate, not prose
# Standard-library packages left out: the test suite, the IDLE and turtle demo applications.
STDLIB_EXCLUDED = {"idlelib", "test", "turtledemo"}
EXCLUDED_DIRS = {"test", "tests", "idle_test", "testing"}
DOCUMENT_SEPARATOR = "\n\n"


def gather_default_corpus(out_path: str | Path, min_chars: int = MIN_DOCSTRING_CHARS) -> dict:
    """Write the embedded default corpus as JSONL (one ``{"text", "source"}`` document a line) and describe it.

    Documents, in this order, each source sorted by name:

    1. every topic of ``pydoc_data.topics.topics`` (the language reference text behind ``help("TOPIC")``);
    2. per standard-library source file (public top-level modules of ``sys.stdlib_module_names`` that are
       written in Python, packages walked recursively, tests and IDLE/turtledemo left out): its docstrings;
    3. per source file of the installed ``torch`` package whose path has no private (``_``) component and is
       not a test: its docstrings.

    Docstrings (module, class, function, method) are read by parsing the source with ``ast``, so nothing is
    imported or executed; they are cleaned with ``inspect.cleandoc``, and those shorter than ``min_chars`` or
    already seen (exact text) are skipped. A file's docstrings join with blank lines into one document. The
    output is deterministic for a given Python and PyTorch installation. Returns the statistics (also written
    beside the corpus as ``corpus.json``).
    """
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    seen: set[str] = set()
    sources: dict[str, dict[str, int]] = {}
    digest = hashlib.sha256()
    with atomic_path(out_path) as tmp, tmp.open("w", encoding="utf-8") as out:
        for source, name, texts in _documents(min_chars):
            fresh = [text for text in texts if text not in seen]
            seen.update(fresh)
            if not fresh:
                continue
            line = json.dumps({"text": DOCUMENT_SEPARATOR.join(fresh), "source": f"{source}:{name}"}) + "\n"
            out.write(line)
            digest.update(line.encode("utf-8"))
            counts = sources.setdefault(source, {"documents": 0, "docstrings": 0, "bytes": 0})
            counts["documents"] += 1
            counts["docstrings"] += len(fresh)
            counts["bytes"] += sum(len(text.encode("utf-8")) for text in fresh)
    stats = {
        "path": str(out_path),
        "sha256": digest.hexdigest(),
        "documents": sum(s["documents"] for s in sources.values()),
        "text_bytes": sum(s["bytes"] for s in sources.values()),
        "sources": sources,
        "min_chars": min_chars,
        "python": sys.version.split()[0],
        "torch": torch.__version__,
    }
    write_json_atomic(out_path.with_name("corpus.json"), stats)
    return stats


def _documents(min_chars: int) -> Iterator[tuple[str, str, list[str]]]:
    """(source, name, texts) for every document of the default corpus, in the documented order."""
    for topic in sorted(topics):
        text = topics[topic].strip()
        if len(text) >= min_chars:
            yield "python-topics", topic, [text]
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for path in _stdlib_files(stdlib):
        yield "python-stdlib", path.relative_to(stdlib).as_posix(), _docstrings(path, min_chars)
    torch_root = Path(torch.__file__).parent
    for path in _package_files(torch_root):
        yield "torch", path.relative_to(torch_root.parent).as_posix(), _docstrings(path, min_chars)


def _stdlib_files(stdlib: Path) -> Iterator[Path]:
    for name in sorted(sys.stdlib_module_names):
        if name.startswith("_") or name in STDLIB_EXCLUDED:
            continue
        if (stdlib / f"{name}.py").is_file():
            yield stdlib / f"{name}.py"
        elif (stdlib / name / "__init__.py").is_file():
            yield from _package_files(stdlib / name)
        # else a module compiled into the interpreter or an extension: no source to read


def _package_files(root: Path) -> Iterator[Path]:
    """The public Python files of a package, sorted: no ``_private`` path component and no test directories."""
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).parts
        private = any(part.startswith("_") and part != "__init__.py" for part in parts)
        if not private and not EXCLUDED_DIRS.intersection(parts[:-1]):
            yield path


def _docstrings(path: Path, min_chars: int) -> list[str]:
    """The module, class and function docstrings of one source file, in source order."""
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (SyntaxError, ValueError, OSError):
        return []  # a file this Python cannot parse (e.g. a template) contributes nothing
    nodes = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, nodes):
            text = ast.get_docstring(node, clean=True)
            if text and len(text) >= min_chars:
                found.append((getattr(node, "lineno", 0), text))
    return [text for _, text in sorted(found, key=lambda item: item[0])]


# ------------------------------------------------------------------------------------------------------------
# The demo


# The demo's body: the shipped `tiny` recipe (configs/tiny.yaml, package data) with a smaller model and vocabulary,
# chosen so that the whole demo, install included, fits 7 minutes on a 2-core AVX2 CPU without AVX-512 and
# learned vs canonical still resolves on every CPU measured (docs/demo.md#time): `tiny` itself (d = 128, 4 layers,
# V = 4,096), three interfaces at 300k tokens, took 14.2 minutes there. A 1,024-token BPE makes the table 27.5%
# of the learned model (K = 10 bits at d = 64).
DEMO_VOCAB_SIZE = 1024
DEMO_VAL_FRACTION = 0.02  # ~22 of the default corpus's ~1,100 documents
DEMO_INTERFACES = (
    "learned",
    "canonical",
)  # the headline pair; `--interfaces learned,canonical,affine` adds affine
DEMO_BENCHMARKS = ("hellaswag", "piqa", "lambada")
DEMO_EVAL_LIMIT = 500  # documents per benchmark: the time budget, not the full sets
# The whole validation split: the document bootstrap needs all 22 documents (64 windows covered only 6).
DEMO_VAL_LIMIT = None
DEMO_SEEDS = [
    0,
    1,
    2,
]  # three: two seeds leave one degree of freedom, and no honest interval resolves on that
# Tokens per run: well past the unigram plateau for this body.
DEMO_BUDGET = "500k"
# The changes to `tiny`: the body and budget above; a 512-token context (8 × 512 instead of 16 × 256 tokens per
# step; RoPE adds no parameters), because some PIQA solutions are longer than 256 tokens and the evaluator refuses a
# continuation longer than the context; fewer checkpoints and in-training validation estimates, for time; and fp32
# (below).
# fp32 for training and evaluation on every machine: `auto` picks bf16 on CPUs that multiply it natively and
# faster (and only by a measured rate, so even by load), and bf16 would move the headline between machines; the
# demo's timings in docs/demo.md are fp32's.
DEMO_PRECISION = "fp32"
DEMO_MODEL = {"d_model": 64, "n_layers": 2, "n_heads": 4, "d_ff": 192, "max_seq_len": 512}
DEMO_OVERRIDES: dict = {
    "model": DEMO_MODEL,
    "precision": DEMO_PRECISION,
    "budget": DEMO_BUDGET,
    "micro_batch": 8,
    "seq_len": 512,
    "val_every": 20,
    "val_batches": 4,
    "checkpoint_every": 40,
    "keep_last": 1,
}


def packaged_config(name: str) -> Path:
    """A recipe shipped with tablefree (``configs/NAME`` of the source tree, installed as package data)."""
    path = Path(str(files("tablefree") / "configs" / name))
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: not found; the tablefree installation lacks its configs package data"
        )
    return path


def demo_recipe(budget: str | None = None) -> dict:
    """The demo's training recipe: the packaged tiny recipe with ``DEMO_OVERRIDES`` (and ``budget``)."""
    recipe = deep_merge(load_yaml(packaged_config("tiny.yaml")), DEMO_OVERRIDES)
    recipe.pop("data", None)  # the demo's own dataset
    if budget:
        recipe["budget"] = budget
    return recipe


def run_demo(
    corpus: str | Path | None = None,
    eval_data: str | Path | None = None,
    out: str | Path = "runs/demo",
    seeds: list[int] | None = None,
    budget: str | None = None,
    eval_limit: int | None = DEMO_EVAL_LIMIT,
    log=print,
    interfaces: list[str] | None = None,
) -> dict:
    """Gather (or take) a corpus, train a tokenizer, prepare shards, train the interfaces on the demo's body (the
    tiny recipe with ``DEMO_OVERRIDES``), evaluate, and write the report in ``out``. Re-running reuses everything
    already finished. ``interfaces`` (default ``DEMO_INTERFACES``, the headline pair) chooses which are trained. Returns ``run_sweep``'s outcome plus ``summary`` (the three lines
    printed at the end)."""
    out = Path(out)
    started = time.perf_counter()
    stage = _Stages(log, started)
    if corpus is None:
        stage("gathering the embedded default corpus (Python and PyTorch documentation)")
        stats = gather_default_corpus(out / "corpus" / "docs.jsonl")
        corpus = stats["path"]
        sizes = ", ".join(f"{name} {s['bytes'] / 1e6:.2f} MB" for name, s in stats["sources"].items())
        log(f"    {stats['text_bytes'] / 1e6:.2f} MB of text in {stats['documents']:,} documents ({sizes})")
    stage(f"training a {DEMO_VOCAB_SIZE}-token byte-level BPE tokenizer and preparing token shards")
    data_dir = out / "data"
    manifest = prepare_dataset(
        corpus, data_dir, vocab_size=DEMO_VOCAB_SIZE, val_fraction=DEMO_VAL_FRACTION, workers=os.cpu_count()
    )
    log(
        f"    {manifest['splits']['train']['tokens']:,} training and {manifest['splits']['val']['tokens']:,} "
        f"validation tokens in {data_dir}"
    )
    benchmarks, notes = _available_benchmarks(eval_data, eval_limit)
    recipe = demo_recipe(budget)
    config = from_dict(
        CompareConfig,
        {
            "name": "demo",
            "train": recipe,
            "dataset": {"dir": str(data_dir)},
            "interfaces": list(interfaces or DEMO_INTERFACES),
            "seeds": seeds or DEMO_SEEDS,
            "eval": {
                "tasks": ["validation", *benchmarks],
                "data_dir": str(eval_data) if eval_data else None,
                "limit": eval_limit if benchmarks else None,
                "val_limit": DEMO_VAL_LIMIT,
                "dtype": DEMO_PRECISION,
            },
            "out": str(out),
            "notes": notes,
        },
        where="demo",
    )
    stage(
        f"training and evaluating {len(config.interfaces) * len(config.seeds)} runs "
        f"(d = {recipe['model']['d_model']}, {recipe['model']['n_layers']} layers, V = {DEMO_VOCAB_SIZE}, "
        f"{recipe['budget']} tokens each, {recipe['precision']}; evaluating "
        f"{', '.join(config.eval.tasks)})"
    )
    result = run_sweep(config, log=lambda line: log(f"    {line}"))
    result["summary"] = summary_lines(result["report"]) if result["report"] else []
    result["wall_time_s"] = time.perf_counter() - started
    stage(f"done in {result['wall_time_s'] / 60:.1f} min")
    return result


class _Stages:
    """Numbered stage headers with the elapsed time, so the user always sees where the demo is."""

    def __init__(self, log, started: float) -> None:
        self.log, self.started, self.number = log, started, 0

    def __call__(self, text: str) -> None:
        self.number += 1
        elapsed = time.perf_counter() - self.started
        self.log(f"[{self.number}] {text}  (at {int(elapsed // 60)}:{int(elapsed % 60):02d})")


def _available_benchmarks(eval_data: str | Path | None, limit: int | None) -> tuple[list[str], list[str]]:
    """The demo benchmarks whose files are present, and the report notes saying what was (not) scored."""
    present = []
    for name in DEMO_BENCHMARKS:
        try:
            task_files(get_task(name), eval_data)
            present.append(name)
        except FileNotFoundError:
            pass
    directory = eval_data_dir(eval_data)
    notes = []
    if present:
        scope = f"the first {limit} documents of each" if limit else "the full sets"
        notes.append(f"Benchmarks scored on {scope}: {', '.join(present)} (from {directory}).")
    missing = [name for name in DEMO_BENCHMARKS if name not in present]
    if missing:
        notes.append(
            f"Benchmarks not scored ({', '.join(missing)}): no data in {directory}. To add them, fetch the "
            f"official files once with `tablefree data download-evals {DEFAULT_EVAL_HINT}` (needs network), "
            f"or point `--eval-data DIR` (or ${ENV_EVAL_DATA}) at a copy, then re-run `tablefree demo`: "
            "finished training is reused and only the evaluation runs."
        )
    return present, notes


DEFAULT_EVAL_HINT = "~/.cache/tablefree/eval"


def summary_lines(report: dict) -> list[str]:
    """Validation loss and bits per byte, trainable parameters, the count of resolved comparisons, and the
    sentence of each validation-loss comparison."""
    metrics = report["metrics"]
    interfaces = report["interfaces"]

    def means(name: str) -> str:
        cells = metrics.get(name, {}).get("per_interface", {})
        return ", ".join(f"{i} {cells[i]['mean']:.3f}" for i in interfaces if i in cells) or "–"

    params = report["params"]
    param_cells = []
    for interface in interfaces:
        if interface in params:
            p = params[interface]
            removed = f" (−{p['removed_percent']:.1f}%)" if p.get("removed_vs_learned") else ""
            param_cells.append(f"{interface} {p['total_trainable'] / 1e6:.2f}M{removed}")
    resolved, tested, chance = summary_counts(report)
    caveat = report["statistics"].get("few_seeds")
    validation = [c for c in verdict(report) if c["metric"] == "validation/val_loss"]
    at_chance = f" ({chance} benchmark comparisons at chance: no verdict)" if chance else ""
    return [
        f"validation loss (nats/token, lower is better): {means('validation/val_loss')}; "
        f"bits per byte: {means('validation/bits_per_byte')}",
        f"trainable parameters: {', '.join(param_cells)}",
        f"statistics: {resolved} of {tested} comparisons resolved{at_chance}",
        *([few_seeds_sentence(caveat, markdown=False)] if caveat else []),
        *(f"{c['a']} vs {c['b']}: {c['sentence']}" for c in validation),
    ]
