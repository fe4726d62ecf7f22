"""What the clients of the services get: the variables of the services that are up, the
Prefect API of a run (as configured, else a temporary server) and the environment of
``fedapt run`` (with an embedded SeaweedFS when it needs one)."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator, Mapping

from flows.services import auth
from flows.services.config import USER_S3_VARS, ServiceError, state_dir
from flows.services.embedded import embedded_s3, patched_environ, temporary_prefect
from flows.services.s3 import s3_client_env
from flows.services.state import read_state
from flows.services.supervisor import status

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
    patience: float = 15.0,
) -> dict[str, str]:
    """Variables to ADD for a client of the services that are up and healthy.

    Never returns a variable already set in ``environ`` (default ``os.environ``). The S3 group
    (``AWS_ENDPOINT_URL``, ``MLFLOW_S3_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``,
    ``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION``) is all-or-nothing: skipped entirely when
    the user configured any of ``USER_S3_VARS``, so their endpoint never meets our keys.
    Services with authentication (``fedapt up --auth on``) add their credentials
    (``MLFLOW_TRACKING_USERNAME``/``_PASSWORD``, ``PREFECT_API_AUTH_STRING``: secrets, never
    print them), only where their URL is added too: never for a server of the user's.
    A service whose process runs but misses the quick probe (a loaded machine) is probed
    again for up to ``patience`` seconds before it is left out, with a line on stderr: its
    clients would otherwise fall back to a local store without a word.
    """
    env = os.environ if environ is None else environ
    sd = state_dir(state)
    st = status(state=sd, probe_timeout=probe_timeout)
    slow = [n for n in ("s3", *CLIENT_URLS) if st[n].state == "running" and not st[n].healthy]
    deadline = time.monotonic() + patience
    while slow and time.monotonic() < deadline:
        st.update(status(slow, state=sd, probe_timeout=max(1.0, deadline - time.monotonic())))
        slow = [n for n in slow if st[n].state == "running" and not st[n].healthy]
        if slow:
            time.sleep(0.5)
    for n in slow:
        print(
            f"fedapt: {n} runs (pid {st[n].pid}) but did not answer its health check"
            f" in {patience:.0f} s; its clients are not pointed at it (see `fedapt status`)",
            file=sys.stderr,
        )
    found: dict[str, str] = {}
    if st["s3"].healthy and st["s3"].url and not user_configured_s3(env):
        found.update(s3_client_env(st["s3"].url, auth.s3_keys(sd) if st["s3"].auth else None))
    if st["mlflow"].healthy and st["mlflow"].url:
        found["MLFLOW_TRACKING_URI"] = st["mlflow"].url
    if st["prefect"].healthy and st["prefect"].url:
        found["PREFECT_API_URL"] = st["prefect"].url + "/api"
    added = {k: v for k, v in found.items() if not env.get(k)}
    up = [n for n, var in CLIENT_URLS.items() if var in added]
    if any(st[n].auth for n in up):
        creds = auth.client_env(sd, {n: read_state(sd).get(n) or {} for n in up})
        added.update({k: v for k, v in creds.items() if not env.get(k)})
    return added


CLIENT_URLS = {"mlflow": "MLFLOW_TRACKING_URI", "prefect": "PREFECT_API_URL"}


def prefect_settings(api_url: str, state: str | os.PathLike[str] | None = None) -> dict[str, str]:
    """Prefect's settings for a client of ``api_url`` (``PREFECT_API_URL``, and
    ``PREFECT_API_AUTH_STRING`` when it is the API of `fedapt up --auth on`'s server and no
    auth string is set): for ``prefect.settings.temporary_settings``. Contains a secret."""
    out = {"PREFECT_API_URL": api_url}
    sd = state_dir(state)
    rec = read_state(sd).get("prefect") or {}
    ours = rec.get("auth") and rec.get("api_url") == api_url.rstrip("/")
    if ours and not os.environ.get("PREFECT_API_AUTH_STRING"):
        out["PREFECT_API_AUTH_STRING"] = auth.value(sd, "FEDAPT_PREFECT_AUTH_STRING")
    return out


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
