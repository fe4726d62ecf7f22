"""Masked standard streams: every line a fedapt process writes through ``sys.stdout`` and
``sys.stderr`` has the password of each URI in it masked, whoever writes it (MLflow's own
"View run ... at:" lines included). Installed by every ``fedapt`` command
(``flows.cli.environment.offline_defaults``) and by the experiment flow (a deployment's run,
in a process of the Prefect worker).

``mask_descriptors`` (the ``fedapt`` command's entry point, ``flows.cli.main``) holds the
same at the file descriptors: what the command's child processes write to the terminal (a
worker pool's processes, Ray's, ``dvc`` and ``git``, anything that inherits file descriptors
1 and 2) passes through a pipe and a relay thread that masks it (``FdRelay``)."""

from __future__ import annotations

import atexit
import contextlib
import os
import select
import sys
import threading
from typing import Any


class MaskedStream:
    """A text stream whose every write has the password of each URI in it masked
    (``fedcore.errors.mask_credentials``): what libraries print is masked too, e.g. MLflow's
    "View run ... at: http://user:secret@host/..." lines. Everything else is the wrapped
    stream's (``isatty``, ``fileno``, ``encoding`` ...).

    ``seal()``: from then on only the sealing thread writes (a run that stops prints its one
    line last: what other threads would print while it stops is dropped)."""

    _sealed_by: int | None = None  # the thread that sealed the process's streams

    def __init__(self, stream: Any) -> None:
        self.wrapped = stream

    def write(self, text: str) -> int:
        from fedcore.errors import mask_credentials

        sealer = MaskedStream._sealed_by
        if sealer is not None and sealer != threading.get_ident():
            return len(text)
        if "@" in text:  # (a URI with a password has one)
            text = mask_credentials(text)
        return int(self.wrapped.write(text))

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def isatty(self) -> bool:
        """The terminal's answer, when ``mask_descriptors`` put a pipe between this stream's
        file descriptor and the terminal (Rich's colours and live progress stay on)."""
        with contextlib.suppress(Exception):
            relay = _relays.get(self.wrapped.fileno())
            if relay is not None:
                return relay.tty
        return bool(self.wrapped.isatty())

    def __getattr__(self, name: str) -> Any:
        return getattr(self.wrapped, name)

    @classmethod
    def seal(cls) -> None:
        cls._sealed_by = threading.get_ident()


def mask_streams() -> None:
    """``sys.stdout`` and ``sys.stderr`` as ``MaskedStream``s (once): every line this process
    writes through them has its passwords masked, whoever writes it. Handlers made later
    (Prefect's console, MLflow's logger) take the masked streams; what writes to the file
    descriptors directly (child processes) is not masked."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, MaskedStream):
            setattr(sys, name, MaskedStream(stream))


# ---- at the file descriptors: what child processes write ----------------------------------

IDLE = 0.1  # seconds: a line's start with no end yet (a prompt, a progress bar) goes out then
DRAIN = 2.0  # seconds: the most ``release`` waits for what was written before it


def mask_bytes(data: bytes) -> bytes:
    """``data`` with each URI's password masked (``fedcore.errors.mask_credentials``); bytes
    that are not UTF-8 pass through unchanged."""
    if b"@" not in data:
        return data
    from fedcore.errors import mask_credentials

    return mask_credentials(data.decode("utf-8", "surrogateescape")).encode(
        "utf-8", "surrogateescape"
    )


class FdRelay:
    """File descriptors ``fds`` (1, 2, or both when they are the same file: one pipe keeps
    their lines' order) redirected into a pipe; a daemon thread reads it and writes to the
    original file, masked. Whole lines (ended by a newline, or a carriage return: a progress
    bar's) are masked and written as they come, in order; a line's start that waits ``IDLE``
    seconds for its end (a prompt) is written as it is, masked. ``release`` puts the original
    file back and writes what the pipe still holds."""

    def __init__(self, fds: tuple[int, ...]) -> None:
        self.fds = fds
        self.tty = os.isatty(fds[0])
        self.target = os.dup(fds[0])  # the terminal (not inherited by children)
        read, write = os.pipe()
        for fd in fds:
            os.dup2(write, fd)  # (inheritable: children write into the pipe)
        os.close(write)
        self.read = read
        self.closing = threading.Event()
        self.cut = False
        self.thread = threading.Thread(target=self._run, name=f"fedapt-mask-{fds}", daemon=True)
        self.thread.start()

    def _write(self, data: bytes) -> None:
        if self.cut:  # released and not drained in time: nothing after the last line
            return
        data = mask_bytes(data)
        with contextlib.suppress(OSError):  # the terminal is gone: nothing to show it on
            while data:
                data = data[os.write(self.target, data) :]

    def _run(self) -> None:
        pending = b""
        while True:
            wait = IDLE if pending or self.closing.is_set() else 1.0
            ready, _, _ = select.select([self.read], [], [], wait)
            if not ready:
                if pending:
                    self._write(pending)
                    pending = b""
                elif self.closing.is_set():  # drained: nothing came for IDLE seconds
                    break
                continue
            try:
                data = os.read(self.read, 65536)
            except OSError:
                break
            if not data:  # every writer closed it
                break
            pending += data
            end = max(pending.rfind(b"\n"), pending.rfind(b"\r")) + 1
            if end:
                self._write(pending[:end])
                pending = pending[end:]
        if pending:
            self._write(pending)
        os.close(self.read)

    def release(self) -> None:
        """The original file back on ``fds``; what was written before is written out (for
        ``DRAIN`` seconds at most: a child that keeps writing does not hold the exit). What
        child processes write later goes nowhere."""
        for fd in self.fds:
            os.dup2(self.target, fd)
        self.closing.set()
        self.thread.join(DRAIN)
        self.cut = True


_relays: dict[int, FdRelay] = {}  # file descriptor -> its relay
_owner: int | None = None  # the process that installed them (a fork's child has none)


def mask_descriptors() -> None:
    """File descriptors 1 and 2 through masking relays (``FdRelay``), once per process:
    every byte that this process and the processes it starts write to standard output and
    error reaches them masked. Released at exit (``release_descriptors``: ``atexit``, and
    ``flows.cli.stopping.stop_now`` before ``os._exit``)."""
    global _owner
    if _owner == os.getpid():
        return
    _relays.clear()  # (a forked child's copies: not its own)
    fds = [fd for fd in (1, 2) if _valid(fd)]
    if not fds:
        return
    for name in ("stdout", "stderr"):  # what Python buffered goes out before the switch
        with contextlib.suppress(Exception):
            getattr(sys, name).flush()
    if len(fds) == 2 and _same_file(1, 2):
        groups: list[tuple[int, ...]] = [(1, 2)]
    else:
        groups = [(fd,) for fd in fds]
    for group in groups:
        relay = FdRelay(group)
        for fd in group:
            _relays[fd] = relay
    _owner = os.getpid()
    atexit.register(release_descriptors)


def release_descriptors() -> None:
    """Standard output and error flushed, their relays drained and released (the process
    ends: what it printed is on the terminal, in order). Only in the process that made them."""
    global _owner
    if _owner != os.getpid():
        return
    for name in ("stdout", "stderr"):
        with contextlib.suppress(Exception):
            getattr(sys, name).flush()
    for relay in {id(r): r for r in _relays.values()}.values():
        relay.release()
    _relays.clear()
    _owner = None


def _valid(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _same_file(a: int, b: int) -> bool:
    sa, sb = os.fstat(a), os.fstat(b)
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)
