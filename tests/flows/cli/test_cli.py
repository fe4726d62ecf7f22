"""The fedapt CLI end to end on real FashionMNIST (small), and its bad-input contract."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli import app
from tests.flows.support import invoke

REPO = Path(__file__).resolve().parents[3]
runner = CliRunner()


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
    "--set",
    "storage.bucket=null",
]


def test_run_writes_summary_with_bytes(tmp_path, prefect_server, monkeypatch, s3_env):
    """`fedapt run` executes the Prefect flow end to end on real FashionMNIST (small),
    tracked in MLflow (local SQLite store) with the final model registered as champion."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    # 500 test images: registered only because tracking.register says so (auto: whole split)
    register = ["--set", "tracking.register=always"]
    res = invoke(tmp_path, "run", *SMALL, *register, "--set", "storage.bucket=fedapt-test")
    assert res.exit_code == 0, res.output
    from tasks.results.storage import s3_client

    listed = s3_client().list_objects_v2(Bucket="fedapt-test", Prefix="runs/fmnist-dir05-fedavg/")
    keys = [o["Key"] for o in listed["Contents"]]
    assert "runs/fmnist-dir05-fedavg/summary.json" in keys
    assert "runs/fmnist-dir05-fedavg/partition/manifest.csv" in keys
    assert "runs/fmnist-dir05-fedavg/comm_cost.md" in keys
    cost = json.loads((tmp_path / "reports/fmnist-dir05-fedavg/comm_cost.json").read_text())
    assert cost["baseline"] == "fedavg-full" and cost["unit"] == "MiB"
    assert cost["final"]["fedavg-full"]["rounds"] == 3
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
    check_mlflow(tmp_path, run)


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


def check_mlflow(tmp_path, run):
    import mlflow.pytorch
    import torch
    from mlflow import MlflowClient

    from fedcore.payload import decode
    from models import get_model

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("fmnist-dir05-fedavg")
    runs = client.search_runs([exp.experiment_id])
    parent = [r for r in runs if r.data.tags.get("fedapt.kind") == "experiment"]
    child = [r for r in runs if r.data.tags.get("fedapt.kind") == "cell"]
    assert len(parent) == 1 and len(child) == 1
    c = child[0]
    assert c.data.tags["mlflow.parentRunId"] == parent[0].info.run_id
    assert c.data.tags["partition_hash"] == run["partition_hash"]
    assert c.data.params["federation.rounds"] == "3"
    hist = client.get_metric_history(c.info.run_id, "test_accuracy_pct")  # in %
    assert [m.step for m in hist] == [1, 2, 3]
    assert hist[-1].value == pytest.approx(100 * run["final_accuracy"])
    # traffic in MiB: cumulative per round, totals as metrics, a round's as a param
    up = client.get_metric_history(c.info.run_id, "cum_upload_mib")
    assert [m.value for m in up] == pytest.approx(
        [k * run["upload_bytes_per_round"] / 2**20 for k in (1, 2, 3)]
    )
    assert c.data.metrics["upload_mib"] == pytest.approx(run["upload_bytes"] / 2**20)
    assert c.data.params["upload_mib_per_round"] == f"{run['upload_bytes_per_round'] / 2**20:.4f}"
    assert "upload_bytes" not in c.data.metrics and "base_download_bytes" not in c.data.metrics
    mv = client.get_model_version_by_alias(run["registered_model"], "champion")
    assert str(mv.version) == run["model_version"]
    new = client.get_model_version_by_alias(run["registered_model"], "challenger")
    assert str(new.version) == run["model_version"]
    assert len(mv.tags["eval_set_sha256"]) == 64 and mv.tags["eval_set_rows"] == "500"
    assert mv.tags["experiment"] == "fmnist-dir05-fedavg" and mv.tags["cell"] == "fedavg-full"
    assert float(mv.tags["final_accuracy_pct"]) == pytest.approx(100 * run["final_accuracy"])
    # The registered model computes exactly what the final global model computes.
    loaded = mlflow.pytorch.load_model(f"models:/{run['registered_model']}@champion")
    ref = get_model("cifar_cnn", num_classes=10, in_channels=1, input_size=28)
    state = (tmp_path / "reports/fmnist-dir05-fedavg/runs/fedavg-full/model.pt").read_bytes()
    ref.load_state_dict(decode(state))
    # It takes images as stored (pixel/255) and normalises them as training did.
    from fedcore.datasets import get_dataset_info

    info = get_dataset_info("fashion_mnist")
    x = torch.rand(4, 1, 28, 28)
    normalised = (x - info.mean[0]) / info.std[0]
    assert torch.allclose(loaded(x), ref.eval()(normalised), atol=1e-5)
    check_readme_load(tmp_path, ref.eval())


README_LOAD = """
import sys
import mlflow.pytorch
import torch
model = mlflow.pytorch.load_model("models:/fedapt-fashion-mnist-cifar-cnn-full@champion")
model.eval()
with torch.no_grad():
    torch.save(model(torch.load(sys.argv[1])).argmax(1), sys.argv[2])
print(type(model).__name__, all(not m.training for m in model.modules()))
"""


def check_readme_load(tmp_path, ref):
    """What the README shows ("Results and registered models"), as a user runs it: a fresh
    Python with MLFLOW_TRACKING_URI set and fedapt not on PYTHONPATH loads the champion, an
    nn.Module that .eval()s, and predicts real test images as the final global model does."""
    import os

    import torch

    from fedcore.datasets import load_dataset

    test = load_dataset("fashion_mnist", REPO / "data/raw", "test")
    images, labels = test.images[:64].float() / 255.0, test.labels[:64]
    torch.save(images, tmp_path / "batch.pt")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp_path / 'mlflow.db'}"
    proc = subprocess.run(
        [sys.executable, "-c", README_LOAD, str(tmp_path / "batch.pt"), str(tmp_path / "y.pt")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["ImageServing", "True"]  # the module itself, in eval mode
    predicted = torch.load(tmp_path / "y.pt")
    info = test.info
    with torch.no_grad():
        expected = ref((images - info.mean[0]) / info.std[0]).argmax(1)
    assert torch.equal(predicted, expected)
    assert (predicted == labels).float().mean() > 0.3  # well above 10% chance


def test_validation_failure_stops_before_training(tmp_path):
    """A shard that breaks an expectation: refused before the flow (issue 45: ``prepare``
    applies the shard validation's rules to the partition it drew), one line naming the
    setting and the client, no traceback, nothing written (no partition, no report). Run as
    the user runs it (a real process)."""
    import os

    args = [a for a in SMALL] + [
        "--set",
        "validation.min_shard_size=5000",
        "--set",
        "runtime.tracking=false",
        "--set",
        f"experiment.reports_dir={tmp_path / 'reports'}",
        "--set",
        f"data.root={REPO / 'data/raw'}",
    ]
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect")}
    env.pop("PREFECT_API_URL", None)
    proc = subprocess.run(
        [sys.executable, "-m", "flows.cli", "run", "--params", str(REPO / "params.yaml"), *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
        env=env,
    )
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2, text
    last = text.strip().splitlines()[-1]
    assert last.startswith("fedapt: error: partition.dirichlet_classwise over 10 clients"), text
    assert "client 0 holds" in last and "validation.min_shard_size is 5000" in last, last
    assert "Traceback" not in text, text
    reports = tmp_path / "reports"
    assert not reports.exists() or not any(p.is_file() for p in reports.rglob("*")), text


def test_deploy_cron_schedule(prefect_server):
    """A scheduled deployment created against a real (temporary) Prefect server."""
    from prefect.client.orchestration import get_client

    res = runner.invoke(
        app,
        [
            "deploy",
            "--cron",
            "0 3 * * *",
            "--name",
            "nightly",
            "--params",
            str(REPO / "params.yaml"),
        ],
    )
    assert res.exit_code == 0, res.output
    with get_client(sync_client=True) as client:
        dep = client.read_deployment_by_name("fedapt-experiment/nightly")
        assert [s.schedule.cron for s in dep.schedules] == ["0 3 * * *"]
        assert dep.work_pool_name == "fedapt-process"
        assert dep.parameters["params_file"] == str(REPO / "params.yaml")
        # one run at a time: a run due while the previous one runs is cancelled
        assert dep.global_concurrency_limit.limit == 1
        assert dep.concurrency_options.collision_strategy == "CANCEL_NEW"


def test_deploy_bad_cron():
    res = runner.invoke(app, ["deploy", "--cron", "every night"])
    assert res.exit_code == 2 and "not a cron expression" in res.output


def test_deploy_unknown_pool_type_names_the_allowed_ones():
    res = runner.invoke(app, ["deploy", "--cron", "0 3 * * *", "--pool-type", "docker"])
    text = res.output.strip()
    assert res.exit_code == 2 and len(text.splitlines()) == 1, text
    assert "--pool-type 'docker'" in text and "allowed: process" in text


def test_deploy_against_a_server_that_is_not_up(monkeypatch):
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")
    res = runner.invoke(app, ["deploy", "--cron", "0 3 * * *"])
    text = res.output.strip()
    assert res.exit_code == 2 and len(text.splitlines()) == 1, text
    assert "PREFECT_API_URL=http://127.0.0.1:9/api" in text and "fedapt up" in text
    assert "Traceback" not in text


def test_deploy_without_any_server_says_to_start_one(monkeypatch):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    monkeypatch.delenv("PREFECT_API_URL", raising=False)  # and no `fedapt up` (test state dir)
    with temporary_settings(restore_defaults={PREFECT_API_URL}):  # not the module's server
        res = runner.invoke(app, ["deploy", "--cron", "0 3 * * *"])
    text = res.output.strip()
    assert res.exit_code == 2 and len(text.splitlines()) == 1, text
    assert "fedapt up" in text


def test_unreachable_s3_stops_before_anything(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "secret-key-id")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret-key")
    res = invoke(tmp_path, "run", *SMALL, "--set", "storage.bucket=fedapt-artifacts")
    assert res.exit_code == 2
    text = res.output.strip()
    assert "AWS_ENDPOINT_URL" in text and len(text.splitlines()) == 1
    assert "secret" not in text
    assert not (tmp_path / "reports").exists()


def test_status_shows_stopped_services():
    res = runner.invoke(app, ["status"])
    assert res.exit_code == 0, res.output
    for name in ("s3", "mlflow", "prefect"):
        assert name in res.output
    assert "stopped" in res.output


def test_up_on_a_busy_port_says_which_and_how(monkeypatch):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        monkeypatch.setenv("FEDAPT_S3_PORT", str(port))
        res = runner.invoke(app, ["up", "s3"])
    assert res.exit_code == 2
    assert f"port {port}" in res.output and "FEDAPT_S3_PORT" in res.output
    assert "Traceback" not in res.output


def test_commands_are_registered_explicitly_and_import_changes_no_environment():
    """Importing the CLI sets no environment variable (the app's callback sets the offline
    defaults when a command runs), and every command function is importable without the app."""
    import os

    code = (
        "import os; before = dict(os.environ); import flows.cli; "
        "assert dict(os.environ) == before, set(os.environ) ^ set(before); "
        "from flows.cli import stages; assert not hasattr(stages, 'app')"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_HOME", "DO_NOT_TRACK")}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=REPO)
