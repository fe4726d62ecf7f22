"""What the clients of the services get: the variables of the services that are up, an
embedded SeaweedFS for a block, and the environment of ``fedapt run``."""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import os
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from flows.services.config import (
    _QUIET_ENV,
    DEFAULT_BUCKET,
    HOST,
    START_TIMEOUT,
    USER_S3_VARS,
    ServiceError,
    state_dir,
)
from flows.services.procs import (
    _check_port,
    _group_alive,
    _lock_holder,
    _locked,
    _pid_alive,
    _prepare_dir,
    _spawn,
    _terminate,
    _untie,
    _url,
    free_port,
    probe,
)
from flows.services.s3 import (
    _data_lock,
    _ensure_buckets,
    remove_leftovers,
    s3_client_env,
    weed_leftovers,
)
from flows.services.supervisor import _command, _wait_healthy, status

# ----------------------------------------------------------------------------- clients


def user_configured_s3(environ: Mapping[str, str] | None = None) -> bool:
    """True when the user set an S3 endpoint, keys or profile (their S3/MinIO/AWS wins)."""
    env = os.environ if environ is None else environ
    return any(env.get(k) for k in USER_S3_VARS)


def env_for_clients(
    state: str | os.PathLike[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    probe_timeout: float = 1.0,
) -> dict[str, str]:
    """Variables to ADD for a client of the services that are up and healthy.

    Never returns a variable already set in ``environ`` (default ``os.environ``). The S3 group
    (``AWS_ENDPOINT_URL``, ``MLFLOW_S3_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``,
    ``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION``) is all-or-nothing: skipped entirely when
    the user configured any of ``USER_S3_VARS``, so their endpoint never meets our keys.
    """
    env = os.environ if environ is None else environ
    st = status(state=state, probe_timeout=probe_timeout)
    found: dict[str, str] = {}
    if st["s3"].healthy and st["s3"].url and not user_configured_s3(env):
        found.update(s3_client_env(st["s3"].url))
    if st["mlflow"].healthy and st["mlflow"].url:
        found["MLFLOW_TRACKING_URI"] = st["mlflow"].url
    if st["prefect"].healthy and st["prefect"].url:
        found["PREFECT_API_URL"] = st["prefect"].url + "/api"
    return {k: v for k, v in found.items() if not env.get(k)}


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
        info = EmbeddedS3(current.url, s3_client_env(current.url), False, current.pid, current.log)
        with patched_environ(info.env) if set_env else contextlib.nullcontext():
            yield info
        return
    with contextlib.ExitStack() as stack:
        with _locked(sd):  # a data dir is served by one SeaweedFS at a time
            if status(["s3"], state=sd)["s3"].state == "running":
                raise ServiceError(
                    "s3 service is recorded as running but unhealthy; run `fedapt down` first"
                )
            shared = _share(sd, stack, timeout)
            if shared is None:
                _check_port("s3", port)
                _prepare_dir(sd)
                port = port or free_port()
                cmd, env, cwd = _command("s3", sd, port, {})
                log = sd / "logs" / "s3-embedded.log"
                users = _users_lock(sd, stack)  # this run is the server's first user
                # Its own session (Ctrl-C at the terminal does not reach it: the run stops
                # it, last) and tied to this process: it dies with the run (kill -9 too),
                # or after the last run sharing it.
                pid = _spawn(
                    cmd,
                    env,
                    cwd,
                    log,
                    _data_lock(sd),
                    tied=True,
                    users=_users_path(sd),
                    info={"url": _url(port)},
                    leftovers=weed_leftovers(cmd),  # its watchdog removes them
                )
                stack.callback(_stop_embedded, pid, users, weed_leftovers(cmd))
        if shared is not None:
            with patched_environ(shared.env) if set_env else contextlib.nullcontext():
                yield shared
            return
        deadline = time.monotonic() + timeout
        _wait_healthy("s3", pid, port, log, deadline)
        _ensure_buckets(_url(port), buckets, deadline)
        info = EmbeddedS3(_url(port), s3_client_env(_url(port)), True, pid, str(log))
        with patched_environ(info.env) if set_env else contextlib.nullcontext():
            yield info


def _users_path(sd: Path) -> Path:
    return _data_lock(sd).with_name(".fedapt-users.lock")


def _users_lock(sd: Path, stack: contextlib.ExitStack, block: bool = True) -> int | None:
    """A shared flock on the users file of the embedded S3 for the rest of ``stack`` (None
    when ``block`` is False and its watchdog holds it exclusively: the server is stopping)."""
    fd = os.open(_users_path(sd), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | (0 if block else fcntl.LOCK_NB))
    except BlockingIOError:
        os.close(fd)
        return None
    stack.callback(os.close, fd)
    return fd


def _share(sd: Path, stack: contextlib.ExitStack, timeout: float) -> EmbeddedS3 | None:
    """The embedded SeaweedFS another run started on this data folder (still serving: its
    run, or another run sharing it, is alive), as a user of it (a shared flock on its users
    file, held for ``stack``); None when there is none."""
    lock = _data_lock(sd)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:  # no server holds the data folder: nothing to share (the file may name a dead one)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return None
    except BlockingIOError:
        pass
    finally:
        os.close(fd)
    info = _lock_holder(lock)
    url, pid = info.get("url"), info.get("pid")
    if info.get("kind") != "embedded" or not isinstance(url, str):
        return None
    if not isinstance(pid, int) or not _pid_alive(pid):
        return None
    deadline = time.monotonic() + timeout
    while not probe(f"{url}/healthz", timeout=2.0):  # its run may still be starting it
        if not _pid_alive(pid) or time.monotonic() >= deadline:
            return None
        time.sleep(0.25)
    if _users_lock(sd, stack, block=False) is None:
        return None  # stopping: the next start waits for its data lock
    return EmbeddedS3(url, s3_client_env(url), False, pid, info.get("log"))


def _stop_embedded(pid: int, users: int | None, leftovers: Iterable[str] = ()) -> None:
    """At the end of the run that started it: stop it now when no other run uses it, else
    leave it to its watchdog, which stops it after the last user (the pipe closes here).
    Either way its ``leftovers`` (sockets, logs) go when it has stopped."""
    try:
        if users is not None:
            fcntl.flock(users, fcntl.LOCK_EX | fcntl.LOCK_NB)  # SH -> EX: the only user?
    except BlockingIOError:
        _untie(pid)
        return
    if _pid_alive(pid) or _group_alive(pid):
        _terminate(pid)
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
    _prepare_dir(sd)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PREFECT_API_URL", "PREFECT_API_KEY", "PREFECT_API_AUTH_STRING")
    }
    env.update(_QUIET_ENV)
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
        pid = _spawn(_prefect_server_command(port), env, Path.cwd(), log, tied=True)
        try:
            _wait_healthy("prefect", pid, port, log, deadline)
        except BaseException:
            _terminate(pid, timeout=10.0)
            raise
    try:
        yield f"{_url(port)}/api"
    except Exception:
        # a failure too: the flow's last logs reach the server before it stops, else Prefect
        # sends them at exit and prints "Error logging to API" after the error line
        _drain_prefect_clients()
        raise
    else:
        _drain_prefect_clients()  # a normal end: the run's last logs and events reach it
    finally:
        if _pid_alive(pid) or _group_alive(pid):
            _terminate(pid, timeout=10.0)


@contextlib.contextmanager
def _exclusive(path: Path, deadline: float) -> Iterator[None]:
    """An exclusive flock on ``path`` for the block, waited for until ``deadline``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise ServiceError(f"{path} is held by another start; try again") from None
                time.sleep(0.2)
        yield
    finally:
        os.close(fd)


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


def check_prefect_api(timeout: float = 5.0) -> None:
    """The Prefect API in use (``PREFECT_API_URL``, or the active profile's) answers: any
    HTTP reply to its /health counts (a Cloud workspace may ask for its key); a URL that is
    malformed or does not connect is one line naming it."""
    import urllib.error
    import urllib.request

    from fedcore.errors import mask_credentials

    url = os.environ.get("PREFECT_API_URL")
    where = "PREFECT_API_URL" if url else "the Prefect profile's PREFECT_API_URL"
    if not url:
        with contextlib.suppress(Exception):
            url = str(sys.modules["prefect.settings"].get_current_settings().api.url or "")
    if not url:
        return
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/health", timeout=timeout):
            return
    except urllib.error.HTTPError:  # it answered
        return
    except (OSError, ValueError):  # refused, no such host, timed out, not a URL
        pass
    raise ServiceError(
        f"{where}: {mask_credentials(url)} is not reachable; start the services (fedapt up) "
        "or unset PREFECT_API_URL to run on a temporary Prefect server"
    )


def _prefect_api_configured() -> bool:
    """Prefect, when imported, already has an API URL (a profile, or settings in effect such
    as a test harness's)."""
    settings = sys.modules.get("prefect.settings")
    if settings is None:
        return False
    with contextlib.suppress(Exception):
        return bool(settings.get_current_settings().api.url)
    return False


def _refresh_prefect_settings() -> None:
    """Prefect reads its settings from the environment once, at import: re-read them when it
    is already imported (the flow module was imported to check names before servers start)."""
    context = sys.modules.get("prefect.context")
    if context is not None:
        context.refresh_global_settings_context()


@contextlib.contextmanager
def run_environment(
    state: str | os.PathLike[str] | None = None,
    *,
    need_s3: bool = False,
    need_prefect: bool = False,
) -> Iterator[dict[str, str]]:
    """What ``fedapt run`` needs: the variables of the services that are up (never overriding
    the user's), and, when ``need_s3`` and no S3 is configured or up, an embedded SeaweedFS for
    the block; when ``need_prefect`` and no Prefect API is configured or up, a temporary Prefect
    server for the block. Both are tied to this process (they die with it, kill -9 included).
    Yields the variables that were added (contains keys: do not print values)."""
    added = env_for_clients(state)
    with contextlib.ExitStack() as stack:
        stack.enter_context(patched_environ(added))
        if need_s3 and not user_configured_s3():
            s3 = stack.enter_context(embedded_s3(state))
            added = {**added, **s3.env}
        if need_prefect:
            added = {**added, **stack.enter_context(prefect_environment(state))}
        yield added


@contextlib.contextmanager
def prefect_environment(state: str | os.PathLike[str] | None = None) -> Iterator[dict[str, str]]:
    """``PREFECT_API_URL`` for the block: as configured (nothing added), else a temporary
    Prefect server tied to this process (``temporary_prefect``). Yields what was added."""
    if os.environ.get("PREFECT_API_URL") or _prefect_api_configured():
        check_prefect_api()  # one line now, not Prefect's traceback once the flow starts
        yield {}
        return
    with contextlib.ExitStack() as stack:
        api = stack.enter_context(temporary_prefect(state))
        stack.callback(_refresh_prefect_settings)  # runs after the variable is restored
        stack.enter_context(patched_environ({"PREFECT_API_URL": api}))
        _refresh_prefect_settings()
        yield {"PREFECT_API_URL": api}
