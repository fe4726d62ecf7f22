"""Claim: residual adapters stay within about one point of full fine-tuning also in the
cross-device setting: 100 clients, 20% sampled per round with replacement, E = 5 local epochs
(seed 000 Table II, FashionMNIST Dir(0.5), and §IV-A2)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tasks.reproduce import plots
from tasks.reproduce.claim_adapters import (
    CI_RESNET,
    CPU_RESNET,
    LEARNED,
    SEED000,
    adapter_gaps,
)
from tasks.reproduce.spec import Claim, Dropped, Experiment, Reading, Results, missing

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# Seed 000 §III and §IV-A2: "we use random sampling with replacement to pick a fraction f",
# 100 clients, f = 0.2, E = 5 local epochs (tuned from {1, 2, 3, 4, 5, 10}); otherwise the
# cross-silo protocol (Dir(0.5): lr 0.1 -> 0.01 at round 30, FedProx mu 0.01, "0.01 and 0.1
# resulted in similar accuracy" at f = 0.2).
CROSS_DEVICE = (
    *SEED000,
    "partition.num_clients=100",
    "federation.participation=0.2",
    "federation.sampling=with_replacement",
    "client.local_epochs=5",
)
# cpu (shared with the gaussian-noise claim): the adapters claim's cpu ResNet26 (width 0.25 at
# 32x32) and its base pretrained out of domain (20,000 held-out rows of classes 5-9 only, 3
# epochs), 30 rounds with the lr step at round 18 (= 30/50), evaluated every second round on
# 2,000 test images (the same evaluation cost as every round on 1,000): the verdict's window
# of 5 evaluations is rounds 22-30, all after the step.
CPU_SEED000 = (
    *CPU_RESNET,
    "data.test_subset=2000",
    "federation.rounds=30",
    "federation.eval_every=2",
    "lr_schedule.milestones=[18]",
)
# cpu, cross-device: 2,400 images over the 100 clients (24 each on average, 10-53 under
# Dir(0.5)), so each of the 20 clients a round runs E = 5 epochs of batch 8, about 17 local
# steps (the seed's clients: 500 images, 8 batches of 64, 40 steps): the drivers kept are
# many small non-IID clients, a fifth of them per round drawn with replacement, and five
# passes over each client's few images per round. The protocol's lr 0.1 (measured on one seed,
# 2026-11-26: at lr 0.025 the residual adapters stayed 2.3-6.6 points behind full fine-tuning
# over 30 rounds; at 0.1 they close to the seed's gap).
_CPU = (
    *CPU_SEED000,
    "data.train_subset=2400",
    "client.batch_size=8",
    "grid.algorithms=[fedavg]",
)
_CI = (
    *CI_RESNET,
    "partition.num_clients=10",
    "data.train_subset=300",
    "federation.participation=0.2",
    "grid.algorithms=[fedavg]",
)

DIR05 = Experiment(
    "cross-device-dir05",
    protocol=(
        *CROSS_DEVICE,
        "partition.scheme=dirichlet_classwise",
        "partition.dirichlet_classwise.beta=0.5",
        "client.lr=0.1",
        "grid.algorithms=[fedavg,fedprox,fednova]",
    ),
    scale={"cpu": _CPU, "ci": _CI},
)

# Table II, FashionMNIST Dir(0.5): full - adapters = 1.21 (FedAvg), 1.21 (FedProx), 1.31
# (FedNova), with per-cell standard deviations of 0.32-0.81 over 5 seeds: the seed's largest
# gap plus its largest std, 2.1 points, still agrees.
GAP = 2.1
WINDOW = 5  # cpu: evaluations at rounds 22, 24, ..., 30 (all after the lr step)


def measure(results: Results) -> Reading:
    if (r := missing(results, [DIR05.name])) is not None:
        return r
    return adapter_gaps(results[DIR05.name], GAP, WINDOW)


def plot(results: Results) -> Figure | None:
    if DIR05.name not in results:
        return None
    cells = sorted(results[DIR05.name].cells)
    fig, (a, b) = plots.panels(2)
    lines = [(DIR05.name, c, c) for c in cells]
    plots.accuracy_curves(results, lines, "cross-device Dir(0.5): accuracy per round", ax=a)
    plots.accuracy_vs_mib(results, lines, "cross-device Dir(0.5): accuracy vs MiB", ax=b)
    return fig


CLAIM = Claim(
    id="cross-device",
    title="In the cross-device setting (100 clients, 20% per round with replacement, E = 5) "
    "residual adapters still end within about 1-2 points of full fine-tuning under Dir(0.5).",
    source="seed 000 Table II, FashionMNIST Dir(0.5), and §IV-A2",
    paper=(
        "Table II (cross-device: 100 clients, fraction 0.2 per round sampled with replacement, "
        "E = 5 local epochs, ResNet26, mean ± std of 5 seeds), FashionMNIST Dir(0.5): FedAvg "
        "93.40 ± 0.62 without vs 92.19 ± 0.70 with adapters; FedProx 93.43 ± 0.81 vs 92.22 ± "
        "0.51; FedNova 93.44 ± 0.32 vs 92.13 ± 0.44 (average difference 1.24 ± 0.03). §IV-A2: "
        '"We see the same tendencies for cross-device as we did for cross-silo, with the '
        'Adapters performing almost on par with traditional finetuning" (cross-silo, Table '
        "I: 1.08). (The extracted table text misplaces the dataset labels by one row; these "
        "are the Dir(0.5) row of the third dataset block, FashionMNIST.)"
    ),
    experiments=(DIR05,),
    measure=measure,
    rule="Holds if, for every algorithm, residual adapters end at most 2.1 points below full "
    "fine-tuning (end levels: the mean test accuracy of each cell's last 5 evaluations; a "
    "negative gap: the adapters ahead), provided each method learned (its end level at least "
    "2 points above its starting model: the pretrained base's test accuracy when the base was "
    "trained on the federation's own classes, else the class prior), otherwise cannot say.",
    tolerance="Table II's FashionMNIST Dir(0.5) gaps are 1.21-1.31 points with per-cell "
    "standard deviations of 0.32-0.81 over 5 seeds: 2.1 is the largest gap plus the largest "
    "std. The learned guard's 2 points are about three standard errors of one evaluation on "
    "2,000 test images (about 0.8 points); it replaces a guard (full fine-tuning 30 points "
    "above the class prior) that a base of the federation's own classes met alone.",
    plot=plot,
    thresholds={"gap_points": GAP, "learned_points": LEARNED},
    window=WINDOW,
    scaled={
        "gpu": "The seed's cross-device protocol (100 clients, 20 per round with replacement, "
        "E = 5, batch 64, lr 0.1 -> 0.01 at round 30, 50 rounds, FedAvg, FedProx mu 0.01 and "
        "FedNova) on all of FashionMNIST except 10,000 held-out rows, whose classes 5-9 "
        "pretrain the frozen base out of domain (ResNet26 ImageNet weights are not available "
        "offline; FashionMNIST is the seed's own dataset here).",
        "cpu": "ResNet26 at width 0.25 and 32x32 on the adapters claim's base, pretrained out "
        "of domain (20,000 held-out rows of classes 5-9 only, 3 epochs: a base of those "
        "classes left residual adapters 8.7 points behind full in a cross-silo probe, "
        "2026-11-26); 2,400 training images over the 100 clients (10-53 each), batch 8 so "
        "that E = 5 epochs are about 17 local steps per round (the seed's: 40), the protocol's "
        "lr 0.1 -> 0.01 at round 18 of 30, evaluated every second round on 2,000 test images "
        "(the whole test split, 10-20 s per evaluation of 10,000 images here, would add 12-24 "
        "minutes to the claim's ~25-32); FedAvg only (each cell takes about half of the "
        "claim's cpu budget; FedProx and FedNova on the gpu profile). Kept: the 100 clients, "
        "a fifth of them per round drawn with replacement, five local epochs over few non-IID "
        "images.",
        "ci": "Smoke test: width 0.125, 300 images over 10 clients, 2 sampled per round with "
        "replacement, 2 rounds of 2 steps, FedAvg.",
    },
    dropped=(
        Dropped(
            "Client lr 0.025 (a probe on one seed, 2026-11-26)",
            "residual adapters stayed 2.3-6.6 points behind full fine-tuning over 30 rounds",
            "the seed's protocol lr for Dir(0.5) is 0.1 (-> 0.01), which the claim keeps; at "
            "0.1 the adapters closed to the seed's gap",
        ),
        Dropped(
            "Base of all classes (committed cpu records, 2026-11-27, 3 seeds): 20,000 held-out "
            "rows of classes 0-9 x 3 epochs, 1,000 test images every round",
            "full - residual -1.52, -1.96, -2.18 points (end levels over the last 5 "
            "evaluations); full fine-tuning ended -0.2, +1.0, +0.2 points from its base "
            "(89.1, 86.8, 86.9%), residual +1.3, +2.9, +2.4",
            "in domain: full fine-tuning never moved off a base that already knew the "
            "federation's classes, so the gap said nothing about adapting (issue 44)",
        ),
    ),
)
