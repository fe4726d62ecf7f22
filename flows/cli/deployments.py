"""``fedapt deploy``: the experiment flow on a cron schedule (Prefect deployments)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from flows.cli.common import ParamsOpt, SetOpt, app, guard, load, out


@app.command()
def deploy(
    cron: Annotated[str, typer.Option(help="cron schedule, e.g. '0 3 * * *'")],
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
    deployed as the next version of the experiment)."""

    def body() -> None:
        from flows.deploy import check_cron, check_pool_type
        from flows.services import WORK_POOL

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
        out.print(
            f"deployed {dep.name} ({dep.id}) on {dep.api_url}, cron '{cron}'", highlight=False
        )
        if dep.worker_ready:
            out.print(f"a worker polls work pool {dep.work_pool}: the scheduled runs will run")
        elif pool == WORK_POOL:  # the pool of fedapt's worker service
            out.print(f"no worker polls work pool {dep.work_pool} yet: start one with `fedapt up`")
        else:
            out.print(
                f"no worker polls work pool {dep.work_pool} yet: start one with "
                f"`prefect worker start --pool {dep.work_pool}`"
            )

    guard(body)


def _versioned(p: Any, new_version: bool) -> list[str]:
    """The override naming the experiment version the deployment's runs write (``[]``: its
    own name); refused in one line when that name holds other params' finished results
    (here, and on S3 when the services of `fedapt up` or AWS_* variables name an endpoint;
    each run checks again before it writes)."""
    from flows import services
    from tasks import storage
    from tasks.origin import check_results, version

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
