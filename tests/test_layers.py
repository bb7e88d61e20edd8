"""The package's layers, derived from its imports: every ``import`` of a ``tablefree`` module, at the top of a file
or inside a function, is an arrow; there is no cycle, so the modules fall into layers with every arrow pointing
down. Readers of checkpoints (evaluation, export, report, analysis) never import the trainer."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def module_files() -> dict[str, Path]:
    files = {}
    for path in sorted((SRC / "tablefree").rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


def imported(module: str, path: Path, modules: set[str]) -> set[str]:
    """The tablefree modules ``module`` imports anywhere in its file (a package's ``from P import sub`` names
    the submodule ``P.sub``)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # tablefree.x.y.function -> tablefree.x.y
                target = target.rpartition(".")[0]
            if target.startswith("tablefree") and target != module:
                found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    files = module_files()
    return {module: imported(module, path, set(files)) for module, path in files.items()}


def layers(graph: dict[str, set[str]]) -> list[list[str]]:
    """The modules in layers, lowest first: each imports only modules of the layers below it. A cycle is an
    AssertionError naming the modules on it."""
    placed: dict[str, int] = {}
    remaining = dict(graph)
    while remaining:
        ready = sorted(m for m, deps in remaining.items() if deps <= placed.keys())
        if not ready:
            raise AssertionError(f"import cycle among: {', '.join(sorted(cycle_members(remaining)))}")
        for module in ready:
            placed[module] = 1 + max((placed[d] for d in graph[module]), default=-1)
            del remaining[module]
    out: list[list[str]] = [[] for _ in range(max(placed.values()) + 1)]
    for module, level in placed.items():
        out[level].append(module)
    return [sorted(level) for level in out]


def cycle_members(graph: dict[str, set[str]]) -> set[str]:
    """The modules that lie on a cycle of ``graph`` (reachable from themselves)."""
    members = set()
    for start in graph:
        stack, seen = list(graph[start]), set()
        while stack:
            node = stack.pop()
            if node == start:
                members.add(start)
                break
            if node in seen or node not in graph:
                continue
            seen.add(node)
            stack.extend(graph[node])
    return members


def test_the_imports_have_no_cycle_and_fall_into_layers() -> None:
    graph = import_graph()
    assert len(graph) > 60 and "tablefree.train.trainer" in graph  # the whole package was read
    order = layers(graph)
    level = {module: i for i, modules in enumerate(order) for module in modules}
    # a few arrows that must point down, as docs/architecture.md draws them
    assert level["tablefree.checkpoint.layout"] < level["tablefree.checkpoint.model_dir"]
    assert level["tablefree.interfaces.options"] < level["tablefree.model_config"] < level["tablefree.model"]
    assert (
        level["tablefree.checkpoint.training"] < level["tablefree.train.trainer"] < level["tablefree.compare"]
    )


def test_function_level_imports_count(tmp_path: Path) -> None:
    """An import inside a function is an arrow too: a cycle through one is found."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}
    try:
        layers(graph)
    except AssertionError as error:
        assert "a, b, c" in str(error) and "d" not in str(error).split(":")[1]
    else:
        raise AssertionError("a cycle was not found")
    source = "def f():\n    from tablefree.train import trainer\n"
    path = tmp_path / "probe.py"
    path.write_text(source)
    assert imported("tablefree.probe", path, {"tablefree.train", "tablefree.train.trainer"}) == {
        "tablefree.train.trainer"
    }


def test_checkpoint_readers_never_import_the_trainer() -> None:
    graph = import_graph()
    readers = [
        m
        for m in graph
        if m.startswith(
            (
                "tablefree.evaluate",
                "tablefree.report",
                "tablefree.analysis",
                "tablefree.checkpoint",
                "tablefree.export",
            )
        )
        or m == "tablefree.generate"
    ]
    reaching = {m: sorted(d for d in graph[m] if d.startswith("tablefree.train")) for m in readers}
    assert not {m: d for m, d in reaching.items() if d}, reaching
