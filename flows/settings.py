"""Settings that become paths. Each place that turns a setting (a params key or an
environment variable) into a path registers it here (``setting_path``); an OSError at that
path, below it or at a folder above it is then reported naming the setting, its value
(shortened) and what is allowed (``explain``, called by ``flows.cli.guards.guard``), where
the OS names only the path (``File exists``, ``File name too long``, ``No such file or
directory``, and a full disk's ``No space left on device``). Light on purpose: the services and the CLI import it before anything heavy."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

SHOWN = 80  # characters of a value or path an error line shows


@dataclass(frozen=True)
class SettingPath:
    key: str  # the params key or environment variable
    value: str  # as the user gave it (or what its absence means)
    path: Path  # the absolute path it became
    allowed: str  # what the setting may be


_paths: dict[str, SettingPath] = {}


def shorten(text: str, limit: int = SHOWN) -> str:
    """``text``, or its start, its end and its length when longer than ``limit``."""
    if len(text) <= limit:
        return text
    return f"{text[: limit // 2]}...{text[-(limit // 4) :]} ({len(text)} characters)"


def setting_path(key: str, value: str, path: str | os.PathLike[str], allowed: str) -> Path:
    """Record that setting ``key`` (given as ``value``) became ``path``; returns the path."""
    where = Path(os.path.abspath(path))
    _paths[key] = SettingPath(key, value, where, allowed)
    return where


def forget() -> None:
    """Forget every registration (a command starts: `fedapt`'s callback)."""
    _paths.clear()


def registered() -> list[SettingPath]:
    """The settings registered so far, in their order."""
    return list(_paths.values())


def explain(exc: OSError, advice: str | None = None) -> str | None:
    """One line naming the setting behind ``exc``'s path, or None when no registered
    setting's path is that path, a folder above it or one below it. It ends with what the
    setting allows, or ``advice`` (a full disk: free some space)."""
    if exc.filename is None or not _paths:
        return None
    failed = Path(os.path.abspath(os.fsdecode(exc.filename)))
    inside = [s for s in _paths.values() if s.path == failed or s.path in failed.parents]
    above = [s for s in _paths.values() if failed in s.path.parents]
    if inside:  # the deepest: the setting whose own path holds the failed one
        found = max(inside, key=lambda s: len(s.path.parts))
    elif above:  # a folder on the way to it: the setting nearest to it
        found = min(above, key=lambda s: len(s.path.parts))
    else:
        return None
    problem = exc.strerror or type(exc).__name__
    at = "" if failed == found.path else f" at {shorten(str(failed))}"
    then = advice if advice is not None else f"allowed: {found.allowed}"
    return f"{found.key}: {shorten(found.value)}: {problem}{at}; {then}"
