"""Claim: server-side Adam and Adagrad (FedOpt) train more steadily than FedAvg under
Dir(alpha <= 1), without ending lower (seed 002 §4.3, Figs. 8-9)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tasks.reproduce import plots
from tasks.reproduce.measures import end_level, learned_points, num, pct, step_variance, table
from tasks.reproduce.spec import (
    Cell,
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

# Seed 002 §4: 50 clients, 75% per round, E=2, B=64, client SGD lr 0.01 momentum 0.9, each
# client's class mix q ~ Dir(alpha p) with alpha = 1 (the most skewed they test), equal
# sizes; §4.3's server optimisers: FedAvg (server lr 1, no momentum), Adagrad (lr 0.001,
# eps 1e-3; LeNet5+BN: lr 0.01, lr decay 0.01), Adam (lr 0.0005, betas 0.9/0.99, eps 1e-3),
# as seed 002 Algorithms 3-4 (fedapt's `form: seed002`). The figures' round count is not in
# the text: 100 rounds assumed. CIFAR-10 is not available offline: FashionMNIST stands in.
SEED002 = (
    "data.dataset=fashion_mnist",
    "data.train_subset=null",
    "data.test_subset=null",
    "partition.scheme=dirichlet_clientwise",
    "partition.dirichlet_clientwise.alpha=1.0",
    "partition.dirichlet_clientwise.sizes=equal",
    "partition.num_clients=50",
    "model.name=lenet5",
    "model.base=none",
    "model.input_size=null",
    "federation.rounds=100",
    "federation.participation=0.75",
    "federation.eval_every=1",
    "client.optimizer=sgd",
    "client.lr=0.01",
    "client.momentum=0.9",
    "client.weight_decay=0.0",
    "client.local_epochs=2",
    "client.batch_size=64",
    "client.max_steps=null",
    "lr_schedule.kind=constant",
    "grid.algorithms=[fedavg,fedadam,fedadagrad]",
    "grid.adapters=[full]",
    "grid.algorithm_options.fedadam.form=seed002",
    "grid.algorithm_options.fedadam.server_lr=0.0005",
    "grid.algorithm_options.fedadam.beta1=0.9",
    "grid.algorithm_options.fedadam.beta2=0.99",
    "grid.algorithm_options.fedadam.tau=0.001",
    "grid.algorithm_options.fedadagrad.form=seed002",
    "grid.algorithm_options.fedadagrad.tau=0.001",
)
# cpu: the seed-002 cpu clients (10, 8 a round at 75%; the fewest at which alpha = 1 can still
# make a client nearly single-class, as the other seed-002 claims' cpu runs) with 300 images
# each: 10 local steps a round at E = 2 (270 rows after the tuning's 10% validation share),
# 36 rounds. The server lrs of FedAdam and FedAdagrad are tuned (the first cpu run's Adam and
# Adagrad, at the seed's CIFAR-10 lrs, ended 10 and 5 points below FedAvg on FashionMNIST):
# the best of 0.001 and 0.01 per optimiser on a validation split, seed 0, all 36 rounds.
# Time: 13 cell-runs of 36 rounds (3 seeds x 3 cells, and 2 tuning runs x 2 optimisers), each
# round 8 clients x 10 LeNet5 steps and 1,000 test images: the records' epochs-e1 (the same
# work a round) took 402 s for 90 seed-rounds, 4.47 s a round, so about 13 x 36 x 4.47 =
# 2,092 s (35 minutes).
_CPU = (
    "data.train_subset=3000",
    "data.test_subset=1000",
    "partition.num_clients=10",
    "federation.rounds=36",
)
_CI = (
    "data.train_subset=400",
    "data.test_subset=100",
    "partition.num_clients=4",
    "federation.rounds=3",
    "client.max_steps=2",
)
LENET5 = Experiment(
    "server-opt-lenet5",
    protocol=(
        *SEED002,
        "model.options.norm=none",
        "grid.algorithm_options.fedadagrad.server_lr=0.001",
    ),
    scale={"cpu": _CPU, "ci": _CI},
    tune={p: Tune(lrs=(0.001, 0.01), key="server_lr") for p in ("ci", "cpu")},
)
LENET5_BN = Experiment(  # Fig. 9: LeNet5 + BatchNorm, Adagrad lr 0.01 with decay 0.01
    "server-opt-lenet5bn",
    protocol=(
        *SEED002,
        "model.options.norm=batch",
        "grid.algorithm_options.fedadagrad.server_lr=0.01",
        "grid.algorithm_options.fedadagrad.lr_decay=0.01",
    ),
    profiles=("gpu",),
)
OPTIMISERS = ("fedadam", "fedadagrad")
WINDOW = 5  # a curve's end level: the mean of its last 5 evaluated rounds
TAIL = 0.5  # steadiness: over the second half of the rounds ("especially in the last rounds")
STEADIER = 0.0  # points: an optimiser's round-to-round std minus FedAvg's lies below this
ACC_POINTS = 2.0  # "steadier", not slower: end level at most 2 points below FedAvg's
LEARNED = 2.0  # points: an optimiser learned when it ends this far above its start


def step_std(cell: Cell | None) -> float | None:
    """The std (points) of the round-to-round change of test accuracy over the second half
    of the rounds (:func:`step_variance`'s square root)."""
    var = None if cell is None else step_variance(cell, TAIL)
    return None if var is None else var**0.5


def _learned(cell: Cell | None, result: ExperimentResult, label: str) -> Check:
    gain = None if cell is None else learned_points(cell, result, WINDOW)
    return Check(f"{label}: learned (points over its start)", gain, ">=", LEARNED, guard=True)


def measure(results: Results) -> Reading:
    if (r := missing(results, [LENET5.name])) is not None:
        return r
    ran = [e for e in (LENET5, LENET5_BN) if e.name in results]
    rows, checks = [], []
    for exp in ran:
        res = results[exp.name]
        base = res.cells.get("fedavg-full")
        s_avg = step_std(base)
        e_avg = None if base is None else end_level(base, WINDOW)
        model = exp.name.removeprefix("server-opt-")
        for alg in ("fedavg", *OPTIMISERS):
            c = res.cells.get(f"{alg}-full")
            s, e = step_std(c), None if c is None else end_level(c, WINDOW)
            if alg != "fedavg":
                steadier = None if s is None or s_avg is None else s - s_avg
                below = None if e is None or e_avg is None else 100 * (e_avg - e)
                checks += [
                    _learned(c, res, f"{model} {alg}"),
                    Check(f"{model} {alg}: round-to-round std - FedAvg's (points)", steadier,
                          "<", STEADIER),
                    Check(f"{model} {alg}: end acc below FedAvg (points)", below, "<=",
                          ACC_POINTS),
                ]  # fmt: skip
            if c is not None:
                rows.append([f"{model} {alg}", num(None if s is None else s**2), num(s), pct(e)])
    tab = table(
        [
            "model, server optimiser",
            "var of round-to-round change (pt^2)",
            "its std (points)",
            f"end acc % (last {WINDOW})",
        ],
        rows,
    )
    return Reading(tuple(checks), tab)


def plot(results: Results) -> Figure | None:
    ran = [e for e in (LENET5, LENET5_BN) if e.name in results]
    if not ran:
        return None
    fig, axes = plots.panels(len(ran))
    for ax, exp in zip(axes, ran, strict=True):
        lines = [(exp.name, f"{a}-full", a) for a in ("fedavg", *OPTIMISERS)]
        plots.accuracy_curves(results, lines, f"{exp.name}: accuracy per round", ax=ax)
    return fig


CLAIM = Claim(
    id="server-opt",
    title="Server Adam and Adagrad train more steadily than FedAvg under Dir(alpha <= 1), "
    "without ending lower.",
    source="seed 002 §4.3, Figs. 8-9",
    paper=(
        '§4.3: "with an adaptive server optimizer, we can reach a more stable convergence '
        'especially in the last rounds" (Fig. 8, LeNet5); Fig. 9 (LeNet5 + BN): "at the end, '
        'the accuracy of the model is much less noisy than the ones using standard FedAVG". '
        "The figures are curves only; the paper gives no variance, so fedapt reports the "
        "round-to-round variation it measures."
    ),
    experiments=(LENET5, LENET5_BN),
    measure=measure,
    rule="Steadiness is the std of the change in test accuracy from one round to the next "
    'over the second half of the rounds, at least the last 3 (the seed: "more stable '
    "convergence especially in the last rounds\"); a curve's end level is the mean of its "
    "last 5 evaluated rounds. Each difference is taken within a seed (the same partition and "
    "client draws) and decided by its 95% interval over the seeds. Holds if FedAdam and "
    "FedAdagrad each jump less than FedAvg (their std minus FedAvg's below 0) and end at "
    "most 2 points below FedAvg's end level: an optimiser whose small server step barely "
    "moves the model is steady without learning. The guard: each optimiser learned (it ends "
    "at least 2 points above its start, the class prior).",
    tolerance="Seed 002 shows curves only (no variance, no seeds); the 2 points of end level "
    "are about its curves' visible spread at the end of training, and about the std of the "
    "difference of two 5-round end levels of FedAvg at alpha = 1 (round-to-round change "
    "std 3-5 points in the cpu runs: 3 x sqrt(2/5) = 1.9). The steadiness check takes any "
    "reduction whose interval lies below 0: the seed names no size.",
    thresholds={
        "steadier_points": STEADIER,
        "below_points": ACC_POINTS,
        "learned_points": LEARNED,
        "tail_share": TAIL,
    },
    window=WINDOW,
    plot=plot,
    scaled={
        "gpu": "The seed's protocol on FashionMNIST (CIFAR-10 is not available offline), 100 "
        "rounds (the figures' count is not in the text), LeNet5 (Fig. 8) and LeNet5 + BN "
        "(Fig. 9).",
        "cpu": "LeNet5 only, 3,000 training images over 10 clients (8 a round, 300 images "
        "each: 270 after the validation share, 10 local steps a round at E = 2 of batch 64), "
        "1,000 test images, 36 rounds; the server lr of FedAdam and FedAdagrad tuned (best of "
        "0.001 and 0.01 on a validation split, seed 0: the first cpu run's seed lrs left them "
        "10 and 5 points below FedAvg). About 35 minutes for 3 seeds with the tuning runs "
        "(13 cell-runs x 36 rounds x 4.47 s, the records' rate for this work a round).",
        "ci": "Smoke test: 400 images over 4 clients, 3 rounds of 2 steps.",
    },
    dropped=(
        Dropped(
            "cpu, 50 clients of 120 images, 30 rounds, the seed's CIFAR-10 server lrs",
            "FedAdam and FedAdagrad ended 10 and 5 points below FedAvg (one seed); 12 "
            "minutes a seed for 3 cells, mostly per-client overhead (37 jobs a round)",
            "the seed's lrs are CIFAR-10's (now tuned on a validation split) and the design "
            "did not fit the budget",
        ),
    ),
)
