"""The project's import structure: layers import downwards only, and nothing imports in a
cycle. fedcore (the engine) < models (backbones, adapter methods) < tasks (Prefect tasks and
the pieces they use) < flows (flows, CLI, deployments). Every import counts, at module level
or inside a function, except those under ``if TYPE_CHECKING:`` (annotations only)."""

from __future__ import annotations

import ast

import pytest

from tests.repo.support import GRAPH, LAYERS, modules, type_checking_only


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


def test_no_import_cycles():
    assert cycles(GRAPH) == []


def folders(graph: dict[str, set[str]], packages: set[str]) -> dict[str, set[str]]:
    """``graph`` with each sub-package collapsed to one node (``fedcore.engine``,
    ``tasks.config``, ...); a module at a layer's top stays a node of its own."""

    def node(m: str) -> str:
        parts = m.split(".")
        return next(
            (
                ".".join(parts[:k])
                for k in range(len(parts), 1, -1)
                if ".".join(parts[:k]) in packages
            ),
            m,
        )

    out: dict[str, set[str]] = {}
    for m, deps in graph.items():
        out.setdefault(node(m), set()).update(node(d) for d in deps if node(d) != node(m))
    for deps in list(out.values()):
        for d in deps:
            out.setdefault(d, set())
    return out


def test_no_import_cycles_between_folders():
    """A folder (a sub-package) and the modules around it import one way: no loop such as
    a module importing a package whose modules import it back."""
    packages = {m for m, p in modules().items() if p.name == "__init__.py"}
    assert cycles(folders(GRAPH, packages)) == []


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
    # a folder loop: p.a.x and p.a.y import nothing of each other, yet p.a <-> p.b
    loop = {"p.a.x": {"p.b"}, "p.a.y": set(), "p.b": {"p.a.y"}}
    assert cycles(loop) == [] and cycles(folders(loop, {"p", "p.a"})) == [["p.a", "p.b"]]
    src = tmp_path / "m.py"
    src.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import x.y\nimport x\n"
    )
    tree = ast.parse(src.read_text())
    assert len(type_checking_only(tree)) > 0
    assert "models.adapters.exits" not in GRAPH["fedcore.exits"]


# tasks/ by room, top to bottom (tasks/__init__.py says what each holds): a room imports
# only the rooms below it
TASKS_ROOMS = (
    "tasks.reproduce",
    "tasks.training",
    "tasks.data",
    "tasks.results",
    "tasks.tracking",
    "tasks.grid",
    "tasks.config",
    "tasks.io",
)


def room_of(module: str) -> str | None:
    return next((r for r in TASKS_ROOMS if module == r or module.startswith(r + ".")), None)


def upward_between_rooms(graph: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{m} -> {d}"
        for m, deps in graph.items()
        if room_of(m)
        for d in deps
        if room_of(d) and TASKS_ROOMS.index(room_of(d)) < TASKS_ROOMS.index(room_of(m))
    )


def test_tasks_is_cut_into_rooms_that_import_downwards():
    """Every module of tasks/ sits in a room, and rooms import only the rooms below."""
    assert [m for m in GRAPH if m.startswith("tasks.") and room_of(m) is None] == []
    assert upward_between_rooms(GRAPH) == []
    # the check itself: an upward import is found
    planted = {"tasks.results.origin": {"tasks.training.checkpoint"}}
    assert upward_between_rooms(planted) == ["tasks.results.origin -> tasks.training.checkpoint"]
