"""Console side effects of a run: a rich progress bar over rounds with live metrics, and
where a cell stands in its grid (cell k of N, the grid's rounds done and its ETA).

A grid's cells may train in parallel and in other processes (Dask, Ray): "cell k of N" is
the cell's position in the grid, fixed when the grid is submitted, and the grid's progress
is read from one small JSON file per cell (``GridSlot.files``, beside the round checkpoints)
that each cell rewrites after every round. Display only: nothing here reaches a hashed file.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import UUID

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
from tasks.io import atomic_write_json


@dataclass(frozen=True)
class GridSlot:
    """Where a cell stands in its grid: position ``index`` (1-based, grid order) of ``total``
    cells of ``rounds`` rounds each. ``files``: every cell's progress file, in grid order
    (empty: the grid's progress is not followed, only the position is shown); ``run``: the
    grid run's token (files of an earlier, interrupted run are ignored); ``artifact``: the
    id of the grid's Prefect progress artifact, or None; ``parallel``: how many cells the
    task runner trains at once (None: unknown, e.g. a remote cluster)."""

    index: int
    total: int
    rounds: int
    files: tuple[str, ...] = ()
    run: str = ""
    artifact: str | None = None
    parallel: int | None = None

    @property
    def label(self) -> str:
        return f"cell {self.index} of {self.total}"


def grid_slots(
    total: int,
    rounds: int,
    folders: list[Path] | None = None,
    artifact: str | None = None,
    parallel: int | None = None,
) -> list[GridSlot]:
    """The slots of a grid of ``total`` cells; ``folders``: each cell's folder for its
    progress file (its checkpoint folder), in grid order, or None to show positions only."""
    files = tuple(str(Path(f) / f"progress-{i}.json") for i, f in enumerate(folders or ()))
    if files and len(files) != total:
        raise ValueError(f"{len(files)} progress folders for {total} cells")
    run = uuid.uuid4().hex
    return [GridSlot(i + 1, total, rounds, files, run, artifact, parallel) for i in range(total)]


def start_grid(
    total: int, rounds: int, folders: list[Path] | None, name: str, parallel: int | None = None
) -> list[GridSlot]:
    """The slots of a grid about to be submitted (``grid_slots``); inside a Prefect flow run,
    with the grid's progress artifact (rounds done of all cells), which its cells update."""
    artifact = None
    if folders:
        from prefect.context import FlowRunContext

        if FlowRunContext.get() is not None:
            try:
                from prefect.artifacts import create_progress_artifact

                created = create_progress_artifact(
                    0.0, description=f"{name}: rounds done of all {total} cells of the grid"
                )
                artifact = str(created)
            except Exception:  # an artifact is a nicety, never a reason to stop a run
                artifact = None
    return grid_slots(total, rounds, folders, artifact, parallel)


def end_grid(slots: list[GridSlot]) -> None:
    """The grid is done: its artifact at 100 % (its cells' last updates may cross)."""
    artifact = slots[0].artifact if slots else None
    if artifact is None:
        return
    from prefect.artifacts import update_progress_artifact

    try:
        update_progress_artifact(UUID(artifact), 100.0)
    except Exception:  # the server went away
        pass


@dataclass(frozen=True)
class GridEta:
    """The grid's rounds done (finished cells count whole, an early stop included) of
    ``total``, and the seconds left (None until a round was timed)."""

    done: int
    total: int
    seconds: float | None

    def text(self) -> str:
        eta = "" if self.seconds is None else f", ETA {clock(self.seconds)}"
        return f"grid {self.done}/{self.total} rounds{eta}"


def grid_eta(slot: GridSlot, states: list[dict[str, Any] | None]) -> GridEta:
    """The grid's progress from its cells' states (None: not started, or of another run):
    rounds left = each unfinished cell's own + ``slot.rounds`` per cell not started; seconds
    left = rounds left x the mean timed round over all cells / the cells that train at once
    (the runner's ``slot.parallel``, at most the cells left; unknown: those training now)."""
    mine = [s if s is not None and s.get("run") == slot.run else None for s in states]
    total = left = timed = 0
    seconds = 0.0
    running = waiting = 0
    for s in mine:
        if s is None:
            total += slot.rounds
            left += slot.rounds
            waiting += 1
            continue
        total += int(s["rounds"])
        if not s["finished"]:
            left += max(0, int(s["rounds"]) - int(s["done"]))
            running += 1
        timed += int(s["timed"])
        seconds += float(s["seconds"])
    lanes = running if slot.parallel is None else min(slot.parallel, running + waiting)
    eta = None if timed == 0 else left * seconds / timed / max(1, lanes)
    return GridEta(total - left, total, 0.0 if left == 0 else eta)


class GridTracker(Callback):
    """This cell's state in its progress file after every round, and the grid's progress
    read from all of them (``eta()``); a no-op without files. Put it before the callbacks
    that show ``eta()``."""

    def __init__(self, slot: GridSlot | None) -> None:
        self.slot = slot
        self._state: dict[str, Any] = {}

    @property
    def follows(self) -> bool:
        return self.slot is not None and bool(self.slot.files)

    def on_fit_start(self, info: dict[str, Any]) -> None:
        run = self.slot.run if self.slot else ""
        self._state = {"run": run, "rounds": int(info["rounds"]), "done": 0}
        self._state.update(timed=0, seconds=0.0, finished=False)
        self._write()

    def on_resume(self, history: Any) -> None:
        self._state["done"] = len(history.rounds)
        self._write()

    def on_round_end(self, record: RoundRecord) -> None:
        self._state["done"] = record.round
        self._state["timed"] += 1
        self._state["seconds"] += float(record.seconds)
        self._write()

    def on_fit_end(self, history: Any) -> None:
        self._state["finished"] = True
        self._write()

    def eta(self) -> GridEta | None:
        if not self.follows:
            return None
        assert self.slot is not None
        return grid_eta(self.slot, [_read(Path(f)) for f in self.slot.files])

    def _write(self) -> None:
        if not self.follows:
            return
        assert self.slot is not None
        try:
            atomic_write_json(self.slot.files[self.slot.index - 1], self._state)
        except OSError:  # progress is a nicety: a full or read-only disk stops the run itself
            pass


def _read(path: Path) -> dict[str, Any] | None:
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # not started yet (or being replaced: it reads whole, never half)
    return state if isinstance(state, dict) else None


def labelled(name: str, slot: GridSlot | None) -> str:
    """``cell k of N: <name>`` for a cell of a grid, else the name."""
    return name if slot is None else f"{slot.label}: {name}"


class RichProgress(Callback):
    """A live bar on a terminal, else one plain line per round; each with the cell's ETA and,
    given a ``grid`` that follows its grid, the grid's rounds done and ETA."""

    def __init__(
        self, label: str, console: Console | None = None, grid: GridTracker | None = None
    ) -> None:
        self.label = label
        self.grid = grid
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
            TextColumn("{task.fields[grid]}"),  # the grid's rounds done and ETA
            console=self.console,
            transient=False,
        )
        self._progress.start()
        self._task = self._progress.add_task(self.label, total=info["rounds"], status="", grid="")

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
        acc = f"acc {100 * record.accuracy:.2f}%" if record.accuracy is not None else "acc -"
        down, up = mib(record.download_bytes), mib(record.upload_bytes)
        status = f"{acc}  down {down:.2f} MiB  up {up:.2f} MiB"
        grid = self.grid.eta() if self.grid is not None else None
        if self._progress is None:  # not a terminal: one plain line per round for logs and CI
            self._seconds.append(record.seconds)
            left = self._rounds - record.round
            eta = f", ETA {clock(left * sum(self._seconds) / len(self._seconds))}" if left else ""
            eta += f"; {grid.text()}" if grid is not None else ""
            self.console.print(
                f"{self.label} round {record.round}/{self._rounds}  {status}  "
                f"({record.seconds:.1f} s{eta})",
                highlight=False,
                markup=False,
                soft_wrap=True,  # one line per round, whatever the width
            )
            return
        text = grid.text() if grid is not None else ""
        self._progress.update(self._task, advance=1, status=status, grid=text)

    def on_fit_end(self, history: Any) -> None:
        if self._progress is not None:
            self._progress.stop()


def clock(seconds: float) -> str:
    """H:MM:SS."""
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def api_only(run_logger: Any) -> Any:
    """A run logger whose records reach the flow run's logs in the Prefect API, not the
    console: the same run context on Prefect's ``prefect.extra`` logger (its handler: the
    API's, no propagation)."""
    import logging

    from prefect.logging.loggers import PrefectLogAdapter

    return PrefectLogAdapter(logging.getLogger("prefect.extra"), dict(run_logger.extra))


class PrefectProgress(Callback):
    """Round progress where Prefect users look: one line per round in the flow run's logs
    (accuracy, MiB; the grid's rounds done and ETA given a ``grid`` that follows its grid)
    and a progress artifact of the cell, updated each round, and of the grid when its slot
    names one. Does nothing outside a Prefect task run (the DVC stage, tests).

    The round lines go to the Prefect API only (Prefect's ``prefect.extra`` logger, which
    does not reach the console): the console has ``RichProgress``'s line for the round, and
    each line a run prints appears once."""

    def __init__(self, label: str, grid: GridTracker | None = None) -> None:
        self.label = label
        self.grid = grid
        self._logger: Any = None
        self._artifact: Any = None
        self._rounds = 0

    def on_fit_start(self, info: dict[str, Any]) -> None:
        from prefect.context import TaskRunContext
        from prefect.logging import get_run_logger

        if TaskRunContext.get() is None:
            return
        self._logger = api_only(get_run_logger())
        self._rounds = int(info["rounds"])
        try:
            from prefect.artifacts import create_progress_artifact

            self._artifact = create_progress_artifact(
                0.0, description=f"{self.label}: rounds done of {self._rounds}"
            )
        except Exception as exc:  # an artifact is a nicety, never a reason to stop a run
            get_run_logger().warning("%s: no progress artifact (%s)", self.label, exc)

    def on_resume(self, history: Any) -> None:
        if self._logger is not None:
            done = len(history.rounds)
            self._logger.info("%s resumed after round %d from its checkpoint", self.label, done)
            self._update(done)

    def on_round_end(self, record: RoundRecord) -> None:
        if self._logger is None:
            return
        acc = "-" if record.accuracy is None else f"{100 * record.accuracy:.2f}%"
        grid = self.grid.eta() if self.grid is not None else None
        self._logger.info(
            "%s round %d/%d: acc %s, down %.2f MiB, up %.2f MiB, total %.1f MiB (%.1f s%s)",
            self.label,
            record.round,
            self._rounds,
            acc,
            mib(record.download_bytes),
            mib(record.upload_bytes),
            mib(record.cum_download_bytes + record.cum_upload_bytes),
            record.seconds,
            "" if grid is None else f"; {grid.text()}",
        )
        self._update(record.round)

    def on_fit_end(self, history: Any) -> None:
        if self._logger is not None:
            self._update_grid()  # a cell that stopped early counts whole from now

    def _update(self, done: int) -> None:
        if self._artifact is not None:
            from prefect.artifacts import update_progress_artifact

            try:
                update_progress_artifact(self._artifact, 100.0 * done / max(1, self._rounds))
            except Exception:  # the server went away: the logs still say it
                self._artifact = None
        self._update_grid()

    def _update_grid(self) -> None:
        """The grid's artifact: its rounds done, as this cell reads them now (cells in other
        processes write it too; each writes what all the files say, so the last write is
        never behind by more than the rounds of one update)."""
        slot = self.grid.slot if self.grid is not None else None
        eta = self.grid.eta() if self.grid is not None else None
        if slot is None or slot.artifact is None or eta is None:
            return
        from prefect.artifacts import update_progress_artifact

        try:
            update_progress_artifact(UUID(slot.artifact), 100.0 * eta.done / max(1, eta.total))
        except Exception:  # the server went away: the logs still say it
            pass
