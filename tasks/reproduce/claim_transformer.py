"""Claim: Houlsby, Pfeiffer and LoRA adapters on a pretrained transformer come within 1-2
points of full fine-tuning while sending at least 98% less (seed 003 Tables 3 and 12)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tasks.reproduce import plots
from tasks.reproduce.measures import (
    end_level,
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
    Reading,
    Results,
    Tune,
    missing,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# Seed 003 §4.2, Table 1 (CV): 9 clients, 50 global epochs, 5 local steps, Adam, batch 12;
# Table 3's learning rates: full 0.0005, adapters 0.005 (lr picked per method by the paper).
# ViT-base and CIFAR-100 are not available offline: the pretrained MiniLM (all-MiniLM-L6-v2)
# on tweet sentiment (3 classes) stands in, Dir(0.5) over 9 clients for "non-IID". Adam is
# AdamW with weight decay 0 (the same update).
_SEED003 = (
    "data.dataset=tweet_sentiment",
    "data.train_subset=null",
    "data.test_subset=null",
    "partition.scheme=dirichlet_classwise",
    "partition.dirichlet_classwise.beta=0.5",
    "partition.num_clients=9",
    "model.name=minilm",
    "model.base=none",
    "model.input_size=null",
    "federation.rounds=50",
    "federation.participation=1.0",
    "federation.eval_every=1",
    "client.optimizer=adamw",
    "client.weight_decay=0.0",
    "client.local_epochs=1",
    "client.max_steps=5",
    "client.batch_size=12",
    "lr_schedule.kind=constant",
    "grid.algorithms=[fedavg]",
)
# cpu: MiniLM costs 0.4-0.7 s a local step here (the 2026-11-25 run: 3.56 s per client job of
# 5 steps for full fine-tuning, 1.8-1.9 s for the adapters), so the seed's 50 rounds of 9 jobs
# would take about 25 minutes per seed for full fine-tuning alone (29.5 s a round then); that
# run could afford 12 rounds, one lr per method and 500 test tweets. The stand-in is a small pretrained ViT, closer
# to the seed's ViT-base than MiniLM: timm's ViT 128 wide, 4 blocks, 14-pixel patches on 28x28
# FashionMNIST, its base trained in the pretrain stage on 5,000 held-out rows of classes 5-9
# only (a base of other classes, as ImageNet-21k is for CIFAR-100: the federation must learn
# classes 0-4, so fine-tuning has something to teach; 5,000 rows, not 10,000, for time: the
# four bases of the profile, three seeds and the tuning split, would otherwise cost a third
# of the claim's 40 minutes), the seed's 50 rounds, 9 Dir(0.5)
# clients of 5 Adam steps of 12, 2,000 test images every 2 rounds (a standard error of ~1
# point per evaluation, 5 of them behind each verdict metric); each method's lr the best of
# the seed's two (5e-4 for full, 5e-3 for the adapters) on a validation split, as the seed
# keeps the best lr per method.
_CPU = (
    "data.dataset=fashion_mnist",
    "data.train_subset=9000",
    "data.test_subset=2000",
    "model.name=vit_small",
    "model.options.embed_dim=128",
    "model.options.depth=4",
    "model.options.patch_size=14",
    "model.input_size=28",
    "model.base=pretrain",
    "pretrain.dataset=null",
    "pretrain.classes=[5,6,7,8,9]",
    "pretrain.max_samples=5000",
    "pretrain.epochs=4",
    "federation.eval_every=2",
)
_TUNE = {"cpu": Tune(lrs=(0.0005, 0.005))}
_CI = (
    "data.train_subset=60",
    "data.test_subset=30",
    "partition.num_clients=3",
    "federation.rounds=1",
    "client.max_steps=1",
    "client.batch_size=4",
)
FULL = Experiment(
    "transformer-full",
    protocol=(*_SEED003, "client.lr=0.0005", "grid.adapters=[full]"),
    scale={"cpu": _CPU, "ci": _CI},
    tune=_TUNE,
)
ADAPTERS = Experiment(
    "transformer-adapters",
    protocol=(*_SEED003, "client.lr=0.005", "grid.adapters=[houlsby,pfeiffer,lora,head]"),
    scale={"cpu": _CPU, "ci": _CI},
    tune=_TUNE,
)
METHODS = ("houlsby", "pfeiffer", "lora")
MINILM = Dropped(
    design="MiniLM on 1,800 tweets (the gpu design's model), 12 of the seed's 50 rounds, one "
    "lr per method (the seed's), 500 test tweets every 2 rounds (2026-11-25, one seed)",
    measured="at the last evaluation full 69.0%, Houlsby 64.8, Pfeiffer 61.2, LoRA 64.0, the "
    "head alone 60.4; 3.56 s per client job of 5 steps for full fine-tuning, 1.8-1.9 s for "
    "the adapters",
    why="the seed's 50 rounds would take about 25 minutes per seed for full fine-tuning alone, "
    "and one evaluation on 500 tweets has a standard error of about 2.1 points against a "
    "2-point rule",
)
WINDOW = 5  # evaluations behind every verdict metric (cpu: the last 10 of 50 rounds)
GAP_POINTS = 2.0  # "within 1-2 points"
TRAFFIC = 3.0  # % of full's bytes per round: "about 98%" less (Table 12: 0.34-2.06%)
OVER_HEAD = 1.0  # the adapters, not the head alone, make the difference: >= 1 point above it
LEARNED = 2.0  # points above the starting model (the pretrained base; the class prior)
THRESHOLDS = {
    "gap": GAP_POINTS,
    "traffic_percent": TRAFFIC,
    "over_head": OVER_HEAD,
    "learned": LEARNED,
}


def measure(results: Results) -> Reading:
    if (r := missing(results, [FULL.name, ADAPTERS.name])) is not None:
        return r
    full_result, ad_result = results[FULL.name], results[ADAPTERS.name]
    full = full_result.cells.get("fedavg-full")
    if full is None:
        return Reading(note=f"{FULL.name} has no cell fedavg-full")
    cells = ad_result.cells
    a_full, m_full = end_level(full, WINDOW), mib_per_round(full)
    head = cells.get("fedavg-head")
    a_head = end_level(head, WINDOW) if head else None
    start = start_level(full_result)
    rows = [["starting model", pct(start), "-", "-", "-", "-"]]
    rows.append(
        ["full", pct(a_full), num(learned_points(full, full_result, WINDOW)), "0.00",
         num(m_full, ".3f"), "100%"]
    )  # fmt: skip
    checks = [
        Check("full: above the starting model (points)",
              learned_points(full, full_result, WINDOW), ">=", LEARNED, guard=True)
    ]  # fmt: skip
    for method in (*METHODS, "head"):
        c = cells.get(f"fedavg-{method}")
        if c is None:
            if method != "head":
                checks.append(Check(f"{method}: below full (points)", None, "<=", GAP_POINTS))
            continue
        acc, share = end_level(c, WINDOW), 100 * mib_per_round(c) / m_full
        gap = None if acc is None or a_full is None else 100 * (a_full - acc)
        learned = learned_points(c, ad_result, WINDOW)
        if method != "head":
            over = None if a_head is None or acc is None else 100 * (acc - a_head)
            checks += [
                Check(f"{method}: above the starting model (points)", learned, ">=", LEARNED,
                      guard=True),
                Check(f"{method}: above the head alone (points)", over, ">=", OVER_HEAD,
                      guard=True),
                Check(f"{method}: below full (points)", gap, "<=", GAP_POINTS),
                Check(f"{method}: share of full's bytes (%)", share, "<=", TRAFFIC),
            ]  # fmt: skip
        rows.append(
            [method, pct(acc), num(learned), num(gap), num(mib_per_round(c), ".3f"),
             f"{share:.2f}%"]
        )  # fmt: skip
    tab = table(
        [
            "adapter",
            f"acc % (last {WINDOW} evaluations)",
            "above the starting model (points)",
            "below full (points)",
            "MiB/round (all clients, both ways, measured)",
            "of full's traffic",
        ],
        rows,
    )
    return Reading(tuple(checks), tab)


def plot(results: Results) -> Figure | None:
    lines = [(FULL.name, "fedavg-full", "full")]
    lines += [(ADAPTERS.name, f"fedavg-{m}", m) for m in (*METHODS, "head")]
    if FULL.name not in results and ADAPTERS.name not in results:
        return None
    fig, (a, b) = plots.panels(2)
    plots.accuracy_curves(results, lines, "accuracy per round", ax=a)
    plots.accuracy_vs_mib(results, lines, "accuracy vs cumulative MiB", ax=b)
    return fig


CLAIM = Claim(
    id="transformer",
    title="Houlsby, Pfeiffer and LoRA adapters come within 1-2 points of full fine-tuning "
    "of a pretrained transformer at 98% or more less traffic.",
    source="seed 003 Tables 1, 3 and 12",
    paper=(
        "Table 3 (CIFAR-100 non-IID, ViT-base): full fine-tuning 61.51 (lr 0.0005); Pfeiffer "
        "64.09, LoRA 60.91, Houlsby 64.19 (lr 0.005). Table 12: ViT-base 330.96 MB vs "
        "Pfeiffer 3.41 MB, LoRA 1.12 MB, Houlsby 6.82 MB per transfer (1.0-2.1% of the model)."
    ),
    experiments=(FULL, ADAPTERS),
    measure=measure,
    rule="Every accuracy is a cell's mean over its last 5 evaluations; differences are taken "
    "within a seed. Holds if Houlsby, Pfeiffer and LoRA each end at most 2 points below full "
    "fine-tuning and send at most 3% of its bytes per round, as measured (the frozen base's "
    "one-time download apart, as the first term of seed 003's Eq. 2). Guards: full "
    "fine-tuning and each adapter end at least 2 points above their starting model (the "
    "pretrained base's own test accuracy; the class prior without a base), and each adapter "
    "at least 1 point above training the classifier alone (head), else the run does not show "
    "that the adapters make the difference.",
    tolerance="Seed 003 gives one run per cell (no spread); its adapters land 0.6 points "
    'below to 2.7 points above full, so 2 points is its claim\'s own "1-2 points"; the '
    "seed-to-seed spread of each paired gap is the interval's. Table 12's adapters send "
    "0.34-2.06% of ViT-base (Houlsby 6.82 of 330.96 MB, above a strict 2%), and the paper "
    'says "about 98%" and "up to 98%" less: 3% keeps that order of saving. It also covers '
    "the narrower cpu ViT, where LoRA's rank-8 matrices and each small tensor's framing weigh "
    "more: fedapt's payload encoder gives Houlsby 2.58%, LoRA 2.32%, Pfeiffer 1.39% of full's "
    "bytes at width 128 (computed from the models before any run; MiniLM: 0.34-1.02%, "
    "measured 2026-11-25).",
    plot=plot,
    scaled={
        "gpu": "The seed's protocol (50 rounds, 9 clients, 5 local Adam steps of 12) on MiniLM "
        "and all 30,269 training tweets: ViT-base weights and CIFAR-100 are not available "
        "offline; non-IID is Dir(0.5) over the 9 clients (tweets have no natural clients).",
        "cpu": "A small pretrained ViT instead of MiniLM (whose training steps take 0.4-0.7 s "
        "here: the seed's 50 rounds would take about 25 minutes per seed for full fine-tuning "
        "alone; the first cpu run could afford 12 of 50 rounds, one lr per method and 500 test "
        "tweets): timm's ViT 128 wide, 4 blocks, 14-pixel patches on 28x28 FashionMNIST, its "
        "base pretrained on 5,000 held-out rows of classes 5-9 only (the federation must "
        "learn the other five, as CIFAR-100 is new to an ImageNet-21k base); the seed's 50 "
        "rounds of 5 Adam steps of 12 over 9 Dir(0.5) clients (9,000 images), 2,000 test "
        "images every 2 rounds (a standard error of ~1 point per evaluation); each method's lr "
        "the best of 5e-4 and 5e-3 (the seed's two) on a validation split.",
        "ci": "Smoke test: 60 tweets over 3 clients, 1 round of 1 step.",
    },
    thresholds=THRESHOLDS,
    window=WINDOW,
    dropped=(MINILM,),
)
