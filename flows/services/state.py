"""The state directory's bookkeeping: ``services.json`` (read, written atomically), the lock
that serialises ``up``/``down`` and the start of an embedded server, and the timestamps the
records carry."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from filelock import FileLock

from fedcore.errors import ConfigError
from fedcore.files import atomic_write_bytes
from flows.services.config import STATE_FILE, state_dir

STATE_LOCK = "services.lock"


def state_path(sd: Path) -> Path:
    return sd / STATE_FILE


def read_state(sd: str | os.PathLike[str] | None = None) -> dict[str, dict[str, Any]]:
    """The recorded services (name -> record); empty when there is no state file. A state
    file fedapt did not write (not JSON, another shape, a pid or port that is not a whole
    number) is one line naming it: never read as "no services" (their processes would be
    reported stopped and left running)."""
    path = state_path(state_dir(sd))
    try:
        text = path.read_text()
    except (FileNotFoundError, NotADirectoryError):  # (a state "folder" that is a file:
        return {}  # its own check names FEDAPT_STATE_DIR)
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the services' state file ({exc})") from None
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    why = _not_state(data)
    if why:
        raise ConfigError(
            f"{path} is not a services state file fedapt wrote ({why}); stop what it started "
            "by hand if anything runs, then move the file away (FEDAPT_STATE_DIR: its folder)"
        )
    return dict(data["services"])


def _not_state(data: Any) -> str | None:
    """Why ``data`` is not the content of a state file (None: it is)."""
    if not isinstance(data, dict) or not isinstance(data.get("services", {}), dict):
        return "not a JSON object with a services mapping"
    data.setdefault("services", {})
    for name, rec in data["services"].items():
        if not isinstance(rec, dict):
            return f"service {name!r} is not a record"
        for key in ("pid", "port"):
            value = rec.get(key)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                return f"service {name!r}: {key} {value!r} is not a whole number"
        leftovers = rec.get("leftovers", [])
        if not isinstance(leftovers, list) or not all(isinstance(x, str) for x in leftovers):
            return f"service {name!r}: leftovers is not a list of paths"
    return None


def write_state(sd: str | os.PathLike[str] | None, services: Mapping[str, Any]) -> Path:
    """Write the state file atomically: a temporary file in the same directory, then rename."""
    sd = state_dir(sd)
    prepare_dir(sd)
    path = state_path(sd)
    text = json.dumps({"version": 1, "services": dict(services)}, indent=2, sort_keys=True)
    # owner-only, as mkstemp made it before: it names the services' processes and ports
    atomic_write_bytes(path, (text + "\n").encode(), mode=0o600, fsync=True)
    return path


def prepare_dir(sd: Path) -> None:
    """Create the state directory, with a ``.gitignore`` that keeps it out of git."""
    sd.mkdir(parents=True, exist_ok=True)
    ignore = sd / ".gitignore"  # keep a state dir inside the repo out of git
    if not ignore.exists():
        with contextlib.suppress(OSError):
            ignore.write_text("*\n")


@contextlib.contextmanager
def state_lock(sd: Path) -> Iterator[None]:
    """Serialise up/down across processes (two `fedapt up` at once); waits for the holder.
    An flock underneath (dropped by the kernel when its holder dies, kill -9 included); a
    forked child does not inherit it."""
    prepare_dir(sd)
    lock = FileLock(sd / STATE_LOCK, thread_local=False, fallback_to_soft=False)
    with lock:
        yield


def now() -> str:
    """The current UTC time, to the second, as the records write it."""
    return datetime.now(UTC).isoformat(timespec="seconds")
