"""`fedapt reproduce`: records this code computes. The interval verdict engine, each record's
code version over the plug-ins it uses only, who computed it (`computed_by`), the rules it ran
under, the refusals, the seed policy's extra seeds and settings derived from other records."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from tasks.reproduce import claim_adapters, recording, records, runs
from tasks.reproduce.spec import Check, Claim, Experiment, Reading, SeedPolicy
from tasks.reproduce.verdict import combine, interval
from tests.tasks.reproduce.support import UNTUNED, finish, plan_adapters

REPO = Path(__file__).resolve().parents[3]


# ---- the interval engine ----------------------------------------------------------------


def _claim(**kw):
    return Claim(
        id="x",
        title="t",
        source="s",
        paper="p",
        experiments=(),
        measure=lambda r: Reading(),
        rule="r",
        tolerance="",
        thresholds={"gap": 1.0},
        **kw,
    )


def _readings(values, side="<=", threshold=1.0, guard=None):
    out = []
    for s, v in enumerate(values):
        checks = [Check("gap", v, side, threshold)]
        if guard is not None:
            checks.append(Check("learned", guard[s], ">=", 2.0, guard=True))
        out.append((s, Reading(tuple(checks))))
    return out


def test_interval_is_the_student_t_interval_of_the_mean():
    iv = interval([1.0, 2.0, 3.0])
    # mean 2, sd 1, t(0.975, 2) = 4.3027: half-width 4.3027 / sqrt(3) = 2.4841
    assert iv.mean == 2.0 and iv.low == pytest.approx(-0.4841, abs=1e-4)
    assert iv.high == pytest.approx(4.4841, abs=1e-4)
    assert interval([5.0]).low == interval([5.0]).high == 5.0


def test_holds_fails_and_straddles_by_the_interval():
    claim = _claim()
    assert combine(claim, _readings([0.1, 0.2, 0.3])).holds is True
    v = combine(claim, _readings([3.0, 3.5, 4.0]))
    assert v.holds is False and "lies on the other side" in v.text
    v = combine(claim, _readings([0.0, 1.5, 0.5]))  # every seed but one on the side
    assert v.holds is None and "straddles" in v.text and v.more_seeds and v.seeds == 3
    # the seed policy: no seed beyond its most
    v = combine(_claim(seeds=SeedPolicy(start=3, most=3)), _readings([0.0, 1.5, 0.5]))
    assert v.holds is None and not v.more_seeds and "the most the seed policy allows" in v.text
    # every seed on the side is not enough when their spread reaches over the threshold
    assert combine(claim, _readings([0.99, 0.0, 0.9])).holds is None
    # too few seeds: cannot say yet, and no seed asked for before the start is reached
    v = combine(claim, _readings([0.1, 0.2]), min_seeds=3)
    assert v.holds is None and "Cannot say yet" in v.text and not v.more_seeds


def test_a_guard_not_met_makes_the_claim_undecided_not_failed():
    claim = _claim()
    v = combine(claim, _readings([3.0, 3.5, 4.0], guard=[0.5, 1.0, 0.2]))
    assert v.holds is None and "the precondition 'learned'" in v.text
    assert not v.more_seeds  # wholly below: more seeds would not meet it
    v = combine(claim, _readings([0.1, 0.2, 0.3], guard=[5.0, 1.0, 6.0]))
    assert v.holds is None and v.more_seeds  # straddling: more seeds may meet it
    assert combine(claim, _readings([0.1, 0.2, 0.3], guard=[5, 6, 7])).holds is True
    v = combine(claim, _readings([0.1, 0.2, 0.3], guard=[5, None, 7]))
    assert v.holds is None and "not measured on every seed" in v.text


def test_rule_hash_covers_text_thresholds_window_and_seed_policy():
    base = _claim()
    h = base.rule_hash()
    assert len(h) == 12 and h == _claim().rule_hash()
    assert dataclasses.replace(base, rule="other").rule_hash() != h
    assert dataclasses.replace(base, thresholds={"gap": 1.5}).rule_hash() != h
    assert dataclasses.replace(base, window=3).rule_hash() != h
    assert dataclasses.replace(base, seeds=SeedPolicy(most=5)).rule_hash() != h
    assert dataclasses.replace(base, title="same rule, new words").rule_hash() == h


def test_a_check_side_outside_the_four_is_refused():
    with pytest.raises(ValueError, match="side"):
        Check("x", 1.0, "==", 1.0)


# ---- the code a record is computed by ----------------------------------------------------


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """A copy of the number code (fedcore, models, tasks), its drivers (flows) and
    constraints.txt."""
    root = tmp_path_factory.mktemp("code")
    for top in (*records.CODE, "flows"):
        shutil.copytree(REPO / top, root / top, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "constraints.txt", root / "constraints.txt")
    return root


FEDAVG = frozenset({"algorithm:fedavg", "adapter:full"})
PROX = frozenset({"algorithm:fedprox", "adapter:residual"})

NEW_ALGORITHM = '''
from typing import ClassVar

from fedcore.algorithms.base import FederatedAlgorithm


class FedNew(FederatedAlgorithm):
    """A new algorithm nobody ran yet."""

    name: ClassVar[str] = "fednew"

    def weight(self, n):
        return 2 * n
'''


def _edit(path: Path, old: str, new: str) -> str:
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, 1))
    return text


def test_adding_an_algorithm_or_adapter_a_record_does_not_use_leaves_it_current(tree):
    before = {u: records.code_version(tree, u) for u in (FEDAVG, PROX, None)}
    init = tree / "fedcore" / "algorithms" / "__init__.py"
    new = tree / "fedcore" / "algorithms" / "fednew.py"
    new.write_text(NEW_ALGORITHM)
    old = _edit(init, "from fedcore.algorithms.fedir import FedIR\n",
                "from fedcore.algorithms.fedir import FedIR\n"
                "from fedcore.algorithms.fednew import FedNew\n")  # fmt: skip
    _edit(init, "        Scaffold,\n", "        Scaffold,\n        FedNew,\n")
    try:
        assert records.code_version(tree, FEDAVG) == before[FEDAVG]
        assert records.code_version(tree, PROX) == before[PROX]
        assert records.code_version(tree, None) != before[None]  # the whole code changed
        uses_it = frozenset({"algorithm:fednew", "adapter:full"})
        v = records.code_version(tree, uses_it)
        _edit(new, "2 * n", "3 * n")
        assert records.code_version(tree, uses_it) != v  # ... and counts where it is used
        assert records.code_version(tree, FEDAVG) == before[FEDAVG]
    finally:
        init.write_text(old)
        new.unlink()
    assert records.code_version(tree, None) == before[None]


def test_a_module_nothing_runs_imports_leaves_every_record_current(tree):
    """A mechanism being built (a new package no driver reaches) changes no record's code
    version; the first import of it from code a run reaches (a function body counts, a driver
    counts) does."""
    before = {u: records.code_version(tree, u) for u in (FEDAVG, PROX, None)}
    pkg = tree / "fedcore" / "mechanism_in_progress"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "noise.py").write_text("def noise(x):\n    return x + 1\n")
    agg = tree / "fedcore" / "aggregate.py"
    flow = tree / "flows" / "experiment.py"
    try:
        assert {u: records.code_version(tree, u) for u in before} == before
        old = agg.read_text()
        agg.write_text(
            old + "\n\ndef _later(x):\n    from fedcore.mechanism_in_progress import noise\n"
        )
        assert all(records.code_version(tree, u) != v for u, v in before.items())
        agg.write_text(old)
        old = flow.read_text()
        flow.write_text(old + "\nimport fedcore.mechanism_in_progress.noise\n")
        assert all(records.code_version(tree, u) != v for u, v in before.items())
        flow.write_text(old)
        (pkg / "noise.py").write_text("def noise(x):\n    return x + 2\n")  # still unreached
        assert {u: records.code_version(tree, u) for u in before} == before
    finally:
        shutil.rmtree(pkg)
    assert {u: records.code_version(tree, u) for u in before} == before


def test_a_module_only_an_unused_plugin_imports_is_not_its_records_code(tree):
    """A helper module that only FedProx's file imports counts for FedProx's records, not
    FedAvg's."""
    v_avg, v_prox = records.code_version(tree, FEDAVG), records.code_version(tree, PROX)
    prox = tree / "fedcore" / "algorithms" / "fedprox.py"
    helper = tree / "fedcore" / "algorithms" / "prox_term.py"
    old = prox.read_text()
    helper.write_text("MU = 0.01\n")
    mark = "@dataclass(frozen=True)\nclass FedProx("
    prox.write_text(old.replace(mark, "from fedcore.algorithms import prox_term\n\n\n" + mark))
    try:
        v_prox_helper = records.code_version(tree, PROX)
        assert v_prox_helper != v_prox  # the new import is FedProx's code
        helper.write_text("MU = 0.02\n")
        assert records.code_version(tree, FEDAVG) == v_avg
        assert records.code_version(tree, PROX) != v_prox_helper
    finally:
        prox.write_text(old)
        helper.unlink()


def test_records_of_the_former_rule_are_carried_over_only_for_the_same_code(tmp_path):
    """``records.migrate``: a record the all-files rule stamped with this checkout's version is
    restamped under the imports rule (computed_by and revalidations that named the same
    version with it); one of other code is left stale; a carried-over one is not touched
    again."""
    from tasks.reproduce import codeversion

    flat = {"grid.algorithms": ["fedavg"], "grid.adapters": ["full"]}
    used = records.uses(flat)
    former = codeversion.all_files_version(used=used, sources=dict(records.loaded_sources()))
    same, other = tmp_path / "same.json", tmp_path / "other.json"
    base = {"params": flat, "seeds": {}, "numerics": "portable"}
    same.write_text(json.dumps({**base, "code": former, "computed_by": {"code": former},
                                "revalidated": [{"to": former}, {"to": "0123456789ab"}]}))  # fmt: skip
    other.write_text(json.dumps({**base, "code": "0123456789ab",
                                 "computed_by": {"code": "0123456789ab"}}))  # fmt: skip
    assert not records.is_current(json.loads(other.read_text()), flat)
    assert records.is_current(json.loads(same.read_text()), flat)  # read-only: before migrating
    assert records.migrate(same) and not records.migrate(other)
    rec = json.loads(same.read_text())
    now = records.record_code(flat)
    assert now != former and rec["code"] == rec["computed_by"]["code"] == now
    assert rec["code_rule"] == records.RULE and rec["migrated"]["from"] == former
    assert [c["to"] for c in rec["revalidated"]] == [now, "0123456789ab"]
    assert records.is_current(rec, flat)
    assert json.loads(other.read_text())["code"] == "0123456789ab"
    text = same.read_text()
    assert not records.migrate(same) and same.read_text() == text


def test_an_unused_plugin_changing_leaves_a_record_current_a_used_one_not(tree):
    v_avg, v_prox = records.code_version(tree, FEDAVG), records.code_version(tree, PROX)
    prox = tree / "fedcore" / "algorithms" / "fedprox.py"
    old = prox.read_text()
    body = old.replace(
        'name: ClassVar[str] = "fedprox"', 'name: ClassVar[str] = "fedprox"\n    x = 1'
    )
    prox.write_text(body)
    try:
        assert records.code_version(tree, FEDAVG) == v_avg
        assert records.code_version(tree, PROX) != v_prox
    finally:
        prox.write_text(old)


def test_the_base_a_used_plugin_derives_from_and_shared_code_always_count(tree):
    v_prox, v_avg = records.code_version(tree, PROX), records.code_version(tree, FEDAVG)
    base = tree / "fedcore" / "algorithms" / "base.py"
    old = base.read_text()
    base.write_text(old + "\nEXTRA = 1\n")
    try:
        assert records.code_version(tree, PROX) != v_prox  # FedProx derives from it
    finally:
        base.write_text(old)
    agg = tree / "fedcore" / "aggregate.py"
    old = agg.read_text()
    agg.write_text(old + "\nEXTRA = 1\n")
    try:
        assert records.code_version(tree, PROX) != v_prox
        assert records.code_version(tree, FEDAVG) != v_avg
    finally:
        agg.write_text(old)


def test_the_config_layer_is_the_records_key_not_its_code(tree):
    """A new check or message in the params layer leaves every record current: what the
    params validate to is the record's key (``config_key``), which a changed default changes."""
    v = records.code_version(tree, FEDAVG)
    sections = tree / "tasks" / "config" / "sections.py"
    old = sections.read_text()
    sections.write_text(old + "\n\ndef _stricter(x):\n    return x is not True\n")
    try:
        assert records.code_version(tree, FEDAVG) == v
    finally:
        sections.write_text(old)
    from tasks.config import load_params
    from tasks.reproduce.runs import config_key

    one = config_key(load_params(overrides=["federation.rounds=5"]).flat())
    two = config_key(load_params(overrides=["federation.rounds=6"]).flat())
    assert one != two


def test_comments_and_docstrings_do_not_change_a_number(tree):
    v = records.code_version(tree, FEDAVG)
    agg = tree / "fedcore" / "aggregate.py"
    old = agg.read_text()
    agg.write_text(old.replace('"""', '"""Reworded. ', 1) + "\n# a comment\n")
    try:
        assert records.code_version(tree, FEDAVG) == v
    finally:
        agg.write_text(old)


def test_uses_reads_the_grid():
    flat = {"grid.algorithms": ["fedavg", "fedprox"], "grid.adapters": ["full"]}
    assert records.uses(flat) == {"algorithm:fedavg", "algorithm:fedprox", "adapter:full"}


# ---- computed_by, the rules, refusals ----------------------------------------------------


def _done(tmp_path):
    it = plan_adapters(tmp_path)
    finish(it)
    recording.register(it)
    recording.write_stamp(it, 1.0, resumed=False)
    recording.write_record(it)
    return it, json.loads(it.record.read_text())


def test_a_record_keeps_the_rules_registered_before_its_run(tmp_path):
    it, rec = _done(tmp_path)
    readers = runs.readers(it.experiment.name)  # every claim that reads it (train-time too)
    assert rec["rules"] == {c.id: c.rule_hash() for c in readers}
    assert rec["rules"]["adapters"] == claim_adapters.CLAIM.rule_hash()
    assert runs.refusal(it, "ci") is None  # the smoke test does not ask for a clean tree


def test_refusals_name_the_record_and_the_fix(tmp_path):
    it, rec = _done(tmp_path)
    rec["computed_by"]["clean"] = False
    it.record.write_text(json.dumps(rec))
    line = runs.refusal(it, "cpu")
    assert str(it.record) in line and "uncommitted changes" in line and "--rerun-stale" in line
    rec["computed_by"]["clean"] = True
    rec["rules"] = {"adapters": "000000000000"}
    it.record.write_text(json.dumps(rec))
    line = runs.refusal(it, "cpu")
    assert "ran under rule 000000000000 of claim 'adapters'" in line
    assert claim_adapters.CLAIM.rule_hash() in line
    del rec["computed_by"]
    it.record.write_text(json.dumps(rec))
    assert "no computed_by" in runs.refusal(it, "cpu")


def test_a_verdict_never_reads_a_record_of_another_rule():
    from tasks.reproduce.spec import ExperimentResult
    from tasks.reproduce.verdict import decide

    claim = dataclasses.replace(UNTUNED, id="adapters")
    result = ExperimentResult({}, {0: {}}, 1.0, {}, {}, {"adapters": "000000000000"})
    v = decide(claim, {"adapters-dir05": result}, ["adapters-dir05"], 1)
    assert v.holds is None and v.text.startswith("refused: adapters-dir05")


def test_the_cli_refuses_a_record_of_a_dirty_tree_in_one_line(tmp_path):
    from typer.testing import CliRunner

    from flows.cli import app

    it = plan_adapters(tmp_path)
    cpu = runs.plan([UNTUNED], "cpu", REPO / "params.yaml",
                    [f"experiment.reports_dir={tmp_path / 'reports'}"], tmp_path / "out")[0]  # fmt: skip
    finish(cpu, seeds=(0, 1, 2))
    recording.register(cpu)
    recording.write_stamp(cpu, 1.0, resumed=False)
    recording.write_record(cpu)
    rec = json.loads(cpu.record.read_text())
    rec["computed_by"]["clean"] = False
    cpu.record.write_text(json.dumps(rec))
    res = CliRunner().invoke(
        app,
        ["reproduce", "--profile", "cpu", "--claim", "adapters", "--report", "--out",
         str(tmp_path / "out"), "--set", f"experiment.reports_dir={tmp_path / 'reports'}"],
    )  # fmt: skip
    assert res.exit_code != 0 and "Traceback" not in res.output
    assert str(cpu.record) in res.output and "uncommitted changes" in res.output
    assert not (tmp_path / "out" / "verdicts.json").exists()
    assert it.params.experiment.name != cpu.params.experiment.name


# ---- the seed policy's extra seeds, and settings derived from other records --------------


def test_an_extra_seed_joins_its_record(tmp_path):
    it, rec = _done(tmp_path)
    extra = recording.extra_seed(it, 2, REPO / "params.yaml")
    assert extra.record == it.record and extra.params.experiment.seeds == (2,)
    assert extra.dir.name == f"{it.params.experiment.name}-seed2"
    assert runs.status(extra) != "done"
    finish(extra, seeds=(2,))
    recording.register(extra)
    recording.write_stamp(extra, 1.0, resumed=False)
    recording.merge_seed(it, extra, 2)
    new = json.loads(it.record.read_text())
    assert sorted(new["seeds"]) == ["0", "1", "2"] and new["seed_runs"][0]["seed"] == 2
    assert runs.status(extra) == "done" and runs.status(it) == "done"
    assert runs.results([it])[it.experiment.name].seeds == (0, 1, 2)
    # a seed run under another rule never joins
    stamp = json.loads((extra.dir / runs.STAMP).read_text())
    stamp["rules"] = {"adapters": "000000000000"}
    (extra.dir / runs.STAMP).write_text(json.dumps(stamp))
    with pytest.raises(ValueError, match="another configuration, code or rules"):
        recording.merge_seed(it, extra, 2)


def test_an_experiment_derives_its_settings_from_the_records_it_runs_after(tmp_path):
    first = dataclasses.replace(claim_adapters.DIR05, tune={})

    def derive(results):
        (result,) = results.values()
        return (f"federation.rounds={len(result.seeds) + 1}",)

    second = Experiment(
        "adapters-dir05-after",
        protocol=claim_adapters.DIR05.protocol,
        scale=claim_adapters.DIR05.scale,
        after=(first.name,),
        derive={"ci": derive},
    )
    claim = dataclasses.replace(UNTUNED, experiments=(first, second))
    sets = [f"experiment.reports_dir={tmp_path / 'reports'}"]
    a, b = runs.plan([claim], "ci", REPO / "params.yaml", sets, tmp_path / "out")
    assert b.waiting and runs.status(b) == "waiting"
    finish(a)
    recording.register(a)
    recording.write_stamp(a, 1.0, resumed=False)
    recording.write_record(a)
    b = runs.replan(b, [claim], "ci", REPO / "params.yaml", sets, tmp_path / "out")
    assert not b.waiting and b.params.federation.rounds == 3
    assert "federation.rounds=3" in b.overrides


def test_the_seed_policy_runs_one_seed_more_while_an_interval_straddles(tmp_path, monkeypatch):
    """`fedapt reproduce`'s loop after the experiments: a claim whose interval straddles gets
    seed 3, then seed 4, each joining the record, until its verdict is decided."""
    import logging

    from flows import reproduce as flow
    from tasks.reproduce import measures

    accs = {0: 0.30, 1: 0.62, 2: 0.45, 3: 0.40, 4: 0.42, 5: 0.41}

    def measure(results):
        cell = next(iter(results.values())).cells["fedavg-full"]
        return Reading((Check("acc", measures.final_accuracy(cell), "<=", 0.6),))

    exp_ = dataclasses.replace(claim_adapters.DIR05, tune={})
    claim = dataclasses.replace(
        UNTUNED, id="adapters", experiments=(exp_,), measure=measure, plot=None
    )
    monkeypatch.setattr(runs, "readers", lambda name: (claim,))
    sets = [f"experiment.reports_dir={tmp_path / 'reports'}"]
    (it,) = runs.plan([claim], "cpu", REPO / "params.yaml", sets, tmp_path / "out")
    finish(it, seeds=(0, 1, 2))
    for s in (0, 1, 2):
        metrics = it.dir / f"seed-{s}" / "runs" / "fedavg-full" / "metrics.json"
        metrics.write_text(json.dumps({"rounds": [{"round": 1, "accuracy": accs[s]}]}))
    recording.register(it)
    recording.write_stamp(it, 1.0, resumed=False)
    recording.write_record(it)
    ran = []

    def fake_run(item, root, params_file, name, resumed):
        (seed,) = item.params.experiment.seeds
        ran.append(seed)
        finish(item, seeds=(seed,))
        metrics = item.dir / f"seed-{seed}" / "runs" / "fedavg-full" / "metrics.json"
        metrics.write_text(json.dumps({"rounds": [{"round": 1, "accuracy": accs[seed]}]}))
        recording.register(item)
        recording.write_stamp(item, 1.0, resumed=False)
        return 1.0

    monkeypatch.setattr(flow, "_run_experiment", fake_run)
    flow._more_seeds([claim], [it], "cpu", str(REPO / "params.yaml"), tmp_path, logging.getLogger())
    # 3 seeds straddle 0.6 ([0.06, 0.85]); with seed 3 still ([0.23, 0.66]),
    # with seed 4 it lies below ([0.29, 0.58]): decided, no seed 5
    assert ran == [3, 4]
    rec = json.loads(it.record.read_text())
    assert sorted(rec["seeds"], key=int) == ["0", "1", "2", "3", "4"]
    from tasks.reproduce.report import verdicts

    v = verdicts([claim], [it], runs.results([it]), "cpu")[claim.id]
    assert v.holds is True and v.seeds == 5 and not v.more_seeds


def test_every_verdict_window_is_measured_on_the_whole_test_split():
    """cpu and gpu: each experiment's last ``window`` evaluations (its readers' largest)
    measure every test row (federation.whole_test_last; a tuning run as the experiment it
    tunes, though it evaluates on its validation split); the ci smoke test keeps its rows."""
    from tasks.reproduce.registry import CLAIMS

    for profile in ("cpu", "gpu"):
        for item in runs.plan(CLAIMS, profile):
            windows = [c.window for c in runs.readers(item.tunes or item.experiment.name)]
            got = item.params.federation.whole_test_last
            assert got == max(windows or [0]), (profile, item.experiment.name)
    assert all(i.params.federation.whole_test_last == 0 for i in runs.plan(CLAIMS, "ci"))


def test_a_stamp_of_either_rule_names_the_same_code_only_for_this_code():
    """A run registered under the former rule and finished under this one is not a run whose
    code changed under it (its record stays clean); a stamp of other code is."""
    from tasks.reproduce import codeversion

    flat = {"grid.algorithms": ["fedprox"], "grid.adapters": ["residual"]}
    used = records.uses(flat)
    former = codeversion.all_files_version(used=used, sources=dict(records.loaded_sources()))
    assert records.same_code(former, flat) and records.same_code(records.record_code(flat), flat)
    assert not records.same_code("0123456789ab", flat) and not records.same_code(None, flat)


def test_a_run_registered_under_the_former_rule_keeps_its_registration(tmp_path):
    """``records.migrate_stamp``: the stamp of a run in progress (registered under the former
    rule, resumed later) names this code under the new rule; one of other code is left."""
    from tasks.reproduce import codeversion

    flat = {"grid.algorithms": ["fedavg"], "grid.adapters": ["full"]}
    former = codeversion.all_files_version(
        used=records.uses(flat), sources=dict(records.loaded_sources())
    )
    stamp, other = tmp_path / "reproduce.json", tmp_path / "other.json"
    stamp.write_text(json.dumps({"rules": {}, "computed_by": {"code": former, "clean": True}}))
    other.write_text(json.dumps({"rules": {}, "computed_by": {"code": "0123456789ab"}}))
    assert records.migrate_stamp(stamp, flat) and not records.migrate_stamp(other, flat)
    got = json.loads(stamp.read_text())
    assert got["computed_by"] == {"code": records.record_code(flat), "clean": True}
    assert records.same_code(got["computed_by"]["code"], flat)
    assert not records.migrate_stamp(stamp, flat)
