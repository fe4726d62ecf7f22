"""Scheduled deployments of the experiment flow to a Prefect server and a process work pool.

``fedapt deploy`` (and ``prefect deploy --all`` with the repository's ``prefect.yaml``) create
the deployment ``fedapt-experiment/<name>`` of ``flows/experiment.py:experiment_flow`` on the
Prefect server: the server's scheduler turns its cron schedule into flow runs and the worker of
``fedapt up`` (service ``worker``, pool ``fedapt-process``) runs them in this checkout.

Every input is checked before anything is created on the server: the cron expression, the
params (in the CLI), the work pool type, that the server answers, and that an existing pool
has the requested type. A deployment runs one flow run at a time: a run that comes due while
the previous one is still running is cancelled (``CANCEL_NEW``), so a frequent schedule cannot
pile up runs that overwrite each other's outputs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import UTC
from pathlib import Path
from typing import Any

from fedcore.errors import ConfigError
from flows import services

ROOT = Path(__file__).resolve().parents[1]
ENTRYPOINT = "flows/experiment.py:experiment_flow"
FLOW_NAME = "fedapt-experiment"


@dataclass(frozen=True)
class Deployed:
    id: str
    name: str  # fedapt-experiment/<name>
    api_url: str
    work_pool: str
    worker_ready: bool  # a worker polls the pool: the scheduled runs will run


def check_cron(cron: str) -> str:
    from prefect.client.schemas.schedules import CronSchedule

    try:
        CronSchedule(cron=cron)
    except ValueError:
        raise ConfigError(
            f"--cron {cron!r} is not a cron expression (five fields, e.g. '0 3 * * *')"
        ) from None
    return cron


def pool_types() -> list[str]:
    """Work pool types whose worker is installed here (``process`` with Prefect itself)."""
    from prefect.workers.base import BaseWorker

    return sorted(BaseWorker.get_all_available_worker_types())


def check_pool_type(pool_type: str) -> str:
    allowed = pool_types()
    if pool_type not in allowed:
        raise ConfigError(
            f"--pool-type {pool_type!r} has no worker installed here; allowed: "
            + ", ".join(allowed)
        )
    return pool_type


def api_url() -> str:
    """The Prefect API to deploy to: the user's ``PREFECT_API_URL`` (environment or Prefect
    profile), else the server of ``fedapt up``. Raises when neither is there or it does not
    answer."""
    from prefect.settings import PREFECT_API_URL

    url = os.environ.get("PREFECT_API_URL") or PREFECT_API_URL.value()
    if not url:
        st = services.status(["prefect"])["prefect"]
        if st.healthy and st.url:
            return st.url + "/api"
        raise ConfigError(
            "fedapt deploy needs a Prefect server: start one with `fedapt up` "
            "(or set PREFECT_API_URL to yours)"
        )
    url = url.rstrip("/")
    if not services.probe(url + "/health", timeout=5.0):
        raise ConfigError(
            f"no Prefect server answers at PREFECT_API_URL={url}; start it (`fedapt up`) "
            "or fix PREFECT_API_URL"
        )
    return url


def deploy(
    *,
    name: str,
    cron: str,
    work_pool: str,
    params_file: str,
    overrides: list[str],
    pool_type: str = "process",
) -> Deployed:
    """Create (or update) the work pool and the scheduled deployment."""
    check_cron(cron)
    check_pool_type(pool_type)
    url = api_url()
    from prefect.settings import temporary_settings

    with temporary_settings(updates=_settings(url)):
        return _deploy(url, name, cron, work_pool, pool_type, params_file, overrides)


def _deploy(
    url: str,
    name: str,
    cron: str,
    work_pool: str,
    pool_type: str,
    params_file: str,
    overrides: list[str],
) -> Deployed:
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.client.schemas.objects import ConcurrencyLimitConfig
    from prefect.exceptions import ObjectNotFound
    from prefect.workers.base import BaseWorker

    with get_client(sync_client=True) as client:
        try:
            pool = client.read_work_pool(work_pool)
        except ObjectNotFound:
            pool = None
        if pool is not None and pool.type != pool_type:
            raise ConfigError(
                f"--work-pool {work_pool!r} exists on {url} with type {pool.type!r}, not "
                f"{pool_type!r}; pick another --work-pool or --pool-type {pool.type}"
            )
        # Load the flow before creating anything: an import error leaves the server as it was.
        source = flow.from_source(source=str(ROOT), entrypoint=ENTRYPOINT)
        if pool is None:
            worker_cls = BaseWorker.get_worker_class_from_type(pool_type)
            assert worker_cls is not None  # check_pool_type
            client.create_work_pool(
                WorkPoolCreate(
                    name=work_pool,
                    type=pool_type,
                    base_job_template=worker_cls.get_default_base_job_template(),
                )
            )
    deployment = source.to_deployment(
        name=name,
        work_pool_name=work_pool,
        cron=cron,
        parameters={"params_file": params_file, "overrides": overrides},
        concurrency_limit=ConcurrencyLimitConfig(limit=1, collision_strategy="CANCEL_NEW"),
    )
    deployment_id = deployment.apply(work_pool_name=work_pool)
    ready = services.work_pool_status(url, work_pool) == "READY"
    return Deployed(str(deployment_id), f"{FLOW_NAME}/{name}", url, work_pool, ready)


# ----------------------------------------------------------------------------- manage


# Runs of a deployment that have not started: Scheduled (Late and AwaitingConcurrencySlot are
# Scheduled states too) and Pending (a worker took it and is starting it).
_NOT_STARTED = ("SCHEDULED", "PENDING")


@dataclass(frozen=True)
class Managed:
    name: str  # fedapt-experiment/<name>
    api_url: str
    cancelled: list[str]  # the runs that had not started, now Cancelled
    running: list[tuple[str, str]]  # (name, id) of the runs still running: they run to the end


def _settings(url: str) -> dict[Any, str]:
    """Prefect's settings for the API at ``url``: with the auth string of `fedapt up --auth
    on`'s server when it is that one (``services.prefect_settings``)."""
    import prefect.settings

    return {getattr(prefect.settings, k): v for k, v in services.prefect_settings(url).items()}


def _client() -> Any:
    from prefect.client.orchestration import get_client

    return get_client(sync_client=True)


def _ours(client: Any) -> list[Any]:
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName

    flows = FlowFilter(name=FlowFilterName(any_=[FLOW_NAME]))
    return sorted(client.read_deployments(flow_filter=flows, limit=200), key=lambda d: d.name)


def _find(client: Any, name: str, url: str) -> Any:
    short = name.removeprefix(f"{FLOW_NAME}/")
    for dep in _ours(client):
        if dep.name == short:
            return dep
    known = ", ".join(d.name for d in _ours(client))
    raise ConfigError(
        f"no deployment {name!r} of {FLOW_NAME} on {url}; "
        + (f"known: {known}" if known else "none yet (create one with: fedapt deploy --cron ...)")
    )


def _runs(client: Any, deployment_id: Any, states: tuple[str, ...]) -> list[Any]:
    from prefect.client.schemas.filters import (
        DeploymentFilter,
        DeploymentFilterId,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType

    wanted = FlowRunFilterStateType(any_=[StateType(s) for s in states])
    return list(
        client.read_flow_runs(
            flow_run_filter=FlowRunFilter(state=FlowRunFilterState(type=wanted)),
            deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id])),
            limit=200,
        )
    )


SETTLE_SECONDS = 3.0  # after the last cancellation: the scheduler's iteration in flight ends


def _schedule_made(run: Any) -> bool:
    """A run the server's pause deletes itself: made by the scheduler, Scheduled (Late too)
    and never started, not one waiting for a concurrency slot."""
    return bool(
        run.auto_scheduled
        and run.state_type is not None
        and run.state_type.value == "SCHEDULED"
        and run.state_name != "AwaitingConcurrencySlot"
        and not run.run_count
    )


def _cancel_not_started(client: Any, deployment_id: Any, why: str) -> list[str]:
    """Cancel the deployment's runs that have not started, then keep looking for
    ``SETTLE_SECONDS`` after the last one: a scheduler iteration that read the deployment as
    active just before the pause still inserts its runs (seen on a loaded machine). Those,
    the schedule's own runs, are deleted as the server's pause deletes them, not reported as
    cancelled; the returned names are the runs someone asked for (by hand, or a worker took)."""
    import time

    from prefect.exceptions import ObjectNotFound
    from prefect.states import Cancelled

    cancelled: list[str] = []
    deadline = time.monotonic() + SETTLE_SECONDS
    while True:
        runs = _runs(client, deployment_id, _NOT_STARTED)
        for run in runs:
            if _schedule_made(run):
                try:
                    client.delete_flow_run(run.id)
                except ObjectNotFound:  # the server's pause deleted it first
                    pass
                continue
            client.set_flow_run_state(run.id, Cancelled(message=why), force=True)
            cancelled.append(run.name)
        if runs:
            deadline = time.monotonic() + SETTLE_SECONDS
        if time.monotonic() >= deadline:
            return cancelled
        time.sleep(0.5)


def manage(action: str, name: str) -> Managed:
    """``pause`` (no new runs; the runs that have not started are cancelled), ``resume`` (the
    scheduler creates runs again) or ``delete`` (the deployment and its runs that have not
    started) the deployment ``name`` (``<name>`` or ``fedapt-experiment/<name>``). A run
    already Running is left to finish; ``Managed.running`` names it."""
    if action not in ("pause", "resume", "delete"):
        raise ConfigError(f"unknown action {action!r}; allowed: pause, resume, delete")
    url = api_url()
    from prefect.settings import temporary_settings

    with temporary_settings(updates=_settings(url)), _client() as client:
        dep = _find(client, name, url)
        why = f"deployment {FLOW_NAME}/{dep.name} {action}d with fedapt deploy {action}"
        cancelled: list[str] = []
        if action == "pause":
            client.pause_deployment(dep.id)  # first: the scheduler creates no new run
            cancelled = _cancel_not_started(client, dep.id, why)
        elif action == "resume":
            client.resume_deployment(dep.id)
        else:
            client.pause_deployment(dep.id)
            cancelled = _cancel_not_started(client, dep.id, why)
        # before a delete: its runs no longer name a deleted deployment
        running = [(r.name, str(r.id)) for r in _runs(client, dep.id, ("RUNNING",))]
        if action == "delete":
            client.delete_deployment(dep.id)
    return Managed(f"{FLOW_NAME}/{dep.name}", url, cancelled, running)


def listing() -> tuple[str, list[dict[str, str]]]:
    """The deployments of the experiment flow on the server: name, state, cron, work pool,
    the next scheduled run. Returns (API URL, rows)."""
    url = api_url()
    from prefect.settings import temporary_settings

    rows = []
    with temporary_settings(updates=_settings(url)), _client() as client:
        for dep in _ours(client):
            crons = [getattr(s.schedule, "cron", None) for s in dep.schedules or []]
            upcoming = sorted(
                r.next_scheduled_start_time or r.expected_start_time
                for r in _runs(client, dep.id, ("SCHEDULED",))
                if (r.next_scheduled_start_time or r.expected_start_time) is not None
            )
            rows.append(
                {
                    "name": dep.name,
                    "state": "paused" if dep.paused else "active",
                    "cron": ", ".join(c for c in crons if c) or "-",
                    "work pool": dep.work_pool_name or "-",
                    "next run": f"{upcoming[0].astimezone(UTC):%Y-%m-%d %H:%M} UTC"
                    if upcoming
                    else "-",
                    "id": str(dep.id),
                }
            )
    return url, rows
