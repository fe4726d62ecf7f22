"""Seed 001's claims (the Accumulator: anytime, anytime + PA, multi-tier, personalization):
each rule on synthetic records over three seeds (holds, does not hold, cannot say), its
guards tripping, and the designs typed in every profile; and the records' starting model of
a base pretrained on some classes only."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from tasks.reproduce import (
    claim_anytime,
    claim_multitier,
    claim_personalize,
    records,
    registry,
    runs,
)
from tasks.reproduce.spec import Cell, Claim, ExperimentResult
from tasks.reproduce.verdict import decide

REPO = Path(__file__).resolve().parents[3]
SEEDS = (0, 1, 2)
ROUNDS = 30  # evaluations per synthetic curve (more than any window)


def exit_cell(levels: list[float], tail: list[list[float]] | None = None) -> Cell:
    """A cell whose exit ``k`` reads ``levels[k]`` at every evaluation, then the per-exit
    accuracies of ``tail`` (one list per evaluation) at the last ones; ``accuracy`` (the
    inference exit) is the last exit's."""
    evals = [levels] * (ROUNDS - len(tail or [])) + list(tail or [])
    rounds = [
        {
            "round": i + 1,
            "accuracy": accs[-1],
            "extra": {f"test_accuracy_exit_{k}": a for k, a in enumerate(accs)},
        }
        for i, accs in enumerate(evals)
    ]
    return Cell({"final_accuracy_exits": list(evals[-1]), "final_accuracy": evals[-1][-1]}, rounds)


def shift(levels: list[float], points: float) -> list[float]:
    return [a + points / 100 for a in levels]


def experiment(claim: Claim, per_seed: dict[int, dict[str, Cell]], base: float = 0.40):
    """A finished experiment of ``claim`` whose cells are ``per_seed[seed]``, its base at
    ``base`` on every seed, stamped with the claim's rule."""
    return ExperimentResult(
        {},
        per_seed,
        60.0,
        {s: 0.1 for s in per_seed},
        {s: base for s in per_seed},
        {claim.id: claim.rule_hash()},
    )


LINEAR = [0.50, 0.60, 0.70]  # headroom: 70 - 60 = 10 points
ACCUMULATOR = [0.60, 0.68, 0.75]
# (claim, experiment, linear cell, accumulator cell)
EXIT_CLAIMS = (
    (claim_anytime.CLAIM, "anytime-exits", "fedavg-lw_linear", "fedavg-accumulator"),
    (registry.ANYTIME_PA, "anytime-exits-pa", "fedavg-lw_linear_pa", "fedavg-accumulator_pa"),
    (claim_multitier.CLAIM, "multitier-exits", "fedavg-lw_linear", "fedavg-accumulator"),
)


def exits_verdict(which, lw, acc, base=0.40, seeds=SEEDS):
    """The verdict of an exit claim when seed ``s`` has linear exits ``lw(s)`` and
    Accumulator exits ``acc(s)``."""
    claim, name, lin, accu = which
    cells = {s: {lin: exit_cell(lw(s)), accu: exit_cell(acc(s))} for s in seeds}
    return decide(claim, {name: experiment(claim, cells, base)}, [name], 3)


@pytest.mark.parametrize("which", EXIT_CLAIMS, ids=lambda w: w[0].id)
def test_exit_claims_hold_fail_and_straddle_over_three_seeds(which):
    jitter = {0: 0.0, 1: 0.5, 2: -0.5}
    v = exits_verdict(which, lambda s: LINEAR, lambda s: shift(ACCUMULATOR, jitter[s]))
    assert v.holds is True, v.text
    assert v.seeds == 3 and "| exit 1: Accumulator - linear (points) | >= -2 |" in v.table
    # the linear heads lead at exit 1 by 5 points on every seed
    behind = [0.45, 0.68, 0.75]
    v = exits_verdict(which, lambda s: LINEAR, lambda s: shift(behind, jitter[s]))
    assert v.holds is False and "'exit 1: Accumulator - linear (points)'" in v.text
    assert "The linear heads lead by more than 2 points at exit(s) 1" in v.text
    # exit 1's paired difference is -6, +3, 0 points: its interval straddles -2
    first = {0: 0.44, 1: 0.53, 2: 0.50}
    v = exits_verdict(which, lambda s: LINEAR, lambda s: [first[s], 0.68, 0.75])
    assert v.holds is None and "straddles" in v.text and v.more_seeds


@pytest.mark.parametrize("which", EXIT_CLAIMS, ids=lambda w: w[0].id)
def test_exit_claims_cannot_say_without_headroom_or_learning(which):
    # linear exits all within a point of each other: the driver is absent, whatever the gaps
    flat = [0.70, 0.705, 0.71]
    v = exits_verdict(which, lambda s: flat, lambda s: [0.71, 0.715, 0.72])
    assert v.holds is None and "the precondition 'headroom" in v.text
    assert "Driver absent: the linear heads' last exit is 0.50 points above" in v.text
    # also when the Accumulator trails badly: the comparison is not read without the driver
    assert exits_verdict(which, lambda s: flat, lambda s: [0.5, 0.5, 0.5]).holds is None
    # both end below the pretrained base's own accuracy: nothing learned
    v = exits_verdict(which, lambda s: LINEAR, lambda s: ACCUMULATOR, base=0.80)
    assert v.holds is None
    assert "'L.W. linear: last exit above the starting model (points)'" in v.text
    assert "'Accumulator: last exit above the starting model (points)'" in v.text
    # without a base the class prior (0.1) is the start: both learned
    assert exits_verdict(which, lambda s: LINEAR, lambda s: ACCUMULATOR, base=None).holds


def test_exit_levels_are_window_means_not_the_last_evaluation():
    """One bad last evaluation (the linear heads swung by up to 19 points between
    evaluations in the cpu records) does not decide: the window's mean does."""
    claim, name, lin, accu = EXIT_CLAIMS[0]
    dip = [[0.30, 0.40, 0.50]]  # the Accumulator's last evaluation only
    cells = {s: {lin: exit_cell(LINEAR), accu: exit_cell(ACCUMULATOR, dip)} for s in SEEDS}
    v = decide(claim, {name: experiment(claim, cells)}, [name], 3)
    assert v.holds is True, v.text  # exit 1: (9 x 60 + 30) / 10 = 57 > 50 - 2
    levels = claim_anytime.exit_levels(cells[0][accu], claim_anytime.WINDOW)
    assert levels == pytest.approx([0.57, 0.652, 0.725])
    assert claim.window == claim_anytime.WINDOW == 10


def test_exit_claims_missing_cells_or_curves():
    claim, name, lin, accu = EXIT_CLAIMS[0]
    assert decide(claim, {}, [name], 3).holds is None
    no_curves = {s: {lin: Cell({"final_accuracy_exits": [0.5]}), accu: exit_cell([0.6])}
                 for s in SEEDS}  # fmt: skip
    v = decide(claim, {name: experiment(claim, no_curves)}, [name], 3)
    assert v.holds is None and "no per-exit accuracies per round" in v.text
    # the plain claim's cells do not count for "+ PA"
    pa = EXIT_CLAIMS[1][0]
    plain = {s: {lin: exit_cell(LINEAR), accu: exit_cell(ACCUMULATOR)} for s in SEEDS}
    v = decide(pa, {"anytime-exits-pa": experiment(pa, plain)}, ["anytime-exits-pa"], 3)
    assert v.holds is None and "has no cells fedavg-lw_linear_pa" in v.text


def test_exit_claims_thresholds_are_hashed_and_the_dropped_design_is_kept():
    for claim, *_ in EXIT_CLAIMS:
        assert dict(claim.thresholds) == {"tolerance": 2.0, "learned": 2.0, "headroom": 5.0}
        assert claim_anytime.IN_DOMAIN in claim.dropped or claim.dropped == (
            claim_multitier.IN_DOMAIN,
        )
        assert "likely cause" not in claim.tolerance + claim.rule
    changed = dataclasses.replace(claim_anytime.CLAIM, thresholds={"headroom": 4.0})
    assert changed.rule_hash() != claim_anytime.CLAIM.rule_hash()
    assert "Accumulator + PA minus the layer-wise linear heads + PA" in registry.ANYTIME_PA.rule


def test_the_committed_in_domain_records_read_driver_absent():
    """The measurement behind the dropped design: the cpu records of 2026-11-27 (a base of
    all ten classes; retired with the earlier rules, kept trimmed under tests/fixtures/retired)
    give 'cannot say' on the headroom and learned guards."""
    for rec, claim, name in (
        ("cpu-anytime-exits", claim_anytime.CLAIM, "anytime-exits"),
        ("cpu-multitier-exits", claim_multitier.CLAIM, "multitier-exits"),
    ):
        path = REPO / "tests" / "fixtures" / "retired" / f"{rec}.json"
        result = records.result(json.loads(path.read_text()))
        stamped = ExperimentResult(
            result.params, result.runs, result.seconds, result.majorities, result.bases,
            {claim.id: claim.rule_hash()},
        )  # fmt: skip
        v = decide(claim, {name: stamped}, [name], 3)
        assert v.holds is None and "the precondition" in v.text and "'headroom" in v.text


def plan(ids, profile):
    return runs.plan(registry.select(ids), profile, REPO / "params.yaml")


def test_the_designs_typed_in_every_profile():
    ids = ["anytime", "anytime-pa", "multitier", "personalize"]
    for profile in ("ci", "cpu", "gpu"):
        items = {it.experiment.name: it.params for it in plan(ids, profile)}
        assert {"anytime-exits", "anytime-exits-pa", "multitier-exits"} <= set(items)
    cpu = {it.experiment.name: it.params for it in plan(ids, "cpu")}
    for name in ("anytime-exits", "anytime-exits-pa", "multitier-exits"):
        p = cpu[name]
        assert tuple(p.pretrain.classes) == (5, 6, 7, 8, 9)  # a base out of domain
        assert (p.federation.rounds, p.federation.eval_every) == (150, 3)
        assert p.federation.rounds // p.federation.eval_every >= claim_anytime.WINDOW
    assert cpu["multitier-exits"].personalize.enabled
    gpu = {it.experiment.name: it.params for it in plan(ids, "gpu")}
    assert tuple(gpu["multitier-exits"].pretrain.classes) == (5, 6, 7, 8, 9)
    assert gpu["anytime-exits"].model.name == "minilm"


# ---- personalize ---------------------------------------------------------------------------


def scope(before: float, after: float) -> dict:
    clients = [
        {"client": c, "severity": c + 1, "accuracy_before": before, "accuracy_after": after}
        for c in range(2)
    ]
    return {
        "mean_accuracy_before": before,
        "mean_accuracy_after": after,
        "mean_gain": after - before,
        "clients": clients,
    }


def personalized(lw: tuple[float, float], acc: tuple[float, float], token: float) -> dict:
    """One seed's cells: (before, after) of the linear heads and of the whole Accumulator;
    the client token starts where the whole Accumulator does (the same model)."""

    def with_p(p):
        c = exit_cell(LINEAR)
        return Cell({**c.record, "personalization": p}, c.rounds)

    return {
        "fedavg-lw_linear": with_p({"payload": scope(*lw)}),
        "fedavg-accumulator": with_p(
            {"payload": scope(*acc), "client_token": scope(acc[0], token)}
        ),
    }


def personalize_verdict(per_seed):
    claim = claim_personalize.CLAIM
    name = claim_multitier.EXITS.name
    return decide(claim, {name: experiment(claim, per_seed)}, [name], 3)


def test_personalize_holds_fails_and_straddles_over_three_seeds():
    jitter = {0: 0.0, 1: 0.01, 2: -0.01}
    v = personalize_verdict(
        {s: personalized((0.30, 0.35), (0.35, 0.42 + jitter[s]), 0.50) for s in SEEDS}
    )
    assert v.holds is True, v.text
    assert "| Accumulator: client token only | 35.00 | 50.00 | 15.00 |" in v.table
    # the token ends 5 points below the whole Accumulator on every seed
    v = personalize_verdict(
        {s: personalized((0.30, 0.35), (0.35, 0.50 + jitter[s]), 0.45) for s in SEEDS}
    )
    assert v.holds is False and "'client token only - whole Accumulator, after (points)'" in v.text
    assert "client token only 35.00% -> 45.00%" in v.text  # the note says where each went
    # the linear heads gain 15 points, the Accumulator 6: it ends above them only because it
    # started above them, which the gain check does not count
    v = personalize_verdict(
        {s: personalized((0.30, 0.45), (0.45, 0.51 + jitter[s]), 0.58) for s in SEEDS}
    )
    assert v.holds is False and "'Accumulator's gain - L.W. linear's gain (points)'" in v.text
    # the token's lead is +8, -6, +1 points: straddles -2 (every gain well above 2)
    lead = {0: 0.08, 1: -0.06, 2: 0.01}
    v = personalize_verdict(
        {s: personalized((0.30, 0.35), (0.35, 0.65), 0.65 + lead[s]) for s in SEEDS}
    )
    assert v.holds is None and "straddles" in v.text and v.more_seeds


def test_personalize_guard_is_the_gain_over_no_fine_tuning():
    """A model that is good before fine-tuning (as every FL model here is) no longer passes:
    each fine-tuning must beat the same model without it on the same test halves."""
    # the Accumulator leads the linear heads after fine-tuning, but nothing gained anything
    v = personalize_verdict({s: personalized((0.70, 0.70), (0.75, 0.75), 0.755) for s in SEEDS})
    assert v.holds is None and "the precondition" in v.text
    assert "'L.W. linear: the heads: gain over no fine-tuning (points)'" in v.text
    # one of the three lost accuracy by fine-tuning (the cpu records' linear heads did)
    v = personalize_verdict({s: personalized((0.74, 0.71), (0.35, 0.45), 0.50) for s in SEEDS})
    assert v.holds is None and "'L.W. linear: the heads: gain over no fine-tuning" in v.text


def test_personalize_missing_records_or_scopes():
    claim = claim_personalize.CLAIM
    name = claim_multitier.EXITS.name
    assert decide(claim, {}, [name], 3).holds is None
    plain = {s: {"fedavg-lw_linear": exit_cell(LINEAR), "fedavg-accumulator": exit_cell(LINEAR)}
             for s in SEEDS}  # fmt: skip
    v = decide(claim, {name: experiment(claim, plain)}, [name], 3)
    assert v.holds is None and "personalize.enabled" in v.text
    assert dict(claim.thresholds) == {"tolerance": 2.0, "learned": 2.0} and claim.window == 1


def test_the_plots_draw():
    claim, name, lin, accu = EXIT_CLAIMS[0]
    r = {name: experiment(claim, {0: {lin: exit_cell(LINEAR), accu: exit_cell(ACCUMULATOR)}})}
    assert claim_anytime.plot(r) is not None
    mt = {
        claim_multitier.EXITS.name: experiment(
            claim, {0: personalized((0.3, 0.4), (0.3, 0.5), 0.6)}
        )
    }
    assert claim_multitier.CLAIM.plot(mt) is not None
    assert claim_personalize.plot(mt) is not None
    assert claim_personalize.plot({}) is None


# ---- the starting model of a base pretrained on some classes -----------------------------


def _card(tmp: Path, card: dict, num_classes: int = 10) -> Path:
    (tmp / "pretrain").mkdir(parents=True)
    (tmp / "pretrain" / "base.json").write_text(json.dumps(card))
    (tmp / "partition").mkdir()
    (tmp / "partition" / "stats.json").write_text(
        json.dumps({"num_classes": num_classes, "label_totals": [1] * num_classes})
    )
    return tmp


def test_base_accuracy_is_on_the_federations_test_rows(tmp_path):
    """A base of classes 5-9 was tested on the federation's test rows of those classes: on
    all of them it scores that times their share (the others count as wrong)."""
    source = {"dataset": "fashion_mnist", "classes": [5, 6, 7, 8, 9], "test_rows": 1012}
    d = _card(tmp_path / "a", {"used": True, "final_test_accuracy": 0.6, "source": source})
    params = {"data.dataset": "fashion_mnist", "data.test_subset": 2000}
    assert records._base_accuracy(d, params) == pytest.approx(0.6 * 1012 / 2000)
    # the whole test split (no subset): the classes' share of the partition's classes
    assert records._base_accuracy(d, {"data.dataset": "fashion_mnist"}) == pytest.approx(0.3)
    # a base of every class: its card as it is
    every = {**source, "classes": "all"}
    d = _card(tmp_path / "b", {"used": True, "final_test_accuracy": 0.8, "source": every})
    assert records._base_accuracy(d, params) == pytest.approx(0.8)
    # a base of another dataset has no accuracy on the federation's rows: the class prior stands in
    other = {**every, "dataset": "mnist"}
    d = _card(tmp_path / "c", {"used": True, "final_test_accuracy": 0.9, "source": other})
    assert records._base_accuracy(d, params) is None
    d = _card(tmp_path / "d", {"used": False, "final_test_accuracy": 0.9, "source": every})
    assert records._base_accuracy(d, params) is None
