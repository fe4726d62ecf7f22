"""Mutation testing of fedapt's core maths: plant one small bug at a time, run the tests that
cover the module, and count the bugs no test noticed (``make mutate``; docs/testing.md).

Every mutant is applied in a temporary copy of the repository (the checkout is never
touched). Operators, found with ``ast``: arithmetic (+ -, * /, // /, ** *, % //), comparisons
(< <=, > >=, == !=, in / not in, is / is not), and/or, ``not x`` -> ``x``, ``-x`` -> ``x``,
numeric constants (n -> n + 1, 0.0 -> 1.0, 1.0 -> 0.5), True/False, augmented assignments
(+= -=, ...), ``return x`` -> ``return None``. Strings, docstrings, annotations and code
under ``raise`` (error messages) are left alone.

A mutant is killed when its tests fail (or error, or run past ``--timeout``: reported
apart), survived when they pass. Tests run in a forked child of a process that has already
imported torch, so a mutant costs its tests' time, not an interpreter start.

    .venv/bin/python scripts/mutate.py                   # every module, every mutant
    .venv/bin/python scripts/mutate.py --sample 60       # 60 mutants drawn with --seed
    .venv/bin/python scripts/mutate.py --module fedcore/schedules.py --list
"""

from __future__ import annotations

import argparse
import ast
import copy
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# module -> the default-suite test files that cover it (the fastest, most direct first).
TARGETS: dict[str, list[str]] = {
    "fedcore/aggregate.py": ["test_pinned_core", "test_algorithms", "test_engine"],
    "fedcore/algorithms/__init__.py": ["test_algorithms_registry", "test_engine"],
    "fedcore/algorithms/base.py": ["test_pinned_core", "test_engine", "test_algorithms"],
    "fedcore/algorithms/fedir.py": ["test_algorithms_data"],
    "fedcore/algorithms/fednilo.py": ["test_pinned_core", "test_algorithms_fednilo"],
    "fedcore/algorithms/fednova.py": ["test_pinned_core", "test_algorithms"],
    "fedcore/algorithms/fedopt.py": ["test_algorithms"],
    "fedcore/algorithms/fedprox.py": ["test_algorithms"],
    "fedcore/algorithms/fedvc.py": ["test_algorithms_data"],
    "fedcore/partition/core.py": ["test_pinned_edges", "test_partition", "test_pinned_core"],
    "fedcore/partition/registry.py": ["test_pinned_edges", "test_partition", "test_pinned_core"],
    "fedcore/partition/schemes.py": ["test_pinned_edges", "test_partition", "test_pinned_core"],
    "fedcore/manifest.py": ["test_partition", "test_validate"],
    "fedcore/payload.py": ["test_engine", "test_pinned_core", "test_algorithms_fednilo"],
    "fedcore/schedules.py": ["test_pinned_core", "test_engine", "test_config"],
    "models/adapters/residual.py": ["test_pinned_edges", "test_adapters"],
}

_BINOP = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.Div,
    ast.Div: ast.Mult,
    ast.FloorDiv: ast.Div,
    ast.Pow: ast.Mult,
    ast.Mod: ast.FloorDiv,
}
_CMP = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
}
_SYMBOL = {
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.Div: "/",
    ast.FloorDiv: "//",
    ast.Pow: "**",
    ast.Mod: "%",
    ast.Lt: "<",
    ast.LtE: "<=",
    ast.Gt: ">",
    ast.GtE: ">=",
    ast.Eq: "==",
    ast.NotEq: "!=",
    ast.In: "in",
    ast.NotIn: "not in",
    ast.Is: "is",
    ast.IsNot: "is not",
    ast.And: "and",
    ast.Or: "or",
}


@dataclass
class Mutant:
    path: str  # relative to the repository
    index: int  # the index-th mutation site of the file (in ast.walk order)
    line: int
    what: str
    status: str = "pending"  # killed | survived | timeout
    seconds: float = 0.0


def _skipped(tree: ast.AST) -> set[int]:
    """ids of nodes never mutated: docstrings, annotations, code under raise, __all__."""
    out: set[int] = set()

    def drop(node: ast.AST | None) -> None:
        if node is not None:
            out.update(id(n) for n in ast.walk(node))

    for node in ast.walk(tree):
        if isinstance(node, ast.Raise | ast.JoinedStr | ast.Assert):
            drop(node)
        elif isinstance(node, ast.AnnAssign):
            drop(node.annotation)
        elif isinstance(node, ast.arg):
            drop(node.annotation)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            drop(node.returns)
        elif isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            drop(node)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                drop(body[0])
    return out


def _sites(tree: ast.AST) -> list[tuple[ast.AST, str, object]]:
    """(node, description, how) for every mutation site, in a deterministic order."""
    skip = _skipped(tree)
    sites: list[tuple[ast.AST, str, object]] = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.BinOp | ast.AugAssign) and type(node.op) in _BINOP:
            new = _BINOP[type(node.op)]
            sites.append((node, f"{_SYMBOL[type(node.op)]} -> {_SYMBOL[new]}", ("op", new)))
        elif isinstance(node, ast.Compare):
            for i, op in enumerate(node.ops):
                new = _CMP[type(op)]
                sites.append((node, f"{_SYMBOL[type(op)]} -> {_SYMBOL[new]}", ("cmp", i, new)))
        elif isinstance(node, ast.BoolOp):
            new = ast.Or if isinstance(node.op, ast.And) else ast.And
            sites.append((node, f"{_SYMBOL[type(node.op)]} -> {_SYMBOL[new]}", ("op", new)))
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not | ast.USub):
            sites.append(
                (node, f"drop unary {'not' if isinstance(node.op, ast.Not) else '-'}", ("unary",))
            )
        elif isinstance(node, ast.Constant) and type(node.value) in (int, float, bool):
            v = node.value
            if isinstance(v, bool):
                new_v: object = not v
            elif isinstance(v, int):
                new_v = v + 1
            else:
                new_v = 1.0 if v == 0.0 else (0.5 if v == 1.0 else v * 2)
            sites.append((node, f"{v!r} -> {new_v!r}", ("const", new_v)))
        elif isinstance(node, ast.Return) and node.value is not None:
            if not (isinstance(node.value, ast.Constant) and node.value.value is None):
                sites.append((node, "return x -> return None", ("return",)))
    return sites


class _Apply(ast.NodeTransformer):
    def __init__(self, target: ast.AST, how: tuple) -> None:
        self.target, self.how = target, how

    def generic_visit(self, node: ast.AST) -> ast.AST:
        node = super().generic_visit(node)
        if node is not self.target:
            return node
        kind = self.how[0]
        if kind == "op":
            node.op = self.how[1]()  # type: ignore[attr-defined]
        elif kind == "cmp":
            node.ops[self.how[1]] = self.how[2]()  # type: ignore[attr-defined]
        elif kind == "unary":
            return node.operand  # type: ignore[attr-defined]
        elif kind == "const":
            node.value = self.how[1]  # type: ignore[attr-defined]
        elif kind == "return":
            node.value = None  # type: ignore[attr-defined]
        return node


def enumerate_mutants(rel: str) -> list[Mutant]:
    tree = ast.parse((REPO / rel).read_text())
    return [
        Mutant(rel, i, getattr(node, "lineno", 0), what)
        for i, (node, what, _) in enumerate(_sites(tree))
    ]


def mutated_source(rel: str, index: int) -> str:
    tree = ast.parse((REPO / rel).read_text())
    node, _, how = _sites(tree)[index]
    new = _Apply(node, how).visit(copy.copy(tree))
    return ast.unparse(ast.fix_missing_locations(new)) + "\n"


def make_copy(dst: Path) -> None:
    """Tracked and untracked-but-not-ignored files of the checkout, data/ by symlink."""
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    for rel in files:
        src = REPO / rel
        if src.is_file():
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / rel)
    if (REPO / "data").exists():
        (dst / "data").symlink_to(REPO / "data")


def run_tests(root: Path, tests: list[str], timeout: float) -> tuple[str, float]:
    """Run pytest in a forked child (own process group); 'passed', 'failed' or 'timeout'."""
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # child: import the copy's code fresh and run the tests
        os.setpgid(0, 0)
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            os.chdir(root)
            sys.path.insert(0, str(root))
            import pytest

            args = ["-x", "-q", "-p", "no:cacheprovider", "-p", "no:randomly"]
            rc = pytest.main([*args, *[f"tests/{t}.py" for t in tests]])
        except BaseException:
            rc = 3
        os._exit(int(rc))
    deadline = start + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            rc = os.waitstatus_to_exitcode(status)
            return ("passed" if rc == 0 else "failed"), time.perf_counter() - start
        if time.perf_counter() > deadline:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.waitpid(pid, 0)
            return "timeout", time.perf_counter() - start
        time.sleep(0.05)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--module", action="append", help="only these modules (repeatable)")
    ap.add_argument("--sample", type=int, help="run this many mutants, drawn with --seed")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, help="seconds per mutant (default 3x baseline+10)")
    ap.add_argument("--list", action="store_true", help="list the mutants and stop")
    ap.add_argument("--json", type=Path, help="write every mutant's outcome here")
    args = ap.parse_args(argv)

    modules = args.module or list(TARGETS)
    unknown = [m for m in modules if m not in TARGETS]
    if unknown:
        ap.error(f"not a mutation target: {unknown[0]} (targets: {', '.join(TARGETS)})")
    mutants = [m for rel in modules for m in enumerate_mutants(rel)]
    total_sites = len(mutants)
    if args.sample is not None and args.sample < len(mutants):
        mutants = sorted(
            random.Random(args.seed).sample(mutants, args.sample),
            key=lambda m: (modules.index(m.path), m.index),
        )
    if args.list:
        for m in mutants:
            print(f"{m.path}:{m.line}: {m.what}")
        print(f"{len(mutants)} of {total_sites} mutants")
        return 0

    import torch  # noqa: F401  (imported once here, shared by every forked test run)

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fedapt-mutate-") as tmp:
        root = Path(tmp)
        make_copy(root)
        baseline: dict[str, float] = {}
        for rel in dict.fromkeys(m.path for m in mutants):
            result, secs = run_tests(root, TARGETS[rel], timeout=1800)
            if result != "passed":
                print(f"tests for {rel} fail without any mutant: fix them first", file=sys.stderr)
                return 2
            baseline[rel] = secs
            print(f"baseline {rel}: {', '.join(TARGETS[rel])} pass in {secs:.1f} s", flush=True)
        for n, m in enumerate(mutants, start=1):
            target = root / m.path
            original = target.read_text()
            target.write_text(mutated_source(m.path, m.index))
            try:
                timeout = args.timeout or 3 * baseline[m.path] + 10
                result, m.seconds = run_tests(root, TARGETS[m.path], timeout)
            finally:
                target.write_text(original)
            m.status = {"failed": "killed", "passed": "survived"}.get(result, result)
            mark = "SURVIVED " if m.status == "survived" else ""
            print(
                f"[{n}/{len(mutants)}] {m.status:8s} {m.path}:{m.line}: {m.what} "
                f"({m.seconds:.1f} s) {mark}",
                flush=True,
            )
    wall = time.perf_counter() - started
    killed = sum(m.status == "killed" for m in mutants)
    timeouts = sum(m.status == "timeout" for m in mutants)
    survived = [m for m in mutants if m.status == "survived"]
    print("\nsurvivors:")
    for m in survived:
        print(f"  {m.path}:{m.line}: {m.what}")
    rate = (killed + timeouts) / len(mutants) if mutants else 1.0
    print(
        f"\n{len(mutants)} mutants (of {total_sites} sites): {killed} killed, "
        f"{timeouts} timed out, {len(survived)} survived; kill rate {rate:.1%} "
        f"(timeouts count as killed); {wall / 60:.1f} min"
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "total_sites": total_sites,
                    "run": len(mutants),
                    "killed": killed,
                    "timeouts": timeouts,
                    "survived": len(survived),
                    "kill_rate": rate,
                    "wall_seconds": round(wall, 1),
                    "mutants": [asdict(m) for m in mutants],
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
