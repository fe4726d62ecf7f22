"""The scale-out hook: the grid's training tasks on a Dask LocalCluster of 2 worker processes
(prefect-dask) give the same numbers as training the cells directly in this process."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tasks.config import load_params

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_dask_task_runner_matches_direct_training(tmp_path, monkeypatch):
    from prefect.testing.utilities import prefect_test_harness

    from flows.experiment import experiment_flow, grid_task_runner
    from tasks.config import experiment_dir
    from tasks.data.experiment import load_experiment_data
    from tasks.data.partitioning import load_partition
    from tasks.training.cell import cell_of
    from tasks.training.train import train_cell

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    p = load_params(
        REPO / "params.yaml",
        [
            f"experiment.reports_dir={tmp_path / 'reports'}",
            f"data.root={REPO / 'data/raw'}",
            "data.train_subset=800",
            "data.test_subset=300",
            "federation.rounds=2",
            "federation.last_rounds=2",
            "grid.algorithms=[fedavg]",
            "runtime.tracking=false",
            "runtime.task_runner=dask",
            "runtime.dask_workers=2",
        ],
    )
    runner = grid_task_runner(p)
    assert type(runner).__name__ == "DaskTaskRunner"
    assert runner.cluster_kwargs["n_workers"] == 2
    with prefect_test_harness(server_startup_timeout=180):
        records = experiment_flow(params=p)
    assert [(r["algorithm"], r["adapter"]) for r in records] == [("fedavg", "full")]

    # The same cell trained here, without Prefect or Dask: identical numbers.
    out = experiment_dir(p)
    data = load_experiment_data(p)
    direct = train_cell(
        cell_of(p, data), data, load_partition(out / "partition"), tmp_path / "direct"
    )
    for key in ("final_accuracy", "mean_accuracy_last_L", "upload_bytes", "download_bytes"):
        assert records[0][key] == direct[key], key
    on_dask = json.loads((out / "runs/fedavg-full/metrics.json").read_text())
    assert on_dask["rounds"][-1]["accuracy"] == direct["final_accuracy"]
    # the Dask worker process computed in portable numerics, as this process does
    timing = json.loads((out / "runs/fedavg-full/timing.json").read_text())
    assert timing["pid"] != os.getpid()
    prov = timing["provenance"]
    assert prov["numerics"] == "portable" and prov["aten_capability"] == "AVX2", prov
    assert prov["onednn_enabled"] is False and prov["nnpack_enabled"] is False, prov


def test_thread_runner_is_the_default():
    from prefect.task_runners import ThreadPoolTaskRunner

    from flows.experiment import grid_task_runner

    p = load_params(REPO / "params.yaml")
    assert p.runtime.task_runner == "thread"
    assert isinstance(grid_task_runner(p), ThreadPoolTaskRunner)


def test_gpu_cluster_gives_each_worker_its_own_gpu():
    """One worker process per GPU, each started with its own CUDA_VISIBLE_DEVICES (real
    worker processes; no GPU is needed to see the variable), round robin past the last."""
    from distributed import Client

    from flows.gpu_cluster import GPUCluster

    kw = {"threads_per_worker": 1, "processes": True, "dashboard_address": None}
    with (
        GPUCluster(gpus=["3", "5"], n_workers=3, host="127.0.0.1", **kw) as cluster,
        Client(cluster) as client,
    ):
        client.wait_for_workers(3, timeout=120)
        seen = client.run(lambda: os.environ.get("CUDA_VISIBLE_DEVICES"))
    assert sorted(seen.values()) == ["3", "3", "5"]
