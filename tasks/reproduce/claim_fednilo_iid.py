"""Claim: on IID data FedNILO still reaches FedAvg's 30-round-mean accuracy with less traffic,
if less so than on non-IID data (seed 004 Table 6.6: 17.9-28.1% savings, average 23.9%)."""

from __future__ import annotations

from functools import partial

from tasks.reproduce import claim_fednilo, fednilo_k
from tasks.reproduce.spec import Claim, Dropped, Experiment

# Seed 004 §6.1.3-6.1.4, the homogeneous tables (6.6-6.7): the protocol of the Dir(0.3)
# tables with an IID, balanced split (each client about 500 images, every class about
# equally). FashionMNIST stands in for CIFAR-10, in every profile.
_SEED004_IID = (*claim_fednilo._SEED004, "partition.scheme=iid")
# cpu: FedAvg must reach its plateau inside the run, or its ACC levels are not its own (the
# plateau guard). 50 rounds on 5,000 images: the seed's 100 clients, E = 5 and B = 50 (each
# client's 50 images are one batch: 5 local steps), 4 clients per round instead of 10 (the
# cost of a round; IID clients are interchangeable); the seed's schedule compressed into the
# run (lr x 0.998^(2000/50) = x 0.9231 per round: the last round's lr is 1.8% of the first, as
# at the seed's round 2000) from lr 0.1: the seed's 0.01 learned too little in a cpu run (62%
# at round 21 of 60 with 10 clients of 60 images, still rising a point a round). Probe of
# 2026-11-26 (FedAvg alone, seed 0, before any FedNILO run): ACC (10-round mean) best 72.26%,
# -0.18 points over its last 10 rounds; its levels 70.0-72.0% first reached at rounds 29-39.
_CPU = (
    "data.train_subset=5000",
    "data.test_subset=500",
    "federation.rounds=50",
    "federation.participation=0.04",
    "client.lr=0.1",
    "lr_schedule.decay=0.9231",
    "report.window=10",
)
_CI = claim_fednilo._CI
# (K, F) pairs of Tables 6.4-6.7 -> per scaled profile, the share of FedAvg's rounds to its
# target accuracy that K is set to (seed 004 §6.1.4's rule; fednilo_k.kick_off). Table
# 6.6's best configurations are 350/50, 400/50 and 500/75; the cpu profile runs the first and
# the last, K at 1/3 and 1/2 of FedAvg's rounds to its top level (the first cpu run's records:
# rounds 39, 50, 41, median 41: K = 14 and 21) and F = K x 50/350, K x 75/500. The comm
# budget is the seed's 1000 CR, which no run reaches: clients not seen since a freeze
# download the frozen layers once (§5.2.4), and 4 clients a round for 30 rounds after the
# freezes reach fewer of the 100 clients than the seed's 10 a round for 1,500 (a probe spent
# 0.13-0.5 CR a round after its last freeze, the seed's Table 6.2 0.002 once every client
# holds the frozen layers; a 30 CR budget stopped 500/75 at round 38 of 50).
_KF = {
    (350, 25): {"ci": claim_fednilo.THIRD},
    (350, 50): {"cpu": claim_fednilo.THIRD},
    (400, 25): {},
    (400, 50): {},
    (450, 50): {},
    (500, 50): {},
    (500, 75): {"cpu": claim_fednilo.HALF_},
}


FEDAVG = Experiment(
    "fednilo-iid-fedavg",
    protocol=(*_SEED004_IID, "grid.algorithms=[fedavg]"),
    scale={"cpu": _CPU, "ci": _CI},
)
CONFIGS = fednilo_k.configs("fednilo-iid", _SEED004_IID, _KF, _CPU, _CI, FEDAVG.name)
SAVING = 0.15  # below Table 6.6's lowest saving (17.9%); its average is 23.9%
_NAMES = tuple(e.name for e in CONFIGS)

CLAIM = Claim(
    id="fednilo-iid",
    title="On IID data FedNILO still needs at least 15% less traffic than FedAvg to reach the "
    "same 30-round-mean accuracy.",
    source="seed 004 Tables 6.6-6.7, §6.2.2 (homogeneous context)",
    paper=(
        "Cumulative GB to reach an ACC level (mean accuracy of the last 30 rounds), FedAvg vs "
        "FedNILO's best K/F, CIFAR-10 IID (Table 6.6): 80.5%: 33.26 vs 27.3 GB (17.9%, "
        "350/50), 81.0%: 41.16 vs 30.58 GB (25.7%, 400/50), 81.5%: 55.14 vs 39.64 GB (28.1%, "
        "500/75), average 23.9%; FedNILO reached no level above 81.5%. CIFAR-100 IID (Table "
        '6.7): 34.1-39.5%, average 34.87%. §6.2.2: "lower but still valid" savings on IID '
        "data."
    ),
    experiments=(FEDAVG, *CONFIGS),
    measure=partial(claim_fednilo.measure, fedavg=FEDAVG.name, configs=_NAMES, least=SAVING),
    rule=claim_fednilo.RULE.format(least="15%"),
    tolerance="Seed 004 gives one run per configuration; Table 6.6's savings are 17.9-28.1% "
    "(average 23.9%), 10 points apart between adjacent half-point levels, so 15% asks for a "
    "saving of the table's order, below its lowest level's, not its average. "
    + claim_fednilo.TOLERANCE,
    thresholds={
        "saving_percent": 100 * SAVING,
        "reach_points": claim_fednilo.REACH,
        "plateau_points": claim_fednilo.PLATEAU,
        "plateau_half": claim_fednilo.HALF,
        "learned_points": claim_fednilo.LEARNED,
        "k_share_low": claim_fednilo.THIRD,
        "k_share_high": claim_fednilo.HALF_,
    },
    window=claim_fednilo.WINDOW,
    plot=partial(claim_fednilo.plot, fedavg=FEDAVG.name, configs=_NAMES),
    scaled={
        "gpu": "The seed's protocol with an IID split and the seven K/F pairs of its grid, on "
        "FashionMNIST (60,000 images over 100 IID clients): CIFAR-10 is not available offline.",
        "cpu": "50 rounds instead of 2,000 on 5,000 images (50 per client, 500 test), the "
        "seed's 100 clients, E = 5 and B = 50, 4 clients per round instead of 10; the lr "
        "schedule compressed into the run (x 0.9231 per round: the last round's lr is 1.8% of "
        "the first, as at the seed's round 2,000) from lr 0.1 (the seed's 0.01 learned too "
        "little in a cpu run), so that FedAvg plateaus within the run (probe, seed 0: its ACC "
        "moved -0.18 points over the last 10 rounds), as the seed's does long before round "
        "2,000. K and F follow §6.1.4, read off FedAvg's records: K = 1/3 and 1/2 of the rounds "
        "FedAvg needed to first reach its top level (the first cpu run: 39, 50, 41, so 14 "
        "and 21), F = K x 50/350 and K x 75/500 (Table 6.6's first and last best pairs, "
        "350/50 and 500/75); the seed's comm budget of 1000 CR (never reached); ACC over a "
        "10-round window (30 of 50 rounds would average the rise itself). Against FedNILO: "
        "clients not seen since a freeze download the frozen layers once, and 4 clients a "
        "round reach fewer of the 100 than the seed's 10 a round over 1,500 rounds, so its "
        "rounds after the last freeze cost 0.13-0.5 CR here (probe), not Table 6.2's 0.002. "
        "About 10 minutes for 3 seeds (the records: 3.4, 2.8, 3.4 minutes).",
        "ci": "Smoke test: 3 rounds over 20 clients, K and F derived (1 and 1), a 2-round window.",
    },
    dropped=(
        Dropped(
            "cpu as now, K/F 13/2 and 20/3 set by hand from a one-seed probe, the old guard "
            "(FedAvg's ACC rising at most 0.5 points over its last 10 rounds)",
            "cannot say: FedNILO's best configuration saved 8.9-34.5% at every level on every "
            "seed (17-28% on average), but FedAvg's ACC still rose 1.44 and 0.58 points over "
            "its last 10 rounds on seeds 1 and 2 (-0.18 on seed 0)",
            "the guard sat under its own noise; K is now read off FedAvg's records",
        ),
    ),
)
