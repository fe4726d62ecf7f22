"""`fedapt reproduce`: each claim's verdict (a pure function of finished records) on
hand-made records: holds, does not hold, and missing experiments."""

from __future__ import annotations

from tasks.reproduce import claim_adapters
from tasks.reproduce.spec import ExperimentResult
from tasks.reproduce.verdict import combine
from tests.tasks.reproduce.support import MB, cell

# ---- claim 5: transformer adapters vs full fine-tuning --------------------------------------


# the transformer claim's rule tests: tests/tasks/reproduce/test_rules_s003.py (``transformer``
# of support.py: tests/tasks/reproduce/test_reproduce.py builds its hand-made report from it)


# ---- claims 6 and 7 (anytime, anytime-pa; train-time): tests/tasks/reproduce/test_rules_s001.py
# and tests/tasks/reproduce/test_rules_s003.py -------------------------------------------------------


# ---- over seeds: every seed on the holding side, none, or straddling -------------------------


def _seeds(values, guard=None):
    """Readings of one check "gap" (holds if <= 1.5) per seed, and a guard when given."""
    from tasks.reproduce.spec import Check, Reading

    out = []
    for s, v in enumerate(values):
        checks = [Check("gap", v, "<=", 1.5)]
        if guard is not None:
            checks.append(Check("learned", guard[s], ">=", 2, guard=True))
        out.append((s, Reading(tuple(checks))))
    return out


def test_seeds_hold_fail_or_straddle_by_the_interval():
    claim = claim_adapters.CLAIM
    v = combine(claim, _seeds([1.0, 1.1, 0.9]))  # mean 1.0, interval [0.75, 1.25]
    assert v.holds is True and "Over 3 seeds (0, 1, 2)" in v.text
    assert "| gap | <= 1.5 | 1.00 ± 0.10 | [0.75, 1.25] | 1.00, 1.10, 0.90 | holds |" in v.table
    v = combine(claim, _seeds([3.0, 3.5, 4.0]))
    assert v.holds is False and "'gap' lies on the other side" in v.text
    v = combine(claim, _seeds([1.0, 2.0, 1.2]))  # one seed across the threshold
    assert v.holds is None and "the interval of 'gap' straddles its threshold" in v.text
    assert v.more_seeds
    v = combine(claim, _seeds([1.0, 1.4, 0.2]))  # every seed below, the interval not
    assert v.holds is None and v.more_seeds
    v = combine(claim, _seeds([1.0, 1.0, 1.0], guard=[5, 1, 5]))
    assert v.holds is None and "the precondition 'learned'" in v.text
    v = combine(claim, _seeds([1.0, 1.0]))  # two of the three seeds a verdict needs
    assert v.holds is None and "Cannot say yet (2 of 3 seeds)" in v.text


def test_decide_reads_the_seeds_every_experiment_finished():
    from tasks.reproduce.verdict import decide

    claim = claim_adapters.CLAIM

    def dir05(seeds, gap):  # records of this rule, the class prior 10%, no base
        residual = cell(0.90 - gap / 100, per_round=MB // 9)
        cells = {"fedavg-full": cell(0.90), "fedavg-residual": residual}
        prior = dict.fromkeys(seeds, 0.1)
        rules = {claim.id: claim.rule_hash()}
        return ExperimentResult({}, {s: cells for s in seeds}, 1.0, prior, {}, rules)

    v = decide(claim, {"adapters-dir05": dir05([0, 1, 2], 1.0)}, ["adapters-dir05"], 3)
    assert v.holds is True and "Over 3 seeds" in v.text
    v = decide(claim, {"adapters-dir05": dir05([0, 1, 2], 3.0)}, ["adapters-dir05"], 3)
    assert v.holds is False
    assert decide(claim, {}, ["adapters-dir05"], 3).holds is None


def test_a_claim_with_no_verdict_yet_is_not_labelled_cannot_say():
    from tasks.reproduce.report import label
    from tasks.reproduce.verdict import Verdict

    assert label(
        Verdict(None, "not run yet: a, b (rerun `fedapt reproduce` to finish)"), "cpu"
    ) == ("not run yet")
    assert label(Verdict(None, "refused: a ran under another rule"), "cpu") == "refused"
    assert label(Verdict(None, "The interval straddles 0."), "cpu") == "cannot say"
    assert label(Verdict(True, "x"), "ci") == "holds (smoke test)"
