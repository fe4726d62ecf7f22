"""The servers a run starts for itself, tied to it (they die with it, kill -9 included): an
embedded SeaweedFS for a block (shared by the runs on one data folder, stopped after the last
of them) and a temporary Prefect API server; and ``patched_environ``, which points the block
at them."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock, Timeout

from flows.services.auth import s3_keys
from flows.services.commands import command
from flows.services.config import (
    DEFAULT_BUCKET,
    HOST,
    QUIET_ENV,
    START_TIMEOUT,
    ServiceError,
    state_dir,
)
from flows.services.ports import base_url, check_port, free_port, probe
from flows.services.process import (
    flock_fd,
    group_alive,
    lock_holder,
    pid_alive,
    spawn,
    terminate,
    untie,
)
from flows.services.s3 import (
    data_lock,
    data_lock_path,
    ensure_buckets,
    remove_leftovers,
    s3_client_env,
    weed_leftovers,
)
from flows.services.state import prepare_dir, state_lock
from flows.services.supervisor import status, wait_healthy


@contextlib.contextmanager
def patched_environ(values: Mapping[str, str]) -> Iterator[None]:
    """Set ``values`` in os.environ for the block, restoring the previous values afterwards."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, old in saved.items():
            if old is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = old


@dataclass(frozen=True)
class EmbeddedS3:
    endpoint: str
    env: Mapping[str, str]  # the S3 client variables (contains the local keys: do not print)
    started: bool  # False when the running `s3` service was reused
    pid: int | None = None
    log: str | None = None

    def __repr__(self) -> str:  # keep the keys out of reprs and logs
        return f"EmbeddedS3(endpoint={self.endpoint!r}, started={self.started}, pid={self.pid})"


@contextlib.contextmanager
def embedded_s3(
    state: str | os.PathLike[str] | None = None,
    *,
    port: int = 0,
    timeout: float = START_TIMEOUT,
    buckets: Iterable[str] = (DEFAULT_BUCKET,),
    set_env: bool = True,
) -> Iterator[EmbeddedS3]:
    """SeaweedFS for the duration of the block, data in ``<state_dir>/s3`` (persistent).

    When the ``s3`` service of ``fedapt up`` is running and healthy it is reused (not stopped
    at exit); so is the embedded SeaweedFS of another run on the same data folder (concurrent
    runs of different experiments share it: it stops after its last user, see ``_share``).
    With ``set_env`` the S3 client variables are set in os.environ for the block (overriding,
    then restored): call this only when the user configured no S3 (see
    ``user_configured_s3``). A server started here stops at exit (also on errors), or, while
    other runs still use it, right after the last of them.
    """
    sd = state_dir(state)
    current = status(["s3"], state=sd)["s3"]
    if current.healthy and current.url:
        keys = s3_keys(sd) if current.auth else None  # fedapt up --auth on
        info = EmbeddedS3(
            current.url, s3_client_env(current.url, keys), False, current.pid, current.log
        )
        with patched_environ(info.env) if set_env else contextlib.nullcontext():
            yield info
        return
    with contextlib.ExitStack() as stack:
        with state_lock(sd):  # a data dir is served by one SeaweedFS at a time
            if status(["s3"], state=sd)["s3"].state == "running":
                raise ServiceError(
                    "s3 service is recorded as running but unhealthy; run `fedapt down` first"
                )
            shared = _share(sd, stack, timeout)
            if shared is None:
                check_port("s3", port)
                prepare_dir(sd)
                port = port or free_port()
                cmd, env, cwd = command("s3", sd, port, {})
                log = sd / "logs" / "s3-embedded.log"
                users = _users_lock(sd, stack)  # this run is the server's first user
                # Its own session (Ctrl-C at the terminal does not reach it: the run stops
                # it, last) and tied to this process: it dies with the run (kill -9 too),
                # or after the last run sharing it.
                pid = spawn(
                    cmd,
                    env,
                    cwd,
                    log,
                    data_lock_path(sd),
                    tied=True,
                    users=_users_path(sd),
                    info={"url": base_url(port)},
                    leftovers=weed_leftovers(cmd),  # its watchdog removes them
                )
                stack.callback(_stop_embedded, pid, users, weed_leftovers(cmd))
        if shared is not None:
            with patched_environ(shared.env) if set_env else contextlib.nullcontext():
                yield shared
            return
        deadline = time.monotonic() + timeout
        wait_healthy("s3", pid, port, log, deadline)
        ensure_buckets(base_url(port), buckets, deadline)
        info = EmbeddedS3(base_url(port), s3_client_env(base_url(port)), True, pid, str(log))
        with patched_environ(info.env) if set_env else contextlib.nullcontext():
            yield info


def _users_path(sd: Path) -> Path:
    return data_lock_path(sd).with_name(".fedapt-users.lock")


def _users_lock(sd: Path, stack: contextlib.ExitStack, block: bool = True) -> int | None:
    """A shared flock on the users file of the embedded S3 for the rest of ``stack`` (None
    when ``block`` is False and its watchdog holds it exclusively: the server is stopping)."""
    fd = os.open(_users_path(sd), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    if not flock_fd(fd, shared=True, block=block):
        os.close(fd)
        return None
    stack.callback(os.close, fd)
    return fd


def _share(sd: Path, stack: contextlib.ExitStack, timeout: float) -> EmbeddedS3 | None:
    """The embedded SeaweedFS another run started on this data folder (still serving: its
    run, or another run sharing it, is alive), as a user of it (a shared flock on its users
    file, held for ``stack``); None when there is none."""
    try:  # no server holds the data folder: nothing to share (the file may name a dead one)
        with data_lock(sd):
            return None
    except Timeout:
        pass
    info = lock_holder(data_lock_path(sd))
    url, pid = info.get("url"), info.get("pid")
    if info.get("kind") != "embedded" or not isinstance(url, str):
        return None
    if not isinstance(pid, int) or not pid_alive(pid):
        return None
    deadline = time.monotonic() + timeout
    while not probe(f"{url}/healthz", timeout=2.0):  # its run may still be starting it
        if not pid_alive(pid) or time.monotonic() >= deadline:
            return None
        time.sleep(0.25)
    if _users_lock(sd, stack, block=False) is None:
        return None  # stopping: the next start waits for its data lock
    return EmbeddedS3(url, s3_client_env(url), False, pid, info.get("log"))


def _stop_embedded(pid: int, users: int | None, leftovers: Iterable[str] = ()) -> None:
    """At the end of the run that started it: stop it now when no other run uses it, else
    leave it to its watchdog, which stops it after the last user (the pipe closes here).
    Either way its ``leftovers`` (sockets, logs) go when it has stopped."""
    if users is not None and not flock_fd(users):  # SH -> EX: the only user?
        untie(pid)
        return
    if pid_alive(pid) or group_alive(pid):
        terminate(pid)
    remove_leftovers(leftovers)  # also when its watchdog was killed before it could


def _prefect_server_command(port: int) -> list[str]:
    """The command Prefect 3.8 runs for its own temporary server (``SubprocessASGIServer``
    in prefect/server/api/server.py): the API app under uvicorn, no UI."""
    spec = importlib.util.find_spec("prefect")
    if spec is None or not spec.submodule_search_locations:
        raise ServiceError("prefect cannot start: the prefect package is not installed")
    app_dir = Path(list(spec.submodule_search_locations)[0]).parent
    return [
        sys.executable,
        "-m",
        "uvicorn",
        "--app-dir",
        str(app_dir),
        "--factory",
        "prefect.server.api.server:create_app",
        "--host",
        HOST,
        "--port",
        str(port),
        "--log-level",
        "error",
        "--lifespan",
        "on",
    ]


@contextlib.contextmanager
def temporary_prefect(
    state: str | os.PathLike[str] | None = None, *, timeout: float = START_TIMEOUT
) -> Iterator[str]:
    """A temporary Prefect API server for the block (``fedapt run`` when no Prefect server
    is configured or up); yields its API URL. It is what Prefect would start by itself
    (ephemeral mode), but started here, tied to this process: Prefect's own one is stopped
    only by an ``atexit`` hook, so SIGTERM or kill -9 of the run left it running forever.
    Database: ``$PREFECT_HOME`` of the run, as before."""
    sd = state_dir(state)
    prepare_dir(sd)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PREFECT_API_URL", "PREFECT_API_KEY", "PREFECT_API_AUTH_STRING")
    }
    env.update(QUIET_ENV)
    env.update(
        {"PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1"}
    )
    log = sd / "logs" / "prefect-temporary.log"
    deadline = time.monotonic() + timeout
    # One start at a time per Prefect home: concurrent runs' servers share its database, and
    # two servers migrating a new database at once fail ("duplicate column name").
    home = Path(os.environ.get("PREFECT_HOME") or Path.home() / ".prefect")
    with _exclusive(home / ".fedapt-server-start.lock", deadline):
        port = free_port()
        pid = spawn(_prefect_server_command(port), env, Path.cwd(), log, tied=True)
        try:
            wait_healthy("prefect", pid, port, log, deadline)
        except BaseException:
            terminate(pid, timeout=10.0)
            raise
    try:
        yield f"{base_url(port)}/api"
    except Exception:
        # a failure too: the flow's last logs reach the server before it stops, else Prefect
        # sends them at exit and prints "Error logging to API" after the error line
        _drain_prefect_clients()
        raise
    else:
        _drain_prefect_clients()  # a normal end: the run's last logs and events reach it
    finally:
        if pid_alive(pid) or group_alive(pid):
            terminate(pid, timeout=10.0)


@contextlib.contextmanager
def _exclusive(path: Path, deadline: float) -> Iterator[None]:
    """An exclusive lock on ``path`` for the block, waited for until ``deadline``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(
        path,
        timeout=max(0.0, deadline - time.monotonic()),
        mode=0o644,
        thread_local=False,
        poll_interval=0.2,
        fallback_to_soft=False,
    )
    try:
        lock.acquire()
    except Timeout:
        raise ServiceError(f"{path} is held by another start; try again") from None
    try:
        yield
    finally:
        lock.release()


def _drain_prefect_clients(timeout: float = 5.0) -> None:
    """Send what Prefect's background log and event workers still hold, before the server
    they send to stops (else they fail at exit: "Error logging to API")."""
    for module, worker in (
        ("prefect.logging.handlers", "APILogWorker"),
        ("prefect.events.worker", "EventsWorker"),
    ):
        service = getattr(sys.modules.get(module), worker, None)
        if service is not None:
            with contextlib.suppress(Exception):
                service.drain_all(timeout=timeout)
