"""The one atomic file write: a temporary file in the target folder, then ``os.replace``.
Readers never see a half-written file, a failed write leaves no temporary file behind, and a
full disk or an I/O error names the file it was writing."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_bytes(
    path: str | Path, data: bytes, *, mode: int | None = None, fsync: bool = False
) -> Path:
    """Write ``data`` to ``path`` (its folder created). The file gets the mode a plain
    ``open`` would give it (0666 less the umask; ``mkstemp`` alone would leave 0600), or
    ``mode`` (0600 for a file only its owner may read). ``fsync``: on disk before the rename
    (a state file that must survive a crash)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_umask() if mode is None else mode)
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)  # no partial output, whatever stopped the write
        if isinstance(exc, OSError) and exc.errno and exc.filename is None:  # ENOSPC, EIO: name it
            raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from exc
        raise
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    """:func:`atomic_write_bytes` of ``text`` in UTF-8, exactly as given (no newline
    translation)."""
    return atomic_write_bytes(path, text.encode("utf-8"))
