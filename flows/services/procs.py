"""The state file, the lock that serialises up/down, the server processes (spawn, signal,
terminate) and the ports and health probes."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from flows.services.config import (
    _MARKERS,
    HEALTH_PATHS,
    HOST,
    STATE_FILE,
    STOP_TIMEOUT,
    PortInUseError,
    ServiceError,
    port_env_var,
    state_dir,
)

# ----------------------------------------------------------------------------- state file


def _state_path(sd: Path) -> Path:
    return sd / STATE_FILE


def read_state(sd: str | os.PathLike[str] | None = None) -> dict[str, dict[str, Any]]:
    """The recorded services (name -> record); empty when there is no or a corrupt state file."""
    path = _state_path(state_dir(sd))
    try:
        data = json.loads(path.read_text())
        services = data.get("services", {})
        return {k: v for k, v in services.items() if isinstance(v, dict)}
    except (OSError, ValueError, AttributeError):
        return {}


def write_state(sd: str | os.PathLike[str] | None, services: Mapping[str, Any]) -> Path:
    """Write the state file atomically: a temporary file in the same directory, then rename."""
    sd = state_dir(sd)
    _prepare_dir(sd)
    path = _state_path(sd)
    fd, tmp = tempfile.mkstemp(prefix=".services.", suffix=".tmp", dir=sd)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump({"version": 1, "services": dict(services)}, fh, indent=2, sort_keys=True)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def _prepare_dir(sd: Path) -> None:
    sd.mkdir(parents=True, exist_ok=True)
    ignore = sd / ".gitignore"  # keep a state dir inside the repo out of git
    if not ignore.exists():
        with contextlib.suppress(OSError):
            ignore.write_text("*\n")


@contextlib.contextmanager
def _locked(sd: Path) -> Iterator[None]:
    """Serialise up/down across processes (two `fedapt up` at once)."""
    _prepare_dir(sd)
    with open(sd / "services.lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


# ----------------------------------------------------------------------------- processes

_children: dict[int, subprocess.Popen[bytes]] = {}  # started here: reaped on stop


def _pid_alive(pid: int | None) -> bool:
    if not pid or pid <= 0:
        return False
    proc = _children.get(pid)
    if proc is not None and proc.poll() is not None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is dead for our purposes
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _is_ours(pid: int | None, name: str) -> bool:
    """Alive and still the program we started (guards against a recycled pid)."""
    if not _pid_alive(pid):
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return True  # no /proc: trust the pid
    return _MARKERS[name] in cmdline


def _group_alive(pgid: int) -> bool:
    """Any live (non-zombie) process left in the process group ``pgid``."""
    proc = _children.get(pgid)
    if proc is not None:
        proc.poll()  # reap our own child so it does not linger as a zombie
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return _any_member_alive(pgid)


def _any_member_alive(pgid: int) -> bool:
    proc_dir = Path("/proc")
    if not proc_dir.is_dir():
        return True
    for entry in proc_dir.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _wait(predicate: Any, timeout: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def _terminate(pid: int, timeout: float = STOP_TIMEOUT) -> None:
    """SIGTERM the process group of ``pid`` (its own session), wait, then SIGKILL."""
    _signal_group(pid, signal.SIGTERM)
    if not _wait(lambda: not _group_alive(pid), timeout):
        _signal_group(pid, signal.SIGKILL)
        _wait(lambda: not _group_alive(pid), 5.0)
    proc = _children.pop(pid, None)
    if proc is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)


def _spawn(
    cmd: list[str], env: Mapping[str, str], cwd: Path, log: Path, lock: Path | None = None
) -> int:
    """Start ``cmd`` detached. With ``lock``, the child inherits an exclusive flock on it and
    holds it for its lifetime (one SeaweedFS per data directory)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        pass_fds: tuple[int, ...] = ()
        if lock is not None:
            lock_fh = stack.enter_context(open(lock, "a"))
            try:
                fcntl.flock(lock_fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                raise ServiceError(
                    f"{cmd and Path(cmd[0]).name} cannot start: {lock.parent} is in use by "
                    "another server (a running `fedapt run` or `fedapt up`?)"
                ) from None
            pass_fds = (lock_fh.fileno(),)
        proc = _popen(cmd, env, cwd, log, pass_fds)
    _children[proc.pid] = proc
    return proc.pid


def _popen(
    cmd: list[str], env: Mapping[str, str], cwd: Path, log: Path, pass_fds: tuple[int, ...]
) -> subprocess.Popen[bytes]:
    with open(log, "ab") as fh:
        fh.write(f"\n=== fedapt: starting {Path(cmd[0]).name} at {_now()}\n".encode())
        fh.flush()
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=fh,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=dict(env),
            start_new_session=True,  # own session and process group: survives the CLI
            close_fds=True,
            pass_fds=pass_fds,
        )
    return proc


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _last_log_line(log: Path, limit: int = 200) -> str:
    try:
        with open(log, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 8192))
            lines = [ln.strip() for ln in fh.read().decode(errors="replace").splitlines()]
    except OSError:
        return ""
    lines = [ln for ln in lines if ln and not ln.startswith("=== fedapt:")]
    return lines[-1][:limit] if lines else ""


# ----------------------------------------------------------------------------- ports and probes


def port_free(port: int, host: str = HOST) -> bool:
    """True when a server could listen on host:port now (bind test, like the servers do)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = HOST) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _free_port_pair(offset: int = 10000, taken: set[int] | None = None) -> int:
    """A port p with p + offset also free (SeaweedFS's admin worker dials admin.port + 10000),
    neither of them in ``taken``."""
    taken = set() if taken is None else taken
    for _ in range(200):
        p = random.randint(20000, 65535 - offset)
        if p in taken or p + offset in taken:
            continue
        if port_free(p) and port_free(p + offset):
            taken.update((p, p + offset))
            return p
    raise ServiceError("s3 cannot start: no free pair of ports for the SeaweedFS admin server")


def _check_port(name: str, port: int) -> None:
    if port and not port_free(port):
        var = port_env_var(name)
        alt = port + 1 if port < 65535 else port - 1
        raise PortInUseError(
            f"{name} cannot start: port {port} on {HOST} is already in use by another program; "
            f"choose another port, e.g. {var}={alt}"
        )


def probe(url: str, timeout: float = 1.0) -> bool:
    """HTTP GET; healthy when it answers 2xx."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return 200 <= resp.status < 300
    except (OSError, ValueError):
        return False


def _health_url(name: str, port: int) -> str:
    return f"http://{HOST}:{port}{HEALTH_PATHS[name]}"


def _url(port: int) -> str:
    return f"http://{HOST}:{port}"
