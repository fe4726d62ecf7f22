"""A deployment with overrides next to a finished experiment, for real: the services of
`fedapt up` (Prefect server and worker, MLflow server with its registry, SeaweedFS S3), a
finished `fedapt run`, then `fedapt deploy --set ...` of the same experiment. The deployment is
refused in one line; with --new-version it deploys `<experiment>-v2`, the worker runs it to
Completed, and the finished experiment's reports, S3 objects and registry aliases are unchanged
afterwards. The deployment's run carries its deployment, flow run and overrides as MLflow tags
and in its summary, and, a smoke run (fewer rounds and rows than its params file), it registers
no model."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows import services as S
from flows.cli import app

REPO = Path(__file__).resolve().parents[2]
NAME = "fmnist-dir05-fedavg"
MODEL = "fedapt-fashion-mnist-cifar-cnn-full"
runner = CliRunner()


def _wait(predicate, timeout: float, what: str, interval: float = 2.0):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)
    return value


def _tree(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != ".fedapt.lock"
    }


def _s3_objects(prefix: str) -> dict[str, str]:
    from tasks.results.storage import s3_client

    pages = s3_client().get_paginator("list_objects_v2").paginate(Bucket="fedapt", Prefix=prefix)
    return {o["Key"]: o["ETag"] for page in pages for o in page.get("Contents", [])}


def _registry(client) -> tuple[dict[str, str], int]:
    model = client.get_registered_model(MODEL)
    versions = client.search_model_versions(f"name = '{MODEL}'")
    return dict(model.aliases), len(versions)


@pytest.mark.slow
def test_a_deployment_with_overrides_leaves_the_finished_experiment_alone(tmp_path, monkeypatch):
    from mlflow import MlflowClient
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    sd, reports = tmp_path / "state", tmp_path / "reports"
    monkeypatch.setenv("FEDAPT_STATE_DIR", str(sd))
    for var in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI", *S.USER_S3_VARS):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PREFECT_WORKER_QUERY_SECONDS", "2")
    common = [
        f"experiment.reports_dir={reports}",
        f"data.root={REPO / 'data/raw'}",
        "partition.num_clients=4",
        "runtime.workers=0",
        "storage.bucket=fedapt",
    ]
    sets = [
        a
        for kv in [*common, "data.train_subset=600", "data.test_subset=300", "federation.rounds=2"]
        for a in ("--set", kv)
    ]
    try:
        st = S.up(["worker", "mlflow"], state=sd, ports={n: 0 for n in S.DEFAULT_PORTS})
        assert all(s.healthy for s in st.values()), st
        env = {**os.environ, **S.env_for_clients(sd)}
        # The finished experiment, registered (a test subset: tracking.register=always).
        done = subprocess.run(
            [sys.executable, "-m", "flows.cli", "run", "--params", str(REPO / "params.yaml"),
             *sets, "--set", "federation.last_rounds=1", "--set", "tracking.register=always"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        monkeypatch.setenv("MLFLOW_TRACKING_URI", env["MLFLOW_TRACKING_URI"])
        for var in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            monkeypatch.setenv(var, env[var])
        mlflow = MlflowClient(env["MLFLOW_TRACKING_URI"])
        before = (
            _tree(reports / NAME),
            _s3_objects(f"runs/{NAME}/"),
            _registry(mlflow),
        )
        assert "summary.json" in before[0] and f"runs/{NAME}/summary.json" in before[1]
        assert set(before[2][0]) == {"champion", "challenger"}, before[2]

        # Overrides that change the numbers (and whole test split: auto could register it).
        smoke = [*common, "federation.rounds=1", "federation.last_rounds=1"]
        smoke += ["data.train_subset=300", "data.test_subset=null"]
        deploy = ["deploy", "--cron", "0 0 1 1 *", "--name", "smoke"]
        deploy += [
            "--params",
            str(REPO / "params.yaml"),
            *[a for kv in smoke for a in ("--set", kv)],
        ]
        api = env["PREFECT_API_URL"]
        with temporary_settings(updates={PREFECT_API_URL: api}), get_client(sync_client=True) as c:
            res = runner.invoke(app, deploy)
            text = res.output.strip()
            assert res.exit_code == 2 and len(text.splitlines()) == 1, text
            assert f"{reports / NAME} holds the finished results of other params" in text
            assert "federation.rounds 2 -> 1" in text and "--new-version" in text
            assert c.read_deployments() == []  # nothing created

            res = runner.invoke(app, [*deploy, "--new-version"])
            assert res.exit_code == 0, res.output
            assert f"deploying experiment {NAME}-v2" in res.output
            dep = c.read_deployment_by_name("fedapt-experiment/smoke")
            assert f"experiment.name={NAME}-v2" in dep.parameters["overrides"]
            run = c.create_flow_run_from_deployment(dep.id)
            final = _wait(
                lambda: (r := c.read_flow_run(run.id)).state.is_final() and r,
                420,
                "the deployment's run to finish",
            )
            assert final.state.is_completed(), (final.state, (sd / "logs/worker.log").read_text())

        after = (_tree(reports / NAME), _s3_objects(f"runs/{NAME}/"), _registry(mlflow))
        assert after == before  # reports, S3 objects, aliases and versions untouched

        summary = json.loads((reports / f"{NAME}-v2" / "summary.json").read_text())
        origin = summary["origin"]
        assert origin["entry"] == "deployment" and origin["deployment"] == "fedapt-experiment/smoke"
        assert origin["flow_run_id"] == str(run.id)
        assert "federation.rounds=1" in origin["overrides"] and origin["smoke"]
        assert f"runs/{NAME}-v2/summary.json" in _s3_objects(f"runs/{NAME}-v2/")
        exp = mlflow.get_experiment_by_name(f"{NAME}-v2")
        runs = mlflow.search_runs([exp.experiment_id])
        assert {r.data.tags["fedapt.kind"] for r in runs} == {"experiment", "cell"}
        for r in runs:
            assert r.data.tags["fedapt.deployment"] == "fedapt-experiment/smoke"
            assert r.data.tags["fedapt.flow_run_id"] == str(run.id)
            assert "federation.rounds=1" in json.loads(r.data.tags["fedapt.overrides"])
        cell = next(r for r in runs if r.data.tags["fedapt.kind"] == "cell")
        assert cell.data.metrics["final_accuracy_pct"] > 0 and "fedapt.smoke" in cell.data.tags
    finally:
        S.down(state=sd)
