"""The run summary: one record per grid cell, written atomically."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from fedcore.errors import ConfigError
from tasks import tracking
from tasks.config import Params
from tasks.grid import CellSpec, cell_folder, grid_cells, record_cell
from tasks.io import atomic_write_json, atomic_write_text
from tasks.results import artifacts, figures, storage

if TYPE_CHECKING:
    from tasks.results.origin import Origin


def write_summary(
    params: Params, records: list[dict[str, Any]], path: str, origin: Origin | None = None
) -> str:
    """summary.json: the params, one record per cell and, for a flow run, its ``origin``
    (entry, overrides, deployment, flow run: ``tasks.results.origin``; not in the DVC report)."""
    summary: dict[str, Any] = {"experiment": params.experiment.name, "params": params.flat()}
    if origin is not None:
        summary["origin"] = origin.record()
    atomic_write_json(path, {**summary, "runs": records})
    return path


def cells(params: Params) -> list[str]:
    return [spec.name for spec in grid_cells(params)]


def report_baseline(params: Params) -> str:
    """The grid cell the savings are measured against: report.baseline, else FedAvg's first
    cell, else the grid's first cell."""
    grid = cells(params)
    want = params.report.baseline
    if want is not None:
        if want not in grid:
            raise ConfigError(
                f"report.baseline {want!r} is not a grid cell; cells: {', '.join(grid)}"
            )
        return want
    return next((c for c in grid if c.startswith("fedavg-")), grid[0])


def cell_records(
    params: Params, runs_dir: str | Path, folder: Callable[[CellSpec], str] = cell_folder
) -> dict[str, dict[str, Any]]:
    """Each grid cell's metrics.json record (with its per-round list), in grid order, from
    ``runs_dir/<folder(cell)>``: the numbers every figure and table of the report shows. A
    cell without one is an error, never a gap."""
    import json

    out = {}
    for spec in grid_cells(params):
        path = Path(runs_dir) / folder(spec) / "metrics.json"
        if not path.is_file():
            raise ConfigError(f"no metrics for grid cell {spec.name}: {path}")
        out[spec.name] = json.loads(path.read_text())
    return out


def acc_window(params: Params, records: dict[str, dict[str, Any]]) -> int:
    """The comm-cost table's ACC window: report.window capped by the most rounds a cell
    evaluated (the same ACC at every round: a window longer than the rounds averages them
    all), so that its label says what was averaged; 1 under report.accuracy: round."""
    if params.report.accuracy != "mean":
        return 1
    evaluated = [
        sum(r.get("accuracy") is not None for r in rec["rounds"]) for rec in records.values()
    ]
    return max(1, min(params.report.window, max(evaluated, default=1)))


def write_comm_cost(
    params: Params,
    runs_dir: str | Path,
    out_dir: str | Path,
    folder: Callable[[CellSpec], str] = cell_folder,
) -> list[Path]:
    """comm_cost.json + comm_cost.md for the grid: cumulative MiB (upload, download, both) to
    first reach each accuracy level, savings against the baseline cell, the MiB to reach the
    target with each cell's final accuracy and mean of the last L evaluated rounds (its
    metrics.json numbers), and per-round traffic by phase for runs that freeze layers
    (FedNILO). Reads each cell's metrics.json (``runs_dir/<folder(cell)>``: a run's and the
    DVC pipeline's folders are the cells' names)."""
    from fedcore.commcost import (
        comm_cost_markdown,
        comm_cost_report,
        direction_markdown,
        phase_markdown,
        phase_report,
        target_report,
    )

    records = cell_records(params, runs_dir, folder)
    runs = {name: r["rounds"] for name, r in records.items()}
    base = report_baseline(params)
    levels = list(params.report.accuracy_levels)
    window = acc_window(params, records)
    rep = comm_cost_report(
        runs, levels, baseline=base, accuracy=params.report.accuracy, window=window
    )
    # One definition of each number: the end of a run is its final accuracy and the mean of
    # its last L evaluated rounds (metrics.json), never the level table's running ACC.
    for name, final in rep["final"].items():
        final.pop("final_acc", None)
        final.update(named_numbers(records[name]))
    phases = phase_report(runs, base)
    target = target_report(rep)
    for name, row in target["runs"].items():
        row.pop("final_acc", None)
        row.update(named_numbers(records[name]))
    columns = {s.name: {"adapter": s.adapter, "codec": s.codec} for s in grid_cells(params)}
    out = Path(out_dir)
    md = [
        f"# Communication cost: {params.experiment.name}",
        "",
        f"Cumulative MiB (upload + download) to first reach each test accuracy; baseline {base}"
        + (
            f"; accuracy (ACC): mean of the last {window} evaluated rounds up to each round"
            + (
                f" (report.window {params.report.window}, capped at the {window} rounds evaluated)."
                if window < params.report.window
                else "."
            )
            if params.report.accuracy == "mean"
            else "; accuracy: the round's own."
        ),
        "",
        comm_cost_markdown(rep, style=params.report.style),
        "Upload and download apart:",
        "",
        direction_markdown(rep),
        target_markdown(target, base, columns),
        phase_markdown(phases, base),
    ]
    return [
        atomic_write_json(out / "comm_cost.json", {**rep, "phases": phases, "target": target}),
        atomic_write_text(out / "comm_cost.md", "\n".join(md)),
    ]


def named_numbers(record: dict[str, Any]) -> dict[str, Any]:
    """A cell's end-of-run numbers as its metrics.json names them, L capped by the rounds
    it evaluated (``figures.last_l``)."""
    return {
        figures.FINAL: record["final_accuracy"],
        figures.MEAN_LAST: record["mean_accuracy_last_L"],
        "last_rounds_L": figures.last_l(record),
    }


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f}"


def mean_last_cell(numbers: dict[str, Any]) -> str:
    """The mean of the last L evaluated rounds with its L beside it: "83.03 (L=5)"."""
    return f"{pct(numbers[figures.MEAN_LAST])} (L={numbers['last_rounds_L']})"


def target_markdown(
    target: dict[str, Any], baseline: str, columns: dict[str, dict[str, str]]
) -> str:
    """The target table (``fedcore.commcost.target_report``, its runs given
    :func:`named_numbers`): per run its ``columns`` (adapter, codec), the MiB up, down and in
    all to first reach the target, the saving, and its final accuracy and mean of the last L
    evaluated rounds, as results.md shows them."""
    from fedcore.commcost import NOT_REACHED

    level = target["target"]
    if level is None:
        return f"The baseline {baseline} reaches none of the accuracy levels: no target.\n"
    keys = sorted({k for c in columns.values() for k in c}, key=["adapter", "codec"].index)
    head = ["run", *keys, "up MiB", "down MiB", "MiB to target", "saving", "final acc %",
            "mean acc last L %"]  # fmt: skip
    lines = [
        f"MiB to reach the target, {100 * level:.1f}% (the highest level {baseline} reaches):",
        "",
        "| " + " | ".join(head) + " |",
        "|---|" + "---|" * len(keys) + "--:|" * 6,
    ]

    def num(x: float | None, fmt: str) -> str:
        return NOT_REACHED if x is None else format(x, fmt)

    for name, r in target["runs"].items():
        if name == baseline:
            saving = "-"
        else:
            saving = num(r["saving"] and 100 * r["saving"], ".1f")
            saving += "%" if r["saving"] is not None else ""
        row = [name, *(columns.get(name, {}).get(k, "") for k in keys)]
        row += [num(r["upload_mib"], ".2f"), num(r["download_mib"], ".2f"), num(r["mib"], ".2f")]
        row += [saving, pct(r[figures.FINAL]), mean_last_cell(r)]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


# Timings (every key train.py keeps out of metrics.json, plus per-round lists) and the
# process a cell ran in: not hashed.
_NOT_EXACT = (
    "provenance",  # the CPU that ran it: artifacts/timing/<cell>.json, not the hashed report
    "wall_seconds",
    "process_seconds",
    "round_seconds",
    "rounds",
    "local_train_seconds_mean",
    "local_train_seconds_per_round",
    "pid",
    "process_name",
)


def write_report(
    params: Params, records: list[dict[str, Any]], out_dir: str | Path, runs_dir: str | Path
) -> list[Path]:
    """The DVC report stage: summary.json without timings or per-round lists, so a rerun
    with the same params and seed writes the same bytes, and the communication-cost report."""
    report_baseline(params)  # a baseline outside the grid: one line before any file is written
    out = Path(out_dir)
    exact = [{k: v for k, v in r.items() if k not in _NOT_EXACT} for r in records]
    summary = Path(write_summary(params, exact, str(out / "summary.json")))
    results = atomic_write_text(
        out / "results.md", results_markdown(params.experiment.name, records)
    )
    figs = write_grid_figures(params, runs_dir, out)
    return [summary, results, *figs, *write_comm_cost(params, runs_dir, out)]


def results_markdown(
    experiment: str, records: list[dict[str, Any]], links: dict[str, str] | None = None
) -> str:
    """The results table as Markdown (results.md, the Prefect results artifact): one row per
    cell, accuracy in %, traffic in MiB (2**20 bytes); ``links``: cell -> its MLflow run.
    ``records``: the cells' metrics.json records (:func:`with_rounds` gives a run's records
    their per-round lists), whose L is capped by the rounds each evaluated."""
    from fedcore.payload import mib

    rows = [
        f"# Results: {experiment}",
        "",
        "| cell | partition | rounds | final acc % | mean acc last L % | up MiB | down MiB "
        "| up MiB/round | diverged at |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for r in records:
        cell = record_cell(r)
        name = f"[{cell}]({links[cell]})" if links and cell in links else cell
        rows.append(
            f"| {name} | {r['partition']} | {len(r['rounds'])} | {pct(r['final_accuracy'])} "
            f"| {mean_last_cell(named_numbers(r))} "
            f"| {mib(r['upload_bytes']):.2f} | {mib(r['download_bytes']):.2f} "
            f"| {mib(r['upload_bytes_per_round']):.2f} | {r.get('diverged_at_round') or '-'} |"
        )
    return "\n".join(rows) + "\n"


def with_rounds(records: list[dict[str, Any]], runs_dir: str | Path) -> list[dict[str, Any]]:
    """A run's records (``rounds``: their count) with each cell's per-round list from its
    ``runs_dir/<cell>/metrics.json``, as the DVC report stage reads them."""
    import json

    out = []
    for r in records:
        if isinstance(r["rounds"], int):
            path = Path(runs_dir) / record_cell(r) / "metrics.json"
            r = {**r, "rounds": json.loads(path.read_text())["rounds"]}
        out.append(r)
    return out


def pareto_metric(params: Params) -> str:
    """The accuracy pareto_front.png draws: the mean of the last L evaluated rounds under
    report.accuracy: mean (seed 004's ACC), the final accuracy under report.accuracy: round."""
    return figures.MEAN_LAST if params.report.accuracy == "mean" else figures.FINAL


def write_grid_figures(
    params: Params,
    runs_dir: str | Path,
    out_dir: str | Path,
    folder: Callable[[CellSpec], str] = cell_folder,
) -> list[Path]:
    """accuracy_vs_mib.png, every cell's accuracy against cumulative MiB, and
    pareto_front.png, each cell's accuracy (:func:`pareto_metric`) against its total MiB with
    the cells no other beats on both (from each cell's metrics.json), each with a JSON of the
    numbers it draws beside it."""
    records = cell_records(params, runs_dir, folder)
    specs = {s.name: s for s in grid_cells(params)}
    return [
        *figures.write_grid_figure(
            {name: r["rounds"] for name, r in records.items()}, out_dir, params.experiment.name
        ),
        *figures.write_pareto_front(
            {name: (specs[name].adapter, specs[name].codec, r) for name, r in records.items()},
            out_dir,
            params.experiment.name,
            pareto_metric(params),
        ),
    ]


@task(name="summary", cache_policy=NO_CACHE)
def summary_task(
    params: Params,
    records: list[dict[str, Any]],
    path: str,
    runs_dir: str,
    origin: Origin | None = None,
) -> list[str]:
    """Write summary.json, results.md, the grid's accuracy-vs-MiB figure and the
    communication-cost report (comm_cost.md/.json) beside it. (``records``: from the grid's
    subflow, passed ``quote``d; Prefect's UI cannot show a ``flow_run`` input.)"""
    out = Path(path).parent
    summary = write_summary(params, records, path, origin)
    results = atomic_write_text(
        out / "results.md",
        results_markdown(params.experiment.name, with_rounds(records, runs_dir)),
    )
    figs = write_grid_figures(params, runs_dir, out)
    cost = write_comm_cost(params, runs_dir, out)
    return [summary, *map(str, (results, *figs, *cost))]


@task(name="log-results", retries=2, retry_delay_seconds=2, cache_policy=NO_CACHE)
def log_results_task(run_id: str, experiment_dir: str, seeds: list[int] | None = None) -> None:
    """The summary, results.md, comm_cost.md/.json and the grid figure into the parent run
    (a seed sweep's: also each seed's, under seed-<s>/)."""
    artifacts.log_experiment(run_id, experiment_dir, seeds)


@task(name="results-artifact", cache_policy=NO_CACHE)
def results_artifact_task(
    experiment: str,
    records: list[dict[str, Any]],
    markdown: str | None = None,
    runs_dir: str | None = None,
) -> None:
    """The results table as a Prefect markdown artifact of the flow run, each cell linked to
    its MLflow run when a tracking server is in use, and a link to the MLflow Runs table of
    the cells (``markdown``: this table instead, a seed sweep's mean ± std; ``runs_dir``: the
    cells' folders, their per-round lists)."""
    from prefect.artifacts import create_markdown_artifact

    tracked = any("mlflow_run_id" in r for r in records)
    if markdown is None:
        links = artifacts.run_links(records) if tracked else {}
        if runs_dir is not None:
            records = with_rounds(records, runs_dir)
        markdown = results_markdown(experiment, records, links)
    table = artifacts.runs_table_link(records) if tracked else None
    if table:
        markdown += f"\n[Compare the cells in MLflow (Runs table)]({table})\n"
    create_markdown_artifact(
        markdown,
        key=artifact_key(experiment),
        description=f"fedapt results of {experiment}",
    )


def artifact_key(experiment: str) -> str:
    """A Prefect artifact key (lowercase letters, digits, dashes) for the experiment."""
    key = "".join(c if c.isalnum() else "-" for c in experiment.lower()).strip("-")
    return f"fedapt-{key or 'results'}"


@task(name="start-tracking", retries=2, retry_delay_seconds=2, cache_policy=NO_CACHE)
def start_tracking_task(
    experiment: str, flat_params: dict[str, Any], tags: dict[str, str] | None = None
) -> str:
    """Open the experiment's parent MLflow run (``tags``: the run's origin); returns its id."""
    return tracking.start_experiment_run(experiment, flat_params, tags=tags)


@task(name="end-tracking", retries=2, retry_delay_seconds=2, cache_policy=NO_CACHE)
def end_tracking_task(run_id: str) -> None:
    """Close the parent MLflow run."""
    tracking.end_run(run_id)


@task(name="upload-artifacts", retries=2, retry_delay_seconds=3, cache_policy=NO_CACHE)
def upload_task(local_dir: str, bucket: str, prefix: str) -> list[str]:
    """Copy the experiment's outputs to s3://bucket/prefix/ (boto3)."""
    return storage.upload_tree(local_dir, bucket, prefix)
