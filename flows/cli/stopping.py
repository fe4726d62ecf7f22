"""How a command stops: SIGINT/SIGTERM unwind it (``stop_on_signals``), and ``stop_now`` ends
the process, threads and all, with one last line and its exit code."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from flows.cli.console import err, print_error
from flows.streams import MaskedStream, release_descriptors


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM under ``stop_on_signals``: unwinds like Ctrl-C; exit 128 + signal."""

    def __init__(self, signum: int) -> None:
        self.signame = signal.Signals(signum).name
        self.exit_code = 128 + signum
        super().__init__(self.signame)


_stop_line = threading.Lock()  # the one line of a stop, whoever prints it
CLEANUP_SECONDS = 3.0  # stop_on_signals: the most its cleanup may take once grace is over


def exit_now(code: int, signame: str, cleanup: Callable[[], Any] | None = None) -> None:
    """A signal's stop (``stop_now``): "interrupted by <signal>", exit ``code``."""
    stop_now(code, f"fedapt: interrupted by {signame} (exit {code})", cleanup=cleanup)


def stop_now(
    code: int,
    line: str,
    *,
    error: bool = False,
    cleanup: Callable[[], Any] | None = None,
) -> None:
    """End the process now, threads and all: ``line`` on stderr, the last thing it prints
    (``error``: as ``print_error`` prints it), then exit ``code``. Whoever stops first prints
    the one line; others wait for the exit. From the start of the stop only this thread
    prints (``MaskedStream.seal``), and child processes print nowhere once their output so
    far is out (``release_descriptors``); ``cleanup`` runs first, for ``CLEANUP_SECONDS`` at
    most.
    The semaphores of its worker pools are unlinked (no "leaked semaphore objects" warning
    from multiprocessing's resource tracker)."""
    if not _stop_line.acquire(blocking=False):
        while True:  # another thread is stopping the process: its line, its exit code
            time.sleep(1)
    MaskedStream.seal()
    if cleanup is not None:
        bounded(cleanup, CLEANUP_SECONDS)
    _release_semaphores()
    # what the command's child processes printed is written out; from here on they print
    # nowhere, so the line below is the last on the terminal
    release_descriptors()
    if error:
        print_error(line)
    else:
        err.print(line, highlight=False, markup=False, soft_wrap=True)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _release_semaphores() -> None:
    """Unlink the named semaphores of this process's multiprocessing objects (a process
    pool's queues and locks), as their finalizers do at a normal exit: ``os._exit`` skips
    them, and the resource tracker would print a warning per run. The workers keep theirs."""
    synchronize = sys.modules.get("multiprocessing.synchronize")
    if synchronize is None:
        return
    from multiprocessing import util

    for finalizer in list(util._finalizer_registry.values()):
        if getattr(finalizer, "_callback", None) is synchronize.SemLock._cleanup:
            with contextlib.suppress(Exception):
                finalizer()


def bounded(fn: Callable[[], Any], seconds: float) -> None:
    """Run ``fn`` (best effort: its errors are ignored) for at most ``seconds``: e.g. marking
    MLflow runs KILLED while stopping, which must not wait on a server that is gone."""

    def body() -> None:
        with contextlib.suppress(Exception):
            fn()

    worker = threading.Thread(target=body, name="fedapt-bounded", daemon=True)
    worker.start()
    worker.join(seconds)


@contextlib.contextmanager
def stop_on_signals(
    grace: float = 4.0, cleanup: Callable[[], None] | None = None
) -> Iterator[None]:
    """SIGINT and SIGTERM raise ``Interrupted`` in the main thread, so the command unwinds:
    its temporary servers stop, its MLflow runs are marked KILLED, its lock is released.
    ``guard`` then prints one line and exits at once (130 / 143) without waiting for a
    training thread to finish its cell. If unwinding takes longer than ``grace`` seconds
    (a task runner waiting for the cell in training), ``cleanup`` runs (``CLEANUP_SECONDS``
    at most) and the process exits anyway, within ``grace + CLEANUP_SECONDS`` of the signal:
    its tied servers die with it, the kernel drops its locks.

    The grace timer starts from the signal itself, seen through ``signal.set_wakeup_fd``:
    while a flow runs, Prefect's own SIGTERM handler is installed instead of ours (it raises
    ``TerminationSignal`` and re-sends the signal once its engine has unwound).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    timer_started = threading.Event()
    raised = threading.Event()

    def start_timer(signum: int) -> None:
        if timer_started.is_set():
            return
        timer_started.set()

        def late() -> None:
            time.sleep(grace)  # (cleanup: bounded, a server that is gone must not hold it)
            exit_now(128 + signum, signal.Signals(signum).name, cleanup)

        threading.Thread(target=late, name="fedapt-stop", daemon=True).start()

    def handler(signum: int, frame: Any) -> None:
        start_timer(signum)
        if raised.is_set():  # a second signal while stopping: the timer ends it
            return
        raised.set()
        raise Interrupted(signum)

    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)

    def watch() -> None:
        with contextlib.suppress(OSError):
            while data := os.read(read_end, 64):
                for signum in data:
                    if signum in (signal.SIGINT, signal.SIGTERM):
                        start_timer(signum)
        os.close(read_end)

    old = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    old_fd = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    threading.Thread(target=watch, name="fedapt-signals", daemon=True).start()
    try:
        yield
    finally:
        signal.set_wakeup_fd(old_fd)
        os.close(write_end)  # the watcher reads end-of-file and ends
        for sig, previous in old.items():
            signal.signal(sig, previous)
