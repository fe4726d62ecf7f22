"""Seed sweeps (``experiment.seeds``): every grid cell trained once per seed, reported as the
mean and sample standard deviation over the seeds (seed 000 §IV: "each experiment is run for
five different random seeds and the mean and standard deviation of these runs are shown on
Tables I and II").

Each seed is a whole single-seed run of its own: ``seed_params`` is the experiment with
``experiment.seed`` set to the seed, so the train/test subsets, the partition, the pretrain
base, the model's initialisation and every client's draws follow from it, and
``reports/<experiment>/seed-<s>/`` holds exactly what ``fedapt run`` with that seed alone
writes under ``reports/<experiment>/`` (partition, runs, summary, results, comm_cost). The
experiment directory itself gets the sweep's summary.json and results.md.

The standard deviation is the sample one (ddof=1, the usual ± over independent runs; seed 000
does not say which); with one seed it is null. A value a run does not have (no evaluation) is left out of its
cell's mean and std, and ``n`` says how many seeds entered them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from prefect import task
from prefect.cache_policies import NO_CACHE

from fedcore.payload import mib
from tasks.config import Params
from tasks.grid import grid_cells, record_cell
from tasks.io import atomic_write_json, atomic_write_text

if TYPE_CHECKING:
    from tasks.results.origin import Origin

STD = "sample standard deviation over the seeds (ddof=1); null with one seed"

# what each cell reports as mean ± std: the record's key, or a function of the record
_METRICS: dict[str, Any] = {
    "final_accuracy": "final_accuracy",
    "mean_accuracy_last_L": "mean_accuracy_last_L",
    "upload_mib": lambda r: mib(r["upload_bytes"]),
    "download_mib": lambda r: mib(r["download_bytes"]),
    "total_mib": lambda r: mib(r["upload_bytes"] + r["download_bytes"]),
}


def seed_params(params: Params, seed: int) -> Params:
    """The single-seed experiment of one seed of a sweep (``experiment.seeds`` unset)."""
    experiment = params.experiment.model_copy(update={"seed": seed, "seeds": None})
    return params.model_copy(update={"experiment": experiment})


def seed_dir(experiment_dir: str | Path, seed: int) -> Path:
    """Where a sweep's seed writes what a single-seed run writes in the experiment dir."""
    return Path(experiment_dir) / f"seed-{seed}"


def stat(values: Sequence[float | None]) -> dict[str, Any]:
    """Mean, sample std (ddof=1) and n of the finite values; ``values`` as given (per seed)."""
    ok = [float(v) for v in values if v is not None and math.isfinite(v)]
    return {
        "mean": float(np.mean(ok)) if ok else None,
        "std": float(np.std(ok, ddof=1)) if len(ok) > 1 else None,
        "n": len(ok),
        "values": list(values),
    }


def cell_stats(params: Params, records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per grid cell (in grid order): its seeds and each metric's mean, std, n and per-seed
    values (in seed order, whatever order the runs finished in)."""
    out = []
    for spec in grid_cells(params):
        runs = sorted((r for r in records if record_cell(r) == spec.name), key=lambda r: r["seed"])
        if not runs:
            continue
        cell: dict[str, Any] = {
            "cell": spec.name,
            "algorithm": spec.algorithm,
            "adapter": spec.adapter,
            **({} if spec.codec == "none" else {"codec": spec.codec}),
            "partition": runs[0]["partition"],
            "seeds": [r["seed"] for r in runs],
            "rounds": [r["rounds"] for r in runs],
            "last_rounds_L": runs[0]["last_rounds_L"],
            "diverged_at_round": [r.get("diverged_at_round") for r in runs],
        }
        for name, get in _METRICS.items():
            cell[name] = stat([r.get(get) if isinstance(get, str) else get(r) for r in runs])
        out.append(cell)
    return out


def write_sweep_summary(
    params: Params,
    records: Sequence[dict[str, Any]],
    out_dir: str | Path,
    origin: Origin | None = None,
) -> list[Path]:
    """summary.json (the per-seed records, in seed then grid order, and each cell's mean ±
    std) and results.md, in the experiment directory."""
    out = Path(out_dir)
    runs = sorted(records, key=lambda r: r["seed"])  # stable: grid order within a seed
    cells = cell_stats(params, runs)
    summary = {
        "experiment": params.experiment.name,
        "params": params.flat(),
        "seeds": list(params.experiment.seeds or ()),
        "std": STD,
        "cells": cells,
        "runs": runs,
    }
    if origin is not None:  # how the run was started (tasks.results.origin)
        summary["origin"] = origin.record()
    return [
        atomic_write_json(out / "summary.json", summary),
        atomic_write_text(out / "results.md", sweep_markdown(params, cells)),
    ]


def mean_std(s: dict[str, Any], scale: float = 1.0, digits: int = 2) -> str:
    """``mean ± std`` (``mean`` alone with one value, ``-`` with none)."""
    if s["mean"] is None:
        return "-"
    text = f"{scale * s['mean']:.{digits}f}"
    return text if s["std"] is None else f"{text} ± {scale * s['std']:.{digits}f}"


def with_n(s: dict[str, Any], scale: float = 1.0, **extra: Any) -> str:
    """``mean ± std (n seeds)``; ``extra`` adds ``, key=value`` inside the parentheses."""
    n = s["n"]
    more = "".join(f", {k}={v}" for k, v in extra.items())
    return f"{mean_std(s, scale)} ({n} seed{'s' if n != 1 else ''}{more})" if n else "-"


def rounds_text(rounds: Sequence[int]) -> str:
    return str(rounds[0]) if len(set(rounds)) == 1 else f"{min(rounds)}-{max(rounds)}"


def diverged_text(cell: dict[str, Any]) -> str:
    """``<round> (seed <seed>)`` of each seed that diverged, ``-`` when none did."""
    pairs = zip(cell["seeds"], cell["diverged_at_round"], strict=True)
    hits = [f"{r} (seed {s})" for s, r in pairs if r]
    return ", ".join(hits) or "-"


def sweep_markdown(params: Params, cells: Sequence[dict[str, Any]]) -> str:
    """The sweep's results table: per cell, ``mean ± std (n seeds)`` of the accuracies (in %)
    and mean ± std of the traffic (MiB, 2**20 bytes)."""
    seeds = ", ".join(map(str, params.experiment.seeds or ()))
    rows = [
        f"# Results: {params.experiment.name}",
        "",
        f"Mean ± sample standard deviation (ddof=1) over seeds {seeds}; each seed's own "
        "results are in seed-<seed>/results.md.",
        "",
        "| cell | partition | rounds | final acc % | mean acc last L % | up MiB | down MiB "
        "| diverged at |",
        "|---|---|--:|--:|--:|--:|--:|--:|",
    ]
    for c in cells:
        rows.append(
            f"| {c['cell']} | {c['partition']} | {rounds_text(c['rounds'])} "
            f"| {with_n(c['final_accuracy'], 100)} "
            f"| {with_n(c['mean_accuracy_last_L'], 100, L=c['last_rounds_L'])} "
            f"| {mean_std(c['upload_mib'])} | {mean_std(c['download_mib'])} "
            f"| {diverged_text(c)} |"
        )
    return "\n".join(rows) + "\n"


def parent_metrics(cells: Sequence[dict[str, Any]]) -> dict[str, float]:
    """The experiment run's MLflow metrics: ``<cell>/<metric>_mean``, ``_std`` and
    ``<cell>/n_seeds``."""
    out: dict[str, float] = {}
    for c in cells:
        out[f"{c['cell']}/n_seeds"] = float(len(c["seeds"]))
        for name in _METRICS:
            for key in ("mean", "std"):
                if c[name][key] is not None:
                    out[f"{c['cell']}/{name}_{key}"] = c[name][key]
    return out


@task(name="sweep-summary", cache_policy=NO_CACHE)
def sweep_summary_task(
    params: Params, records: list[dict[str, Any]], out_dir: str, origin: Origin | None = None
) -> list[dict[str, Any]]:
    """Write the sweep's summary.json and results.md; returns the per-cell statistics."""
    write_sweep_summary(params, records, out_dir, origin)
    return cell_stats(params, records)


@task(name="log-sweep-metrics", retries=2, retry_delay_seconds=2, cache_policy=NO_CACHE)
def log_sweep_metrics_task(run_id: str, cells: list[dict[str, Any]]) -> None:
    """Each cell's mean and std over the seeds as metrics of the experiment's MLflow run."""
    from tasks import tracking

    tracking.log_metrics(run_id, parent_metrics(cells))
