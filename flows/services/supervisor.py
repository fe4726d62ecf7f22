"""The supervisor: each service's command and environment, ``up``, ``down`` and ``status``,
and the readiness of the worker's pool."""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from fedcore.errors import ConfigError
from flows.services.config import (
    DEFAULT_BUCKET,
    DEFAULT_SERVICES,
    HOST,
    QUIET_ENV,
    ROOT,
    SERVICES,
    START_TIMEOUT,
    STOP_TIMEOUT,
    WORK_POOL,
    WORK_POOL_TYPE,
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
)
from flows.services.rayhead import (
    ensure_token,
    ray_cmd,
    ray_env,
    ray_leftovers,
    ray_ready,
    ray_record,
    stop_head,
)
from flows.services.s3 import (
    data_lock_path,
    ensure_buckets,
    remove_leftovers,
    s3_client_env,
    scratch_dir,
    weed_cmd,
    weed_leftovers,
)
from flows.services.state import now, read_state, state_lock, write_state

# ----------------------------------------------------------------------------- commands


def base_env(keep: tuple[str, ...] = ()) -> dict[str, str]:
    """The environment of a server: the user's, less the client settings of other services
    (``AWS_*``, ``MLFLOW_*``, ``PREFECT_*``) unless they start with one of ``keep``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AWS_", "MLFLOW_", "PREFECT_")) or k in QUIET_ENV or k.startswith(keep)
    }
    env.update(QUIET_ENV)
    return env


def worker_limit() -> int:
    """Flow runs the worker runs at once (``FEDAPT_WORKER_LIMIT``, default 1: a run already
    uses every core of a small machine)."""
    value = os.environ.get("FEDAPT_WORKER_LIMIT", "1")
    try:
        limit = int(value)
    except ValueError:
        limit = 0
    if limit < 1:
        raise ConfigError(f"FEDAPT_WORKER_LIMIT={value!r} is not a positive whole number")
    return limit


def command(name: str, sd: Path, port: int, records: Mapping[str, Any]) -> tuple[list, dict, Path]:
    env = base_env()
    if name == "ray":  # rayhead.py; cwd: its session folder's root
        cmd, env = ray_cmd(sd, port), ray_env(env)
        ensure_token(env)
        return cmd, env, Path(ray_record(cmd)["temp_dir"])
    if name == "s3":  # its files live in its scratch folder, removed when it stops
        env["TMPDIR"] = str(scratch_dir(sd, port))
        return weed_cmd(sd, port), env, scratch_dir(sd, port)
    bindir = Path(sys.executable).parent
    if name == "mlflow":  # configured in mlflow/server.toml
        conf = mlflow_config(sd)
        home = sd / "mlflow"
        home.mkdir(parents=True, exist_ok=True)
        env.update(s3_client_env(records["s3"]["url"]))
        cmd = [
            str(bindir / "mlflow"),
            "server",
            "--host",
            HOST,
            "--port",
            str(port),
            "--workers",
            str(conf["workers"]),
            "--backend-store-uri",
            conf["backend_store_uri"],
            "--artifacts-destination",
            conf["artifacts_destination"],
            *conf["extra_args"],
        ]
        return cmd, env, home
    if name == "worker":
        # Scheduled runs are child processes of the worker and inherit this environment:
        # the user's own MLflow/S3 settings stay (as for `fedapt run`), the flow adds the
        # services that are up (services.run_environment). Working directory: this checkout.
        env = base_env(keep=("AWS_", "MLFLOW_", "PREFECT_WORKER_"))
        env["PREFECT_HOME"] = str(sd / "prefect")
        env["PREFECT_API_URL"] = records["prefect"]["api_url"]
        env["PREFECT_WORKER_WEBSERVER_HOST"] = HOST
        env["PREFECT_WORKER_WEBSERVER_PORT"] = str(port)
        cmd = [
            str(bindir / "prefect"),
            "worker",
            "start",
            "--pool",
            WORK_POOL,
            "--type",
            WORK_POOL_TYPE,  # the pool is created if it does not exist yet
            "--name",
            f"fedapt-worker-{port}",
            "--limit",
            str(worker_limit()),
            "--with-healthcheck",
            "--install-policy",
            "never",
        ]
        return cmd, env, ROOT
    home = sd / "prefect"
    home.mkdir(parents=True, exist_ok=True)
    # The server's own settings (e.g. PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS) are
    # the user's to choose; client settings (PREFECT_API_URL ...) are not passed on.
    env = base_env(keep=("PREFECT_SERVER_",))
    env["PREFECT_HOME"] = str(home)
    env["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    # The UI asks the API at this address (else Prefect's default port, 4200: on any other
    # port, FEDAPT_PREFECT_PORT, the UI showed "Can't connect to Server API")
    env["PREFECT_UI_API_URL"] = f"{base_url(port)}/api"
    cmd = [str(bindir / "prefect"), "server", "start", "--host", HOST, "--port", str(port)]
    return cmd, env, home


def _record(name: str, pid: int, port: int, log: Path) -> dict[str, Any]:
    rec = {
        "name": name,
        "pid": pid,
        "port": port,
        "url": base_url(port),
        "health": health_url(name, port),
        "log": str(log),
        "started_at": now(),
    }
    if name == "prefect":
        rec["api_url"] = base_url(port) + "/api"
    if name == "worker":
        rec["pool"] = WORK_POOL
    if name == "ray":  # its address, not a URL: 127.0.0.1:<port> (RAY_ADDRESS)
        rec["url"] = f"{HOST}:{port}"
    return rec


def _fail(name: str, pid: int, log: Path, why: str) -> ServiceError:
    terminate(pid, timeout=5.0)
    last = last_log_line(log)
    tail = f" (last log line: {last})" if last else ""
    return ServiceError(f"{name} {why}; see {log}{tail}")


def wait_healthy(name: str, pid: int, port: int, log: Path, deadline: float) -> None:
    url = health_url(name, port)
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


def work_pool_status(api_url: str, pool: str = WORK_POOL, timeout: float = 2.0) -> str | None:
    """The status of a work pool on the Prefect server (READY while a worker polls it,
    NOT_READY, PAUSED), or None when the server does not know it or does not answer."""
    try:
        with urllib.request.urlopen(f"{api_url}/work_pools/{pool}", timeout=timeout) as resp:
            return json.loads(resp.read()).get("status")
    except (OSError, ValueError, AttributeError):
        return None


def _wait_pool_ready(rec: Mapping[str, Any], deadline: float) -> None:
    """The worker is up once its pool is READY: it created the pool and polled the server."""
    while work_pool_status(rec["api_url"], rec.get("pool", WORK_POOL)) != "READY":
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
    ``rayhead.stop_head``)."""
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
) -> dict[str, ServiceStatus]:
    """Start the services (default all but ray; mlflow pulls in s3) and wait until they are
    healthy.

    Idempotent: a recorded service that is alive and healthy is left as it is; stale records
    are dropped. Every port is checked before anything starts. Raises ``PortInUseError`` or
    ``ServiceError`` (one line naming the service and its log); a failed service is stopped.
    """
    sd = state_dir(state)
    names = with_dependencies(service_names(services, DEFAULT_SERVICES))
    wanted = resolve_ports(ports)
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
        # A service whose dependency moved (or is gone) is restarted against the new one.
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
            check_port(n, wanted[n], taken)
            if wanted[n]:
                taken.setdefault(wanted[n], n)
        deadline = time.monotonic() + timeout
        # Already running: it may still be starting (or hung) - wait for it like a new one.
        for n in names:
            if n in records:
                rec = records[n]
                _wait_running(n, rec, deadline)
        # s3 first (mlflow needs it), then mlflow and prefect side by side, then the worker.
        for group in (["s3"], ["mlflow", "prefect", "ray"], ["worker"]):
            pending = {}
            for n in group:
                if n not in to_start:
                    continue
                port = wanted[n] or free_port()
                cmd, env, cwd = command(n, sd, port, records)
                log = sd / "logs" / f"{n}.log"
                pid = spawn(cmd, env, cwd, log, data_lock_path(sd) if n == "s3" else None)
                records[n] = _record(n, pid, port, log)
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
                    wait_healthy(n, rec["pid"], rec["port"], Path(rec["log"]), deadline)
                    if n == "s3":
                        ensure_buckets(rec["url"], buckets, deadline)
                    if n == "worker":
                        _wait_pool_ready(rec, deadline)
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
        )
    return out
