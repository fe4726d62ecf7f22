"""A run resolved once: ``prepare(params) -> RunPlan``, then the flow runs what was resolved.

``prepare`` checks every input a run would reject (names, the grid's cells against their
algorithms, GPUs, the report's baseline, writable folders, the tracking and S3 servers, the
data, every adapter on the model, the pretrain source, the partition (every rule of the
flow's shard validation: ``flows.checks``), other params' results, the checkpoints of a rerun
(their configuration, then every tensor against the cell's model)) and keeps what it computed on the way: the experiment's data,
its partition (drawn, or read from ``--partition`` and checked) and, per grid cell, a
``CellSpec`` and the cell's initial model. Each check runs once: ``fedapt run``, a DVC train
stage and ``fedapt reproduce`` prepare before a server starts; a deployment's flow run
prepares when it starts. The flow then writes the plan's partition (no second draw) and
hands each cell its data, partition and initial model (in this process: one backbone build
per cell; a Dask or Ray worker builds its own and reads the data from disk).
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from torch import nn

from fedcore.datasets import get_dataset_info
from fedcore.errors import ConfigError
from fedcore.partition import Partition
from flows.checks import check_checkpoints, check_drawn_partition, given_partition
from flows.runners import check_dask_address
from tasks.config import Params, experiment_dir
from tasks.data.experiment import ExperimentData, load_experiment_data
from tasks.data.partitioning import build_partition
from tasks.data.pretrain import check_source
from tasks.grid import CellSpec, ResolvedCell, grid_cells
from tasks.io import check_writable
from tasks.results.origin import check_results
from tasks.results.report import report_baseline
from tasks.results.storage import ensure_bucket
from tasks.tracking import check_tracking_server
from tasks.training.cell import check_cell, initial_cell_model, initial_models, resolve_cells
from tasks.training.runtime import check_runtime
from tasks.training.sweep import seed_dir, seed_params


class RunPlan:
    """What ``prepare`` resolved for one experiment (or, for a seed sweep, one plan per seed
    in ``seeds``): its data, partition, resolved cells (``tasks.grid.ResolvedCell``, what
    each training task carries) and the cells' initial models. Not a dataclass on purpose:
    Prefect records a flow's parameters as JSON and would deep-copy a dataclass's tensors to
    do so; this one it records as a placeholder."""

    __slots__ = ("params", "data", "partition", "cells", "resuming", "seeds", "_models",
                 "_pending")  # fmt: skip

    def __init__(
        self,
        params: Params,
        data: ExperimentData | None,
        partition: Partition | None,
        cells: tuple[ResolvedCell, ...],
        resuming: list[str],
        seeds: tuple[RunPlan, ...] = (),
        models: dict[str, nn.Module] | None = None,
    ) -> None:
        self.params, self.data, self.partition = params, data, partition
        self.cells, self.resuming, self.seeds = cells, resuming, seeds
        self._models = models or {}
        self._pending = Counter(c.adapter for c in cells)  # cells still to take each model

    def __repr__(self) -> str:
        return f"RunPlan({self.params.experiment.name!r}, cells={[c.name for c in self.cells]})"

    @property
    def num_classes(self) -> int:
        """The experiment's number of classes (a decoder's vocabulary for next-token data),
        read off its data (a sweep's: the first seed's; every seed's is the same)."""
        data = self.data if self.data is not None else self.seeds[0].data
        assert data is not None
        return data.num_classes

    def cell(self, spec: CellSpec) -> ResolvedCell:
        """The resolved cell of ``spec`` (a DVC train stage's one cell)."""
        return next(c for c in self.cells if c.spec == spec)

    def take_model(self, cell: ResolvedCell) -> nn.Module | None:
        """The cell's initial model, built by ``prepare`` (None: the cell builds it, e.g. on a
        pretrain base written after ``prepare``). The adapter's last cell takes the model
        itself, earlier ones a copy: no cell trains another's."""
        model = self._models.get(cell.adapter)
        if model is None:
            return None
        self._pending[cell.adapter] -= 1
        if self._pending[cell.adapter] > 0:
            return copy.deepcopy(model)
        return self._models.pop(cell.adapter)

    def model_source(self, cell: ResolvedCell) -> Callable[[], nn.Module | None]:
        """``take_model`` deferred to when the cell starts (a model per cell in memory at a
        time, not the whole grid's)."""
        return lambda: self.take_model(cell)


def check_names(params: Params) -> None:
    """What needs no data and that parsing ``params`` could not check: the dataset's name,
    each grid cell against its algorithm's rules (its ``check`` hook), the device, the GPUs
    and the ``RAY_AUTH_MODE`` of a local Ray and the report's baseline. (Names and options of models, algorithms,
    adapters and partition schemes were typed by ``tasks.config``.)"""
    get_dataset_info(params.data.dataset)
    for spec in grid_cells(params):
        check_cell(params, spec.algorithm, spec.adapter)  # the algorithm's own rules
    check_runtime(params)  # the device, Ray's address and GPUs, a run's own Ray
    check_dask_address(params)  # runtime.task_runner: dask on a cluster that answers
    report_baseline(params)  # a baseline cell outside the grid -> the cells there are


def check_sweep(params: Params, partition_dir: str | Path | None) -> None:
    """A seed sweep draws each seed's partition itself: a given partition is refused."""
    if params.experiment.seeds is not None and partition_dir is not None:
        raise ConfigError(
            f"--partition {partition_dir}: a seed sweep (experiment.seeds "
            f"{list(params.experiment.seeds)}) draws a partition per seed; drop --partition, "
            "or set experiment.seeds=null to run experiment.seed on this partition"
        )


def check_inputs(params: Params, partition_dir: str | Path | None) -> None:
    """Every input check that needs no data and no server: a given partition for a seed
    sweep (``check_sweep``), then ``check_names``."""
    check_sweep(params, partition_dir)
    check_names(params)


def check_storage(params: Params, *, results: bool = True) -> None:
    """What ``prepare(storage=False)`` left for when S3 is up: the bucket (reachable, keys
    accepted, created if missing) and, with ``results``, no other params' results under the
    experiment there."""
    if params.storage.bucket:
        ensure_bucket(params.storage.bucket)
        if results:
            check_results(params, s3=True)


def prepare(
    params: Params,
    partition_dir: str | Path | None = None,
    *,
    storage: bool = True,
    results: bool = True,
    models: bool = True,
    checked: bool = False,
    checkpoints: Path | None = None,
    base: Path | None = None,
) -> RunPlan:
    """Check everything a run would reject (cheap: no training) and resolve the run.

    ``storage=False``: the DVC stages (their outputs go to the DVC remote, not to
    ``storage.bucket``: no S3 server needed). ``results=False``: skip the check that the
    experiment's folder holds no other params' finished results (``fedapt reproduce`` reruns
    its own experiments). ``models=False``: check every adapter on the model but keep no
    model (``fedapt reproduce`` checks every experiment before the first one runs).
    ``checked``: the caller ran ``check_inputs`` and ``check_writable`` on the experiment's
    folder already (before taking its lock and starting a server): each check runs once.
    ``checkpoints``, ``base``: where a DVC train stage keeps its cell's checkpoint and reads
    its pretrain base (default: the experiment's folder, as the flow).
    """
    out = experiment_dir(params)
    if not checked:
        check_inputs(params, partition_dir)
        check_writable("experiment.reports_dir", out)
    if params.runtime.tracking:
        check_tracking_server()
    if storage and params.storage.bucket:
        ensure_bucket(params.storage.bucket)  # unreachable S3 or bad keys -> one line now
    if params.experiment.seeds is None:
        plan = _resolve(params, partition_dir, out, models, checkpoints=checkpoints, base=base)
    else:  # a sweep: every seed's own data, draw, base and checkpoints
        plan = _resolve_sweep(params, out, models)
    if results:
        check_results(params, s3=storage and bool(params.storage.bucket))
    return plan


def _resolve_sweep(params: Params, out: Path, keep_models: bool) -> RunPlan:
    """A seed sweep's plan: one ``_resolve``d plan per seed (its own data, draw, base and
    checkpoints; the splits read and the adapters checked on the first seed)."""
    seeds: list[RunPlan] = []
    for s in params.experiment.seeds or ():
        seeds.append(_resolve(params, None, out, keep_models, seeds[0] if seeds else None, seed=s))
    resuming = [f"seed-{s.params.experiment.seed}/{c}" for s in seeds for c in s.resuming]
    return RunPlan(params, None, None, (), resuming, tuple(seeds))


def _resolve(
    params: Params,
    partition_dir: str | Path | None,
    out: Path,
    keep_models: bool,
    like: RunPlan | None = None,
    checkpoints: Path | None = None,
    base: Path | None = None,
    seed: int | None = None,
) -> RunPlan:
    """One experiment's (one seed's) data, models, cells, pretrain source, partition (drawn
    or given, checked as the flow's validation will) and checkpoints (their configuration,
    then their tensors against the cells' models). ``like``: the sweep's first seed's plan,
    whose splits and adapter checks this seed shares; ``seed``: this plan's seed in a sweep
    (``params`` and ``out`` are then the sweep's: the seed's own are derived here)."""
    if seed is not None:
        params, out = seed_params(params, seed), seed_dir(out, seed)
    data = load_experiment_data(params, like.data if like else None)  # missing data -> how
    pretrain = params.model.base == "pretrain"
    keep = keep_models and not pretrain  # a pretrain base is written by the flow, later
    if checkpoints is None:  # the flow's (a DVC train stage names its own)
        checkpoints, base = out / "checkpoints", out / "pretrain" / "base.pt"
    # Each adapter's initial model: an unknown model or option, an adapter that does not
    # apply -> one line now. Kept for the cells (one build per cell) where they can use it.
    built = (
        {a: initial_cell_model(params, data, a) for a in params.grid.adapters}
        if keep or like is None
        else {}
    )
    # each checkpoint's model (below): the plan's, else built when a checkpoint is there
    model_of = initial_models(params, data, built)
    cells = resolve_cells(params, built, base, seed, like.cells if like else ())
    if pretrain:
        check_source(params, data)  # no source rows left, classes out of range, no dataset
    if partition_dir is not None:
        part = given_partition(params, data, partition_dir)
    else:
        part = build_partition(params, data)  # bad partition options and values
        check_drawn_partition(params, data, part)  # what the flow's shard validation refuses
    # each checkpoint: for this configuration, and holding this cell's model
    resuming = check_checkpoints(cells, part.content_hash(), checkpoints, model_of)
    return RunPlan(params, data, part, cells, resuming, models=built if keep else None)
