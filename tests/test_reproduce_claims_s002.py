"""Seed 002's FedAvg ablation claims (§4.1, Figs. 2-5: local epochs, Dirichlet alpha, FedIR,
FedVC): each verdict on hand-made curves where it holds, does not hold and cannot say, the
measures they share, and their experiments typed in every profile."""

from __future__ import annotations

from pathlib import Path

import pytest

from tasks.reproduce import (
    claim_dirichlet_alpha,
    claim_fedir,
    claim_fedvc,
    claim_local_epochs,
    registry,
    runs,
)
from tasks.reproduce.measures import convergence_round, last_mean, trailing
from tasks.reproduce.spec import PROFILES
from tasks.reproduce.verdict import combine
from tests.test_reproduce_verdicts import cell, exp, judge

REPO = Path(__file__).resolve().parents[1]
ROUNDS = 30
IDS = ["local-epochs", "dirichlet-alpha", "fedir", "fedvc"]


def curve(end: float, conv: int, start: float = 0.3, rounds: int = ROUNDS) -> list[float]:
    """Accuracy rising linearly from ``start`` to ``end`` at round ``conv``, then flat."""
    return [start + (end - start) * min(1.0, r / conv) for r in range(1, rounds + 1)]


def run(cells: dict) -> object:
    return exp(cells, **{"federation.rounds": ROUNDS})


def fedavg(end: float, conv: int) -> object:
    return run({"fedavg-full": cell(accs=curve(end, conv))})


def straddle(claim, a, b):
    """The verdict over two seeds whose readings are those of results ``a`` and ``b``."""
    return combine(claim, [(0, claim.measure(a)), (1, claim.measure(b))], min_seeds=2)


# ---- the shared measures ---------------------------------------------------------------------


def test_end_level_and_convergence_round_by_hand():
    c = cell(accs=[0.2, 0.5, 0.6, 0.8, 0.7, 0.9, 0.8, 0.8, 0.8, 0.9])
    assert last_mean(c, 5) == pytest.approx(0.84)  # 0.9, 0.8, 0.8, 0.8, 0.9
    assert trailing(c, 3)[:2] == [(3, pytest.approx(0.43333333)), (4, pytest.approx(0.63333333))]
    # 95% of 0.84 = 0.798: trailing means 0.433, 0.633, 0.7, 0.8 -> round 6
    assert convergence_round(c, last=5) == 6
    assert convergence_round(cell(accs=[0.5])) is None  # fewer rounds than the window
    # 0.70, 0.75, 0.80 at rounds 8-10, flat after: trailing 0.75 at 10, 0.783 >= 0.76 at 11
    assert convergence_round(cell(accs=curve(0.8, 10))) == 11


# ---- local epochs (Fig. 2) -------------------------------------------------------------------


def _epochs(e1, e2, e4):
    return {
        claim_local_epochs.E1.name: fedavg(*e1),
        claim_dirichlet_alpha.ALPHA1.name: fedavg(*e2),
        claim_local_epochs.E4.name: fedavg(*e4),
    }


def test_local_epochs_holds_fewer_rounds_same_end():
    v = judge(claim_local_epochs.CLAIM, _epochs((0.80, 20), (0.81, 12), (0.815, 6)))
    assert v.holds is True and "| E=1 | 80.00 |" in v.table


def test_local_epochs_times_every_e_to_the_lowest_end_level():
    # E=1 ends 6 points lower: every E is timed to 95% of 0.75 = 71.25%, not to its own end
    v = judge(claim_local_epochs.CLAIM, _epochs((0.75, 20), (0.81, 12), (0.815, 6)))
    assert "the first round at 71.25% or more" in v.table
    assert "| E=1 | 75.00 | 20 |" in v.table and "| E=4 | 81.50 | 6 |" in v.table


def test_local_epochs_fails_when_an_e_ends_lower():
    v = judge(claim_local_epochs.CLAIM, _epochs((0.8, 20), (0.81, 12), (0.74, 6)))
    assert v.holds is False and "'end acc spread over E (points)' fails" in v.text
    assert "E=4 ends 74.00%, E=2 81.00%" in v.text


def test_local_epochs_cannot_say_before_every_e_converged():
    e1 = run({"fedavg-full": cell(accs=[0.3 + 0.012 * r for r in range(ROUNDS)])})  # rising
    r = _epochs((0.8, 20), (0.81, 12), (0.815, 6)) | {claim_local_epochs.E1.name: e1}
    v = judge(claim_local_epochs.CLAIM, r)
    assert v.holds is None and "precondition 'largest end-level rise over E" in v.text
    assert "E=1 is still rising at the end (+6.0 points" in v.text


def test_local_epochs_fails_when_more_epochs_are_slower():
    v = judge(claim_local_epochs.CLAIM, _epochs((0.80, 8), (0.81, 12), (0.815, 6)))
    assert v.holds is False and "'convergence round E=1 - E=2' fails" in v.text
    assert "E=2 converges at round" in v.text


def test_local_epochs_cannot_say_when_seeds_straddle():
    good = _epochs((0.80, 20), (0.81, 12), (0.815, 6))
    apart = _epochs((0.76, 20), (0.81, 12), (0.815, 6))  # 5.5 points apart
    v = straddle(claim_local_epochs.CLAIM, good, apart)
    assert v.holds is None and "straddle" in v.text and "end acc spread" in v.text


def test_local_epochs_missing():
    v = judge(claim_local_epochs.CLAIM, {claim_local_epochs.E1.name: fedavg(0.8, 10)})
    assert v.holds is None and "not run yet" in v.text and "alpha-1" in v.text


# ---- Dirichlet alpha (Fig. 3) ----------------------------------------------------------------


def _alphas(iid, a10, a1, a100=None):
    r = {
        claim_dirichlet_alpha.IID.name: fedavg(*iid),
        claim_dirichlet_alpha.ALPHA10.name: fedavg(*a10),
        claim_dirichlet_alpha.ALPHA1.name: fedavg(*a1),
    }
    if a100 is not None:
        r[claim_dirichlet_alpha.ALPHA100.name] = fedavg(*a100)
    return r


def test_dirichlet_alpha_holds_on_a_steady_decline():
    v = judge(claim_dirichlet_alpha.CLAIM, _alphas((0.86, 6), (0.84, 9), (0.76, 16)))
    assert v.holds is True
    # alpha = 100 level with IID (0.5 points above, 1 round earlier) is within the slack
    r = _alphas((0.86, 6), (0.84, 9), (0.76, 16), a100=(0.865, 5))
    v = judge(claim_dirichlet_alpha.CLAIM, r)
    assert v.holds is True and "| alpha=100 | 86.50 |" in v.table


def test_dirichlet_alpha_fails_without_a_decline_or_slowdown():
    v = judge(claim_dirichlet_alpha.CLAIM, _alphas((0.80, 6), (0.84, 9), (0.79, 16)))
    assert v.holds is False and "'end acc IID - alpha=10 (points)'" in v.text
    assert "alpha=10 ends 84.00%, IID 80.00%" in v.text
    v = judge(claim_dirichlet_alpha.CLAIM, _alphas((0.86, 16), (0.84, 9), (0.76, 6)))
    assert v.holds is False and "'convergence round alpha=1 - IID' fails" in v.text


def test_dirichlet_alpha_cannot_say_when_seeds_straddle():
    good = _alphas((0.86, 6), (0.84, 9), (0.76, 16))
    flat = _alphas((0.86, 6), (0.84, 9), (0.85, 16))  # alpha = 1 only 1 point below IID
    v = straddle(claim_dirichlet_alpha.CLAIM, good, flat)
    assert v.holds is None and "straddle" in v.text and "IID - alpha=1" in v.text


def test_dirichlet_alpha_names_a_still_rising_alpha1():
    rising = run({"fedavg-full": cell(accs=[0.3 + 0.015 * r for r in range(ROUNDS)])})
    r = _alphas((0.86, 6), (0.84, 9), (0.76, 16)) | {claim_dirichlet_alpha.ALPHA1.name: rising}
    assert "alpha=1 is still rising" in judge(claim_dirichlet_alpha.CLAIM, r).text


def test_dirichlet_alpha_missing():
    v = judge(claim_dirichlet_alpha.CLAIM, {claim_dirichlet_alpha.IID.name: fedavg(0.8, 5)})
    assert v.holds is None and "alpha-10" in v.text


# ---- FedIR (Fig. 4) --------------------------------------------------------------------------


def _fedir(gaps, alphas=(10, 1)):
    """FedAvg at 0.80 (alpha = 10: 0.82) and FedIR ``gaps`` points from it, per alpha."""
    r = {}
    for alpha, gap in zip(alphas, gaps, strict=True):
        base = 0.82 if alpha == 10 else 0.80
        r[f"alpha-{alpha}"] = fedavg(base, 10)
        r[f"fedir-alpha{alpha}"] = run({"fedir-full": cell(accs=curve(base + gap / 100, 10))})
    return r


def test_fedir_holds_below_fedavg_at_every_alpha():
    v = judge(claim_fedir.CLAIM, _fedir((-1.5, -4.0)))
    assert v.holds is True and "| alpha=1 | 80.00 | 76.00 | -4.00 |" in v.table
    v = judge(claim_fedir.CLAIM, _fedir((-0.5, -1.5, -4.0), alphas=(100, 10, 1)))
    assert v.holds is True and "alpha=100" in v.table


def test_fedir_fails_where_it_beats_fedavg():
    v = judge(claim_fedir.CLAIM, _fedir((1.0, 2.0)))
    assert v.holds is False and "alpha=1: FedIR - FedAvg" in v.text
    assert "at alpha = 1 FedIR ends +2.00 points from FedAvg" in v.text


def test_fedir_cannot_say_when_seeds_straddle():
    v = straddle(claim_fedir.CLAIM, _fedir((-1.0, -3.0)), _fedir((0.5, -3.0)))
    assert v.holds is None and "straddle" in v.text and "alpha=10" in v.text


def test_fedir_missing():
    r = _fedir((-1.0, -3.0))
    del r["fedir-alpha10"]
    assert judge(claim_fedir.CLAIM, r).holds is None


# ---- FedVC (Fig. 5) --------------------------------------------------------------------------


def _fedvc(gain, vc_conv=10, name="fedvc-std50"):
    avg, vc = curve(0.78, 10), curve(0.78 + gain / 100, vc_conv)
    return {name: run({"fedavg-full": cell(accs=avg), "fedvc-full": cell(accs=vc)})}


def test_fedvc_holds_better_and_as_fast():
    v = judge(claim_fedvc.CLAIM, _fedvc(2.0, vc_conv=11))
    assert v.holds is True and "| STD 50% FedVC | 80.00 | 12 |" in v.table
    both = _fedvc(2.0) | _fedvc(1.0, name="fedvc-std30")
    assert judge(claim_fedvc.CLAIM, both).holds is True


def test_fedvc_fails_below_fedavg_or_slower():
    v = judge(claim_fedvc.CLAIM, _fedvc(-2.0))
    assert v.holds is False and "at STD 50% FedVC ends -2.00 points from FedAvg" in v.text
    v = judge(claim_fedvc.CLAIM, _fedvc(2.0, vc_conv=20))  # 10 rounds later: > 3 (10% of 30)
    assert v.holds is False and "convergence round' fails" in v.text
    assert "FedVC converges at round 20, FedAvg at 11" in v.text


def test_fedvc_and_fedir_name_a_curve_still_rising():
    rising = [0.3 + 0.015 * r for r in range(ROUNDS)]  # +7.5 points over its last 5 rounds
    flat = curve(0.8, 10)
    r = {"fedvc-std50": run({"fedavg-full": cell(accs=flat), "fedvc-full": cell(accs=rising)})}
    v = judge(claim_fedvc.CLAIM, r)
    assert v.holds is False and "FedVC at STD 50% is still rising at the end (+7.5" in v.text
    above = [0.45 + 0.015 * r for r in range(ROUNDS)]  # ends near 0.87, FedAvg at 0.82
    r = _fedir((-1.0, -3.0)) | {"fedir-alpha10": run({"fedir-full": cell(accs=above)})}
    v = judge(claim_fedir.CLAIM, r)
    assert v.holds is False and "FedIR at alpha = 10 is still rising at the end" in v.text


def test_fedvc_cannot_say_when_seeds_straddle():
    v = straddle(claim_fedvc.CLAIM, _fedvc(2.0), _fedvc(-0.5))
    assert v.holds is None and "straddle" in v.text
    assert judge(claim_fedvc.CLAIM, {}).holds is None


# ---- the experiments, typed in every profile -------------------------------------------------


def test_seed002_experiments_type_in_every_profile():
    claims = registry.select(IDS)
    for profile in PROFILES:
        items = {
            it.experiment.name: it.params for it in runs.plan(claims, profile, REPO / "params.yaml")
        }
        want = {"epochs-e1", "epochs-e4", "alpha-iid", "alpha-10", "alpha-1"}
        want |= {"fedir-alpha10", "fedir-alpha1", "fedvc-std50"}
        if profile == "gpu":
            want |= {"alpha-100", "fedir-alpha100", "fedvc-std30"}
        assert set(items) == want
        e4, vc = items["epochs-e4"], items["fedvc-std50"]
        assert e4.client.local_epochs == 4 and items["alpha-1"].client.local_epochs == 2
        assert tuple(vc.grid.algorithms) == ("fedavg", "fedvc")
        assert vc.partition.dirichlet_clientwise.sizes == "normal"
        assert vc.partition.dirichlet_clientwise.size_rel_std == 0.5
        n_vc = vc.grid.algorithm("fedvc").n_vc
        clients = vc.partition.num_clients
        assert n_vc * clients == (vc.data.train_subset or 60000)  # N_VC = the mean size
        assert items["alpha-iid"].partition.scheme == "iid"
        assert tuple(items["fedir-alpha1"].grid.algorithms) == ("fedir",)
    cpu = {it.experiment.name: it.params for it in runs.plan(claims, "cpu", REPO / "params.yaml")}
    assert cpu["alpha-1"].partition.num_clients == 10 and cpu["alpha-1"].federation.rounds == 30
