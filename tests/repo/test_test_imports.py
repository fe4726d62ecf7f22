"""The tests' own structure (issue 47): no file under tests/ imports a test module (test_*.py),
its own included, nor does the code it hands a child process. What tests share lives in
tests/helpers.py, tests/cli_contract.py, the support.py beside the tests that use it, or a
conftest.py fixture (docs/testing.md); pytest collects none of them as tests."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def module_name(path: str) -> str:
    """``tests/a/test_b.py`` -> ``tests.a.test_b`` (a package: its folder's name)."""
    return ".".join(Path(path).with_suffix("").parts).removesuffix(".__init__")


def is_test_module(name: str) -> bool:
    return name.rsplit(".", 1)[-1].startswith("test_")


def imported(tree: ast.AST, name: str, package: bool) -> list[tuple[int, str]]:
    """(line, module) of every import in ``tree`` (of module ``name``), relative ones resolved;
    ``from pkg import x`` counts as pkg and pkg.x (x may be a module)."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = name.split(".")[: None if package else -1]
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join([*parts, base] if base else parts)
            out += [(node.lineno, base)] + [(node.lineno, f"{base}.{a.name}") for a in node.names]
    return out


def child_code(tree: ast.AST) -> list[tuple[int, ast.AST]]:
    """(first line, parsed code) of the Python code in every string: what a test hands to
    ``python -c`` or writes for a child process (an f-string's fields read as names; a
    template that does not parse whole, line by line)."""
    found: list[tuple[int, ast.AST]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
        elif isinstance(node, ast.JoinedStr):
            text = "".join(
                str(v.value) if isinstance(v, ast.Constant) else "_" for v in node.values
            )
        else:
            continue
        if "import" not in text:
            continue
        try:
            found.append((node.lineno, ast.parse(text)))
        except (SyntaxError, ValueError):
            for i, line in enumerate(text.splitlines()):
                try:
                    found.append((node.lineno + i, ast.parse(line.strip())))
                except (SyntaxError, ValueError):
                    continue
    return found


def imports_of_test_modules(sources: dict[str, str]) -> list[str]:
    """``path:line: module`` for each import of a test module in ``sources`` (path relative to
    the repository -> its text); empty when there is none."""
    found = []
    for path, text in sorted(sources.items()):
        name = module_name(path)
        package = path.endswith("__init__.py")
        tree = ast.parse(text, path)
        for start, t in [(1, tree), *child_code(tree)]:
            for line, mod in imported(t, name, package):
                if mod.startswith("tests.") and is_test_module(mod):
                    found.append(f"{path}:{start + line - 1}: {mod}")
    return sorted(set(found))


def test_no_test_module_is_imported():
    here = Path(__file__).resolve()  # its planted cases below are code that imports test modules
    sources = {
        str(p.relative_to(ROOT)): p.read_text()
        for p in sorted((ROOT / "tests").rglob("*.py"))
        if p.resolve() != here
    }
    assert imports_of_test_modules(sources) == []


TEMPLATE = "C = '''\nsys.path.insert(0, {repo!r})\nfrom tests.a.test_x import f\n'''\n"


@pytest.mark.parametrize(
    ("path", "text", "flagged"),
    [
        pytest.param("tests/a/test_x.py", "from tests.a.test_y import f\n", True, id="from"),
        pytest.param("tests/a/test_x.py", "import tests.a.test_y\n", True, id="import"),
        pytest.param("tests/a/test_x.py", "from tests.a import test_y\n", True, id="from-pkg"),
        pytest.param("tests/a/test_x.py", "from .test_y import f\n", True, id="relative"),
        pytest.param("tests/a/test_x.py", "from . import test_y\n", True, id="relative-pkg"),
        pytest.param("tests/a/b/test_x.py", "from ..test_y import f\n", True, id="relative-up"),
        pytest.param(
            "tests/a/test_x.py",
            "def t():\n    from tests.a.test_x import f\n",
            True,
            id="itself-in-a-function",
        ),
        pytest.param("tests/a/support.py", "from tests.b.test_y import f\n", True, id="support"),
        pytest.param("tests/conftest.py", "from tests.a.test_y import f\n", True, id="conftest"),
        pytest.param(
            "tests/a/test_x.py",
            "CODE = 'import sys\\nfrom tests.a.test_y import f'\n",
            True,
            id="child-code",
        ),
        pytest.param(
            "tests/a/test_x.py",
            "c = f'from tests.a.test_x import h; h({w!r})'\n",
            True,
            id="child-f-string",
        ),
        pytest.param("tests/a/test_x.py", TEMPLATE, True, id="child-template"),
        pytest.param(
            "tests/a/test_x.py", "from tests.a.support import f\n", False, id="ok-support"
        ),
        pytest.param("tests/a/test_x.py", "from tests.helpers import h\n", False, id="ok-helpers"),
        pytest.param(
            "tests/a/test_x.py", "from tests.cli_contract import invoke\n", False, id="ok-contract"
        ),
        pytest.param("tests/a/test_x.py", "from .support import f\n", False, id="ok-relative"),
        pytest.param(
            "tests/a/test_x.py", "from tasks.reproduce import runs\n", False, id="ok-project"
        ),
        pytest.param(
            "tests/a/test_x.py",
            "'''see tests/a/test_y.py: from there import it'''\n",
            False,
            id="ok-prose",
        ),
    ],
)
def test_the_check_sees_every_way_of_importing_a_test_module(path, text, flagged):
    assert bool(imports_of_test_modules({path: text})) is flagged
