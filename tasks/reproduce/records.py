"""The committed records of a reproduction: one small JSON file per finished experiment under
``reproduce/<profile>/records/`` (its configuration, the code and numerics that computed it,
and per seed every cell's summary record and round records: what the verdicts read, never a
model file). The report is assembled from these files alone, so a fresh clone holds the
profile's evidence, skips what they cover, and rebuilds the same report.

A record counts for an experiment when it was written for the same configuration (the flat
params that determine its numbers, ``runs.config_key``) by the same code version (a hash of
the source that computes numbers, ``code_version``) in the same numerics. A record of another
code version or numerics is *stale*: ``fedapt reproduce`` stops on it in one line unless told
``--rerun-stale``, since mixing numbers of two code versions in one report would be silent.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tasks.io import atomic_write_json
from tasks.reproduce.spec import Cell, ExperimentResult

RECORDS = "records"
ROOT = Path(__file__).resolve().parents[2]
# The source whose changes can change a number: the core, the models and the tasks that
# load data, partition, pretrain and train; not what only writes, tracks or reports, and not
# the config layer: what it validates params to is the record's key (``runs.config_key``), so
# a changed default or check shows there, not in the code version.
CODE = ("fedcore", "models", "tasks")
NOT_NUMBERS = (
    "tasks/config/",
    "tasks/reproduce/",
    "tasks/report.py",
    "tasks/figures.py",
    "tasks/progress.py",
    "tasks/tracking/",
    "tasks/storage.py",
    "tasks/origin.py",
    "tasks/artifacts.py",
    "tasks/modelfile.py",
    "tasks/yamlfile.py",
    "tasks/validate.py",
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


def code_version(
    root: Path = ROOT,
    used: frozenset[str] | None = None,
    sources: Mapping[str, bytes] | None = None,
) -> str:
    """12 hex digits of a hash over what computes a record's numbers: the syntax trees of the
    number-computing source files (comments, docstrings and layout left out) and the pins of
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


@functools.cache
def loaded_sources() -> tuple[tuple[str, bytes], ...]:
    """The number-computing source of this process, read once, at the first call (the start of
    a reproduce run), so source files changed on disk under a running reproduction (a pull, a
    merge) cannot stamp its records with code it did not run."""
    return tuple(sorted(code_files().items()))


@functools.cache
def loaded_code_version(used: frozenset[str] | None = None) -> str:
    """:func:`code_version` of the source this process loaded (:func:`loaded_sources`)."""
    return code_version(used=used, sources=dict(loaded_sources()))


def record_code(flat: Mapping[str, Any]) -> str:
    """The code version a record of these flat params is computed by (its plug-ins only)."""
    return loaded_code_version(uses(flat))


def _git(*args: str) -> str | None:
    import subprocess

    try:
        done = subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else the platform's word for it."""
    import platform

    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@functools.cache
def checkout() -> dict[str, Any]:
    """The commit of this checkout and whether its tree was clean, read once, at the first call
    (the start of a run): no tracked file changed and no untracked file, outside the
    reproduction's own outputs (``reproduce/``). Not a git checkout: commit None, clean False."""
    head = _git("rev-parse", "HEAD")
    if head is None:
        return {"commit": None, "clean": False, "changed": ["not a git checkout"]}
    lines = (_git("status", "--porcelain", "--untracked-files=normal") or "").splitlines()
    changed = [x[3:] for x in lines if not x[3:].startswith("reproduce/")]
    return {"commit": head.strip(), "clean": not changed, "changed": changed[:5]}


def computed_by(flat: Mapping[str, Any], numerics: str) -> dict[str, Any]:
    """Who computed a record: the commit, the record's code version, whether the tree was
    clean, the CPU model and the numerics mode."""
    where = checkout()
    return {
        "commit": where["commit"],
        "code": record_code(flat),
        "clean": where["clean"],
        "cpu": cpu_model(),
        "numerics": numerics,
    }


def record_path(records_dir: Path, name: str) -> Path:
    return records_dir / f"{name}.json"


def read_record(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text()) if path.is_file() else None
    except (OSError, ValueError):
        return None  # a record that does not parse is rewritten by the rerun


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _majority(directory: Path) -> float | None:
    """The most frequent class's share of the partitioned training rows."""
    try:
        totals = _json(directory / "partition" / "stats.json")["label_totals"]
        return max(totals) / sum(totals)
    except (TypeError, KeyError, ValueError, ZeroDivisionError):
        return None


def _base_accuracy(directory: Path, params: Mapping[str, Any] | None = None) -> float | None:
    """The pretrained base's test accuracy before any round, on the federation's test rows
    (its card), None without one. A base that learned only some classes (``pretrain.classes``)
    was tested on the federation's test rows of those classes: on all of them it scores that
    accuracy times their share (it never predicts a class it never learned: the rows of the
    others count as wrong). A base of another dataset has no accuracy on these rows: None."""
    card = _json(directory / "pretrain" / "base.json")
    value = card.get("final_test_accuracy") if isinstance(card, dict) and card.get("used") else None
    if not isinstance(value, (int, float)):
        return None
    source = card.get("source") or {}
    dataset = (params or {}).get("data.dataset")
    if dataset is not None and source.get("dataset") not in (None, dataset):
        return None
    classes = source.get("classes", "all")
    if not isinstance(classes, list):
        return float(value)
    rows, tested = source.get("test_rows"), (params or {}).get("data.test_subset")
    if isinstance(rows, int) and isinstance(tested, int) and tested > 0:
        return float(value) * rows / tested
    stats = _json(directory / "partition" / "stats.json")
    total = stats.get("num_classes") if isinstance(stats, dict) else None
    return float(value) * len(classes) / total if isinstance(total, int) and total else None


def collect(directory: Path, summary: Mapping[str, Any]) -> dict[str, Any]:
    """Per seed, each cell's summary record and round records, the class prior and the
    pretrained base's test accuracy, from a finished experiment folder (a seed sweep's
    ``seed-<s>/`` or a single seed's own)."""
    seeds: dict[str, Any] = {}
    for record in summary["runs"]:
        seed = int(record.get("seed", summary["params"].get("experiment.seed", 0)))
        where = directory / f"seed-{seed}" if "seeds" in summary else directory
        cell = f"{record['algorithm']}-{record['adapter']}"
        metrics = _json(where / "runs" / cell / "metrics.json") or {}
        entry = seeds.setdefault(
            str(seed),
            {
                "majority": _majority(where),
                "base_accuracy": _base_accuracy(where, summary["params"]),
                "cells": {},
            },
        )
        entry["cells"][cell] = {"record": record, "rounds": metrics.get("rounds", [])}
    return seeds


def write_record(
    path: Path,
    *,
    experiment: str,
    claim: str,
    config: Mapping[str, Any],
    params: Mapping[str, Any],
    numerics: str,
    overrides: list[str],
    seconds: float,
    resumed: bool,
    seeds: Mapping[str, Any],
    code: str,
    computed_by: Mapping[str, Any],
    rules: Mapping[str, str],
) -> Path:
    """The record, with who computed it and the rules its run started under."""
    return atomic_write_json(
        path,
        {
            "experiment": experiment,
            "claim": claim,
            "code": code,
            "computed_by": dict(computed_by),
            "rules": dict(rules),
            "numerics": numerics,
            "seconds": round(seconds, 1),
            "resumed": resumed,
            "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "overrides": overrides,
            "config": dict(config),
            "params": dict(params),
            "seeds": dict(seeds),
        },
    )


def result(record: Mapping[str, Any]) -> ExperimentResult:
    """The verdicts' view of a record."""
    runs, majorities, bases = {}, {}, {}
    for seed, entry in record["seeds"].items():
        runs[int(seed)] = {
            name: Cell(record=c["record"], rounds=c.get("rounds", []))
            for name, c in entry["cells"].items()
        }
        majorities[int(seed)] = entry.get("majority")
        bases[int(seed)] = entry.get("base_accuracy")
    return ExperimentResult(
        record["params"], runs, record.get("seconds"), majorities, bases, record.get("rules") or {}
    )
