"""``fedapt run``, ``fedapt partition`` and ``fedapt models``: the experiment commands."""

from __future__ import annotations

import contextlib
import copy
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from flows.cli.console import err, out
from flows.cli.guards import guarded
from flows.cli.logs import quiet_prefect_tracebacks
from flows.cli.params import ParamsOpt, SetOpt, load
from flows.cli.runguards import exit_if_diverged, services_watched
from flows.cli.stopping import stop_on_signals
from flows.cli.tables import results_table, sweep_table

MAX_LABEL_COLUMNS = 100  # `fedapt partition` prints per-class counts up to this many classes
# `fedapt models`: the shapes it builds (model.input_size's bound; a decoder's vocabulary)
MAX_CHANNELS, MAX_SIDE, MAX_CLASSES = 64, 1024, 1_000_000


@guarded
def run(
    params: ParamsOpt = None,
    set_: SetOpt = None,
    device: Annotated[str | None, typer.Option(help="auto, cpu or cuda")] = None,
    workers: Annotated[str | None, typer.Option(help="CPU worker processes: auto or N")] = None,
    partition_dir: Annotated[
        Path | None,
        typer.Option("--partition", help="use the manifest in this folder (from fedapt partition)"),
    ] = None,
    new_version: Annotated[
        bool,
        typer.Option(
            "--new-version",
            help="when reports/<experiment> holds other params' results, run as <experiment>-v<k>",
        ),
    ] = False,
) -> None:
    """Run the experiment grid in params.yaml and print the results table. A run never
    overwrites the finished results of other params: it stops in one line, or with
    --new-version runs as the next version of the experiment."""

    from flows import services
    from flows.services import runwatch

    options = {}  # a bad value is refused naming the option
    if device is not None:
        options[f"runtime.device={device}"] = "--device"
    if workers is not None:
        options[f"runtime.workers={workers}"] = "--workers"
    p = load(params, set_, options=options)
    runwatch.grace_seconds()  # a bad FEDAPT_SERVICE_GRACE: one line before anything starts
    # The services of `fedapt up` (Prefect API, MLflow server, S3), when they are up; set
    # before Prefect is imported, which reads its settings once. SIGINT/SIGTERM unwind
    # (servers stopped, MLflow runs KILLED, lock released), then exit 130/143 in one line.
    up_env = services.env_for_clients()
    with (
        stop_on_signals(cleanup=_runs_killed),
        services.patched_environ(up_env),
    ):
        from flows.experiment import experiment_flow, in_process
        from flows.plan import check_inputs, check_storage, prepare
        from tasks import tracking
        from tasks.config import experiment_dir
        from tasks.io import check_writable
        from tasks.results.origin import version

        # bad names, a given partition for a seed sweep: stop here, before any server starts
        check_inputs(p, partition_dir)
        given = list(set_ or [])
        if new_version:  # <experiment>-v<k>: free, or holding these params' results
            named = version(p, s3=False)  # (S3 is checked once its server is up)
            if named.experiment.name != p.experiment.name:
                out.print(
                    f"running experiment {named.experiment.name}: {p.experiment.name} "
                    "holds other params' results",
                    highlight=False,
                )
                given.append(f"experiment.name={named.experiment.name}")
            p = named
        check_writable("experiment.reports_dir", experiment_dir(p))
        with contextlib.ExitStack() as stack:
            # one run per experiment directory: a second one stops here, naming the first,
            # before it writes anything or starts a server
            stack.enter_context(services.run_lock(experiment_dir(p), "fedapt run"))
            # every input checked, the data read, the partition drawn (or read and checked
            # row by row), the models built; another run's results, another configuration's
            # checkpoints or another model's -> one line, before any server starts
            plan = prepare(p, partition_dir, storage=False, models=in_process(p), checked=True)
            # temporary servers (S3; Prefect once the inputs are checked) are tied to this
            # process: they die with it, kill -9 included
            stack.enter_context(services.run_environment(need_s3=bool(p.storage.bucket)))
            stack.enter_context(tracking.ended_on_error())  # runs open on an error: FAILED
            check_storage(p)  # S3 reachable, the bucket there, no other params' results in it
            if p.runtime.tracking:  # runs an earlier, killed run left RUNNING: KILLED
                _note_stale_runs(tracking.close_stale_runs(p.experiment.name), p)
            resume = _resume_hint(p)
            quiet_prefect_tracebacks()
            with (
                services.prefect_environment(),  # a temporary server if none is set/up
                # a service of the run that stops answering (`fedapt down`, a crash) stops
                # the run in one line within seconds, not after minutes of retries
                services_watched(tuple(up_env), resume, tracking=p.runtime.tracking),
            ):
                records = experiment_flow(
                    params=p,
                    params_file=str(params or "params.yaml"),
                    overrides=given,  # recorded: the run's origin
                    partition_dir=str(partition_dir) if partition_dir else None,
                    plan=plan,
                )
        where = where_results(p, plan.data or plan.seeds[0].data, records)
    if p.experiment.seeds is not None:  # mean ± std over the seeds
        from tasks.training.sweep import cell_stats

        out.print(sweep_table(cell_stats(p, records), list(p.experiment.seeds)))
    else:
        from tasks.results.report import with_rounds

        out.print(results_table(with_rounds(records, experiment_dir(p) / "runs")))
    out.print(f"summary: {experiment_dir(p) / 'summary.json'}")
    out.print(_numerics_line(p.runtime.numerics), highlight=False)
    for line in where:  # whole, however long (a link broken in two opens nothing)
        out.print(line, soft_wrap=True, highlight=False)
    exit_if_diverged(p, records)


def _numerics_line(mode: str) -> str:
    from fedcore import numerics

    prov = numerics.provenance()
    if mode == "portable":
        return "numerics: portable (the same bytes on any x86-64 CPU with AVX2)"
    return (
        f"numerics: native ({prov['cpu_isa']} kernels: exact on this machine; "
        "--set runtime.numerics=portable for any x86-64 CPU)"
    )


def _resume_hint(params: Any) -> str:
    """What the same command does after a stop: resume from the cells' checkpoints."""
    from tasks.config import experiment_dir

    if params.runtime.checkpoint_every == 0:
        return "it starts over (runtime.checkpoint_every is 0: no checkpoints)"
    return f"it resumes from the last checkpoint in {experiment_dir(params)}"


def _runs_killed() -> None:
    from tasks import tracking

    tracking.end_active_runs("KILLED")


def _note_stale_runs(run_ids: list[str], params: Any) -> None:
    if run_ids:
        err.print(
            f"mlflow: marked {len(run_ids)} run(s) of {params.experiment.name} KILLED that an "
            "earlier run left RUNNING when it died",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )


def where_results(params: Any, data: Any, records: list[dict[str, Any]]) -> list[str]:
    import os

    from fedcore.errors import mask_credentials
    from tasks.data.experiment import data_sources

    lines = [f"data: {src}"] if (src := data_sources(data)) else []
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if params.runtime.tracking:
        table = _runs_table(records)
        server = bool(uri) and uri.startswith(("http://", "https://"))
        then = f", then {table}" if table else ""
        if server and table:
            lines.append(f"MLflow: {table}")  # the run's cells, training view (masked)
        elif uri and (server or not table):
            lines.append(f"MLflow: {mask_credentials(uri)}")  # never a password on the screen
        elif uri:  # a database of your own: its UI is `mlflow ui` on it
            shown = mask_credentials(uri)
            lines.append(
                f"MLflow: {shown} (see it with `mlflow ui --backend-store-uri {shown}`{then})"
            )
        else:
            lines.append(
                "MLflow: local store mlruns/ (see it with `fedapt up`, or `mlflow ui "
                f"--backend-store-uri sqlite:///mlruns/mlflow.db`{then})"
            )
    if params.storage.bucket:
        from tasks.results.storage import experiment_prefix

        prefix = experiment_prefix(params.storage.prefix, params.experiment.name)
        lines.append(f"outputs: s3://{params.storage.bucket}/{prefix}/")
    return lines


def _runs_table(records: list[dict[str, Any]]) -> str | None:
    """The MLflow Runs table of this run's cells (training view, their results as columns),
    or None when no cell was tracked."""
    from tasks import tracking

    flat = [r for r in records if isinstance(r, dict)]
    parent = tracking.parent_run(flat)
    return tracking.runs_table_url(parent) if parent else None


@guarded
def partition(
    params: ParamsOpt = None,
    set_: SetOpt = None,
    out_dir: Annotated[Path | None, typer.Option("--out", help="output folder")] = None,
) -> None:
    """Partition the dataset; write manifest.csv + stats.json and print a label histogram."""

    from tasks.config import experiment_dir
    from tasks.data.experiment import data_sources, load_experiment_data
    from tasks.data.partitioning import build_partition, write_partition
    from tasks.io import check_writable

    p = load(params, set_, numerics="portable")  # a DVC stage (numpy draws, no kernels)
    target = out_dir or experiment_dir(p) / "partition"
    check_writable("--out" if out_dir else "experiment.reports_dir", target)
    data = load_experiment_data(p)
    part = build_partition(p, data)
    manifest, stats = write_partition(p, data, part, target)
    import numpy as np

    labels, num_classes = data.train.labels.numpy(), data.train.info.num_classes
    shown = {k: v for k, v in part.params.items() if k != "groups"}  # natural: role ids
    t = Table(title=f"{part.scheme} {shown}  hash {part.content_hash()[:12]}")
    t.add_column("client", justify="right")
    t.add_column("size", justify="right")
    if num_classes > MAX_LABEL_COLUMNS:  # a vocabulary (next-token labels)
        t.add_column("distinct labels", justify="right")
        for i, ix in enumerate(part.client_indices):
            t.add_row(str(i), str(len(ix)), str(len(np.unique(labels[ix]))))
        out.print(t)
        out.print(f"manifest: {manifest}\nstats: {stats}")
        return
    counts = part.label_counts(labels, num_classes)
    for k in range(counts.shape[1]):
        t.add_column(str(k), justify="right")
    if any(v > 0 for v in part.noise_var):
        t.add_column("noise var", justify="right")
    for i, row in enumerate(counts):
        cells = [str(i), str(int(row.sum())), *(str(int(v)) for v in row)]
        if any(v > 0 for v in part.noise_var):
            cells.append(f"{part.noise_var[i]:.4f}")
        t.add_row(*cells)
    out.print(t)
    out.print(f"manifest: {manifest}\nstats: {stats}")
    if src := data_sources(data):
        out.print(f"data: {src}", highlight=False)


@guarded
def models(
    num_classes: Annotated[int, typer.Option(help="number of classes")] = 10,
    input_shape: Annotated[str, typer.Option(help="C,H,W of the input")] = "3,32,32",
    model: Annotated[
        list[str] | None, typer.Option("--model", "-m", help="only these backbones")
    ] = None,
) -> None:
    """Backbones x adapter methods: parameters, payload bytes per round, ratio to full."""

    from fedcore.errors import ConfigError, UnknownNameError
    from fedcore.payload import mib
    from models import get_model, list_models
    from models.adapters import adapt, get_adapter, list_adapters

    try:
        c, h, w = (int(x) for x in input_shape.split(","))
    except ValueError:
        raise ConfigError(f"--input-shape expects C,H,W (got {input_shape!r})") from None
    if h != w:
        raise ConfigError(f"--input-shape: square inputs only (got {h}x{w})")
    if not (1 <= c <= MAX_CHANNELS and 1 <= h <= MAX_SIDE):
        raise ConfigError(
            f"--input-shape: C in [1, {MAX_CHANNELS}] and H = W in [1, {MAX_SIDE}] "
            f"(got {input_shape})"
        )
    if not 2 <= num_classes <= MAX_CLASSES:
        raise ConfigError(f"--num-classes: must be in [2, {MAX_CLASSES}] (got {num_classes})")
    names = model or list_models()
    for name in names:
        if name not in list_models():
            raise UnknownNameError("model", name, list_models())
    t = Table(
        title=f"backbones x adapter methods, input {c}x{h}x{w}, {num_classes} classes "
        "(payload = one client's upload per round; MiB = 2^20 bytes)"
    )
    cols = (
        "model",
        "adapter",
        "total params",
        "trainable params",
        "payload bytes",
        "payload MiB",
        "model MiB",
        "full / payload",
    )
    for col in cols:
        t.add_column(col, justify="left" if col in ("model", "adapter") else "right")
    skipped = []
    for name in names:
        full_bytes = None
        try:  # built once (initialising ViT-B takes seconds), copied for each method
            plain = get_model(name, num_classes=num_classes, in_channels=c, input_size=h)
        except ConfigError as exc:  # e.g. text_hf needs hf_name and the network
            skipped.append(f"{name} ({exc})")
            continue
        for adapter in ["full", *(a for a in list_adapters() if a != "full")]:
            base = copy.deepcopy(plain)
            method = get_adapter(adapter)
            reason = method.applies_to(base)
            if reason is not None:
                skipped.append(f"{name}/{adapter} ({reason})")
                continue
            n = method.counts(adapt(base, adapter))
            full_bytes = full_bytes or n.payload_bytes
            t.add_row(
                name,
                adapter,
                f"{n.total_params:,}",
                f"{n.trainable_params:,}",
                f"{n.payload_bytes:,}",
                f"{mib(n.payload_bytes):.3f}",
                f"{mib(n.model_bytes):.3f}",
                f"{full_bytes / n.payload_bytes:.2f}",
            )
    out.print(t)
    if skipped:
        out.print("not applicable: " + "; ".join(skipped), highlight=False)
