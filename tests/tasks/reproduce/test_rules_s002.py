"""Seed 002's claims (§4.1 Figs. 2-5: local epochs, Dirichlet alpha, FedIR, FedVC; §4.3 Figs.
8-9: server optimisers): each rule fed synthetic records over three seeds where it holds, does
not hold and cannot say, its guards tripping, the measures they share, and their experiments
typed in every profile."""

from __future__ import annotations

from pathlib import Path

import pytest

from tasks.reproduce import (
    claim_dirichlet_alpha,
    claim_fedir,
    claim_fedvc,
    claim_local_epochs,
    claim_server_opt,
    registry,
    runs,
)
from tasks.reproduce.measures import (
    convergence_round,
    last_mean,
    step_variance,
    trailing,
    trend_rise,
    upto,
)
from tasks.reproduce.spec import PROFILES, ExperimentResult
from tasks.reproduce.verdict import decide
from tests.tasks.reproduce.support import PRIOR, curve, judge, over_seeds
from tests.tasks.reproduce.support import curve_cell as cell
from tests.tasks.reproduce.support import prior_exp as exp

REPO = Path(__file__).resolve().parents[3]
IDS = ["local-epochs", "dirichlet-alpha", "fedir", "fedvc", "server-opt"]


def rising(rounds: int, start: float = 0.3, per_round: float = 0.012) -> list[float]:
    return [start + per_round * r for r in range(rounds)]


# ---- the shared measures ---------------------------------------------------------------------


def test_end_level_and_convergence_round_by_hand():
    c = cell([0.2, 0.5, 0.6, 0.8, 0.7, 0.9, 0.8, 0.8, 0.8, 0.9])
    assert last_mean(c, 5) == pytest.approx(0.84)  # 0.9, 0.8, 0.8, 0.8, 0.9
    assert trailing(c, 3)[:2] == [(3, pytest.approx(0.43333333)), (4, pytest.approx(0.63333333))]
    # 95% of 0.84 = 0.798: trailing means 0.433, 0.633, 0.7, 0.8 -> round 6
    assert convergence_round(c, last=5) == 6
    assert convergence_round(cell([0.5])) is None  # fewer rounds than the window
    # 0.70, 0.75, 0.80 at rounds 8-10, flat after: trailing 0.75 at 10, 0.783 >= 0.76 at 11
    assert convergence_round(cell(curve(0.8, 10, 30))) == 11


def test_trend_rise_by_hand():
    # 20 rounds climbing half a point a round: the line through the last 10 rises 4.5 points
    assert trend_rise(cell(rising(20, per_round=0.005))) == pytest.approx(4.5)
    assert trend_rise(cell(curve(0.8, 5, 20))) == pytest.approx(0.0, abs=1e-9)  # flat half
    # the least-squares line, not the ends: one jump at the last round moves it by far less
    jump = curve(0.8, 5, 20)[:-1] + [0.9]
    assert 0 < trend_rise(cell(jump)) < 10 * 0.6
    assert trend_rise(cell([0.5, 0.6, 0.7])) is None  # fewer than 5 evaluated rounds
    assert trend_rise(cell(rising(9)), least=5) == pytest.approx(1.2 * 4)  # last 5 of 9


def test_upto_cuts_a_curve_to_its_first_rounds():
    c = cell(rising(40))
    assert [r["round"] for r in upto(c, 30).rounds] == list(range(1, 31))
    assert upto(c, 30).record == c.record


def test_step_variance_by_hand():
    # last half of [50, 60, 40, 70, 80, 75], at least 3 rounds: [70, 80, 75] -> steps 10, -5
    assert step_variance(cell([0.5, 0.6, 0.4, 0.7, 0.8, 0.75])) == pytest.approx(56.25)
    # [50, 60, 40, 70]: the last 3 rounds -> steps -20, 30; all rounds -> 10, -20, 30
    assert step_variance(cell([0.5, 0.6, 0.4, 0.7])) == pytest.approx(625.0)
    whole = step_variance(cell([0.5, 0.6, 0.4, 0.7]), tail=1.0)
    assert whole == pytest.approx(
        ((10 - 20 / 3) ** 2 + (-20 - 20 / 3) ** 2 + (30 - 20 / 3) ** 2) / 3
    )
    assert step_variance(cell([0.5, 0.6])) is None


def test_every_seed002_rule_names_its_numbers():
    for claim in registry.select(IDS):
        assert claim.thresholds and claim.window == 5, claim.id
        assert all(isinstance(v, float | int) for v in claim.thresholds.values())
    hashes = {c.rule_hash() for c in registry.select(IDS)}
    assert len(hashes) == len(IDS)


# ---- local epochs (Fig. 2) -------------------------------------------------------------------

E1, E2, E4 = (
    claim_local_epochs.E1.name,
    claim_dirichlet_alpha.ALPHA10.name,
    claim_local_epochs.E4.name,
)


def _epochs(e1=(0.80, 40), e2=(0.81, 20), e4=(0.815, 8), seed=0, jitter=1.5, **replace):
    """One seed's results: each E as the cpu design runs it (80, 40, 20 rounds)."""
    r = {
        E1: exp({"fedavg-full": cell(curve(*e1, 80, jitter=jitter, phase=seed))}),
        E2: exp({"fedavg-full": cell(curve(*e2, 40, jitter=jitter, phase=seed + 1))}),
        E4: exp({"fedavg-full": cell(curve(*e4, 20, jitter=jitter, phase=seed + 2))}),
    }
    return r | replace


def test_local_epochs_holds_fewer_rounds_same_end():
    v = over_seeds(claim_local_epochs.CLAIM, [_epochs(seed=s) for s in range(3)])
    assert v.holds is True and v.seeds == 3, v.text
    assert "| E=1 (guard)" not in v.table and "E=1: trend over its second half" in v.table


def test_local_epochs_times_every_e_to_the_lowest_end_level():
    # E=1 ends 6 points lower: every E is timed to 95% of 0.75 = 71.25%, not to its own end
    v = judge(claim_local_epochs.CLAIM, _epochs(e1=(0.75, 40), jitter=0.0))
    assert "the first round at 71.25% or more" in v.table
    assert "| E=1 | 75.00 | 38 |" in v.table and "| E=4 | 81.50 | 8 |" in v.table


def test_local_epochs_does_not_hold_when_an_e_ends_lower_or_more_epochs_are_slower():
    lower = [_epochs(e4=(0.74, 8), seed=s) for s in range(3)]
    v = over_seeds(claim_local_epochs.CLAIM, lower)
    assert v.holds is False and "'abs(end acc E=4 - E=2) (points)' lies on the other side" in v.text
    assert "E=4 ends" in v.text
    slower = [_epochs(e1=(0.80, 8), seed=s) for s in range(3)]  # E=1 converges first
    v = over_seeds(claim_local_epochs.CLAIM, slower)
    assert v.holds is False and "'convergence round E=1 - E=2 (rounds)'" in v.text


def test_local_epochs_cannot_say_when_seeds_straddle():
    # E=1 ends 1, 2 and 5.5 points below E=2: the interval of the gap straddles 3 points
    seeds = [_epochs(e1=(0.81 - gap, 40), seed=s) for s, gap in enumerate((0.01, 0.02, 0.055))]
    v = over_seeds(claim_local_epochs.CLAIM, seeds)
    assert v.holds is None and "straddles" in v.text and "abs(end acc E=1 - E=2)" in v.text
    assert v.more_seeds


def test_local_epochs_guard_trips_while_an_e_still_rises():
    still = {E1: exp({"fedavg-full": cell(rising(80, per_round=0.006))})}  # +24 over 40
    v = over_seeds(claim_local_epochs.CLAIM, [_epochs(seed=s, **still) for s in range(3)])
    assert v.holds is None and "precondition 'E=1: trend over its second half" in v.text
    assert "E=1 is still rising at the end" in v.text


def test_local_epochs_missing():
    v = judge(claim_local_epochs.CLAIM, {E1: exp({"fedavg-full": cell(curve(0.8, 10, 80))})})
    assert v.holds is None and "not run yet" in v.text and "alpha-10" in v.text


# ---- Dirichlet alpha (Fig. 3) ----------------------------------------------------------------


def _alphas(iid=(0.86, 6), a10=(0.84, 9), a1=(0.76, 16), a100=None, seed=0, a10_rounds=40):
    d = claim_dirichlet_alpha
    r = {
        d.IID.name: exp({"fedavg-full": cell(curve(*iid, 30, jitter=1.0, phase=seed))}),
        d.ALPHA10.name: exp(
            {"fedavg-full": cell(curve(*a10, a10_rounds, jitter=1.0, phase=seed + 1))}
        ),
        d.ALPHA1.name: exp({"fedavg-full": cell(curve(*a1, 30, jitter=1.0, phase=seed + 2))}),
    }
    if a100 is not None:
        r[d.ALPHA100.name] = exp({"fedavg-full": cell(curve(*a100, 30))})
    return r


def test_dirichlet_alpha_holds_on_a_steady_decline():
    v = over_seeds(claim_dirichlet_alpha.CLAIM, [_alphas(seed=s) for s in range(3)])
    assert v.holds is True, v.text
    # alpha = 100 level with IID (0.5 points above, 1 round earlier) is within the slack
    v = judge(claim_dirichlet_alpha.CLAIM, _alphas(a100=(0.865, 5)))
    assert v.holds is True and "| alpha=100 | 86.50 |" in v.table


def test_dirichlet_alpha_reads_every_curve_over_the_rounds_all_ran():
    # alpha = 10's rounds 31-40 (the local-epochs claim's) jump to 99%: not read here
    r = _alphas()
    a10 = curve(0.84, 9, 30) + [0.99] * 10
    r[claim_dirichlet_alpha.ALPHA10.name] = exp({"fedavg-full": cell(a10)})
    v = judge(claim_dirichlet_alpha.CLAIM, r)
    assert v.holds is True and "| alpha=10 | 84.00 |" in v.table and "first 30 rounds" in v.table


def test_dirichlet_alpha_does_not_hold_without_a_decline_or_slowdown():
    v = over_seeds(claim_dirichlet_alpha.CLAIM, [_alphas(iid=(0.80, 6), seed=s) for s in range(3)])
    assert v.holds is False and "'end acc IID - alpha=10 (points)'" in v.text
    assert "alpha=10 ends" in v.text
    fast = [_alphas(iid=(0.86, 16), a1=(0.76, 6), seed=s) for s in range(3)]
    v = over_seeds(claim_dirichlet_alpha.CLAIM, fast)
    assert v.holds is False and "'convergence round alpha=1 - IID (rounds)'" in v.text


def test_dirichlet_alpha_cannot_say_when_seeds_straddle():
    # alpha = 1 ends 10, 1 and 4 points below IID: the decline's interval straddles 2 points
    seeds = [_alphas(a1=(0.86 - d, 16), seed=s) for s, d in enumerate((0.10, 0.01, 0.04))]
    v = over_seeds(claim_dirichlet_alpha.CLAIM, seeds)
    assert v.holds is None and "straddles" in v.text and "IID - alpha=1" in v.text


def test_dirichlet_alpha_names_a_still_rising_alpha1():
    r = _alphas() | {
        claim_dirichlet_alpha.ALPHA1.name: exp({"fedavg-full": cell(rising(30, per_round=0.015))})
    }
    assert "alpha=1 is still rising" in judge(claim_dirichlet_alpha.CLAIM, r).text


def test_dirichlet_alpha_missing():
    r = {claim_dirichlet_alpha.IID.name: exp({"fedavg-full": cell(curve(0.8, 5, 30))})}
    v = judge(claim_dirichlet_alpha.CLAIM, r)
    assert v.holds is None and "alpha-10" in v.text


# ---- FedIR (Fig. 4) --------------------------------------------------------------------------


def _fedir(gaps, alphas=(10, 1), seed=0, avg_rounds=None):
    """FedAvg at 0.80 (alpha = 10: 0.82) and FedIR ``gaps`` points from it, per alpha; FedAvg
    at alpha = 10 runs 40 rounds (the local-epochs claim's), FedIR 30."""
    r = {}
    for alpha, gap in zip(alphas, gaps, strict=True):
        base = 0.82 if alpha == 10 else 0.80
        n = avg_rounds or (40 if alpha == 10 else 30)
        r[f"alpha-{alpha}"] = exp({"fedavg-full": cell(curve(base, 10, n, jitter=1, phase=seed))})
        ir = curve(base + gap / 100, 10, 30, jitter=1, phase=seed + 3)
        r[f"fedir-alpha{alpha}"] = exp({"fedir-full": cell(ir)})
    return r


def test_fedir_holds_where_it_does_not_improve():
    v = over_seeds(claim_fedir.CLAIM, [_fedir((-1.5 + s, -4.0 + s)) for s in range(3)])
    assert v.holds is True, v.text
    v = judge(claim_fedir.CLAIM, _fedir((1.0, -4.0)))  # level with FedAvg is no improvement
    assert v.holds is True and "| alpha=10 (30 rounds) | 82.00 | 83.00 | +1.00 |" in v.table
    v = judge(claim_fedir.CLAIM, _fedir((-0.5, -1.5, -4.0), alphas=(100, 10, 1)))
    assert v.holds is True and "alpha=100" in v.table


def test_fedir_does_not_hold_where_it_improves():
    v = over_seeds(claim_fedir.CLAIM, [_fedir((-1.0, 4.0 + s), seed=s) for s in range(3)])
    assert v.holds is False and "'alpha=1: FedIR - FedAvg end acc (points)'" in v.text
    assert "at alpha = 1 FedIR ends +4" in v.text


def test_fedir_cannot_say_when_seeds_straddle():
    seeds = [_fedir((g, -3.0), seed=s) for s, g in enumerate((-1.0, 3.0, 5.0))]
    v = over_seeds(claim_fedir.CLAIM, seeds)
    assert v.holds is None and "straddles" in v.text and "alpha=10" in v.text and v.more_seeds


def test_fedir_guard_trips_when_fedir_learned_nothing():
    r = _fedir((-1.0, -3.0)) | {"fedir-alpha1": exp({"fedir-full": cell([PRIOR] * 30)})}
    v = over_seeds(claim_fedir.CLAIM, [r] * 3)
    assert v.holds is None and "precondition 'alpha=1 FedIR: learned" in v.text


def test_fedir_reads_fedavg_over_fedirs_rounds():
    # FedAvg at alpha = 10 ran 40 rounds and jumps to 95% after round 30: not compared
    r = _fedir((-1.0, -3.0))
    r["alpha-10"] = exp({"fedavg-full": cell(curve(0.82, 10, 30) + [0.95] * 10)})
    v = judge(claim_fedir.CLAIM, r)
    assert v.holds is True and "| alpha=10 (30 rounds) | 82.00 |" in v.table


def test_fedir_missing():
    r = _fedir((-1.0, -3.0))
    del r["fedir-alpha10"]
    assert judge(claim_fedir.CLAIM, r).holds is None


# ---- FedVC (Fig. 5) --------------------------------------------------------------------------

ROUNDS_VC = claim_fedvc.CPU_ROUNDS


def _fedvc(gain, vc_conv=10, name="fedvc-std50", seed=0, vc=None):
    avg = curve(0.78, 10, ROUNDS_VC, jitter=1.5, phase=seed)
    vc = vc or curve(0.78 + gain / 100, vc_conv, ROUNDS_VC, jitter=1.5, phase=seed + 2)
    cells = {"fedavg-full": cell(avg), "fedvc-full": cell(vc)}
    return {name: exp(cells, **{"federation.rounds": ROUNDS_VC})}


def test_fedvc_holds_better_and_as_fast():
    v = over_seeds(claim_fedvc.CLAIM, [_fedvc(1.5 + s / 2, vc_conv=11, seed=s) for s in range(3)])
    assert v.holds is True, v.text
    both = _fedvc(2.0) | _fedvc(1.0, name="fedvc-std30")
    assert judge(claim_fedvc.CLAIM, both).holds is True


def test_fedvc_does_not_hold_below_fedavg_or_slower():
    v = over_seeds(claim_fedvc.CLAIM, [_fedvc(-2.0 - s, seed=s) for s in range(3)])
    assert v.holds is False and "at STD 50% FedVC ends -2" in v.text
    slow = [_fedvc(2.0, vc_conv=20, seed=s) for s in range(3)]  # 10 of 40 rounds later
    v = over_seeds(claim_fedvc.CLAIM, slow)
    assert v.holds is False and "convergence round) (share of rounds)' lies on" in v.text


def test_fedvc_cannot_say_when_seeds_straddle():
    seeds = [_fedvc(g, seed=s) for s, g in enumerate((2.0, -0.5, 0.5))]
    v = over_seeds(claim_fedvc.CLAIM, seeds)
    assert v.holds is None and "straddles" in v.text
    assert judge(claim_fedvc.CLAIM, {}).holds is None


def test_fedvc_guards_trip_on_a_rising_or_unlearned_curve():
    still = rising(ROUNDS_VC, per_round=0.012)  # +24 points over its second half
    v = over_seeds(claim_fedvc.CLAIM, [_fedvc(0, seed=s, vc=still) for s in range(3)])
    assert v.holds is None and "precondition 'STD 50% FedVC: trend over its second half" in v.text
    assert "FedVC at STD 50% is still rising at the end" in v.text
    flat = [PRIOR + 0.005] * ROUNDS_VC
    v = over_seeds(claim_fedvc.CLAIM, [_fedvc(0, seed=s, vc=flat) for s in range(3)])
    assert v.holds is None and "'STD 50% FedVC: learned (points over its start)'" in v.text


# ---- server optimisers (§4.3, Figs. 8-9) -----------------------------------------------------

JUMPY = [0.5, 0.6, 0.4, 0.7, 0.55, 0.7, 0.5, 0.72, 0.6, 0.75]
SMOOTH = [0.5, 0.54, 0.58, 0.6, 0.62, 0.64, 0.65, 0.66, 0.67, 0.68]  # ends 0.6 above JUMPY


def _opt(avg, adam, adagrad=None):
    cells = {"fedavg-full": cell(avg), "fedadam-full": cell(adam)}
    cells["fedadagrad-full"] = cell(adagrad or adam)
    return {claim_server_opt.LENET5.name: exp(cells)}


def _shift(accs, d):
    return [a + d for a in accs]


def test_server_opt_holds_steadier_and_as_high():
    seeds = [_opt(_shift(JUMPY, s / 100), _shift(SMOOTH, s / 200)) for s in range(3)]
    v = over_seeds(claim_server_opt.CLAIM, seeds)
    assert v.holds is True, v.text


def test_server_opt_does_not_hold_when_jumpier_or_lower():
    seeds = [_opt(_shift(SMOOTH, s / 100), _shift(JUMPY, s / 100)) for s in range(3)]
    v = over_seeds(claim_server_opt.CLAIM, seeds)
    assert v.holds is False
    assert "'lenet5 fedadam: round-to-round std - FedAvg's (points)'" in v.text
    low = [0.30 + 0.01 * i for i in range(10)]  # steady but 25 points below FedAvg's end
    v = over_seeds(claim_server_opt.CLAIM, [_opt(JUMPY, low, SMOOTH)] * 3)
    assert v.holds is False and "'lenet5 fedadam: end acc below FedAvg (points)'" in v.text


def test_server_opt_cannot_say_when_seeds_straddle_or_an_optimiser_learned_nothing():
    # FedAdam ends 1, 5 and 0 points below FedAvg: the interval straddles the 2 points
    ends = (0.01, 0.05, 0.0)
    seeds = [_opt(JUMPY, _shift(SMOOTH, -0.006 - d)) for d in ends]
    v = over_seeds(claim_server_opt.CLAIM, seeds)
    assert v.holds is None and "straddles" in v.text and "end acc below FedAvg" in v.text
    stuck = [PRIOR + 0.001 * (i % 2) for i in range(10)]
    v = over_seeds(claim_server_opt.CLAIM, [_opt(JUMPY, SMOOTH, stuck)] * 3)
    assert v.holds is None and "precondition 'lenet5 fedadagrad: learned" in v.text
    assert over_seeds(claim_server_opt.CLAIM, [{}] * 3).holds is None


def test_a_verdict_over_three_seeds_through_decide():
    """The whole path: per-seed records of one experiment, the rule hash they ran under."""
    claim = claim_server_opt.CLAIM
    per = {
        s: _opt(_shift(JUMPY, s / 100), _shift(SMOOTH, s / 100))[claim_server_opt.LENET5.name]
        for s in range(3)
    }
    res = ExperimentResult(
        {},
        {s: r.runs[0] for s, r in per.items()},
        60.0,
        {s: PRIOR for s in per},
        rules={claim.id: claim.rule_hash()},
    )
    v = decide(claim, {claim_server_opt.LENET5.name: res}, [claim_server_opt.LENET5.name], 3)
    assert v.holds is True and v.seeds == 3
    other = ExperimentResult(res.params, res.runs, 60.0, res.majorities, rules={claim.id: "x"})
    v = decide(claim, {claim_server_opt.LENET5.name: other}, [claim_server_opt.LENET5.name], 3)
    assert v.holds is None and "refused" in v.text


# ---- the experiments, typed in every profile -------------------------------------------------


def test_seed002_experiments_type_in_every_profile():
    claims = registry.select(IDS)
    for profile in PROFILES:
        items = {
            it.experiment.name: it.params for it in runs.plan(claims, profile, REPO / "params.yaml")
        }
        want = {"epochs-e1", "epochs-e4", "alpha-iid", "alpha-10", "alpha-1"}
        want |= {"fedir-alpha10", "fedir-alpha1", "fedvc-std50", "server-opt-lenet5"}
        if profile == "gpu":
            want |= {"alpha-100", "fedir-alpha100", "fedvc-std30", "server-opt-lenet5bn"}
        assert want <= set(items)
        e4, vc = items["epochs-e4"], items["fedvc-std50"]
        assert e4.client.local_epochs == 4 and items["alpha-10"].client.local_epochs == 2
        assert e4.partition.dirichlet_clientwise.alpha == 10  # the E curves run at alpha = 10
        assert tuple(vc.grid.algorithms) == ("fedavg", "fedvc")
        assert vc.partition.dirichlet_clientwise.sizes == "normal"
        assert vc.partition.dirichlet_clientwise.size_rel_std == 0.5
        assert vc.partition.dirichlet_clientwise.alpha == 1
        n_vc = vc.grid.algorithm("fedvc").n_vc
        clients = vc.partition.num_clients
        assert n_vc * clients == (vc.data.train_subset or 60000)  # N_VC = the mean size
        assert items["alpha-iid"].partition.scheme == "iid"
        assert tuple(items["fedir-alpha1"].grid.algorithms) == ("fedir",)
    cpu = {it.experiment.name: it.params for it in runs.plan(claims, "cpu", REPO / "params.yaml")}
    assert cpu["alpha-1"].partition.num_clients == 10 and cpu["alpha-1"].federation.rounds == 30
    # local epochs: every E gets 80 local epochs (E=2 is the alpha = 10 run)
    rounds = {e: cpu[n].federation.rounds for e, n in ((1, E1), (2, E2), (4, E4))}
    assert {e * r for e, r in rounds.items()} == {claim_local_epochs.EPOCHS} and rounds[1] == 80
    assert cpu["fedir-alpha10"].federation.rounds == 30  # read against alpha-10's first 30
    assert cpu["fedvc-std50"].federation.rounds == 40
    so = cpu["server-opt-lenet5"]
    assert (so.partition.num_clients, so.federation.rounds, so.data.train_subset) == (10, 36, 3000)
    assert so.partition.dirichlet_clientwise.alpha == 1


def test_the_plots_draw():
    assert claim_local_epochs.CLAIM.plot(_epochs()) is not None
    assert claim_dirichlet_alpha.CLAIM.plot(_alphas()) is not None
    assert claim_fedir.CLAIM.plot(_fedir((-1.0, -3.0))) is not None
    assert claim_fedvc.CLAIM.plot(_fedvc(2.0)) is not None
    assert claim_server_opt.CLAIM.plot(_opt(JUMPY, SMOOTH)) is not None
    for claim in registry.select(IDS):
        assert claim.plot({}) is None
