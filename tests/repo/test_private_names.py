"""No module imports another module's private name (issue 47): a name starting with ``_``
is its module's own; what others need is public (and documented as such)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROJECT = ("fedcore", "models", "tasks", "flows", "tests", "benchmarks", "scripts")


def private_imports(root: Path, paths: list[Path]) -> list[str]:
    found = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ImportFrom) or not node.module or node.level:
                continue
            if node.module.split(".")[0] not in PROJECT:
                continue
            found += [
                f"{path.relative_to(root)}: from {node.module} import {a.name}"
                for a in node.names
                if a.name.startswith("_") and not a.name.startswith("__")
            ]
    return found


def test_no_private_name_is_imported_across_modules():
    paths = [p for top in PROJECT for p in sorted((REPO / top).rglob("*.py"))]
    assert private_imports(REPO, paths) == []


def test_the_check_finds_one(tmp_path):
    (tmp_path / "m.py").write_text("from fedcore.cohort.util import _hidden, shown\n")
    assert private_imports(tmp_path, [tmp_path / "m.py"]) == [
        "m.py: from fedcore.cohort.util import _hidden"
    ]
