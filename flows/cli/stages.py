"""The DVC pipeline's stage commands: ``fedapt prepare | partition | validate | pretrain |
train | report``.

Each stage reads params.yaml (the single configuration), writes only its declared outputs
(atomically) and calls the same library functions as the Prefect flow, so ``dvc repro`` and
``fedapt run`` compute the same numbers. Outputs that DVC hashes carry no timings.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from flows.cli.console import out
from flows.cli.guards import guarded
from flows.cli.params import ParamsOpt, SetOpt, load, output_path
from flows.cli.runguards import exit_if_diverged
from flows.cli.tables import results_table


@guarded
def prepare(
    params: ParamsOpt = None,
    set_: SetOpt = None,
    out_dir: Annotated[Path, typer.Option("--out", help="output folder")] = Path(
        "artifacts/prepare"
    ),
) -> None:
    """Load the dataset and write dataset.json: the rows used, label counts and sha256."""

    from tasks.data.experiment import dataset_card, load_experiment_data
    from tasks.io import atomic_write_json

    p = load(params, set_, numerics="portable")
    output_path("--out", out_dir)
    card = dataset_card(p, load_experiment_data(p))
    path = atomic_write_json(out_dir / "dataset.json", card)
    out.print(
        f"{card['dataset']}: {card['train']['rows_used']} train / "
        f"{card['test']['rows_used']} test rows, train sha256 {card['train']['sha256'][:12]}"
    )
    out.print(f"dataset card: {path}")


@guarded
def validate(
    params: ParamsOpt = None,
    set_: SetOpt = None,
    partition_dir: Annotated[
        Path, typer.Option("--partition", help="folder with manifest.csv + stats.json")
    ] = Path("artifacts/partition"),
    report: Annotated[
        Path | None,
        typer.Option("--out", help="report file (default: <partition>/validation.json)"),
    ] = None,
) -> None:
    """Check the client shards (pandera + great-expectations); exit 2 with the report on failure."""

    from tasks.data.experiment import dataset_num_classes
    from tasks.data.partitioning import load_partition
    from tasks.data.validate import validate_partition

    p = load(params, set_, numerics="portable")
    if report is not None:
        output_path("--out", report, file="validation.json")
    load_partition(partition_dir)  # a missing or altered manifest -> one line
    num_classes = dataset_num_classes(p)
    path = validate_partition(partition_dir, num_classes, p.validation.min_shard_size, report)
    out.print(f"shards valid: {partition_dir} ({path})")


@guarded(services=True)
def pretrain(
    params: ParamsOpt = None,
    set_: SetOpt = None,
    out_dir: Annotated[Path, typer.Option("--out", help="output folder")] = Path(
        "artifacts/pretrain"
    ),
    timing_dir: Annotated[
        Path, typer.Option("--timing", help="folder for pretrain.json timings (not hashed)")
    ] = Path("artifacts/timing"),
) -> None:
    """Train the frozen base centrally on the pretrain source (model.base: pretrain):
    base.pt + base.json; with another model.base, only a card saying it is unused."""

    from flows.plan import check_names
    from tasks.data.experiment import load_experiment_data
    from tasks.data.pretrain import check_source, run_pretrain

    p = load(params, set_, numerics="portable")
    check_names(p)
    for key, folder in (("--out", out_dir), ("--timing", timing_dir)):
        output_path(key, folder)  # a path below a file: one line now, not after training
    data = None
    if p.model.base == "pretrain":
        data = load_experiment_data(p)  # read once: the source's check and the training
        check_source(p, data)  # bad source -> one line before any training
    card = run_pretrain(p, out_dir, data, timing_file=timing_dir / "pretrain.json")
    if not card["used"]:
        out.print(f"pretrain not used ({card['reason']}): {out_dir / 'base.json'}")
        return
    src = card["source"]
    out.print(
        f"base {card['model']} on {src['dataset']} ({src['rows']} rows, classes "
        f"{src['classes']}): source test accuracy {100 * card['final_test_accuracy']:.2f}%"
    )
    out.print(f"base: {out_dir / 'base.pt'} (sha256 {card['base_sha256'][:12]})")


@guarded(services=True)
def train(
    algorithm: Annotated[str, typer.Option(help="a registered algorithm, e.g. fedavg")],
    adapter: Annotated[str, typer.Option(help="a registered adapter, e.g. full")] = "full",
    codec: Annotated[
        str, typer.Option(help="an update codec of grid.codecs (or codec_options), e.g. int8")
    ] = "none",
    params: ParamsOpt = None,
    set_: SetOpt = None,
    partition_dir: Annotated[
        Path, typer.Option("--partition", help="folder with manifest.csv + stats.json")
    ] = Path("artifacts/partition"),
    out_dir: Annotated[
        Path | None,
        typer.Option(
            "--out", help="cell folder (default: artifacts/runs/<cell>, e.g. fedavg-full)"
        ),
    ] = None,
    device: Annotated[str | None, typer.Option(help="auto, cpu or cuda")] = None,
    timing_dir: Annotated[
        Path, typer.Option("--timing", help="folder for <cell>.json timings (not hashed)")
    ] = Path("artifacts/timing"),
    base_dir: Annotated[
        Path, typer.Option("--base", help="pretrain output (base.pt) for model.base: pretrain")
    ] = Path("artifacts/pretrain"),
) -> None:
    """Train one grid cell (one DVC stage of the train matrix), tracked in MLflow."""

    from flows.localray import local_ray
    from flows.plan import prepare
    from tasks.config import load_params
    from tasks.grid import CellSpec, cell_folder, grid_cells
    from tasks.results.origin import origin
    from tasks.results.progress import GridSlot
    from tasks.training.cell import require_base
    from tasks.training.train import run_cell

    # the whole grid: where this cell stands in it
    cells = list(grid_cells(load_params(params, set_)))
    spec = CellSpec(algorithm, adapter, codec)
    # the cell's own grid, refused naming the option typed (not grid.* in the params file)
    options = {
        f"grid.algorithms=[{algorithm}]": "--algorithm",
        f"grid.adapters=[{adapter}]": "--adapter",
        f"grid.codecs=[{codec}]": "--codec",
        **({f"runtime.device={device}": "--device"} if device else {}),
    }
    p = load(params, set_, numerics="portable", options=options)
    slot = None  # "cell k of N" (each cell is its own stage: no grid ETA)
    if spec in cells:
        slot = GridSlot(cells.index(spec) + 1, len(cells), p.federation.rounds)
    require_base(p, base_dir / "base.pt")  # model.base: pretrain without a base -> now
    # (the cell's checkpoint is this stage's own: checked with the data and models)
    ckpts = Path("artifacts/checkpoints")
    plan = prepare(
        p, partition_dir, storage=False, results=False, checkpoints=ckpts, base=base_dir / "base.pt"
    )
    _require_valid(partition_dir)
    cell_dir = out_dir or Path("artifacts/runs") / cell_folder(spec)
    for key, folder in (("--out", cell_dir), ("--timing", timing_dir)):
        output_path(key, folder)  # a path below a file: one line now, not after training
    cell = plan.cell(spec)
    with local_ray(p):  # a Ray of the cell's own: token authentication, on 127.0.0.1
        record = run_cell(
            cell,
            partition_dir,
            cell_dir,
            # entry dvc; inside `dvc exp run`, a smoke run (not registered under auto)
            run_origin=origin("dvc", p, params, set_ or ()),
            timing_file=timing_dir / f"{cell.name}.json",
            # outside the stage's output (DVC removes that before it runs): a killed
            # `dvc repro` resumes the cell; deleted when the cell's outputs are written
            checkpoint_file=ckpts / f"{cell.name}.pt",
            slot=slot,
            data=plan.data,  # read once, by prepare
            part=plan.partition,
            model=plan.take_model(cell),
        )
    metrics = cell_dir / "metrics.json"
    out.print(results_table([{**record, "rounds": json.loads(metrics.read_text())["rounds"]}]))
    exit_if_diverged(p, [record])


def _require_valid(partition_dir: Path) -> None:
    from fedcore.errors import ConfigError

    report = partition_dir / "validation.json"
    if not report.is_file():
        raise ConfigError(f"{partition_dir} has not been validated: run fedapt validate first")
    if not json.loads(report.read_text()).get("success"):
        raise ConfigError(f"{report} records failed shard checks: fix the partition first")


@guarded
def report(
    params: ParamsOpt = None,
    set_: SetOpt = None,
    runs_dir: Annotated[Path, typer.Option("--runs", help="folder of cell folders")] = Path(
        "artifacts/runs"
    ),
    out_dir: Annotated[Path, typer.Option("--out", help="output folder")] = Path(
        "artifacts/report"
    ),
    timing_dir: Annotated[
        Path, typer.Option("--timing", help="folder of <cell>.json timings")
    ] = Path("artifacts/timing"),
) -> None:
    """Collect the grid's metrics.json files into summary.json (and the comparison report)."""

    from tasks.results.report import write_report

    p = load(params, set_, numerics="portable")
    output_path("--out", out_dir)
    records = collect_records(p, runs_dir, timing_dir)
    paths = write_report(p, records, out_dir, runs_dir)
    out.print(results_table(records))
    for path in paths:
        out.print(f"wrote {path}")


def collect_records(
    params: Any, runs_dir: Path, timing_dir: Path | None = None
) -> list[dict[str, Any]]:
    """The grid's records in grid order; a missing cell is an error, not a silent gap."""
    from fedcore.errors import ConfigError
    from tasks.grid import cell_folder, grid_cells
    from tasks.io import missing

    if not runs_dir.is_dir():
        what = "is a file" if runs_dir.exists() else missing(runs_dir)
        raise ConfigError(
            f"--runs {runs_dir} {what}: give the folder of the cell folders the train stages "
            "wrote (default: artifacts/runs)"
        )
    records = []
    for spec in grid_cells(params):
        path = runs_dir / cell_folder(spec) / "metrics.json"
        if not path.is_file():
            raise ConfigError(
                f"--runs {runs_dir} has no metrics for grid cell {spec.name} ({path}): a DVC "
                "train stage per grid cell writes them (list the cell under dvc.cells in "
                "params.yaml)"
            )
        record = json.loads(path.read_text())
        for timing in (
            path.with_name("timing.json"),
            (timing_dir or path.parent) / f"{spec.name}.json",
        ):
            if timing.is_file():
                record.update(json.loads(timing.read_text()))  # for the table only
        records.append(record)
    return records
