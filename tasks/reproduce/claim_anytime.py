"""Claim: in anytime FL (an exit drawn per local step) the Accumulator is at least as
accurate as layer-wise linear heads at every exit (seed 001 Table 2)."""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING

from tasks.reproduce import plots
from tasks.reproduce.measures import learned_points, num, pct, start_level, table
from tasks.reproduce.spec import (
    Cell,
    Check,
    Claim,
    Dropped,
    Experiment,
    Reading,
    Results,
    Tune,
    missing,
)

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
# cpu: MiniLM is a mean-pooling model whose CLS token was never trained as a summary (its
# first cpu run left every exit of both methods at the class prior), so the cpu profile uses
# a small ViT (timm's, 128 wide, 6 blocks, 14-pixel patches on 28x28 FashionMNIST) whose CLS
# token is trained in the pretrain stage on 10,000 held-out rows, then the seed's anytime
# protocol: 100 Dir(1.0) clients, 10 a round, batch 10, one local epoch (3,000 images: 3
# steps); each method's lr tuned on a validation split (the seed's 5e-3 and 10x).
# The base is pretrained out of domain, on classes 5-9 only (sandal, shirt, sneaker, bag,
# ankle boot): with a base pretrained on all ten classes (the records of 2026-11-27) the
# linear heads were already at 67-75% at exit 1 and 76-80% at the others, against the base's
# own 78.8%: the task was read linearly at every depth, so the run lacked the weak early
# exits where seed 001's Accumulator gains (the headroom guard below measures that).
VIT = (
    "data.dataset=fashion_mnist",
    "model.name=vit_small",
    "model.options.embed_dim=128",
    "model.options.depth=6",
    "model.options.patch_size=14",
    "model.input_size=28",
    "model.base=pretrain",
    "pretrain.dataset=null",
    "pretrain.classes=[5,6,7,8,9]",
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
            "federation.rounds=150",
            "federation.eval_every=3",
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
# The cpu design as it ran on 2026-11-27 (records of code e870b3e4ebd8), before the base
# moved out of domain: the sensitivity row of every Accumulator claim.
IN_DOMAIN = Dropped(
    design="base pretrained on all ten FashionMNIST classes (10,000 held-out rows, 4 epochs), "
    "60 rounds, 1,000 test images every 5 rounds",
    measured="base 78.4-79.2%; the linear heads at 67.6-75.4% (exit 1) and 75.7-80.2% (exits "
    "2-6) at the last evaluation. Read by this rule (means of the last 10 evaluations): "
    "headroom 0.21, 0.92, 2.28 points over seeds 0-2 (+ PA: 0.98, 1.98, 2.51), each "
    "method's last exit 0.2-4.2 points below the base",
    why="the linear exits were saturated and neither method ended above the base: the run "
    "could not test the claim's driver (the old rule read 'does not hold' by half a point)",
)
MINILM = Dropped(
    design="MiniLM on 3,000 tweets (the gpu design's model), 60 rounds at lr 0.05 chosen on a "
    "linear-heads-only run, 500 test tweets every 5 rounds (2026-11-25, one seed)",
    measured="every exit of both methods at or below the class prior (42.4%) at the last "
    "evaluation; about 15 s a round on 2 cores",
    why="nothing was learned to compare (MiniLM is mean-pooled: its CLS token was never "
    "trained as a summary, unlike DeiT's and the cpu ViT's)",
)
WINDOW = 10  # evaluations behind every verdict metric (cpu: the last 30 of 150 rounds)
TOLERANCE = 2.0  # points: "at least as accurate", one of seed 001's per-method stds (1.3-1.8)
LEARNED = 2.0  # points each method's last exit ends above its starting model
HEADROOM = 5.0  # points the linear heads' last exit ends above their mean over exits
THRESHOLDS = {"tolerance": TOLERANCE, "learned": LEARNED, "headroom": HEADROOM}
RULE = (
    "Every accuracy is a cell's mean over its last 10 evaluations; differences are taken "
    "within a seed. Holds if at every exit the Accumulator minus the layer-wise linear heads "
    "is at least -2 points (at least as accurate, within one of seed 001's stds). Guards: "
    "each method's last exit ends at least 2 points above its starting model (the pretrained "
    "base's own test accuracy; the class prior without a base), and the linear heads' last "
    "exit ends at least 5 points above their mean over exits (headroom: the early exits are "
    "not already read as well linearly as the last, else the run lacks the weak early exits "
    "where seed 001's Accumulator gains, and 'at least as accurate' would hold vacuously)."
)
TOLERANCE_TEXT = (
    "Seed 001's Table 2 stds are 1.3-1.8 points per method against gaps of 23-40 points, so "
    "the claim is about the direction: 2 points (about one such std) count as level, and the "
    "seed-to-seed spread of each paired difference is the interval's (a 10-evaluation mean "
    "instead of one evaluation, whose linear heads swung by up to 20 points between "
    "evaluations in the cpu records). The headroom guard measures the driver: in seed 001 the "
    "linear heads' mean over the 12 exits (36.06%, Table 2) lies about 38 points below a "
    "linear head at the last exit (73.85%, Table 1); 5 points (2.5 tolerances) is a floor far "
    "under that and above the 0.2-2.5 points of the cpu records with an in-domain base."
)


def exit_levels(cell: Cell, window: int) -> list[float]:
    """Per exit, the mean test accuracy (fraction) of its last ``window`` evaluations (the
    rounds' ``test_accuracy_exit_<k>``); empty when the rounds carry no per-exit accuracy."""
    out = []
    for k in range(64):
        key = f"test_accuracy_exit_{k}"
        accs = [float(r["extra"][key]) for r in cell.rounds if key in (r.get("extra") or {})]
        if not accs:
            break
        out.append(statistics.fmean(accs[-window:]))
    return out


def measure(
    results: Results,
    experiment: str = EXITS.name,
    linear: str = "fedavg-lw_linear",
    accumulator: str = "fedavg-accumulator",
    window: int = WINDOW,
) -> Reading:
    """The comparison at every exit, for ``experiment``'s cells ``linear`` and ``accumulator``
    (the "+ PA" and multi-tier claims pass their own)."""
    if (r := missing(results, [experiment])) is not None:
        return r
    result = results[experiment]
    cells = result.cells
    if linear not in cells or accumulator not in cells:
        return Reading(note=f"{experiment} has no cells {linear} and {accumulator}")
    lw = exit_levels(cells[linear], window)
    acc = exit_levels(cells[accumulator], window)
    if not lw or len(lw) != len(acc):
        return Reading(note="the cells have no per-exit accuracies per round to compare")
    diffs = [100 * (a - b) for a, b in zip(acc, lw, strict=True)]
    headroom = 100 * (lw[-1] - statistics.fmean(lw))
    learned = {
        "L.W. linear": learned_points(cells[linear], result, window),
        "Accumulator": learned_points(cells[accumulator], result, window),
    }
    rows = [
        [str(k + 1), pct(b), pct(a), num(d)]
        for k, (a, b, d) in enumerate(zip(acc, lw, diffs, strict=True))
    ]
    rows.append(
        ["mean", pct(statistics.fmean(lw)), pct(statistics.fmean(acc)),
         num(statistics.fmean(diffs))]
    )  # fmt: skip
    tab = table(
        [
            "exit (block)",
            f"L.W. linear % (last {window} evaluations)",
            "Accumulator %",
            "difference (points)",
        ],
        rows,
    )
    start = start_level(result)
    tab += (
        f"\n\nStarting model (the pretrained base, or the class prior without one): "
        f"{pct(start)}%; the linear heads' last exit {num(headroom)} points above their mean "
        "over exits (the headroom)."
    )
    checks = [
        Check(f"{name}: last exit above the starting model (points)", value, ">=", LEARNED,
              guard=True)
        for name, value in learned.items()
    ]  # fmt: skip
    checks.append(
        Check("headroom: linear heads' last exit - their mean (points)", headroom, ">=",
              HEADROOM, guard=True)
    )  # fmt: skip
    checks += [
        Check(f"exit {k + 1}: Accumulator - linear (points)", d, ">=", -TOLERANCE)
        for k, d in enumerate(diffs)
    ]
    notes = []
    if headroom < HEADROOM:
        notes.append(
            f"Driver absent: the linear heads' last exit is {headroom:.2f} points above their "
            f"mean over exits (exit 1 at {pct(lw[0])}%, the last at {pct(lw[-1])}%; seed 001: "
            "about 38): the early exits are read about as well linearly as the last, so the run "
            "cannot test the claim where seed 001's Accumulator gains (the weak early exits)."
        )
    behind = [str(k + 1) for k, d in enumerate(diffs) if d < -TOLERANCE]
    if behind:
        notes.append(
            f"The linear heads lead by more than {TOLERANCE:g} points at exit(s) "
            f"{', '.join(behind)}; the mean over exits differs by "
            f"{statistics.fmean(diffs):+.2f} points."
        )
    return Reading(tuple(checks), tab, " ".join(notes))


def plot(
    results: Results,
    experiment: str = EXITS.name,
    linear: str = "fedavg-lw_linear",
    accumulator: str = "fedavg-accumulator",
    window: int = WINDOW,
) -> Figure | None:
    if experiment not in results:
        return None
    cells = results[experiment].cells
    if linear not in cells or accumulator not in cells:
        return None
    lw = exit_levels(cells[linear], window)
    acc = exit_levels(cells[accumulator], window)
    n = max(len(lw), len(acc))
    fig, (a, b) = plots.panels(2)
    plots.bars(
        [str(k + 1) for k in range(n)],
        [("L.W. linear", [100 * x for x in lw]), ("Accumulator", [100 * x for x in acc])],
        f"accuracy at each exit (mean of the last {window} evaluations)",
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
        "CLS token is trained in the pretrain stage on 10,000 held-out rows of classes 5-9 "
        "only (4 epochs), instead of MiniLM, a mean-pooling model whose CLS was never trained "
        "as a summary (the first cpu run on MiniLM left every exit at the class prior). The "
        "base is out of domain on purpose: pretrained on all ten classes it left the linear "
        "heads within 0-2 points of their last exit at every depth (see the sensitivity "
        "row). Then the seed's protocol: 100 Dir(1.0) clients, 10 a round, batch 10, one "
        "local epoch on 3,000 images (3 steps), 150 rounds (4,500 SGD steps per method "
        "against the seed's ~750,000), 1,000 test images every 3 rounds; each method's lr the "
        "best of 5e-3 (the seed's) and 5e-2 on a validation split.",
        "ci": "Smoke test: 40 tweets over 4 clients, 2 rounds of 2 steps.",
    },
    thresholds=THRESHOLDS,
    window=WINDOW,
    dropped=(MINILM, IN_DOMAIN),
)
