"""The exclusive lock of an output directory: one ``fedapt run`` (or DVC stage) per directory.

``run_lock(dir, what)`` holds ``fcntl.flock`` on ``<dir>/.fedapt.lock`` for the block and
writes the holder (what, pid, host, start time) into it. A second holder is refused at once
with one line naming the running process (``DirectoryLocked``), before it writes anything.
The kernel drops a flock when its holder dies, also on kill -9, so a dead run never blocks
the next one; the file then still names the dead pid, which is reported as such if leftover
processes of that run (e.g. a forked worker) still hold the lock.

Forked children (client worker pools) close their copy of the descriptor (``os.fork`` hook):
they never keep the lock alive after their parent died. Re-entrant within a process: the
flow takes the same lock the CLI already holds (``fedapt run`` -> ``experiment_flow``).
Stdlib only.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fedcore.errors import FedaptError
from tasks.io import pid_alive

LOCK_NAME = ".fedapt.lock"

_held: dict[Path, int] = {}  # lock file -> descriptor, held by this process


class DirectoryLocked(FedaptError):
    """Another process holds the directory's lock; the message names it (one line)."""


def _close_in_child() -> None:
    for fd in _held.values():
        with contextlib.suppress(OSError):
            os.close(fd)  # the parent's open file description keeps the lock
    _held.clear()


os.register_at_fork(after_in_child=_close_in_child)


def holder(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """What the lock file of ``directory`` says about its last holder ({} if nothing)."""
    try:
        data = json.loads((Path(directory) / LOCK_NAME).read_text() or "{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _describe(directory: Path, info: dict[str, Any]) -> str:
    what = info.get("what") or "another fedapt process"
    pid, host = info.get("pid"), info.get("host")
    if not isinstance(pid, int):
        return f"{directory} is in use by {what} (lock {directory / LOCK_NAME})"
    where = f"pid {pid}" + (f" on {host}" if host else "")
    since = f", started {info['started_at']}" if info.get("started_at") else ""
    if host == socket.gethostname() and not pid_alive(pid):
        return (
            f"{directory} is locked by leftover processes of {what} ({where}{since}), which is "
            f"no longer running; stop them or wait, then retry (lock {directory / LOCK_NAME})"
        )
    return (
        f"{directory} is in use by {what} ({where}{since}); wait for it to finish, or give "
        "this run another experiment.name"
    )


@contextlib.contextmanager
def run_lock(directory: str | os.PathLike[str], what: str = "fedapt run") -> Iterator[Path]:
    """Hold the exclusive lock of ``directory`` for the block (created if missing; folders
    this call created are removed again at the end when nothing else was written in them)."""
    directory = Path(directory).absolute()
    path = directory / LOCK_NAME
    if path in _held:  # re-entrant: this process already holds it
        yield path
        return
    created = [p for p in (directory, *directory.parents) if not p.exists()]
    directory.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise DirectoryLocked(_describe(directory, holder(directory))) from None
        except BaseException:
            os.close(fd)
            raise
        try:  # the file we locked may have been removed by its last holder meanwhile
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    info = {
        "what": what,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
    _held[path] = fd
    try:
        yield path
    finally:
        _held.pop(path, None)
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        if created:  # nothing written: leave no folders behind (a refused run, Ctrl-C early)
            with contextlib.suppress(OSError):
                if [p.name for p in directory.iterdir()] == [LOCK_NAME]:
                    path.unlink()
                    for p in created:
                        p.rmdir()
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
