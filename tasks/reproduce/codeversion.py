"""The code version of a record: a hash of the source that can change its numbers.

The number code is the source under fedcore/, models/ and tasks/, less what only writes,
tracks, reports or validates params (``NOT_NUMBERS``). A record's code version hashes the part
of it the record's run can execute: the modules the drivers (flows/ and the non-number tasks)
import, and everything those import in turn, in function bodies too, with the plug-ins the
record does not use (algorithms, adapter methods) left out, their classes and the imports of
them with them. So a module nothing imports yet (a mechanism being built), a new plug-in and a
changed one the record does not run leave its code version as it was; any other change to
code it can run changes it. Comments, docstrings and layout never count; the pins of the
numeric libraries in constraints.txt always do.

Records stamped by the former rule (every number-code file, ``all_files_version``) are carried
over by ``records.migrate`` when that rule still gives their code version on this checkout:
then the code that computed them is this code, file for file.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

RULE = "imports"  # the rule a record's ``code`` was computed by (``code_rule``)
ROOT = Path(__file__).resolve().parents[2]

# The source whose changes can change a number: the core, the models and the tasks that
# load data, partition, pretrain and train; not what only writes, tracks or reports, and not
# the config layer: what it validates params to is the record's key (``runs.config_key``), so
# a changed default or check shows there, not in the code version.
CODE = ("fedcore", "models", "tasks")
NOT_NUMBERS = (
    "tasks/config/",
    "tasks/reproduce/",
    "tasks/results/",
    "tasks/tracking/",
    "tasks/training/modelfile.py",
    "tasks/data/validate.py",
)
PINS = ("numpy==", "peft==", "timm==", "torch==", "torchvision==", "transformers==")
# Packages of plug-ins: a top-level class there with a ``name = "..."`` attribute is the
# plug-in of that registry name (an algorithm, an adapter method); its kind is the key.
PLUGINS = {"algorithm": "fedcore/algorithms/", "adapter": "models/adapters/"}


def code_files(root: Path = ROOT) -> dict[str, bytes]:
    """The number-computing source files (path relative to ``root`` -> bytes)."""
    files = sorted(
        p
        for top in CODE
        for p in (root / top).rglob("*.py")
        if not p.relative_to(root).as_posix().startswith(NOT_NUMBERS)
    )
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in files}


def pins(root: Path = ROOT) -> str:
    path = root / "constraints.txt"
    if not path.is_file():
        return ""
    return "\n".join(x for x in path.read_text().splitlines() if x.startswith(PINS))


def uses(flat: Mapping[str, Any]) -> frozenset[str]:
    """The plug-ins a run's flat params use: ``algorithm:<name>``, ``adapter:<name>``."""
    out = set()
    for kind, key in (("algorithm", "grid.algorithms"), ("adapter", "grid.adapters")):
        names = flat.get(key) or ()
        out |= {f"{kind}:{n}" for n in ([names] if isinstance(names, str) else names)}
    return frozenset(out)


def all_files_version(
    root: Path = ROOT,
    used: frozenset[str] | None = None,
    sources: Mapping[str, bytes] | None = None,
) -> str:
    """The former rule, kept to carry the records it stamped over (``records.migrate``): 12
    hex digits of a hash over the syntax trees of all the number-computing source files (comments, docstrings and layout left out) and the pins of
    the numeric libraries in constraints.txt. With ``used`` (see :func:`uses`), the plug-ins
    the record does not use are left out (their classes and every reference to them in
    imports and literal lists, tuples, sets and dicts; a file left with nothing else is
    skipped), so adding or changing an algorithm or adapter method that a record does not run
    leaves it current; the classes a used plug-in derives from stay in. ``used`` None: every
    plug-in counts (the whole code's version)."""
    files = dict(sources) if sources is not None else code_files(root)
    trees = {path: _parsed(path, text) for path, text in files.items()}
    drop = _unused_plugins(trees, used) if used is not None else frozenset()
    h = hashlib.sha256()
    for path in sorted(trees):
        dumped = _dump(path, files[path], drop & _names(path, files[path]))
        if dumped is None:
            continue
        h.update(path.encode() + b"\0" + dumped.encode() + b"\0")
    h.update(pins(root).encode())
    return h.hexdigest()[:12]


@functools.lru_cache(maxsize=4096)
def _parsed(path: str, text: bytes) -> Any:
    import ast

    return ast.parse(text, filename=path)


@functools.lru_cache(maxsize=4096)
def _names(path: str, text: bytes) -> frozenset[str]:
    """Every name a file defines, imports or refers to (what dropping a plug-in can touch)."""
    import ast

    out = set()
    for node in ast.walk(_parsed(path, text)):
        if isinstance(node, ast.Name):
            out.add(node.id)
        elif isinstance(node, ast.ClassDef):
            out.add(node.name)
        elif isinstance(node, ast.alias):
            out.add(node.name)
    return frozenset(out)


@functools.lru_cache(maxsize=8192)
def _dump(path: str, text: bytes, drop: frozenset[str]) -> str | None:
    import ast

    tree = _reduced(_parsed(path, text), set(drop))
    return None if tree is None else ast.dump(tree)


def _plugin_classes(trees: Mapping[str, Any]) -> dict[str, tuple[str, list[str]]]:
    """Class name -> (its registry key ``kind:name`` or "", its base names), for the classes
    of the plug-in packages."""
    import ast

    out: dict[str, tuple[str, list[str]]] = {}
    for path, tree in trees.items():
        kind = next((k for k, pre in PLUGINS.items() if path.startswith(pre)), None)
        if kind is None:
            continue
        for node in tree.body:
            if not isinstance(node, ast.ClassDef):
                continue
            key = ""
            for stmt in node.body:
                target = value = None
                if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                    target, value = stmt.targets[0], stmt.value
                elif isinstance(stmt, ast.AnnAssign):
                    target, value = stmt.target, stmt.value
                if (
                    isinstance(target, ast.Name)
                    and target.id == "name"
                    and isinstance(value, ast.Constant)
                    and isinstance(value.value, str)
                ):
                    key = f"{kind}:{value.value}"
            bases = [b.id for b in node.bases if isinstance(b, ast.Name)]
            out[node.name] = (key, bases)
    return out


def _unused_plugins(trees: Mapping[str, Any], used: frozenset[str]) -> frozenset[str]:
    """The class names of plug-ins ``used`` does not name nor derive from."""
    classes = _plugin_classes(trees)
    keep: set[str] = set()
    todo = [c for c, (key, _) in classes.items() if key in used]
    while todo:
        c = todo.pop()
        if c in keep or c not in classes:
            continue
        keep.add(c)
        todo += classes[c][1]
    return frozenset(c for c, (key, _) in classes.items() if key and c not in keep)


def _reduced(tree: Any, drop: set[str]) -> Any:
    """``tree`` without docstrings and without the classes in ``drop`` and the references to
    them in imports and literal containers; None when nothing but imports is left of a file
    that had a dropped class (a plug-in's own file)."""
    import ast
    import copy

    tree = copy.deepcopy(tree)
    had = False

    class Strip(ast.NodeTransformer):
        def generic_visit(self, node: Any) -> Any:
            super().generic_visit(node)
            body = getattr(node, "body", None)
            if (
                isinstance(body, list)
                and body
                and isinstance(
                    node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
                )
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                node.body = body[1:] or [ast.Pass()]
            return node

        def visit_ClassDef(self, node: Any) -> Any:
            nonlocal had
            if node.name in drop:
                had = True
                return None
            return self.generic_visit(node)

        def visit_ImportFrom(self, node: Any) -> Any:
            node.names = [a for a in node.names if a.name not in drop]
            return node if node.names else None

        def _elts(self, node: Any) -> Any:
            self.generic_visit(node)
            node.elts = [e for e in node.elts if not (isinstance(e, ast.Name) and e.id in drop)]
            return node

        visit_Tuple = visit_List = visit_Set = _elts

        def visit_Dict(self, node: Any) -> Any:
            self.generic_visit(node)
            pairs = [
                (k, v)
                for k, v in zip(node.keys, node.values, strict=True)
                if not (isinstance(v, ast.Name) and v.id in drop)
            ]
            node.keys = [k for k, _ in pairs]
            node.values = [v for _, v in pairs]
            return node

    tree = Strip().visit(tree)
    if had and all(isinstance(n, (ast.Import, ast.ImportFrom, ast.Pass)) for n in tree.body):
        return None
    return tree


# The first-party packages that drive a run without computing its numbers (besides the
# ``NOT_NUMBERS`` files of tasks/): the number code they import is where a run's code starts.
DRIVERS = ("flows",)


def driver_files(root: Path = ROOT) -> dict[str, bytes]:
    """The driver source files (path relative to ``root`` -> bytes)."""
    files = sorted(
        {p for top in DRIVERS for p in (root / top).rglob("*.py")}
        | {
            p
            for p in (root / "tasks").rglob("*.py")
            if p.relative_to(root).as_posix().startswith(NOT_NUMBERS)
        }
    )
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in files}


def code_version(
    root: Path = ROOT,
    used: frozenset[str] | None = None,
    sources: Mapping[str, bytes] | None = None,
    drivers: Mapping[str, bytes] | None = None,
) -> str:
    """12 hex digits of a hash over the number code a record's run can execute (see the module
    docstring) and the pins of the numeric libraries. ``used`` (see :func:`uses`): the plug-ins
    the record runs; None: every plug-in counts (the whole code's version). ``sources`` and
    ``drivers`` default to the files under ``root``."""
    files = dict(sources) if sources is not None else code_files(root)
    driving = dict(drivers) if drivers is not None else driver_files(root)
    trees = {path: _parsed(path, text) for path, text in files.items()}
    drop = _unused_plugins(trees, used) if used is not None else frozenset()
    h = hashlib.sha256(RULE.encode() + b"\0")
    for path in sorted(reachable(files, driving, drop)):
        dumped = _dump(path, files[path], drop & _names(path, files[path]))
        if dumped is not None:
            h.update(path.encode() + b"\0" + dumped.encode() + b"\0")
    h.update(pins(root).encode())
    return h.hexdigest()[:12]


def reachable(
    files: Mapping[str, bytes], drivers: Mapping[str, bytes], drop: frozenset[str] = frozenset()
) -> set[str]:
    """The files of ``files`` that ``drivers`` import, directly or through each other (a
    package's ``__init__`` with each of its modules), with the classes in ``drop`` and the
    imports of them left out."""
    modules = {_module(path): path for path in files}

    def targets(name: str) -> list[str]:
        parts = name.split(".")
        found = (modules.get(".".join(parts[:i])) for i in range(1, len(parts) + 1))
        return [p for p in found if p is not None]

    todo = [t for path, text in drivers.items() for n in _imports(path, text) for t in targets(n)]
    seen: set[str] = set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        text = files[path]
        todo += [t for n in _imports(path, text, drop & _names(path, text)) for t in targets(n)]
    return seen


def _module(path: str) -> str:
    """``a/b/c.py`` -> ``a.b.c``; ``a/b/__init__.py`` -> ``a.b``."""
    dotted = path.removesuffix(".py").replace("/", ".")
    return dotted.removesuffix(".__init__")


@functools.lru_cache(maxsize=8192)
def _imports(path: str, text: bytes, drop: frozenset[str] = frozenset()) -> frozenset[str]:
    """The absolute module names a file imports anywhere in it (``from a import b`` gives
    ``a`` and ``a.b``: b may be a module), once ``drop``'s classes and their imports are out."""
    import ast

    tree = _reduced(_parsed(path, text), set(drop))
    if tree is None:
        return frozenset()
    package = _module(path) if path.endswith("__init__.py") else _module(path).rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            out.add(base)
            out |= {f"{base}.{a.name}" for a in node.names}
    return frozenset(out)
