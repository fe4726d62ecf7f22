"""The files a run is given, bad ones (data.root, --partition, its manifest and stats, the
stages' output folders): one clear line before any work and nothing written; the partition a
run is given is never written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.cli_contract import LOCAL, REPO, SMALL, assert_one_clear_line, invoke


@pytest.fixture(scope="module")
def partition_dir(tmp_path_factory) -> Path:
    """A real partition of 1200 train rows (fedapt partition), copied by the cases below."""
    out = tmp_path_factory.mktemp("partition") / "p"
    res = invoke(out.parent, "partition", "--out", str(out))
    assert res.exit_code == 0, res.output
    return out


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _edit_manifest(d: Path, row: int, col: int, value: str) -> None:
    path = d / "manifest.csv"
    lines = path.read_text().splitlines()
    cells = lines[row - 1].split(",")
    cells[col] = value
    lines[row - 1] = ",".join(cells)
    path.write_text("\n".join(lines) + "\n")


def _file_case(name: str, tmp_path: Path, part: Path) -> tuple[list[str], Path | None, str]:
    """(args, data.root or None, needle) of one bad-file case."""
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder\n")
    if name == "root-missing":
        return [], tmp_path / "dta/raw", f"no FashionMNIST files under {tmp_path / 'dta/raw'}"
    if name == "root-is-file":
        return [], a_file, f"data.root: {a_file} is a file"
    if name == "root-corrupt":
        raw = tmp_path / "root/FashionMNIST/raw"
        raw.mkdir(parents=True)
        (raw / "train-images-idx3-ubyte").write_bytes(b"\x00garbage")
        return [], tmp_path / "root", f"{raw} are incomplete or corrupt"
    if name == "reports-under-file":
        reports = ["--set", f"experiment.reports_dir={a_file}/reports"]
        return reports, None, f"experiment.reports_dir: {a_file} is a file"
    if name == "partition-is-file":
        return ["--partition", str(a_file)], None, f"--partition {a_file} is a file, not a partition's folder"
    if name == "partition-out-is-file":
        return ["--out", str(a_file / "p")], None, f"--out: {a_file} is a file"
    d = _copy(part, tmp_path / "part")
    args = ["--partition", str(d)]
    if name == "partition-other-subset":
        return [*args, "--set", "data.train_subset=1000"], None, "train_subset 1200 (now 1000)"
    if name == "partition-other-seed":
        return [*args, "--set", "experiment.seed=1"], None, "seed 0 (now 1)"
    if name == "partition-other-validation":  # its shards hold the validation rows now asked for
        return [*args, "--set", "data.validation=0.1"], None, "validation 0.0 (now 0.1)"
    if name == "partition-legacy-other-rows":  # written before stats.json kept the selection
        stats = json.loads((d / "stats.json").read_text())
        del stats["data_selection"]
        (d / "stats.json").write_text(json.dumps(stats))
        return (
            [*args, "--set", "data.train_subset=1000"],
            None,
            "outside the current data selection",
        )
    if name == "manifest-index-out-of-range":
        _edit_manifest(d, 2, 1, "60000")
        return args, None, "manifest.csv: row 2, column sample_index: 60000 is out of range"
    if name == "manifest-index-past-int64":
        _edit_manifest(d, 3, 1, str(2**64))
        return args, None, f"manifest.csv: row 3, column sample_index: {2**64} is too large"
    if name == "manifest-not-integer":
        _edit_manifest(d, 5, 0, "x1")
        return args, None, "manifest.csv: row 5, column client_id: 'x1' is not an integer"
    if name == "manifest-wrong-label":
        path = d / "manifest.csv"
        c, i, y = path.read_text().splitlines()[1].split(",")
        _edit_manifest(d, 2, 2, str((int(y) + 1) % 10))
        return args, None, "manifest.csv: row 2, column label"
    if name == "stats-not-json":
        (d / "stats.json").write_text("{not json")
        return args, None, f"{d / 'stats.json'}: unreadable"
    raise AssertionError(name)


@pytest.mark.parametrize(
    "name",
    [
        "root-missing",
        "root-is-file",
        "root-corrupt",
        "reports-under-file",
        "partition-is-file",
        "partition-out-is-file",
        "partition-other-subset",
        "partition-other-seed",
        "partition-other-validation",
        "partition-legacy-other-rows",
        "manifest-index-out-of-range",
        "manifest-index-past-int64",
        "manifest-not-integer",
        "manifest-wrong-label",
        "stats-not-json",
    ],
)
def test_bad_files(tmp_path, partition_dir, name):
    args, root, needle = _file_case(name, tmp_path, partition_dir)
    command = "partition" if "--out" in args else "run"
    res = invoke(tmp_path, command, *args, root=root)
    assert_one_clear_line(res, needle, tmp_path / "reports")


@pytest.mark.parametrize("option", ["--out", "--timing"])
def test_stage_outputs_below_a_file_stop_before_training(tmp_path, partition_dir, option):
    """A DVC stage's output folder below a file: one line before training, not after it."""
    part = _copy(partition_dir, tmp_path / "part")
    assert invoke(tmp_path, "validate", "--partition", str(part)).exit_code == 0
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    args = ["--algorithm", "fedavg", "--partition", str(part), option, str(a_file / "cell")]
    res = invoke(tmp_path, "train", *args)
    assert_one_clear_line(res, f"{option}: {a_file} is a file", tmp_path / "reports")


@pytest.mark.slow
def test_a_given_partition_is_never_written_and_the_error_line_is_last(tmp_path, partition_dir):
    """``fedapt run --partition DIR`` never writes into DIR; shards the flow's validation
    would refuse (too small for validation.min_shard_size) are refused before the flow, in
    one line naming DIR's stats.json and the client, with no report and no other file
    written (issue 45: before, the validation task refused them inside the flow, after
    writing validation.json). A real process."""
    import os
    import subprocess
    import sys

    part = _copy(partition_dir, tmp_path / "part")
    before = {p.name: p.stat().st_mtime_ns for p in part.iterdir()}
    part.chmod(0o555)
    reports = tmp_path / "reports"
    cmd = [
        sys.executable, "-m", "flows.cli", "run", *LOCAL, *SMALL,
        "--params", str(REPO / "params.yaml"),
        "--set", f"data.root={REPO / 'data/raw'}",
        "--set", f"experiment.reports_dir={reports}",
        "--set", "validation.min_shard_size=100000",
        "--partition", str(part),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    finally:
        part.chmod(0o755)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert lines[-1].startswith(f"fedapt: error: {part / 'stats.json'}: client 0 holds"), lines
    assert "validation.min_shard_size is 100000" in lines[-1], lines[-1]
    assert "Error logging to API" not in res.stderr + res.stdout, res.stderr
    assert not reports.exists() or not any(p.is_file() for p in reports.rglob("*"))
    assert {p.name: p.stat().st_mtime_ns for p in part.iterdir()} == before
