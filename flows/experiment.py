"""The experiment flow (Prefect 3): partition -> validate shards -> one training task per
grid cell -> summary (MLflow tracking and model registration inside the training tasks). A
seed sweep (``experiment.seeds``) does each step per seed, under ``seed-<s>/``, trains every
(seed, cell) on one task runner and adds the mean ± std over the seeds (``tasks.sweep``).

``preflight`` checks every input in the calling process before the flow starts, so bad
parameters stop with one line and leave no partial outputs; every output file is written
atomically by the tasks. Tasks pass paths and small JSON records, never tensors.
"""

from __future__ import annotations

import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prefect import flow
from prefect.task_runners import ThreadPoolTaskRunner

from fedcore.datasets import get_dataset_info
from fedcore.device import resolve_device
from fedcore.errors import ConfigError
from flows import services
from flows.runners import (
    cell_params,
    cell_resources,
    check_gpus,
    grid_parallelism,
    grid_task_runner,
)
from tasks import checkpoint, tracking
from tasks.cell import check_cell, check_ray_clients, model_factory
from tasks.config import Params, experiment_dir, in_force, load_params
from tasks.data import dataset_num_classes, load_experiment_data
from tasks.io import check_writable
from tasks.origin import Origin, check_results, origin, prefect_run
from tasks.partitioning import build_partition, check_partition_data, load_partition, partition_task
from tasks.pretrain import check_source, log_base_task, pretrain_task
from tasks.progress import end_grid, start_grid
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
from tasks.sweep import (
    log_sweep_metrics_task,
    seed_dir,
    seed_params,
    sweep_markdown,
    sweep_summary_task,
)
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
    check_gpus(params)  # a local Ray without the GPUs the cells would request
    check_ray_clients(params)  # runtime.clients: ray: the cluster answers, the GPUs exist
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
        for seed in params.experiment.seeds or ():  # a sweep: every seed's own draw
            ps = seed_params(params, seed)
            build_partition(ps, load_experiment_data(ps))
            if params.model.base == "pretrain":
                check_source(ps)
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


def check_sweep(params: Params, partition_dir: str | Path | None) -> None:
    """A seed sweep draws each seed's partition itself: a given partition is refused."""
    if params.experiment.seeds is not None and partition_dir is not None:
        raise ConfigError(
            f"--partition {partition_dir}: a seed sweep (experiment.seeds "
            f"{list(params.experiment.seeds)}) draws a partition per seed; drop --partition, "
            "or set experiment.seeds=null to run experiment.seed on this partition"
        )


def check_checkpoints(params: Params, partition_dir: str | Path | None = None) -> list[str]:
    """A rerun's cell checkpoints (reports/<experiment>/checkpoints) must be for this
    configuration: refused in one line before anything runs. Returns the cells that resume
    (a seed sweep's as ``seed-<s>/<cell>``, from each seed's own checkpoints)."""
    if params.experiment.seeds is not None:
        check_sweep(params, partition_dir)
        out = experiment_dir(params)
        return [
            f"seed-{seed}/{cell}"
            for seed in params.experiment.seeds
            for cell in _resuming(seed_params(params, seed), None, seed_dir(out, seed))
        ]
    return _resuming(params, partition_dir, experiment_dir(params))


def _resuming(params: Params, partition_dir: str | Path | None, out: Path) -> list[str]:
    if partition_dir is None:
        part = build_partition(params, load_experiment_data(params))  # drawn once per process
    else:
        part = load_partition(partition_dir)
    base = out / "pretrain" / "base.pt" if params.model.base == "pretrain" else None
    return checkpoint.check_cells(params, part.content_hash(), out / "checkpoints", base)


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
    run_origin: Origin | None = None,
) -> list[dict[str, Any]]:
    """One training task per (algorithm, adapter) cell, on the configured task runner."""
    cells = [(a, d) for a in params.grid.algorithms for d in params.grid.adapters]
    folders = [Path(checkpoint_dir)] * len(cells) if checkpoint_dir else None
    slots = start_grid(
        len(cells),
        params.federation.rounds,
        folders,
        params.experiment.name,
        grid_parallelism(params),
    )
    with cell_resources(params):  # on Ray: each task's GPUs
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
                run_origin=run_origin,
                slot=slot,
            )
            for (algorithm, adapter), slot in zip(cells, slots, strict=True)
        ]
    records = [f.result() for f in futures]  # in grid order, whatever order they finish in
    end_grid(slots)
    return records


@flow(name="fedapt-train-sweep", flow_run_name=grid_run_name)
def train_sweep_flow(
    params: Params,
    partition_dirs: list[str],
    experiment_dir: str,
    parent_run_id: str | None = None,
    base_paths: list[str | None] | None = None,
    run_origin: Origin | None = None,
) -> list[list[dict[str, Any]]]:
    """A seed sweep's grid: one training task per (seed, cell), all on the configured task
    runner; seed ``s`` (``partition_dirs`` and ``base_paths`` in the order of
    ``experiment.seeds``) writes under ``seed-<s>/runs`` and ``seed-<s>/checkpoints``.
    Returns the records per seed, in grid order, whatever order they finish in."""
    seeds = params.experiment.seeds or ()
    bases = base_paths or [None] * len(seeds)
    cells = [(a, d) for a in params.grid.algorithms for d in params.grid.adapters]
    folders = [seed_dir(experiment_dir, s) / "checkpoints" for s in seeds for _ in cells]
    slots = start_grid(
        len(folders),
        params.federation.rounds,
        folders,
        params.experiment.name,
        grid_parallelism(params),
    )
    slot = iter(slots)  # (seed, cell) in order: seed-major, as the folders
    futures = []
    with cell_resources(params):  # on Ray: each task's GPUs
        for seed, part_dir, base in zip(seeds, partition_dirs, bases, strict=True):
            ps, out = seed_params(params, seed), seed_dir(experiment_dir, seed)
            futures.append(
                [
                    train_task.with_options(task_run_name=f"train-{a}-{d}-seed-{seed}").submit(
                        ps,
                        part_dir,
                        a,
                        d,
                        str(out / "runs"),
                        parent_run_id,
                        base,
                        str(out / "checkpoints"),
                        seed,
                        run_origin,
                        slot=next(slot),
                    )  # fmt: skip
                    for a, d in cells
                ]
            )
    records = [[f.result() for f in per_seed] for per_seed in futures]
    end_grid(slots)
    return records


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
    entry: str = "run",
) -> list[dict[str, Any]]:
    """Run the experiment grid of params.yaml (or of ``params``) and write its summary.

    Parameters are typed once (``tasks.config``): a deployment's JSON ``params`` become a
    ``Params`` through Prefect's validation, and every task receives that object.
    ``overrides``: applied to ``params_file``, or (with ``params``) the overrides ``params``
    were made with, recorded as the run's origin; ``entry``: what started it (``run``,
    ``reproduce``; a deployment's runs are told by Prefect's runtime)."""
    p = params if params is not None else load_params(params_file, overrides)
    p = in_force(p, "native")  # a deployment's run starts here (auto: native, as fedapt run)
    check_sweep(p, partition_dir)
    deployment, flow_run_id = prefect_run()
    run_origin = origin(
        "deployment" if deployment else entry,
        p,
        params_file,
        overrides or (),
        deployment=deployment,
        flow_run_id=flow_run_id,
    )
    # Deployment runs get the same environment as `fedapt run`: the services that are up,
    # else an embedded S3 for the outputs (a no-op when the CLI already set it up); and the
    # experiment directory's lock (re-entrant: `fedapt run` already holds it). MLflow runs
    # still open when the flow fails are ended FAILED (KILLED on SIGINT/SIGTERM).
    with (
        services.run_lock(experiment_dir(p), "flow run of fedapt-experiment"),
        services.run_environment(need_s3=bool(p.storage.bucket)),
        tracking.ended_on_error(),
    ):
        if entry != "reproduce":  # (reproduce reruns its own experiments on a new config)
            check_results(p, s3=bool(p.storage.bucket))  # never over another run's results
        out = experiment_dir(p)
        parent = (
            start_tracking_task(p.experiment.name, p.flat(), run_origin.tags())
            if p.runtime.tracking
            else None
        )
        if p.experiment.seeds is not None:
            return run_sweep(p, out, parent, run_origin)
        part_dir = partition_dir or partition_task(p, str(out / "partition"))
        num_classes = dataset_num_classes(p)  # a decoder's vocabulary for next-token data
        # stops before training; a given partition is an input, never written to: its report
        # goes to the experiment's own folder
        report = str(out / "validation.json") if partition_dir else None
        validate_task(part_dir, num_classes, p.validation.min_shard_size, report)
        base = None
        if p.model.base == "pretrain":  # the frozen base, trained once and reused (cached)
            base = pretrain_task(p, str(out / "pretrain"))
            if parent is not None:
                log_base_task(parent, base)
        grid = train_grid_flow.with_options(task_runner=grid_task_runner(p))
        checkpoints = out / "checkpoints"  # a rerun after a crash resumes from these
        records = grid(
            cell_params(p), part_dir, str(out / "runs"), parent, base, str(checkpoints), run_origin
        )
        summary_task(p, records, str(out / "summary.json"), str(out / "runs"), run_origin)
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


def run_sweep(
    p: Params, out: Path, parent: str | None, run_origin: Origin | None = None
) -> list[dict[str, Any]]:
    """The flow's body for a seed sweep: each seed's partition (validated) and pretrain base
    before any training, then every (seed, cell), each seed's own outputs (its summary,
    results, comm_cost) under seed-<s>/, and the sweep's summary and results (mean ± std)
    in the experiment directory. Returns the records, seed by seed, in grid order."""
    seeds = list(p.experiment.seeds or ())
    num_classes = dataset_num_classes(p)  # a decoder's vocabulary for next-token data
    part_dirs: list[str] = []
    bases: list[str | None] = []
    for seed in seeds:
        ps, sd = seed_params(p, seed), seed_dir(out, seed)
        part_dirs.append(partition_task(ps, str(sd / "partition")))
        validate_task(part_dirs[-1], num_classes, p.validation.min_shard_size)
        base = None
        if p.model.base == "pretrain":  # each seed's own base (its subset, its init)
            base = pretrain_task(ps, str(sd / "pretrain"))
            if parent is not None:
                log_base_task(parent, base, f"seed-{seed}/pretrain")
        bases.append(base)
    grid = train_sweep_flow.with_options(task_runner=grid_task_runner(p))
    by_seed = grid(cell_params(p), part_dirs, str(out), parent, bases, run_origin)
    for seed, records in zip(seeds, by_seed, strict=True):
        sd, ps = seed_dir(out, seed), seed_params(p, seed)
        summary_task(ps, records, str(sd / "summary.json"), str(sd / "runs"), run_origin)
    records = [r for per_seed in by_seed for r in per_seed]
    cells = sweep_summary_task(p, records, str(out), run_origin)
    results_artifact_task(p.experiment.name, records, sweep_markdown(p, cells))
    if parent is not None:
        log_sweep_metrics_task(parent, cells)
        log_results_task(parent, str(out), seeds)
    for seed in seeds:  # the sweep is done: nothing to resume
        shutil.rmtree(seed_dir(out, seed) / "checkpoints", ignore_errors=True)
    if p.storage.bucket:
        upload_task(str(out), p.storage.bucket, f"{p.storage.prefix}/{p.experiment.name}")
    if parent is not None:
        end_tracking_task(parent)
    return records
