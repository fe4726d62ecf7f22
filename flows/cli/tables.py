"""The results tables a command prints: one row per grid cell, or per cell over a seed sweep."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.table import Table


def results_table(records: list[dict[str, Any]]) -> Table:
    """One row per grid cell: accuracy in %, traffic in MiB (2**20 bytes) per round and in
    total, the round it diverged at. A record read from metrics.json (the report stage)
    carries its per-round list in ``rounds``: the table shows its length, never the list,
    and caps L by the rounds it evaluated (``tasks.results.figures.last_l``: a run's records need
    theirs, ``tasks.results.report.with_rounds``)."""
    from fedcore.payload import mib
    from tasks.grid import record_cell
    from tasks.results.figures import last_l

    t = Table(
        title="fedapt results (traffic in MiB = 2^20 bytes; acc last L: mean over the last L "
        "evaluated rounds; s: wall seconds)",
        box=box.SIMPLE_HEAD,
    )
    cols = [
        "cell",
        "partition",
        "rounds",
        "final acc",
        "acc last L",
        "up/rnd",
        "down/rnd",
        "up",
        "down",
        "total",
        "diverged at",
        "s",
    ]
    exits = any(r.get("final_accuracy_exits") for r in records)  # early-exit methods
    if exits:
        cols.append("acc per exit")
    personal = any(r.get("personalization") for r in records)  # seed 001 Table 4
    if personal:
        cols.append("personalized % (gain)")
    private = any(r.get("privacy") for r in records)  # client-level DP
    if private:
        cols.append("epsilon (delta)")
    for col in cols:
        t.add_column(col, justify="left" if col in ("cell", "partition") else "right")
    for r in records:
        per_exit = " ".join(f"{100 * a:.1f}" for a in r.get("final_accuracy_exits") or [])
        up, down = mib(r["upload_bytes"]), mib(r["download_bytes"])
        t.add_row(
            record_cell(r),
            str(r["partition"]),
            str(rounds_run(r)),
            _pct(r["final_accuracy"]),
            f"{_pct(r['mean_accuracy_last_L'])} L={last_l(r)}",
            f"{mib(r['upload_bytes_per_round']):.2f}",
            f"{mib(r['download_bytes_per_round']):.2f}",
            f"{up:.1f}",
            f"{down:.1f}",
            f"{up + down:.1f}",
            str(r.get("diverged_at_round") or "-"),
            f"{r['wall_seconds']:.0f}" if "wall_seconds" in r else "-",
            *([per_exit or "-"] if exits else []),
            *([_personal(r.get("personalization") or {})] if personal else []),
            *([_spent(r.get("privacy"))] if private else []),
        )
    return t


def _spent(privacy: dict[str, Any] | None) -> str:
    """epsilon(delta) of a DP run; "-" for a run without privacy."""
    if not privacy:
        return "-"
    return f"{privacy['epsilon']:.3g} ({privacy['delta']:.0e})"


def rounds_run(record: dict[str, Any]) -> int:
    """The rounds a record ran: ``rounds`` is their number in a run's record and the list
    of per-round records in a cell's metrics.json."""
    rounds = record["rounds"]
    return rounds if isinstance(rounds, int) else len(rounds)


def sweep_table(cells: list[dict[str, Any]], seeds: list[int]) -> Table:
    """A seed sweep's table (``tasks.training.sweep.cell_stats``): one row per cell, mean ± sample
    std over the seeds (n seeds) of the accuracies in %, of the traffic in MiB."""
    from tasks.training.sweep import diverged_text, mean_std, rounds_text, with_n

    t = Table(
        title=f"fedapt results, mean ± std over seeds {', '.join(map(str, seeds))} "
        "(sample std; MiB = 2^20 bytes)"
    )
    cols = ("run", "partition", "rounds", "final acc %", "mean acc last L %", "up MiB", "down MiB")
    for col in (*cols, "diverged at"):
        t.add_column(col, justify="left" if col in ("run", "partition") else "right")
    for c in cells:
        t.add_row(
            f"{c['algorithm']}/{c['adapter']}" + (f"/{c['codec']}" if "codec" in c else ""),
            c["partition"],
            rounds_text(c["rounds"]),
            with_n(c["final_accuracy"], 100),
            with_n(c["mean_accuracy_last_L"], 100, L=c["last_rounds_L"]),
            mean_std(c["upload_mib"], digits=1),
            mean_std(c["download_mib"], digits=1),
            diverged_text(c),
        )
    return t


def _personal(by_scope: dict[str, Any]) -> str:
    """Mean personalized accuracy and its gain over the global model, per scope."""
    return (
        " ".join(
            f"{scope.removeprefix('client_')} {100 * r['mean_accuracy_after']:.1f} "
            f"({100 * r['mean_gain']:+.1f})"
            for scope, r in by_scope.items()
            if r.get("mean_gain") is not None
        )
        or "-"
    )


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f}%"
