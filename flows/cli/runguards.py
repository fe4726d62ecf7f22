"""What guards a run while it goes and as it ends: the watch over the services it uses (a lost
one stops it in one line) and the exit code of a run that diverged."""

from __future__ import annotations

import contextlib
from typing import Any

import typer

from flows.cli.console import err
from flows.cli.stopping import stop_now


def services_watched(
    managed: tuple[str, ...], resume: str, *, tracking: bool
) -> contextlib.AbstractContextManager[None]:
    """For the block, the watch over the services a run uses (``flows.services.runwatch``):
    one that stops answering (`fedapt down`, a crash) stops the run within seconds in one
    line (``services_lost``), not after minutes of the clients' retries: after
    ``FEDAPT_SERVICE_GRACE`` seconds without an answer (default 3). ``managed``: the
    variables `fedapt up`'s services set; ``resume``: what the same command does then."""
    from flows.services import runwatch

    return runwatch.watch(
        runwatch.watched_services(managed=managed),
        lambda lost: services_lost(lost, resume, tracking=tracking),
        grace=runwatch.grace_seconds(),  # FEDAPT_SERVICE_GRACE (checked as the command starts)
    )


def services_lost(lost: list[Any], resume: str, *, tracking: bool) -> None:
    """Services of the run stopped answering: the run stops now, exit 2, in one line naming
    them, what to start and how to resume. Its MLflow runs are marked KILLED while the MLflow
    server still answers (else the rerun marks them)."""
    what = ", ".join(f"{s.name} ({s.var}={s.shown})" for s in lost)
    who = "they" if len(lost) > 1 else "it"
    if all(s.managed for s in lost):
        how = "start the services again (fedapt up), then run the same command"
    elif any(s.managed for s in lost):
        how = "once they answer again (fedapt up starts fedapt's), run the same command"
    else:
        how = f"once {who} {'answer' if len(lost) > 1 else 'answers'} again, run the same command"
    mlflow_up = not any(s.name == "mlflow" for s in lost)
    stop_now(
        2,
        f"{what} stopped answering during the run (`fedapt down`, or {who} crashed); "
        f"the run stopped: {how}; {resume}",
        error=True,
        cleanup=_runs_killed if tracking and mlflow_up else None,
    )


def _runs_killed() -> None:
    from tasks import tracking

    tracking.end_active_runs("KILLED")


EXIT_DIVERGED = 3  # the outputs were written, but training diverged (runtime.allow_divergence)


def exit_if_diverged(params: Any, records: list[dict[str, Any]]) -> None:
    """Exit with EXIT_DIVERGED when a cell diverged, unless ``runtime.allow_divergence``
    (each cell printed its warning line as it ended)."""
    from tasks.training.train import diverged

    cells = diverged(records)
    if cells and not params.runtime.allow_divergence:
        err.print(
            f"fedapt: diverged: {', '.join(cells)} (exit {EXIT_DIVERGED}; "
            "runtime.allow_divergence: true accepts it)",
            highlight=False,
            markup=False,
        )
        raise typer.Exit(EXIT_DIVERGED)
