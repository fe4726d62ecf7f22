"""`fedapt reproduce`: each claim's verdict (a pure function of finished records) on
hand-made records: holds, does not hold, and missing experiments."""

from __future__ import annotations

import pytest

from tasks.reproduce import (
    claim_adapters,
    claim_fednilo,
    claim_label_skew,
    claim_server_opt,
    claim_transformer,
)
from tasks.reproduce.spec import Cell, ExperimentResult
from tasks.reproduce.verdict import combine

MB = 2**20


def cell(acc=0.5, accs=None, per_round=MB, seconds=1.0, exits=None):
    """A finished cell: ``accs`` per round (fractions), ``per_round`` bytes each way."""
    accs = [acc] if accs is None else accs
    rounds = [
        {
            "round": i + 1,
            "accuracy": a,
            "cum_upload_bytes": per_round * (i + 1),
            "cum_download_bytes": per_round * (i + 1),
        }
        for i, a in enumerate(accs)
    ]
    record = {
        "final_accuracy": accs[-1],
        "upload_bytes_per_round": per_round,
        "download_bytes_per_round": per_round,
        "upload_bytes": per_round * len(accs),
        "download_bytes": per_round * len(accs),
        "local_train_seconds_mean": seconds,
        "final_accuracy_exits": exits or [],
    }
    return Cell(record, rounds)


def exp(cells, majority=None, **params):
    return ExperimentResult(params, {0: cells}, 60.0, {0: majority})


def judge(claim, results):
    """The claim's verdict on one seed's results (its rule, decided as over seeds)."""
    return combine(claim, [(0, claim.measure(results))], min_seeds=1)


# ---- claim 1: residual adapters vs full under Dir(0.5) ------------------------------------


def test_adapters_holds_within_a_point_at_a_ninth():
    r = {
        "adapters-dir05": exp(
            {
                "fedavg-full": cell(0.94, per_round=9 * MB),
                "fedavg-residual": cell(0.93, per_round=MB),
            }
        )
    }
    v = judge(claim_adapters.CLAIM, r)
    assert v.holds is True and "1/9.00" in v.table and "| 1.00 |" in v.table


def test_adapters_fails_on_a_large_gap_or_no_saving():
    far = {"fedavg-full": cell(0.94, per_round=9 * MB), "fedavg-residual": cell(0.90, per_round=MB)}
    assert judge(claim_adapters.CLAIM, {"adapters-dir05": exp(far)}).holds is False
    same = {"fedavg-full": cell(0.94, per_round=MB), "fedavg-residual": cell(0.94, per_round=MB)}
    assert judge(claim_adapters.CLAIM, {"adapters-dir05": exp(same)}).holds is False


def test_adapters_missing():
    v = judge(claim_adapters.CLAIM, {})
    assert v.holds is None and "adapters-dir05" in v.text


# ---- claim 2: #M = 1 collapses, #M = 3 learns ---------------------------------------------


def test_label_skew_holds_and_fails():
    m1 = exp({"fedavg-full": cell(0.18), "fedavg-residual": cell(0.17)})
    m3 = exp({"fedavg-full": cell(0.70), "fedavg-residual": cell(0.66)})
    assert judge(claim_label_skew.CLAIM, {"label-skew-m1": m1, "label-skew-m3": m3}).holds is True
    m1_learns = exp({"fedavg-full": cell(0.55), "fedavg-residual": cell(0.17)})
    v = judge(claim_label_skew.CLAIM, {"label-skew-m1": m1_learns, "label-skew-m3": m3})
    assert v.holds is False and "Does not hold: 'fedavg-full: #M=1 acc %'" in v.text
    v = judge(claim_label_skew.CLAIM, {"label-skew-m1": m1})
    assert v.holds is None and "label-skew-m3" in v.text


# ---- claim 3: FedNILO traffic to FedAvg's ACC levels ---------------------------------------


def _nilo(per_round, accs):
    return exp({"fednilo-full": cell(accs=accs, per_round=per_round)}, **{"report.window": 2})


def test_fednilo_levels_are_half_points_below_fedavgs_best():
    assert claim_fednilo.levels(0.7537) == [0.73, 0.735, 0.74, 0.745, 0.75]


def test_fednilo_holds_when_it_reaches_the_levels_for_less():
    accs = [0.5, 0.6, 0.7, 0.8, 0.8, 0.8, 0.8]  # window 2: FedAvg level over its last 2 rounds
    base = exp({"fedavg-full": cell(accs=accs, per_round=10 * MB)}, **{"report.window": 2})
    r = {"fednilo-fedavg": base, "fednilo-k350f25": _nilo(5 * MB, accs)}
    v = judge(claim_fednilo.CLAIM, r)
    assert v.holds is True and "| mean saving (%) | >= 30 | 50.00 |" in v.table  # half the bytes


def test_fednilo_fails_when_it_saves_less_or_never_reaches():
    accs = [0.5, 0.6, 0.7, 0.8, 0.8, 0.8, 0.8]
    base = exp({"fedavg-full": cell(accs=accs, per_round=10 * MB)}, **{"report.window": 2})
    v = judge(claim_fednilo.CLAIM, {"fednilo-fedavg": base, "fednilo-k350f25": _nilo(8 * MB, accs)})
    assert v.holds is False and "| mean saving (%) | >= 30 | 20.00 |" in v.table
    low = _nilo(MB, [0.3] * 7)
    v = judge(claim_fednilo.CLAIM, {"fednilo-fedavg": base, "fednilo-k500f75": low})
    assert v.holds is False and "none" in v.text and "its best ACC" in v.text and "30.00%" in v.text
    assert "not reached" in v.table


def test_fednilo_cannot_say_while_fedavg_still_rises():
    rising = [0.5, 0.6, 0.7, 0.8, 0.9]  # +20 points over the last 2 rounds (the window)
    base = exp({"fedavg-full": cell(accs=rising, per_round=10 * MB)}, **{"report.window": 2})
    v = judge(claim_fednilo.CLAIM, {"fednilo-fedavg": base, "fednilo-k350f25": _nilo(MB, rising)})
    assert v.holds is None and "precondition" in v.text and "still" not in v.table


def test_fednilo_missing():
    assert judge(claim_fednilo.CLAIM, {}).holds is None
    base = exp({"fedavg-full": cell(accs=[0.5, 0.6])}, **{"report.window": 2})
    assert judge(claim_fednilo.CLAIM, {"fednilo-fedavg": base}).holds is None


# ---- claim 4: server optimisers' round-to-round variance -----------------------------------


def test_server_opt_variance_decides():
    jumpy = cell(accs=[0.5, 0.6, 0.4, 0.7, 0.3, 0.7, 0.4, 0.62])
    smooth = cell(accs=[0.5, 0.52, 0.54, 0.56, 0.57, 0.59, 0.60, 0.62])
    r = {
        "server-opt-lenet5": exp(
            {"fedavg-full": jumpy, "fedadam-full": smooth, "fedadagrad-full": smooth}
        )
    }
    assert judge(claim_server_opt.CLAIM, r).holds is True
    steady = cell(accs=[0.5 + 0.01 * i for i in range(8)])  # equal steps: variance 0
    r = {
        "server-opt-lenet5": exp(
            {"fedavg-full": smooth, "fedadam-full": jumpy, "fedadagrad-full": steady}
        )
    }
    v = judge(claim_server_opt.CLAIM, r)
    assert v.holds is False and "Does not hold: 'lenet5 fedadam: variance / FedAvg's'" in v.text
    assert judge(claim_server_opt.CLAIM, {}).holds is None
    # steadier but ending well below FedAvg: slower learning, not steadier training
    slow = cell(accs=[0.30, 0.31, 0.32, 0.33, 0.34, 0.35, 0.36, 0.37])
    r = {"server-opt-lenet5": exp({"fedavg-full": jumpy, "fedadam-full": slow})}
    v = judge(claim_server_opt.CLAIM, r)
    assert v.holds is False and "'lenet5 fedadam: final acc below FedAvg (points)'" in v.text


def test_step_variance_by_hand():
    from tasks.reproduce.measures import step_variance

    # last half of [50, 60, 40, 70, 80, 75], at least 3 rounds: [70, 80, 75] -> steps 10, -5
    assert step_variance(cell(accs=[0.5, 0.6, 0.4, 0.7, 0.8, 0.75])) == pytest.approx(56.25)
    # [50, 60, 40, 70]: the last 3 rounds -> steps -20, 30; all rounds -> 10, -20, 30
    assert step_variance(cell(accs=[0.5, 0.6, 0.4, 0.7])) == pytest.approx(625.0)
    whole = step_variance(cell(accs=[0.5, 0.6, 0.4, 0.7]), tail=1.0)
    assert whole == pytest.approx(
        ((10 - 20 / 3) ** 2 + (-20 - 20 / 3) ** 2 + (30 - 20 / 3) ** 2) / 3
    )
    assert step_variance(cell(accs=[0.5, 0.6])) is None


# ---- claim 5: transformer adapters vs full fine-tuning --------------------------------------


def _transformer(adapter_acc, head_acc, share=0.01):
    full = exp({"fedavg-full": cell(0.62, per_round=100 * MB)})
    cells = {
        f"fedavg-{m}": cell(adapter_acc, per_round=int(100 * MB * share))
        for m in claim_transformer.METHODS
    }
    cells["fedavg-head"] = cell(head_acc, per_round=MB // 100)
    return {"transformer-full": full, "transformer-adapters": exp(cells)}


# the transformer claim's rule tests: tests/test_reproduce_rules_s003.py (``_transformer``
# above stays: tests/test_reproduce.py builds its hand-made report from it)


# ---- claims 6 and 7 (anytime, anytime-pa; train-time): tests/test_reproduce_rules_s001.py
# and tests/test_reproduce_rules_s003.py -------------------------------------------------------


# ---- over seeds: every seed on the holding side, none, or straddling -------------------------


def _seeds(values, guard=None):
    """Readings of one check "gap" (holds if <= 1.5) per seed, and a guard when given."""
    from tasks.reproduce.spec import Check, Reading

    out = []
    for s, v in enumerate(values):
        checks = [Check("gap", v, v <= 1.5, "<= 1.5")]
        if guard is not None:
            checks.append(Check("learned", guard[s], guard[s] >= 2, ">= 2", guard=True))
        out.append((s, Reading(tuple(checks))))
    return out


def test_seeds_hold_fail_or_straddle():
    claim = claim_adapters.CLAIM
    v = combine(claim, _seeds([1.0, 1.2, 0.8]))
    assert v.holds is True and "Over 3 seeds (0, 1, 2)" in v.text
    assert "| gap | <= 1.5 | 1.00 ± 0.20 | 1.00, 1.20, 0.80 | 3 of 3 |" in v.table
    v = combine(claim, _seeds([2.0, 2.5, 3.0]))
    assert v.holds is False and "fails on every seed" in v.text
    v = combine(claim, _seeds([1.0, 2.0, 1.2]))  # one seed across the threshold
    assert v.holds is None and "the seeds straddle the threshold of 'gap'" in v.text
    v = combine(claim, _seeds([1.0, 1.0, 1.0], guard=[5, 1, 5]))
    assert v.holds is None and "the precondition 'learned'" in v.text
    v = combine(claim, _seeds([1.0, 1.0]))  # two of the three seeds a verdict needs
    assert v.holds is None and "Cannot say yet (2 of 3 seeds)" in v.text


def test_decide_reads_the_seeds_every_experiment_finished():
    from tasks.reproduce.spec import ExperimentResult
    from tasks.reproduce.verdict import decide

    def dir05(seeds, gap):
        residual = cell(0.90 - gap / 100, per_round=MB // 9)
        cells = {"fedavg-full": cell(0.90), "fedavg-residual": residual}
        return ExperimentResult({}, {s: cells for s in seeds}, 1.0, {})

    claim = claim_adapters.CLAIM
    v = decide(claim, {"adapters-dir05": dir05([0, 1, 2], 1.0)}, ["adapters-dir05"], 3)
    assert v.holds is True and "Over 3 seeds" in v.text
    v = decide(claim, {"adapters-dir05": dir05([0, 1, 2], 3.0)}, ["adapters-dir05"], 3)
    assert v.holds is False
    assert decide(claim, {}, ["adapters-dir05"], 3).holds is None
