"""The Ray head of ``fedapt up ray``: its command line, when it is ready, and every process
of it (for ``down``).

``ray start --head --block`` runs in the foreground as the service's process: the GCS, the
raylet and Ray's other daemons are its children, in its process group, and it stops them in
order when it gets SIGTERM (``stop_head``: then SIGKILL to whatever is left). Never
``ray stop``: that stops every Ray of this user on the machine (another run's, another
engineer's). Started on 127.0.0.1 (``--node-ip-address``), though Ray 2.60's GCS, raylet and
agents still listen on every interface or the machine's address: hence token authentication
(``ray_env``). No dashboard; the head's session files live in its own temporary folder
(``ray_temp_dir``), so it never touches ``/tmp/ray`` and its processes can be told from any
other Ray's by that folder in their command lines or open files.

Its address is ``127.0.0.1:<port>`` (``FEDAPT_RAY_PORT``, default 6379): what ``ray.init``,
``RAY_ADDRESS`` and ``runtime.ray_address`` take; the Ray Client server
(``ray://127.0.0.1:<port>``) listens on a free port, recorded as ``client_url``.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psutil

from flows.services.config import HOST
from flows.services.ports import free_port, health_url, probe
from flows.services.process import is_ours

ADDRESS_VAR = "RAY_ADDRESS"  # what `fedapt env` exports (ray.init() and the ray CLI read it)
AUTH_VAR = "RAY_AUTH_MODE"  # token: what a client of the head needs (ray_env)
READY_FILE = "ray_current_cluster"  # written by `ray start` into its temp dir once it is up
# A session's socket paths (<temp>/session_<date>_<pid>/sockets/plasma_store) must fit the
# 107 bytes of a Unix socket path: a longer state folder gets a short folder in the temp dir.
_MAX_TEMP_LEN = 40


def ray_temp_dir(sd: Path) -> Path:
    """The head's session folder root: ``<state_dir>/ray``, or, where that path is too long
    for Ray's sockets, ``<tmp>/fedapt-ray-<hash of the state dir>``."""
    own = sd / "ray"
    if len(str(own)) <= _MAX_TEMP_LEN:
        return own
    digest = hashlib.sha256(str(sd).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"fedapt-ray-{digest}"


def ray_cmd(sd: Path, port: int, host: str = HOST) -> list[str]:
    """``ray start`` for a head on ``host``:``port`` (its Ray Client server on a free port)."""
    temp = ray_temp_dir(sd)
    temp.mkdir(parents=True, exist_ok=True)
    (temp / READY_FILE).unlink(missing_ok=True)  # a stale one of an earlier head
    for old in temp.glob("session_2*"):  # earlier heads' (stopped: up dropped their record)
        shutil.rmtree(old, ignore_errors=True)
    return [
        str(Path(sys.executable).parent / "ray"),
        "start",
        "--head",
        "--block",  # stays in the foreground: the supervised process
        "--node-ip-address",
        host,
        "--port",
        str(port),
        "--ray-client-server-port",
        str(free_port()),
        # fixed by default (52365): another Ray on this machine would clash
        "--dashboard-agent-listen-port",
        str(free_port()),
        "--include-dashboard",
        "false",
        "--dashboard-host",
        HOST,
        "--disable-usage-stats",
        "--temp-dir",
        str(temp),
    ]


def ray_record(cmd: list[str]) -> dict[str, str]:
    """What the service's record keeps of a ``ray_cmd``: its address, its Ray Client URL and
    its session folder's root."""

    def arg(flag: str) -> str:
        return cmd[cmd.index(flag) + 1]

    host = arg("--node-ip-address")
    return {
        "address": f"{host}:{arg('--port')}",
        "client_url": f"ray://{host}:{arg('--ray-client-server-port')}",
        "temp_dir": arg("--temp-dir"),
    }


def ray_leftovers(sd: Path, temp: str) -> list[str]:
    """What ``down`` removes once the head has stopped: its session folder where it is not in
    the state folder (``<tmp>/fedapt-ray-...``); one in the state folder stays, with Ray's logs,
    until the next head starts."""
    return [] if Path(temp).is_relative_to(sd) else [temp]


def ray_env(env: Mapping[str, str]) -> dict[str, str]:
    """The head's environment: no address of another cluster, no usage stats, and token
    authentication: whatever ``--node-ip-address`` says, Ray's GCS listens on every interface,
    so a client needs the token (``~/.ray/auth_token``, made by Ray if missing) and
    ``RAY_AUTH_MODE=token``, as ``fedapt env`` exports it."""
    out = {k: v for k, v in env.items() if k != ADDRESS_VAR}
    out["RAY_USAGE_STATS_ENABLED"] = "0"
    out[AUTH_VAR] = "token"
    return out


def ensure_token(env: Mapping[str, str]) -> None:
    """A token for the head's authentication: the user's (``RAY_AUTH_TOKEN``,
    ``RAY_AUTH_TOKEN_PATH``, ``~/.ray/auth_token``), else one made by Ray itself (``ray
    get-auth-token --generate``, into ``~/.ray/auth_token``, as Ray does for a local
    ``ray.init()``); ``ray start`` in token mode refuses to start without one. The token is
    never printed: that command's output is dropped; and no other user reads it: the file is
    made under umask 077 (mode 0600, where Ray's own would be 0644)."""
    if env.get("RAY_AUTH_TOKEN") or env.get("RAY_AUTH_TOKEN_PATH"):
        return
    home = Path(env.get("HOME") or Path.home())
    if (home / ".ray" / "auth_token").is_file():
        return
    cmd = [str(Path(sys.executable).parent / "ray"), "get-auth-token", "--generate"]
    with contextlib.suppress(OSError, subprocess.SubprocessError):  # then `ray start` says it
        subprocess.run(
            cmd,
            env=dict(env),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=120,
            umask=0o077,
        )


def ray_ready(rec: Mapping[str, Any]) -> bool:
    """The head is up: ``ray start`` wrote its address file (after the GCS and the raylet
    started) and the GCS accepts connections."""
    ready = Path(rec["temp_dir"]) / READY_FILE
    health = rec.get("health") or health_url("ray", int(rec["port"]))
    return ready.is_file() and probe(health, timeout=2.0)


def ray_processes(rec: Mapping[str, Any], *, group: bool = True) -> list[psutil.Process]:
    """The live processes of the head: its process group (``group``: only while its
    ``ray start`` is alive and ours, else the id may be another program's by now), and any
    process of this user that names its session folder on its command line or holds a file
    under it open (a worker that left the group; Ray's workers rename themselves
    ``ray::...``)."""
    pgid = int(rec["pid"]) if group else -1
    temp = str(rec.get("temp_dir") or "")
    found = []
    for proc in psutil.process_iter(["cmdline", "status", "uids"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE or proc.pid == os.getpid():
                continue
            if os.getpgid(proc.pid) == pgid or (temp and _names(proc, temp)):
                found.append(proc)
        except (OSError, psutil.Error):
            continue
    return found


def _names(proc: psutil.Process, temp: str) -> bool:
    """``proc`` names the folder ``temp`` (or a path under it) on its command line, or holds a
    file under it open (a process of this user)."""
    within = re.compile(re.escape(temp) + r"(/|$)")
    if any(within.search(arg) for arg in proc.info.get("cmdline") or []):
        return True
    uids = proc.info.get("uids")
    if uids is None or uids.real != os.getuid():
        return False
    fds = Path(f"/proc/{proc.pid}/fd")
    try:
        return any(os.readlink(fd).startswith(temp + os.sep) for fd in fds.iterdir())
    except OSError:
        return False


def stop_head(rec: Mapping[str, Any], timeout: float) -> None:
    """Stop the head: SIGTERM to ``ray start --block`` alone, which drains the node and stops
    its daemons in order (about 2.5 s; SIGTERM to the whole group at once left the GCS and
    ``ray start`` running for over 20 s); then, after ``timeout`` or once all are gone, SIGKILL
    to what is left. A head whose ``ray start`` is gone: what names its session folder."""
    pid = int(rec["pid"])
    ours = is_ours(pid, "ray")  # else: a head that died, a pid that may be recycled
    if ours:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while ray_processes(rec) and time.monotonic() < deadline:
            time.sleep(0.2)
    kill_stragglers(rec, group=ours)
    if rec.get("temp_dir"):  # it names a head that is gone
        (Path(rec["temp_dir"]) / READY_FILE).unlink(missing_ok=True)


def kill_stragglers(rec: Mapping[str, Any], *, group: bool = True) -> None:
    """SIGKILL what is left of the head (``group``: see ``ray_processes``)."""
    procs = ray_processes(rec, group=group)
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(procs, timeout=5.0)
