"""Claim: FedIR (importance reweighting) does not improve on FedAvg under Dir(alpha) class
mixes: it ends below FedAvg at every alpha (seed 002 §4.1, Fig. 4, which "deny the expected
improvements for FedIR")."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tasks.reproduce import plots
from tasks.reproduce.claim_dirichlet_alpha import (
    ALPHA1,
    ALPHA10,
    ALPHA100,
    LAST,
    fedavg,
    points,
    rising,
)
from tasks.reproduce.measures import last_mean, pct, table
from tasks.reproduce.spec import Check, Claim, Experiment, Reading, Results, missing

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def _fedir(base: Experiment) -> Experiment:
    """FedIR on the same partition, sampling and protocol as the FedAvg run ``base``, which
    it is compared with (same seeds: the same clients in the same rounds)."""
    return Experiment(
        base.name.replace("alpha-", "fedir-alpha"),
        protocol=(*base.protocol, "grid.algorithms=[fedir]"),
        scale=base.scale,
        profiles=base.profiles,
    )


# Fig. 4 compares "different values of alpha": the values of §4, 1, 10 and 100 (alpha = 100
# on gpu only, as in the dirichlet-alpha claim). FedAvg's runs are that claim's.
PAIRS = tuple((_fedir(e), e) for e in (ALPHA100, ALPHA10, ALPHA1))


def measure(results: Results) -> Reading:
    needed = [n for ir, avg in PAIRS[1:] for n in (ir.name, avg.name)]  # alpha = 100: gpu only
    if (r := missing(results, needed)) is not None:
        return r
    checks, rows, notes = [], [], []
    for ir, avg in PAIRS:
        if ir.name not in results or avg.name not in results:
            continue
        alpha = avg.name.removeprefix("alpha-")
        c_ir = results[ir.name].cells.get("fedir-full")
        c_avg = fedavg(results, avg)
        e_ir = None if c_ir is None else last_mean(c_ir, LAST)
        e_avg = None if c_avg is None else last_mean(c_avg, LAST)
        gap = points(e_ir, e_avg)
        ok = None if gap is None else gap < 0
        checks.append(Check(f"alpha={alpha}: FedIR - FedAvg end acc (points)", gap, ok, "< 0"))
        if ok is False:
            notes.append(f"at alpha = {alpha} FedIR ends {gap:+.2f} points from FedAvg")
            notes += rising(c_avg, f"FedAvg at alpha = {alpha}")
            notes += rising(c_ir, f"FedIR at alpha = {alpha}")
        rows.append(
            [f"alpha={alpha}", pct(e_avg), pct(e_ir), "-" if gap is None else f"{gap:+.2f}"]
        )
    tab = table(
        ["class mixes", f"FedAvg end acc % (last {LAST})", "FedIR end acc %", "FedIR - FedAvg"],
        rows,
    )
    return Reading(tuple(checks), tab, "; ".join(notes) + ("." if notes else ""))


def plot(results: Results) -> Figure | None:
    ran = [(ir, avg) for ir, avg in PAIRS if ir.name in results or avg.name in results]
    if not ran:
        return None
    fig, axes = plots.panels(len(ran))
    for ax, (ir, avg) in zip(axes, ran, strict=True):
        alpha = avg.name.removeprefix("alpha-")
        lines = [(avg.name, "fedavg-full", "FedAvg"), (ir.name, "fedir-full", "FedIR")]
        plots.accuracy_curves(results, lines, f"alpha = {alpha} (seed 002 Fig. 4)", ax=ax)
    return fig


CLAIM = Claim(
    id="fedir",
    title="FedIR does not improve on FedAvg under Dir(alpha) class mixes: it ends below "
    "FedAvg at every alpha.",
    source="seed 002 §4.1, Fig. 4",
    paper=(
        '§4.1 "Federated Averaging vs Importance Reweighting": "This setting is designed for '
        "proving the higher efficiency of FedIR in respect to FedAVG in case of "
        "non-identically distributed clients. The results, visible in Figure 4 deny the "
        "expected improvements for FedIR, which scores less than the standard method in every "
        'setting." (Its conclusion: "slight improvements in efficiency in different '
        'settings" for the standard methods overall.) Fig. 4 is curves only; fedapt tests '
        "what the text reads off it: FedIR below FedAvg at each alpha."
    ),
    experiments=tuple(ir for ir, _ in PAIRS),
    reads=tuple(avg.name for _, avg in PAIRS),
    measure=measure,
    rule="A curve's end level is the mean of its last 5 evaluated rounds. Holds if FedIR's "
    "end level is below FedAvg's at every alpha run (1 and 10; also 100 on gpu), on the same "
    "partition and client sampling. FedIR at or above FedAvg at some alpha (the improvement "
    "the seed expected) makes it fail there.",
    tolerance="Seed 002 reports curves only: no numbers, no seeds, no spread, and 'scores "
    "less ... in every setting' names no margin, so the rule has none: the seeds' verdict "
    "over three seeds is 'cannot say' where FedIR and FedAvg are level within seed noise.",
    plot=plot,
    scaled={
        "gpu": "The seed's protocol (50 clients, 75% per round, E=2, B=64, SGD 0.01/0.9, "
        "LeNet5, equal sizes) on FashionMNIST (CIFAR-10 is not available offline), 100 rounds "
        "(not in the text), alpha = 100, 10, 1; FedAvg from the dirichlet-alpha claim's runs.",
        "cpu": "As the dirichlet-alpha claim (6,000 images on 10 clients, 8 per round, 30 "
        "rounds); alpha = 10 and 1, where the reweighting p(y)/q_k(y) is far from 1 (at "
        "alpha = 100, q_k(y) stays within about 3 points of 10%, so the weights stay near 1: "
        "a near-tie with FedAvg).",
        "ci": "Smoke test: 400 images over 4 clients, 3 rounds of 2 steps; alpha = 10, 1.",
    },
)
