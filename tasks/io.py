"""Atomic file writes: a reader never sees a half-written output (temp file, then rename)."""

from __future__ import annotations

import errno
import json
import math
import os
from pathlib import Path
from typing import Any

from fedcore.errors import ConfigError
from fedcore.files import atomic_write_bytes, atomic_write_text  # noqa: F401 (for the tasks)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` of this host is alive (a zombie counts as dead; a process of
    another user, which we may not signal, as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def missing(path: str | Path) -> str:
    """What a path that cannot be reached is, as the rest of a line naming it: a link loop
    or a dangling link is said as such, not "does not exist"."""
    path = Path(path)
    try:
        path.stat()
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "is a loop of symbolic links (it leads back to itself)"
        if path.is_symlink():
            return f"is a broken symbolic link (to {os.readlink(path)}, which does not exist)"
        return "does not exist"
    return "exists"


def check_writable(key: str, path: str | Path) -> None:
    """``path`` (a folder to write into, existing or not) can be created and written: one
    line naming ``key`` and the path when a part of it is a file or is not writable."""
    path = Path(path)
    for part in (path, *path.parents):
        if not part.exists():
            if part.is_symlink():  # a dangling link or a loop: mkdir would fail on it
                raise ConfigError(f"{key}: {part} {missing(part)}; fix it or choose another path")
            continue
        if not part.is_dir():
            raise ConfigError(
                f"{key}: {part} is a file, not a folder, so {path} cannot be created; "
                "choose another path"
            )
        if not os.access(part, os.W_OK | os.X_OK):
            raise ConfigError(
                f"{key}: cannot write under {part} (permission denied); choose a writable "
                "folder or fix its permissions"
            )
        return


def atomic_write_json(path: str | Path, obj: Any) -> Path:
    """Strict JSON: NaN/Inf (e.g. the loss of a round whose updates were all rejected) -> null."""
    text = json.dumps(_finite(obj), indent=2, sort_keys=True, allow_nan=False, default=str)
    return atomic_write_bytes(path, (text + "\n").encode())


def _finite(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj
