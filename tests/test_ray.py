"""``runtime.task_runner: ray`` (prefect-ray): the grid's cells train in parallel in Ray
worker processes of a local Ray instance, called the way a deployment calls the flow."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_ray_runner_is_built_from_params():
    from flows.experiment import cell_params, grid_task_runner
    from tasks.config import load_params

    p = load_params(REPO / "params.yaml", ["runtime.task_runner=ray", "runtime.ray_workers=3"])
    runner = grid_task_runner(p)
    assert type(runner).__name__ == "RayTaskRunner"
    assert runner.address is None
    kw = runner.init_kwargs
    assert kw["num_cpus"] == 3 and kw["include_dashboard"] is False
    assert kw["_node_ip_address"] == "127.0.0.1"  # never bound beyond this machine
    share = (os.cpu_count() or 1) // 3  # the local cores, shared by the 3 cells at once
    assert cell_params(p).runtime.workers == (share if share > 1 else 0)
    remote = load_params(
        REPO / "params.yaml", ["runtime.task_runner=ray", "runtime.ray_address=auto"]
    )
    assert grid_task_runner(remote).address == "auto"
    assert cell_params(remote).runtime.workers == "auto"  # a cluster's own cores


@pytest.mark.slow
def test_two_cells_train_in_parallel_ray_workers(tmp_path, monkeypatch):
    from prefect.client.orchestration import get_client
    from prefect.testing.utilities import prefect_test_harness

    from flows.experiment import experiment_flow

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    overrides = [
        f"experiment.reports_dir={tmp_path / 'reports'}",
        "experiment.name=pinned-ray",
        f"data.root={REPO / 'data/raw'}",
        "data.train_subset=600",
        "data.test_subset=200",
        "federation.rounds=2",
        "grid.algorithms=[fedavg,fedprox]",
        "runtime.tracking=false",
        "runtime.workers=0",
        "storage.bucket=null",
        "runtime.task_runner=ray",
        "runtime.ray_workers=2",
    ]
    with prefect_test_harness(server_startup_timeout=180):
        records = experiment_flow(params_file=str(REPO / "params.yaml"), overrides=overrides)
        with get_client(sync_client=True) as client:
            logs = [log.message for log in client.read_logs()]
    assert [(r["algorithm"], r["rounds"]) for r in records] == [("fedavg", 2), ("fedprox", 2)]
    # grid progress in the two worker processes: each cell by its grid position, with the
    # grid's rounds (a worker's last lines may reach the API after the flow has ended)
    for cell in ("cell 1 of 2: fedavg-full round 1/2", "cell 2 of 2: fedprox-full round 1/2"):
        line = next((m for m in logs if cell in m), None)
        assert line is not None and "/4 rounds" in line, [m for m in logs if "round" in m]
    runs = tmp_path / "reports/pinned-ray/runs"
    pids = {
        json.loads((runs / c / "timing.json").read_text())["pid"]
        for c in ("fedavg-full", "fedprox-full")
    }
    assert len(pids) == 2 and os.getpid() not in pids  # two Ray workers, not this process
    for c in ("fedavg-full", "fedprox-full"):  # each worker computed in portable numerics
        prov = json.loads((runs / c / "timing.json").read_text())["provenance"]
        assert prov["numerics"] == "portable" and prov["aten_capability"] == "AVX2", prov
        assert prov["onednn_enabled"] is False and prov["threads"] == 2, prov
