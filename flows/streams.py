"""Masked standard streams: every line a fedapt process writes through ``sys.stdout`` and
``sys.stderr`` has the password of each URI in it masked, whoever writes it (MLflow's own
"View run ... at:" lines included). Installed by every ``fedapt`` command
(``flows.cli.common.offline_defaults``) and by the experiment flow (a deployment's run, in a
process of the Prefect worker)."""

from __future__ import annotations

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
