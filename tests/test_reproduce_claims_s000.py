"""`fedapt reproduce`: seed 000's cross-device, #M = 2 and Gau(0.1) claims on hand-made
records (holds, does not hold, cannot say), and their experiments typed in every profile."""

from __future__ import annotations

from pathlib import Path

from tasks.reproduce import (
    claim_cross_device,
    claim_gaussian_noise,
    claim_label_skew_m2,
    registry,
    runs,
)
from tasks.reproduce.spec import PROFILES, ExperimentResult
from tasks.reproduce.verdict import decide
from tests.test_reproduce_verdicts import MB, cell, exp, judge

REPO = Path(__file__).resolve().parents[1]


def _over_seeds(claim, per_seed):
    """The claim's verdict over seeds: ``per_seed[s]`` maps experiment -> cells of seed s."""
    names = sorted({n for cells in per_seed for n in cells})
    results = {
        n: ExperimentResult({}, {s: c[n] for s, c in enumerate(per_seed)}, 1.0, {}) for n in names
    }
    return decide(claim, results, names, len(per_seed))


def _gaps(full, residual, algs=("fedavg",)):
    cells = {}
    for alg in algs:
        cells[f"{alg}-full"] = cell(full, accs=[full - 0.1, full], per_round=9 * MB)
        cells[f"{alg}-residual"] = cell(residual, accs=[residual - 0.1, residual], per_round=MB)
    return cells


# ---- cross-device: residual within 2.1 points of full, 100 clients, 20% per round -----------


def test_cross_device_holds_fails_and_cannot_say():
    name, claim = "cross-device-dir05", claim_cross_device.CLAIM
    ok = {name: exp(_gaps(0.85, 0.84, ("fedavg", "fedprox")), majority=0.1)}
    v = judge(claim, ok)
    assert v.holds is True and "| fedprox | 85.00 | 84.00 | 1.00 |" in v.table
    far = {name: exp(_gaps(0.85, 0.80), majority=0.1)}
    v = judge(claim, far)
    assert v.holds is False and "'fedavg: full - residual (points)' fails" in v.text
    assert "more than 2.1 points below" in v.text and "over its last 2 evaluations" in v.text
    ahead = {name: exp(_gaps(0.80, 0.85), majority=0.1)}  # adapters ahead: a negative gap
    assert judge(claim, ahead).holds is True
    unlearned = {name: exp(_gaps(0.30, 0.20), majority=0.1)}  # full 20 points above the prior
    v = judge(claim, unlearned)
    assert v.holds is None and "the precondition" in v.text
    v = _over_seeds(claim, [{name: _gaps(0.85, g)} for g in (0.84, 0.80, 0.845)])
    assert v.holds is None and "straddle" in v.text
    assert judge(claim, {}).holds is None and name in judge(claim, {}).text


def test_cross_device_protocol_is_cross_device():
    gpu = {
        it.experiment.name: it.params
        for it in runs.plan(registry.select(["cross-device"]), "gpu", REPO / "params.yaml")
    }["cross-device-dir05"]
    assert gpu.partition.num_clients == 100 and gpu.federation.participation == 0.2
    assert gpu.federation.sampling == "with_replacement" and gpu.client.local_epochs == 5
    assert gpu.client.batch_size == 64 and gpu.federation.rounds == 50
    assert list(gpu.grid.algorithms) == ["fedavg", "fedprox", "fednova"]
    cpu = {
        it.experiment.name: it.params
        for it in runs.plan(registry.select(["cross-device"]), "cpu", REPO / "params.yaml")
    }["cross-device-dir05"]
    assert cpu.partition.num_clients == 100 and cpu.federation.sampling == "with_replacement"
    assert cpu.client.local_epochs == 5 and cpu.pretrain.classes is None  # all classes
    assert cpu.client.lr == 0.1 and cpu.model.options.width == 0.25


# ---- #M = 2: above #M = 1 by 10 points, below #M = 3 ---------------------------------------


def _m_cells(a1, a2, a3, cells=("fedavg-full", "fedavg-residual")):
    return {f"label-skew-m{m}": {c: cell(a) for c in cells} for m, a in ((1, a1), (2, a2), (3, a3))}


def _m(a1, a2, a3):
    return {name: exp(cells) for name, cells in _m_cells(a1, a2, a3).items()}


def test_label_skew_m2_holds_fails_and_cannot_say():
    claim = claim_label_skew_m2.CLAIM
    v = judge(claim, _m(0.18, 0.55, 0.70))
    assert v.holds is True and "| fedavg-full | 18.00 | 55.00 | 70.00 | 37.00 | 15.00 |" in v.table
    v = judge(claim, _m(0.73, 0.76, 0.80))  # #M = 1 did not collapse: too little to rise above
    assert v.holds is False and "Does not hold: 'fedavg-full: #M=2 - #M=1 (points)'" in v.text
    assert "did not collapse" in v.text
    v = judge(claim, _m(0.18, 0.72, 0.70))  # #M = 2 above #M = 3
    assert v.holds is False and "#M=3 - #M=2" in v.text
    v = _over_seeds(claim, [_m_cells(0.18, 0.55, a3) for a3 in (0.70, 0.50, 0.60)])
    assert v.holds is None and "straddle" in v.text
    v = judge(claim, {k: r for k, r in _m(0.18, 0.55, 0.70).items() if k != "label-skew-m2"})
    assert v.holds is None and "label-skew-m2" in v.text


def test_label_skew_m2_differs_from_the_other_m_runs_only_in_m():
    for profile in PROFILES:
        items = runs.plan(registry.select(["label-skew-m2"]), profile, REPO / "params.yaml")
        flat = {it.experiment.name: it.params.flat() for it in items}
        assert set(flat) == {"label-skew-m1", "label-skew-m2", "label-skew-m3"}
        for m in (1, 3):
            other = flat[f"label-skew-m{m}"]
            diff = {k for k in flat["label-skew-m2"] if flat["label-skew-m2"][k] != other.get(k)}
            assert diff == {"partition.labels_per_client.m", "experiment.name"}, diff


# ---- Gau(0.1): residual within 1.7 points of full -----------------------------------------


def test_gaussian_noise_holds_fails_and_cannot_say():
    name, claim = "gaussian-noise", claim_gaussian_noise.CLAIM
    assert judge(claim, {name: exp(_gaps(0.90, 0.89), majority=0.1)}).holds is True
    v = judge(claim, {name: exp(_gaps(0.90, 0.88), majority=0.1)})
    assert v.holds is False and "| fedavg | 90.00 | 88.00 | 2.00 |" in v.table
    v = judge(claim, {name: exp(_gaps(0.35, 0.34), majority=0.1)})
    assert v.holds is None and "the precondition" in v.text
    v = _over_seeds(claim, [{name: _gaps(0.90, g)} for g in (0.89, 0.88, 0.895)])
    assert v.holds is None and "straddle" in v.text
    assert judge(claim, {}).holds is None


def test_gaussian_noise_protocol():
    for profile in PROFILES:
        (item,) = runs.plan(registry.select(["gaussian-noise"]), profile, REPO / "params.yaml")
        assert item.params.partition.scheme == "gaussian_noise"
        assert item.params.partition.num_clients == (4 if profile == "ci" else 10)
    assert item.params.partition.gaussian_noise.sigma == 0.1 and item.params.client.lr == 0.1


def test_every_profile_types_these_experiments():
    ids = ["cross-device", "label-skew-m2", "gaussian-noise"]
    for profile in PROFILES:
        items = runs.plan(registry.select(ids), profile, REPO / "params.yaml")
        names = [it.params.experiment.name for it in items]
        assert len(names) == len(set(names)) and all(n.startswith(f"{profile}-") for n in names)
        assert {it.claim.id for it in items} == {*ids, "label-skew"}
