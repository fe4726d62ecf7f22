"""Seed 003's claims (Houlsby, Pfeiffer and LoRA adapters on transformers): the transformer,
train-time and Shakespeare rules on synthetic records over three seeds (holds, does not hold,
cannot say), their guards tripping, and the designs typed in every profile."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tasks.reproduce import claim_shakespeare as shk
from tasks.reproduce import claim_train_time, claim_transformer, registry, runs
from tasks.reproduce.spec import Cell, Claim, ExperimentResult
from tasks.reproduce.verdict import combine, decide

REPO = Path(__file__).resolve().parents[3]
MB = 2**20
SEEDS = (0, 1, 2)
TR = claim_transformer


def curve(end: float, per_round: int, seconds: float = 1.0, last: list[float] | None = None):
    """A cell evaluated 25 times at ``end`` (then at ``last``), ``per_round`` bytes each way."""
    accs = [end] * (25 - len(last or [])) + list(last or [])
    rounds = [
        {
            "round": 2 * (i + 1),
            "accuracy": a,
            "cum_upload_bytes": 2 * (i + 1) * per_round,
            "cum_download_bytes": 2 * (i + 1) * per_round,
        }
        for i, a in enumerate(accs)
    ]
    record = {
        "final_accuracy": accs[-1],
        "upload_bytes_per_round": per_round,
        "download_bytes_per_round": per_round,
        "local_train_seconds_mean": seconds,
    }
    return Cell(record, rounds)


def stamped(claim: Claim, runs_: dict, base: float | None, model: str = "vit_small"):
    return ExperimentResult(
        {"model.name": model},
        runs_,
        60.0,
        {s: 0.1 for s in runs_},
        {s: base for s in runs_},
        {claim.id: claim.rule_hash()},
    )


def transformer(claim, full, adapters, head=0.60, share=0.01, base=0.30, seconds=None):
    """The transformer claim's two experiments over three seeds: ``full(s)`` and
    ``adapters(s)`` (houlsby, pfeiffer, lora) are seed ``s``'s end levels; ``seconds(s)``
    the (full, adapter) local seconds per client job."""
    secs = seconds or (lambda s: (1.0, 0.6))
    fulls, ads = {}, {}
    for s in SEEDS:
        fulls[s] = {"fedavg-full": curve(full(s), 100 * MB, secs(s)[0])}
        cells = {
            f"fedavg-{m}": curve(a, int(100 * MB * share), secs(s)[1])
            for m, a in zip(TR.METHODS, adapters(s), strict=True)
        }
        cells["fedavg-head"] = curve(head, MB // 10, 0.1)
        ads[s] = cells
    return {
        TR.FULL.name: stamped(claim, fulls, base),
        TR.ADAPTERS.name: stamped(claim, ads, base),
    }


def verdict(claim, results, needs=(TR.FULL.name, TR.ADAPTERS.name)):
    return decide(claim, results, list(needs), 3)


JIT = {0: 0.0, 1: 0.002, 2: -0.002}


def test_transformer_holds_fails_and_straddles_over_three_seeds():
    c = TR.CLAIM
    v = verdict(c, transformer(c, lambda s: 0.80 + JIT[s], lambda s: (0.79, 0.80, 0.79)))
    assert v.holds is True, v.text
    assert "| houlsby: above the head alone (points) (guard) | >= 1 |" in v.table
    # 5 points below full on every seed
    v = verdict(c, transformer(c, lambda s: 0.80 + JIT[s], lambda s: (0.79, 0.80, 0.75)))
    assert v.holds is False and "'lora: below full (points)'" in v.text
    # the measured bytes: 4% of full's per round
    v = verdict(c, transformer(c, lambda s: 0.80, lambda s: (0.79, 0.80, 0.79), share=0.04))
    assert v.holds is False and "share of full's bytes (%)" in v.text
    # lora's gap is 0.5, 4.5, 1.0 points: straddles 2
    gap = {0: 0.005, 1: 0.045, 2: 0.010}
    v = verdict(c, transformer(c, lambda s: 0.80, lambda s: (0.79, 0.80, 0.80 - gap[s])))
    assert v.holds is None and "straddles" in v.text and v.more_seeds


def test_transformer_guards_learned_and_head():
    c = TR.CLAIM
    # the head alone is as good as the adapters: they do not make the difference
    v = verdict(c, transformer(c, lambda s: 0.80, lambda s: (0.79, 0.80, 0.79), head=0.80))
    assert v.holds is None and "'houlsby: above the head alone (points)'" in v.text
    # everything ends at the pretrained base: nothing learned for the adapters to match
    v = verdict(
        c, transformer(c, lambda s: 0.30, lambda s: (0.30, 0.30, 0.30), head=0.2, base=0.30)
    )
    assert v.holds is None and "'full: above the starting model (points)'" in v.text
    assert "'lora: above the starting model (points)'" in v.text
    # without a base the class prior (0.1) is the start
    v = verdict(c, transformer(c, lambda s: 0.80, lambda s: (0.79, 0.80, 0.79), base=None))
    assert v.holds is True


def test_transformer_reads_window_means():
    """A last-evaluation dip of 5 points (a gap of 5.5 alone) moves the 5-evaluation mean
    by 1: within the 2 points."""
    c = TR.CLAIM
    r = transformer(c, lambda s: 0.80, lambda s: (0.79, 0.80, 0.795))
    ad = r[TR.ADAPTERS.name]
    dip = curve(0.795, MB, 0.6, last=[0.745])
    r[TR.ADAPTERS.name] = dataclasses.replace(
        ad, runs={s: {**ad.runs[s], "fedavg-lora": dip} for s in SEEDS}
    )
    v = verdict(c, r)
    assert v.holds is True, v.text
    assert "| lora | 78.50 |" in v.table.split("<details>")[1]  # (4 x 79.5 + 74.5) / 5


def test_transformer_missing_and_thresholds():
    c = TR.CLAIM
    assert verdict(c, {}).holds is None
    assert dict(c.thresholds) == {"gap": 2.0, "traffic_percent": 3.0, "over_head": 1.0,
                                  "learned": 2.0}  # fmt: skip
    assert c.window == 5 and "likely cause" not in c.tolerance and c.dropped == (TR.MINILM,)
    assert TR.plot(transformer(c, lambda s: 0.8, lambda s: (0.79, 0.8, 0.79))) is not None


# ---- train-time --------------------------------------------------------------------------


def times(seconds):
    """The transformer experiments with seed ``s``'s (full, adapter) seconds per client job."""
    c = claim_train_time.CLAIM
    return transformer(c, lambda s: 0.80, lambda s: (0.79, 0.80, 0.79), seconds=seconds)


def test_train_time_ratios_within_a_seed():
    """Each seed ran on a machine under another load (full: 10, 20, 15 s per job): the
    seconds differ by 2x across seeds, the ratios within a seed do not."""
    load = {0: 10.0, 1: 20.0, 2: 15.0}
    c = claim_train_time.CLAIM
    v = verdict(c, times(lambda s: (load[s], 0.6 * load[s])), c.reads[:2])
    assert v.holds is True, v.text
    assert "| vit_small lora / full local time | < 1 | 0.60 ± 0.00 |" in v.table
    v = verdict(c, times(lambda s: (load[s], 1.25 * load[s])), c.reads[:2])
    assert v.holds is False and "vit_small houlsby / full local time" in v.text
    ratio = {0: 0.8, 1: 1.1, 2: 0.9}
    v = verdict(c, times(lambda s: (load[s], ratio[s] * load[s])), c.reads[:2])
    assert v.holds is None and "straddles" in v.text and v.more_seeds
    assert verdict(c, {}, c.reads[:2]).holds is None
    assert dict(c.thresholds) == {"ratio": 1.0}


def test_train_time_reads_the_shakespeare_cells_not_resnet():
    r = shakespeare(0.215, (0.212, 0.222, 0.208), iid=False)
    pairs = claim_train_time.pairs(r)
    assert ("gpt2_small lora (Shakespeare)", 0.6, 1.0) in pairs
    assert shk.FULL.name in claim_train_time.CLAIM.reads
    assert "adapters-dir05" not in claim_train_time.CLAIM.reads
    assert claim_train_time.plot(times(lambda s: (1.0, 0.6))) is not None


# ---- shakespeare (gpu only: its rule) ------------------------------------------------------

FULL_MB = 45 * MB  # gpt2_small: 9 clients x 5.06 MiB each way


def _last(acc, per_round, seconds=1.0):
    """A cell whose last 5 evaluations average ``acc`` (its final one 0.5 points lower: the
    rule reads the mean)."""
    tail = [acc + 0.002, acc + 0.002, acc + 0.001, acc, acc - 0.005]
    return curve(acc - 0.05, per_round, seconds, last=tail)


def shakespeare(full, adapters, base=0.155, iid=True, share=(0.015, 0.008, 0.013)):
    """One seed's results of the claim's experiments: ``adapters`` (houlsby, pfeiffer, lora)
    accuracies, their payload a ``share`` of full's, both partitions alike (non-IID only if
    not ``iid``)."""
    ad_cells = {
        f"fedavg-{m}": _last(a, int(s * FULL_MB), seconds=0.6)
        for m, a, s in zip(shk.METHODS, adapters, share, strict=True)
    }
    full_cells = {"fedavg-full": _last(full, FULL_MB)}

    def exp_(cells):
        return ExperimentResult({}, {0: cells}, 60.0, {0: None}, {0: base})

    out = {shk.FULL.name: exp_(full_cells), shk.ADAPTERS.name: exp_(ad_cells)}
    if iid:
        out[shk.IID_FULL.name] = exp_(full_cells)
        out[shk.IID_ADAPTERS.name] = exp_(ad_cells)
    return out


def judge(results):
    return combine(shk.CLAIM, [(0, shk.CLAIM.measure(results))], min_seeds=1)


def test_shakespeare_holds_when_the_adapters_are_within_a_point_at_two_percent():
    # Table 4's picture shifted onto a base at 15.5%: full +6 points, adapters -0.7..+0.7
    v = judge(shakespeare(0.215, (0.212, 0.222, 0.208)))
    assert v.holds is True, v.text
    assert "| non-IID | base | 15.50 |" in v.table
    assert "| IID | lora | 20.80 | 5.30 | 0.70 |" in v.table
    assert "full gains 6.00 points over the base" in v.text


def test_shakespeare_does_not_hold_when_an_adapter_falls_behind_or_sends_too_much():
    v = judge(shakespeare(0.215, (0.212, 0.222, 0.19)))
    assert v.holds is False and "'non-IID: lora below full (points)'" in v.text
    v = judge(shakespeare(0.215, (0.212, 0.222, 0.21), share=(0.03, 0.008, 0.013)))
    assert v.holds is False and "houlsby share of full's bytes" in v.text


def test_shakespeare_cannot_say_when_fine_tuning_taught_the_base_nothing():
    """Everything ties at the base (as fedapt's runs on the held-out-plays base did): the gap
    checks hold vacuously, the guards say the run cannot decide, and the note says why."""
    v = judge(shakespeare(0.156, (0.155, 0.157, 0.154)))
    assert v.holds is None and "precondition 'non-IID: full above the pretrained base" in v.text
    assert "full fine-tuning ends 0.10 points above the pretrained base (15.50%)" in v.text
    # an adapter that learned less than 2 points, within the gap of a full that learned 2.5
    v = judge(shakespeare(0.18, (0.18, 0.18, 0.171)))
    assert v.holds is None and "'non-IID: lora above the pretrained base (points)'" in v.text
    # an unknown base accuracy (no card) cannot pass the guards either
    assert judge(shakespeare(0.215, (0.212, 0.222, 0.208), base=None)).holds is None


def test_shakespeare_seeds_that_straddle_the_gap_cannot_say():
    good = shk.CLAIM.measure(shakespeare(0.215, (0.212, 0.222, 0.208)))
    bad = shk.CLAIM.measure(shakespeare(0.215, (0.212, 0.222, 0.19)))
    v = combine(shk.CLAIM, [(0, good), (1, bad), (2, good)])
    assert v.holds is None and "straddles" in v.text and "lora below full" in v.text


def test_shakespeare_non_iid_alone_where_the_profile_runs_only_it_and_missing_experiments():
    r = shakespeare(0.215, (0.212, 0.222, 0.208), iid=False)
    v = judge(r)
    assert v.holds is True and "IID:" not in v.text.replace("non-IID:", "")
    del r[shk.ADAPTERS.name]
    assert "not run yet: shakespeare-adapters" in shk.CLAIM.measure(r).note
    assert dict(shk.CLAIM.thresholds) == {"gap": 1.0, "traffic_percent": 2.0, "learned": 2.0}


# ---- the designs ---------------------------------------------------------------------------


def plan(ids, profile):
    return runs.plan(registry.select(ids), profile, REPO / "params.yaml")


def test_shakespeare_experiments_per_profile_and_the_gpu_protocol():
    for profile, names in (
        ("ci", {shk.FULL.name, shk.ADAPTERS.name}),
        ("cpu", set()),
        ("gpu", {shk.FULL.name, shk.ADAPTERS.name, shk.IID_FULL.name, shk.IID_ADAPTERS.name}),
    ):
        items = plan(["shakespeare"], profile)
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


def test_transformer_and_train_time_designs():
    cpu = {it.experiment.name: it for it in plan(["transformer", "train-time"], "cpu")}
    # the two experiments and their lr tuning runs (the seed's two lrs each)
    assert set(cpu) == {
        "transformer-full", "transformer-adapters",
        "transformer-full-lr0.0005", "transformer-full-lr0.005",
        "transformer-adapters-lr0.0005", "transformer-adapters-lr0.005",
    }  # fmt: skip
    p = cpu["transformer-adapters"].params
    assert p.model.name == "vit_small" and p.model.base == "pretrain"
    assert tuple(p.pretrain.classes) == (5, 6, 7, 8, 9) and p.pretrain.max_samples == 5000
    assert (p.federation.rounds, p.federation.eval_every) == (50, 2)
    assert p.federation.rounds // p.federation.eval_every >= TR.WINDOW
    assert (p.partition.num_clients, p.client.max_steps, p.client.batch_size) == (9, 5, 12)
    gpu = {it.experiment.name: it.params for it in plan(["transformer"], "gpu")}
    assert gpu["transformer-full"].model.name == "minilm"
    assert gpu["transformer-adapters"].client.lr == 0.005


@pytest.mark.parametrize("claim", [TR.CLAIM, claim_train_time.CLAIM, shk.CLAIM], ids=lambda c: c.id)
def test_rule_texts_carry_no_untested_cause(claim):
    assert "likely cause" not in claim.rule + claim.tolerance
    assert claim.thresholds, claim.id
