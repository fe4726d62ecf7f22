"""Claim: FedNILO reaches FedAvg's 30-round-mean accuracy with at least 30% less traffic
(seed 004 Tables 6.4-6.7: 18-59% savings, mostly above 30%)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from fedcore.commcost import RoundPoint, first_reach, windowed
from tasks.reproduce import plots
from tasks.reproduce.measures import MIB, num, param, pct, table
from tasks.reproduce.spec import Check, Claim, Experiment, Reading, Results, missing

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
# cpu (provisional: designed from probes under load on 2026-11-26, not yet run quiet): the
# first cpu run froze layers at round 21 of 120 while FedAvg still rose, and with 100 clients
# at 10 per round each client first seen after a freeze still downloaded the frozen layers
# once (13-22 MiB a round for about 10 rounds against FedAvg's 22.4), which ate most of the
# saving in so short a run. So: 20 clients with 5 per round (the one-off downloads are done
# within a few rounds), 6,000 images (300 per client, E = 5 of batch 50 = 30 local steps),
# lr 0.05 (FedAvg at the seed's 0.01 without momentum did not plateau within budget), 60
# rounds, ACC over a 10-round window; K and F by seed 004's rule (K about 1/3-1/2 of the
# rounds FedAvg needs to reach its level: about 25-30 here), the tables' two F/K ratios.
_CPU = (
    "data.train_subset=6000",
    "data.test_subset=1000",
    "partition.num_clients=20",
    "federation.participation=0.25",
    "federation.rounds=60",
    "client.lr=0.05",
    "report.window=10",
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
# (K, F) pairs of Tables 6.4-6.7 -> (K, F, comm budget in CR) per profile
_KF = {
    (350, 25): {"cpu": (12, 1, 60), "ci": (1, 1, 1000)},
    (350, 50): {},
    (400, 25): {},
    (400, 50): {},
    (450, 50): {},
    (500, 50): {},
    (500, 75): {"cpu": (15, 2, 60)},
}


def configs(
    prefix: str,
    protocol: tuple[str, ...],
    pairs: dict[tuple[int, int], dict[str, tuple[int, int, int]]],
    cpu: tuple[str, ...],
    ci: tuple[str, ...],
) -> tuple[Experiment, ...]:
    """One FedNILO experiment ``<prefix>-k<K>f<F>`` per (K, F) pair of the seed's tables, with
    the (K, F, comm budget in CR) each scaled profile runs it at (``pairs``; gpu: all, the
    seed's own K and F, budget 1000 CR)."""

    def opts(K: int, F: int, cr: float) -> tuple[str, ...]:
        o = "grid.algorithm_options.fednilo"
        return (f"{o}.K={K}", f"{o}.F={F}", f"{o}.comm_budget_cr={cr}")

    out = []
    for (k, f), scaled in pairs.items():
        scale = {
            p: (*base, *opts(*scaled[p])) for p, base in (("cpu", cpu), ("ci", ci)) if p in scaled
        }
        out.append(
            Experiment(
                f"{prefix}-k{k}f{f}",
                protocol=(*protocol, "grid.algorithms=[fednilo]", *opts(k, f, 1000)),
                scale=scale,
                profiles=("gpu", *scaled),
            )
        )
    return tuple(out)


FEDAVG = Experiment(
    "fednilo-fedavg",
    protocol=(*_SEED004, "grid.algorithms=[fedavg]"),
    scale={"cpu": _CPU, "ci": _CI},
)
CONFIGS = configs("fednilo", _SEED004, _KF, _CPU, _CI)
NAMES = tuple(e.name for e in CONFIGS)
SAVING = 0.30  # "at least 30% less traffic" (Tables 6.4-6.7 average 24-53%)
STEPS = (2.0, 1.5, 1.0, 0.5, 0.0)  # levels: FedAvg's best ACC minus these points (0.5 grid)


PLATEAU_POINTS = 0.5  # "cannot say" while FedAvg's ACC still rises by more over its last
# `report.window` rounds (30, the seed's ACC window): its levels are not its own yet


def plateau_rise(points: Sequence[RoundPoint], rounds: int) -> float | None:
    """FedAvg's ACC at its last evaluated round minus its ACC ``rounds`` rounds earlier
    (points); None when the run is shorter."""
    ev = [p for p in points if p.accuracy is not None]
    if not ev:
        return None
    last = ev[-1]
    earlier = [p for p in ev if p.round <= last.round - rounds]
    return None if not earlier else 100 * (last.accuracy - earlier[-1].accuracy)


def levels(best_acc: float) -> list[float]:
    """Accuracy levels as in Tables 6.4-6.7: half-point steps up to FedAvg's best ACC."""
    top = math.floor(best_acc * 200) / 200  # rounded down to half a point
    return [round(top - s / 100, 4) for s in STEPS if top - s / 100 > 0]


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
    window = int(param(results[fedavg].params, "report.window", 30))
    base = windowed(results[fedavg].cells["fedavg-full"].rounds, window)
    nilo = {n: windowed(results[n].cells["fednilo-full"].rounds, window) for n in ran}
    best = max((p.accuracy for p in base if p.accuracy is not None), default=None)
    if best is None:
        return Reading(note="FedAvg has no evaluated round")
    rise = plateau_rise(base, window)
    plateau = Check(
        f"FedAvg's ACC rise over its last {window} rounds (points)",
        rise,
        None if rise is None else rise <= PLATEAU_POINTS,
        f"<= {PLATEAU_POINTS:g}",
        guard=True,
    )
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
                who.removeprefix("fednilo-") if who else "-",
            ]
        )
    tab = table(["ACC level %", "FedAvg MiB", "FedNILO MiB (best)", "saving", "config"], rows)
    if not savings:
        top = max((p.accuracy for r in nilo.values() for p in r if p.accuracy), default=None)
        note = (
            f"FedNILO reached none of FedAvg's accuracy levels: its best ACC (mean of the last "
            f"{window} evaluated rounds) is {pct(top)}%, below the lowest level."
        )
        return Reading(
            (plateau, Check("mean saving (%)", None, False, f">= {100 * least:.0f}")), tab, note
        )
    mean = sum(savings) / len(savings)
    check = Check("mean saving (%)", 100 * mean, mean >= least, f">= {100 * least:.0f}")
    return Reading((plateau, check), tab)


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
        window = int(param(results[exp].params, "report.window", 30))
        ev = [p for p in windowed(results[exp].cells[cell].rounds, window) if p.accuracy]
        b.plot([p.cum_bytes / MIB for p in ev], [100 * p.accuracy for p in ev], label=label)
    b.set_xscale("log")
    b.set(
        xlabel="cumulative MiB transmitted (log)",
        ylabel="ACC: mean of the last rounds (%)",
        title="ACC (seed 004 §6.1.5) vs cumulative MiB",
    )
    b.grid(alpha=0.3, which="both")
    b.legend(fontsize=7)
    return fig


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
    rule="ACC is the mean test accuracy of the last 30 evaluated rounds (seed 004 §6.1.5). "
    "Levels: half-point steps up to FedAvg's best ACC (as Tables 6.4-6.7). Holds if, over the "
    "levels both reach, FedNILO's best configuration saves on average at least 30% of "
    "FedAvg's cumulative traffic. The guard: FedAvg's ACC rose at most half a point over its "
    "last 30 rounds (else its levels are not yet its own and the comparison is premature).",
    tolerance="Seed 004 gives one run per configuration; its average savings per table are "
    "24-53%, so 30% is about the middle of its own range, not its best case.",
    plot=plot,
    scaled={
        "gpu": "The seed's protocol and the seven K/F pairs of its tables, on FashionMNIST "
        "(60,000 images over 100 Dir(0.3) clients): CIFAR-10 is not available offline.",
        "cpu": "60 rounds instead of 2,000 on 6,000 images over 20 Dir(0.3) clients, 5 per "
        "round (the seed: 100 clients, 10 per round; with so few rounds the one-off download "
        "of frozen layers to clients first seen after a freeze ate most of the saving, "
        "measured), E = 5 of batch 50, lr 0.05 (at the seed's 0.01 FedAvg had not plateaued "
        "within the budget), 1,000 test images, ACC over a 10-round window, K/F 12/1 and "
        "15/2 (seed 004's rule: K about 1/3-1/2 of the rounds FedAvg needs to reach its "
        "level; the F/K ratios of the tables' first and last pairs, 350/25 and 500/75), comm "
        "budget 60 CR. Provisional: designed from probes on a loaded machine; the guard says "
        '"cannot say" if FedAvg still rises over its last 10 rounds.',
        "ci": "Smoke test: 3 rounds over 20 clients, K=1, F=1, a 2-round window.",
    },
)
