"""``runtime.task_runner: ray`` (prefect-ray): the grid's cells train in parallel in Ray
worker processes of a local Ray instance, called the way a deployment calls the flow."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# A 2-cell grid of 2 rounds on a small subset, nothing tracked or uploaded.
SMALL_GRID = [
    f"data.root={REPO / 'data/raw'}",
    "data.train_subset=600",
    "data.test_subset=200",
    "federation.rounds=2",
    "grid.algorithms=[fedavg,fedprox]",
    "runtime.tracking=false",
    "runtime.workers=0",
    "storage.bucket=null",
]


def test_ray_runner_is_built_from_params():
    from flows.experiment import cell_params, grid_task_runner
    from tasks.config import load_params

    p = load_params(REPO / "params.yaml", ["runtime.task_runner=ray", "runtime.ray_workers=3"])
    runner = grid_task_runner(p)
    assert type(runner).__name__ == "RayTaskRunner"
    assert runner.address is None
    kw = runner.init_kwargs
    assert kw["num_cpus"] == 3 and kw["include_dashboard"] is False
    # on this machine alone, where flows.localray's variables are set (else Ray 2.60 resolves
    # 127.0.0.1 to the machine's address: tests/flows/test_localray.py)
    assert kw["_node_ip_address"] == "127.0.0.1"
    share = (os.cpu_count() or 1) // 3  # the local cores, shared by the 3 cells at once
    assert cell_params(p).runtime.workers == (share if share > 1 else 0)
    remote = load_params(
        REPO / "params.yaml", ["runtime.task_runner=ray", "runtime.ray_address=auto"]
    )
    assert grid_task_runner(remote).address == "auto"
    assert cell_params(remote).runtime.workers == "auto"  # a cluster's own cores


def test_ray_tasks_request_gpus_a_node_has():
    """runtime.ray_gpus: auto asks one GPU per cell where a node has one (a task that asks none
    sees no GPU under Ray); a request no node meets, or device cuda with none, is one line."""
    from fedcore.errors import ConfigError
    from tasks.config import load_params
    from tasks.training.runtime import ray_gpus

    def params(*sets: str):
        return load_params(REPO / "params.yaml", ["runtime.task_runner=ray", *sets])

    assert ray_gpus(params(), [0.0, 0.0]) == 0.0  # auto on CPU nodes: the CPU, as asked
    assert ray_gpus(params(), [0.0, 4.0]) == 1.0  # auto where a node has GPUs
    assert ray_gpus(params("runtime.device=cpu"), [4.0]) == 0.0
    assert ray_gpus(params("runtime.ray_gpus=0.5"), [1.0]) == 0.5  # two cells share one GPU
    with pytest.raises(ConfigError, match=r"^runtime.device: cuda: 1 GPU per cell asked, but no "):
        ray_gpus(params("runtime.device=cuda"), [0.0])
    with pytest.raises(ConfigError, match="the Ray cluster at auto has more than 1;"):
        ray_gpus(params("runtime.ray_gpus=2", "runtime.ray_address=auto"), [1.0, 1.0])
    with pytest.raises(ConfigError, match="Ray hides the GPUs from a task that requests none"):
        ray_gpus(params("runtime.device=cuda", "runtime.ray_gpus=0"), [2.0])


def test_local_ray_and_dask_see_this_machines_gpus(monkeypatch):
    """A local Ray gets this machine's GPUs unless device is cpu; a local Dask cluster gives
    each worker its own GPU when there are some (flows.gpu_cluster)."""
    import flows.runners as runners
    from tasks.config import load_params

    monkeypatch.setattr(runners, "visible_gpus", lambda: ["0", "1"])
    ray = load_params(REPO / "params.yaml", ["runtime.task_runner=ray"])
    assert runners.grid_task_runner(ray).init_kwargs["num_gpus"] == 2
    cpu = load_params(REPO / "params.yaml", ["runtime.task_runner=ray", "runtime.device=cpu"])
    assert runners.grid_task_runner(cpu).init_kwargs["num_gpus"] == 0
    dask = runners.grid_task_runner(load_params(REPO / "params.yaml", ["runtime.task_runner=dask"]))
    assert dask.cluster_class == "flows.gpu_cluster.GPUCluster"
    assert dask.cluster_kwargs["gpus"] == ["0", "1"] and dask.cluster_kwargs["n_workers"] == 2
    monkeypatch.setattr(runners, "visible_gpus", lambda: [])
    plain = runners.grid_task_runner(
        load_params(REPO / "params.yaml", ["runtime.task_runner=dask"])
    )
    assert plain.cluster_class == "distributed.LocalCluster"


@pytest.mark.slow
def test_two_cells_train_in_parallel_ray_workers(tmp_path, monkeypatch):
    from prefect.client.orchestration import get_client
    from prefect.testing.utilities import prefect_test_harness

    from flows.experiment import experiment_flow

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    overrides = [
        f"experiment.reports_dir={tmp_path / 'reports'}",
        "experiment.name=pinned-ray",
        *SMALL_GRID,
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


def test_cells_and_their_client_actors_share_one_local_ray():
    """task_runner ray + clients ray, no address: the local Ray holds every cell's actors
    (ray_workers x actors per cell CPUs), a cell takes no CPU but one fedapt_cell, and each
    cell starts its share of actors on that Ray (cell_params' ray_actors)."""
    from flows.runners import CELL_RESOURCE, cell_params, grid_task_runner
    from tasks.config import load_params

    both = ["runtime.task_runner=ray", "runtime.clients=ray", "runtime.ray_workers=2"]
    p = load_params(REPO / "params.yaml", [*both, "runtime.ray_actors=3"])
    kw = grid_task_runner(p).init_kwargs
    assert kw["num_cpus"] == 6 and kw["resources"] == {CELL_RESOURCE: 2}
    assert cell_params(p).runtime.ray_actors == 3
    auto = load_params(REPO / "params.yaml", both)
    share = max(1, (os.cpu_count() or 1) // 2)
    assert cell_params(auto).runtime.ray_actors == share
    assert grid_task_runner(auto).init_kwargs["num_cpus"] == 2 * share
    cells_only = load_params(REPO / "params.yaml", both[:1] + both[2:])
    assert "resources" not in grid_task_runner(cells_only).init_kwargs
    remote = load_params(REPO / "params.yaml", [*both, "runtime.ray_address=auto"])
    assert grid_task_runner(remote).address == "auto"
    assert cell_params(remote).runtime.ray_actors == "auto"  # a cluster's own CPUs


@pytest.mark.slow
def test_cells_with_clients_on_actors_on_one_local_ray_give_the_thread_runners_bytes(
    tmp_path, monkeypatch
):
    """A 2-cell grid on the local Ray runner whose cells' clients train on actors of the
    same Ray completes (no actor waits for CPUs the cells hold) with the outputs of the
    thread runner with local clients: metrics.json and model.pt, byte for byte; the node of
    each client is in the Ray run's timing.json only."""
    from prefect.testing.utilities import prefect_test_harness

    from flows.experiment import experiment_flow

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    common = ["experiment.name=shared-ray", *SMALL_GRID]
    ray_run = ["runtime.task_runner=ray", "runtime.ray_workers=2", "runtime.clients=ray"]
    with prefect_test_harness(server_startup_timeout=180):
        for name, extra in (("thread", []), ("ray", ray_run)):
            reports = f"experiment.reports_dir={tmp_path / name}"
            records = experiment_flow(
                params_file=str(REPO / "params.yaml"), overrides=[*common, reports, *extra]
            )
            assert [(r["algorithm"], r["rounds"]) for r in records] == [
                ("fedavg", 2),
                ("fedprox", 2),
            ]
    used = set()
    for cell in ("fedavg-full", "fedprox-full"):
        runs = [tmp_path / name / "shared-ray/runs" / cell for name in ("thread", "ray")]
        for f in ("metrics.json", "model.pt"):
            assert (runs[0] / f).read_bytes() == (runs[1] / f).read_bytes(), (cell, f)
        timing = [json.loads((r / "timing.json").read_text()) for r in runs]
        assert timing[1]["pid"] != os.getpid()  # trained in a Ray worker process
        # the clients trained on actors, each one's node recorded beside the times
        assert "client_nodes" not in timing[0]
        placed = timing[1]["client_nodes"]
        assert {row[0] for row in placed["clients"]} == {1, 2}  # both rounds' clients
        assert len(placed["nodes"]) == 1 and "?" not in placed["nodes"].values()
        used |= set(placed["nodes"])
    assert len(used) == 1  # both cells' actors on the runner's Ray (a Ray of their own: 2)
