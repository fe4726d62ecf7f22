"""Style gates run with the suite: ruff (lint + format) always, mypy on the core as slow."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def run(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)


def test_ruff_clean():
    ruff = shutil.which("ruff", path=str(BIN)) or "ruff"
    lint = run(ruff, "check", "--no-cache", ".")
    assert lint.returncode == 0, lint.stdout
    fmt = run(ruff, "format", "--no-cache", "--check", ".")
    assert fmt.returncode == 0, fmt.stdout


@pytest.mark.slow
def test_mypy_core():
    res = run(sys.executable, "-m", "mypy")
    assert res.returncode == 0, res.stdout
