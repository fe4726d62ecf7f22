"""One definition of each number: every figure's source data and every table of the report
(results.md, comm_cost.md/.json, pareto_front, accuracy_vs_mib, the cells' figures, the
terminal table) show a cell's final accuracy and the mean of its last L evaluated rounds as
its metrics.json, scores.json (DVC metrics) and summary.json hold them, L capped by the rounds
it evaluated and named in every label. Built from the committed real record of the train
stage, and checked on the committed report too."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tasks.config import load_params
from tasks.results import figures
from tasks.results.report import write_report

REPO = Path(__file__).resolve().parents[3]
RUNS = REPO / "artifacts/runs"
CELL = RUNS / "fedavg-full"  # the committed output of the train stage
MIB = 2**20


def _scores(record: dict[str, Any]) -> dict[str, Any]:
    """scores.json as tasks/training/outputs.py writes it (DVC's metrics file), its numbers only."""
    up, down = record["upload_bytes"] / MIB, record["download_bytes"] / MIB
    return {
        "final_accuracy_pct": round(100 * record["final_accuracy"], 6),
        "mean_accuracy_last_L_pct": round(100 * record["mean_accuracy_last_L"], 6),
        "rounds": len(record["rounds"]),
        "upload_mib": round(up, 6),
        "download_mib": round(down, 6),
        "total_mib": round(up + down, 6),
        "diverged_at_round": record["diverged_at_round"],
    }


def _cell(runs: Path, name: str, adapter: str, rounds: int, scale: float, div: int) -> None:
    """A cell from the committed record: its first ``rounds`` rounds, accuracies x ``scale``
    and bytes / ``div``, its numbers recomputed as fedcore.events.History computes them."""
    record = json.loads((CELL / "metrics.json").read_text())
    per_round = []
    for r in record["rounds"][:rounds]:
        r = dict(r)
        r["accuracy"] = round(r["accuracy"] * scale, 4)
        for k in ("upload_bytes", "download_bytes", "cum_upload_bytes", "cum_download_bytes"):
            r[k] //= div
        per_round.append(r)
    ev = [r["accuracy"] for r in per_round if r["accuracy"] is not None]
    last = per_round[-1]
    record.update(
        adapter=adapter,
        rounds=per_round,
        final_accuracy=ev[-1],
        mean_accuracy_last_L=float(np.mean(ev[-record["last_rounds_L"] :])),
        upload_bytes=last["cum_upload_bytes"],
        download_bytes=last["cum_download_bytes"],
        upload_bytes_per_round=last["upload_bytes"],
        download_bytes_per_round=last["download_bytes"],
    )
    (runs / name).mkdir(parents=True)
    (runs / name / "metrics.json").write_text(json.dumps(record))
    (runs / name / "scores.json").write_text(json.dumps(_scores(record)))


def _table(md: str, first_head: str) -> list[dict[str, str]]:
    """The rows of the Markdown table whose header starts with ``first_head``."""
    lines = md.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_head} |"))
    head = [c.strip() for c in lines[start].strip("|").split("|")]
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(head, (c.strip() for c in line.strip("|").split("|")), strict=True)))
    return rows


def check_agree(runs: Path, report: Path, saved: list[Any] | None = None) -> None:
    """Every number of the report in ``report`` against the cells' records in ``runs``
    (``saved``: the figures the report drew, to check the PNGs show their source data)."""
    summary = json.loads((report / "summary.json").read_text())
    names = [figures.FINAL, figures.MEAN_LAST]
    cells = {}
    for run in summary["runs"]:
        from tasks.grid import record_cell

        name = record_cell(run)
        record = json.loads((runs / name / "metrics.json").read_text())
        scores = json.loads((runs / name / "scores.json").read_text())
        for k in names:  # DVC metrics (in %), summary.json and metrics.json: one number each
            assert run[k] == record[k], (name, k)
            assert scores[f"{k}_pct"] == round(100 * record[k], 6), (name, k)
        evaluated = sum(r["accuracy"] is not None for r in record["rounds"])
        cells[name] = (record, scores, min(record["last_rounds_L"], evaluated))

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{100 * x:.2f}"

    results = _table((report / "results.md").read_text(), "cell")
    cost_md = (report / "comm_cost.md").read_text()
    target = _table(cost_md, "run") if "MiB to reach the target" in cost_md else []
    assert [r["cell"] for r in results] == list(cells)
    for row in [*results, *target]:
        record, _, L = cells[row.get("cell") or row["run"]]
        assert row["final acc %"] == pct(record["final_accuracy"])
        assert row["mean acc last L %"] == f"{pct(record['mean_accuracy_last_L'])} (L={L})"

    cost = json.loads((report / "comm_cost.json").read_text())
    for name, (record, scores, L) in cells.items():
        for part in (cost["final"][name], *([cost["target"]["runs"][name]] if target else [])):
            assert "final_acc" not in part  # the level table's running ACC is not a final one
            assert part[figures.FINAL] == record["final_accuracy"]
            assert part[figures.MEAN_LAST] == record["mean_accuracy_last_L"]
            assert part["last_rounds_L"] == L
        assert cost["final"][name]["mib"] == pytest.approx(scores["total_mib"], abs=1e-6)
    most = max(sum(r["accuracy"] is not None for r in c[0]["rounds"]) for c in cells.values())
    if cost["accuracy"] == "mean":  # the level table's window, capped and named
        assert cost["window"] <= most
        assert f"ACC: mean test accuracy of the last {cost['window']} evaluated" in cost_md
        assert "last 30 evaluated" not in cost_md or most >= 30

    pareto = json.loads((report / "pareto_front.json").read_text())
    metric = pareto["metric"]
    ls = {c[2] for c in cells.values()}
    if metric == figures.MEAN_LAST and len(ls) == 1:
        assert pareto["label"] == f"mean accuracy of the last {ls.pop()} evaluated rounds"
    evaluated_cells = [name for name, c in cells.items() if c[2] > 0]
    assert list(pareto["points"]) == evaluated_cells  # every cell that evaluated, none else
    for name, p in pareto["points"].items():
        record, scores, L = cells[name]
        assert p[metric] == record[metric] and p["L"] == L
        assert p["total_mib"] == pytest.approx(scores["total_mib"], abs=1e-6)
    # the front, recomputed: the cells no other cell beats on both MiB and accuracy
    xy = {n: (p["total_mib"], p[metric]) for n, p in pareto["points"].items()}
    front = sorted(
        (n for n in xy if not any(
            o != n and xy[o][0] <= xy[n][0] and xy[o][1] >= xy[n][1] and xy[o] != xy[n]
            for o in xy
        )),
        key=lambda n: xy[n],
    )  # fmt: skip
    assert pareto["front"] == (front if len(front) >= 2 else [])  # a line joins two or more

    curves = json.loads((report / "accuracy_vs_mib.json").read_text())
    for name, c in curves.items():
        record, scores, _ = cells[name]
        assert c["accuracy_pct"][-1] == pytest.approx(100 * record["final_accuracy"])
        assert c["mib"][-1] == pytest.approx(scores["total_mib"], abs=1e-6)
        # the cell's own figures (written by the train stage) end at the same numbers
        figs = figures.cell_figures(record["rounds"], name)
        (by_round,) = figs["accuracy_vs_round.png"].axes[0].get_lines()
        assert by_round.get_ydata()[-1] == pytest.approx(100 * record["final_accuracy"])
        total = figs["accuracy_vs_mib.png"].axes[0].get_lines()[0]
        assert total.get_xdata()[-1] == pytest.approx(scores["total_mib"], abs=1e-6)

    if saved is None:
        return
    # The PNGs the report drew show exactly their source data, and label what they show.
    by_x = {fig.axes[0].get_xlabel(): fig.axes[0] for fig in saved}
    ax = by_x["cumulative MiB transmitted (log)"]  # accuracy_vs_mib.png
    ends = {t.get_text() for t in ax.get_legend().get_texts()}
    assert ends == set(curves) and "final accuracy" in ax.get_legend().get_title().get_text()
    for line in ax.get_lines():
        c = curves[line.get_label()] if line.get_label() in curves else None
        if c is not None:
            assert np.allclose(line.get_xdata(), c["mib"])
            assert np.allclose(line.get_ydata(), c["accuracy_pct"])
        else:  # the marker at each curve's end: its final accuracy
            assert (line.get_xdata()[0], line.get_ydata()[0]) in {
                (c["mib"][-1], c["accuracy_pct"][-1]) for c in curves.values()
            }
    ax = by_x["total MiB transmitted, up + down (log)"]  # pareto_front.png
    assert ax.get_ylabel() == f"{pareto['label']} (%)"
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == [*pareto["points"], *(["Pareto front"] if pareto["front"] else [])]
    for line in ax.get_lines():
        if line.get_label() == "Pareto front":
            assert len(line.get_xdata()) == len(pareto["front"]) >= 2
            continue
        p = pareto["points"][line.get_label()]
        assert list(line.get_xdata()) == [p["total_mib"]]
        assert list(line.get_ydata()) == [pytest.approx(100 * p[metric])]


@pytest.mark.parametrize(
    "grid",
    [
        # two cells, 15 rounds: a front of two, drawn; L = 5
        {"adapters": "[full,lora]", "front": 2, "cells": [("fedavg-full", "full", 15, 1.0, 1),
                                                          ("fedavg-lora", "lora", 15, 0.9, 10)]},
        # one cell of 3 rounds: L capped at 3, no front, report.window capped at 3
        {"adapters": "[full]", "front": 0, "cells": [("fedavg-full", "full", 3, 1.0, 1)]},
        # report.accuracy: round: the Pareto figure shows the final accuracy; fedavg-lora
        # (as many MiB, less accurate) is beaten: a front of one, not drawn
        {"adapters": "[full,lora]", "accuracy": "round", "front": 0,
         "cells": [("fedavg-full", "full", 4, 1.0, 1), ("fedavg-lora", "lora", 4, 0.9, 1)]},
    ],
)  # fmt: skip
def test_every_figure_and_table_shows_the_records_numbers(tmp_path, monkeypatch, grid):
    from flows.cli.stages import collect_records

    runs = tmp_path / "runs"
    for cell in grid["cells"]:
        _cell(runs, *cell)
    sets = ["grid.algorithms=[fedavg]", f"grid.adapters={grid['adapters']}"]
    sets += [f"report.accuracy={grid.get('accuracy', 'mean')}"]
    params = load_params(REPO / "params.yaml", sets)
    saved: list[Any] = []
    save_png = figures.save_png

    def keep(fig: Any) -> bytes:
        saved.append(fig)
        return save_png(fig)

    monkeypatch.setattr(figures, "save_png", keep)
    write_report(params, collect_records(params, runs), tmp_path / "report", runs)
    check_agree(runs, tmp_path / "report", saved)
    pareto = json.loads((tmp_path / "report/pareto_front.json").read_text())
    assert pareto["metric"] == (
        figures.FINAL if grid.get("accuracy") == "round" else figures.MEAN_LAST
    )
    assert len(pareto["front"]) == grid["front"]
    if grid["cells"][0][2] == 3:
        assert re.search(r"\(L=3\)", (tmp_path / "report/results.md").read_text())
        assert (
            "report.window 30, capped at the 3 rounds"
            in (tmp_path / "report/comm_cost.md").read_text()
        )


def test_the_committed_report_agrees_with_the_committed_runs():
    check_agree(RUNS, REPO / "artifacts/report")


def test_the_terminal_table_names_the_capped_l():
    from flows.cli.tables import results_table

    record = json.loads((CELL / "metrics.json").read_text())
    short = {**record, "rounds": record["rounds"][:2]}
    table = results_table([record, short])
    assert list(table.columns[4].cells) == [
        f"{100 * record['mean_accuracy_last_L']:.2f}% L=5",
        f"{100 * record['mean_accuracy_last_L']:.2f}% L=2",
    ]


def test_a_pareto_front_of_one_cell_is_not_drawn_nor_in_the_legend():
    record = json.loads((CELL / "metrics.json").read_text())
    data = figures.pareto_data({"fedavg-full": ("full", "none", record)}, figures.MEAN_LAST)
    assert data["front"] == []
    ax = figures.pareto_front_figure(data, "t").axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["fedavg-full"]
    assert [line.get_label() for line in ax.get_lines()] == ["fedavg-full"]
