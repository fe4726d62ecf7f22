"""Claim: residual adapters stay within about one point of full fine-tuning also in the
cross-device setting: 100 clients, 20% sampled per round with replacement, E = 5 local epochs
(seed 000 Table II, FashionMNIST Dir(0.5), and §IV-A2)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tasks.reproduce import plots
from tasks.reproduce.claim_adapters import CI_RESNET, CPU_RESNET, SEED000
from tasks.reproduce.measures import final_accuracy, num, pct, table
from tasks.reproduce.spec import (
    Check,
    Claim,
    Experiment,
    ExperimentResult,
    Reading,
    Results,
    missing,
)

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
# 32x32, a base trained on 20,000 held-out rows of all classes for 3 epochs: a base of classes
# 5-9 alone left residual adapters 8.7 points behind full on Dir(0.5), measured 2026-11-26,
# since frozen 3x3 kernels cannot build the features of classes the base never separated), 30
# rounds with the lr step at round 18 (= 30/50).
CPU_SEED000 = (
    *CPU_RESNET,
    "data.test_subset=1000",
    "federation.rounds=30",
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
LEARNED = 0.30  # guard: full fine-tuning ends at least 30 points above the class prior


def adapter_gaps(result: ExperimentResult, gap: float, learned: float) -> Reading:
    """Per algorithm: full - residual final accuracy (points) at most ``gap``; a guard that
    full fine-tuning learned (``learned`` above the class prior, 10% when unknown). Shared
    by the gaussian-noise claim."""
    cells = result.cells
    prior = result.majority if result.majority is not None else 0.1
    rows, checks, failed = [], [], []
    for alg in sorted({name.split("-", 1)[0] for name in cells}):
        full, res = cells.get(f"{alg}-full"), cells.get(f"{alg}-residual")
        if full is None or res is None:
            continue
        a_full, a_res = final_accuracy(full), final_accuracy(res)
        diff = None if a_full is None or a_res is None else 100 * (a_full - a_res)
        checks += [
            Check(f"{alg}: full acc - class prior (points)",
                  None if a_full is None else 100 * (a_full - prior),
                  None if a_full is None else a_full - prior >= learned,
                  f">= {100 * learned:.0f}", guard=True),
            Check(f"{alg}: full - residual (points)", diff,
                  None if diff is None else diff <= gap, f"<= {gap:g}"),
        ]  # fmt: skip
        rows.append([alg, pct(a_full), pct(a_res), num(diff)])
        if diff is not None and diff > gap:
            failed.append(alg)
    if not rows:
        return Reading(note="no algorithm ran both full and residual")
    note = ""
    if failed:
        note = (
            f"{', '.join(failed)}: the adapters end more than {gap:g} points below full "
            f"fine-tuning; {trend(result)}"
        )
    tab = table(["algorithm", "full acc %", "residual acc %", "full - residual (points)"], rows)
    return Reading(tuple(checks), tab, note)


def trend(result: ExperimentResult, last: int = 5) -> str:
    """What the curves say about a gap: each cell's change over its last ``last`` evaluated
    rounds (still rising: more rounds would narrow or widen it) and its best round."""
    parts = []
    for name, cell in sorted(result.cells.items()):
        accs = [100 * float(r["accuracy"]) for r in cell.rounds if r.get("accuracy") is not None]
        if len(accs) < 2:
            continue
        tail = accs[-min(last, len(accs)) :]
        parts.append(
            f"{name} {tail[-1] - tail[0]:+.1f} points over its last {len(tail)} evaluations "
            f"(best {max(accs):.1f}%)"
        )
    return "; ".join(parts) if parts else "no per-round accuracies to say more"


def measure(results: Results) -> Reading:
    if (r := missing(results, [DIR05.name])) is not None:
        return r
    return adapter_gaps(results[DIR05.name], GAP, LEARNED)


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
    "fine-tuning (a negative gap: the adapters ahead), provided full fine-tuning learned (its "
    "final accuracy at least 30 points above always predicting the most frequent class; "
    "otherwise cannot say).",
    tolerance="Table II's FashionMNIST Dir(0.5) gaps are 1.21-1.31 points with per-cell "
    "standard deviations of 0.32-0.81 over 5 seeds: 2.1 is the largest gap plus the largest "
    "std.",
    plot=plot,
    scaled={
        "gpu": "The seed's cross-device protocol (100 clients, 20 per round with replacement, "
        "E = 5, batch 64, lr 0.1 -> 0.01 at round 30, 50 rounds, FedAvg, FedProx mu 0.01 and "
        "FedNova) on all of FashionMNIST except 10,000 rows that pretrain the frozen base "
        "(ResNet26 ImageNet weights are not available offline; FashionMNIST is the seed's own "
        "dataset here).",
        "cpu": "ResNet26 at width 0.25 and 32x32 on the adapters claim's base (20,000 held-out "
        "rows of all classes, 3 epochs; a base of classes 5-9 alone left residual adapters "
        "8.7 points behind full, measured: frozen kernels cannot build features for classes "
        "the base never separated); 2,400 training images over the 100 clients (10-53 each), batch 8 so that E = 5 "
        "epochs are about 17 local steps per round (the seed's: 40), the protocol's lr 0.1 "
        "-> 0.01 at round 18 of 30, 1,000 test images; FedAvg only (each cell "
        "takes about half of the claim's cpu budget; FedProx and FedNova on the gpu profile). "
        "Kept: the 100 clients, a fifth of them per round drawn with replacement, five local "
        "epochs over few non-IID images.",
        "ci": "Smoke test: width 0.125, 300 images over 10 clients, 2 sampled per round with "
        "replacement, 2 rounds of 2 steps, FedAvg.",
    },
)
