"""The environment every command starts in: offline, quiet defaults, a path variable set but
empty refused, CUDA's workspace set, the standard streams masked."""

from __future__ import annotations

import os
from pathlib import Path

import typer

from flows.cli.console import print_error
from flows.streams import mask_streams

# Offline and quiet by default; the project keeps its own Prefect home. Set when a command
# runs (the app's callback), before it imports Prefect or MLflow; never at import.
_ROOT = Path(__file__).resolve().parents[2]
OFFLINE_DEFAULTS = {
    "PREFECT_HOME": str(_ROOT / ".prefect"),
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    "DO_NOT_TRACK": "true",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DVC_NO_ANALYTICS": "1",
    # MLflow's HTTP client retries a request 7 times with a backoff factor of 2 (about 4
    # minutes a call; a run that lost its server stalled for 11): 3 retries, factor 1 (about
    # 7 s) ride out a blip; a server that is gone is the run's watch's to report (runwatch).
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "3",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
}


# cuBLAS reads its workspace size once, at its first call, and its deterministic mode needs
# this one: set before any CUDA work (fedcore.device.CUBLAS_WORKSPACE, which
# tests/fedcore/engine/test_engine.py keeps equal; not imported here, it would import torch for every command).
CUBLAS_WORKSPACE = ":4096:8"


# Variables that name a path: an empty value (`FEDAPT_STATE_DIR= fedapt ...`) is refused in one
# line. (Prefect took an empty PREFECT_HOME as the current folder and wrote its database there;
# the others fell back to their defaults without a word.)
EMPTY_REFUSED = {
    "FEDAPT_STATE_DIR": "a folder fedapt may create and write into",
    "PREFECT_HOME": "a folder Prefect may create and write into",
    "FEDAPT_MLFLOW_CONFIG": "a TOML file with one [server] table, as mlflow/server.toml",
}

FOLDER_VARIABLES = ("FEDAPT_STATE_DIR", "PREFECT_HOME")


def _file_in_the_way(value: str | None) -> Path | None:
    """The path (``value`` or a folder above it) that exists but is no folder, if any: a
    command would otherwise fail later, or report services "not running"."""
    if not value:
        return None
    path = Path(value)
    for place in (path, *path.parents):
        if place.exists():
            return None if place.is_dir() else place
    return None


def offline_defaults() -> None:
    """Every command: the environment defaults above, where the user set none, and what
    CUDA libraries read at their first call; and standard output and error masked
    (``mask_streams``)."""
    from flows import settings

    settings.forget()  # a new command (a test's CliRunner runs many in one process)
    for var, unset in EMPTY_REFUSED.items():  # set but empty: not "unset", never a guess
        if var in os.environ and not os.environ[var].strip():
            print_error(
                f"{var} is set but empty ({os.environ[var]!r}); allowed: {unset} "
                f"(unset {var} for its default)"
            )
            raise typer.Exit(2)
    for var in FOLDER_VARIABLES:  # a file where a folder must be: every command stops
        if (blocked := _file_in_the_way(os.environ.get(var))) is not None:
            where = (
                "is a file" if str(blocked) == os.environ[var] else f"is under the file {blocked}"
            )
            print_error(
                f"{var}={os.environ[var]} {where}, not a folder; allowed: {EMPTY_REFUSED[var]} "
                f"(unset {var} for its default)"
            )
            raise typer.Exit(2)
    given = os.environ.get("PREFECT_HOME")
    for key, value in {**OFFLINE_DEFAULTS, "CUBLAS_WORKSPACE_CONFIG": CUBLAS_WORKSPACE}.items():
        os.environ.setdefault(key, value)
    default = OFFLINE_DEFAULTS["PREFECT_HOME"]
    settings.setting_path(
        "PREFECT_HOME",
        given or f"unset, so {default}",
        os.environ["PREFECT_HOME"],
        f"a folder Prefect may create and write into (unset: {default})",
    )
    mask_streams()
