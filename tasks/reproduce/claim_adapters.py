"""Claim: residual adapters come within about one point of full fine-tuning under Dir(0.5)
while sending about 1/9 of the bytes per round (seed 000 Table I and §IV-A4)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tasks.reproduce import plots
from tasks.reproduce.measures import (
    end_level,
    evaluated,
    learned_points,
    mib_per_round,
    num,
    pct,
    start_level,
    table,
)
from tasks.reproduce.spec import (
    Check,
    Claim,
    Dropped,
    Experiment,
    ExperimentResult,
    Reading,
    Results,
    Tune,
    missing,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# Seed 000 §IV-A: ResNet26 at 72x72, 10 clients all participating (cross-silo), E=1, B=64,
# SGD momentum 0.9, weight decay 5e-4, 50 rounds; lr 0.1 -> 0.01 at round 30 (Dir, Gau,
# IID) or 0.01 -> 0.001 (#M); FedProx mu 0.01. The base is ImageNet-pretrained in the paper;
# no ResNet26 ImageNet weights exist offline, so fedapt's pretrain stage trains the base on
# FashionMNIST rows the federation never sees (Rebuffi's domain-agnostic base, seed 000 §III),
# of classes 5-9 only: out of domain, as ImageNet is for the seed's tasks (FashionMNIST is the
# only image dataset offline: other classes of it).
SEED000 = (
    "data.dataset=fashion_mnist",
    "data.train_subset=50000",  # the other 10,000 training rows train the base
    "data.test_subset=null",
    "partition.num_clients=10",
    "model.name=resnet26",
    "model.options.width=1.0",
    "model.input_size=72",
    "model.base=pretrain",
    "pretrain.dataset=null",
    "pretrain.classes=[5,6,7,8,9]",
    "pretrain.max_samples=10000",
    "pretrain.epochs=2",
    "federation.rounds=50",
    "federation.participation=1.0",
    "federation.eval_every=1",
    "client.optimizer=sgd",
    "client.momentum=0.9",
    "client.weight_decay=0.0005",
    "client.local_epochs=1",
    "client.batch_size=64",
    "client.max_steps=null",
    "lr_schedule.kind=step",
    "lr_schedule.gamma=0.1",
    "lr_schedule.milestones=[30]",
    "grid.algorithm_options.fedprox.mu=0.01",
    "grid.adapters=[full,residual]",
)
# cpu: a quarter-width ResNet26 at 32x32 (the full one at 72x72 takes about 18 h per Table I
# cell on 2 cores), 10,000 training images (1,000 per client: ~16 local steps per round, E = 1
# at batch 64; the seed's clients take ~78), 16 rounds with the lr step at round 10 (the
# seed's 30/50), evaluated every second round on 2,000 test images (the same evaluation cost
# as every round on 1,000, half the test-sampling variance of a paired gap). The base is
# pretrained out of domain, as the seed's ImageNet base is: 20,000 held-out rows of classes
# 5-9 only, 3 epochs (what sets the adapters' gap is the frozen base: in the 2026-11-25 run
# residual plateaued at its base's quality from round 7 while full kept rising; a probe on
# 2026-11-26 with a base of classes 5-9 left residual 8.7 points behind full, the committed
# 2026-11-27 run on a base of all classes 0.5 points: the dropped designs below). Only
# FashionMNIST is on this machine, so "out of domain" is other classes of it. Bytes are the
# cells' measured ones: at width 0.25 each message's fixed framing (~47 KB over 157 tensors)
# and the BatchNorm parameters, which shrink with the width and not its square, make the
# ratio 1/6.70 (width 0.3: 1/7.29, 0.5: 1/8.09, 1: 1/8.65, as `fedapt models` counts them).
CPU_RESNET = (
    "model.options.width=0.25",
    "model.input_size=32",
    "data.train_subset=10000",
    "data.test_subset=2000",
    "pretrain.classes=[5,6,7,8,9]",
    "pretrain.max_samples=20000",
    "pretrain.epochs=3",
    "federation.rounds=16",
    "federation.eval_every=2",
    "lr_schedule.milestones=[10]",
)
CI_RESNET = (
    "model.options.width=0.125",
    "model.input_size=32",
    "data.train_subset=200",
    "data.test_subset=100",
    "partition.num_clients=4",
    "pretrain.max_samples=200",
    "pretrain.epochs=1",
    "federation.rounds=2",
    "lr_schedule.milestones=[2]",
    "client.max_steps=2",
)

DIR05 = Experiment(
    "adapters-dir05",
    protocol=(
        *SEED000,
        "partition.scheme=dirichlet_classwise",
        "partition.dirichlet_classwise.beta=0.5",
        "client.lr=0.1",
        "grid.algorithms=[fedavg,fedprox,fednova]",
    ),
    scale={
        "cpu": (*CPU_RESNET, "grid.algorithms=[fedavg]"),
        "ci": (*CI_RESNET, "grid.algorithms=[fedavg]"),
    },
    # the smoke test runs the tuning path end to end (the seed fixes one lr for all methods;
    # the cpu and gpu profiles keep it)
    tune={"ci": Tune(lrs=(0.1, 0.01))},
)

# "within about 1 point": Table I's FashionMNIST Dir(0.5) gaps are 1.07-1.17 with per-method
# stds of 0.53-0.64 over 5 seeds, so a gap of one std above the seed's, 1.7, still agrees.
GAP = 1.7
RATIO = (7.0, 11.0)  # "about 1/9": 22.2 MB vs 2.58 MB = 8.6 (seed 000 §IV-A4)
LEARNED = 2.0  # guard: each method ends at least 2 points above its starting model
WINDOW = 4  # cpu: evaluations at rounds 10, 12, 14, 16 (all after the lr step)


def adapter_gaps(
    result: ExperimentResult,
    gap: float,
    window: int,
    ratio: tuple[float, float] | None = None,
) -> Reading:
    """Per algorithm: full - residual end level (points, the mean of the last ``window``
    evaluations of each) at most ``gap``; with ``ratio``, full's measured bytes per round over
    residual's (the cells' records) within it; guards that each method learned (its end level
    at least ``LEARNED`` points above its starting model, ``measures.learned_points``). Shared
    by the cross-device and gaussian-noise claims."""
    cells = result.cells
    start = start_level(result)
    rows, checks, failed = [], [], []
    for alg in sorted({name.split("-", 1)[0] for name in cells}):
        full, res = cells.get(f"{alg}-full"), cells.get(f"{alg}-residual")
        if full is None or res is None:
            continue
        e_full, e_res = end_level(full, window), end_level(res, window)
        diff = None if e_full is None or e_res is None else 100 * (e_full - e_res)
        l_full, l_res = learned_points(full, result, window), learned_points(res, result, window)
        checks += [
            Check(f"{alg}-full: learned (points)", l_full, ">=", LEARNED, guard=True),
            Check(f"{alg}-residual: learned (points)", l_res, ">=", LEARNED, guard=True),
            Check(f"{alg}: full - residual (points)", diff, "<=", gap),
        ]
        row = [alg, pct(start), pct(e_full), pct(e_res), num(diff)]
        if ratio is not None:
            mib_full, mib_res = mib_per_round(full), mib_per_round(res)
            times = mib_full / mib_res if mib_res > 0 else None
            name = f"{alg}: full / residual bytes per round (measured"
            checks += [
                Check(f"{name}, lower end)", times, ">=", ratio[0]),
                Check(f"{name}, upper end)", times, "<=", ratio[1]),
            ]
            row += [
                num(mib_full, ".3f"),
                num(mib_res, ".3f"),
                "-" if times is None else f"1/{times:.2f}",
            ]
        rows.append(row)
        if diff is not None and diff > gap:
            failed.append(alg)
    if not rows:
        return Reading(note="no algorithm ran both full and residual")
    header = ["algorithm", "start %", "full end %", "residual end %", "full - residual (points)"]
    if ratio is not None:
        header += ["full MiB/round", "residual MiB/round", "residual / full"]
    note = ""
    if failed:
        note = (
            f"{', '.join(failed)}: the adapters end more than {gap:g} points below full "
            f"fine-tuning; {trend(result)}"
        )
    return Reading(tuple(checks), table(header, rows), note)


def trend(result: ExperimentResult, last: int = 5) -> str:
    """What the curves say about a gap: each cell's change over its last ``last`` evaluated
    rounds (still rising: more rounds would narrow or widen it) and its best round."""
    parts = []
    for name, cell in sorted(result.cells.items()):
        accs = [100 * a for a in evaluated(cell)]
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
    return adapter_gaps(results[DIR05.name], GAP, WINDOW, RATIO)


def plot(results: Results) -> Figure | None:
    if DIR05.name not in results:
        return None
    cells = sorted(results[DIR05.name].cells)
    fig, (a, b) = plots.panels(2)
    lines = [(DIR05.name, c, c) for c in cells]
    plots.accuracy_curves(results, lines, "Dir(0.5): accuracy per round", ax=a)
    plots.accuracy_vs_mib(results, lines, "Dir(0.5): accuracy vs MiB", ax=b)
    return fig


CLAIM = Claim(
    id="adapters",
    title="Residual adapters come within about 1 point of full fine-tuning under Dir(0.5) "
    "at about 1/9 of the MiB per round.",
    source="seed 000 Table I, FashionMNIST Dir(0.5), and §IV-A4",
    paper=(
        "Table I (cross-silo, 10 clients, ResNet26, mean of 5 seeds), FashionMNIST Dir(0.5): "
        "FedAvg 93.99 ± 0.64 without vs 92.82 ± 0.53 with adapters; FedProx 94.22 vs 93.14; "
        "FedNova 94.19 vs 93.12 (average difference 1.08 ± 0.13). §IV-A4: the full ResNet26 "
        'payload is 22.2 MB, the adapters\' 2.58 MB, "almost a ninth".'
    ),
    experiments=(DIR05,),
    measure=measure,
    rule="Holds if, for every algorithm, residual adapters end at most 1.7 points below full "
    "fine-tuning (end levels: the mean test accuracy of each cell's last 4 evaluations; a "
    "negative gap means the adapters were ahead) and full fine-tuning's measured bytes per "
    "round (upload + download, read from the cells' records) are 7 to 11 times the "
    "adapters', provided each method learned (its end level at least 2 points above its "
    "starting model: the pretrained base's test accuracy when the base was trained on the "
    "federation's own classes, else the class prior), otherwise cannot say.",
    tolerance="The 1.7-point tolerance is the seed's own gap (1.07-1.17 points) plus one of "
    "its per-method standard deviations over 5 seeds (0.53-0.64). The byte range 7-11 brackets "
    "the seed's 22.2 / 2.58 = 8.6 by about a quarter either way; the measured ratio is the same "
    "on every seed (message sizes depend on the tensors' shapes only), so its interval has no "
    "width and the check decides alone. The learned guard's 2 points are about three standard "
    "errors of one evaluation on 2,000 test images (about 0.8 points): a method that moved "
    "less from its start has no gap worth reading.",
    plot=plot,
    thresholds={
        "gap_points": GAP,
        "bytes_ratio_min": RATIO[0],
        "bytes_ratio_max": RATIO[1],
        "learned_points": LEARNED,
    },
    window=WINDOW,
    scaled={
        "gpu": "The seed's protocol on all of FashionMNIST except 10,000 held-out rows, whose "
        "classes 5-9 pretrain the frozen base out of domain (ResNet26 ImageNet weights are "
        "not available offline).",
        "cpu": "ResNet26 at width 0.25 and 32x32 (the full one at 72x72 takes about 18 h per "
        "cell on 2 cores), 10,000 training images (1,000 per client: ~16 local steps per "
        "round), 16 rounds with the lr step at round 10, evaluated every second round on 2,000 "
        "test images, the verdict's last 4 evaluations on the whole test split (10,000), "
        "FedAvg only (FedProx and FedNova are gpu only, for time). The base is pretrained out of domain as the seed's ImageNet base "
        "is: 20,000 held-out rows of classes 5-9 only, 3 epochs (FashionMNIST is the only "
        "image dataset offline: other classes of it). A probe on 2026-11-26 with such a base "
        "left residual 8.7 points behind full, so the gap may well exceed the seed's here. "
        "The byte check reads the cells' measured bytes: at width 0.25 the adapters' "
        "messages carry the same fixed framing as full's (~47 KB over 157 tensors) and "
        "BatchNorm parameters that shrink with the width rather "
        "than its square, so the design sends 1/6.70 of full's bytes, outside 1/7-1/11: this "
        "check does not hold at this scale, by construction. Width 0.5 would send 1/8.09 "
        "(width 1: 1/8.65) but costs 1.5-3.5 times the compute, beyond the claim's 40-minute "
        "budget; the gpu profile measures the seed's full width.",
        "ci": "Smoke test: width 0.125, 200 images over 4 clients, 2 rounds of 2 steps.",
    },
    dropped=(
        Dropped(
            "First cpu run (2026-11-25, one seed): width 0.5, 3,000 training images (~5 local "
            "steps per client a round), a base of 6,000 held-out rows of all classes x 2 "
            "epochs, 20 rounds, FedAvg and FedProx",
            "residual 85.4% against full 88.0% at the final evaluation (2.6 points behind), "
            "residual flat at its base's quality from round 7 while full kept rising",
            "too little training for the base and the clients (the report of that run is in "
            "docs/results/reproduction/)",
        ),
        Dropped(
            "Base of all classes (committed cpu records, 2026-11-27, 3 seeds): 20,000 held-out "
            "rows of classes 0-9 x 3 epochs, 20 rounds, 1,000 test images",
            "full - residual 0.54, 0.30, -0.24 points (end levels over the last 5 "
            "evaluations); full ended 2.8, 2.6, 3.6 points and residual 2.3, 2.3, 3.9 above "
            "their bases (86.9, 87.7, 85.3%); measured bytes 1/6.70",
            "in domain: the base already knew the federation's classes, so it did most of "
            "both methods' work (issue 44: bases out of domain)",
        ),
    ),
)
