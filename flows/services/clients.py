"""What the clients of the services get: the variables of the services that are up, an
embedded SeaweedFS for a block, and the environment of ``fedapt run``."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from flows.services.config import (
    DEFAULT_BUCKET,
    START_TIMEOUT,
    USER_S3_VARS,
    ServiceError,
    state_dir,
)
from flows.services.procs import (
    _check_port,
    _group_alive,
    _locked,
    _pid_alive,
    _prepare_dir,
    _spawn,
    _terminate,
    _url,
    free_port,
)
from flows.services.s3 import _data_lock, _ensure_buckets, s3_client_env
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
    at exit). With ``set_env`` the S3 client variables are set in os.environ for the block
    (overriding, then restored): call this only when the user configured no S3 (see
    ``user_configured_s3``). The server is stopped at exit, also on errors.
    """
    sd = state_dir(state)
    current = status(["s3"], state=sd)["s3"]
    if current.healthy and current.url:
        info = EmbeddedS3(current.url, s3_client_env(current.url), False, current.pid, current.log)
        with patched_environ(info.env) if set_env else contextlib.nullcontext():
            yield info
        return
    with _locked(sd):  # a data dir is served by one SeaweedFS at a time
        if status(["s3"], state=sd)["s3"].state == "running":
            raise ServiceError(
                "s3 service is recorded as running but unhealthy; run `fedapt down` first"
            )
        _check_port("s3", port)
        _prepare_dir(sd)
        port = port or free_port()
        cmd, env, cwd = _command("s3", sd, port, {})
        log = sd / "logs" / "s3-embedded.log"
        pid = _spawn(cmd, env, cwd, log, _data_lock(sd))
    try:
        deadline = time.monotonic() + timeout
        _wait_healthy("s3", pid, port, log, deadline)
        _ensure_buckets(_url(port), buckets, deadline)
        info = EmbeddedS3(_url(port), s3_client_env(_url(port)), True, pid, str(log))
        with patched_environ(info.env) if set_env else contextlib.nullcontext():
            yield info
    finally:
        if _pid_alive(pid) or _group_alive(pid):
            _terminate(pid)


@contextlib.contextmanager
def run_environment(
    state: str | os.PathLike[str] | None = None,
    *,
    need_s3: bool = False,
) -> Iterator[dict[str, str]]:
    """What ``fedapt run`` needs: the variables of the services that are up (never overriding
    the user's), and, when ``need_s3`` and no S3 is configured or up, an embedded SeaweedFS for
    the block. Yields the variables that were added (contains keys: do not print values)."""
    added = env_for_clients(state)
    with contextlib.ExitStack() as stack:
        stack.enter_context(patched_environ(added))
        if need_s3 and not user_configured_s3():
            s3 = stack.enter_context(embedded_s3(state))
            added = {**added, **s3.env}
        yield added
