"""The server processes: start one detached (``spawn``; optionally tied to this process by
a watchdog, optionally holding a lock file for its lifetime), whether a pid or a process
group is alive and still ours (psutil), signal and stop a group (``terminate``), and the
last line of a server's log."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import psutil

from flows.services.config import CMDLINE_MARKERS, STOP_TIMEOUT, ServiceError
from flows.services.state import now

WATCHDOG = str(Path(__file__).with_name("watchdog.py"))  # see that file

_children: dict[int, subprocess.Popen[bytes]] = {}  # started here: reaped on stop
_ties: dict[int, int] = {}  # pid of a tied server -> the write end of its watchdog pipe


# ----------------------------------------------------------------------------- liveness


def returncode(pid: int) -> int | None:
    """The exit status of a server this process started and that has ended (else None)."""
    proc = _children.get(pid)
    return proc.returncode if proc is not None else None


def pid_alive(pid: int | None) -> bool:
    """Process ``pid`` is alive: not a zombie (one we started is reaped); a process of
    another user, which we may not inspect, counts as alive."""
    if not pid or pid <= 0:
        return False
    proc = _children.get(pid)
    if proc is not None and proc.poll() is not None:
        return False
    if not psutil.pid_exists(pid):
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:
        return True


def _cmdline(pid: int) -> list[str] | None:
    """The command line of ``pid``; None when it may not be read."""
    try:
        return psutil.Process(pid).cmdline()
    except psutil.NoSuchProcess:
        return []
    except psutil.Error:
        return None


def is_ours(pid: int | None, name: str) -> bool:
    """Alive and still the program we started for service ``name`` (guards against a
    recycled pid)."""
    if pid is None or not pid_alive(pid):
        return False
    cmdline = _cmdline(pid)
    if cmdline is None:
        return True  # not readable: trust the pid
    return CMDLINE_MARKERS[name] in " ".join(cmdline)


def is_watchdog(pid: int) -> bool:
    """``pid`` is the watchdog of a tied server (``watchdog.py``)."""
    return WATCHDOG in " ".join(_cmdline(pid) or [])


def group_alive(pgid: int) -> bool:
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
    return any_member_alive(pgid)


def any_member_alive(pgid: int) -> bool:
    """A process of group ``pgid`` that is not a zombie (killpg(pgid, 0) counts zombies)."""
    for pid in psutil.pids():
        try:
            if os.getpgid(pid) == pgid and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return True
        except (OSError, psutil.Error):
            continue
    return False


def pids_with_arg(arg: str) -> list[int]:
    """The processes one of whose command-line arguments is exactly ``arg``."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if arg in (proc.info.get("cmdline") or []):
            found.append(proc.pid)
    return found


# ----------------------------------------------------------------------------- stopping


def signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def terminate(pid: int, timeout: float = STOP_TIMEOUT) -> None:
    """SIGTERM the process group of ``pid`` (its own session), wait, then SIGKILL."""
    signal_group(pid, signal.SIGTERM)
    if not wait_until(lambda: not group_alive(pid), timeout):
        signal_group(pid, signal.SIGKILL)
        wait_until(lambda: not group_alive(pid), 5.0)
    proc = _children.pop(pid, None)
    if proc is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
    untie(pid)


# ----------------------------------------------------------------------------- starting


def spawn(
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
    user: tuple[int, int] | None = None,
) -> int:
    """Start ``cmd`` detached (own session and process group). With ``lock``, the child
    inherits an exclusive flock on it and holds it for its lifetime (one SeaweedFS per data
    directory). With ``tied``, the server dies with this process on every exit path, kill -9
    included: it runs under a watchdog (``watchdog.py``) that stops its process group when the
    pipe from this process reaches end-of-file, and, with ``users``, no process holds a shared
    flock on that file any more (runs sharing the server). ``info`` goes into the lock file
    (e.g. the server's URL). A tied server's ``leftovers`` (files, folders) are removed by its
    watchdog once it has stopped. ``user`` (uid, gid): run it as that user, without root's
    groups (PostgreSQL refuses to run as root). Returns the pid (the process group's id)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    label = Path(cmd[0]).name
    with contextlib.ExitStack() as stack:
        pass_fds: tuple[int, ...] = ()
        lock_fd = None
        if lock is not None:
            lock_fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            stack.callback(os.close, lock_fd)
            take_data_lock(lock, lock_fd, cmd)
            pass_fds = (lock_fd,)
        write_end = None
        if tied:
            read_end, write_end = os.pipe()  # both close-on-exec; the read end is passed on
            stack.callback(os.close, read_end)
            shared = ["--users", str(users)] if users is not None else []
            for path in leftovers:
                shared += ["--leftover", str(path)]
            cmd = [sys.executable, "-I", "-S", WATCHDOG, str(read_end), *shared, *cmd]
            pass_fds = (*pass_fds, read_end)
        try:
            proc = _popen(cmd, env, cwd, log, pass_fds, label, user)
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
                "started_at": now(),
                **(info or {}),
            }
            os.ftruncate(lock_fd, 0)
            os.pwrite(lock_fd, (json.dumps(holder) + "\n").encode(), 0)
    _children[proc.pid] = proc
    return proc.pid


def _close_ties_in_child() -> None:
    for fd in _ties.values():  # a forked worker must not keep our servers alive
        with contextlib.suppress(OSError):
            os.close(fd)
    _ties.clear()


os.register_at_fork(after_in_child=_close_ties_in_child)


def tied(pid: int) -> bool:
    """This process still holds the pipe that keeps the tied server ``pid`` alive."""
    return pid in _ties


def untie(pid: int) -> None:
    """Close this process's end of the watchdog pipe of ``pid``: its watchdog stops it (once
    no run uses it any more)."""
    fd = _ties.pop(pid, None)
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)


def flock_fd(fd: int, *, shared: bool = False, block: bool = False) -> bool:
    """flock the open file ``fd`` (exclusive, or ``shared``); without ``block``, False when
    another open file holds it. The one raw flock of the package: filelock's locks belong to
    the process that took them, while these are handed on or shared: a server inherits its
    data-dir lock through ``pass_fds`` and holds it exactly as long as it lives, and the users
    of an embedded SeaweedFS hold shared locks on its users file, which its watchdog
    (stdlib only, ``python -I -S``) takes exclusively; converting shared to exclusive on the
    same descriptor is how the last user knows it is the last."""
    op = (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | (0 if block else fcntl.LOCK_NB)
    try:
        fcntl.flock(fd, op)
    except BlockingIOError:
        return False
    return True


def take_data_lock(lock: Path, fd: int, cmd: list[str], wait: float = 15.0) -> None:
    """flock ``lock`` for a server. Held by an embedded server (a run's): wait for it, since
    its watchdog stops it when its last user is gone; one that predates the watchdog and whose
    run is dead is stopped here. Held by a ``fedapt up`` service or still held after ``wait``
    seconds: one line naming the holder."""
    name = Path(cmd[0]).name if cmd else "server"
    start = time.monotonic()
    signalled: set[tuple[int, int]] = set()
    while True:
        if flock_fd(fd):
            return
        info = lock_holder(lock)
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
            if isinstance(owner, int) and pid_alive(owner):
                who += f" of `fedapt run` pid {owner}"
            elif info.get("kind") == "service":
                who += " of `fedapt up`"
            raise ServiceError(
                f"{name} cannot start: {lock.parent} is in use by another server ({who}; "
                "a running `fedapt run` or `fedapt up`?)"
            )
        stale = isinstance(owner, int) and not pid_alive(owner) and not is_watchdog(pid)
        if stale:  # its run died and nothing else will stop it: its process group, then -9
            sig = signal.SIGTERM if waited < wait / 2 else signal.SIGKILL
            if (pid, sig) not in signalled:
                signal_group(pid, sig)
                signalled.add((pid, sig))
        time.sleep(0.1)


def _lock_users(data: Path) -> str:
    """Servers serving ``data`` (their command line names it), for the message."""
    pids = pids_with_arg(f"-dir={data}")
    return f"pid {', '.join(map(str, pids))}" if pids else "another process"


def lock_holder(lock: Path) -> dict[str, Any]:
    """What ``spawn`` wrote into the lock file about the server holding it ({} if nothing)."""
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
    user: tuple[int, int] | None = None,
) -> subprocess.Popen[bytes]:
    as_user: dict[str, Any] = {}
    if user is not None:
        as_user = {"user": user[0], "group": user[1], "extra_groups": []}
    with open(log, "ab") as fh:
        name = label or Path(cmd[0]).name
        fh.write(f"\n=== fedapt: starting {name} at {now()}\n".encode())
        fh.flush()
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=fh,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=dict(env),
            start_new_session=True,  # own session and process group: see spawn
            close_fds=True,
            pass_fds=pass_fds,
            **as_user,
        )
    return proc


def last_log_line(log: Path, limit: int = 200) -> str:
    try:
        with open(log, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 8192))
            lines = [ln.strip() for ln in fh.read().decode(errors="replace").splitlines()]
    except OSError:
        return ""
    lines = [ln for ln in lines if ln and not ln.startswith("=== fedapt:")]
    return lines[-1][:limit] if lines else ""
