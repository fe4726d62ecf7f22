"""Where the grid's training tasks run (``runtime.task_runner``): one after another in this
process, on a Dask cluster (prefect-dask) or on Ray (prefect-ray), the params each cell gets
there, and which GPU a cell sees.

GPUs: a local Dask cluster gives each worker process one visible GPU (``CUDA_VISIBLE_DEVICES``,
round robin over this machine's), so the cells that train at once use different GPUs; a Ray
training task requests ``runtime.ray_gpus`` GPUs (Ray then shows it those alone; a task that
requests none sees no GPU at all, so ``device: auto`` would train on the CPU unasked).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prefect.context import FlowRunContext
from prefect.task_runners import ThreadPoolTaskRunner

from fedcore.errors import ConfigError, mask_credentials
from tasks.config import Params
from tasks.training.runtime import ray_address, ray_gpus, visible_gpus


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
    kwargs: dict[str, Any] = {
        "n_workers": rt.dask_workers,
        "threads_per_worker": 1,
        "processes": True,
        "dashboard_address": None,
        "host": "127.0.0.1",
    }
    if rt.device != "cpu" and (gpus := visible_gpus()):
        gpu_kwargs = {**kwargs, "gpus": gpus}
        return DaskTaskRunner(
            cluster_class="flows.gpu_cluster.GPUCluster", cluster_kwargs=gpu_kwargs
        )
    return DaskTaskRunner(cluster_class="distributed.LocalCluster", cluster_kwargs=kwargs)


class _NoDashboardLine(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "dashboard is available" not in record.getMessage()


def check_dask_address(params: Params, timeout: float = 5.0) -> None:
    """Preflight of ``runtime.dask_address``: one line where it is not ``tcp://host:port``
    or nothing answers there (Dask would retry for 30 s and fail in a traceback, after the
    partition was drawn and a Prefect server started)."""
    import socket
    from urllib.parse import urlsplit

    address = params.runtime.dask_address
    if params.runtime.task_runner != "dask" or not address:
        return
    shown = mask_credentials(address)
    parts = urlsplit(address if "://" in address else f"tcp://{address}")
    try:
        host, port = parts.hostname, parts.port
    except ValueError:
        host, port = None, None
    if parts.scheme not in ("tcp", "tls") or not host or port is None:
        raise ConfigError(
            f"runtime.dask_address: {shown!r} is not tcp://host:port (or tls://host:port); "
            "null starts a local Dask cluster"
        )
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError as err:
        raise ConfigError(
            f"runtime.dask_address: nothing answers at {shown} ({err.strerror or err}); start "
            "the scheduler (dask scheduler) or set runtime.dask_address: null for a local Dask "
            "cluster"
        ) from None


def ray_task_runner(params: Params) -> Any:
    """prefect-ray's runner: the cluster at ``runtime.ray_address`` (else ``RAY_ADDRESS``:
    ``tasks.training.runtime.ray_address``), or a local Ray instance of
    ``runtime.ray_workers`` CPUs on 127.0.0.1 (no dashboard, no usage stats; with token
    authentication and on 127.0.0.1 alone where ``flows.localray.local_ray`` is in force, as
    around every run: ``_node_ip_address`` alone is not enough on Ray 2.60); each training
    task takes one CPU, so that many cells train at once. With the clients on Ray actors
    too (``cells_share_ray``): CPUs for every cell's actors, the cells a resource of their
    own."""
    from prefect_ray import RayTaskRunner

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ctx = FlowRunContext.get()  # task runs on Ray workers report to this flow's Prefect API
    if ctx is not None and "PREFECT_API_URL" not in os.environ:
        os.environ["PREFECT_API_URL"] = str(ctx.client.api_url)
    rt = params.runtime
    if address := ray_address(params):
        return RayTaskRunner(address=address)
    shared: dict[str, Any] = {}
    if cells_share_ray(params):  # the cells' client actors: CPUs of their own
        shared = {"resources": {CELL_RESOURCE: rt.ray_workers}}
    return RayTaskRunner(
        init_kwargs={
            "num_cpus": rt.ray_workers * (actors_per_cell(params) if shared else 1),
            **shared,
            "num_gpus": 0 if rt.device == "cpu" else len(visible_gpus()),
            "include_dashboard": False,
            "_node_ip_address": "127.0.0.1",
            "log_to_driver": True,
            "configure_logging": False,
            # cells import fedapt from this checkout, whatever the worker's directory
            "runtime_env": {"env_vars": {"PYTHONPATH": str(Path.cwd())}},
        }
    )


# A local Ray's custom resource that the cells of ``cells_share_ray`` take one of each
# (instead of a CPU): ``ray_workers`` of it, so that many cells train at once.
CELL_RESOURCE = "fedapt_cell"


def cells_share_ray(params: Params) -> bool:
    """The cells run on a local Ray (``task_runner: ray``, no ``ray_address``) and their
    clients on Ray actors (``clients: ray``): one Ray for both, the actors connect to it. A
    cell then takes no CPU but one ``CELL_RESOURCE`` (it waits on its actors), the actors one
    CPU each: the local Ray has ``ray_workers`` x ``actors_per_cell`` CPUs, so no actor waits
    for CPUs the cells hold."""
    rt = params.runtime
    return rt.task_runner == "ray" and not ray_address(params) and rt.clients == "ray"


def actors_per_cell(params: Params) -> int:
    """Each cell's client actors on a shared local Ray (``cells_share_ray``):
    ``runtime.ray_actors``, else an equal share of this machine's cores (at least one)."""
    rt = params.runtime
    if rt.ray_actors != "auto":
        return rt.ray_actors
    return max(1, (os.cpu_count() or 1) // rt.ray_workers)


def grid_parallelism(params: Params) -> int | None:
    """How many cells the grid's task runner trains at once: 1 here, the local Dask or Ray
    workers; None for a cluster at an address (its size is its own)."""
    rt = params.runtime
    if rt.task_runner == "thread":
        return 1
    address = rt.dask_address if rt.task_runner == "dask" else ray_address(params)
    if address:
        return None
    return rt.dask_workers if rt.task_runner == "dask" else rt.ray_workers


def cell_params(params: Params) -> Params:
    """The params each training task gets. On a LocalCluster the cells share this machine's
    cores, so ``workers: auto`` becomes an equal share per Dask worker (results do not depend
    on it: clients always train single-threaded)."""
    rt = params.runtime
    if cells_share_ray(params):  # each cell's share of the local Ray's actor CPUs
        runtime = rt.model_copy(update={"ray_actors": actors_per_cell(params)})
        return params.model_copy(update={"runtime": runtime})
    local = {"dask": rt.dask_workers, "ray": rt.ray_workers}.get(rt.task_runner)
    address = rt.dask_address if rt.task_runner == "dask" else ray_address(params)
    if local is not None and not address and rt.workers == "auto":
        share = (os.cpu_count() or 1) // local
        runtime = rt.model_copy(update={"workers": share if share > 1 else 0})
        return params.model_copy(update={"runtime": runtime})
    return params


@contextlib.contextmanager
def cell_resources(params: Params) -> Iterator[None]:
    """Around the grid's submissions: on Ray, each training task requests its GPUs
    (``ray_gpus`` against the nodes of the running cluster) and, where the cells share a
    local Ray with their clients' actors (``cells_share_ray``), no CPU but one
    ``CELL_RESOURCE``; elsewhere nothing."""
    if params.runtime.task_runner != "ray":
        yield
        return
    import ray
    from prefect_ray.context import remote_options

    nodes = [float(n["Resources"].get("GPU", 0.0)) for n in ray.nodes() if n.get("Alive")]
    gpus = ray_gpus(params, nodes)
    options: dict[str, Any] = {"num_gpus": gpus} if gpus else {}
    if cells_share_ray(params):
        options.update(num_cpus=0, resources={CELL_RESOURCE: 1})
    if not options:
        yield
        return
    with remote_options(**options):
        yield
