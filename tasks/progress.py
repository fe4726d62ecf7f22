"""Console side effects of a run: a rich progress bar over rounds with live metrics."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from fedcore.events import Callback, RoundRecord
from fedcore.payload import mib


class RichProgress(Callback):
    def __init__(self, label: str, console: Console | None = None) -> None:
        self.label = label
        self.console = console or Console(stderr=True)
        self._progress: Progress | None = None
        self._task: Any = None
        self._rounds = 0

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
            self.console.print(
                f"{self.label} round {record.round}/{self._rounds}  {status}  ({record.seconds:.1f} s)",
                highlight=False,
            )
            return
        self._progress.update(self._task, advance=1, status=status)

    def on_fit_end(self, history: Any) -> None:
        if self._progress is not None:
            self._progress.stop()
