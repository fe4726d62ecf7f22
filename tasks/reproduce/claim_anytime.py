"""Claim: in anytime FL (an exit drawn per local step) the Accumulator is at least as
accurate as layer-wise linear heads at every exit (seed 001 Table 2)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tasks.reproduce import plots
from tasks.reproduce.measures import num, pct, table
from tasks.reproduce.spec import Check, Claim, Experiment, Reading, Results, Tune, missing

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# Seed 001 §5.1 and Appendix A: FedAvg, SGD lr 5e-3 (no momentum given), batch 10, 1 local
# epoch, 100 clients with 10% per round, LDA Dir(1.0) (Table 2's "Non-IID (1.0)"), anytime:
# an exit drawn uniformly per local iteration, 1500 rounds, cosine lr schedule (fedapt has
# none: constant). DeiT-small and CIFAR-100 are not available offline: the pretrained
# MiniLM (6 blocks, so 6 exits) on tweet sentiment stands in.
_SEED001 = (
    "data.dataset=tweet_sentiment",
    "data.train_subset=null",
    "data.test_subset=null",
    "partition.scheme=dirichlet_classwise",
    "partition.dirichlet_classwise.beta=1.0",
    "partition.num_clients=100",
    "model.name=minilm",
    "model.base=none",
    "model.input_size=null",
    "federation.rounds=1500",
    "federation.participation=0.1",
    "federation.eval_every=1",
    "client.optimizer=sgd",
    "client.lr=0.005",
    "client.momentum=0.0",
    "client.weight_decay=0.0",
    "client.local_epochs=1",
    "client.batch_size=10",
    "client.max_steps=null",
    "lr_schedule.kind=constant",
    "grid.algorithms=[fedavg]",
    "grid.adapters=[lw_linear,accumulator]",
    "grid.adapter_options.lw_linear.exits=anytime",
    "grid.adapter_options.accumulator.exits=anytime",
)
# cpu (provisional: speeds measured on 2026-11-26 under load, not yet run): MiniLM is a
# mean-pooling model whose CLS token was never trained as a summary, and seed 001's ablation
# says the link to a well-trained CLS drives most of the Accumulator's gain; so the cpu
# profile uses a small ViT (timm's, 128 wide, 6 blocks, 14-pixel patches on 28x28
# FashionMNIST) whose CLS token is trained in the pretrain stage on 10,000 held-out rows, then
# the seed's anytime protocol: 100 Dir(1.0) clients, 10 a round, batch 10, one local epoch
# (3,000 images: 3 steps), 60 rounds; each method's lr tuned on a validation split (the
# seed's 5e-3 and 10x; the first cpu run tuned it on the linear heads alone).
VIT = (
    "data.dataset=fashion_mnist",
    "model.name=vit_small",
    "model.options.embed_dim=128",
    "model.options.depth=6",
    "model.options.patch_size=14",
    "model.input_size=28",
    "model.base=pretrain",
    "pretrain.dataset=null",
    "pretrain.classes=null",
    "pretrain.max_samples=10000",
    "pretrain.epochs=4",
)
EXITS = Experiment(
    "anytime-exits",
    protocol=_SEED001,
    scale={
        "cpu": (
            *VIT,
            "data.train_subset=3000",
            "data.test_subset=1000",
            "federation.rounds=60",
            "federation.eval_every=5",
        ),
        "ci": (
            "data.train_subset=40",
            "data.test_subset=30",
            "partition.num_clients=4",
            "federation.participation=0.5",
            "federation.rounds=2",
            "client.max_steps=2",
        ),
    },
    tune={"cpu": Tune(lrs=(0.005, 0.05))},
)
TOLERANCE = 0.5  # points: "at least as accurate", up to half a point of test noise
LEARNED = 2.0  # points above the majority-class share at some exit: the exits learned at all
RULE = (
    "Holds if at the last evaluation the Accumulator is at least as accurate as the "
    "layer-wise linear heads, within half a point, at every exit. The guard: some exit of "
    "either method is at least 2 points above always predicting the most frequent training "
    "class (else nothing was learned to compare)."
)
TOLERANCE_TEXT = (
    "Seed 001's Table 2 stds are 1.3-1.8 points against gaps of 23-40 points, so the claim "
    "is about the direction; half a point absorbs test-set noise when the two are level."
)


def measure(
    results: Results,
    experiment: str = EXITS.name,
    linear: str = "fedavg-lw_linear",
    accumulator: str = "fedavg-accumulator",
) -> Reading:
    """The comparison at every exit, for ``experiment``'s cells ``linear`` and ``accumulator``
    (the "+ PA" claim passes its own)."""
    if (r := missing(results, [experiment])) is not None:
        return r
    cells = results[experiment].cells
    if linear not in cells or accumulator not in cells:
        return Reading(note=f"{experiment} has no cells {linear} and {accumulator}")
    lw = list(cells[linear].record.get("final_accuracy_exits") or [])
    acc = list(cells[accumulator].record.get("final_accuracy_exits") or [])
    if not lw or len(lw) != len(acc):
        return Reading(note="the cells have no per-exit accuracies to compare")
    diffs = [100 * (a - b) for a, b in zip(acc, lw, strict=True)]
    rows = [
        [str(k + 1), pct(b), pct(a), num(d)]
        for k, (a, b, d) in enumerate(zip(acc, lw, diffs, strict=True))
    ]
    rows.append(
        ["mean", pct(sum(lw) / len(lw)), pct(sum(acc) / len(acc)), num(sum(diffs) / len(diffs))]
    )
    tab = table(["exit (block)", "L.W. linear %", "Accumulator %", "difference (points)"], rows)
    checks = []
    prior = results[experiment].majority
    if prior is not None:
        above = 100 * (max(lw + acc) - prior)
        checks.append(
            Check("best exit above the class prior (points)", above, above >= LEARNED,
                  f">= {LEARNED:g}", guard=True)
        )  # fmt: skip
    checks += [
        Check(f"exit {k + 1}: Accumulator - linear (points)", d, d >= -TOLERANCE,
              f">= -{TOLERANCE:g}")
        for k, d in enumerate(diffs)
    ]  # fmt: skip
    behind = [str(k + 1) for k, d in enumerate(diffs) if d < -TOLERANCE]
    note = ""
    if behind:
        note = (
            f"The linear heads lead by more than {TOLERANCE:g} points at exit(s) "
            f"{', '.join(behind)}; the mean over exits differs by {sum(diffs) / len(diffs):+.2f} "
            "points. The likely cause, not tested here: the training budget (the scaled design "
            "gives each method ~1/400 of the seed's SGD steps; the Accumulator has more to "
            "learn than a linear head, the mixing of the CLS history, and seed 001's gaps come "
            "after the whole budget)."
        )
    return Reading(tuple(checks), tab, note)


def plot(
    results: Results,
    experiment: str = EXITS.name,
    linear: str = "fedavg-lw_linear",
    accumulator: str = "fedavg-accumulator",
) -> Figure | None:
    if experiment not in results:
        return None
    cells = results[experiment].cells
    if linear not in cells or accumulator not in cells:
        return None
    lw = cells[linear].record.get("final_accuracy_exits") or []
    acc = cells[accumulator].record.get("final_accuracy_exits") or []
    n = max(len(lw), len(acc))
    fig, (a, b) = plots.panels(2)
    plots.bars(
        [str(k + 1) for k in range(n)],
        [("L.W. linear", [100 * x for x in lw]), ("Accumulator", [100 * x for x in acc])],
        "accuracy at each exit (last evaluation)",
        "test accuracy (%)",
        ax=a,
    )
    lines = [
        (experiment, linear, "L.W. linear (last exit)"),
        (experiment, accumulator, "Accumulator (last exit)"),
    ]
    plots.accuracy_curves(results, lines, "accuracy per round", ax=b)
    return fig


CLAIM = Claim(
    id="anytime",
    title="In anytime FL the Accumulator is at least as accurate as layer-wise linear heads "
    "at every exit.",
    source="seed 001 Table 2, Fig. 3 (top), Appendix A",
    paper=(
        "Table 2 (anytime FL, mean over the 12 exits of DeiT-small): CIFAR-100 Non-IID (1.0) "
        "L.W. Linear 36.06 ± 1.35 vs Accumulator 63.02 ± 1.79; IID 36.42 vs 64.28; Non-IID "
        "(0.1) 34.00 vs 57.34; FEMNIST non-IID 35.49 vs 75.12. Fig. 3 (top) shows the "
        "Accumulator above the linear heads at every exit."
    ),
    experiments=(EXITS,),
    measure=measure,
    rule=RULE,
    tolerance=TOLERANCE_TEXT,
    plot=plot,
    scaled={
        "gpu": "The seed's protocol (1,500 rounds, 100 Dir(1.0) clients, 10% per round, SGD "
        "5e-3, batch 10) on MiniLM (6 exits) and all training tweets: DeiT-small and CIFAR-100 "
        "are not available offline; a constant lr instead of the cosine schedule.",
        "cpu": "A small ViT (128 wide, 6 blocks, 14-pixel patches, 28x28 FashionMNIST) whose "
        "CLS token is trained in the pretrain stage on 10,000 held-out rows (4 epochs), "
        "instead of MiniLM, a mean-pooling model whose CLS was never trained as a summary "
        "(seed 001's ablation: the link to a well-trained CLS drives most of the gain; the "
        "first cpu run on MiniLM left the Accumulator at the class prior). Then the seed's "
        "protocol: 100 Dir(1.0) clients, 10 a round, batch 10, one local epoch on 3,000 "
        "images (3 steps), 60 rounds (1,800 SGD steps per method against the seed's ~750,000), "
        "1,000 test images every 5 rounds; each method's lr the best of 5e-3 (the seed's) and "
        "5e-2 on a validation split.",
        "ci": "Smoke test: 40 tweets over 4 clients, 2 rounds of 2 steps.",
    },
)
