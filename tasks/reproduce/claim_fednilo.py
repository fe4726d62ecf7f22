"""Claim: FedNILO reaches FedAvg's 30-round-mean accuracy with at least 30% less traffic
(seed 004 Tables 6.4-6.7: 18-59% savings, mostly above 30%)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from fedcore.commcost import ACC_WINDOW, RoundPoint, first_reach, windowed
from tasks.reproduce import plots
from tasks.reproduce.fednilo_k import configs
from tasks.reproduce.measures import MIB, learned_points, num, param, pct, table, trend_rise
from tasks.reproduce.spec import (
    Check,
    Claim,
    Dropped,
    Experiment,
    Reading,
    Results,
    missing,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# Seed 004 §6.1: CifarCNN (Table 6.1), 100 clients, 10 sampled per round, E=5, B=50, SGD lr
# 0.01 (no momentum given), weight decay 1e-3, lr x 0.998 per round, 2000 rounds, LDA
# Dir(0.3) label by label (heterogeneous tables 6.4-6.5), ACC = mean of the last 30 rounds.
# CIFAR-10/100 cannot be had offline: FashionMNIST stands in, in every profile.
_SEED004 = (
    "data.dataset=fashion_mnist",
    "data.train_subset=null",
    "data.test_subset=null",
    "partition.scheme=dirichlet_classwise",
    "partition.dirichlet_classwise.beta=0.3",
    "partition.num_clients=100",
    "model.name=cifar_cnn",
    "model.base=none",
    "model.input_size=null",
    "federation.rounds=2000",
    "federation.participation=0.1",
    "federation.sampling=without_replacement",
    "federation.eval_every=1",
    "client.optimizer=sgd",
    "client.lr=0.01",
    "client.momentum=0.0",
    "client.weight_decay=0.001",
    "client.local_epochs=5",
    "client.batch_size=50",
    "client.max_steps=null",
    "lr_schedule.kind=exponential",
    "lr_schedule.decay=0.998",
    "grid.adapters=[full]",
    "report.accuracy=mean",
    "report.window=30",
)
# cpu (not yet run; its per-round work is the first cpu design's, whose records give its
# time): 20 clients of 300 images with 5 a round (with 100 clients at 10 a round, clients
# first seen after a freeze still downloaded the frozen layers once, 13-22 MiB a round for
# about 10 rounds against FedAvg's 22.4, which ate most of the saving in a short run), E = 5
# of batch 50 (30 local steps), 30 rounds with the seed's lr schedule compressed into them as
# the fednilo-iid claim does (x 0.874 a round = 0.998^(2000/30): the last round's lr is 2% of
# the first, as at the seed's round 2,000) from lr 0.1, so that FedAvg converges within the
# run as the seed's does long before round 2,000 (the first design's constant-ish lr 0.05
# left FedAvg climbing, and jumping 3-5 points between rounds, to round 60), ACC over a
# 5-round window. K and F are derived from FedAvg's records (the seed's rule, `fednilo_k.kick_off`).
# Time, from the first design's records (FedAvg 33.5 s a round for 3 seeds; FedNILO ~11 s a
# seed-round while all layers train, ~5 s once all but the last are frozen): FedAvg 1,004 s,
# the two configurations about 650 and 760 s at the K/F the rule is expected to give
# (9/1, 13/2): about 40 minutes.
_CPU = (
    "data.train_subset=6000",
    "data.test_subset=1000",
    "partition.num_clients=20",
    "federation.participation=0.25",
    "federation.rounds=30",
    "client.lr=0.1",
    "lr_schedule.decay=0.874",
    "report.window=5",
)
_CI = (
    "data.train_subset=600",
    "data.test_subset=200",
    "partition.num_clients=20",
    "federation.participation=0.25",
    "federation.rounds=3",
    "client.local_epochs=1",
    "report.window=2",
)
THIRD, HALF_ = 1 / 3, 1 / 2
# (K, F) pairs of Tables 6.4-6.7 -> per scaled profile, the share of FedAvg's rounds to its
# target accuracy that K is set to (seed 004 §6.1.4: "K as 1/2, 1/3 of the number of rounds
# needed for the target accuracy"; the tables' first and last pairs, 350 and 500, stand in
# the ratio 1/3 : 1/2 = 0.67, 350/500 = 0.7). gpu runs every pair at the seed's own K and F.
_KF: dict[tuple[int, int], dict[str, float]] = {
    (350, 25): {"cpu": THIRD, "ci": THIRD},
    (350, 50): {},
    (400, 25): {},
    (400, 50): {},
    (450, 50): {},
    (500, 50): {},
    (500, 75): {"cpu": HALF_},
}
FEDAVG = Experiment(
    "fednilo-fedavg",
    protocol=(*_SEED004, "grid.algorithms=[fedavg]"),
    scale={"cpu": _CPU, "ci": _CI},
)
CONFIGS = configs("fednilo", _SEED004, _KF, _CPU, _CI, FEDAVG.name)
NAMES = tuple(e.name for e in CONFIGS)
SAVING = 0.30  # "at least 30% less traffic" (Tables 6.4-6.7 average 24-53%)
STEPS = (2.0, 1.5, 1.0, 0.5, 0.0)  # levels: FedAvg's best ACC minus these points (0.5 grid)
REACH = 2.0  # points: FedNILO's best ACC at most this far below FedAvg's (its lowest level)
PLATEAU = 5.0  # points: FedAvg's least-squares trend over the second half of its rounds
HALF = 0.5
LEARNED = 2.0  # points: FedNILO ends this far above its start (the class prior)
WINDOW = 5  # the learned guard's end level: the mean of the last 5 evaluated rounds


def levels(best_acc: float) -> list[float]:
    """Accuracy levels as in Tables 6.4-6.7: half-point steps up to FedAvg's best ACC (the
    top one last)."""
    top = math.floor(best_acc * 200) / 200  # rounded down to half a point
    return [round(top - s / 100, 4) for s in STEPS if top - s / 100 > 0]


def _top(points: Sequence[RoundPoint]) -> float | None:
    return max((p.accuracy for p in points if p.accuracy is not None), default=None)


def measure(
    results: Results,
    fedavg: str = FEDAVG.name,
    configs: Sequence[str] = NAMES,
    least: float = SAVING,
) -> Reading:
    """The savings of the best of the FedNILO experiments ``configs`` over ``fedavg``'s at
    its ACC levels, ``least`` the least mean saving that holds (the IID claim passes its
    own)."""
    ran = [n for n in configs if n in results]
    if (r := missing(results, [fedavg])) is not None or not ran:
        return r or Reading(note="no FedNILO configuration has finished yet")
    window = int(param(results[fedavg].params, "report.window", ACC_WINDOW))
    avg_cell = results[fedavg].cells["fedavg-full"]
    base = windowed(avg_cell.rounds, window)
    nilo = {n: windowed(results[n].cells["fednilo-full"].rounds, window) for n in ran}
    best = _top(base)
    if best is None:
        return Reading(note="FedAvg has no evaluated round")
    gains = {n: learned_points(results[n].cells["fednilo-full"], results[n], WINDOW) for n in ran}
    known = [g for g in gains.values() if g is not None]
    top_nilo = max((a for n in ran if (a := _top(nilo[n])) is not None), default=None)
    checks = [
        Check(
            "FedAvg: trend over its second half (points)",
            trend_rise(avg_cell, HALF),
            "<=",
            PLATEAU,
            guard=True,
        ),
        Check(
            "FedNILO (best configuration): learned (points over its start)",
            max(known) if known else None,
            ">=",
            LEARNED,
            guard=True,
        ),
        Check(
            "FedNILO's best ACC - FedAvg's (points)",
            None if top_nilo is None else 100 * (top_nilo - best),
            ">=",
            -REACH,
        ),
    ]
    rows, savings = [], []
    for level in levels(best):
        b = first_reach(base, level)
        reach = {n: first_reach(r, level) for n, r in nilo.items()}
        hits = {n: p for n, p in reach.items() if p is not None}
        who = min(hits, key=lambda n: hits[n].cum_bytes) if hits else None
        saving = None
        if b is not None and who is not None:
            saving = 1 - hits[who].cum_bytes / b.cum_bytes
            savings.append(saving)
        rows.append(
            [
                f"{100 * level:.1f}",
                num(b.cum_bytes / MIB if b else None, ".1f"),
                num(hits[who].cum_bytes / MIB if who else None, ".1f"),
                "not reached" if saving is None else f"{100 * saving:.1f}%",
                who.removeprefix(f"{fedavg.removesuffix('fedavg')}") if who else "-",
            ]
        )
    tab = table(["ACC level %", "FedAvg MiB", "FedNILO MiB (best)", "saving", "config"], rows)
    mean = 100 * sum(savings) / len(savings) if savings else None
    checks.append(Check("mean saving (%)", mean, ">=", 100 * least))
    note = ""
    if not savings:
        note = (
            f"FedNILO reached none of FedAvg's accuracy levels: its best ACC (mean of the last "
            f"{window} evaluated rounds) is {pct(top_nilo)}%, below the lowest level."
        )
    return Reading(tuple(checks), tab, note)


def plot(
    results: Results,
    fedavg: str = FEDAVG.name,
    configs: Sequence[str] = NAMES,
) -> Figure | None:
    lines = [(fedavg, "fedavg-full", "FedAvg")]
    lines += [(n, "fednilo-full", n.removeprefix("fednilo-")) for n in configs]
    if not any(name in results for name, _, _ in lines):
        return None
    fig, (a, b) = plots.panels(2)
    plots.accuracy_curves(results, lines, "test accuracy per round", ax=a)
    for exp, cell, label in lines:  # what the verdict compares: ACC against cumulative MiB
        if exp not in results:
            continue
        window = int(param(results[exp].params, "report.window", ACC_WINDOW))
        ev = [
            (p.cum_bytes / MIB, 100 * p.accuracy)
            for p in windowed(results[exp].cells[cell].rounds, window)
            if p.accuracy
        ]
        b.plot([x for x, _ in ev], [y for _, y in ev], label=label)
    b.set_xscale("log")
    b.set(
        xlabel="cumulative MiB transmitted (log)",
        ylabel="ACC: mean of the last rounds (%)",
        title="ACC (seed 004 §6.1.5) vs cumulative MiB",
    )
    b.grid(alpha=0.3, which="both")
    b.legend(fontsize=7)
    return fig


RULE = (
    "ACC is the mean test accuracy of the last `report.window` evaluated rounds (seed 004 "
    "§6.1.5: 30; a scaled profile names its own). Levels: half-point steps from 2 points "
    "below FedAvg's best ACC up to it (as Tables 6.4-6.7). Per seed, the saving at a level is "
    "1 - FedNILO's cumulative traffic to first reach it / FedAvg's, for FedNILO's best "
    "configuration at that level, averaged over the levels both reach; each number is "
    "decided by its 95% interval over the seeds. Holds if the mean saving is at least {least} "
    "and FedNILO's best ACC is at most 2 points below FedAvg's (it reaches FedAvg's levels "
    "at all). FedNILO's K is a share (1/3 or 1/2) of the rounds FedAvg needs to first reach "
    "its top level (the median over the seeds) and F keeps the seed's F/K (seed 004 §6.1.4), "
    "in the scaled profiles. The guards: FedAvg has converged (the least-squares trend "
    "through the second half of its evaluated rounds rises at most 5 points; else its levels "
    "are not yet its own) and FedNILO learned (its best configuration ends at least 2 points "
    "above its start, the class prior)."
)
TOLERANCE = (
    "The guard's old form, FedAvg's ACC rising at most 0.5 points over its last window, sat "
    "under its own noise: a difference of two 10-round means has a per-seed std of about "
    "0.45 x FedAvg's round-to-round scatter (3-5 points at Dir(0.3) in the first 60-round "
    "cpu design: 1.4-2.2 points), so its 95% interval over 3 seeds spans about +-3.5-5.5 "
    "points and no FedAvg, however flat, could pass it. The trend through the second half "
    "averages every round of it, and the design now lets FedAvg settle: with the seed's lr "
    "decay compressed into the run, that half runs at 15% to 2% of the first lr, where the "
    "fednilo-iid claim's FedAvg scattered 0.7-1.4 points about its line (records; its trend "
    "interval over 3 seeds -0.8 to 4.6 points), and a flat FedAvg's interval then lies below "
    "5 points in about 9 cases of 10 (simulated, 15- and 25-round halves), while a FedAvg "
    "still climbing half a point a round (7 points over a 15-round half) does not pass. At the first non-IID design's "
    "scatter (constant-ish lr, 3-5 points) no such guard could pass: its 60-round FedAvg's "
    "interval spans -7.7 to 10.7 points. The 2-point reach is the span of the tables' "
    "levels below FedAvg's best."
)

CLAIM = Claim(
    id="fednilo",
    title="FedNILO needs at least 30% less traffic than FedAvg to reach the same "
    "30-round-mean accuracy.",
    source="seed 004 Tables 6.4-6.7, §6.1.4-6.1.5",
    paper=(
        "Cumulative GB to reach an ACC level (mean accuracy of the last 30 rounds), FedAvg vs "
        "FedNILO's best K/F: Table 6.4 (CIFAR-10 Dir(0.3)) 74.5%: 45.35 vs 24.58 GB (45.8%), "
        "75.5%: 60.13 vs 24.65 GB (59.0%), average 52.57%; Table 6.5 (CIFAR-100 Dir(0.3)) "
        "average 42.43%; Table 6.6 (CIFAR-10 IID) 17.9-28.1%, average 23.9%; Table 6.7 "
        '(CIFAR-100 IID) average 34.87%. §6.2: savings "ranging from 18% up to 59%".'
    ),
    experiments=(FEDAVG, *CONFIGS),
    measure=measure,
    rule=RULE.format(least="30%"),
    tolerance="Seed 004 gives one run per configuration; its average savings per table are "
    "24-53%, so 30% is about the middle of its own range, not its best case. " + TOLERANCE,
    thresholds={
        "saving_percent": 100 * SAVING,
        "reach_points": REACH,
        "plateau_points": PLATEAU,
        "plateau_half": HALF,
        "learned_points": LEARNED,
        "k_share_low": THIRD,
        "k_share_high": HALF_,
    },
    window=WINDOW,
    plot=plot,
    scaled={
        "gpu": "The seed's protocol and the seven K/F pairs of its tables, on FashionMNIST "
        "(60,000 images over 100 Dir(0.3) clients): CIFAR-10 is not available offline.",
        "cpu": "30 rounds instead of 2,000 on 6,000 images over 20 Dir(0.3) clients, 5 per "
        "round (the seed: 100 clients, 10 per round; with so few rounds the one-off download "
        "of frozen layers to clients first seen after a freeze ate most of the saving, "
        "measured), E = 5 of batch 50, the seed's lr schedule compressed into the run (x "
        "0.874 a round: the last round's lr is 2% of the first, as at the seed's round 2,000) "
        "from lr 0.1, so that FedAvg converges within the run, 1,000 test images, ACC over a "
        "5-round window; two configurations, the tables' first and last pairs (350/25, "
        "500/75), with K = 1/3 and 1/2 of the rounds FedAvg needed to reach its top level "
        "(read off its records) and F = K x 25/350, K x 75/500. About 40 minutes for 3 seeds "
        "(from the first design's per-round times). Not yet run: the compressed schedule "
        "follows the fednilo-iid claim's, whose FedAvg converged; at Dir(0.3) it is untried.",
        "ci": "Smoke test: 3 rounds over 20 clients, K and F derived (1 and 1), a 2-round window.",
    },
    dropped=(
        Dropped(
            "cpu, 100 clients with 10 a round, 120 rounds, freezing from round 21",
            "clients first seen after a freeze downloaded the frozen layers once, 13-22 MiB a "
            "round for about 10 rounds against FedAvg's 22.4 (probe), eating most of the "
            "saving; FedAvg still rose when the layers froze",
            "the one-off downloads dominate a short run: 20 clients, 5 a round",
        ),
        Dropped(
            "cpu, 20 clients with 5 a round, 60 rounds, lr 0.05 (x 0.998 a round), K/F 12/1 "
            "and 15/2 fixed before FedAvg ran",
            "cannot say: FedAvg's ACC still rose over its last 10 rounds on some seed; "
            "FedNILO's best ACC 74.8, 73.0, 74.6% reached none of FedAvg's levels (its best "
            "ACC 77.5, 76.5, 77.6%, first reached at rounds 41, 59, 60); 75 minutes",
            "K was fixed before FedAvg's rounds to its level were known (the rule gives "
            "K = 20 and 30 from those records) and the design ran twice the budget",
        ),
    ),
)
