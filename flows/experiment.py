"""The experiment flow (Prefect 3): partition -> validate shards -> one training task per
grid cell -> summary (MLflow tracking and model registration inside the training tasks).

``preflight`` checks every input in the calling process before the flow starts, so bad
parameters stop with one line and leave no partial outputs; every output file is written
atomically by the tasks. Tasks pass paths and small JSON records, never tensors.
"""

from __future__ import annotations

import logging
import os
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prefect import flow
from prefect.context import FlowRunContext
from prefect.task_runners import ThreadPoolTaskRunner

from fedcore.datasets import get_dataset_info
from fedcore.device import resolve_device
from fedcore.errors import ConfigError
from flows import services
from tasks import checkpoint, tracking
from tasks.cell import check_cell, model_factory
from tasks.config import Params, experiment_dir, load_params
from tasks.data import (
    build_partition,
    check_partition_data,
    dataset_num_classes,
    load_experiment_data,
    load_partition,
    partition_task,
)
from tasks.io import check_writable
from tasks.pretrain import check_source, log_base_task, pretrain_task
from tasks.report import (
    end_tracking_task,
    log_results_task,
    report_baseline,
    results_artifact_task,
    start_tracking_task,
    summary_task,
    upload_task,
)
from tasks.storage import ensure_bucket
from tasks.tracking import check_tracking_server
from tasks.train import train_task
from tasks.validate import validate_task


def check_names(params: Params) -> None:
    """What needs no data and that parsing ``params`` could not check: the dataset's name,
    each grid cell against its algorithm's rules (its ``check`` hook), the device and the
    report's baseline. (Names and options of models, algorithms, adapters and partition
    schemes were typed by ``tasks.config``.)"""
    get_dataset_info(params.data.dataset)
    for adapter in params.grid.adapters:
        for algorithm in params.grid.algorithms:
            check_cell(params, algorithm, adapter)  # the algorithm's own rules (check hook)
    resolve_device(params.runtime.device)
    report_baseline(params)  # a baseline cell outside the grid -> the cells there are


def preflight(
    params: Params, partition_dir: str | Path | None = None, *, storage: bool = True
) -> None:
    """Everything a run would reject, checked before the flow starts (cheap: no training).

    ``storage=False`` for the DVC stages: their outputs go to the DVC remote (``dvc push``),
    not to ``storage.bucket``, so they need no S3 server.
    """
    check_names(params)
    check_writable("experiment.reports_dir", experiment_dir(params))
    if params.runtime.tracking:
        check_tracking_server()
    if storage and params.storage.bucket:
        ensure_bucket(params.storage.bucket)  # unreachable S3 or bad keys -> one line now
    data = load_experiment_data(params)  # missing data -> how to get it
    for adapter in params.grid.adapters:  # unknown model or option; adapter not applicable
        model_factory(params, data, adapter)()
    if params.model.base == "pretrain":
        check_source(params)  # no source rows left, classes out of range, missing dataset
    if partition_dir is None:
        build_partition(params, data)  # bad partition options and values
        return
    labels = data.train.labels.numpy()
    part = load_partition(partition_dir, num_samples=len(labels), labels=labels)
    check_partition_data(params, data, partition_dir, part)  # another subset -> one line
    want = (params.partition.scheme, params.partition.num_clients)
    if (part.scheme, part.num_clients) != want:
        raise ConfigError(
            f"partition in {partition_dir} is {part.scheme} over {part.num_clients} clients, "
            f"params.yaml asks for {want[0]} over {want[1]}; re-run fedapt partition"
        )


def check_checkpoints(params: Params, partition_dir: str | Path | None = None) -> list[str]:
    """A rerun's cell checkpoints (reports/<experiment>/checkpoints) must be for this
    configuration: refused in one line before anything runs. Returns the cells that resume."""
    if partition_dir is None:
        part = build_partition(params, load_experiment_data(params))  # drawn once per process
    else:
        part = load_partition(partition_dir)
    out = experiment_dir(params)
    base = out / "pretrain" / "base.pt" if params.model.base == "pretrain" else None
    return checkpoint.check_cells(params, part.content_hash(), out / "checkpoints", base)


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


def _experiment_name() -> str:
    """The experiment a flow run is for, from its parameters (Prefect's runtime context)."""
    from prefect.runtime import flow_run

    given = flow_run.parameters
    p = given.get("params")
    try:
        if isinstance(p, Params):
            return p.experiment.name
        if isinstance(p, dict):  # a deployment's JSON params (typed by Prefect later)
            name = str((p.get("experiment") or {}).get("name") or "auto")
            return "fedapt" if name == "auto" else name
        path = given.get("params_file", "params.yaml")
        return load_params(path, given.get("overrides")).experiment.name
    except Exception:  # a bad params file fails the run itself, with its one line
        return "fedapt"


def _stamp() -> str:
    return datetime.now(UTC).strftime("%Y%m%d-%H%M%S")


def experiment_run_name() -> str:
    """Flow-run names the UI can be read by: ``<experiment>-<UTC time>``."""
    return f"{_experiment_name()}-{_stamp()}"


def grid_run_name() -> str:
    return f"{_experiment_name()}-grid-{_stamp()}"


@flow(name="fedapt-train-grid", flow_run_name=grid_run_name)
def train_grid_flow(
    params: Params,
    partition_dir: str,
    runs_dir: str,
    parent_run_id: str | None = None,
    base_path: str | None = None,
    checkpoint_dir: str | None = None,
) -> list[dict[str, Any]]:
    """One training task per (algorithm, adapter) cell, on the configured task runner."""
    futures = [
        train_task.submit(
            params,
            partition_dir,
            algorithm,
            adapter,
            runs_dir,
            parent_run_id,
            base_path,
            checkpoint_dir,
        )
        for algorithm in params.grid.algorithms
        for adapter in params.grid.adapters
    ]
    return [f.result() for f in futures]  # in grid order, whatever order they finish in


@flow(
    name="fedapt-experiment",
    flow_run_name=experiment_run_name,
    task_runner=ThreadPoolTaskRunner(max_workers=1),
)
def experiment_flow(
    params: Params | None = None,
    params_file: str = "params.yaml",
    overrides: list[str] | None = None,
    partition_dir: str | None = None,
) -> list[dict[str, Any]]:
    """Run the experiment grid of params.yaml (or of ``params``) and write its summary.

    Parameters are typed once (``tasks.config``): a deployment's JSON ``params`` become a
    ``Params`` through Prefect's validation, and every task receives that object."""
    p = params if params is not None else load_params(params_file, overrides)
    # Deployment runs get the same environment as `fedapt run`: the services that are up,
    # else an embedded S3 for the outputs (a no-op when the CLI already set it up); and the
    # experiment directory's lock (re-entrant: `fedapt run` already holds it). MLflow runs
    # still open when the flow fails are ended FAILED (KILLED on SIGINT/SIGTERM).
    with (
        services.run_lock(experiment_dir(p), "flow run of fedapt-experiment"),
        services.run_environment(need_s3=bool(p.storage.bucket)),
        tracking.ended_on_error(),
    ):
        out = experiment_dir(p)
        parent = start_tracking_task(p.experiment.name, p.flat()) if p.runtime.tracking else None
        part_dir = partition_dir or partition_task(p, str(out / "partition"))
        num_classes = dataset_num_classes(p)  # a decoder's vocabulary for next-token data
        validate_task(part_dir, num_classes, p.validation.min_shard_size)  # stops before training
        base = None
        if p.model.base == "pretrain":  # the frozen base, trained once and reused (cached)
            base = pretrain_task(p, str(out / "pretrain"))
            if parent is not None:
                log_base_task(parent, base)
        grid = train_grid_flow.with_options(task_runner=grid_task_runner(p))
        checkpoints = out / "checkpoints"  # a rerun after a crash resumes from these
        records = grid(cell_params(p), part_dir, str(out / "runs"), parent, base, str(checkpoints))
        summary_task(p, records, str(out / "summary.json"), str(out / "runs"))
        results_artifact_task(p.experiment.name, records)  # the flow run's Artifacts tab
        if parent is not None:
            log_results_task(parent, str(out))
        shutil.rmtree(checkpoints, ignore_errors=True)  # the grid is done: nothing to resume
        if p.storage.bucket:
            prefix = f"{p.storage.prefix}/{p.experiment.name}"
            upload_task(str(out), p.storage.bucket, prefix)
        if parent is not None:
            end_tracking_task(parent)
    return records
