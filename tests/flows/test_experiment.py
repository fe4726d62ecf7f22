"""Pinned flow behaviours (issue 12): the experiment flow called the way a deployment calls
it (``params_file`` + ``overrides``) honours the overrides, and ``runtime.task_runner: dask``
really runs the grid's cells on the Dask runner.

The two fast tests run the flow's body (``experiment_flow.fn``) with its tasks replaced by
recorders, so they see exactly what the flow hands on: the params it loaded and the task
runner of the grid subflow. The slow test runs the real flow on a Prefect test server and a
Dask LocalCluster and checks the cell ran in a Dask worker process.
"""

from __future__ import annotations

import contextlib
import json
import os
import types
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _typed(params) -> dict:
    """What a task received: a typed Params (never a dict to re-validate), as JSON here."""
    from tasks.config import Params

    assert isinstance(params, Params), type(params)
    return params.model_dump(mode="json")


class FlowSpy:
    """Stands in for the flow's tasks and grid subflow; records what the flow passes on."""

    def __init__(self) -> None:
        self.partition_spec: dict | None = None
        self.partition_dir: str | None = None
        self.runner = None
        self.grid_spec: dict | None = None
        self.summary_spec: dict | None = None

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import flows.experiment as fe

        def partition_task(spec, out, *_plan):  # (the plan's data and draw)
            self.partition_spec, self.partition_dir = _typed(spec), out
            return out

        spy = self

        class Grid:
            def with_options(self, *, task_runner=None, **_):
                spy.runner = task_runner
                return self

            def __call__(self, plan, part_dir, runs_dir, parent, checkpoints=None, origin=None):
                spy.grid_spec = _typed(plan.params)
                return [{"algorithm": a} for a in spy.grid_spec["grid"]["algorithms"]]

        def summary_task(spec, records, path, runs_dir, origin=None):
            self.summary_spec = _typed(spec)

        env = types.SimpleNamespace(
            run_environment=lambda **_: contextlib.nullcontext({}),
            run_lock=lambda *a, **k: contextlib.nullcontext(),
        )
        monkeypatch.setattr(fe, "services", env)  # no S3, no service lookup
        monkeypatch.setattr(fe, "partition_task", partition_task)
        monkeypatch.setattr(fe, "validate_task", lambda *a, **k: None)
        monkeypatch.setattr(fe, "train_grid_flow", Grid())
        monkeypatch.setattr(fe, "summary_task", summary_task)
        monkeypatch.setattr(fe, "results_artifact_task", lambda *a, **k: None)


def deployment_run(tmp_path: Path, *overrides: str) -> list:
    """``experiment_flow`` as a deployment calls it: parameters params_file and overrides."""
    from flows.experiment import experiment_flow

    base = [
        f"experiment.reports_dir={tmp_path / 'reports'}",
        "runtime.tracking=false",
        "storage.bucket=null",
    ]
    return experiment_flow.fn(params_file=str(REPO / "params.yaml"), overrides=[*base, *overrides])


def test_deployment_call_honours_set_overrides(tmp_path, monkeypatch):
    spy = FlowSpy()
    spy.install(monkeypatch)
    records = deployment_run(
        tmp_path,
        "experiment.name=pinned",
        "federation.rounds=7",
        "client.lr=0.02",
        "grid.algorithms=[fedprox,fednova]",
    )
    assert records == [{"algorithm": "fedprox"}, {"algorithm": "fednova"}]
    assert spy.partition_dir == str(tmp_path / "reports/pinned/partition")
    for spec in (spy.partition_spec, spy.grid_spec, spy.summary_spec):
        assert spec is not None
        assert spec["experiment"]["name"] == "pinned"
        assert spec["federation"]["rounds"] == 7
        assert spec["client"]["lr"] == 0.02
        assert spec["grid"]["algorithms"] == ["fedprox", "fednova"]
        assert spec["runtime"]["tracking"] is False and spec["storage"]["bucket"] is None
    # Without overrides the same call runs params.yaml as it is.
    import yaml

    spy2 = FlowSpy()
    spy2.install(monkeypatch)
    deployment_run(tmp_path)
    defaults = yaml.safe_load((REPO / "params.yaml").read_text())
    assert spy2.grid_spec["federation"]["rounds"] == defaults["federation"]["rounds"] != 7
    assert spy2.grid_spec["experiment"]["name"] == defaults["experiment"]["name"]


def test_flow_runs_the_grid_on_the_configured_task_runner(tmp_path, monkeypatch):
    from prefect.task_runners import ThreadPoolTaskRunner

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    spy = FlowSpy()
    spy.install(monkeypatch)
    deployment_run(tmp_path, "runtime.task_runner=dask", "runtime.dask_workers=3")
    assert type(spy.runner).__name__ == "DaskTaskRunner"
    assert spy.runner.cluster_kwargs["n_workers"] == 3
    assert spy.runner.cluster_kwargs["processes"] is True
    assert spy.grid_spec["runtime"]["task_runner"] == "dask"

    spy.install(monkeypatch)
    # no scheduler at this made-up address: the preflight that refuses one is tested in
    # tests/tasks/config/test_bad_settings.py; here the runner it picks
    monkeypatch.setattr("flows.plan.check_dask_address", lambda params: None)
    deployment_run(tmp_path, "runtime.task_runner=dask", "runtime.dask_address=tcp://h:8786")
    assert type(spy.runner).__name__ == "DaskTaskRunner"
    assert spy.runner.address == "tcp://h:8786"

    spy.install(monkeypatch)
    deployment_run(tmp_path)  # params.yaml: thread
    assert isinstance(spy.runner, ThreadPoolTaskRunner)


@pytest.mark.slow
def test_deployment_style_run_trains_in_a_dask_worker_process(tmp_path, monkeypatch):
    """The real flow (Prefect test server, Dask LocalCluster of 2 worker processes), called
    with params_file + overrides: the overrides shape the outputs and the training cell ran
    in a Dask worker process, not in this one."""
    from prefect.testing.utilities import prefect_test_harness

    from flows.experiment import experiment_flow

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    overrides = [
        f"experiment.reports_dir={tmp_path / 'reports'}",
        "experiment.name=pinned-dask",
        f"data.root={REPO / 'data/raw'}",
        "data.train_subset=600",
        "data.test_subset=200",
        "federation.rounds=2",
        "federation.last_rounds=2",
        "grid.algorithms=[fedavg]",
        "runtime.tracking=false",
        "runtime.workers=0",
        "storage.bucket=null",
        "runtime.task_runner=dask",
        "runtime.dask_workers=2",
    ]
    with prefect_test_harness(server_startup_timeout=180):
        records = experiment_flow(params_file=str(REPO / "params.yaml"), overrides=overrides)
    out = tmp_path / "reports/pinned-dask"
    assert [r["rounds"] for r in records] == [2]
    stats = json.loads((out / "partition/stats.json").read_text())
    assert sum(c["size"] for c in stats["clients"]) == 600
    metrics = json.loads((out / "runs/fedavg-full/metrics.json").read_text())
    assert len(metrics["rounds"]) == 2
    timing = json.loads((out / "runs/fedavg-full/timing.json").read_text())
    assert timing["pid"] != os.getpid()
    assert "Dask Worker" in timing["process_name"], timing["process_name"]
