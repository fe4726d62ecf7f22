"""The experiment flow (Prefect 3): partition -> validate shards -> one training task per
grid cell -> summary (MLflow tracking and model registration inside the training tasks). A
seed sweep (``experiment.seeds``) does each step per seed, under ``seed-<s>/``, trains every
(seed, cell) on one task runner and adds the mean ± std over the seeds (``tasks.training.sweep``).

The flow runs a ``RunPlan`` (``flows.plan.prepare``: every input checked, the data read and
the partition drawn once, before the flow starts, so bad parameters stop with one line and
leave no partial outputs); a deployment's flow run prepares its own. Every output file is
written atomically by the tasks. Tasks on a Dask or Ray worker get paths and small records;
in this process they also get the plan's data, partition and each cell's initial model.

The grid's records (a subflow's return value) reach the flow's later tasks ``quote``d: Prefect
would record them as a ``flow_run`` input, which its UI cannot show (the Task Runs tab then
lists no task run at all).
"""

from __future__ import annotations

import dataclasses
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prefect import flow
from prefect.task_runners import ThreadPoolTaskRunner
from prefect.utilities.annotations import quote

from flows import services
from flows.localray import local_ray
from flows.plan import RunPlan, prepare
from flows.runners import cell_params, cell_resources, grid_parallelism, grid_task_runner
from flows.streams import mask_streams
from tasks import tracking
from tasks.config import Params, experiment_dir, in_force, load_params
from tasks.data.partitioning import partition_task
from tasks.data.pretrain import log_base_task, pretrain_task
from tasks.data.validate import validate_task
from tasks.grid import ResolvedCell, grid_cells
from tasks.results.origin import Origin, origin, prefect_run
from tasks.results.progress import end_grid, start_grid
from tasks.results.report import (
    end_tracking_task,
    log_results_task,
    results_artifact_task,
    start_tracking_task,
    summary_task,
    upload_task,
)
from tasks.results.storage import experiment_prefix
from tasks.training.sweep import (
    log_sweep_metrics_task,
    seed_dir,
    sweep_markdown,
    sweep_summary_task,
)
from tasks.training.train import train_task


def _experiment_name() -> str:
    """The experiment a flow run is for, from its parameters (Prefect's runtime context)."""
    from prefect.runtime import flow_run

    given = flow_run.parameters
    p = given.get("params") or getattr(given.get("plan"), "params", None)
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


def in_process(params: Params) -> bool:
    """The grid's cells run in this process (``runtime.task_runner: thread``): they take the
    plan's data, partition and models instead of reading and building their own."""
    return params.runtime.task_runner == "thread"


def _inputs(plan: RunPlan, cell: ResolvedCell) -> dict[str, Any]:
    """What a cell gets from the plan when it runs in this process (else nothing: a worker
    reads and builds its own)."""
    if not in_process(plan.params):
        return {}
    return {"data": plan.data, "part": plan.partition, "model": plan.model_source(cell)}


def on_runner(cell: ResolvedCell) -> ResolvedCell:
    """``cell`` with the params its task runs with on the grid's runner (``cell_params``)."""
    return dataclasses.replace(cell, params=cell_params(cell.params))


@flow(name="fedapt-train-grid", flow_run_name=grid_run_name)
def train_grid_flow(
    plan: Any,
    partition_dir: str,
    runs_dir: str,
    parent_run_id: str | None = None,
    checkpoint_dir: str | None = None,
    run_origin: Origin | None = None,
) -> list[dict[str, Any]]:
    """One training task per (algorithm, adapter, codec) cell of ``plan`` (the run's
    ``RunPlan``: its resolved cells, and its data, partition and models for in-process
    cells), on the configured task runner."""
    params, cells = plan.params, plan.cells
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
                on_runner(cell),
                partition_dir,
                runs_dir,
                parent_run_id,
                checkpoint_dir,
                run_origin=run_origin,
                slot=slot,
                **_inputs(plan, cell),
            )
            for cell, slot in zip(cells, slots, strict=True)
        ]
    records = [f.result() for f in futures]  # in grid order, whatever order they finish in
    end_grid(slots)
    return records


@flow(name="fedapt-train-sweep", flow_run_name=grid_run_name)
def train_sweep_flow(
    plan: Any,
    partition_dirs: list[str],
    experiment_dir: str,
    parent_run_id: str | None = None,
    run_origin: Origin | None = None,
) -> list[list[dict[str, Any]]]:
    """A seed sweep's grid: one training task per (seed, cell) of ``plan`` (the sweep's
    ``RunPlan``, one per seed in ``plan.seeds``), all on the configured task runner; seed
    ``s`` (``partition_dirs`` in the order of ``experiment.seeds``) writes under
    ``seed-<s>/runs`` and ``seed-<s>/checkpoints``. Returns the records per seed, in grid
    order, whatever order they finish in."""
    params = plan.params
    seeds = params.experiment.seeds or ()
    folders = [
        seed_dir(experiment_dir, s) / "checkpoints" for s in seeds for _ in grid_cells(params)
    ]
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
        for seed, part_dir, sp in zip(seeds, partition_dirs, plan.seeds, strict=True):
            out = seed_dir(experiment_dir, seed)
            futures.append(
                [
                    train_task.submit(
                        on_runner(cell),
                        part_dir,
                        str(out / "runs"),
                        parent_run_id,
                        str(out / "checkpoints"),
                        run_origin,
                        slot=next(slot),
                        **_inputs(sp, cell),
                    )
                    for cell in sp.cells
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
    plan: Any = None,
) -> list[dict[str, Any]]:
    """Run the experiment grid of params.yaml (or of ``params``) and write its summary.

    Parameters are typed once (``tasks.config``): a deployment's JSON ``params`` become a
    ``Params`` through Prefect's validation, and every task receives that object.
    ``overrides``: applied to ``params_file``, or (with ``params``) the overrides ``params``
    were made with, recorded as the run's origin; ``entry``: what started it (``run``,
    ``reproduce``; a deployment's runs are told by Prefect's runtime). ``plan``: the
    ``RunPlan`` that ``flows.plan.prepare`` made of ``params`` before the flow started
    (``fedapt run``); without one (a deployment's run, ``fedapt reproduce``) the flow
    prepares its own once the run's services are up."""
    mask_streams()  # a deployment's run: what it prints is masked as `fedapt run`'s is
    p = params if params is not None else load_params(params_file, overrides)
    p = in_force(p, "native")  # a deployment's run starts here (auto: native, as fedapt run)
    deployment, flow_run_id = prefect_run()
    run_origin = origin(
        "deployment" if deployment else entry,
        p,
        params_file,
        overrides or (),
        deployment=deployment,
        flow_run_id=flow_run_id,
    )
    tags = run_origin.tags()  # the MLflow tags of the run's origin
    # Deployment runs get the same environment as `fedapt run`: the services that are up,
    # else an embedded S3 for the outputs (a no-op when the CLI already set it up); and the
    # experiment directory's lock (re-entrant: `fedapt run` already holds it). MLflow runs
    # still open when the flow fails are ended FAILED (KILLED on SIGINT/SIGTERM).
    with (
        services.run_lock(experiment_dir(p), "flow run of fedapt-experiment"),
        services.run_environment(need_s3=bool(p.storage.bucket)),
        tracking.ended_on_error(),
        local_ray(p),  # a Ray of the run's own: token authentication, on 127.0.0.1
    ):
        if plan is None:  # (reproduce reruns its own experiments on a new config)
            plan = prepare(p, partition_dir, results=entry != "reproduce")
        out = experiment_dir(p)
        parent = (
            start_tracking_task(p.experiment.name, p.flat(), tags) if p.runtime.tracking else None
        )
        if p.experiment.seeds is not None:
            return run_sweep(p, out, parent, run_origin, plan)
        # (the flow's own tasks run in this process: they take the plan's data and draw)
        part_dir = partition_dir or partition_task(
            p, str(out / "partition"), plan.data, plan.partition
        )
        # stops before training; a given partition is an input, never written to: its report
        # goes to the experiment's own folder
        report = str(out / "validation.json") if partition_dir else None
        validate_task(part_dir, plan.num_classes, p.validation.min_shard_size, report)
        if p.model.base == "pretrain":  # the frozen base, trained once and reused (cached)
            base = pretrain_task(p, str(out / "pretrain"), plan.data)  # where the cells read it
            if parent is not None:
                log_base_task(parent, base)
        grid = train_grid_flow.with_options(task_runner=grid_task_runner(p))
        checkpoints = out / "checkpoints"  # a rerun after a crash resumes from these
        records = grid(plan, part_dir, str(out / "runs"), parent, str(checkpoints), run_origin)
        summary_task(p, quote(records), str(out / "summary.json"), str(out / "runs"), run_origin)
        # the flow run's Artifacts tab
        results_artifact_task(p.experiment.name, quote(records), runs_dir=str(out / "runs"))
        if parent is not None:
            log_results_task(parent, str(out))
        shutil.rmtree(checkpoints, ignore_errors=True)  # the grid is done: nothing to resume
        if p.storage.bucket:
            prefix = experiment_prefix(p.storage.prefix, p.experiment.name)
            upload_task(str(out), p.storage.bucket, prefix)
        if parent is not None:
            end_tracking_task(parent)
    return records


def run_sweep(
    p: Params, out: Path, parent: str | None, run_origin: Origin | None, plan: RunPlan
) -> list[dict[str, Any]]:
    """The flow's body for a seed sweep: each seed's partition (validated) and pretrain base
    before any training, then every (seed, cell), each seed's own outputs (its summary,
    results, comm_cost) under seed-<s>/, and the sweep's summary and results (mean ± std)
    in the experiment directory. Returns the records, seed by seed, in grid order."""
    seeds = list(p.experiment.seeds or ())
    part_dirs: list[str] = []
    for seed, sp in zip(seeds, plan.seeds, strict=True):  # sp.params: the seed's own params
        sd = seed_dir(out, seed)
        part_dirs.append(partition_task(sp.params, str(sd / "partition"), sp.data, sp.partition))
        validate_task(part_dirs[-1], plan.num_classes, p.validation.min_shard_size)
        if p.model.base == "pretrain":  # each seed's own base (its subset, its init)
            base = pretrain_task(sp.params, str(sd / "pretrain"), sp.data)  # its cells read it
            if parent is not None:
                log_base_task(parent, base, f"seed-{seed}/pretrain")
    grid = train_sweep_flow.with_options(task_runner=grid_task_runner(p))
    by_seed = grid(plan, part_dirs, str(out), parent, run_origin)
    for seed, sp, records in zip(seeds, plan.seeds, by_seed, strict=True):
        sd = seed_dir(out, seed)
        summary_task(
            sp.params, quote(records), str(sd / "summary.json"), str(sd / "runs"), run_origin
        )
    records = [r for per_seed in by_seed for r in per_seed]
    cells = sweep_summary_task(p, quote(records), str(out), run_origin)
    results_artifact_task(p.experiment.name, quote(records), sweep_markdown(p, cells))
    if parent is not None:
        log_sweep_metrics_task(parent, cells)
        log_results_task(parent, str(out), seeds)
    for seed in seeds:  # the sweep is done: nothing to resume
        shutil.rmtree(seed_dir(out, seed) / "checkpoints", ignore_errors=True)
    if p.storage.bucket:
        prefix = experiment_prefix(p.storage.prefix, p.experiment.name)
        upload_task(str(out), p.storage.bucket, prefix)
    if parent is not None:
        end_tracking_task(parent)
    return records
