"""Claim: with one label per client (#M = 1) every method collapses, while #M = 3 learns
(seed 000 Table I, FashionMNIST rows; §IV-A3 "For M = 1, we see almost no progress")."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tasks.reproduce import plots
from tasks.reproduce.claim_adapters import CI_RESNET, CPU_RESNET, SEED000
from tasks.reproduce.measures import final_accuracy, num, pct, table
from tasks.reproduce.spec import Check, Claim, Experiment, Reading, Results, missing

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# Seed 000 §IV-A: quantity-based label imbalance starts at lr 0.01 (-> 0.001 at round 30).
_SKEW = (
    *SEED000,
    "partition.scheme=labels_per_client",
    "client.lr=0.01",
    "grid.algorithms=[fedavg,fedprox,fednova]",
)
# cpu: a quarter-width ResNet26 (the claim is about accuracy, not bytes), 2,000 images
_CPU = (
    *CPU_RESNET,
    "model.options.width=0.25",
    "data.train_subset=2000",
    "federation.rounds=15",
    "lr_schedule.milestones=[9]",
)
_CI = (*CI_RESNET, "partition.num_clients=10", "data.train_subset=300")


def _skew(m: int) -> Experiment:
    return Experiment(
        f"label-skew-m{m}",
        protocol=(*_SKEW, f"partition.labels_per_client.m={m}"),
        scale={"cpu": _CPU, "ci": (*_CI, "grid.algorithms=[fedavg]")},
    )


M1, M3 = _skew(1), _skew(3)
COLLAPSED = 0.30  # M = 1 "collapses": at most 30% (Table I: 16.47-20.82%; chance is 10%)
LEARNS = 20.0  # M = 3 "learns": at least 20 points above the same cell at M = 1 (Table I: +47-56)


def measure(results: Results) -> Reading:
    if (r := missing(results, [M1.name, M3.name])) is not None:
        return r
    one, three = results[M1.name].cells, results[M3.name].cells
    rows, checks = [], []
    for cell in sorted(set(one) & set(three)):
        a1, a3 = final_accuracy(one[cell]), final_accuracy(three[cell])
        gain = None if a1 is None or a3 is None else 100 * (a3 - a1)
        checks += [
            Check(f"{cell}: #M=1 acc %", None if a1 is None else 100 * a1,
                  None if a1 is None else a1 <= COLLAPSED, f"<= {100 * COLLAPSED:.0f}"),
            Check(f"{cell}: #M=3 - #M=1 (points)", gain,
                  None if gain is None else gain >= LEARNS, f">= {LEARNS:.0f}"),
        ]  # fmt: skip
        rows.append([cell, pct(a1), pct(a3), num(gain)])
    if not rows:
        return Reading(note="no cell ran under both #M = 1 and #M = 3")
    tab = table(["cell", "#M=1 acc %", "#M=3 acc %", "#M=3 - #M=1 (points)"], rows)
    return Reading(tuple(checks), tab)


def plot(results: Results) -> Figure | None:
    if M1.name not in results and M3.name not in results:
        return None
    fig, axes = plots.panels(2)
    for ax, exp in zip(axes, (M1, M3), strict=True):
        cells = sorted(results[exp.name].cells) if exp.name in results else []
        lines = [(exp.name, c, c) for c in cells]
        plots.accuracy_curves(results, lines, f"#M = {exp.name[-1]}: accuracy per round", ax=ax)
    return fig


CLAIM = Claim(
    id="label-skew",
    title="With #M = 1 label per client every method collapses, while #M = 3 learns.",
    source="seed 000 (000_951abe0eee0db477.txt) Table I, FashionMNIST #M rows, and §IV-A3",
    paper=(
        "Table I (cross-silo), FashionMNIST #M = 1: FedAvg 20.82 / 16.47, FedProx 18.59 / "
        "17.92, FedNova 16.97 / 17.03 (without / with adapters); #M = 3: 72.50 / 70.90, "
        '70.97 / 67.94, 73.43 / 67.31. §IV-A3: "For M = 1, we see almost no progress in the '
        'training of either Adapters or the full model." (The extracted table text misplaces '
        "the dataset labels by one row; these are the rows under the third dataset block.)"
    ),
    experiments=(M1, M3),
    measure=measure,
    rule="Holds if every cell ends at 30% or below with one label per client (#M = 1) and "
    "at least 20 points higher with three (#M = 3).",
    tolerance="Table I's #M = 1 cells end at 16.5-20.8% with standard deviations of 1-4 "
    "points over 5 seeds, so 30% leaves about 10 points (2-3 stds) of room above the seed's "
    "highest cell; its #M = 3 cells are 47-56 points above #M = 1, so 20 is a loose floor.",
    plot=plot,
    scaled={
        "gpu": "The seed's protocol (lr 0.01 -> 0.001 at round 30), base pretrained on 10,000 "
        "held-out rows as in the Dir(0.5) claim.",
        "cpu": "ResNet26 at width 0.25 and 32x32 (this claim is about accuracy, not bytes), "
        "2,000 training images (200 per client: about 4 local steps per round where the seed's "
        "clients take about 94, so less client drift), 15 rounds (lr step at round 9); all "
        "three algorithms, full and residual, since the claim is about every method; one base "
        "pretrained on 6,000 held-out rows serves both #M runs.",
        "ci": "Smoke test: width 0.125, 300 images over 10 clients, 2 rounds of 2 steps, FedAvg.",
    },
)
