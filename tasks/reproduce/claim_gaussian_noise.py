"""Claim: under noise-based feature skew, Gau(0.1), residual adapters end within about 1.4
points of full fine-tuning (seed 000 Table I, FashionMNIST Gau(0.1) rows; §V "Adapters perform
on par or close for both quantity-based label imbalance and noise-based feature distribution
skew")."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tasks.reproduce import plots
from tasks.reproduce.claim_adapters import CI_RESNET, LEARNED, SEED000, adapter_gaps
from tasks.reproduce.claim_cross_device import CPU_SEED000, WINDOW
from tasks.reproduce.spec import Claim, Dropped, Experiment, Reading, Results, missing

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# Seed 000 §IV: the IID split, then client C_i gets x^ = x + e, e ~ Gau(sigma * i / N) (mean
# 0, variance sigma * i / N), sigma = 0.1; lr 0.1 -> 0.01 at round 30 as for Dir(0.5); the
# cross-silo protocol (10 clients, all per round, E = 1).
# cpu: the cross-device claim's ResNet26 (width 0.25, 32x32, the adapters claim's base
# pretrained out of domain on classes 5-9, 30 rounds, lr step at 18, every second round
# evaluated on 2,000 test images) on 2,400 training images, 240 per client: batch 12 makes
# E = 1 20 local steps per round (the seed's clients: 5,000 images, 79 steps); the protocol's
# lr 0.1, as the cross-device claim. The same data and base as the cross-device claim
# (`fedapt reproduce` trains it once).
_CPU = (
    *CPU_SEED000,
    "data.train_subset=2400",
    "client.batch_size=12",
    "grid.algorithms=[fedavg]",
)
GAU = Experiment(
    "gaussian-noise",
    protocol=(
        *SEED000,
        "partition.scheme=gaussian_noise",
        "partition.gaussian_noise.sigma=0.1",
        "client.lr=0.1",
        "grid.algorithms=[fedavg,fedprox,fednova]",
    ),
    scale={"cpu": _CPU, "ci": (*CI_RESNET, "grid.algorithms=[fedavg]")},
)

# Table I, FashionMNIST Gau(0.1): full - adapters = 1.38 (FedAvg), 1.34 (FedProx), 1.30
# (FedNova), per-cell stds 0.06-0.28 over 5 seeds: the largest gap plus the largest std.
GAP = 1.7


def measure(results: Results) -> Reading:
    if (r := missing(results, [GAU.name])) is not None:
        return r
    return adapter_gaps(results[GAU.name], GAP, WINDOW)


def plot(results: Results) -> Figure | None:
    if GAU.name not in results:
        return None
    cells = sorted(results[GAU.name].cells)
    fig, (a, b) = plots.panels(2)
    lines = [(GAU.name, c, c) for c in cells]
    plots.accuracy_curves(results, lines, "Gau(0.1): accuracy per round", ax=a)
    plots.accuracy_vs_mib(results, lines, "Gau(0.1): accuracy vs MiB", ax=b)
    return fig


CLAIM = Claim(
    id="gaussian-noise",
    title="Under noise-based feature skew, Gau(0.1), residual adapters end within about 1.4 "
    "points of full fine-tuning.",
    source="seed 000 Table I, FashionMNIST Gau(0.1), §IV and §V",
    paper=(
        "Table I (cross-silo, 10 clients, ResNet26, mean ± std of 5 seeds), FashionMNIST "
        "Gau(0.1): FedAvg 94.90 ± 0.12 without vs 93.52 ± 0.27 with adapters; FedProx 94.90 ± "
        "0.13 vs 93.56 ± 0.28; FedNova 94.82 ± 0.07 vs 93.52 ± 0.06 (average difference 1.34). "
        '§V: "Adapters perform on par or close for both quantity-based label imbalance and '
        "noise-based feature distribution skew.\" §IV: client C_i's images get noise "
        "Gau(sigma * i / N), variance sigma * i / N, sigma = 0.1. (The extracted table text "
        "misplaces the dataset labels by one row; these are the last row of the third dataset "
        "block, FashionMNIST.)"
    ),
    experiments=(GAU,),
    measure=measure,
    rule="Holds if, for every algorithm, residual adapters end at most 1.7 points below full "
    "fine-tuning under Gau(0.1) (end levels: the mean test accuracy of each cell's last 5 "
    "evaluations; a negative gap: the adapters ahead), provided each method learned (its end "
    "level at least 2 points above its starting model: the pretrained base's test accuracy "
    "when the base was trained on the federation's own classes, else the class prior), "
    "otherwise cannot say.",
    tolerance="Table I's FashionMNIST Gau(0.1) gaps are 1.30-1.38 points with per-cell "
    "standard deviations of 0.06-0.28 over 5 seeds: 1.7 is the largest gap plus the largest "
    "std (the adapters claim's tolerance under Dir(0.5) is the same 1.7). The learned guard's "
    "2 points are about three standard errors of one evaluation on 2,000 test images (about "
    "0.8 points); it replaces a guard (full fine-tuning 30 points above the class prior) that "
    "a base of the federation's own classes met alone.",
    plot=plot,
    thresholds={"gap_points": GAP, "learned_points": LEARNED},
    window=WINDOW,
    scaled={
        "gpu": "The seed's cross-silo protocol under Gau(0.1) (10 clients, all per round, E = "
        "1, batch 64, lr 0.1 -> 0.01 at round 30, 50 rounds, FedAvg, FedProx mu 0.01, "
        "FedNova) on all of FashionMNIST except 10,000 held-out rows, whose classes 5-9 "
        "pretrain the frozen base out of domain.",
        "cpu": "ResNet26 at width 0.25 and 32x32, the base of the adapters and cross-device "
        "claims, pretrained out of domain (20,000 held-out rows of classes 5-9 only, 3 "
        "epochs), 2,400 training images (240 per client), batch 12 so that E = 1 is 20 local "
        "steps per round (the seed's: 79), the protocol's lr 0.1 -> 0.01 at round 18 of 30, "
        "evaluated every second round on 2,000 test images, the verdict's last evaluations on "
        "the whole test split (10,000); FedAvg only, for time. Kept: the per-client noise variance sigma * i / N on the "
        "training images, the IID split, full participation.",
        "ci": "Smoke test: width 0.125, 200 images over 4 clients, 2 rounds of 2 steps, FedAvg.",
    },
    dropped=(
        Dropped(
            "Base of all classes (committed cpu records, 2026-11-27, 3 seeds): 20,000 held-out "
            "rows of classes 0-9 x 3 epochs, 1,000 test images every round",
            "full - residual -0.98, -0.74, -1.16 points (end levels over the last 5 "
            "evaluations); full fine-tuning ended -0.4, +2.2, +0.2 points from its base "
            "(89.1, 86.8, 86.9%), residual +0.6, +3.0, +1.4",
            "in domain: full fine-tuning barely moved off a base that already knew the "
            "federation's classes, so the gap said nothing about adapting (issue 44)",
        ),
    ),
)
