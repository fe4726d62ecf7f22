"""Claim: server-side Adam and Adagrad (FedOpt) train more steadily than FedAvg under
Dir(alpha <= 1) (seed 002 §4.3, Figs. 8-9)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tasks.reproduce import plots
from tasks.reproduce.measures import final_accuracy, num, pct, step_variance, table
from tasks.reproduce.spec import Check, Claim, Experiment, Reading, Results, Tune, missing

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# Seed 002 §4: 50 clients, 75% per round, E=2, B=64, client SGD lr 0.01 momentum 0.9, each
# client's class mix q ~ Dir(alpha p) with alpha = 1 (the most skewed they test), equal
# sizes; §4.3's server optimisers: FedAvg (server lr 1, no momentum), Adagrad (lr 0.001,
# eps 1e-3; LeNet5+BN: lr 0.01, lr decay 0.01), Adam (lr 0.0005, betas 0.9/0.99, eps 1e-3),
# as seed 002 Algorithms 3-4 (fedapt's `form: seed002`). The figures' round count is not in
# the text: 100 rounds assumed. CIFAR-10 is not available offline: FashionMNIST stands in.
_SEED002 = (
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
# cpu: 20 clients (15 a round) of 300 images, 30 rounds: the first cpu run's 50 clients of
# 120 images took 12 minutes a seed for 3 cells (mostly per-client overhead: 37 jobs a round);
# three seeds and the server-lr tuning must fit in about 15. The server lrs are tuned (the
# first run's Adam and Adagrad, at the seed's CIFAR-10 lrs, ended 10 and 5 points below FedAvg
# on FashionMNIST): the best of 0.001 and 0.01 per optimiser on a validation split.
_CPU = (
    "data.train_subset=6000",
    "data.test_subset=1000",
    "partition.num_clients=20",
    "federation.rounds=30",
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
        *_SEED002,
        "model.options.norm=none",
        "grid.algorithm_options.fedadagrad.server_lr=0.001",
    ),
    scale={"cpu": _CPU, "ci": _CI},
    tune={p: Tune(lrs=(0.001, 0.01), key="server_lr") for p in ("ci", "cpu")},
)
LENET5_BN = Experiment(  # Fig. 9: LeNet5 + BatchNorm, Adagrad lr 0.01 with decay 0.01
    "server-opt-lenet5bn",
    protocol=(
        *_SEED002,
        "model.options.norm=batch",
        "grid.algorithm_options.fedadagrad.server_lr=0.01",
        "grid.algorithm_options.fedadagrad.lr_decay=0.01",
    ),
    profiles=("gpu",),
)
OPTIMISERS = ("fedadam", "fedadagrad")


ACC_POINTS = 2.0  # "steadier", not slower: final accuracy at most 2 points below FedAvg's


def measure(results: Results) -> Reading:
    if (r := missing(results, [LENET5.name])) is not None:
        return r
    ran = [e for e in (LENET5, LENET5_BN) if e.name in results]
    rows, checks = [], []
    for exp in ran:
        cells = results[exp.name].cells
        base = cells.get("fedavg-full")
        v_avg = step_variance(base) if base else None
        a_avg = final_accuracy(base) if base else None
        model = exp.name.removeprefix("server-opt-")
        for alg in ("fedavg", *OPTIMISERS):
            c = cells.get(f"{alg}-full")
            if c is None:
                continue
            var, acc = step_variance(c), final_accuracy(c)
            if alg != "fedavg":
                ratio = None if var is None or not v_avg else var / v_avg
                below = None if acc is None or a_avg is None else 100 * (a_avg - acc)
                checks += [
                    Check(f"{model} {alg}: variance / FedAvg's", ratio,
                          None if ratio is None else ratio < 1.0, "< 1"),
                    Check(f"{model} {alg}: final acc below FedAvg (points)", below,
                          None if below is None else below <= ACC_POINTS,
                          f"<= {ACC_POINTS:g}"),
                ]  # fmt: skip
            rows.append(
                [f"{model} {alg}", num(var), num(None if var is None else var**0.5), pct(acc)]
            )
    tab = table(
        [
            "model, server optimiser",
            "var of round-to-round change (pt^2)",
            "its std (points)",
            "final acc %",
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
    title="Server Adam and Adagrad train more steadily than FedAvg under Dir(alpha <= 1).",
    source="seed 002 §4.3, Figs. 8-9",
    paper=(
        '§4.3: "with an adaptive server optimizer, we can reach a more stable convergence '
        'especially in the last rounds" (Fig. 8, LeNet5); Fig. 9 (LeNet5 + BN): "at the end, '
        'the accuracy of the model is much less noisy than the ones using standard FedAVG". '
        "The figures are curves only; the paper gives no variance, so fedapt reports the "
        "round-to-round variance it measures."
    ),
    experiments=(LENET5, LENET5_BN),
    measure=measure,
    rule="Steadiness is the variance of the change in test accuracy from one round to the next "
    'over the second half of the rounds, at least the last 3 (the seed: "more stable '
    'convergence especially in the last rounds"). Holds if FedAdam and FedAdagrad each jump '
    "less than FedAvg and end at most 2 points below FedAvg's final accuracy: an optimiser "
    "whose small server step barely moves the model is steady without learning.",
    tolerance="Seed 002 shows curves only (no variance, no seeds); the 2 points of final "
    "accuracy are about its curves' visible spread at the end of training.",
    plot=plot,
    scaled={
        "gpu": "The seed's protocol on FashionMNIST (CIFAR-10 is not available offline), 100 "
        "rounds (the figures' count is not in the text), LeNet5 (Fig. 8) and LeNet5 + BN "
        "(Fig. 9).",
        "cpu": "LeNet5 only, 6,000 training images over 20 clients (15 a round, 300 images "
        "each, E = 2 of batch 64), 1,000 test images, 30 rounds; the server lr of FedAdam and "
        "FedAdagrad tuned (best of 0.001 and 0.01 on a validation split, seed 0: the first "
        "cpu run's seed lrs left them 10 and 5 points below FedAvg).",
        "ci": "Smoke test: 400 images over 4 clients, 3 rounds of 2 steps.",
    },
)
