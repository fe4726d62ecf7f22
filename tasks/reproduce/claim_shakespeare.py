"""Claim: on federated Shakespeare next-word prediction, Houlsby, Pfeiffer and LoRA adapters on
a pretrained GPT-2 end within about a point of full fine-tuning while sending 98% less per
round (seed 003 Tables 4, 8 and 12).

What drives the effect is fine-tuning a *pretrained* decoder: the base brings what the
federation's few labels cannot teach, and the adapters only steer it. So the comparison
means something only when fine-tuning teaches the base something: full fine-tuning must end
clearly above the pretrained base's own test accuracy (a guard). Without that, every method
ties at the base and the rule would hold vacuously.

Offline there are no gpt2 weights: fedapt's ``gpt2_small`` is pretrained on the seven plays
held out of the federation (``tasks/data/pretrain_lm.py``). That base already knows the
federation's domain (the same author, the same verse layout), which gpt2-base (WebText) does
not, so fine-tuning on one next-token label per window has little left to teach it (see
``scaled``): the guard is what reports that, as "cannot say".
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tasks.reproduce import plots
from tasks.reproduce.measures import end_level, mib_per_round, num, pct, table
from tasks.reproduce.spec import (
    Cell,
    Check,
    Claim,
    Dropped,
    Experiment,
    Reading,
    Results,
    missing,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# Seed 003 §4.2 and Table 1 (NLP): gpt2-base, 9 clients all taking part, 30 global epochs of
# 5 local steps, batch 16, Adam (fedapt: AdamW, weight decay 0, fresh each round: the same
# update; the table's "epsilon 0.0005" is not an option of fedapt's optimiser). Next-token
# accuracy on windows of 32 tokens (fedcore/lm.py: one label, the token after the window).
# gpt2_small with its defaults (4 blocks x 128, 4,096-token BPE), pretrained on the held-out
# plays (causal LM at every position, AdamW 0.003, 10 epochs: docs/results/shakespeare.md's
# run C reached 15.5% after 6, still rising) stands in for gpt2-base.
_SEED003 = (
    "data.dataset=shakespeare",
    "data.train_subset=null",
    "data.test_subset=null",  # all 6,330 test windows: one standard error is ~0.45 points
    "partition.num_clients=9",
    "partition.natural.min_samples=150",  # roles with at least 30 rounds x 5 steps of 16 / 16
    "model.name=gpt2_small",
    "model.options={}",
    "model.input_size=null",
    "model.base=pretrain",
    "pretrain.dataset=null",
    "pretrain.classes=null",
    "pretrain.max_samples=null",
    "pretrain.epochs=10",
    "pretrain.lr=0.003",
    "pretrain.momentum=0.9",
    "pretrain.weight_decay=0.01",
    "pretrain.batch_size=64",
    "federation.rounds=30",
    "federation.participation=1.0",
    "federation.eval_every=1",
    "federation.last_rounds=5",
    "client.optimizer=adamw",
    "client.weight_decay=0.0",
    "client.local_epochs=1",
    "client.max_steps=5",
    "client.batch_size=16",
    "lr_schedule.kind=constant",
    "grid.algorithms=[fedavg]",
)
# Table 4 (non-IID): one client per speaking role (TFF's federated Shakespeare, 9 clients).
# Table 8 (IID): the seed merges 27 role datasets into 9 clients of 3; fedapt's iid scheme
# deals all roles' training windows out to 9 clients.
_NON_IID = ("partition.scheme=natural",)
_IID = ("partition.scheme=iid",)
_CI = (
    "model.options={vocab_size: 512, layers: 1, hidden: 16, heads: 2, context: 8, stride: 8}",
    "data.test_subset=100",
    "partition.num_clients=3",
    "partition.natural.min_samples=10",
    "pretrain.max_samples=64",
    "pretrain.epochs=1",
    "pretrain.batch_size=16",
    "federation.rounds=2",
    "client.max_steps=1",
    "client.batch_size=8",
)
_PROFILES = ("ci", "gpu")  # see CLAIM.scaled["cpu"]
METHODS = ("houlsby", "pfeiffer", "lora")
# Learning rates as Tables 4 and 8 give them: full 0.0001; Houlsby and Pfeiffer 0.0005; LoRA
# 0.0005 (Table 4) and 0.001 (Table 8: here 0.0005 with the other adapters, one experiment).
FULL = Experiment(
    "shakespeare-full",
    protocol=(*_SEED003, *_NON_IID, "client.lr=0.0001", "grid.adapters=[full]"),
    scale={"ci": _CI},
    profiles=_PROFILES,
)
ADAPTERS = Experiment(
    "shakespeare-adapters",
    protocol=(*_SEED003, *_NON_IID, "client.lr=0.0005", "grid.adapters=[houlsby,pfeiffer,lora]"),
    scale={"ci": _CI},
    profiles=_PROFILES,
)
# The smoke test runs the non-IID pair only (the IID pair is the same pipeline).
IID_FULL = Experiment(
    "shakespeare-iid-full",
    protocol=(*_SEED003, *_IID, "client.lr=0.0001", "grid.adapters=[full]"),
    profiles=("gpu",),
)
IID_ADAPTERS = Experiment(
    "shakespeare-iid-adapters",
    protocol=(*_SEED003, *_IID, "client.lr=0.0005", "grid.adapters=[houlsby,pfeiffer,lora]"),
    profiles=("gpu",),
)
# (label, full experiment, adapters experiment)
PAIRS = (("non-IID", FULL, ADAPTERS), ("IID", IID_FULL, IID_ADAPTERS))
GAP = 1.0  # points below full: Tables 4/8's largest gap, 0.71, plus ~0.3 (see TOLERANCE)
TRAFFIC = 2.0  # % of full's bytes per round: Table 12's 0.23-1.40%, "over 98%" less
LEARNED = 2.0  # points full fine-tuning and each adapter must gain over the pretrained base:
# twice GAP, so an adapter that learned nothing cannot pass the gap check
WINDOW = 5  # evaluations behind every verdict metric (every round is evaluated: the last 5)
THRESHOLDS = {"gap": GAP, "traffic_percent": TRAFFIC, "learned": LEARNED}


def accuracy(cell: Cell | None) -> float | None:
    """Mean test accuracy over the last ``WINDOW`` evaluations."""
    return None if cell is None else end_level(cell, WINDOW)


def _points(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else 100 * (a - b)


def measure(results: Results) -> Reading:
    """The non-IID pair always; the IID pair where the profile ran it (``gpu``: the verdict
    waits for every experiment a profile plans before it measures)."""
    if (r := missing(results, [FULL.name, ADAPTERS.name])) is not None:
        return r
    checks: list[Check] = []
    rows: list[list[str]] = []
    notes: list[str] = []
    for label, full_exp, ad_exp in PAIRS:
        if full_exp.name not in results or ad_exp.name not in results:
            continue
        full = results[full_exp.name].cells.get("fedavg-full")
        cells = results[ad_exp.name].cells
        base = results[full_exp.name].base_accuracy
        a_full = accuracy(full)
        m_full = mib_per_round(full) if full is not None else None
        gain = _points(a_full, base)
        checks.append(
            Check(f"{label}: full above the pretrained base (points)", gain, ">=", LEARNED,
                  guard=True)
        )  # fmt: skip
        rows.append([label, "base", pct(base), "-", "-", "-", "-"])
        rows.append([label, "full", pct(a_full), num(gain), "0.00", num(m_full, ".3f"), "100%"])
        gains = []
        for method in METHODS:
            c = cells.get(f"fedavg-{method}")
            if c is None:
                checks.append(Check(f"{label}: {method} below full (points)", None, "<=", GAP))
                continue
            acc, m = accuracy(c), mib_per_round(c)
            gap = _points(a_full, acc)
            share = None if not m_full else m / m_full
            checks += [
                Check(f"{label}: {method} above the pretrained base (points)",
                      _points(acc, base), ">=", LEARNED, guard=True),
                Check(f"{label}: {method} below full (points)", gap, "<=", GAP),
                Check(f"{label}: {method} share of full's bytes (%)",
                      None if share is None else 100 * share, "<=", TRAFFIC),
            ]  # fmt: skip
            share_text = "-" if share is None else f"{100 * share:.2f}%"
            rows.append(
                [label, method, pct(acc), num(_points(acc, base)), num(gap), num(m, ".3f"),
                 share_text]
            )  # fmt: skip
            gains.append(f"{method} {num(_points(acc, base))}")
        if gain is not None and gain < LEARNED:
            notes.append(
                f"{label}: full fine-tuning ends {gain:.2f} points above the pretrained base "
                f"({pct(base)}%): nothing learnt for the adapters to match (theirs: "
                f"{', '.join(gains)}); the base knows the same author's plays (see what ran)."
            )
        elif gain is not None:
            notes.append(
                f"{label}: full gains {gain:.2f} points over the base ({pct(base)}%); the "
                f"adapters {', '.join(gains)}."
            )
    tab = table(
        [
            "partition",
            "method",
            "acc % (mean of last L rounds)",
            "over the base (points)",
            "below full (points)",
            "MiB/round (all clients, both ways)",
            "of full's traffic",
        ],
        rows,
    )
    return Reading(tuple(checks), tab, " ".join(notes))


def plot(results: Results) -> Figure | None:
    if not any(e.name in results for _, f, a in PAIRS for e in (f, a)):
        return None
    fig, axes = plots.panels(3)
    for ax, (label, full_exp, ad_exp) in zip(axes[:2], PAIRS, strict=True):
        lines = [(full_exp.name, "fedavg-full", "full")]
        lines += [(ad_exp.name, f"fedavg-{m}", m) for m in METHODS]
        plots.accuracy_curves(results, lines, f"{label}: next-token accuracy per round", ax=ax)
        base = results[full_exp.name].base_accuracy if full_exp.name in results else None
        if base is not None:
            ax.axhline(100 * base, color="black", lw=0.8, ls="--", label="pretrained base")
            ax.legend(fontsize=7)
    lines = [(FULL.name, "fedavg-full", "full")]
    lines += [(ADAPTERS.name, f"fedavg-{m}", m) for m in METHODS]
    plots.accuracy_vs_mib(results, lines, "non-IID: accuracy vs cumulative MiB", ax=axes[2])
    return fig


RULE = (
    "Every accuracy is a cell's mean next-token accuracy over its last 5 evaluations (every "
    "round is evaluated); differences are taken within a seed. Holds if, on both the non-IID "
    "(one client per speaking role) and the IID partition, Houlsby, Pfeiffer and LoRA each "
    "end at most 1 point below full fine-tuning and send at most 2% of its bytes per round, "
    "as measured (the frozen base's one-time download apart, as in seed 003's Eq. 2). "
    "Guards: full fine-tuning and each adapter end at least 2 points above the pretrained "
    "base's own test accuracy (the same test windows, before any round), else fine-tuning "
    "taught the base nothing for the adapters to match and the run cannot say."
)
TOLERANCE = (
    "Seed 003 reports one run per cell (no spread). Its adapters end 0.72 points above to "
    "0.71 below full fine-tuning (Table 4) and 0.09 to 0.50 below (Table 8), all called "
    "comparable; 1 point is its largest gap (0.71) plus about 0.3 for the seed-to-seed "
    "spread it does not report (about the standard error of a paired accuracy difference on "
    "the 6,330 test windows); the seed-to-seed spread of each paired gap is the interval's. "
    "The guards' 2 points are twice that tolerance, so an adapter that stayed at the base "
    "cannot pass."
)

CLAIM = Claim(
    id="shakespeare",
    title="On federated Shakespeare next-word prediction, Houlsby, Pfeiffer and LoRA adapters "
    "on a pretrained GPT-2 end within about a point of full fine-tuning at 2% or less of its "
    "traffic per round.",
    source="seed 003 Tables 1, 4, 8 and 12",
    paper=(
        "Table 4 (Shakespeare non-IID, gpt2-base, 9 clients, 30 rounds of 5 Adam steps of "
        "16): full fine-tuning 28.46 (lr 0.0001); Pfeiffer 29.18, LoRA 27.75, Houlsby 28.29 "
        "(lr 0.0005); RNN 16.49, LSTM 17.48 from scratch. Table 8 (IID, 27 roles merged into 9 "
        "clients): full 31.10 (lr 0.0001); Pfeiffer 30.6 (0.0005), LoRA 30.73 (0.001), "
        "Houlsby 31.01 (0.0005). Table 12: gpt2-base 487.82 MB vs Pfeiffer 3.41, LoRA 1.12, "
        "Houlsby 6.82 MB per transfer (0.23-1.40%)."
    ),
    experiments=(FULL, ADAPTERS, IID_FULL, IID_ADAPTERS),
    measure=measure,
    rule=RULE,
    tolerance=TOLERANCE,
    plot=plot,
    scaled={
        "gpu": "The seed's protocol (9 clients, 30 rounds, 5 local Adam steps of 16, its "
        "learning rates, LoRA at 0.0005 on IID too) with gpt2_small (4 blocks x 128, 1.3M "
        "parameters, 4,096-token BPE) pretrained for 10 epochs on the 7 plays held out of "
        "the federation in place of gpt2-base (no GPT-2 weights offline); all 6,330 test "
        "windows; IID is fedapt's iid split of every role's windows over 9 clients (the "
        "seed merges 27 roles in threes). Expect 'cannot say': that base already knows the "
        "federation's author and layout (gpt2-base knew neither), and in fedapt's runs "
        "fine-tuning it on one next-token label per window moved the test accuracy by less "
        "than a point (docs/results/shakespeare.md).",
        "cpu": "gpu profile only: no design that fits 2 cores has the effect's driver, "
        "fine-tuning that teaches the pretrained base something to match. Measured on "
        "this machine (2026-11-26, load 8-11): a 4 x 64 gpt2_small pretrained on the "
        "held-out plays (3 epochs, 144 s) scored 13.2% on 2,000 test windows; 10 rounds of 9 "
        "roles x 5 steps of 16 left full fine-tuning (lr 1e-3) at 12.4-13.1% and LoRA (5e-3) "
        "at 12.9-13.5%, and even centralised "
        "full fine-tuning on the 9 roles' windows (600-900 steps of 16, lr 3e-4 or 1e-3) "
        "raised the test loss on those very roles (5.21 -> 5.25, 5.19 -> 6.26). With nothing "
        "learnt in fine-tuning, adapters and full tie at the base and the comparison says "
        "nothing; the pretraining alone of a stronger base takes the whole 4-minute budget.",
        "ci": "Smoke test: a 1-block GPT-2 16 wide (512-token BPE, 8-token windows) pretrained "
        "for 1 epoch on 64 blocks; 3 clients, 2 rounds of 1 step.",
    },
    requires=("dataset:shakespeare", "model:gpt2_small"),
    thresholds=THRESHOLDS,
    window=WINDOW,
    dropped=(
        Dropped(
            design="a cpu design: a 4 x 64 gpt2_small pretrained on the held-out plays (3 "
            "epochs), 10 rounds of 9 roles x 5 steps of 16, 2,000 test windows (2026-11-26)",
            measured="the base 13.2%; full fine-tuning (lr 1e-3) 12.4-13.1%, LoRA (5e-3) "
            "12.9-13.5%; centralised full fine-tuning on the same roles raised their test loss "
            "(5.19 -> 6.26 after 900 steps at 1e-3)",
            why="fine-tuning taught the base nothing (the guard's 'cannot say' by design), and "
            "a stronger base's pretraining alone takes the probe's whole budget",
        ),
    ),
)
