"""Where the grid's training tasks run (``runtime.task_runner``): one after another in this
process, on a Dask cluster (prefect-dask) or on Ray (prefect-ray), and the params each cell
gets there."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from prefect.context import FlowRunContext
from prefect.task_runners import ThreadPoolTaskRunner

from tasks.config import Params


def grid_task_runner(params: Params) -> Any:
    """The task runner of the grid's training tasks, chosen in params.yaml (runtime)."""
    rt = params.runtime
    if rt.task_runner == "thread":
        return ThreadPoolTaskRunner(max_workers=1)  # cells one after another, in this process
    if rt.task_runner == "ray":
        return ray_task_runner(params)
    import dask
    from prefect_dask import DaskTaskRunner

    dask.config.set({"distributed.worker.daemon": False, "logging.distributed": "warning"})
    logging.getLogger("distributed").setLevel(logging.WARNING)
    # Task runs on the Dask workers report to this flow's Prefect API; without this, each
    # worker process would start a temporary server of its own (ephemeral mode).
    ctx = FlowRunContext.get()
    if ctx is not None and "PREFECT_API_URL" not in os.environ:
        os.environ["PREFECT_API_URL"] = str(ctx.client.api_url)
    if rt.dask_address:
        return DaskTaskRunner(address=rt.dask_address)
    # no dashboard is started (dashboard_address None), so no "dashboard is available" line
    logging.getLogger("prefect.task_runner.dask").addFilter(_NoDashboardLine())
    # One single-thread worker process per cell; the nanny must not be a daemon, because a
    # cell may itself fan clients out to worker processes (runtime.workers).
    return DaskTaskRunner(
        cluster_class="distributed.LocalCluster",
        cluster_kwargs={
            "n_workers": rt.dask_workers,
            "threads_per_worker": 1,
            "processes": True,
            "dashboard_address": None,
            "host": "127.0.0.1",
        },
    )


class _NoDashboardLine(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "dashboard is available" not in record.getMessage()


def ray_task_runner(params: Params) -> Any:
    """prefect-ray's runner: the cluster at ``runtime.ray_address``, or a local Ray instance of
    ``runtime.ray_workers`` CPUs on 127.0.0.1 (no dashboard, no usage stats); each training
    task takes one CPU, so that many cells train at once."""
    from prefect_ray import RayTaskRunner

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ctx = FlowRunContext.get()  # task runs on Ray workers report to this flow's Prefect API
    if ctx is not None and "PREFECT_API_URL" not in os.environ:
        os.environ["PREFECT_API_URL"] = str(ctx.client.api_url)
    rt = params.runtime
    if rt.ray_address:
        return RayTaskRunner(address=rt.ray_address)
    return RayTaskRunner(
        init_kwargs={
            "num_cpus": rt.ray_workers,
            "include_dashboard": False,
            "_node_ip_address": "127.0.0.1",
            "log_to_driver": True,
            "configure_logging": False,
            # cells import fedapt from this checkout, whatever the worker's directory
            "runtime_env": {"env_vars": {"PYTHONPATH": str(Path.cwd())}},
        }
    )


def grid_parallelism(params: Params) -> int | None:
    """How many cells the grid's task runner trains at once: 1 here, the local Dask or Ray
    workers; None for a cluster at an address (its size is its own)."""
    rt = params.runtime
    if rt.task_runner == "thread":
        return 1
    address = rt.dask_address if rt.task_runner == "dask" else rt.ray_address
    if address:
        return None
    return rt.dask_workers if rt.task_runner == "dask" else rt.ray_workers


def cell_params(params: Params) -> Params:
    """The params each training task gets. On a LocalCluster the cells share this machine's
    cores, so ``workers: auto`` becomes an equal share per Dask worker (results do not depend
    on it: clients always train single-threaded)."""
    rt = params.runtime
    local = {"dask": rt.dask_workers, "ray": rt.ray_workers}.get(rt.task_runner)
    address = rt.dask_address if rt.task_runner == "dask" else rt.ray_address
    if local is not None and not address and rt.workers == "auto":
        share = (os.cpu_count() or 1) // local
        runtime = rt.model_copy(update={"workers": share if share > 1 else 0})
        return params.model_copy(update={"runtime": runtime})
    return params
