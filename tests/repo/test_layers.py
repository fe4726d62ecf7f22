"""The project's import structure: layers import downwards only, and nothing imports in a
cycle. fedcore (the engine) < models (backbones, adapter methods) < tasks (Prefect tasks and
the pieces they use) < flows (flows, CLI, deployments). Every import counts, at module level
or inside a function, except those under ``if TYPE_CHECKING:`` (annotations only)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ("fedcore", "models", "tasks", "flows")  # each may import those before it


def modules() -> dict[str, Path]:
    out = {}
    for pkg in LAYERS:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = path
    return out


def _type_checking_only(tree: ast.AST) -> set[int]:
    ids: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            ids.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return ids


def imports(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the project modules it imports (a package counts as its __init__)."""
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        tree = ast.parse(path.read_text(), str(path))
        skip = _type_checking_only(tree)
        deps: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    pkg = name.split(".")
                    if path.name != "__init__.py":
                        pkg = pkg[:-1]
                    pkg = pkg[: len(pkg) - (node.level - 1)]
                    base = ".".join([*pkg, base] if base else pkg)
                # `from pkg import mod` is an edge to pkg.mod; `from mod import name` to mod
                subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in mods]
                targets = subs or [base]
            else:
                continue
            # An edge goes to the module named, not to its parent packages (import-linter's
            # and pylint's convention): a package importing its submodules is no cycle.
            deps.update(targets)
        graph[name] = {d for d in deps if d in mods and d != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


GRAPH = imports(modules())


def test_no_import_cycles():
    assert cycles(GRAPH) == []


@pytest.mark.parametrize("layer", LAYERS)
def test_layers_import_downwards_only(layer):
    allowed = set(LAYERS[: LAYERS.index(layer) + 1])
    upward = sorted(
        f"{m} -> {d}"
        for m, deps in GRAPH.items()
        if m.split(".")[0] == layer
        for d in deps
        if d.split(".")[0] not in allowed
    )
    assert upward == []


def test_the_checker_sees_cycles_and_upward_imports(tmp_path):
    """The check itself: a planted cycle and a planted upward import are found."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    src = tmp_path / "m.py"
    src.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import x.y\nimport x\n"
    )
    tree = ast.parse(src.read_text())
    assert len(_type_checking_only(tree)) > 0
    assert "models.adapters.exits" not in GRAPH["fedcore.exits"]
