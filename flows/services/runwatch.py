"""The watch of a run over the services it uses: the MLflow tracking server, the Prefect API
and the S3 endpoint its environment names. A thread probes each every ``interval`` seconds;
one that has not answered for ``grace`` seconds (`fedapt down`, a crash, a hung server) is
reported, once, to the run's ``on_lost``, which stops the run in one line. Without it a run
that lost its server stalled for minutes in the clients' retries, then ended in tracebacks.

Stdlib only, like the rest of the package. What counts as answering: MLflow's ``/health``
with status 200 (a password in the URI sent as basic auth, as MLflow's client sends it),
any HTTP reply from the Prefect API's ``/health`` or from the S3 endpoint (a Cloud
workspace or an S3 server may ask for credentials first: it still answers).
"""

from __future__ import annotations

import base64
import contextlib
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit, urlunsplit

INTERVAL = 1.0  # seconds between two rounds of probes
GRACE = 3.0  # seconds a service may fail to answer before the run stops (FEDAPT_SERVICE_GRACE)
MAX_GRACE = 600.0  # its most: a longer wait is the clients' own retries again
GRACE_VAR = "FEDAPT_SERVICE_GRACE"
PROBE_TIMEOUT = 2.0


def grace_seconds(environ: Mapping[str, str] | None = None) -> float:
    """How long a service may not answer before the run stops: ``FEDAPT_SERVICE_GRACE``
    (seconds, a number in (0, 600]; e.g. 30 for a server that restarts under the run), else
    ``GRACE``. Anything else is one ConfigError line naming the variable."""
    from fedcore.errors import ConfigError
    from flows.settings import shorten

    env = os.environ if environ is None else environ
    value = env.get(GRACE_VAR)
    if value is None:
        return GRACE
    try:
        seconds = float(value.strip())
    except ValueError:
        seconds = float("nan")
    if not 0 < seconds <= MAX_GRACE:  # (NaN included)
        raise ConfigError(
            f"{GRACE_VAR}={shorten(repr(value))} is not a number of seconds in (0, "
            f"{MAX_GRACE:g}]: how long a service of a run may not answer before the run "
            f"stops (unset: {GRACE:g})"
        )
    return seconds


@dataclass(frozen=True)
class Watched:
    """A service a run uses: its name, the variable that names it, the URL shown (password
    masked), the URL probed and its headers (``repr`` leaves them out), and whether `fedapt
    up` started it (``managed``)."""

    name: str
    var: str
    shown: str
    url: str = field(repr=False)
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    ok_status: tuple[int, ...] = ()  # () = any HTTP reply counts; else these statuses only
    managed: bool = False


def _split_auth(uri: str) -> tuple[str, dict[str, str]]:
    """``uri`` without its user:password, and the basic-auth header made of them."""
    parts = urlsplit(uri)
    netloc = parts.netloc.rsplit("@", 1)[-1]
    bare = urlunsplit(parts._replace(netloc=netloc))
    if parts.username is None:
        return bare, {}
    token = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
    return bare, {"Authorization": "Basic " + base64.b64encode(token).decode()}


def _mask(uri: str) -> str:
    parts = urlsplit(uri)
    if parts.password is None:
        return uri
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))


def watched_services(
    environ: Mapping[str, str] | None = None, managed: tuple[str, ...] = ()
) -> list[Watched]:
    """The services of the environment (default ``os.environ``) that a run talks to over
    HTTP: ``MLFLOW_TRACKING_URI`` (http/https; a local store is not a service),
    ``PREFECT_API_URL``, ``AWS_ENDPOINT_URL`` (else ``MLFLOW_S3_ENDPOINT_URL``; AWS itself,
    with no endpoint set, is not watched). ``managed``: the variables `fedapt up`'s services
    set (``env_for_clients``)."""
    env = os.environ if environ is None else environ
    out = []
    tracking = env.get("MLFLOW_TRACKING_URI") or ""
    if tracking.lower().startswith(("http://", "https://")):
        bare, headers = _split_auth(tracking)
        out.append(
            Watched(
                "mlflow",
                "MLFLOW_TRACKING_URI",
                _mask(tracking),
                bare.rstrip("/") + "/health",
                headers,
                (200,),
                "MLFLOW_TRACKING_URI" in managed,
            )
        )
    api = env.get("PREFECT_API_URL") or ""
    if api.lower().startswith(("http://", "https://")):
        bare, headers = _split_auth(api)
        out.append(
            Watched(
                "prefect",
                "PREFECT_API_URL",
                _mask(api),
                bare.rstrip("/") + "/health",
                headers,
                managed="PREFECT_API_URL" in managed,
            )
        )
    for var in ("AWS_ENDPOINT_URL", "MLFLOW_S3_ENDPOINT_URL"):
        endpoint = env.get(var) or ""
        if endpoint.lower().startswith(("http://", "https://")):
            bare, _ = _split_auth(endpoint)
            out.append(Watched("s3", var, _mask(endpoint), bare, managed=var in managed))
            break
    return out


def answers(service: Watched, timeout: float = PROBE_TIMEOUT) -> bool:
    """Whether the service answers its probe now."""
    request = urllib.request.Request(service.url, headers=dict(service.headers))
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            status = int(resp.status)
    except urllib.error.HTTPError as exc:  # it answered, with an error status
        status = int(exc.code)
    except (OSError, ValueError):  # refused, reset, timed out, no such host
        return False
    return not service.ok_status or status in service.ok_status


@contextlib.contextmanager
def watch(
    services: list[Watched],
    on_lost: Callable[[list[Watched]], None],
    *,
    interval: float = INTERVAL,
    grace: float = GRACE,
    timeout: float = PROBE_TIMEOUT,
) -> Iterator[None]:
    """Probe ``services`` from a daemon thread for the block; the first time one has not
    answered for ``grace`` seconds, call ``on_lost`` (from that thread) with every service
    not answering then, and stop watching. ``on_lost`` is expected to end the process (it
    may also return: the block then goes on unwatched)."""
    stop = threading.Event()

    def run() -> None:
        failing_since: dict[str, float] = {}
        while not stop.wait(interval):
            now = time.monotonic()
            for service in services:
                if answers(service, timeout):
                    failing_since.pop(service.var, None)
                else:
                    failing_since.setdefault(service.var, now)
            if stop.is_set():
                return
            now = time.monotonic()
            if any(now - t >= grace for t in failing_since.values()):
                on_lost([s for s in services if s.var in failing_since])
                return

    if services:
        threading.Thread(target=run, name="fedapt-runwatch", daemon=True).start()
    try:
        yield
    finally:
        stop.set()
