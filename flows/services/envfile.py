"""The tools follow the services: the variables that point ``prefect``, ``mlflow``, boto3 and
the AWS CLI at the servers of ``fedapt up``, as a shell script.

``fedapt up`` writes them to ``<state_dir>/env`` (0600: it holds the local S3 keys) and
``fedapt down`` rewrites it for what is still up or removes it, so the file never names a
stopped server; ``fedapt env`` prints the same for ``eval "$(fedapt env)"`` from a live health
check. Both export ``FEDAPT_ENV_VARS``, the names they set: when a service is down, ``fedapt
env`` unsets exactly those of its variables that an earlier eval set (never a variable of the
user's) and says on stderr which services are down.

The S3 group (``AWS_ENDPOINT_URL`` ...) is left out when the user configured S3 themselves
(``USER_S3_VARS`` set, and not by fedapt), so their endpoint never meets fedapt's keys.

The Ray head of ``fedapt up ray`` gives ``RAY_ADDRESS`` (127.0.0.1:<port>; ``ray.init()``, the
``ray`` CLI and ``fedapt run`` without ``runtime.ray_address`` read it) and
``RAY_AUTH_MODE=token`` (rayhead.ray_env). Ray is started only when named, so a stopped head
is named among the services that are down only where an earlier eval exported its address.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from pathlib import Path

from flows.services import auth
from flows.services.clients import user_configured_s3
from flows.services.config import state_dir
from flows.services.rayhead import ADDRESS_VAR, AUTH_VAR
from flows.services.s3 import s3_client_env
from flows.services.state import read_state
from flows.services.supervisor import status

ENV_FILE = "env"
MARK = "FEDAPT_ENV_VARS"  # the names fedapt exported (space separated)
# Every variable fedapt may export, by service (the order of the script).
_GROUPS = {
    "prefect": ("PREFECT_API_URL", "PREFECT_API_AUTH_STRING"),
    "mlflow": ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"),
    "s3": tuple(s3_client_env("")),
    "ray": (ADDRESS_VAR, AUTH_VAR),
}


def env_path(state: str | os.PathLike[str] | None = None) -> Path:
    return state_dir(state) / ENV_FILE


def tool_env(
    state: str | os.PathLike[str] | None = None, *, environ: Mapping[str, str] | None = None
) -> tuple[dict[str, str], list[str]]:
    """The variables of the services that are up and healthy, and the services that are not
    (of prefect, mlflow, s3; ray where an earlier eval exported its address)."""
    found, down, _, _ = _tool_env(state, os.environ if environ is None else environ)
    return found, down


def _tool_env(
    state: str | os.PathLike[str] | None, env: Mapping[str, str]
) -> tuple[dict[str, str], list[str], bool, dict[str, Path]]:
    """``tool_env``, whether any of the services is up, and the files of the secrets among
    the variables (``fedapt up --auth on``: the script reads them from there)."""
    ours = set(env.get(MARK, "").split())
    sd = state_dir(state)
    st = status(list(_GROUPS), state=sd)
    found: dict[str, str] = {}
    down = [n for n in _GROUPS if not (st[n].healthy and st[n].url)]
    if "prefect" not in down:
        found["PREFECT_API_URL"] = f"{st['prefect'].url}/api"
    if "mlflow" not in down:
        found["MLFLOW_TRACKING_URI"] = str(st["mlflow"].url)
    with_auth = [n for n in ("prefect", "mlflow") if n not in down and st[n].auth]
    if with_auth:
        found.update(auth.client_env(sd, {n: read_state(sd).get(n) or {} for n in with_auth}))
    if "s3" not in down:
        users = {k: v for k, v in env.items() if k not in ours}
        if not user_configured_s3(users):
            keys = auth.s3_keys(sd) if st["s3"].auth else None
            found.update(s3_client_env(str(st["s3"].url), keys))
    files = {
        var: auth.secret_path(sd, own)
        for var, own in auth.SECRET_VARS.items()
        if var in found and (var != "AWS_SECRET_ACCESS_KEY" or st["s3"].auth)
    }
    if "ray" not in down:
        found[ADDRESS_VAR] = str(st["ray"].url)  # 127.0.0.1:<port>
        found[AUTH_VAR] = "token"
    any_up = len(down) < len(_GROUPS)
    if "ray" in down and ADDRESS_VAR not in ours:
        down.remove("ray")  # never started by a plain `fedapt up`: not worth a line
    return found, down, any_up, files


def env_script(
    state: str | os.PathLike[str] | None = None, *, environ: Mapping[str, str] | None = None
) -> tuple[str, list[str]]:
    """The shell script (``export``/``unset`` lines) and the services that are down."""
    env = os.environ if environ is None else environ
    found, down, _, files = _tool_env(state, env)
    lines = [f"# fedapt services of {state_dir(state)} (fedapt up / fedapt down / fedapt env)"]
    for k, v in found.items():  # a secret: read from its file (0600), never printed
        shown = f'"$(cat {shlex.quote(str(files[k]))})"' if k in files else shlex.quote(v)
        lines.append(f"export {k}={shown}")
    stale = [k for k in env.get(MARK, "").split() if k not in found]
    lines += [f"unset {k}" for k in stale]
    if found:
        lines.append(f"export {MARK}={shlex.quote(' '.join(found))}")
    else:
        lines.append(f"unset {MARK}")
    return "\n".join(lines) + "\n", down


def write_env_file(
    state: str | os.PathLike[str] | None = None, *, environ: Mapping[str, str] | None = None
) -> Path | None:
    """Write ``<state_dir>/env`` for the services that are up (atomically, mode 0600); remove
    it when none is. Returns its path, or None when removed."""
    path = env_path(state)
    env = os.environ if environ is None else environ
    text, _ = env_script(state, environ=env)
    if not _tool_env(state, env)[2]:
        path.unlink(missing_ok=True)
        return None
    # Sourced, not evaluated: no unset lines of a shell's earlier values (none are known here).
    text = "".join(line + "\n" for line in text.splitlines() if not line.startswith("unset "))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{ENV_FILE}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    tmp.replace(path)
    return path
