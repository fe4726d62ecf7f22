"""Claim: under unequal client sizes FedVC (virtual clients of N_VC samples) ends more
accurate than FedAvg, even at a size STD of 50% of the mean, and converges in as many rounds
(seed 002 §4.1, Fig. 5)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tasks.reproduce import plots
from tasks.reproduce.claim_dirichlet_alpha import (
    CI,
    CPU,
    FEDAVG002,
    HALF,
    LEARNED,
    PLATEAU,
    SHARE,
    SLACK,
    TRAILING,
    WINDOW,
    learned,
    plateau,
    points,
    rising,
    share_apart,
)
from tasks.reproduce.measures import convergence_round, end_level, num, pct, table
from tasks.reproduce.spec import Check, Claim, Dropped, Experiment, Reading, Results, missing

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# Seed 002 §4: client sizes "drawn from a normal distribution controlled with a relative
# standard deviation term (expressed as a fraction of the mean)"; Fig. 5 varies that STD and
# the text names 50%. Class mixes as in the seed's other runs, Dir(alpha p) with alpha = 1:
# the class skew is what makes FedAvg's large clients, with several times the local steps of
# its small ones, pull the average towards their classes (the bottleneck FedVC removes).
# N_VC (not given) = the mean client size, so FedVC trains as many samples per round as
# FedAvg does on average, spread evenly: FedVC's clients all take the same local steps.
_VC = "grid.algorithm_options.fedvc.n_vc"
# cpu: 40 rounds (the first design's 30 ended with both curves still climbing 6-10 points
# over their second halves): 1,753 s per 30 rounds for the two cells and 3 seeds in the
# records, so 2,337 s (39 minutes) for 40.
CPU_ROUNDS = 40


def _std(rel: float, profiles: tuple[str, ...] = ("ci", "cpu", "gpu")) -> Experiment:
    return Experiment(
        f"fedvc-std{round(100 * rel)}",
        protocol=(
            *FEDAVG002,
            "partition.scheme=dirichlet_clientwise",
            "partition.dirichlet_clientwise.alpha=1",
            "partition.dirichlet_clientwise.sizes=normal",
            f"partition.dirichlet_clientwise.size_rel_std={rel:g}",
            "grid.algorithms=[fedavg,fedvc]",
            # a draw below 1 is clipped to a 1-image client (2.3% of draws at STD 50%): the
            # seed's scheme, which the default shard check (10 images) would reject
            "validation.min_shard_size=1",
            f"{_VC}=1200",  # 60,000 images / 50 clients
        ),
        scale={
            "cpu": (*CPU, f"federation.rounds={CPU_ROUNDS}", f"{_VC}=600"),
            "ci": (*CI, f"{_VC}=100"),
        },
        profiles=profiles,
    )


STD30, STD50 = _std(0.3, ("gpu",)), _std(0.5)
RUNS = (STD30, STD50)
GAIN = 0.0  # points: "a consistent improvement" names no margin


def measure(results: Results) -> Reading:
    if (r := missing(results, [STD50.name])) is not None:
        return r
    checks, rows, notes = [], [], []
    for exp in RUNS:
        if exp.name not in results:
            continue
        std = exp.name.removeprefix("fedvc-std")
        res = results[exp.name]
        avg, vc = res.cells.get("fedavg-full"), res.cells.get("fedvc-full")
        rounds = int(res.params.get("federation.rounds", 0) or 0) or None
        e_avg = None if avg is None else end_level(avg, WINDOW)
        e_vc = None if vc is None else end_level(vc, WINDOW)
        r_avg = None if avg is None else convergence_round(avg, SHARE, WINDOW, TRAILING)
        r_vc = None if vc is None else convergence_round(vc, SHARE, WINDOW, TRAILING)
        checks += [
            plateau(avg, f"STD {std}% FedAvg"),
            plateau(vc, f"STD {std}% FedVC"),
            learned(vc, res, f"STD {std}% FedVC"),
        ]
        gain = points(e_vc, e_avg)
        checks.append(Check(f"STD {std}%: FedVC - FedAvg end acc (points)", gain, ">", GAIN))
        if gain is not None and gain <= GAIN:
            notes.append(f"at STD {std}% FedVC ends {gain:+.2f} points from FedAvg")
        later = share_apart(r_avg, r_vc, rounds)
        apart = None if later is None else abs(later)
        checks.append(
            Check(f"STD {std}%: abs(FedVC - FedAvg convergence round) (share of rounds)", apart,
                  "<=", SLACK)
        )  # fmt: skip
        if apart is not None and apart > SLACK:
            notes.append(f"at STD {std}% FedVC converges at round {r_vc}, FedAvg at {r_avg}")
        notes += rising(avg, f"FedAvg at STD {std}%") + rising(vc, f"FedVC at STD {std}%")
        rows += [
            [f"STD {std}% FedAvg", pct(e_avg), num(r_avg, "d")],
            [f"STD {std}% FedVC", pct(e_vc), num(r_vc, "d")],
        ]
    tab = table(
        ["client sizes, algorithm", f"end acc % (last {WINDOW})", "convergence round"], rows
    )
    return Reading(tuple(checks), tab, "; ".join(notes) + ("." if notes else ""))


def plot(results: Results) -> Figure | None:
    ran = [e for e in RUNS if e.name in results]
    if not ran:
        return None
    fig, axes = plots.panels(len(ran))
    for ax, exp in zip(axes, ran, strict=True):
        lines = [(exp.name, f"{a}-full", a) for a in ("fedavg", "fedvc")]
        std = exp.name.removeprefix("fedvc-std")
        plots.accuracy_curves(results, lines, f"size STD {std}% (seed 002 Fig. 5)", ax=ax)
    return fig


CLAIM = Claim(
    id="fedvc",
    title="With unequal client sizes (STD up to 50% of the mean) FedVC ends more accurate "
    "than FedAvg and converges in as many rounds.",
    source="seed 002 §4.1, Fig. 5",
    paper=(
        '§4.1 "Federated Averaging vs Virtual Clients": "The setting compares different value '
        "of an STD parameter which represent the standard deviation, expressed in percentage "
        "of the average number of samples per each client. [...] The results, visible in "
        "Figure 5 show a consistent improvement even with high level of disparity (STD: 50%) "
        'for the FedVC accuracy, while the convergence time is unchanged." Fig. 5 is curves '
        "only; the text names no STD but 50%, no alpha and no N_VC."
    ),
    experiments=RUNS,
    measure=measure,
    rule="A curve's end level is the mean of its last 5 evaluated rounds; its convergence "
    "round is the first round at which its 3-round trailing mean reaches 95% of that end "
    "level. Each number is taken within a seed (the same client sizes and class mixes) and "
    "decided by its 95% interval over the seeds. Holds if at every size STD run (50%; also "
    "30% on gpu) FedVC's end level minus FedAvg's lies above 0 and their convergence rounds "
    "differ by at most 10% of the rounds. The guards: both curves have converged (the "
    "least-squares trend through the second half of each one's evaluated rounds rises at "
    "most 5 points) and FedVC learned (it ends at least 2 points above its start, the class "
    "prior); else 'cannot say'.",
    tolerance="Seed 002 reports curves only: no numbers, no seeds, no spread. 'A consistent "
    "improvement' names no margin, so the rule takes any whose interval lies above 0 (while "
    "it straddles 0 the verdict asks for more seeds); 'unchanged' convergence allows 10% of "
    "the rounds, about the jitter of where a 3-round trailing mean first crosses a level on "
    "FedAvg's curves at alpha = 1. The plateau guard's 5 points (see local-epochs) is tied "
    "to the noise: at alpha = 1 with unequal sizes these curves scatter 2-5 points about a "
    "line (30-round cpu runs), so a flat pair passes it over 3 seeds only about 6 times in "
    "10 (simulated, 20-round halves) and the verdict may say 'cannot say' on converged "
    "curves; a curve still climbing 6-10 points over its second half, as both did in the "
    "30-round runs, does not pass.",
    thresholds={
        "gain_points": GAIN,
        "slack_share": SLACK,
        "plateau_points": PLATEAU,
        "plateau_half": HALF,
        "learned_points": LEARNED,
        "convergence_share": SHARE,
        "trailing_rounds": TRAILING,
    },
    window=WINDOW,
    plot=plot,
    scaled={
        "gpu": "The seed's protocol (50 clients, 75% per round, E=2, B=64, SGD 0.01/0.9, "
        "LeNet5) at alpha = 1 on FashionMNIST (CIFAR-10 is not available offline), 100 rounds "
        "(not in the text), sizes ~ Normal(mean, STD x mean) with STD 30% and 50%, N_VC = "
        "1,200 (the mean size; the text gives none).",
        "cpu": "6,000 images on 10 clients (8 per round), 40 rounds, STD 50% (the STD the "
        "text names), N_VC = 600 (the mean size): FedAvg's clients range from a few dozen to "
        "about 1,000 images, i.e. from 2-3 to about 30 local steps per round, while each "
        "FedVC client takes 20. About 39 minutes for 3 seeds (the records: 1,753 s per 30 "
        "rounds).",
        "ci": "Smoke test: 400 images over 4 clients, 3 rounds of 2 steps, N_VC = 100.",
    },
    dropped=(
        Dropped(
            "cpu, 30 rounds, the old rule (every check on every seed)",
            "cannot say: FedVC - FedAvg end level -3.18, +0.42, -0.68 points and convergence "
            "rounds +1, -4, +7 apart over seeds 0-2; both curves still climbed 6-10 points "
            "over rounds 16-30",
            "the curves had not converged: 40 rounds is what the 40-minute budget allows",
        ),
    ),
)
