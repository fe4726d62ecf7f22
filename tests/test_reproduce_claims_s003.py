"""`fedapt reproduce`, the Shakespeare next-word claim (seed 003 Tables 4, 8 and 12): its
verdict on hand-made results (holds, does not hold, cannot say) and its experiments typed in
every profile."""

from __future__ import annotations

from pathlib import Path

from tasks.reproduce import claim_shakespeare as shk
from tasks.reproduce import claim_train_time, registry, runs
from tasks.reproduce.spec import Cell, ExperimentResult
from tasks.reproduce.verdict import combine, decide
from tests.test_reproduce_verdicts import MB, cell, judge

REPO = Path(__file__).resolve().parents[1]
FULL_MB = 45 * MB  # gpt2_small: 9 clients x 5.06 MiB each way


def _exp(cells, base):
    return ExperimentResult({}, {0: cells}, 60.0, {0: None}, {0: base})


def _last(acc, per_round, seconds=1.0):
    """A cell whose mean over the last L rounds is ``acc`` (its final round 0.5 points lower:
    the rule reads the mean)."""
    c = cell(acc - 0.005, per_round=per_round, seconds=seconds)
    return Cell({**c.record, "mean_accuracy_last_L": acc}, c.rounds)


def results(full, adapters, base=0.155, iid=True, share=(0.015, 0.008, 0.013)):
    """Results of the claim's experiments: ``adapters`` (houlsby, pfeiffer, lora) accuracies,
    their payload a ``share`` of full's, both partitions alike (non-IID only if not ``iid``)."""
    ad_cells = {
        f"fedavg-{m}": _last(a, int(s * FULL_MB), seconds=0.6)
        for m, a, s in zip(shk.METHODS, adapters, share, strict=True)
    }
    full_cells = {"fedavg-full": _last(full, FULL_MB)}
    out = {
        shk.FULL.name: _exp(full_cells, base),
        shk.ADAPTERS.name: _exp(ad_cells, base),
    }
    if iid:
        out[shk.IID_FULL.name] = _exp(full_cells, base)
        out[shk.IID_ADAPTERS.name] = _exp(ad_cells, base)
    return out


def test_holds_when_the_adapters_are_within_a_point_at_two_percent():
    # Table 4's picture shifted onto a base at 15.5%: full +6 points, adapters -0.7..+0.7
    v = judge(shk.CLAIM, results(0.215, (0.212, 0.222, 0.208)))
    assert v.holds is True, v.text
    assert (
        "| non-IID | base | 15.50 |" in v.table
        and "| IID | lora | 20.80 | 5.30 | 0.70 |" in v.table
    )
    assert "full gains 6.00 points over the base" in v.text


def test_does_not_hold_when_an_adapter_falls_behind_or_sends_too_much():
    v = judge(shk.CLAIM, results(0.215, (0.212, 0.222, 0.19)))
    assert v.holds is False and "'non-IID: lora below full (points)'" in v.text
    v = judge(shk.CLAIM, results(0.215, (0.212, 0.222, 0.21), share=(0.03, 0.008, 0.013)))
    assert v.holds is False and "houlsby share of full's bytes" in v.text


def test_cannot_say_when_fine_tuning_taught_the_base_nothing():
    """Everything ties at the base (as fedapt's runs on the held-out-plays base did): the gap
    checks hold vacuously, the guard says the run cannot decide, and the note says why."""
    v = judge(shk.CLAIM, results(0.156, (0.155, 0.157, 0.154)))
    assert v.holds is None and "precondition 'non-IID: full above the pretrained base" in v.text
    assert "full fine-tuning ends 0.10 points above the pretrained base (15.50%)" in v.text
    # an unknown base accuracy (no card) cannot pass the guard either
    assert judge(shk.CLAIM, results(0.215, (0.212, 0.222, 0.208), base=None)).holds is None


def test_seeds_that_straddle_the_gap_cannot_say():
    good = shk.CLAIM.measure(results(0.215, (0.212, 0.222, 0.208)))
    bad = shk.CLAIM.measure(results(0.215, (0.212, 0.222, 0.19)))
    v = combine(shk.CLAIM, [(0, good), (1, bad), (2, good)])
    assert v.holds is None and "straddle" in v.text and "lora below full" in v.text


def test_non_iid_alone_where_the_profile_runs_only_it_and_missing_experiments():
    r = results(0.215, (0.212, 0.222, 0.208), iid=False)
    v = judge(shk.CLAIM, r)
    assert v.holds is True and "IID:" not in v.text.replace("non-IID:", "")
    del r[shk.ADAPTERS.name]
    assert "not run yet: shakespeare-adapters" in shk.CLAIM.measure(r).note


def test_experiments_per_profile_and_the_gpu_protocol():
    for profile, names in (
        ("ci", {shk.FULL.name, shk.ADAPTERS.name}),
        ("cpu", set()),
        ("gpu", {shk.FULL.name, shk.ADAPTERS.name, shk.IID_FULL.name, shk.IID_ADAPTERS.name}),
    ):
        items = runs.plan(registry.select(["shakespeare"]), profile, REPO / "params.yaml")
        assert {it.experiment.name for it in items} == names
        for it in items:
            p = it.params
            assert p.data.dataset == "shakespeare" and p.model.name == "gpt2_small"
            assert p.model.base == "pretrain" and tuple(p.grid.algorithms) == ("fedavg",)
            if profile == "gpu":
                assert (p.federation.rounds, p.client.max_steps, p.client.batch_size) == (30, 5, 16)
                assert p.partition.num_clients == 9 and p.client.optimizer == "adamw"
                full = "full" in p.grid.adapters
                assert p.client.lr == (0.0001 if full else 0.0005)
                iid = "iid" in it.experiment.name
                assert p.partition.scheme == ("iid" if iid else "natural")
    # cpu runs none of them, and its verdict says so rather than waiting for seeds
    v = decide(shk.CLAIM, {}, [], shk.CLAIM.seeds_needed("cpu"))
    assert v.holds is None and v.text.startswith("not run under this profile")
    assert "gpu profile only" in shk.CLAIM.scaled["cpu"]


def test_train_time_reads_the_shakespeare_cells():
    r = results(0.215, (0.212, 0.222, 0.208), iid=False)
    pairs = claim_train_time.pairs(r)
    assert ("gpt2_small lora (Shakespeare)", 0.6, 1.0) in pairs
    assert shk.FULL.name in claim_train_time.CLAIM.reads
