"""The exclusive lock of an output directory: one ``fedapt run`` (or DVC stage) per directory.

``run_lock(dir, what)`` holds a ``filelock.FileLock`` (an flock) on ``<dir>/.fedapt.lock`` for
the block and writes the holder (what, pid, host, start time) into it. A second holder is refused at once
with one line naming the running process (``DirectoryLocked``), before it writes anything.
The kernel drops a flock when its holder dies, also on kill -9, so a dead run never blocks
the next one; the file then still names the dead pid, which is reported as such if leftover
processes of that run (e.g. a forked worker) still hold the lock. A block that fails (a
refused run) removes the lock file it made: a refused run leaves no file behind.

Forked children (client worker pools) close their copy of the descriptor (filelock's
``os.fork`` hook) and forget the lock (ours): they never keep the lock alive after their parent
died. Re-entrant within a process: the flow takes the same lock the CLI already holds
(``fedapt run`` -> ``experiment_flow``).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from fedcore.errors import FedaptError
from flows.services.process import pid_alive

LOCK_NAME = ".fedapt.lock"

_held: dict[Path, FileLock] = {}  # lock file -> its lock, held by this process


class DirectoryLocked(FedaptError):
    """Another process holds the directory's lock; the message names it (one line)."""


def _forget_in_child() -> None:
    _held.clear()  # filelock closed the child's descriptors; the parent's keep the lock


os.register_at_fork(after_in_child=_forget_in_child)


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
    fresh = not path.exists()  # the lock file is this call's: a refused run removes it
    directory.mkdir(parents=True, exist_ok=True)
    info = {
        "what": what,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }

    def record(fd: int) -> None:  # with the lock held, before anything else is written
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)

    lock = FileLock(
        path,
        mode=0o644,
        thread_local=False,
        blocking=False,
        fallback_to_soft=False,
        on_acquired=record,
    )
    while True:
        try:
            lock.acquire()
            break
        except Timeout:
            # the file we tried may have been removed by its last holder meanwhile: retry
            if path.exists():
                raise DirectoryLocked(_describe(directory, holder(directory))) from None
    _held[path] = lock
    failed = False
    try:
        yield path
    except BaseException:
        failed = True
        raise
    finally:
        _held.pop(path, None)
        with contextlib.suppress(OSError):
            os.truncate(path, 0)  # still ours: the lock is released last
        if created:  # nothing written: leave no folders behind (a refused run, Ctrl-C early)
            with contextlib.suppress(OSError):
                if [p.name for p in directory.iterdir()] == [LOCK_NAME]:
                    path.unlink()
                    for p in created:
                        p.rmdir()
        elif fresh and failed:  # a refused run in a folder it found: no lock file left there
            with contextlib.suppress(OSError):
                path.unlink()  # (a process waiting on it retries on the next file)
        lock.release()
