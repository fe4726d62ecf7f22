"""Claim: with one label per client (#M = 1) every method collapses, while #M = 3 learns
(seed 000 Table I, FashionMNIST rows; §IV-A3 "For M = 1, we see almost no progress")."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tasks.reproduce import plots
from tasks.reproduce.claim_adapters import CI_RESNET, CPU_RESNET, SEED000
from tasks.reproduce.measures import end_level, learned_points, num, pct, table
from tasks.reproduce.spec import Check, Claim, Dropped, Experiment, Reading, Results, missing

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# Seed 000 §IV-A: quantity-based label imbalance starts at lr 0.01 (-> 0.001 at round 30).
_SKEW = (
    *SEED000,
    "partition.scheme=labels_per_client",
    "client.lr=0.01",
    "grid.algorithms=[fedavg,fedprox,fednova]",
)
# cpu: what drives the collapse is a model whose features do not already separate the classes
# (measured 2026-11-26: a base pretrained on held-out FashionMNIST, all classes or only 5-9,
# keeps #M = 1 at 46-79%: FedAvg's averaged head acts as a class-mean classifier on features
# that separate the classes) and enough local steps per round for one-class clients to drift
# (20 of 64, the seed's ~94). So the cpu profile trains from a random init (the seed's
# ImageNet base does not know FashionMNIST; a random one knows nothing: the nearest offline
# stand-in for "not these classes' features"), FedAvg with full fine-tuning only (frozen random
# 3x3 kernels under residual adapters would test a random-feature model, not the claim);
# 5,000 images (500 per client), 6 rounds of 3 local epochs capped at 20 steps, lr step at 4,
# every round evaluated on the whole test split (10,000 images).
_CPU = (
    *CPU_RESNET,
    "model.options.width=0.25",
    "model.base=none",
    "data.train_subset=5000",
    "data.test_subset=null",
    "federation.rounds=6",
    "federation.eval_every=1",
    "lr_schedule.milestones=[4]",
    "client.local_epochs=3",
    "client.max_steps=20",
    "grid.algorithms=[fedavg]",
    "grid.adapters=[full]",
)
_CI = (*CI_RESNET, "partition.num_clients=10", "data.train_subset=300")


def _skew(m: int) -> Experiment:
    return Experiment(
        f"label-skew-m{m}",
        protocol=(*_SKEW, f"partition.labels_per_client.m={m}"),
        scale={"cpu": _CPU, "ci": (*_CI, "grid.algorithms=[fedavg]")},
    )


M1, M3 = _skew(1), _skew(3)
COLLAPSED = 30.0  # #M = 1 "collapses": at most 30% (Table I: 16.47-20.82%; chance is 10%)
LEARNS = 20.0  # #M = 3 "learns": at least 20 points above the same cell at #M = 1 (+47-56)
LEARNED = 2.0  # guard: #M = 3 ends at least 2 points above its starting model
WINDOW = 3  # cpu: the last 3 of 6 rounds, all after the lr step at round 4


def measure(results: Results) -> Reading:
    if (r := missing(results, [M1.name, M3.name])) is not None:
        return r
    one, three = results[M1.name].cells, results[M3.name].cells
    rows, checks = [], []
    for cell in sorted(set(one) & set(three)):
        a1, a3 = end_level(one[cell], WINDOW), end_level(three[cell], WINDOW)
        gain = None if a1 is None or a3 is None else 100 * (a3 - a1)
        learned = learned_points(three[cell], results[M3.name], WINDOW)
        checks += [
            Check(f"{cell}: #M=3 learned (points)", learned, ">=", LEARNED, guard=True),
            Check(f"{cell}: #M=1 end %", None if a1 is None else 100 * a1, "<=", COLLAPSED),
            Check(f"{cell}: #M=3 - #M=1 (points)", gain, ">=", LEARNS),
        ]
        rows.append([cell, pct(a1), pct(a3), num(gain), num(learned)])
    if not rows:
        return Reading(note="no cell ran under both #M = 1 and #M = 3")
    tab = table(
        ["cell", "#M=1 end %", "#M=3 end %", "#M=3 - #M=1 (points)", "#M=3 learned (points)"],
        rows,
    )
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
    source="seed 000 Table I, FashionMNIST #M rows, and §IV-A3",
    paper=(
        "Table I (cross-silo), FashionMNIST #M = 1: FedAvg 20.82 / 16.47, FedProx 18.59 / "
        "17.92, FedNova 16.97 / 17.03 (without / with adapters); #M = 3: 72.50 / 70.90, "
        '70.97 / 67.94, 73.43 / 67.31. §IV-A3: "For M = 1, we see almost no progress in the '
        'training of either Adapters or the full model." (The extracted table text misplaces '
        "the dataset labels by one row; these are the rows under the third dataset block.)"
    ),
    experiments=(M1, M3),
    measure=measure,
    rule="Holds if every cell ends at 30% or below with one label per client (#M = 1) and at "
    "least 20 points higher with three (#M = 3) (end levels: the mean test accuracy of each "
    "cell's last 3 evaluations), provided #M = 3 learned (its end level at least 2 points "
    "above its starting model: the class prior from a random initialisation, the pretrained "
    "base's test accuracy from a base of the federation's own classes), otherwise cannot say.",
    tolerance="Table I's #M = 1 cells end at 16.5-20.8% with standard deviations of 1-4 "
    "points over 5 seeds, so 30% leaves about 10 points (2-3 stds) of room above the seed's "
    "highest cell; its #M = 3 cells are 47-56 points above #M = 1, so 20 is a loose floor. "
    "The cpu design's random initialisation meets neither by itself: #M = 3 must end 20 "
    "points above #M = 1, and #M = 1 above 30% fails the rule (as it did from pretrained "
    "bases, the dropped designs). The guard's 2 "
    "points are about four standard errors of one evaluation on 10,000 test images (0.5 "
    "points): it tells a federation that learned nothing at all, whatever #M, from a collapse.",
    plot=plot,
    thresholds={"collapsed_percent": COLLAPSED, "gain_points": LEARNS, "learned_points": LEARNED},
    window=WINDOW,
    scaled={
        "gpu": "The seed's protocol (lr 0.01 -> 0.001 at round 30), base pretrained on the "
        "classes 5-9 of 10,000 held-out rows as in the Dir(0.5) claim. Measured on cpu, such a base (it knows the "
        "classes, where the seed's ImageNet base did not) keeps #M = 1 far above the "
        'collapse: expect "does not hold" for that reason; the cpu profile\'s random init is '
        "the design that keeps the driver.",
        "cpu": "ResNet26 at width 0.25 and 32x32 from a random init, FedAvg with full "
        "fine-tuning only, 5,000 training images (500 per client), 6 rounds of 3 local epochs "
        "capped at 20 steps of 64 (lr 0.01, x0.1 at round 4), every round evaluated on the "
        "whole test split (10,000 images). What drives the collapse is kept: features that do "
        "not separate the classes and enough local steps for one-class clients to drift. A "
        "base pretrained on held-out FashionMNIST (all classes, or only classes 5-9) cannot "
        "collapse (the dropped designs), while from a random init #M = 1 sat at 8-9% and "
        "#M = 3 reached 40% by round 3 (2026-11-26). FedProx, FedNova and residual adapters "
        "are gpu only (each pair of cells is another 4-5 minutes per seed here; frozen random "
        "kernels under adapters would test a random-feature model).",
        "ci": "Smoke test: width 0.125, 300 images over 10 clients, 2 rounds of 2 steps, FedAvg.",
    },
    dropped=(
        Dropped(
            "Base pretrained on held-out FashionMNIST rows of all classes (the first cpu run, "
            "2026-11-25, one seed; FedAvg, FedProx, FedNova x full, residual)",
            "#M = 1 ended at 72.6-75.2% in every cell, #M = 3 only 6.0-9.7 points higher",
            "a base that already separates the classes keeps #M = 1 from collapsing (FedAvg's "
            "averaged head acts as a class-mean classifier on its features); the seed's "
            "ImageNet base did not know FashionMNIST",
        ),
        Dropped(
            "Base pretrained on held-out rows of classes 5-9 only (a probe, 2026-11-26), 20 or "
            "60 local steps per round",
            "#M = 1 stayed at 46-48%",
            "as above: the base's features separate the classes well enough for #M = 1 to "
            "learn; a random initialisation is the nearest offline stand-in for a base that "
            "does not know these classes",
        ),
    ),
)
