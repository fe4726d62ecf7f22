"""Nothing stray in git: weights live in DVC's cache and S3, never in a commit, and no tracked
file is large outside the paths allowed to be (figures, the vendored plot renderer)."""

from __future__ import annotations

import fnmatch
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TENSORS = ("*.pt", "*.pth", "*.safetensors", "*.ckpt", "*.npy", "*.npz", "*.pkl", "*.onnx")
LARGE = 1_000_000  # bytes
ALLOWED_LARGE = ("vendor/*", "*.png", "*.svg")


def stray(files: list[tuple[str, int]]) -> list[str]:
    """Why each tracked (path, size) is out of place; empty when none is."""
    out = []
    for path, size in files:
        name = path.rsplit("/", 1)[-1]
        if any(fnmatch.fnmatch(name, p) for p in TENSORS):
            out.append(f"{path}: a tensor file (weights belong in DVC's cache and S3)")
        elif size > LARGE and not any(fnmatch.fnmatch(path, p) for p in ALLOWED_LARGE):
            out.append(f"{path}: {size:,} bytes, over {LARGE:,} outside {ALLOWED_LARGE}")
    return out


def tracked() -> list[tuple[str, int]]:
    names = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True
    ).stdout.split(b"\0")
    paths = [n.decode() for n in names if n]
    return [(p, (REPO / p).stat().st_size) for p in paths if (REPO / p).is_file()]


def test_no_tracked_file_is_weights_or_large():
    assert stray(tracked()) == []


@pytest.mark.parametrize(
    ("path", "size", "flagged"),
    [
        ("artifacts/runs/fedavg-full/model.pt", 10, True),
        ("checkpoints/x.safetensors", 10, True),
        ("a/b.npz", 10, True),
        ("data/big.csv", 2_000_000, True),
        ("vendor/vega/dvc-plots.html", 2_000_000, False),
        ("docs/results/codecs-pareto.png", 2_000_000, False),
        ("tasks/results/report.py", 50_000, False),
    ],
)
def test_the_hygiene_check_flags_weights_and_large_files(path, size, flagged):
    assert bool(stray([(path, size)])) is flagged


MAX_LINES = 400  # a source file a reader takes in whole; the tests may run longer


def too_long(files: dict[str, str]) -> list[str]:
    """The Python source files (outside tests/) over MAX_LINES lines, with their length."""
    return [
        f"{path}: {text.count(chr(10))} lines"
        for path, text in files.items()
        if path.endswith(".py") and not path.startswith("tests/") and text.count("\n") > MAX_LINES
    ]


def test_no_source_file_is_over_400_lines():
    files = {p: (REPO / p).read_text() for p, _ in tracked() if p.endswith(".py")}
    assert too_long(files) == []
    assert too_long({"fedcore/x.py": "x\n" * 401, "tests/t.py": "x\n" * 900}) == [
        "fedcore/x.py: 401 lines"
    ]
