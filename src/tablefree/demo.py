"""``tablefree demo``: the whole experiment on the embedded default corpus, offline, in about ten minutes on CPU.

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
from collections.abc import Iterator
from pathlib import Path

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
    tmp = out_path.with_name(f".{out_path.name}.tmp.{os.getpid()}")
    with tmp.open("w", encoding="utf-8") as out:
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
    os.replace(tmp, out_path)
    import torch

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
    from tablefree.checkpoint import write_json_atomic

    write_json_atomic(out_path.with_name("corpus.json"), stats)
    return stats


def _documents(min_chars: int) -> Iterator[tuple[str, str, list[str]]]:
    """(source, name, texts) for every document of the default corpus, in the documented order."""
    from pydoc_data.topics import topics

    for topic in sorted(topics):
        text = topics[topic].strip()
        if len(text) >= min_chars:
            yield "python-topics", topic, [text]
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for path in _stdlib_files(stdlib):
        yield "python-stdlib", path.relative_to(stdlib).as_posix(), _docstrings(path, min_chars)
    import torch

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
