"""The supervisor: ``up``, ``down`` and ``status``, and the readiness of each service (its
health probe, the worker's pool, the Ray head). Each service's command line and environment:
``commands``; which store mlflow and prefect use: ``stores``."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import time
import urllib.request
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from flows.services import auth, pgserver, pgstore
from flows.services.auth import Access
from flows.services.commands import command, worker_limit
from flows.services.config import (
    DEFAULT_BUCKET,
    DEFAULT_SERVICES,
    HOST,
    SERVICES,
    START_TIMEOUT,
    STOP_TIMEOUT,
    WORK_POOL,
    ServiceError,
    ServiceStatus,
    artifact_bucket,
    mlflow_config,
    resolve_ports,
    service_names,
    state_dir,
    with_dependants,
    with_dependencies,
)
from flows.services.ports import base_url, check_port, free_port, health_url, probe
from flows.services.process import (
    group_alive,
    is_ours,
    last_log_line,
    pid_alive,
    returncode,
    spawn,
    terminate,
    wait_until,
)
from flows.services.rayhead import ray_leftovers, ray_ready, ray_record, stop_head
from flows.services.s3 import data_lock_path, ensure_buckets, remove_leftovers, weed_leftovers
from flows.services.state import now, read_state, state_lock, write_state
from flows.services.stores import (
    preflight,
    prepare_own_server,
    same_store,
    store_record,
    with_store_server,
)


def _record(
    name: str, pid: int, port: int, log: Path, access: Access = auth.LOCAL
) -> dict[str, Any]:
    host = auth.bind_host(name, access)
    rec = {
        "name": name,
        "pid": pid,
        "port": port,
        "url": base_url(port, host),
        "health": health_url(name, port, host),
        "log": str(log),
        "started_at": now(),
        "host": host,
        "auth": access.auth,  # credentials: in <state dir>/auth/, never here
    }
    if name == "prefect":
        rec["api_url"] = base_url(port, host) + "/api"
    if name == "worker":
        rec["pool"] = WORK_POOL
    if name == "ray":  # its address, not a URL: <host>:<port> (RAY_ADDRESS)
        rec["url"] = f"{host}:{port}"
    if name == "postgres":  # no password in it: the role's is in <state dir>/postgres/password
        rec["url"] = health_url(name, port)
    return rec


def _fail(name: str, pid: int, log: Path, why: str) -> ServiceError:
    terminate(pid, timeout=5.0)
    last = last_log_line(log)
    tail = f" (last log line: {last})" if last else ""
    return ServiceError(f"{name} {why}; see {log}{tail}")


def wait_healthy(
    name: str, pid: int, port: int, log: Path, deadline: float, url: str | None = None
) -> None:
    """Wait until the server's health check (``url``, else its default on 127.0.0.1)
    answers."""
    url = url or health_url(name, port)
    while True:
        if not pid_alive(pid):
            code = returncode(pid)
            why = f"exited during start (code {code})" if code is not None else "exited"
            raise _fail(name, pid, log, why)
        if probe(url, timeout=2.0):
            return
        if time.monotonic() >= deadline:
            raise _fail(name, pid, log, f"did not answer {url} in time")
        time.sleep(0.25)


def work_pool_status(
    api_url: str, pool: str = WORK_POOL, timeout: float = 2.0, auth_string: str | None = None
) -> str | None:
    """The status of a work pool on the Prefect server (READY while a worker polls it,
    NOT_READY, PAUSED), or None when the server does not know it or does not answer
    (``auth_string``: Prefect's, for a server that asks for it)."""
    request = urllib.request.Request(f"{api_url}/work_pools/{pool}")
    if auth_string:
        token = base64.b64encode(auth_string.encode()).decode()
        request.add_unredirected_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return json.loads(resp.read()).get("status")
    except (OSError, ValueError, AttributeError):
        return None


def _wait_pool_ready(rec: Mapping[str, Any], deadline: float, auth_string: str | None) -> None:
    """The worker is up once its pool is READY: it created the pool and polled the server."""
    pool = rec.get("pool", WORK_POOL)
    while work_pool_status(rec["api_url"], pool, auth_string=auth_string) != "READY":
        if not pid_alive(rec["pid"]):
            raise _fail("worker", rec["pid"], Path(rec["log"]), "exited during start")
        if time.monotonic() >= deadline:
            raise _fail(
                "worker", rec["pid"], Path(rec["log"]), f"did not make pool {WORK_POOL} ready"
            )
        time.sleep(0.25)


def _wait_ray_ready(rec: Mapping[str, Any], deadline: float) -> None:
    """The Ray head is up once ``ray start`` wrote its address file (rayhead.ray_ready)."""
    while not ray_ready(rec):
        if not pid_alive(rec["pid"]):
            code = returncode(rec["pid"])
            why = f"exited during start (code {code})" if code is not None else "exited"
            raise _fail("ray", rec["pid"], Path(rec["log"]), why)
        if time.monotonic() >= deadline:
            raise _fail("ray", rec["pid"], Path(rec["log"]), "did not start in time")
        time.sleep(0.25)


def _stop(name: str, rec: Mapping[str, Any], timeout: float) -> None:
    """Stop a recorded service that is still ours: its process group (the Ray head: see
    ``rayhead.stop_head``; PostgreSQL: first its fast shutdown, SIGINT to the postmaster,
    which ends its sessions and writes a checkpoint)."""
    if name == "postgres":
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(int(rec["pid"]), signal.SIGINT)
        wait_until(lambda: not group_alive(int(rec["pid"])), timeout)
    if name == "ray":
        stop_head(rec, timeout)
        if not group_alive(int(rec["pid"])):
            return
    terminate(int(rec["pid"]), timeout=timeout)


def _alive_record(name: str, rec: Mapping[str, Any] | None) -> bool:
    return bool(rec) and is_ours(rec.get("pid"), name)  # type: ignore[union-attr]


def up(
    services: Iterable[str] | None = None,
    *,
    state: str | os.PathLike[str] | None = None,
    ports: Mapping[str, int] | None = None,
    timeout: float = START_TIMEOUT,
    buckets: Iterable[str] = (DEFAULT_BUCKET,),
    store: str | None = None,
    host: str | None = None,
    auth_mode: str | None = None,
) -> dict[str, ServiceStatus]:
    """Start the services (default all but ray; mlflow pulls in s3) and wait until they are
    healthy. ``store``: where Prefect and MLflow keep their data (``pgstore``: sqlite,
    postgres, a postgresql:// URL; default ``$FEDAPT_STORE``, else the running services',
    else sqlite); fedapt's PostgreSQL server (service ``postgres``) starts first when it is
    theirs. ``host``, ``auth_mode`` (on, off): the address they listen on and whether they
    ask for credentials (``auth``: default ``$FEDAPT_HOST``, ``$FEDAPT_AUTH``, else the
    running services', else 127.0.0.1 without; another address needs ``auth_mode="on"``).

    Idempotent: a recorded service that is alive and healthy is left as it is; stale records
    are dropped. Every port is checked before anything starts. Raises ``PortInUseError`` or
    ``ServiceError`` (one line naming the service and its log); a failed service is stopped.
    """
    sd = state_dir(state)
    names = with_dependencies(service_names(services, DEFAULT_SERVICES))
    wanted = resolve_ports(ports)
    running = {n: r for n, r in read_state(sd).items() if _alive_record(n, r)}
    access = auth.resolve_access(host, auth_mode, running)  # before anything starts
    chosen = pgstore.resolve_store(store, running)
    names = with_store_server(chosen, names)
    preflight(chosen, names, sd, running)  # a bad store stops here, before anything starts
    credentials: dict[str, str] = {}
    if access.auth:  # yours (FEDAPT_*), kept or new; half a pair is one line here
        needs = {"worker": "prefect"}
        credentials = auth.check_credentials(sd, {needs.get(n, n) for n in names})
    auth.check_packages(access, names)
    buckets = list(buckets)
    if "worker" in names:  # a bad FEDAPT_WORKER_LIMIT too
        worker_limit()
    if "mlflow" in names:  # a bad mlflow/server.toml stops here, before anything starts
        bucket = artifact_bucket(mlflow_config(sd)["artifacts_destination"])
        if bucket and "s3" in names and bucket not in buckets:
            buckets.append(bucket)  # the artifact store's bucket, on fedapt's S3
    with state_lock(sd):
        records = read_state(sd)
        for n in list(records):
            if not _alive_record(n, records[n]):
                if n == "ray":  # its `ray start` is gone: any process left of it
                    stop_head(records[n], timeout=0)
                remove_leftovers(records.pop(n).get("leftovers", []))
        # A service whose store or dependency moved (or is gone) is restarted against it.
        for n in pgstore.STORE_USERS:
            rec = records.get(n)
            if rec and n in names and not same_store(rec, chosen, sd, records):
                terminate(int(rec["pid"]))
                records.pop(n)
        # ... and one on another address, or with other authentication
        for n in names:
            rec = records.get(n)
            if rec and n != "postgres" and not _same_access(n, rec, access):
                _stop(n, rec, STOP_TIMEOUT)
                remove_leftovers(records.pop(n).get("leftovers", []))
        for n, dep, key, field in (
            ("mlflow", "s3", "s3_url", "url"),
            ("worker", "prefect", "api_url", "api_url"),
        ):
            rec, dep_rec = records.get(n), records.get(dep)
            if rec and n in names and (not dep_rec or rec.get(key) != dep_rec.get(field)):
                terminate(int(rec["pid"]))
                records.pop(n)
        write_state(sd, records)
        to_start = [n for n in names if n not in records]
        # the ports of the services running, and of those about to start: two services
        # never get one port (FEDAPT_PREFECT_PORT=4201 is the worker's default port)
        taken = {int(r["port"]): n for n, r in records.items() if r.get("port")}
        for n in to_start:
            check_port(n, wanted[n], taken, auth.bind_host(n, access))
            if wanted[n]:
                taken.setdefault(wanted[n], n)
        auth.keep_credentials(sd, credentials)  # <state dir>/auth/, each file 0600
        deadline = time.monotonic() + timeout
        # Already running: it may still be starting (or hung) - wait for it like a new one.
        for n in names:
            if n in records:
                rec = records[n]
                _wait_running(n, rec, deadline)
        # s3 and postgres first (mlflow and prefect need them; postgres's initdb before s3
        # starts), then mlflow and prefect side by side, then the worker.
        for group in (["postgres", "s3"], ["mlflow", "prefect", "ray"], ["worker"]):
            pending = {}
            for n in group:
                if n not in to_start:
                    continue
                port = wanted[n] or free_port()
                cmd, env, cwd = command(n, sd, port, records, chosen, access)
                log = sd / "logs" / f"{n}.log"
                user = None
                if n == "postgres":  # its data folder, made once; as postgres under root
                    user = pgserver.run_as()
                    pgserver.initdb(sd, Path(cmd[0]).parent, env, log, user)
                lock = data_lock_path(sd) if n == "s3" else None
                pid = spawn(cmd, env, cwd, log, lock, user=user)
                records[n] = _record(n, pid, port, log, access)
                if n in pgstore.STORE_USERS:
                    records[n].update(store_record(n, chosen, sd, records, env))
                if n == "s3":
                    records[n]["leftovers"] = weed_leftovers(cmd)
                if n == "ray":  # address, client_url, temp_dir
                    records[n].update(ray_record(cmd))
                    records[n]["leftovers"] = ray_leftovers(sd, records[n]["temp_dir"])
                if n == "mlflow":
                    records[n]["s3_url"] = records["s3"]["url"]
                if n == "worker":
                    records[n]["api_url"] = records["prefect"]["api_url"]
                write_state(sd, records)
                pending[n] = records[n]
            try:
                for n, rec in pending.items():
                    log = Path(rec["log"])
                    wait_healthy(n, rec["pid"], rec["port"], log, deadline, rec["health"])
                    if n == "s3":
                        keys = auth.s3_keys(sd) if access.auth else None
                        ensure_buckets(rec["url"], buckets, deadline, keys)
                    if n == "postgres":  # Prefect's and MLflow's databases, pg_trgm
                        prepare_own_server(chosen, sd, int(rec["port"]))
                    if n == "worker":
                        prefect_auth = auth.client_env(sd, records).get("PREFECT_API_AUTH_STRING")
                        _wait_pool_ready(rec, deadline, prefect_auth)
                    if n == "ray":
                        _wait_ray_ready(rec, deadline)
            except BaseException:  # also Ctrl-C: a failed group leaves nothing half-started
                for n, rec in pending.items():
                    if n == "ray":
                        stop_head(rec, timeout=5.0)
                    if group_alive(rec["pid"]):
                        terminate(rec["pid"], timeout=5.0)
                    remove_leftovers(rec.get("leftovers", []))
                    records.pop(n, None)
                write_state(sd, records)
                raise
    return status(names, state=sd)


def _same_access(name: str, rec: Mapping[str, Any], access: Access) -> bool:
    """The running service of ``rec`` listens where ``access`` says, with its authentication
    (a record of before ``--host``: 127.0.0.1, without)."""
    host = rec.get("host", HOST)
    return host == auth.bind_host(name, access) and bool(rec.get("auth")) == access.auth


def _wait_running(name: str, rec: Mapping[str, Any], deadline: float) -> None:
    url = rec.get("health") or health_url(name, int(rec["port"]))
    while not probe(url, timeout=2.0):
        if time.monotonic() >= deadline:
            raise ServiceError(
                f"{name} is running (pid {rec['pid']}) but does not answer {url}; see "
                f"{rec.get('log')} or restart it with `fedapt down` then `fedapt up`"
            )
        time.sleep(0.25)


def down(
    services: Iterable[str] | None = None,
    *,
    state: str | os.PathLike[str] | None = None,
    timeout: float = STOP_TIMEOUT,
) -> dict[str, ServiceStatus]:
    """Stop the services (default all, ray included) and those that depend on them (s3 ->
    mlflow too), dependants first: SIGTERM to the process group, wait ``timeout``, then
    SIGKILL (the Ray head: ``rayhead.stop_head``).

    Stale records are dropped. Returns the status after stopping.
    """
    sd = state_dir(state)
    names = with_dependants(service_names(services))
    with state_lock(sd):
        records = read_state(sd)
        if "postgres" in names:  # and the services whose store it is
            users = [n for n, r in records.items() if r.get("store_kind") == "postgres"]
            names = with_dependants([*names, *users])
        for n in reversed(SERVICES):
            if n not in names or n not in records:
                continue
            rec = records[n]
            if is_ours(rec.get("pid"), n):
                _stop(n, rec, timeout)
            elif n == "ray":  # its `ray start` is gone: any process left of it
                stop_head(rec, timeout=0)
            remove_leftovers(rec.get("leftovers", []))  # s3: its sockets and logs
            records.pop(n)
            write_state(sd, records)
    return status(names, state=sd)


def status(
    services: Iterable[str] | None = None,
    *,
    state: str | os.PathLike[str] | None = None,
    probe_timeout: float = 1.0,
) -> dict[str, ServiceStatus]:
    """Each service: running / stopped / stale, pid, url, log and a quick health probe."""
    names = service_names(services)
    records = read_state(state)
    out = {}
    for n in names:
        rec = records.get(n)
        if not rec:
            out[n] = ServiceStatus(n, "stopped", False)
            continue
        alive = is_ours(rec.get("pid"), n)
        healthy = alive and probe(
            rec.get("health") or health_url(n, int(rec["port"])), probe_timeout
        )
        out[n] = ServiceStatus(
            n,
            "running" if alive else "stale",
            healthy,
            pid=rec.get("pid"),
            port=rec.get("port"),
            url=rec.get("url"),
            log=rec.get("log"),
            started_at=rec.get("started_at"),
            store=rec.get("store"),
            auth=bool(rec.get("auth")),
        )
    return out
