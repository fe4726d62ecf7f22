"""`fedapt reproduce`: the verdicts of the fednilo-iid, multitier and personalize claims on
hand-made records (holds, does not hold, cannot say), and their experiments typed in every
profile."""

from __future__ import annotations

from pathlib import Path

from tasks.reproduce import (
    claim_fednilo_iid,
    claim_multitier,
    claim_personalize,
    registry,
    runs,
)
from tasks.reproduce.spec import PROFILES, Cell
from tests.test_reproduce_verdicts import MB, cell, exp, judge

REPO = Path(__file__).resolve().parents[1]
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


# ---- multitier -----------------------------------------------------------------------------


def _tiers(lw, acc, majority=None):
    cells = {"fedavg-lw_linear": cell(exits=lw), "fedavg-accumulator": cell(exits=acc)}
    return {"multitier-exits": exp(cells, majority=majority)}


def test_multitier_every_exit():
    lw = [0.40, 0.45, 0.50]
    assert judge(claim_multitier.CLAIM, _tiers(lw, [0.41, 0.45, 0.60], 0.1)).holds is True
    assert judge(claim_multitier.CLAIM, _tiers(lw, [0.398, 0.45, 0.5], 0.1)).holds is True
    v = judge(claim_multitier.CLAIM, _tiers(lw, [0.55, 0.50, 0.45], 0.1))
    assert v.holds is False and "'exit 3: Accumulator - linear (points)'" in v.text


def test_multitier_note_says_whether_the_linear_lead_lasted():
    def curve(per_round):  # per evaluated round, the accuracy of each exit
        rounds = [
            {"round": i + 1, "accuracy": accs[-1],
             "extra": {f"test_accuracy_exit_{k}": a for k, a in enumerate(accs)}}
            for i, accs in enumerate(per_round)
        ]  # fmt: skip
        return Cell({"final_accuracy_exits": per_round[-1]}, rounds)

    cells = {
        "fedavg-lw_linear": curve([[0.5, 0.6], [0.5, 0.6], [0.5, 0.7]]),
        "fedavg-accumulator": curve([[0.6, 0.7], [0.6, 0.7], [0.6, 0.6]]),
    }
    v = judge(claim_multitier.CLAIM, {"multitier-exits": exp(cells, majority=0.1)})
    assert v.holds is False and "exit 2: linear 63.33 vs Accumulator 66.67" in v.text
    assert "(Accumulator 70.0 -> 70.0 -> 60.0)" in v.text


def test_multitier_cannot_say_at_the_class_prior_or_missing():
    v = judge(claim_multitier.CLAIM, _tiers([0.10, 0.11], [0.10, 0.10], 0.105))
    assert v.holds is None and "precondition" in v.text
    assert judge(claim_multitier.CLAIM, {}).holds is None
    assert (
        judge(
            claim_multitier.CLAIM, {"anytime-exits": _tiers([0.4], [0.5])["multitier-exits"]}
        ).holds
        is None
    )


# ---- personalize ---------------------------------------------------------------------------


def _scope(before, after):
    clients = [
        {"client": 0, "severity": 1, "accuracy_before": before, "accuracy_after": after},
        {"client": 1, "severity": 2, "accuracy_before": before, "accuracy_after": after},
    ]
    return {
        "mean_accuracy_before": before,
        "mean_accuracy_after": after,
        "mean_gain": after - before,
        "clients": clients,
    }


def _personal(lw, acc, token, majority=0.1):
    def with_p(p):
        c = cell(exits=[0.5, 0.6])
        return Cell({**c.record, "personalization": p}, c.rounds)

    cells = {
        "fedavg-lw_linear": with_p({"payload": _scope(0.3, lw)}),
        "fedavg-accumulator": with_p(
            {"payload": _scope(0.35, acc), "client_token": _scope(0.35, token)}
        ),
    }
    return {"multitier-exits": exp(cells, majority=majority)}


def test_personalize_holds_when_the_token_leads_and_the_accumulator_beats_linear():
    v = judge(claim_personalize.CLAIM, _personal(0.60, 0.62, 0.70))
    assert v.holds is True
    assert "| Accumulator: client token only | 35.00 | 70.00 | 35.00 |" in v.table
    assert judge(claim_personalize.CLAIM, _personal(0.60, 0.598, 0.596)).holds is True  # level


def test_personalize_fails_when_the_token_trails_or_linear_wins():
    v = judge(claim_personalize.CLAIM, _personal(0.60, 0.70, 0.62))
    assert v.holds is False and "'client token only - whole Accumulator (points)'" in v.text
    assert "client token only 35.00% -> 62.00%" in v.text  # the note says where each went
    v = judge(claim_personalize.CLAIM, _personal(0.70, 0.62, 0.65))
    assert v.holds is False and "L.W. linear" in v.text


def test_personalize_cannot_say_without_learning_or_records():
    v = judge(claim_personalize.CLAIM, _personal(0.10, 0.10, 0.11, majority=0.1))
    assert v.holds is None and "precondition" in v.text
    assert judge(claim_personalize.CLAIM, {}).holds is None
    plain = {"multitier-exits": exp({"fedavg-lw_linear": cell(), "fedavg-accumulator": cell()})}
    v = judge(claim_personalize.CLAIM, plain)
    assert v.holds is None and "personalize.enabled" in v.text


def test_the_plots_draw():
    assert claim_personalize.plot(_personal(0.6, 0.62, 0.7)) is not None
    assert claim_multitier.CLAIM.plot(_tiers([0.4, 0.5], [0.5, 0.6])) is not None
    assert claim_fednilo_iid.CLAIM.plot(_iid(PLATEAU, PLATEAU, MB)) is not None
    assert claim_personalize.plot({}) is None
