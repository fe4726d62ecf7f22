"""Console side effects of a run: a rich progress bar over rounds with live metrics."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from fedcore.events import Callback, RoundRecord
from fedcore.payload import mib


class RichProgress(Callback):
    def __init__(self, label: str, console: Console | None = None) -> None:
        self.label = label
        self.console = console or Console(stderr=True)
        self._progress: Progress | None = None
        self._task: Any = None
        self._rounds = 0
        self._seconds: list[float] = []  # this process's round times (the ETA's mean)

    def on_fit_start(self, info: dict[str, Any]) -> None:
        self._rounds = info["rounds"]
        if not self.console.is_terminal:
            return  # logs and CI: one plain line per round instead of a live bar
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=self.console,
            transient=False,
        )
        self._progress.start()
        self._task = self._progress.add_task(self.label, total=info["rounds"], status="")

    def on_resume(self, history: Any) -> None:
        done = len(history.rounds)
        if self._progress is None:
            self.console.print(
                f"{self.label} resumed: rounds 1-{done}/{self._rounds} from the checkpoint",
                highlight=False,
                markup=False,
            )
            return
        self._progress.update(self._task, advance=done, status=f"resumed after round {done}")

    def on_round_end(self, record: RoundRecord) -> None:
        acc = f"acc {record.accuracy:.4f}" if record.accuracy is not None else "acc -"
        down, up = mib(record.download_bytes), mib(record.upload_bytes)
        status = f"{acc}  down {down:.2f} MiB  up {up:.2f} MiB"
        if self._progress is None:  # not a terminal: one plain line per round for logs and CI
            self._seconds.append(record.seconds)
            left = self._rounds - record.round
            eta = f", ETA {_clock(left * sum(self._seconds) / len(self._seconds))}" if left else ""
            self.console.print(
                f"{self.label} round {record.round}/{self._rounds}  {status}  "
                f"({record.seconds:.1f} s{eta})",
                highlight=False,
                markup=False,
                soft_wrap=True,  # one line per round, whatever the width
            )
            return
        self._progress.update(self._task, advance=1, status=status)

    def on_fit_end(self, history: Any) -> None:
        if self._progress is not None:
            self._progress.stop()


def _clock(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class PrefectProgress(Callback):
    """Round progress where Prefect users look: one line per round in the flow run's logs
    (accuracy, MiB) and a progress artifact of the cell, updated each round. Does nothing
    outside a Prefect task run (the DVC stage, tests)."""

    def __init__(self, label: str) -> None:
        self.label = label
        self._logger: Any = None
        self._artifact: Any = None
        self._rounds = 0

    def on_fit_start(self, info: dict[str, Any]) -> None:
        from prefect.context import TaskRunContext
        from prefect.logging import get_run_logger

        if TaskRunContext.get() is None:
            return
        self._logger = get_run_logger()
        self._rounds = int(info["rounds"])
        try:
            from prefect.artifacts import create_progress_artifact

            self._artifact = create_progress_artifact(
                0.0, description=f"{self.label}: rounds done of {self._rounds}"
            )
        except Exception as exc:  # an artifact is a nicety, never a reason to stop a run
            self._logger.warning("%s: no progress artifact (%s)", self.label, exc)

    def on_resume(self, history: Any) -> None:
        if self._logger is not None:
            done = len(history.rounds)
            self._logger.info("%s resumed after round %d from its checkpoint", self.label, done)
            self._update(done)

    def on_round_end(self, record: RoundRecord) -> None:
        if self._logger is None:
            return
        acc = "-" if record.accuracy is None else f"{100 * record.accuracy:.2f}%"
        self._logger.info(
            "%s round %d/%d: acc %s, down %.2f MiB, up %.2f MiB, total %.1f MiB (%.1f s)",
            self.label,
            record.round,
            self._rounds,
            acc,
            mib(record.download_bytes),
            mib(record.upload_bytes),
            mib(record.cum_download_bytes + record.cum_upload_bytes),
            record.seconds,
        )
        self._update(record.round)

    def _update(self, done: int) -> None:
        if self._artifact is None:
            return
        from prefect.artifacts import update_progress_artifact

        try:
            update_progress_artifact(self._artifact, 100.0 * done / max(1, self._rounds))
        except Exception:  # the server went away: the logs still say it
            self._artifact = None
