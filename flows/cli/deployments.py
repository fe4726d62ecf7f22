"""``fedapt deploy``: the experiment flow on a cron schedule (Prefect deployments), and
``fedapt deploy ls | pause | resume | delete`` to manage them."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from flows.cli.console import out, print_error
from flows.cli.guards import guarded
from flows.cli.params import ParamsOpt, SetOpt, load

NameArg = Annotated[
    str, typer.Argument(help="deployment name (as in `fedapt deploy ls`)", show_default=False)
]


@guarded
def deploy(
    ctx: typer.Context,
    cron: Annotated[
        str | None, typer.Option(help="cron schedule, e.g. '0 3 * * *' (required to deploy)")
    ] = None,
    name: Annotated[str, typer.Option(help="deployment name")] = "scheduled",
    work_pool: Annotated[
        str | None,
        typer.Option(help="Prefect work pool (default: the pool of the worker of `fedapt up`)"),
    ] = None,
    pool_type: Annotated[
        str, typer.Option(help="type of the work pool when it is created")
    ] = "process",
    params: ParamsOpt = None,
    set_: SetOpt = None,
    new_version: Annotated[
        bool,
        typer.Option(
            "--new-version",
            help="when reports/<experiment> holds other params' results, deploy <experiment>-v<k>",
        ),
    ] = False,
) -> None:
    """Deploy the experiment flow on a cron schedule to the Prefect server of `fedapt up`
    (or PREFECT_API_URL); the worker of `fedapt up` runs it. Overrides that would make its
    runs write over another run's finished results are refused (or, with --new-version,
    deployed as the next version of the experiment). Subcommands: ls, pause, resume,
    delete."""
    if ctx.invoked_subcommand is not None:
        if cron is not None or set_ or params is not None:
            sub = ctx.invoked_subcommand
            print_error(
                f"--cron, --params and --set create a deployment; `fedapt deploy {sub}` takes none"
            )
            raise typer.Exit(2)
        return

    from fedcore.errors import ConfigError
    from flows.deploy import check_cron, check_pool_type
    from flows.services import WORK_POOL

    if cron is None:
        raise ConfigError(
            "fedapt deploy needs --cron (e.g. --cron '0 3 * * *'), or one of: "
            "ls, pause NAME, resume NAME, delete NAME"
        )
    pool = work_pool or WORK_POOL
    from flows.deploy import deploy as do_deploy

    check_cron(cron)
    params_file = str((params or Path("params.yaml")).resolve())
    p = load(Path(params_file), set_)  # the scheduled runs must not fail on bad params
    overrides = [*(set_ or []), *_versioned(p, new_version)]  # never over other results
    check_pool_type(pool_type)
    dep = do_deploy(
        name=name,
        cron=cron,
        work_pool=pool,
        pool_type=pool_type,
        params_file=params_file,
        overrides=overrides,
    )
    out.print(f"deployed {dep.name} ({dep.id}) on {dep.api_url}, cron '{cron}'", highlight=False)
    if dep.worker_ready:
        out.print(f"a worker polls work pool {dep.work_pool}: the scheduled runs will run")
    elif pool == WORK_POOL:  # the pool of fedapt's worker service
        out.print(f"no worker polls work pool {dep.work_pool} yet: start one with `fedapt up`")
    else:
        out.print(
            f"no worker polls work pool {dep.work_pool} yet: start one with "
            f"`prefect worker start --pool {dep.work_pool}`"
        )


@guarded
def ls() -> None:
    """List the deployments of the experiment flow: state, cron, work pool, next run."""

    from flows.deploy import listing

    url, rows = listing()
    if not rows:
        out.print(f"no deployments on {url} (create one with: fedapt deploy --cron ...)")
        return
    t = Table(title=f"deployments of fedapt-experiment on {url}")
    for col in rows[0]:
        t.add_column(col)
    for row in rows:
        t.add_row(*row.values())
    out.print(t)


@guarded
def _manage(action: str, name: str) -> None:
    from flows.deploy import manage

    done = manage(action, name)
    out.print(f"{action}d {done.name} on {done.api_url}", highlight=False)
    if done.cancelled:
        out.print(
            f"cancelled {len(done.cancelled)} run(s) that had not started: "
            + ", ".join(done.cancelled),
            highlight=False,
        )
    for run_name, run_id in done.running:
        out.print(
            f"run {run_name} is still running and runs to its end "
            f"(stop it with: prefect flow-run cancel {run_id})",
            highlight=False,
        )


def pause(name: NameArg) -> None:
    """Pause a deployment: no new scheduled runs, and its runs that have not started yet
    (Scheduled, Late, Pending) are cancelled; a Running one runs to its end."""
    _manage("pause", name)


def resume(name: NameArg) -> None:
    """Resume a paused deployment: the server's scheduler creates its runs again."""
    _manage("resume", name)


def delete(name: NameArg) -> None:
    """Delete a deployment and cancel its runs that have not started; a Running one runs to
    its end."""
    _manage("delete", name)


def _versioned(p: Any, new_version: bool) -> list[str]:
    """The override naming the experiment version the deployment's runs write (``[]``: its
    own name); refused in one line when that name holds other params' finished results
    (here, and on S3 when the services of `fedapt up` or AWS_* variables name an endpoint;
    each run checks again before it writes)."""
    from flows import services
    from tasks.results import storage
    from tasks.results.origin import check_results, version

    with services.patched_environ(services.env_for_clients()):
        s3 = bool(p.storage.bucket) and storage.endpoint_url() is not None
        if not new_version:
            check_results(p, s3=s3)
            return []
        named = version(p, s3=s3).experiment.name
    if named != p.experiment.name:
        out.print(f"deploying experiment {named}: {p.experiment.name} holds other results")
        return [f"experiment.name={named}"]
    return []
