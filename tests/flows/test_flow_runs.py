"""What a Prefect user sees of a run (issue 17): flow and task runs named after the
experiment and the cell, round progress in the flow run's logs, a results artifact and a
progress artifact per cell. On a real (test) Prefect server."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.flows.support import read_all_logs

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_flow_run_names_logs_and_artifacts(tmp_path, monkeypatch):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterType,
        LogFilter,
        LogFilterFlowRunId,
        TaskRunFilter,
        TaskRunFilterFlowRunId,
    )
    from prefect.testing.utilities import prefect_test_harness

    from flows.experiment import experiment_flow

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    overrides = [
        f"experiment.reports_dir={tmp_path / 'reports'}",
        "experiment.name=Named-Runs",
        f"data.root={REPO / 'data/raw'}",
        "data.train_subset=400",
        "data.test_subset=100",
        "partition.num_clients=4",
        "federation.rounds=2",
        "client.max_steps=2",
        "grid.algorithms=[fedavg]",
        "runtime.tracking=false",
        "runtime.workers=0",
        "storage.bucket=null",
    ]
    with prefect_test_harness(server_startup_timeout=180):
        state = experiment_flow(
            params_file=str(REPO / "params.yaml"), overrides=overrides, return_state=True
        )
        run_id = state.state_details.flow_run_id
        with get_client(sync_client=True) as client:
            run = client.read_flow_run(run_id)
            subflows = [r for r in client.read_flow_runs() if r.id != run_id]
            tasks = client.read_task_runs(
                task_run_filter=TaskRunFilter(
                    flow_run_id=TaskRunFilterFlowRunId(any_=[r.id for r in subflows])
                )
            )
            # the flow's own tasks: no input is a subflow's return value ("flow_run"), which
            # Prefect's UI cannot show (its Task Runs tab then lists none; issue 46)
            own = client.read_task_runs(
                task_run_filter=TaskRunFilter(flow_run_id=TaskRunFilterFlowRunId(any_=[run_id]))
            )
            flows = LogFilter(flow_run_id=LogFilterFlowRunId(any_=[r.id for r in [run, *subflows]]))
            deadline = time.monotonic() + 60  # the API log handler ships in batches
            while True:
                logs = read_all_logs(client, flows)
                done = any("fedavg-full round 2/2: acc" in log.message for log in logs)
                if done or time.monotonic() > deadline:
                    break
                time.sleep(1.0)
            markdown = client.read_artifacts(
                artifact_filter=ArtifactFilter(type=ArtifactFilterType(any_=["markdown"]))
            )
            progress = client.read_artifacts(
                artifact_filter=ArtifactFilter(type=ArtifactFilterType(any_=["progress"]))
            )
    assert run.name.startswith("Named-Runs-"), run.name
    assert any(r.name.startswith("Named-Runs-grid-") for r in subflows)
    assert "train-fedavg-full" in [t.name for t in tasks]
    kinds = {i.input_type for t in own for inputs in t.task_inputs.values() for i in inputs}
    assert {t.name.rsplit("-", 1)[0] for t in own} >= {"summary", "results-artifact"}
    assert "flow_run" not in kinds, kinds
    lines = [log.message for log in logs]
    assert any("fedavg-full round 2/2: acc" in m for m in lines), lines[-10:]
    (results,) = [a for a in markdown if a.key == "fedapt-named-runs"]
    assert "| fedavg-full |" in results.data
    # the cell's and its grid's (issue 28: cell k of N, the grid's rounds done)
    assert sorted((a.description, a.data) for a in progress) == [
        ("Named-Runs: rounds done of all 1 cells of the grid", 100.0),
        ("cell 1 of 1: fedavg-full: rounds done of 2", 100.0),
    ]
