"""Claim: FedAvg's accuracy declines steadily and its convergence slows as the clients' class
mixes grow more skewed, from IID through Dir(alpha) with alpha = 100, 10, 1 (seed 002 §4.1,
Fig. 3). Its experiments are seed 002's FedAvg setting, which the other seed-002 claims
(local epochs, FedIR, FedVC) vary or read; the guards and helpers they share live here."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tasks.reproduce import plots
from tasks.reproduce.claim_server_opt import SEED002
from tasks.reproduce.measures import (
    convergence_round,
    end_level,
    learned_points,
    num,
    pct,
    table,
    trend_rise,
    upto,
)
from tasks.reproduce.spec import (
    Cell,
    Check,
    Claim,
    Dropped,
    Experiment,
    ExperimentResult,
    Reading,
    Results,
    missing,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# Seed 002 §4.1 FedAvg (the server-opt claim's protocol without its server optimisers): 50
# clients, 75% per round, E=2 (chosen in Fig. 2 "for all the next experiments"), B=64, SGD lr
# 0.01 momentum 0.9, LeNet5, equal client sizes, q ~ Dir(alpha p) per client; 100 rounds
# assumed (the figures' round count is not in the text); FashionMNIST for CIFAR-10.
FEDAVG002 = (
    *(s for s in SEED002 if not s.startswith("grid.algorithm")),
    "model.options.norm=none",
    "grid.algorithms=[fedavg]",
)
# cpu: 10 clients of 600 images (8 per round at 75%), 30 rounds. Ten is the fewest clients
# whose quota (S/N) still fits in one class's pool (S/10), so Dir(alpha p) at alpha = 1 can
# still make a client (nearly) single-class as with the seed's 50 clients; 600 images are 20
# local steps per round at E=2 (the seed's clients: about 32), the local work that the
# local-epochs and FedVC claims turn on.
CPU = (
    "data.train_subset=6000",
    "data.test_subset=1000",
    "partition.num_clients=10",
    "federation.rounds=30",
)
CI = (
    "data.train_subset=400",
    "data.test_subset=100",
    "partition.num_clients=4",
    "federation.rounds=3",
    "client.max_steps=2",
)
WINDOW = 5  # a curve's end level: the mean of its last 5 evaluated rounds (Claim.window)
LAST = WINDOW  # (the name the seed-002 claims used for it)
# The seed-002 claims' shared guards (their tolerance texts say why these numbers):
PLATEAU = 5.0  # points: the most a curve's least-squares trend may still rise over the
# second half of its rounds for the curve to count as converged
HALF = 0.5  # ... over this share of its evaluated rounds
LEARNED = 2.0  # points: a method "learned" when it ends this far above what it started from


def _alpha(alpha: float | None, profiles: tuple[str, ...] = ("ci", "cpu", "gpu")) -> Experiment:
    """FedAvg with Dir(alpha p) class mixes (None: IID)."""
    part = (
        ("partition.scheme=iid",)
        if alpha is None
        else (
            "partition.scheme=dirichlet_clientwise",
            f"partition.dirichlet_clientwise.alpha={alpha:g}",
        )
    )
    name = "alpha-iid" if alpha is None else f"alpha-{alpha:g}"
    return Experiment(name, (*FEDAVG002, *part), {"cpu": CPU, "ci": CI}, profiles)


# Fig. 3: IID and alpha = 100, 10, 1, most identical first. ALPHA1 (E=2, equal sizes) is also
# the FedIR claim's FedAvg at alpha = 1; ALPHA10 the local-epochs claim's E=2 curve and the
# FedIR claim's FedAvg at alpha = 10. Under cpu ALPHA10 runs 40 rounds (80 local epochs, the
# local-epochs claim's design: its E=2 curve must reach its plateau); this claim and FedIR
# read it over the rounds their other curves ran (30).
ALPHA10_CPU_ROUNDS = 40
IID, ALPHA100, ALPHA10, ALPHA1 = (
    _alpha(None),
    _alpha(100.0, ("gpu",)),  # cpu and ci: IID and alpha = 100 are near-identical mixes
    _alpha(10.0),
    _alpha(1.0),
)
ALPHA10 = Experiment(
    ALPHA10.name,
    ALPHA10.protocol,
    {"cpu": (*CPU, f"federation.rounds={ALPHA10_CPU_ROUNDS}"), "ci": CI},
    ALPHA10.profiles,
)
CURVES = ((IID, "IID"), (ALPHA100, "alpha=100"), (ALPHA10, "alpha=10"), (ALPHA1, "alpha=1"))

TIE = 1.0  # points: a less skewed setting may end this far below a more skewed one (level)
DECLINE = 2.0  # points: IID ends at least this far above alpha = 1 (a decline, not noise)
SLACK = 0.1  # of the rounds: a more skewed setting may converge this much earlier (level)
SHARE = 0.95  # a curve's convergence round: its 3-round mean first at 95% of its end level
TRAILING = 3


def fedavg(results: Results, exp: Experiment) -> Cell | None:
    return results[exp.name].cells.get("fedavg-full") if exp.name in results else None


def last_round(cell: Cell | None) -> int | None:
    """The last evaluated round of a curve (None without evaluations)."""
    ev = [int(r["round"]) for r in cell.rounds if r.get("accuracy") is not None] if cell else []
    return ev[-1] if ev else None


def common(cells: dict[str, Cell]) -> tuple[dict[str, Cell], int | None]:
    """The curves cut to the rounds every one of them ran, and that round count."""
    ends = [r for c in cells.values() if (r := last_round(c)) is not None]
    if not ends:
        return cells, None
    n = min(ends)
    return {k: upto(c, n) for k, c in cells.items()}, n


def points(a: float | None, b: float | None) -> float | None:
    """a - b in points (a, b fractions)."""
    return None if a is None or b is None else 100 * (a - b)


def rounds_apart(a: int | None, b: int | None) -> float | None:
    """b - a in rounds."""
    return None if a is None or b is None else float(b - a)


def share_apart(a: int | None, b: int | None, rounds: int | None) -> float | None:
    """b - a as a share of the ``rounds`` run."""
    return None if a is None or b is None or not rounds else (b - a) / rounds


def rise_points(cell: Cell) -> float | None:
    """The trend's rise over the second half of the curve (points): still climbing?"""
    return trend_rise(cell, HALF)


def plateau(cell: Cell | None, label: str) -> Check:
    """The guard that a curve has converged: its least-squares trend over the second half of
    its evaluated rounds rises at most PLATEAU points."""
    rise = None if cell is None else trend_rise(cell, HALF)
    return Check(f"{label}: trend over its second half (points)", rise, "<=", PLATEAU, guard=True)


def learned(cell: Cell | None, result: ExperimentResult, label: str) -> Check:
    """The guard that a method learned: its end level at least LEARNED points above what its
    training started from (a random initialisation: the class prior)."""
    gain = None if cell is None else learned_points(cell, result, WINDOW)
    return Check(f"{label}: learned (points over its start)", gain, ">=", LEARNED, guard=True)


def rising(cell: Cell | None, label: str) -> list[str]:
    """A note when ``cell``'s curve is still climbing at the end (its end level and
    convergence round are then where the run stopped, not where it converges)."""
    rise = None if cell is None else rise_points(cell)
    if rise is None or rise <= PLATEAU:
        return []
    return [
        f"{label} is still rising at the end (its trend climbs {rise:+.1f} points over the "
        "second half of its rounds): its end level and convergence round are not final yet"
    ]


def measure(results: Results) -> Reading:
    if (r := missing(results, [IID.name, ALPHA10.name, ALPHA1.name])) is not None:
        return r
    full = {label: c for e, label in CURVES if (c := fedavg(results, e)) is not None}
    ran, rounds = common(full)
    ends = {label: end_level(c, WINDOW) for label, c in ran.items()}
    conv = {label: convergence_round(c, SHARE, WINDOW, TRAILING) for label, c in ran.items()}
    checks, notes = [], []
    labels = list(ran)
    pairs = list(zip(labels, labels[1:], strict=False))  # alpha falls
    for hi, lo in [*pairs, ("IID", "alpha=1")]:
        whole = (hi, lo) == ("IID", "alpha=1")
        drop = points(ends[hi], ends[lo])
        floor = DECLINE if whole else -TIE
        checks.append(Check(f"end acc {hi} - {lo} (points)", drop, ">=", floor))
        if drop is not None and drop < floor:
            notes.append(f"{lo} ends {pct(ends[lo])}%, {hi} {pct(ends[hi])}%")
        if whole:
            later = rounds_apart(conv[hi], conv[lo])
            checks.append(Check(f"convergence round {lo} - {hi} (rounds)", later, ">", 0.0))
        else:
            later = share_apart(conv[hi], conv[lo], rounds)
            checks.append(
                Check(f"convergence round {lo} - {hi} (share of rounds)", later, ">=", -SLACK)
            )
        if later is not None and later < (0 if whole else -SLACK):
            notes.append(f"{lo} converges at round {conv[lo]}, {hi} at round {conv[hi]}")
    notes += rising(ran.get("alpha=1"), "alpha=1")
    rows = [[label, pct(ends[label]), num(conv[label], "d")] for label in ran]
    tab = table(
        [f"FedAvg, class mixes (first {rounds} rounds)", f"end acc % (last {WINDOW})",
         "convergence round"],
        rows,
    )  # fmt: skip
    return Reading(tuple(checks), tab, "; ".join(notes) + ("." if notes else ""))


def plot(results: Results) -> Figure | None:
    lines = [(e.name, "fedavg-full", label) for e, label in CURVES]
    if not any(e in results for e, _, _ in lines):
        return None
    return plots.accuracy_curves(results, lines, "FedAvg: IID vs Dir(alpha) (seed 002 Fig. 3)")


RULE = (
    "Every curve is read over the rounds all of them ran. A curve's end level is the mean of "
    "its last 5 evaluated rounds; its convergence round is the first round at which its "
    "3-round trailing mean reaches 95% of that end level. Each number below is taken within a "
    "seed and decided by its 95% interval over the seeds. Holds if, going from IID through "
    "alpha = 100, 10 to 1 (those that ran), each step ends no more than 1 point above the "
    "step before it and converges no more than 10% of the rounds earlier (neighbours may be "
    "level), IID ends at least 2 points above alpha = 1, and alpha = 1 converges in more "
    "rounds than IID."
)

CLAIM = Claim(
    id="dirichlet-alpha",
    title="FedAvg's accuracy declines steadily, and its convergence slows, as the class "
    "mixes go from IID to Dir(alpha) with alpha -> 0.",
    source="seed 002 §4.1, Fig. 3",
    paper=(
        '§4.1 "IID and Non-IID comparison": "The results, in Figure 3, show a steady decline '
        "in performance as the α value decreases, also the convergence time increase as long "
        'as α tends to zero." §4: "α is selected with values 1, 10 and 100. Higher value of '
        'α, are for simplicity redirected to the IID case." Fig. 3 is curves only (test '
        "accuracy per round); the text gives no numbers, so fedapt reads the two trends it "
        "names: the curves' end levels fall, and their convergence rounds rise, as alpha falls."
    ),
    experiments=(IID, ALPHA100, ALPHA10, ALPHA1),
    measure=measure,
    rule=RULE,
    tolerance="Seed 002 reports curves only: no numbers, no seeds, no spread. The 1-point and "
    "10%-of-the-rounds slack lets neighbours that the figure would show level (IID and alpha "
    "= 100 are nearly the same mixes) come out in either order; the 2-point decline from IID "
    "to alpha = 1 is about the std of the difference of two 5-round end levels of FedAvg at "
    "alpha = 1 (its round-to-round change has a std of 3-5 points in fedapt's cpu runs, so "
    "3 x sqrt(2/5) = 1.9), so a smaller gap is not a decline one could see in the figure. "
    "The intervals over seeds carry the seed-to-seed spread the figure does not show.",
    thresholds={
        "tie_points": TIE,
        "decline_points": DECLINE,
        "slack_share": SLACK,
        "slower_rounds": 0.0,
        "convergence_share": SHARE,
        "trailing_rounds": TRAILING,
    },
    window=WINDOW,
    plot=plot,
    scaled={
        "gpu": "The seed's protocol (50 clients, 75% per round, E=2, B=64, SGD 0.01/0.9, "
        "LeNet5) on FashionMNIST (CIFAR-10 is not available offline), 100 rounds (the "
        "figure's count is not in the text); IID and alpha = 100, 10, 1.",
        "cpu": "6,000 training images on 10 clients (8 per round; 600 images, 20 local steps "
        "per round at E=2: the seed's clients take about 32), 1,000 test images, 30 rounds "
        "(alpha = 10 runs 40 for the local-epochs claim, read here over its first 30); "
        "10 clients are the fewest at which one class's pool (600) still holds a whole "
        "client's quota, so alpha = 1 can make single-class clients as with 50. IID, alpha = "
        "10 and 1: alpha = 100 (gpu only) mixes nearly as IID does (q_k within about 3 points "
        "of 10% per class), so it would only add a tie.",
        "ci": "Smoke test: 400 images over 4 clients, 3 rounds of 2 steps; IID, alpha = 10, 1.",
    },
    dropped=(
        Dropped(
            "cpu, every curve 30 rounds (alpha = 10 included), the old rule (every check on "
            "every seed, no intervals)",
            "held on all 3 seeds (2026-11-27 records: IID > alpha 10 > alpha 1, alpha 1 "
            "slower); alpha = 1 still rose 5-9 points over its last 15 rounds",
            "alpha = 10 now runs 40 rounds for the local-epochs claim (read here over its "
            "first 30, so this claim's numbers are those of the 30-round design); the rule "
            "is now decided by 95% intervals over the seeds",
        ),
    ),
)
