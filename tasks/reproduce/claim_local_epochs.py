"""Claim: more local epochs E make FedAvg converge in fewer rounds, while every E ends at
the same accuracy (seed 002 §4.1, Fig. 2)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tasks.reproduce import plots
from tasks.reproduce.claim_dirichlet_alpha import (
    ALPHA10,
    CI,
    CPU,
    FEDAVG002,
    HALF,
    PLATEAU,
    TRAILING,
    WINDOW,
    fedavg,
    plateau,
    rise_points,
    rounds_apart,
)
from tasks.reproduce.measures import end_level, num, pct, rounds_to, table
from tasks.reproduce.spec import Check, Claim, Dropped, Experiment, Reading, Results, missing

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# Fig. 2's E values are not in the text: it chose E=2 as one of "the two best" and rejected a
# higher E for its "excessive updating time", so it ran E=2, at least one E above it and
# (for a trend) one below: E = 1, 2, 4. Nor is its alpha: the runs "aim at finding a setting
# for the next FedAVG tasks". fedapt runs them at alpha = 10, where FedAvg's curves flatten
# within the cpu budget (at alpha = 1 they still climbed 0.3-0.6 points a round at round 30
# and jumped 3-5 points between rounds, so no affordable run shows where they converge); the
# E=2 curve is the dirichlet-alpha claim's FedAvg at alpha = 10 (equal sizes, E=2).
_PARTITION = (
    "partition.scheme=dirichlet_clientwise",
    "partition.dirichlet_clientwise.alpha=10",
)
# cpu: every E gets the same local work, 80 epochs of its 600 images per client (800 local
# steps): E=1 80 rounds, E=2 40, E=4 20. Where the claim holds, E=4 converges within fewer
# rounds than E=2 and E=2 within fewer than E=1, so each curve has the second half of its run
# to show its plateau (the guard) at a third of the cost of running all three for 80 rounds.
EPOCHS = 80


def _epochs(e: int) -> Experiment:
    return Experiment(
        f"epochs-e{e}",
        protocol=(*FEDAVG002, *_PARTITION, f"client.local_epochs={e}"),
        scale={"cpu": (*CPU, f"federation.rounds={EPOCHS // e}"), "ci": CI},
    )


E1, E4 = _epochs(1), _epochs(4)
CURVES = ((E1, "E=1"), (ALPHA10, "E=2"), (E4, "E=4"))
SAME = 3.0  # points: "all models converge to the same accuracy": end levels this close
SHARE = 0.95  # the level whose rounds are compared: 95% of the lowest end level


def measure(results: Results) -> Reading:
    if (r := missing(results, [E1.name, ALPHA10.name, E4.name])) is not None:
        return r
    cells = {label: fedavg(results, e) for e, label in CURVES}
    ends = {k: None if c is None else end_level(c, WINDOW) for k, c in cells.items()}
    # "all models converge to the same accuracy": the convergence time is the rounds each E
    # takes to reach it, read as 95% of the lowest end level (which every curve reaches)
    known = [v for v in ends.values() if v is not None]
    level = SHARE * min(known) if len(known) == len(ends) else None
    conv = {
        k: None if c is None or level is None else rounds_to(c, level, TRAILING)
        for k, c in cells.items()
    }
    # "converge to the same accuracy" speaks of converged curves: each E must have reached
    # its plateau (the guards), else its end level and convergence round are not final yet
    checks = [plateau(cells[k], k) for k in cells]
    notes = []
    for lo, hi, side in (("E=1", "E=2", ">"), ("E=2", "E=4", ">=")):
        fewer = rounds_apart(conv[hi], conv[lo])  # rounds E=lo needs beyond E=hi
        checks.append(Check(f"convergence round {lo} - {hi} (rounds)", fewer, side, 0.0))
        if fewer is not None and not checks[-1].ok:
            notes.append(f"{hi} converges at round {conv[hi]}, {lo} at round {conv[lo]}")
    for other in ("E=1", "E=4"):
        a, b = ends[other], ends["E=2"]
        gap = None if a is None or b is None else abs(100 * (a - b))
        checks.append(Check(f"abs(end acc {other} - E=2) (points)", gap, "<=", SAME))
        if gap is not None and gap > SAME:
            notes.append(f"{other} ends {pct(a)}%, E=2 {pct(b)}%")
    rises = {k: None if c is None else rise_points(c) for k, c in cells.items()}
    notes += [
        f"{k} is still rising at the end ({v:+.1f} points over the second half of its "
        "rounds): not converged in the rounds run"
        for k, v in rises.items()
        if v is not None and v > PLATEAU
    ]
    rows = [[k, pct(ends[k]), num(conv[k], "d"), num(rises[k], "+.2f")] for k in ends]
    tab = table(
        [
            "FedAvg, alpha = 10",
            f"end acc % (last {WINDOW})",
            "convergence round",
            "trend over the second half (points)",
        ],
        rows,
    )
    if level is not None:
        tab += (
            f"\n\nConvergence round: the first round at {100 * level:.2f}% or more (3-round mean)."
        )
    return Reading(tuple(checks), tab, "; ".join(notes) + ("." if notes else ""))


def plot(results: Results) -> Figure | None:
    lines = [(e.name, "fedavg-full", label) for e, label in CURVES]
    if not any(e in results for e, _, _ in lines):
        return None
    return plots.accuracy_curves(
        results, lines, "FedAvg, alpha = 10: local epochs (seed 002 Fig. 2)"
    )


CLAIM = Claim(
    id="local-epochs",
    title="More local epochs make FedAvg converge in fewer rounds; every E ends at the same "
    "accuracy.",
    source="seed 002 §4.1, Fig. 2",
    paper=(
        '§4.1 "Preliminary Federated Parameter Tuning": "The general accuracy does not undergo '
        "variations, all models converge to the same accuracy. The convergence time of the "
        "model decreases as the number of epochs grows. The two best performances are mostly "
        "similar and, due to the excessive updating time for higher local epochs, E=2 is used "
        'for all the next experiments." Fig. 2 is curves only and the text names neither the '
        "E values nor alpha; fedapt reads the two statements: the curves' end levels agree, "
        "and their convergence rounds fall as E grows."
    ),
    experiments=(E1, E4),
    reads=(ALPHA10.name,),
    measure=measure,
    rule="A curve's end level is the mean of its last 5 evaluated rounds; its convergence "
    "round is the first round at which its 3-round trailing mean reaches 95% of the lowest "
    "end level of the three (the accuracy they all converge to, by the claim). Each number is "
    "taken within a seed and decided by its 95% interval over the seeds. Holds if E=2 "
    'converges in fewer rounds than E=1, E=4 in no more rounds than E=2 ("the two best '
    'performances are mostly similar"), and the end levels of E=1 and of E=4 each lie within '
    "3 points of E=2's. The guards: every E has converged, the least-squares trend through "
    "the second half of its evaluated rounds rising at most 5 points (else 'cannot say': the "
    "runs were too short to show where the curves converge).",
    tolerance="Seed 002 reports curves only: no numbers, no seeds, no spread. 3 points is "
    "about the round-to-round jumps of FedAvg at alpha = 10 (the std of its round-to-round "
    "change was 2.0-2.8 points over rounds 16-30 of the 30-round cpu runs): curves whose end "
    "levels differ by less cannot be told apart on such a figure. The plateau guard's 5 "
    "points replace a 2-point rise of a 5-round mean over the 5 before, which sat under its "
    "own noise (its std was about 1.9 points per seed, and its 95% interval over 3 seeds "
    "spans about +-4.7): on a flat curve with the residual noise of the alpha = 10 runs "
    "(1.3-1.8 points about a line), the trend over 10-40 rounds has a per-seed std of about "
    "1-1.8 points, and a flat curve's interval over 3 seeds lies below 5 points in 7 to 10 "
    "cases of 10 (simulated; 7 for E=4's 10-round half at the noisiest), while the 30-round runs' second halves, still climbing 3.8-7.1 "
    "points at alpha = 10 and 5-9 at alpha = 1, do not pass.",
    thresholds={
        "plateau_points": PLATEAU,
        "plateau_half": HALF,
        "same_points": SAME,
        "convergence_share": SHARE,
        "trailing_rounds": TRAILING,
        "fewer_rounds": 0.0,
    },
    window=WINDOW,
    plot=plot,
    scaled={
        "gpu": "The seed's protocol (50 clients, 75% per round, B=64, SGD 0.01/0.9, LeNet5, "
        "equal sizes) at alpha = 10 on FashionMNIST (CIFAR-10 is not available offline), "
        "100 rounds (not in the text); E = 1, 2, 4 (the text names none: E=2 and a higher "
        "E were its two best; nor does it name the alpha of Fig. 2).",
        "cpu": "As the dirichlet-alpha claim (6,000 images on 10 clients, 8 per round, 600 "
        "images each, so E = 1, 2, 4 are 10, 20 and 40 local steps per round; the seed's "
        "clients: about 16 per epoch) at alpha = 10, each E for 80 local epochs: E=1 80 "
        "rounds, E=2 40 (the dirichlet-alpha claim's alpha = 10 run), E=4 20. About 40 "
        "minutes for 3 seeds at the records' rates (E=1 402 s and E=4 1,446 s per 30 rounds, "
        "alpha = 10 1,016 s): 1,073 + 964 s, and 339 s for alpha = 10's 10 rounds beyond "
        "the dirichlet-alpha claim's 30.",
        "ci": "Smoke test: 400 images over 4 clients, 3 rounds of 2 steps (E changes nothing "
        "at 2 steps).",
    },
    dropped=(
        Dropped(
            "cpu at alpha = 1, every E 30 rounds (E=2: the alpha = 1 run)",
            "cannot say on every seed: some E still rising over its last 5 rounds (E=1 "
            "ended 56-65%, E=4 69-77%; their trends still climbed 2.6-17 points over rounds "
            "16-30, with round-to-round jumps of 3-5 points)",
            "at alpha = 1 no run within the 40-minute budget (E=1 + E=4 cost about 20 s a "
            "round a seed) flattens, and its jumps are larger than any plateau guard that 3 "
            "seeds can certify",
        ),
    ),
)
