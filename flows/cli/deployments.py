"""``fedapt deploy``: the experiment flow on a cron schedule (Prefect deployments)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

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
) -> None:
    """Deploy the experiment flow on a cron schedule to the Prefect server of `fedapt up`
    (or PREFECT_API_URL); the worker of `fedapt up` runs it."""

    def body() -> None:
        from flows.deploy import check_cron, check_pool_type
        from flows.services import WORK_POOL

        pool = work_pool or WORK_POOL
        from flows.deploy import deploy as do_deploy

        check_cron(cron)
        params_file = str((params or Path("params.yaml")).resolve())
        load(Path(params_file), set_)  # the scheduled runs must not fail on bad params
        check_pool_type(pool_type)
        dep = do_deploy(
            name=name,
            cron=cron,
            work_pool=pool,
            pool_type=pool_type,
            params_file=params_file,
            overrides=list(set_ or []),
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
