"""The ``fedapt`` command line. Heavy imports happen inside commands (start-up stays fast)."""

from __future__ import annotations

import copy
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from tasks.services import WORK_POOL  # stdlib-only module: cheap at CLI start-up

# Offline and quiet by default; the project keeps its own Prefect home (DESIGN.md).
_ROOT = Path(__file__).resolve().parents[1]
for _key, _value in {
    "PREFECT_HOME": str(_ROOT / ".prefect"),
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    "DO_NOT_TRACK": "true",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DVC_NO_ANALYTICS": "1",
}.items():
    os.environ.setdefault(_key, _value)

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="fedapt: communication-efficient federated learning with parameter-efficient adapters.",
)
out = Console(width=140) if not sys.stdout.isatty() else Console()
err = Console(stderr=True)

ParamsOpt = Annotated[
    Path | None, typer.Option("--params", "-p", help="params file (default: params.yaml)")
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", "-s", help="override a parameter, e.g. --set federation.rounds=5"),
]


class _NoTracebackForFedaptErrors(logging.Filter):
    """Prefect logs task/flow failures with tracebacks; a FedaptError is a user-facing
    message, so its records keep the message and lose the traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        from fedcore.errors import FedaptError

        if record.exc_info and isinstance(record.exc_info[1], FedaptError):
            record.exc_info = None
            record.exc_text = None
        return True


def quiet_prefect_tracebacks() -> None:
    flt = _NoTracebackForFedaptErrors()
    names = ["prefect", *(n for n in logging.Logger.manager.loggerDict if n.startswith("prefect"))]
    for name in names:
        for handler in logging.getLogger(name).handlers:
            if flt not in handler.filters:
                handler.addFilter(flt)


def _guard(fn: Callable[[], Any]) -> Any:
    """Run a command body; a FedaptError becomes one line on stderr and exit code 2."""
    from fedcore.errors import FedaptError

    try:
        return fn()
    except FedaptError as exc:
        err.print(f"[red]fedapt: error:[/red] {exc}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        err.print("fedapt: interrupted")
        raise typer.Exit(130) from None


def _load(params: Path | None, overrides: list[str] | None, extra: list[str] | None = None) -> Any:
    from tasks.config import load_params

    return load_params(params, [*(overrides or []), *(extra or [])])


@app.command()
def run(
    params: ParamsOpt = None,
    set_: SetOpt = None,
    device: Annotated[str | None, typer.Option(help="auto, cpu or cuda")] = None,
    workers: Annotated[str | None, typer.Option(help="CPU worker processes: auto or N")] = None,
    partition_dir: Annotated[
        Path | None,
        typer.Option("--partition", help="use the manifest in this folder (from fedapt partition)"),
    ] = None,
) -> None:
    """Run the experiment grid in params.yaml and print the results table."""

    def body() -> None:
        from tasks import services

        extra = []
        if device is not None:
            extra.append(f"runtime.device={device}")
        if workers is not None:
            extra.append(f"runtime.workers={workers}")
        p = _load(params, set_, extra)
        # The services of `fedapt up` (Prefect API, MLflow server, S3), when they are up; set
        # before Prefect is imported, which reads its settings once.
        with services.patched_environ(services.env_for_clients()):
            from flows.experiment import experiment_dir, experiment_flow, preflight, validate

            validate(p)  # bad names stop here, before any server starts
            with services.run_environment(need_s3=bool(p.storage.bucket)):
                preflight(p, partition_dir)
                quiet_prefect_tracebacks()
                records = experiment_flow(
                    params=p.model_dump(mode="json"),
                    partition_dir=str(partition_dir) if partition_dir else None,
                )
            where = _where_results(p)
        out.print(results_table(records))
        out.print(f"summary: {experiment_dir(p) / 'summary.json'}")
        for line in where:
            out.print(line)

    _guard(body)


def _where_results(params: Any) -> list[str]:
    import os

    lines = []
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if params.runtime.tracking:
        lines.append(
            f"MLflow: {uri}"
            if uri and uri.startswith("http")
            else "MLflow: local store mlruns/ (see it with `fedapt up`, or `mlflow ui "
            "--backend-store-uri sqlite:///mlruns/mlflow.db`)"
        )
    if params.storage.bucket:
        lines.append(
            f"outputs: s3://{params.storage.bucket}/{params.storage.prefix}/{params.experiment.name}/"
        )
    return lines


def results_table(records: list[dict[str, Any]]) -> Table:
    """One row per run; accuracy in %, traffic in MiB (2**20 bytes) per round and in total."""
    from fedcore.payload import mib

    t = Table(title="fedapt results (MiB = 2^20 bytes)")
    cols = (
        "run",
        "partition",
        "rounds",
        "final acc",
        "mean acc last L",
        "up MiB/rnd",
        "down MiB/rnd",
        "up MiB",
        "down MiB",
        "s",
    )
    exits = any(r.get("final_accuracy_exits") for r in records)  # early-exit methods
    if exits:
        cols = (*cols, "acc per exit")
    personal = any(r.get("personalization") for r in records)  # seed 001 Table 4
    if personal:
        cols = (*cols, "personalized % (gain)")
    for col in cols:
        t.add_column(col, justify="left" if col in ("run", "partition") else "right")
    for r in records:
        per_exit = " ".join(f"{100 * a:.1f}" for a in r.get("final_accuracy_exits") or [])
        t.add_row(
            f"{r['algorithm']}/{r['adapter']}",
            r["partition"],
            str(r["rounds"]),
            _pct(r["final_accuracy"]),
            f"{_pct(r['mean_accuracy_last_L'])} L={r['last_rounds_L']}",
            f"{mib(r['upload_bytes_per_round']):.2f}",
            f"{mib(r['download_bytes_per_round']):.2f}",
            f"{mib(r['upload_bytes']):.1f}",
            f"{mib(r['download_bytes']):.1f}",
            f"{r['wall_seconds']:.0f}" if "wall_seconds" in r else "-",
            *([per_exit or "-"] if exits else []),
            *([_personal(r.get("personalization") or {})] if personal else []),
        )
    return t


def _personal(by_scope: dict[str, Any]) -> str:
    """Mean personalized accuracy and its gain over the global model, per scope."""
    return (
        " ".join(
            f"{scope.removeprefix('client_')} {100 * r['mean_accuracy_after']:.1f} "
            f"({100 * r['mean_gain']:+.1f})"
            for scope, r in by_scope.items()
            if r.get("mean_gain") is not None
        )
        or "-"
    )


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f}%"


@app.command()
def partition(
    params: ParamsOpt = None,
    set_: SetOpt = None,
    out_dir: Annotated[Path | None, typer.Option("--out", help="output folder")] = None,
) -> None:
    """Partition the dataset; write manifest.csv + stats.json and print a label histogram."""

    def body() -> None:
        from flows.experiment import experiment_dir
        from tasks.data import build_partition, load_experiment_data, write_partition

        p = _load(params, set_)
        data = load_experiment_data(p)
        part = build_partition(p, data)
        target = out_dir or experiment_dir(p) / "partition"
        manifest, stats = write_partition(p, data, part, target)
        counts = part.label_counts(data.train.labels.numpy(), data.train.info.num_classes)
        t = Table(title=f"{part.scheme} {part.params}  hash {part.content_hash()[:12]}")
        t.add_column("client", justify="right")
        t.add_column("size", justify="right")
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

    _guard(body)


@app.command()
def models(
    num_classes: Annotated[int, typer.Option(help="number of classes")] = 10,
    input_shape: Annotated[str, typer.Option(help="C,H,W of the input")] = "3,32,32",
    model: Annotated[
        list[str] | None, typer.Option("--model", "-m", help="only these backbones")
    ] = None,
) -> None:
    """Backbones x adapter methods: parameters, payload bytes per round, ratio to full."""

    def body() -> None:
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

    _guard(body)


@app.command()
def deploy(
    cron: Annotated[str, typer.Option(help="cron schedule, e.g. '0 3 * * *'")],
    name: Annotated[str, typer.Option(help="deployment name")] = "scheduled",
    work_pool: Annotated[str, typer.Option(help="Prefect work pool")] = WORK_POOL,
    pool_type: Annotated[
        str, typer.Option(help="type of the work pool when it is created")
    ] = "process",
    params: ParamsOpt = None,
    set_: SetOpt = None,
) -> None:
    """Deploy the experiment flow on a cron schedule to the Prefect server of `fedapt up`
    (or PREFECT_API_URL); the worker of `fedapt up` runs it."""

    def body() -> None:
        from flows.deploy import check_cron, check_pool_type
        from flows.deploy import deploy as do_deploy

        check_cron(cron)
        params_file = str((params or Path("params.yaml")).resolve())
        _load(Path(params_file), set_)  # the scheduled runs must not fail on bad params
        check_pool_type(pool_type)
        dep = do_deploy(
            name=name,
            cron=cron,
            work_pool=work_pool,
            pool_type=pool_type,
            params_file=params_file,
            overrides=list(set_ or []),
        )
        out.print(
            f"deployed {dep.name} ({dep.id}) on {dep.api_url}, cron '{cron}'", highlight=False
        )
        if dep.worker_ready:
            out.print(f"a worker polls work pool {dep.work_pool}: the scheduled runs will run")
        elif work_pool == WORK_POOL:  # the pool of fedapt's worker service
            out.print(f"no worker polls work pool {dep.work_pool} yet: start one with `fedapt up`")
        else:
            out.print(
                f"no worker polls work pool {dep.work_pool} yet: start one with "
                f"`prefect worker start --pool {dep.work_pool}`"
            )

    _guard(body)


# The service commands (up, down, status) and the DVC stage commands (prepare, validate,
# train, report) register themselves on ``app``.
import flows.service_commands  # noqa: E402, F401
import flows.stages  # noqa: E402, F401


def main() -> None:
    app(prog_name="fedapt")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
