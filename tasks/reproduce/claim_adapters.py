"""Claim: residual adapters come within about one point of full fine-tuning under Dir(0.5)
while sending about 1/9 of the bytes per round (seed 000 Table I and §IV-A4)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tasks.reproduce import plots
from tasks.reproduce.measures import final_accuracy, mib_per_round, num, pct, table
from tasks.reproduce.spec import Check, Claim, Experiment, Reading, Results, Tune, missing

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# Seed 000 §IV-A: ResNet26 at 72x72, 10 clients all participating (cross-silo), E=1, B=64,
# SGD momentum 0.9, weight decay 5e-4, 50 rounds; lr 0.1 -> 0.01 at round 30 (Dir, Gau,
# IID) or 0.01 -> 0.001 (#M); FedProx mu 0.01. The base is ImageNet-pretrained in the paper;
# no ResNet26 ImageNet weights exist offline, so fedapt's pretrain stage trains the base on
# FashionMNIST rows the federation never sees (Rebuffi's domain-agnostic base, seed 000 §III).
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
    "pretrain.classes=null",
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
# cell on 2 cores). What sets the adapters' gap is the frozen base (the 2026-11-25 run: residual
# plateaued at its base's quality from round 7 while full kept rising; a base of classes 5-9
# alone left residual 8.7 points behind, measured 2026-11-26): so a longer-trained base on all
# classes, 20,000 held-out rows x 3 epochs, and ~16 local steps per round (1,000 images per
# client, E = 1 at batch 64: the seed's clients take ~78), 20 rounds, lr step at round 12. The
# byte ratio is the seed's claim about the full-width model: it is counted there (at width 0.25
# each message's fixed framing makes the measured ratio 1/6.7).
CPU_RESNET = (
    "model.options.width=0.25",
    "model.input_size=32",
    "data.train_subset=10000",
    "data.test_subset=1000",
    "pretrain.max_samples=20000",
    "pretrain.epochs=3",
    "federation.rounds=20",
    "lr_schedule.milestones=[12]",
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


def measure(results: Results) -> Reading:
    if (r := missing(results, [DIR05.name])) is not None:
        return r
    cells = results[DIR05.name].cells
    rows, checks = [], []
    for alg in sorted({name.split("-", 1)[0] for name in cells}):
        full, res = cells.get(f"{alg}-full"), cells.get(f"{alg}-residual")
        if full is None or res is None:
            continue
        a_full, a_res = final_accuracy(full), final_accuracy(res)
        gap = None if a_full is None or a_res is None else 100 * (a_full - a_res)
        ratio = mib_per_round(full) / mib_per_round(res)
        checks.append(
            Check(f"{alg}: full - residual (points)", gap, None if gap is None else gap <= GAP,
                  f"<= {GAP:g}")
        )  # fmt: skip
        rows.append(
            [
                alg,
                pct(a_full),
                pct(a_res),
                num(gap),
                num(mib_per_round(full)),
                num(mib_per_round(res)),
                f"1/{ratio:.2f}",
            ]
        )
    if not rows:
        return Reading(note="no algorithm ran both full and residual")
    width = float(results[DIR05.name].params.get("model.options.width", 1.0))
    if width != 1.0:  # the seed's ratio is about the full-width model: count it there
        ratio, where = full_width_ratio(), "full width, counted as `fedapt models` counts it"
    else:
        ratio, where = mib_per_round(full) / mib_per_round(res), "measured"
    ok = RATIO[0] <= ratio <= RATIO[1]
    checks.append(
        Check(f"full / residual bytes ({where})", ratio, ok, f"{RATIO[0]:g} to {RATIO[1]:g}")
    )
    tab = table(
        [
            "algorithm",
            "full acc %",
            "residual acc %",
            "gap (points)",
            "full MiB/round",
            "residual MiB/round",
            "residual / full",
        ],
        rows,
    )
    return Reading(tuple(checks), tab)


def full_width_ratio() -> float:
    """Full fine-tuning's payload over residual adapters' for the seed's ResNet26 (width 1,
    72x72, one channel, 10 classes), from the parameters each method sends (what
    ``fedapt models -m resnet26 --input-shape 1,72,72`` prints), without training."""
    import copy

    from models import get_model
    from models.adapters import adapt, get_adapter

    plain = get_model("resnet26", num_classes=10, in_channels=1, input_size=72)
    sent = {
        name: get_adapter(name).counts(adapt(copy.deepcopy(plain), name)).payload_bytes
        for name in ("full", "residual")
    }
    return sent["full"] / sent["residual"]


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
    "fine-tuning and send 1/7 to 1/11 of its bytes per round. A negative gap means the "
    "adapters were ahead.",
    tolerance="The 1.7-point tolerance is the seed's own gap (1.07-1.17 points) plus one of "
    "its per-method standard deviations over 5 seeds (0.53-0.64); the byte ratio is "
    "deterministic.",
    plot=plot,
    scaled={
        "gpu": "The seed's protocol on all of FashionMNIST except 10,000 rows that pretrain "
        "the frozen base (ResNet26 ImageNet weights are not available offline).",
        "cpu": "ResNet26 at width 0.25 and 32x32 (the full one at 72x72 takes about 18 h per "
        "cell on 2 cores), 10,000 training images (1,000 per client: ~16 local steps per "
        "round) and 1,000 test images, 20 rounds with the lr step at round 12, FedAvg only "
        "(FedProx and FedNova are gpu only, for time). The gap is set by the frozen base, so it "
        "is trained longer than in the first cpu run: 20,000 held-out rows of all classes for 3 "
        "epochs (a base of classes 5-9 alone left residual 8.7 points behind, measured). The "
        "byte ratio is checked on the full-width model, counted as `fedapt models` counts it "
        "(at width 0.25 each message's fixed framing makes the measured ratio 1/6.7).",
        "ci": "Smoke test: width 0.125, 200 images over 4 clients, 2 rounds of 2 steps.",
    },
)
