"""Scheduled deployments of the experiment flow to a Prefect server and a process work pool.

A deployment needs a long-lived Prefect server (``PREFECT_API_URL``); runs are picked up by a
worker: ``prefect worker start --pool fedapt-process``.
"""

from __future__ import annotations

from pathlib import Path

from fedcore.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
ENTRYPOINT = "flows/experiment.py:experiment_flow"


def api_url() -> str | None:
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value()


def check_cron(cron: str) -> str:
    from prefect.client.schemas.schedules import CronSchedule

    try:
        CronSchedule(cron=cron)
    except ValueError:
        raise ConfigError(
            f"--cron {cron!r} is not a cron expression (five fields, e.g. '0 3 * * *')"
        ) from None
    return cron


def deploy(
    *, name: str, cron: str, work_pool: str, params_file: str, overrides: list[str]
) -> tuple[str, str]:
    """Create/update the work pool and the scheduled deployment; returns (id, API URL)."""
    check_cron(cron)
    url = api_url()
    if not url:
        raise ConfigError(
            "fedapt deploy needs a Prefect server: run `.venv/bin/prefect server start --host "
            "127.0.0.1` and set PREFECT_API_URL=http://127.0.0.1:4200/api"
        )
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists

    with get_client(sync_client=True) as client:
        try:
            client.create_work_pool(WorkPoolCreate(name=work_pool, type="process"))
        except ObjectAlreadyExists:
            pass
    source = flow.from_source(source=str(ROOT), entrypoint=ENTRYPOINT)
    deployment_id = source.deploy(
        name=name,
        work_pool_name=work_pool,
        cron=cron,
        parameters={"params_file": params_file, "overrides": overrides},
        build=False,
        push=False,
        print_next_steps=False,
    )
    return str(deployment_id), url
