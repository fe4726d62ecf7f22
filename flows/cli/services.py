"""``fedapt up | down | status``: the local services behind the UI workflows, on 127.0.0.1
(another address: ``--host``, with ``--auth on``, flows/services/auth.py).

s3 (SeaweedFS), mlflow (tracking server: SQLite store, artifacts in s3://fedapt/mlflow) and
prefect (API + UI); with ``--store postgres`` both keep their data in PostgreSQL (postgres, a
supervised server; or a server of yours, ``--store postgresql://...``). ``fedapt run`` uses whichever are up and falls back to the embedded
defaults otherwise (see flows/services/). ray (a local Ray head) starts only when named
(``fedapt up ray``); a run uses it where ``RAY_ADDRESS`` names it (``eval "$(fedapt env)"``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from flows.cli.console import err, out
from flows.cli.guards import guarded

ServiceArg = Annotated[
    list[str] | None,
    typer.Argument(
        help="services (postgres, s3, mlflow, prefect, worker, ray); default: all (up: all "
        "but ray, and postgres only for a PostgreSQL store)",
        show_default=False,
    ),
]
StoreOpt = Annotated[
    str | None,
    typer.Option(
        "--store",
        help="where Prefect and MLflow keep their data: sqlite, postgres (fedapt's own "
        "PostgreSQL server, service postgres) or the postgresql:// URL of a server of yours; "
        "default: FEDAPT_STORE, else the store of the running services, else sqlite",
        show_default=False,
    ),
]


HostOpt = Annotated[
    str | None,
    typer.Option(
        "--host",
        help="the address the services listen on: 127.0.0.1 (the default: this machine only), "
        "another IPv4 address of this machine, 0.0.0.0 (all) or localhost; any other than "
        "127.0.0.1 and localhost needs --auth on; default: FEDAPT_HOST, else the address of "
        "the running services, else 127.0.0.1 (the worker's health check and PostgreSQL stay "
        "on 127.0.0.1)",
        show_default=False,
    ),
]
AuthOpt = Annotated[
    str | None,
    typer.Option(
        "--auth",
        help="on: every service asks for credentials (MLflow's basic-auth app, Prefect's auth "
        "string, SeaweedFS's S3 keys; Ray's token always), yours from FEDAPT_MLFLOW_USERNAME/"
        "FEDAPT_MLFLOW_PASSWORD, FEDAPT_PREFECT_AUTH_STRING, FEDAPT_S3_ACCESS_KEY/"
        "FEDAPT_S3_SECRET_KEY or generated, kept in <state dir>/auth/ (mode 0600); off; "
        "default: FEDAPT_AUTH, else that of the running services, else off",
        show_default=False,
    ),
]


def _table(statuses: dict) -> Table:
    t = Table(title="fedapt services")
    for col in ("service", "state", "healthy", "url", "auth", "pid", "log"):
        t.add_column(col)
    for st in statuses.values():
        t.add_row(
            st.name,
            st.state,
            "yes" if st.healthy else "no",
            st.url or "-",
            "yes" if st.auth else "-",
            str(st.pid or "-"),
            st.log or "-",
        )
    return t


def _print_stores(statuses: dict) -> None:
    """Where Prefect and MLflow keep their data (passwords masked)."""
    for name, label in (("prefect", "Prefect"), ("mlflow", "MLflow")):
        st = statuses.get(name)
        if st is not None and st.state == "running" and st.store:
            out.print(f"{label} store: {st.store}", highlight=False, markup=False)


@guarded
def up(
    services: ServiceArg = None,
    store: StoreOpt = None,
    host: HostOpt = None,
    auth: AuthOpt = None,
) -> None:
    """Start the services (ports: FEDAPT_S3_PORT, FEDAPT_MLFLOW_PORT, FEDAPT_PREFECT_PORT,
    FEDAPT_WORKER_PORT, FEDAPT_RAY_PORT, FEDAPT_POSTGRES_PORT); the worker runs the scheduled
    deployments of `fedapt deploy`. A local Ray head starts only when named: fedapt up ray."""

    from flows import services as svc

    # the services asked for, and what they need
    statuses = svc.up(services or None, store=store, host=host, auth_mode=auth)
    healthy = {n for n, st in statuses.items() if st.healthy}
    if "s3" in healthy and statuses["s3"].url:
        configure_dvc_remote(statuses["s3"].url)
    out.print(_table(statuses))
    _print_stores(statuses)
    if "mlflow" in healthy:
        from tasks.tracking.views import home_url

        url = statuses["mlflow"].url
        out.print(f"MLflow UI: {home_url(url)}  (models: {url}/#/models)", highlight=False)
    if "prefect" in healthy:
        out.print(f"Prefect UI: {statuses['prefect'].url}")
    if "worker" in healthy:
        out.print(f"Prefect worker: runs the deployments of work pool {svc.WORK_POOL}")
    if "ray" in healthy:
        out.print(
            f"Ray head: {statuses['ray'].url} (RAY_ADDRESS; runs use it with runtime.clients "
            "or runtime.task_runner ray once RAY_ADDRESS is set, see fedapt env)",
            highlight=False,
        )
    if healthy - {"ray"}:
        out.print("fedapt run now tracks to these services; stop them with: fedapt down")
    if svc.write_env_file():
        out.print(
            'point prefect, mlflow, AWS and Ray tools at them: eval "$(.venv/bin/fedapt env)"'
        )


@guarded
def down(services: ServiceArg = None) -> None:
    """Stop the services (data stays in .fedapt/ for the next `fedapt up`)."""

    from flows import services as svc

    statuses = svc.down(services or None)
    svc.write_env_file()  # what is still up, or no file at all
    out.print(_table(statuses))
    stale = [k for k in os.environ.get("FEDAPT_ENV_VARS", "").split() if k in os.environ]
    found, _ = svc.tool_env()
    if any(k not in found for k in stale):  # an earlier eval "$(fedapt env)" set them
        out.print('this shell still points tools at them; unset with: eval "$(fedapt env)"')


@guarded
def env_() -> None:
    """Point prefect, mlflow, AWS and Ray tools at the services: eval "$(fedapt env)".

    Prints export lines (PREFECT_API_URL, MLFLOW_TRACKING_URI, AWS_*, RAY_ADDRESS and
    RAY_AUTH_MODE) for the services that are up; for those that are down it unsets what an
    earlier eval set and says so on stderr.
    """

    from flows import services as svc

    text, down = svc.env_script()
    sys.stdout.write(text)
    if down:
        names = ", ".join(down)
        how = " / ".join(
            c
            for c, need in (("fedapt up", down != ["ray"]), ("fedapt up ray", "ray" in down))
            if need
        )
        err.print(
            f"fedapt env: not running: {names} (start with: {how})",
            highlight=False,
            markup=False,
        )


@guarded
def status() -> None:
    """Show which services are running and healthy."""

    from flows import services as svc

    statuses = svc.status()
    svc.write_env_file()  # a service that died since `fedapt up` leaves it
    out.print(_table(statuses))
    _print_stores(statuses)


def configure_dvc_remote(endpoint: str, repo: Path | None = None) -> None:
    """Point the DVC remote ``fedapt`` (s3://fedapt/dvc, in .dvc/config) at the local S3 server:
    endpoint and keys (the s3 service's of ``fedapt up --auth on``, else the fixed local ones)
    go to .dvc/config.local (mode 0600), which DVC keeps out of git."""
    from configobj import ConfigObj  # DVC's own config format

    from flows import services as svc

    path = (repo or svc.ROOT) / ".dvc" / "config.local"
    if not path.parent.is_dir():
        return
    cfg = ConfigObj(str(path)) if path.is_file() else ConfigObj()
    cfg.filename = str(path.with_name(".config.local.tmp"))
    rec = svc.read_state().get("s3") or {}
    with_auth = rec.get("auth") and rec.get("url") == endpoint
    env = svc.s3_client_env(endpoint, svc.s3_keys(svc.state_dir()) if with_auth else None)
    cfg['remote "fedapt"'] = {
        **cfg.get('remote "fedapt"', {}),
        "endpointurl": endpoint,
        "access_key_id": env["AWS_ACCESS_KEY_ID"],
        "secret_access_key": env["AWS_SECRET_ACCESS_KEY"],
        "region": env["AWS_DEFAULT_REGION"],
    }
    cfg.write()
    tmp = path.with_name(".config.local.tmp")
    tmp.chmod(0o600)
    tmp.replace(path)
