"""Claim: local training with adapters takes less time than full fine-tuning (seed 003
§4.4.1, Tables 10-11: 20-40% less). Runs nothing itself: it reads the measured local
training time (``local_train_seconds_mean``, per client job, decode/encode excluded) of the
transformer and ResNet26 claims' cells, and of the Shakespeare claim's non-IID cells where
the profile ran them (Table 11 is Shakespeare non-IID)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tasks.reproduce import claim_shakespeare as shk
from tasks.reproduce import plots
from tasks.reproduce.claim_adapters import DIR05
from tasks.reproduce.claim_transformer import ADAPTERS, FULL, METHODS
from tasks.reproduce.measures import num, table
from tasks.reproduce.spec import Cell, Check, Claim, Reading, Results, missing

if TYPE_CHECKING:
    from matplotlib.figure import Figure

KEY = "local_train_seconds_mean"


def _seconds(cell: Cell | None) -> float | None:
    value = None if cell is None else cell.record.get(KEY)
    return None if value is None else float(value)


def pairs(results: Results) -> list[tuple[str, float | None, float | None]]:
    """(label, adapter seconds, full seconds) for every adapter cell with a full baseline."""
    out = []
    if FULL.name in results and ADAPTERS.name in results:
        full = _seconds(results[FULL.name].cells.get("fedavg-full"))
        for m in METHODS:
            out.append(
                (f"MiniLM {m}", _seconds(results[ADAPTERS.name].cells.get(f"fedavg-{m}")), full)
            )
    if shk.FULL.name in results and shk.ADAPTERS.name in results:
        full = _seconds(results[shk.FULL.name].cells.get("fedavg-full"))
        for m in shk.METHODS:
            ad = _seconds(results[shk.ADAPTERS.name].cells.get(f"fedavg-{m}"))
            out.append((f"gpt2_small {m} (Shakespeare)", ad, full))
    if DIR05.name in results:
        cells = results[DIR05.name].cells
        for alg in sorted({c.split("-", 1)[0] for c in cells}):
            out.append(
                (
                    f"ResNet26 {alg} residual",
                    _seconds(cells.get(f"{alg}-residual")),
                    _seconds(cells.get(f"{alg}-full")),
                )
            )
    return out


def measure(results: Results) -> Reading:
    if (r := missing(results, [FULL.name, ADAPTERS.name])) is not None:
        return r
    rows, checks = [], []
    for label, ad, full in pairs(results):
        ratio = None if ad is None or not full else ad / full
        checks.append(
            Check(f"{label} / full local time", ratio, None if ratio is None else ratio < 1.0,
                  "< 1")
        )  # fmt: skip
        rows.append([label, num(ad, ".3f"), num(full, ".3f"), num(ratio)])
    tab = table(
        ["adapter cell", "local s per client job", "full s per client job", "adapter / full"], rows
    )
    return Reading(tuple(checks), tab)


def plot(results: Results) -> Figure | None:
    ps = [p for p in pairs(results) if p[1] is not None and p[2]]
    if not ps:
        return None
    fig, (ax,) = plots.panels(1)
    groups = [p[0].replace(" ", "\n", 1) for p in ps]
    plots.bars(
        groups,
        [("adapter / full", [p[1] / p[2] for p in ps])],
        "local training time, adapter / full",
        "ratio (1 = as slow as full)",
        ax=ax,
    )
    ax.axhline(1.0, color="black", lw=0.8)
    ax.axhspan(0.58, 0.80, color="green", alpha=0.12, label="seed 003 Tables 10-11")
    ax.legend(fontsize=7)
    return fig


CLAIM = Claim(
    id="train-time",
    title="Local training with adapters takes less time than full fine-tuning.",
    source="seed 003 §4.4.1, Tables 10-11",
    paper=(
        "Table 10 (Stack Overflow, gpt2-base, 30 rounds): full 2 h 10 m 59 s; Pfeiffer 0.75, "
        "LoRA 0.80, Houlsby 0.79 of it. Table 11 (Shakespeare): Pfeiffer 0.58, LoRA 0.65, "
        'Houlsby 0.65. §4.4.1: "approximately 20% reduction", "up to 40%".'
    ),
    experiments=(),
    measure=measure,
    rule="Holds if every adapter cell's local training time per client job is below full "
    "fine-tuning's on the same backbone (the cells of one backbone ran one after another on a "
    "shared machine, so the ratios carry its load noise).",
    tolerance="Seed 003 reports one run per cell, with ratios of 0.58-0.80; the rule asks "
    "only for the direction (< 1), on every seed.",
    plot=plot,
    reads=(FULL.name, ADAPTERS.name, DIR05.name, shk.FULL.name, shk.ADAPTERS.name),
    scaled={
        p: "No runs of its own: the transformer claim's cells (and the ResNet26 Dir(0.5) "
        "and Shakespeare non-IID cells where they ran) record their local training time."
        for p in ("gpu", "cpu", "ci")
    },
)
