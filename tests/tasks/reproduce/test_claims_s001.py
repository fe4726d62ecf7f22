"""`fedapt reproduce`: the verdicts of the fednilo-iid claim on hand-made records (holds, does
not hold, cannot say), and its experiments (with the multitier and personalize claims', whose
rules are tested in tests/tasks/reproduce/test_rules_s001.py) typed in every profile."""

from __future__ import annotations

from pathlib import Path

from tasks.reproduce import (
    claim_fednilo_iid,
    registry,
    runs,
)
from tasks.reproduce.spec import PROFILES
from tests.tasks.reproduce.support import MB, cell, exp

REPO = Path(__file__).resolve().parents[3]
IDS = ["fednilo-iid", "multitier", "personalize"]


def test_the_claims_type_in_every_profile():
    for profile in PROFILES:
        items = runs.plan(registry.select(IDS), profile, REPO / "params.yaml")
        names = {it.experiment.name: it.params for it in items}
        assert "multitier-exits" in names  # owned by multitier, read by personalize
        assert "fednilo-iid-fedavg" in names
        mt = names["multitier-exits"]
        assert mt.model.name == "vit_small" and mt.personalize.enabled
        assert mt.grid.adapter("accumulator").options.exits == "multitier"
        assert names["fednilo-iid-fedavg"].partition.scheme == "iid"
    gpu = {it.experiment.name: it.params for it in runs.plan(registry.select(IDS), "gpu")}
    assert len([n for n in gpu if n.startswith("fednilo-iid-k")]) == 7
    assert gpu["fednilo-iid-k350f50"].grid.algorithm("fednilo").K == 350
    assert gpu["multitier-exits"].model.options.depth == 12
    cpu = {it.experiment.name: it.params for it in runs.plan(registry.select(IDS), "cpu")}
    assert sorted(n for n in cpu if n.startswith("fednilo-iid-k")) == [
        "fednilo-iid-k350f50",
        "fednilo-iid-k500f75",
    ]
    assert cpu["multitier-exits"].model.options.embed_dim == 128
    assert cpu["multitier-exits"].personalize.max_clients == 30


# ---- fednilo-iid ---------------------------------------------------------------------------

PLATEAU = [0.5, 0.6, 0.7, 0.8, 0.8, 0.8, 0.8]  # window 2: flat over the last 2 rounds


def _iid(fedavg_accs, nilo_accs, nilo_per_round, config="fednilo-iid-k350f50"):
    w = {"report.window": 2}
    return {
        "fednilo-iid-fedavg": exp({"fedavg-full": cell(accs=fedavg_accs, per_round=10 * MB)}, **w),
        config: exp({"fednilo-full": cell(accs=nilo_accs, per_round=nilo_per_round)}, **w),
    }


def test_the_plots_draw():
    assert claim_fednilo_iid.CLAIM.plot(_iid(PLATEAU, PLATEAU, MB)) is not None
