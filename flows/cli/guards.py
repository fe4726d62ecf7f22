"""A command's one-line error guard (``guard``, ``guarded``): a FedaptError, or an OSError at
the edges, becomes one line on stderr naming the setting, and exit code 2."""

from __future__ import annotations

import ast
import errno
import functools
import os
import re
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

import typer

from flows.cli.console import err, print_error
from flows.cli.stopping import Interrupted, exit_now

P = ParamSpec("P")
R = TypeVar("R")


def guarded(fn: Callable[P, R] | None = None, *, services: bool = False) -> Any:
    """A command's error guard, as a decorator: a FedaptError becomes one line on stderr and
    exit code 2 (``guard``). ``services=True`` runs the command with the services of `fedapt
    up` that are up (the same rule as `fedapt run`: a `dvc repro` stage run while the MLflow
    server is up is tracked there, not in mlruns/)."""

    def wrap(f: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(f)
        def run(*args: P.args, **kwargs: P.kwargs) -> R:
            def body() -> R:
                if not services:
                    return f(*args, **kwargs)
                from flows import services as svc

                with svc.patched_environ(svc.env_for_clients()):
                    return f(*args, **kwargs)

            return guard(body)  # type: ignore[no-any-return]

        return run

    return wrap(fn) if fn is not None else wrap


def guard(fn: Callable[[], Any]) -> Any:
    """Run a command body; a FedaptError becomes one line on stderr and exit code 2."""
    from fedcore.errors import FedaptError

    try:
        return _loops_as_os_errors(fn)
    except FedaptError as exc:
        print_error(str(exc))
        raise typer.Exit(2) from None
    except OSError as exc:  # at the edges: a path that cannot be read or written
        from flows import settings

        full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
        if exc.filename is None:
            if not full:
                raise
            print_error(_full_disk_without_a_path(exc))  # a write that names no file
            raise typer.Exit(2) from None
        path = exc.filename if exc.filename2 is None else f"{exc.filename} -> {exc.filename2}"
        name_dangling_link(exc)
        # the setting (params key, variable) that made the path; a full disk too: the line
        # names the setting whose folder filled, and the file
        named = settings.explain(exc, FULL_DISK_ADVICE if full else None)
        if named is not None:
            print_error(named)
            raise typer.Exit(2) from None
        if full:
            hint = FULL_DISK_ADVICE
        else:
            hint = (
                "check that the path exists, is the right kind (file or folder) and that you "
                "may read and write it"
            )
        print_error(f"{path}: {exc.strerror or type(exc).__name__}; {hint}")
        raise typer.Exit(2) from None
    except KeyboardInterrupt as exc:
        if isinstance(exc, Interrupted):  # the command unwound: stop now, threads and all
            exit_now(exc.exit_code, exc.signame)
        err.print("fedapt: interrupted")
        raise typer.Exit(130) from None


def name_dangling_link(exc: OSError) -> None:
    """mkdir on a link to nowhere or a link loop says "File exists" (EEXIST) or "No such
    file or directory": say what the path is instead."""
    name = exc.filename
    if exc.errno not in (errno.EEXIST, errno.ENOENT) or not isinstance(name, str | bytes):
        return
    name = os.fsdecode(name)
    if os.path.islink(name) and not os.path.exists(name):
        from tasks.io import missing

        exc.strerror = missing(name).removeprefix("is ")


def _loops_as_os_errors(fn: Callable[[], Any]) -> Any:
    """``fn()``, with Python 3.11's ``Path.resolve()`` error on a loop of symbolic links
    (a RuntimeError naming the path) raised as the OSError it is (ELOOP, with the path), so
    ``guard`` names the setting that made the path like any other path error."""
    try:
        return fn()
    except RuntimeError as exc:
        found = re.fullmatch(r"Symlink loop from (.+)", str(exc))
        if found is None:
            raise
        try:
            path = ast.literal_eval(found.group(1))
        except (ValueError, SyntaxError):
            raise exc from None
        raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path) from None


FULL_DISK_ADVICE = "free some space there (or raise the quota) and run again"


def _full_disk_without_a_path(exc: OSError) -> str:
    """A full disk whose error names no file: the folders the command's settings name."""
    from flows import settings

    problem = exc.strerror or "No space left on device"
    named = [f"{s.key} ({settings.shorten(str(s.path))})" for s in settings.registered()]
    where = ", ".join(named) or "the outputs"
    return f"{problem}; free some space (or raise the quota) on the disk of {where}, then run again"
