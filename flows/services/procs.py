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
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterable, Iterator, Mapping
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
from tasks.io import pid_alive

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
    return pid_alive(pid)


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
    _untie(pid)


def _spawn(
    cmd: list[str],
    env: Mapping[str, str],
    cwd: Path,
    log: Path,
    lock: Path | None = None,
    *,
    tied: bool = False,
    users: Path | None = None,
    info: Mapping[str, Any] | None = None,
    leftovers: Iterable[str] = (),
) -> int:
    """Start ``cmd`` detached (own session and process group). With ``lock``, the child
    inherits an exclusive flock on it and holds it for its lifetime (one SeaweedFS per data
    directory). With ``tied``, the server dies with this process on every exit path, kill -9
    included: it runs under a watchdog (``watchdog.py``) that stops its process group when the
    pipe from this process reaches end-of-file, and, with ``users``, no process holds a shared
    flock on that file any more (runs sharing the server). ``info`` goes into the lock file
    (e.g. the server's URL). A tied server's ``leftovers`` (files, folders) are removed by its
    watchdog once it has stopped. Returns the pid (the process group's id)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    label = Path(cmd[0]).name
    with contextlib.ExitStack() as stack:
        pass_fds: tuple[int, ...] = ()
        lock_fd = None
        if lock is not None:
            lock_fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            stack.callback(os.close, lock_fd)
            _take_data_lock(lock, lock_fd, cmd)
            pass_fds = (lock_fd,)
        write_end = None
        if tied:
            read_end, write_end = os.pipe()  # both close-on-exec; the read end is passed on
            stack.callback(os.close, read_end)
            shared = ["--users", str(users)] if users is not None else []
            for path in leftovers:
                shared += ["--leftover", str(path)]
            cmd = [sys.executable, "-I", "-S", _WATCHDOG, str(read_end), *shared, *cmd]
            pass_fds = (*pass_fds, read_end)
        try:
            proc = _popen(cmd, env, cwd, log, pass_fds, label)
        except BaseException:
            if write_end is not None:
                os.close(write_end)
            raise
        if write_end is not None:
            _ties[proc.pid] = write_end
        if lock_fd is not None:
            holder = {
                "pid": proc.pid,
                "owner": os.getpid() if tied else None,  # embedded: dies with its owner
                "kind": "embedded" if tied else "service",
                "host": socket.gethostname(),
                "started_at": _now(),
                **(info or {}),
            }
            os.ftruncate(lock_fd, 0)
            os.pwrite(lock_fd, (json.dumps(holder) + "\n").encode(), 0)
    _children[proc.pid] = proc
    return proc.pid


_WATCHDOG = str(Path(__file__).with_name("watchdog.py"))  # see that file

_ties: dict[int, int] = {}  # pid of a tied server -> the write end of its watchdog pipe


def _close_ties_in_child() -> None:
    for fd in _ties.values():  # a forked worker must not keep our servers alive
        with contextlib.suppress(OSError):
            os.close(fd)
    _ties.clear()


os.register_at_fork(after_in_child=_close_ties_in_child)


def _untie(pid: int) -> None:
    fd = _ties.pop(pid, None)
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)


def _take_data_lock(lock: Path, fd: int, cmd: list[str], wait: float = 15.0) -> None:
    """flock ``lock`` for a server. Held by an embedded server (a run's): wait for it, since
    its watchdog stops it when its last user is gone; one that predates the watchdog and whose
    run is dead is stopped here. Held by a ``fedapt up`` service or still held after ``wait``
    seconds: one line naming the holder."""
    name = Path(cmd[0]).name if cmd else "server"
    start = time.monotonic()
    signalled: set[tuple[int, int]] = set()
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        info = _lock_holder(lock)
        pid, owner = info.get("pid"), info.get("owner")
        embedded = (
            info.get("kind") == "embedded"
            and info.get("host") == socket.gethostname()
            and isinstance(pid, int)
            and pid > 1
        )
        waited = time.monotonic() - start
        if not embedded or waited >= wait:
            who = f"pid {pid}" if isinstance(pid, int) else _lock_users(lock.parent)
            if isinstance(owner, int) and _pid_alive(owner):
                who += f" of `fedapt run` pid {owner}"
            elif info.get("kind") == "service":
                who += " of `fedapt up`"
            raise ServiceError(
                f"{name} cannot start: {lock.parent} is in use by another server ({who}; "
                "a running `fedapt run` or `fedapt up`?)"
            )
        stale = isinstance(owner, int) and not _pid_alive(owner) and not _is_watchdog(pid)
        if stale:  # its run died and nothing else will stop it: its process group, then -9
            sig = signal.SIGTERM if waited < wait / 2 else signal.SIGKILL
            if (pid, sig) not in signalled:
                _signal_group(pid, sig)
                signalled.add((pid, sig))
        time.sleep(0.1)


def _is_watchdog(pid: int) -> bool:
    try:
        return _WATCHDOG.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _lock_users(data: Path) -> str:
    """Servers serving ``data`` (their command line names it), for the message."""
    needle = f"-dir={data}".encode()
    pids = []
    with contextlib.suppress(OSError):
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    if needle in (entry / "cmdline").read_bytes().split(b"\0"):
                        pids.append(entry.name)
    return f"pid {', '.join(pids)}" if pids else "another process"


def _lock_holder(lock: Path) -> dict[str, Any]:
    try:
        data = json.loads(lock.read_text() or "{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _popen(
    cmd: list[str],
    env: Mapping[str, str],
    cwd: Path,
    log: Path,
    pass_fds: tuple[int, ...],
    label: str | None = None,
) -> subprocess.Popen[bytes]:
    with open(log, "ab") as fh:
        name = label or Path(cmd[0]).name
        fh.write(f"\n=== fedapt: starting {name} at {_now()}\n".encode())
        fh.flush()
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=fh,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=dict(env),
            start_new_session=True,  # own session and process group: see _spawn
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
