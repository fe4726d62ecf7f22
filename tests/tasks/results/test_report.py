"""`fedapt report` (the DVC report stage) prints one short table: a row per grid cell, never
the per-round records its metrics.json files carry."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from flows.cli import app
from flows.cli.tables import results_table, rounds_run
from tests.cli_contract import assert_one_clear_line, runner

REPO = Path(__file__).resolve().parents[3]
CELL = REPO / "artifacts/runs/fedavg-full"  # the committed output of the train stage


def _grid(tmp_path: Path) -> Path:
    """Two cells from the committed real record: fedavg-full and a diverged fedavg-lora."""
    runs = tmp_path / "runs"
    shutil.copytree(CELL, runs / "fedavg-full")
    shutil.copytree(CELL, runs / "fedavg-lora")
    path = runs / "fedavg-lora/metrics.json"
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, "adapter": "lora", "diverged_at_round": 7}))
    return runs


def test_report_prints_one_row_per_cell(tmp_path):
    runs = _grid(tmp_path)
    rounds = len(json.loads((CELL / "metrics.json").read_text())["rounds"])
    res = subprocess.run(
        [sys.executable, "-m", "flows.cli", "report", "--runs", str(runs)]
        + ["--out", str(tmp_path / "report"), "--timing", str(tmp_path / "no-timing")]
        + ["--params", str(REPO / "params.yaml"), "--set", "grid.algorithms=[fedavg]"]
        + ["--set", "grid.adapters=[full,lora]"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=300,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert "'accuracy'" not in res.stdout and "cum_upload_bytes" not in res.stdout
    assert len(lines) < 20, res.stdout  # a table and the files written, as `dvc repro` shows
    assert all(len(line) <= 140 for line in lines)
    rows = [line.split() for line in lines if line.strip().startswith("fedavg-")]
    assert [row[0] for row in rows] == ["fedavg-full", "fedavg-lora"]
    for row in rows:  # cell, partition, rounds, final acc, acc last L (2 words), MiB x 5, ...
        assert row[2] == str(rounds)
        up, down, total = map(float, row[8:11])
        assert abs(up + down - total) <= 0.11
    assert rows[0][11] == "-" and rows[1][11] == "7"  # diverged at
    assert (tmp_path / "report/summary.json").is_file()


def test_rounds_run_reads_a_count_or_the_per_round_list():
    assert rounds_run({"rounds": 4}) == 4
    assert rounds_run({"rounds": [{"round": 1}, {"round": 2}]}) == 2
    record = json.loads((CELL / "metrics.json").read_text())
    table = results_table([record])
    assert list(table.columns[2].cells) == [str(len(record["rounds"]))]


@pytest.mark.parametrize("folders", [[], ["fedavg-full-none"], ["fedavg-lora"]])
def test_report_of_a_grid_cell_without_its_folder(tmp_path, folders):
    """The DVC report stage reads artifacts/runs/<cell>: a cell no train stage wrote (a
    folder of the old name, fedavg-full-none, included) is one line naming params.yaml's
    dvc.cells, and no report is written."""
    runs = tmp_path / "runs"
    for name in folders:
        (runs / name).mkdir(parents=True)
        shutil.copy(REPO / "artifacts/runs/fedavg-full/metrics.json", runs / name)
    res = runner.invoke(
        app,
        ["report", "--params", str(REPO / "params.yaml"), "--runs", str(runs)]
        + ["--out", str(tmp_path / "report"), "--timing", str(tmp_path / "timing")],
    )
    if not folders:  # no cell folder at all: the --runs folder is not there
        assert_one_clear_line(res, f"--runs {runs} does not exist", tmp_path / "report")
        return
    needle = f"--runs {runs} has no metrics for grid cell fedavg-full ("
    assert_one_clear_line(res, needle, tmp_path / "report")
    assert "(list the cell under dvc.cells in params.yaml)" in res.output


def test_report_with_a_baseline_outside_the_grid_writes_nothing(tmp_path):
    """``report.baseline`` naming no grid cell: one line, and no summary.json, results.md or
    figure half-written before the comparison needed the baseline."""
    res = runner.invoke(
        app,
        ["report", "--params", str(REPO / "params.yaml"), "--runs", str(REPO / "artifacts/runs")]
        + ["--out", str(tmp_path / "report"), "--timing", str(tmp_path / "timing")]
        + ["--set", "report.baseline=fedprox-lora"],
    )
    assert_one_clear_line(res, "report.baseline 'fedprox-lora' is not a grid cell", tmp_path)
