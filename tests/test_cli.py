"""The fedapt CLI end to end on real FashionMNIST (small), and its bad-input contract."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli import app

REPO = Path(__file__).resolve().parents[1]
runner = CliRunner()


@pytest.fixture(scope="module")
def prefect_server():
    """One temporary Prefect server (real API, SQLite) for the flow runs in this module."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield


SMALL = [
    "--set",
    "data.train_subset=1200",
    "--set",
    "data.test_subset=500",
    "--set",
    "federation.rounds=3",
    "--set",
    "federation.last_rounds=2",
    "--set",
    "runtime.workers=0",
]


def invoke(tmp_path, *args):
    reports = ["--set", f"experiment.reports_dir={tmp_path / 'reports'}"]
    data = ["--set", f"data.root={REPO / 'data/raw'}"]
    return runner.invoke(app, [*args, "--params", str(REPO / "params.yaml"), *reports, *data])


def test_run_writes_summary_with_bytes(tmp_path, prefect_server):
    """`fedapt run` executes the Prefect flow end to end on real FashionMNIST (small)."""
    res = invoke(tmp_path, "run", *SMALL)
    assert res.exit_code == 0, res.output
    summary = json.loads((tmp_path / "reports/fmnist-dir05-fedavg/summary.json").read_text())
    (run,) = summary["runs"]
    for key in (
        "algorithm",
        "adapter",
        "partition",
        "rounds",
        "final_accuracy",
        "mean_accuracy_last_L",
        "upload_bytes",
        "download_bytes",
        "wall_seconds",
    ):
        assert key in run
    assert run["algorithm"] == "fedavg" and run["partition"] == "dirichlet_classwise"
    assert run["rounds"] == 3 and run["final_accuracy"] > 0.3  # well above 10% chance
    assert run["upload_bytes"] == 3 * run["upload_bytes_per_round"]  # full model, 10 clients
    metrics = json.loads(
        (tmp_path / "reports/fmnist-dir05-fedavg/runs/fedavg-full/metrics.json").read_text()
    )
    assert [r["round"] for r in metrics["rounds"]] == [1, 2, 3]
    assert "MiB" in res.output


def test_partition_command(tmp_path):
    res = invoke(
        tmp_path,
        "partition",
        "--set",
        "partition.scheme=labels_per_client",
        "--set",
        "partition.labels_per_client.m=2",
        "--set",
        "data.train_subset=2000",
    )
    assert res.exit_code == 0, res.output
    manifest = tmp_path / "reports/fmnist-dir05-fedavg/partition/manifest.csv"
    assert manifest.read_text().startswith("client_id,sample_index,label")


def test_models_command():
    res = runner.invoke(app, ["models", "--num-classes", "10", "--input-shape", "3,32,32"])
    assert res.exit_code == 0, res.output
    assert "cifar_cnn" in res.output and "815,892" in res.output


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--set", "data.dataset=imagenet"], "unknown dataset 'imagenet'"),
        (["--set", "model.name=vgg"], "unknown model 'vgg'"),
        (["--set", "partition.scheme=zipf"], "unknown partition scheme"),
        (["--set", "grid.algorithms=[fedsgd]"], "unknown algorithm 'fedsgd'"),
        (["--set", "partition.dirichlet_classwise.beta=0"], "beta"),
        (["--set", "partition.num_clients=5000", "--set", "data.train_subset=1000"], "num_clients"),
        (["--set", "federation.participation=0"], "federation.participation"),
        (["--set", "federation.rounds=0"], "federation.rounds"),
        (["--set", "client.lr=-0.1"], "client.lr"),
        (["--set", "federation.roundz=2"], "unknown key 'federation.roundz'"),
        (
            [
                "--set",
                "partition.scheme=labels_per_client",
                "--set",
                "partition.labels_per_client.m=11",
            ],
            "m",
        ),
    ],
)
def test_bad_input_one_line_no_outputs(tmp_path, args, needle):
    res = invoke(tmp_path, "run", *args)
    assert res.exit_code == 2, res.output
    text = res.output.strip()
    assert needle in text and "Traceback" not in text
    assert len(text.splitlines()) == 1, text
    assert not (tmp_path / "reports").exists()  # nothing written


def test_console_script_error_exit(tmp_path):
    """The installed entry point: non-zero exit, one line on stderr, no traceback."""
    bad = tmp_path / "params.yaml"
    bad.write_text("federation:\n  rounds: [1,\n")
    proc = subprocess.run(
        [sys.executable, "-m", "flows.cli", "run", "--params", str(bad)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "malformed YAML" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
