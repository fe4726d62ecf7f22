"""What the repository checks share: the project's modules and their import graph (layers,
DVC stage deps), and a temporary copy of the repository that `dvc repro` runs in (the
``repo_copy`` fixture of tests/conftest.py)."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ("fedcore", "models", "tasks", "flows")  # each may import those before it


def modules() -> dict[str, Path]:
    out = {}
    for pkg in LAYERS:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = path
    return out


def type_checking_only(tree: ast.AST) -> set[int]:
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
        skip = type_checking_only(tree)
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


GRAPH = imports(modules())


# ---- a copy of the repository for `dvc repro` -----------------------------------------------

DVC = str(Path(sys.executable).parent / "dvc")
# Stages call `fedapt` from the environment, as in an activated venv.
PATH = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"


def sh(*cmd: str, cwd: Path) -> str:
    env = {**os.environ, "DVC_NO_ANALYTICS": "1", "DO_NOT_TRACK": "true", "PATH": PATH}
    res = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout + res.stderr


def copy_data(dst: Path) -> None:
    """The dataset the pipeline reads (``data/``, set up by ``make setup``): its absence is a
    failure that says how to fix it, not a copy error deep in shutil."""
    raw = ROOT / "data" / "raw"
    assert raw.is_dir() and any(raw.iterdir()), (
        f"{raw} is missing or empty: run `make setup` (scripts/get-data.sh) first"
    )
    shutil.copytree(ROOT / "data", dst / "data")


def copy_repo(tmp_path: Path) -> Path:
    """The tracked files (the committed outputs left out), the data and a tiny params.yaml in
    ``tmp_path/repo``, a git repository of its own: what `dvc repro` runs in."""
    dst = tmp_path / "repo"
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout
    for rel in files.split():
        if rel.startswith("artifacts/"):  # the committed outputs: rebuilt here, not copied
            continue
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, dst / rel)
    copy_data(dst)
    (dst / ".venv").symlink_to(ROOT / ".venv")
    params = yaml.safe_load((dst / "params.yaml").read_text())
    params["data"].update(train_subset=600, test_subset=300)
    params["federation"].update(rounds=2, last_rounds=2)
    params["runtime"].update(workers=0, tracking=False)
    (dst / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    sh("git", "init", "-q", cwd=dst)
    return dst
