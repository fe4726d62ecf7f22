"""Grid-level progress (issue 28 item 7): "cell k of N" from the cell's grid position, the
grid's rounds done and ETA from every cell's progress file (cells may train in parallel, in
other processes), in the terminal lines, the Prefect logs and artifacts, and `reproduce`."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from fedcore.events import RoundRecord
from tasks.results.progress import (
    GridSlot,
    GridTracker,
    RichProgress,
    grid_eta,
    grid_slots,
    labelled,
)

REPO = Path(__file__).resolve().parents[3]


def rec(r: int, seconds: float) -> RoundRecord:
    return RoundRecord(r, 0.1, (0,), 2**20, 2**20, r, r, 0.5, 0.5, 0.7, 0, seconds)


def state(run: str, done: int, rounds: int = 4, timed: int | None = None, secs: float = 0.0,
          finished: bool = False) -> dict:  # fmt: skip
    timed = done if timed is None else timed
    return {"run": run, "done": done, "rounds": rounds, "timed": timed, "seconds": secs,
            "finished": finished}  # fmt: skip


def test_slots_number_the_grid_in_order(tmp_path):
    slots = grid_slots(3, 5, [tmp_path] * 3)
    assert [s.label for s in slots] == ["cell 1 of 3", "cell 2 of 3", "cell 3 of 3"]
    assert len({s.run for s in slots}) == 1 and len(set(slots[0].files)) == 3
    assert grid_slots(3, 5)[0].run != slots[0].run  # each grid run its own token
    assert labelled("fedavg-full", slots[1]) == "cell 2 of 3: fedavg-full"
    assert labelled("fedavg-full", None) == "fedavg-full"
    with pytest.raises(ValueError):
        grid_slots(3, 5, [tmp_path] * 2)


def test_grid_eta_sequential_cells():
    slot = GridSlot(2, 3, 4, ("a", "b", "c"), "run")
    # cell 1 done in 4 rounds of 2 s, cell 2 one round of 2 s in, cell 3 not started
    eta = grid_eta(slot, [state("run", 4, secs=8.0, finished=True), state("run", 1, secs=2.0),
                          None])  # fmt: skip
    assert (eta.done, eta.total) == (5, 12)
    assert eta.seconds == pytest.approx(7 * 2.0)  # 3 + 4 rounds left at 2 s, one at a time
    assert eta.text() == "grid 5/12 rounds, ETA 0:00:14"


def test_grid_eta_parallel_cells_divide_by_the_cells_running():
    slot = GridSlot(1, 4, 4, ("a", "b", "c", "d"), "run")
    states = [state("run", 2, secs=4.0), state("run", 2, secs=4.0), None, None]
    eta = grid_eta(slot, states)
    assert (eta.done, eta.total) == (4, 16)
    assert eta.seconds == pytest.approx(12 * 2.0 / 2)  # two cells train at once


def test_grid_eta_uses_the_runners_parallelism_up_to_the_cells_left():
    slot = GridSlot(1, 4, 4, ("a", "b", "c", "d"), "run", parallel=2)
    done = state("run", 4, secs=8.0, finished=True)
    # a cell just finished, the next not started yet: still two at a time
    eta = grid_eta(slot, [done, state("run", 2, secs=4.0), None, None])
    assert eta.seconds == pytest.approx(10 * 2.0 / 2)
    eta = grid_eta(slot, [done, done, done, state("run", 2, secs=4.0)])  # the last cell alone
    assert eta.seconds == pytest.approx(2 * 2.0)


def test_parallelism_of_the_task_runners():
    from flows.runners import grid_parallelism
    from tasks.config import load_params

    def of(*sets: str) -> int | None:
        return grid_parallelism(load_params(REPO / "params.yaml", list(sets)))

    assert of("runtime.task_runner=thread") == 1
    assert of("runtime.task_runner=dask", "runtime.dask_workers=3") == 3
    assert of("runtime.task_runner=ray", "runtime.ray_workers=4") == 4
    assert of("runtime.task_runner=dask", "runtime.dask_address=tcp://10.0.0.1:8786") is None


def test_grid_eta_ignores_an_earlier_run_and_counts_early_stops_whole():
    slot = GridSlot(1, 2, 10, ("a", "b"), "now")
    stale = state("before", 7, rounds=10, secs=70.0)  # an interrupted run's file
    eta = grid_eta(slot, [state("now", 0, rounds=10), stale])
    assert (eta.done, eta.total, eta.seconds) == (0, 20, None)  # nothing timed yet
    stopped = state("now", 3, rounds=10, secs=3.0, finished=True)  # a budget ended it
    eta = grid_eta(slot, [stopped, state("now", 10, rounds=10, secs=10.0, finished=True)])
    assert (eta.done, eta.total, eta.seconds) == (20, 20, 0.0)


def test_resumed_rounds_count_done_but_not_timed(tmp_path):
    (slot,) = grid_slots(1, 4, [tmp_path])
    t = GridTracker(slot)
    t.on_fit_start({"rounds": 4})
    t.on_resume(type("H", (), {"rounds": [1, 2]})())
    t.on_round_end(rec(3, 5.0))
    saved = json.loads(Path(slot.files[0]).read_text())
    assert saved == state(slot.run, 3, timed=1, secs=5.0)
    eta = t.eta()
    assert eta is not None and (eta.done, eta.seconds) == (3, 5.0)


def test_terminal_lines_show_the_cell_and_the_grid(tmp_path):
    slots = grid_slots(2, 2, [tmp_path] * 2)
    buf = io.StringIO()
    for slot, secs in zip(slots, (3.0, 1.0), strict=True):
        grid = GridTracker(slot)
        bar = RichProgress(labelled("fedavg-full", slot), Console(file=buf, width=300), grid)
        for cb in (grid, bar):
            cb.on_fit_start({"rounds": 2})
        for r in (1, 2):
            for cb in (grid, bar):
                cb.on_round_end(rec(r, secs))
        for cb in (grid, bar):
            cb.on_fit_end(None)
    lines = buf.getvalue().splitlines()
    assert lines[0].startswith("cell 1 of 2: fedavg-full round 1/2")
    assert "(3.0 s, ETA 0:00:03; grid 1/4 rounds, ETA 0:00:09)" in lines[0]
    assert lines[3].startswith("cell 2 of 2: fedavg-full round 2/2")
    assert lines[3].endswith("(1.0 s; grid 4/4 rounds, ETA 0:00:00)")


def test_a_cell_without_files_shows_its_position_only():
    buf = io.StringIO()
    slot = GridSlot(2, 3, 2)  # the DVC train stage: each cell its own stage
    grid = GridTracker(slot)
    bar = RichProgress(labelled("fedavg-lora", slot), Console(file=buf, width=300), grid)
    for cb in (grid, bar):
        cb.on_fit_start({"rounds": 2})
        cb.on_round_end(rec(1, 1.0))
    line = buf.getvalue().splitlines()[0]
    assert line.startswith("cell 2 of 3: fedavg-lora round 1/2") and "grid" not in line


def test_reproduce_eta_at_the_sessions_pace():
    from tasks.reproduce import runs

    assert runs.eta_text(0, 0.0, 300) == "300 cell-rounds left, ETA after the first experiment"
    assert runs.eta_text(100, 50.0, 300) == (
        "300 cell-rounds left, ETA 0:02:30 at this session's pace"
    )
    assert runs.eta_text(100, 50.0, 0) == "nothing left"
    items = runs.plan(runs.CLAIMS, "ci", REPO / "params.yaml")
    p = items[0].params
    cells = len(p.grid.algorithms) * len(p.grid.adapters) * len(p.experiment.seeds or [0])
    assert runs.work(items[0]) == cells * p.federation.rounds


@pytest.mark.slow
def test_a_real_two_cell_grid_shows_cell_2_of_2(tmp_path, monkeypatch):
    """`fedapt run` on a 2-cell grid with a real (test) Prefect server: the terminal lines,
    the flow run's logs and the grid's progress artifact."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterType
    from prefect.testing.utilities import prefect_test_harness
    from typer.testing import CliRunner

    from flows.cli import app

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    sets = [
        f"experiment.reports_dir={tmp_path}",
        "experiment.name=grid-progress",
        f"data.root={REPO / 'data/raw'}",
        "data.train_subset=400",
        "data.test_subset=100",
        "partition.num_clients=4",
        "federation.rounds=2",
        "client.max_steps=2",
        "grid.algorithms=[fedavg,fedprox]",
        "runtime.tracking=false",
        "runtime.workers=0",
        "storage.bucket=null",
    ]
    args = ["run", "--params", str(REPO / "params.yaml")]
    for s in sets:
        args += ["--set", s]
    with prefect_test_harness(server_startup_timeout=180):
        res = CliRunner().invoke(app, args)
        with get_client(sync_client=True) as client:
            progress = client.read_artifacts(
                artifact_filter=ArtifactFilter(type=ArtifactFilterType(any_=["progress"]))
            )
    assert res.exit_code == 0, res.output
    out = res.output
    assert "cell 1 of 2: fedavg-full round 2/2" in out
    last = [line for line in out.splitlines() if "cell 2 of 2: fedprox-full round 2/2" in line]
    assert last and "grid 4/4 rounds, ETA 0:00:00" in last[0], out[-2000:]
    (grid,) = [a for a in progress if "all 2 cells" in (a.description or "")]
    assert grid.data == 100.0
    cells = sorted(a.description for a in progress if a is not grid)
    assert cells == [
        "cell 1 of 2: fedavg-full: rounds done of 2",
        "cell 2 of 2: fedprox-full: rounds done of 2",
    ]
    assert not (tmp_path / "grid-progress" / "checkpoints").exists()  # files removed with it


def test_the_live_bar_shows_the_cell_and_the_grid(tmp_path):
    import re

    buf = io.StringIO()
    for slot in grid_slots(2, 2, [tmp_path] * 2, parallel=1):
        grid = GridTracker(slot)
        console = Console(file=buf, force_terminal=True, width=200)
        bar = RichProgress(labelled("fedavg-full", slot), console, grid)
        for cb in (grid, bar):
            cb.on_fit_start({"rounds": 2})
        for r in (1, 2):
            for cb in (grid, bar):
                cb.on_round_end(rec(r, 1.0))
        for cb in (grid, bar):
            cb.on_fit_end(None)
    text = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", buf.getvalue()).replace("\r", "\n")
    lines = [line for line in text.splitlines() if line.strip()]
    assert lines[-1].startswith("cell 2 of 2: fedavg-full")
    assert lines[-1].endswith("grid 4/4 rounds, ETA 0:00:00")
