"""`fedapt reproduce`: the profiles' experiments as typed params, what counts as finished,
shared frozen bases, the report, the DVC pipeline, the bad-profile line, and the gpu profile
against `fedapt run`'s preflight. Verdicts: tests/tasks/reproduce/test_verdicts.py; the ci profile
end to end: tests/tasks/reproduce/test_ci.py (slow)."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli import app
from tasks.reproduce import claim_adapters, recording, records, registry, report, runs
from tasks.reproduce.spec import PROFILES, ExperimentResult, dedupe
from tests.tasks.reproduce.support import (
    MB,
    UNTUNED,
    cell,
    exp,
    finish,
    plan_adapters,
    transformer,
)


def two_seeds(result):
    """The same cells for seeds 0 and 1 (the ci profile's two), run under every claim's rule."""
    rules = {c.id: c.rule_hash() for c in registry.CLAIMS}
    prior = {0: result.majority, 1: result.majority}
    return ExperimentResult(
        result.params, {0: result.cells, 1: result.cells}, majorities=prior, rules=rules
    )


REPO = Path(__file__).resolve().parents[3]


# ---- the registry, the profiles, finished or not, the report --------------------------------


def test_every_profile_types_every_experiment():
    for profile in PROFILES:
        items = runs.plan(registry.CLAIMS, profile, REPO / "params.yaml")
        names = [it.params.experiment.name for it in items]
        assert len(names) == len(set(names)) and all(n.startswith(f"{profile}-") for n in names)
        assert {it.claim.id for it in items} == {
            c.id for c in registry.CLAIMS if c.runs(profile) and not registry.unmet(c)
        }
    ci = {
        it.experiment.name: it.params
        for it in runs.plan(registry.CLAIMS, "ci", REPO / "params.yaml")
    }
    assert ci["adapters-dir05"].federation.rounds == 2 and ci["adapters-dir05"].runtime.workers == 0
    gpu = {
        it.experiment.name: it.params
        for it in runs.plan(registry.CLAIMS, "gpu", REPO / "params.yaml")
    }
    assert gpu["fednilo-k350f25"].grid.algorithm("fednilo").K == 350
    assert gpu["adapters-dir05"].model.input_size == 72


def test_user_overrides_win_and_a_bad_one_is_one_line(tmp_path):
    from fedcore.errors import ConfigError

    items = runs.plan(
        registry.select(["adapters"]),
        "cpu",
        REPO / "params.yaml",
        ["federation.rounds=3", f"experiment.reports_dir={tmp_path}"],
    )
    (it,) = items
    assert it.params.federation.rounds == 3
    # an override that only makes sense on the claim's model (cifar_cnn has no width)
    (it,) = runs.plan(
        registry.select(["adapters"]),
        "cpu",
        REPO / "params.yaml",
        ["model.options.width=0.5", f"experiment.reports_dir={tmp_path}"],
    )
    assert it.params.model.options.width == 0.5
    assert it.dir == tmp_path / "reproduce" / "cpu" / "cpu-adapters-dir05"
    with pytest.raises(ConfigError, match="federation.roundz"):
        runs.plan(
            registry.select(["adapters"]), "cpu", REPO / "params.yaml", ["federation.roundz=3"]
        )


def test_unknown_claim_and_pending_hook():
    from fedcore.errors import UnknownNameError

    with pytest.raises(UnknownNameError, match="valid: adapters"):
        registry.select(["nope"])
    assert registry.unmet(registry.ANYTIME_PA) == []  # models/adapters/exits_pa.py
    assert registry.unmet(claim_adapters.CLAIM) == []
    lacking = dataclasses.replace(claim_adapters.CLAIM, requires=("adapter:nope", "model:cnn9"))
    assert registry.unmet(lacking) == ["adapter:nope", "model:cnn9"]


def test_dedupe_keeps_the_last_value():
    assert dedupe(["a.b=1", "a={}", "a.b=2", "c=1"]) == ["a={}", "a.b=2", "c=1"]


def test_status_from_records_and_the_experiment_folder(tmp_path):
    it = plan_adapters(tmp_path)
    assert it.record == tmp_path / "out" / "records" / f"{it.params.experiment.name}.json"
    assert runs.status(it) == "pending"
    (it.dir / "seed-1" / "checkpoints").mkdir(parents=True)  # a seed sweep's layout
    (it.dir / "seed-1" / "checkpoints" / "fedavg-full.pt").write_bytes(b"x")
    assert runs.status(it) == "resume"
    shutil.rmtree(it.dir / "seed-1")
    assert runs.status(it) == "pending"
    (it.dir / "checkpoints").mkdir(parents=True)  # one seed's
    (it.dir / "checkpoints" / "fedavg-full.pt").write_bytes(b"x")
    assert runs.status(it) == "resume"
    finish(it, **{"runtime.workers": 7})  # runtime.workers cannot change a number
    assert runs.status(it) == "resume"  # a summary, but no stamp of this code version
    recording.write_stamp(it, 12.5, resumed=False)
    assert runs.status(it) == "finished"
    recording.write_record(it)
    assert runs.status(it) == "done"
    rec = json.loads(it.record.read_text())
    assert rec["code"] == records.record_code(it.params.flat()) and rec["numerics"] == "portable"
    by = rec["computed_by"]
    assert by["code"] == rec["code"] and by["cpu"] and by["numerics"] == "portable"
    assert set(by) == {"commit", "code", "clean", "cpu", "numerics"}
    assert rec["seconds"] == 12.5 and sorted(rec["seeds"]) == ["0", "1"]
    result = runs.results([it])[it.experiment.name]
    assert result.seeds == (0, 1) and result.majorities == {0: 0.65, 1: 0.65}
    assert result.bases == {0: 0.42, 1: None} and result.seed(0).base_accuracy == 0.42
    assert result.runs[1]["fedavg-full"].rounds == [{"round": 1, "accuracy": 0.6}]
    # the record alone is the evidence: the experiment's folder may be gone (a fresh clone)
    shutil.rmtree(it.dir)
    assert runs.status(it) == "done" and it.experiment.name in runs.results([it])
    # another code version's record is stale, and says how to go on in one line
    rec["code"] = "0123456789ab"
    it.record.write_text(json.dumps(rec))
    assert runs.status(it) == "stale" and not runs.results([it])
    assert "--rerun-stale" in runs.stale_text(it) and "0123456789ab" in runs.stale_text(it)
    # a record of another configuration does not count
    rec["code"], rec["config"]["client.lr"] = records.record_code(it.params.flat()), 0.5
    it.record.write_text(json.dumps(rec))
    assert runs.status(it) == "pending"


def test_code_version_follows_the_number_code_only(tmp_path):
    for rel in ("fedcore/a.py", "models/b.py", "tasks/c.py", "tasks/results/report.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x = 1\n")
    (tmp_path / "tasks" / "reproduce").mkdir()
    (tmp_path / "tasks" / "reproduce" / "claim_x.py").write_text("y = 1\n")
    (tmp_path / "flows").mkdir()  # a driver that runs them all
    (tmp_path / "flows" / "run.py").write_text(
        "import fedcore.a, models.b, tasks.c, tasks.results.report\n"
    )
    v = records.code_version(tmp_path)
    (tmp_path / "tasks" / "results" / "report.py").write_text("x = 2\n")  # no number
    (tmp_path / "tasks" / "reproduce" / "claim_x.py").write_text("y = 2\n")
    assert records.code_version(tmp_path) == v
    (tmp_path / "fedcore" / "a.py").write_text("x = 2\n")
    assert records.code_version(tmp_path) != v


def test_report_only_runs_nothing_and_names_what_is_missing(tmp_path):
    res = CliRunner().invoke(
        app,
        ["reproduce", "--profile", "cpu", "--claim", "adapters", "--claim", "fedvc", "--report",
         "--out", str(tmp_path / "out"), "--set", f"experiment.reports_dir={tmp_path}"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "adapters: not run yet" in res.output and "fedvc: not run yet" in res.output
    verdicts = json.loads((tmp_path / "out" / "verdicts.json").read_text())
    assert sorted(verdicts) == ["adapters", "fedvc"]
    assert verdicts["adapters"]["text"].startswith("not run yet: adapters-dir05")
    assert not (tmp_path / "reproduce").exists()  # no experiment folder: nothing ran


def test_too_few_seeds_for_a_claim_is_one_line(tmp_path):
    res = CliRunner().invoke(
        app,
        ["reproduce", "--profile", "cpu", "--claim", "adapters", "--plan", "--set",
         "experiment.seeds=[0,1]", "--set", f"experiment.reports_dir={tmp_path}"],
    )  # fmt: skip
    assert res.exit_code != 0 and "Traceback" not in res.output
    assert "claim 'adapters' needs at least 3 seeds" in res.output
    assert len(res.output.strip().splitlines()) == 1


def test_experiments_with_the_same_base_share_it(tmp_path):
    """Each seed of a sweep shares its own base (seed-<s>/pretrain: the seed's subset and
    init) with the same seed of another experiment of the same data, model and pretrain."""
    import hashlib

    from tasks.data.pretrain import fingerprint
    from tasks.training.sweep import seed_params

    m1, m3 = runs.plan(
        registry.select(["label-skew"]),
        "ci",
        REPO / "params.yaml",
        [f"experiment.reports_dir={tmp_path}"],
    )
    assert tuple(m1.params.experiment.seeds) == (0, 1)
    root = m1.dir.parent
    assert recording.share_base(m3, root) is None  # nothing trained yet
    for s in (0, 1):
        blob = f"the frozen base of seed {s}".encode()
        card = {
            "fingerprint": fingerprint(seed_params(m1.params, s)),
            "base_sha256": hashlib.sha256(blob).hexdigest(),
        }
        (m1.dir / f"seed-{s}" / "pretrain").mkdir(parents=True)
        (m1.dir / f"seed-{s}" / "pretrain" / "base.pt").write_bytes(blob)
        (m1.dir / f"seed-{s}" / "pretrain" / "base.json").write_text(json.dumps(card))
    assert recording.share_base(m3, root) == m1.dir / "seed-0" / "pretrain"
    for s in (0, 1):
        got = (m3.dir / f"seed-{s}" / "pretrain" / "base.pt").read_bytes()
        assert got == f"the frozen base of seed {s}".encode()
    assert recording.share_base(m3, root) is None  # it has its own now
    (dir05,) = runs.plan(
        [UNTUNED],
        "ci",
        REPO / "params.yaml",
        [f"experiment.reports_dir={tmp_path}"],
    )
    assert recording.share_base(dir05, root) is None  # another partition size: another base


def test_report_from_hand_made_results(tmp_path):
    items = runs.plan(
        registry.CLAIMS, "ci", REPO / "params.yaml", [f"experiment.reports_dir={tmp_path}"]
    )
    results = {k: two_seeds(v) for k, v in transformer(0.61, 0.50).items()}
    results["adapters-dir05"] = two_seeds(
        exp(
            {
                "fedavg-full": cell(0.94, per_round=9 * MB),
                "fedavg-residual": cell(0.93, per_round=MB),
            },
            majority=0.1,
        )
    )
    root = tmp_path / "reproduce" / "ci"
    path = report.write_report("ci", registry.CLAIMS, items, results, root, "fedapt reproduce")
    assert "Over 2 seeds (0, 1)" in path.read_text()
    # each cell's accuracy and traffic as mean ± std over the seeds
    assert "| fedavg-residual | 93.00 ± 0.00 | 2.000 ± 0.000 | 2 |" in path.read_text()
    text = path.read_text()
    assert "Smoke test, not a reproduction" in text
    for i, claim in enumerate(registry.CLAIMS, 1):
        assert f"## {i}. {claim.id}" in text
    assert "holds (smoke test)" in text
    assert (root / "figures" / "adapters.png").read_bytes()[:4] == b"\x89PNG"
    assert (root / "figures" / "transformer.png").is_file()
    assert not (root / "figures" / "fednilo.png").exists()  # nothing ran: no figure
    verdicts = json.loads((root / "verdicts.json").read_text())
    assert verdicts["adapters"]["holds"] is True and verdicts["fednilo"]["holds"] is None
    cpu_items = runs.plan(
        registry.CLAIMS, "cpu", REPO / "params.yaml", [f"experiment.reports_dir={tmp_path}"]
    )
    three = {
        k: dataclasses.replace(
            v, runs={**v.runs, 2: v.runs[0]}, majorities={**v.majorities, 2: v.majorities[0]}
        )
        for k, v in results.items()
    }
    decided = report.verdicts(registry.CLAIMS, cpu_items, three, "cpu")
    cpu = report.markdown("cpu", registry.CLAIMS, cpu_items, three, decided, {}, "x")
    assert "Smoke test" not in cpu and "| holds |" in cpu
    assert "Over 3 seeds (0, 1, 2)" in cpu


def test_bad_profile_is_one_line(tmp_path):
    res = CliRunner().invoke(
        app, ["reproduce", "--profile", "fast", "--set", f"experiment.reports_dir={tmp_path}"]
    )
    assert res.exit_code == 2
    assert (
        res.output.strip()
        == "fedapt: error: unknown profile (--profile) 'fast'; valid: ci, cpu, gpu"
    )
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(
    "flags, line",
    [
        (["--revalidate", "--rerun-stale"], "--revalidate checks stale records; it does not go"),
        (["--revalidate", "--report"], "--report and --revalidate do different things; give one"),
        (["--plan", "--report"], "--plan and --report do different things; give one of them"),
        (["--plan", "--report", "--revalidate"], "--plan and --report and --revalidate do"),
    ],
)
def test_modes_that_do_not_go_together_are_one_line(tmp_path, flags, line):
    """--plan, --report and --revalidate are commands of their own: none silently wins."""
    res = CliRunner().invoke(
        app,
        ["reproduce", "--profile", "ci", *flags, "--out", str(tmp_path / "o")]
        + ["--set", f"experiment.reports_dir={tmp_path}"],
    )
    assert res.exit_code == 2, res.output
    assert res.output.strip().startswith(f"fedapt: error: {line}"), res.output
    assert len(res.output.strip().splitlines()) == 1
    assert not any(tmp_path.iterdir())


def test_plan_lists_without_running(tmp_path):
    res = CliRunner().invoke(
        app,
        [
            "reproduce",
            "--profile",
            "cpu",
            "--plan",
            "--claim",
            "fednilo",
            "--set",
            f"experiment.reports_dir={tmp_path}",
        ],
    )
    assert res.exit_code == 0, res.output
    # each experiment with its state (pending, or done/stale once its record is committed)
    assert "cpu-fednilo-k500f75" in res.output
    assert any(state in res.output for state in ("pending", "done", "stale"))
    assert not any(tmp_path.iterdir())


def test_reproduce_dvc_pipeline_matches_the_command():
    """reproduce/dvc.yaml: one stage per profile calling `fedapt reproduce` from the
    environment, deps covering every project package, outs = what the report writes."""
    import yaml

    spec = yaml.safe_load((REPO / "reproduce" / "dvc.yaml").read_text())["stages"]["reproduce"]
    assert spec["foreach"] == list(PROFILES)
    do = spec["do"]
    assert do["cmd"] == "fedapt reproduce --profile ${item}" and do["wdir"] == ".."
    assert {"fedcore", "models", "tasks", "flows", "data"} <= set(do["deps"])
    outs = [next(iter(o)) for o in do["outs"]]
    root = "reproduce/${item}"
    assert outs == [
        f"{root}/{runs.REPORT}",
        f"{root}/verdicts.json",
        f"{root}/{runs.FIGURES}",
        f"{root}/{records.RECORDS}",
    ]
    kept = do["outs"][-1][f"{root}/{records.RECORDS}"]
    assert kept == {"cache": False, "persist": True}  # the records a rerun resumes from
    # no plots: the root's `dvc plots show` would warn about them until a profile has run
    assert "plots" not in do
    # the default pipeline never starts a reproduction
    assert "reproduce" not in (REPO / "dvc.yaml").read_text()


def test_gpu_profile_passes_preflight(tmp_path):
    """The gpu profile cannot run on the CPU machines, but every experiment of it must pass
    `fedapt run`'s checks: data present, partitions drawable, models and adapters built."""
    from flows.plan import prepare

    sets = ["storage.bucket=null", "runtime.tracking=false", f"experiment.reports_dir={tmp_path}"]
    sets.append(f"data.root={REPO / 'data/raw'}")
    items = runs.plan(registry.CLAIMS, "gpu", REPO / "params.yaml", sets)
    # anytime-pa; shakespeare 4; seed 000 Table II, #M = 2, Gau: 3; seed 002 §4.1: 11; seed 001
    # multi-tier and personalization, seed 004 IID: 9
    assert len(items) == 44
    for it in items:
        prepare(it.params, results=False, models=False)
    assert not any(tmp_path.iterdir())  # checks only: nothing written


def test_tuning_runs_come_first_and_choose_each_cells_lr(tmp_path):
    """An experiment with `tune`: one seed-0 run per lr on the training rows less a held-out
    validation share, evaluated there; the experiment waits for their records, then each cell
    trains at the lr with its best mean validation accuracy over the last L rounds."""
    from tasks.reproduce.spec import Tune

    exp_ = dataclasses.replace(
        claim_adapters.DIR05,
        scale={"ci": (*claim_adapters.DIR05.scale["ci"], "grid.adapters=[full,residual]")},
        tune={"ci": Tune(lrs=(0.1, 0.01), validation=0.2)},
    )
    claim = dataclasses.replace(claim_adapters.CLAIM, experiments=(exp_,))
    sets = [f"experiment.reports_dir={tmp_path / 'reports'}"]
    items = runs.plan([claim], "ci", REPO / "params.yaml", sets, tmp_path / "out")
    probes, main = items[:2], items[2]
    assert [p.params.experiment.name for p in probes] == [
        "ci-adapters-dir05-lr0.1", "ci-adapters-dir05-lr0.01"
    ]  # fmt: skip
    for p, lr in zip(probes, (0.1, 0.01), strict=True):
        assert p.tunes == "adapters-dir05" and p.params.client.lr == lr
        assert p.params.experiment.seeds is None and p.params.experiment.seed == 0
        assert (p.params.data.validation, p.params.data.evaluate) == (0.2, "validation")
    assert main.waiting and runs.status(main) == "waiting"
    assert main.params.data.validation == 0.2 and main.params.data.evaluate == "test"
    assert main.params.experiment.seeds == (0, 1)
    # the tuning runs finish: full is best at 0.1, residual at 0.01
    scores = {0.1: {"fedavg-full": 0.8, "fedavg-residual": 0.6},
              0.01: {"fedavg-full": 0.7, "fedavg-residual": 0.6}}  # fmt: skip
    scores[0.01]["fedavg-residual"] = 0.65
    for p in probes:
        _record(p, scores[p.params.client.lr])
    main = runs.replan(main, [claim], "ci", REPO / "params.yaml", sets, tmp_path / "out")
    assert not main.waiting and runs.status(main) == "pending"
    assert main.lrs == {"fedavg-full": 0.1, "fedavg-residual": 0.01}
    table = report.tuning_table(runs.plan([claim], "ci", REPO / "params.yaml", sets,
                                          tmp_path / "out"), "adapters-dir05")  # fmt: skip
    assert "| cell | lr 0.01 | lr 0.1 |" in table
    assert "| fedavg-full | 70.00 | **80.00** |" in table
    assert "| fedavg-residual | **65.00** | 60.00 |" in table
    assert "held-out 20%" in table and "never the test set" in table


def _record(item, accs):
    """A record for ``item`` as if its run had finished with these cells' last-L accuracies."""
    cells = {
        name: {"record": {"mean_accuracy_last_L": acc}, "rounds": []} for name, acc in accs.items()
    }
    records.write_record(
        item.record,
        experiment=item.params.experiment.name,
        claim=item.claim.id,
        config=runs.config_key(item.params.flat()),
        params=item.params.flat(),
        numerics=item.params.runtime.numerics,
        overrides=list(item.overrides),
        seconds=1.0,
        resumed=False,
        seeds={"0": {"majority": None, "cells": cells}},
        code=records.record_code(item.params.flat()),
        computed_by=records.computed_by(item.params.flat(), item.params.runtime.numerics),
        rules=runs.rules_for(item),
    )


def test_server_lr_tuning_sets_each_server_optimisers_lr(tmp_path):
    from tasks.reproduce import claim_server_opt
    from tasks.reproduce.spec import Tune

    exp_ = dataclasses.replace(
        claim_server_opt.LENET5, tune={"ci": Tune(lrs=(0.01, 0.001), key="server_lr")}
    )
    claim = dataclasses.replace(claim_server_opt.CLAIM, experiments=(exp_,))
    sets = [f"experiment.reports_dir={tmp_path / 'reports'}"]
    items = runs.plan([claim], "ci", REPO / "params.yaml", sets, tmp_path / "out")
    probe, main = items[0], items[-1]
    assert probe.params.grid.algorithms == ("fedadam", "fedadagrad")  # FedAvg has none
    assert probe.params.grid.algorithm_options.fedadam.server_lr == 0.01
    assert probe.params.grid.algorithm_options.fedadagrad.server_lr == 0.01
    assert probe.params.client.lr == main.params.client.lr  # the clients' lr untouched
    _record(items[0], {"fedadam-full": 0.5, "fedadagrad-full": 0.7})
    _record(items[1], {"fedadam-full": 0.6, "fedadagrad-full": 0.6})
    main = runs.replan(main, [claim], "ci", REPO / "params.yaml", sets, tmp_path / "out")
    opts = main.params.grid.algorithm_options
    assert (opts.fedadam.server_lr, opts.fedadagrad.server_lr) == (0.001, 0.01)
    assert main.params.grid.algorithms == ("fedavg", "fedadam", "fedadagrad")


def test_revalidation_compares_a_whole_seed_and_restamps(tmp_path):
    """A record of another code version is checked against one whole seed rerun: every round
    value of every cell and every cell's summary record (times aside); identical, it is
    stamped with this code version and keeps what was checked and by whom."""
    from tasks.reproduce import revalidate

    rounds = [
        {"round": 1, "accuracy": 0.5, "train_loss": 1.25, "clients": [0, 1], "seconds": 3.0},
        {"round": 2, "accuracy": 0.6, "train_loss": 1.0, "clients": [1, 2], "seconds": 3.0},
        {"round": 3, "accuracy": 0.7, "train_loss": 0.75, "clients": [0, 2], "seconds": 3.0},
    ]
    summary = {
        "final_accuracy": 0.7,
        "personalized_accuracy": 0.9,
        "local_train_seconds": 2.0,
        "mlflow_run_id": "abc",
        "provenance": {"cpu": "AMD EPYC"},
    }
    rec = {
        "code": "0123456789ab",
        "numerics": "portable",
        "params": {"experiment.seeds": [0, 1], "grid.algorithms": ["fedavg"]},
        "seeds": {
            "1": {
                "base_accuracy": 0.8,
                "cells": {"fedavg-full": {"record": summary, "rounds": rounds}},
            }
        },
    }
    now = [dict(r, seconds=9.0) for r in rounds]
    # another machine, tracking off: neither is a number of the run
    again = dict(summary, local_train_seconds=5.0, mlflow_run_id=None, provenance={"cpu": "Xeon"})
    seeds = {
        "1": {"base_accuracy": 0.8, "cells": {"fedavg-full": {"record": again, "rounds": now}}}
    }
    assert revalidate.compare(rec, seeds, 1) == []
    now[2]["clients"] = [0, 1]  # the last round counts as much as the first
    assert revalidate.compare(rec, seeds, 1) == [
        "fedavg-full round 3 clients: [0, 2] recorded, [0, 1] now"
    ]
    now[2]["clients"] = [0, 2]
    again["personalized_accuracy"] = 0.85  # what runs after training is compared too
    assert revalidate.compare(rec, seeds, 1) == [
        "fedavg-full personalized_accuracy: 0.9 recorded, 0.85 now"
    ]
    del now[2]
    assert revalidate.compare(rec, seeds, 1)[0] == "fedavg-full: 2 rounds, 3 recorded"
    seeds["1"]["base_accuracy"] = 0.81
    assert revalidate.compare(rec, seeds, 1)[0] == "base_accuracy 0.8 recorded, 0.81 now"
    assert revalidate.compare(rec, {}, 1) == ["the check run has no seed 1"]
    assert revalidate.compare(rec, seeds, 0) == ["the record has no seed 0"]
    sets = revalidate.check_sets(rec, 1, tmp_path)
    assert "experiment.seeds=[1]" in sets and not any("stop_after" in x for x in sets)
    assert not any("personalize" in x for x in sets)  # personalization runs as recorded
    path = revalidate.restamp(tmp_path / "r.json", rec, 1, ["fedavg-full"])
    new = json.loads(path.read_text())
    assert new["code"] == records.record_code(rec["params"]) != "0123456789ab"
    checked = new["revalidated"][0]
    assert checked["from"] == "0123456789ab" and checked["seed"] == 1
    assert checked["rounds"] == "all" and checked["computed_by"]["code"] == new["code"]
    assert new["seeds"] == rec["seeds"]


def test_revalidate_checks_stale_records_and_current_ones_no_second_process_reran():
    """``--revalidate`` reruns a seed of a stale record, and of a current record until a
    revalidation at its code stamped it; then nothing (and not-run experiments never)."""
    from tasks.reproduce import revalidate

    rec = {"code": "aaaaaaaaaaaa", "revalidated": []}
    assert revalidate.to_check("stale", rec) == "code aaaaaaaaaaaa"
    assert "not yet rerun" in (revalidate.to_check("done", rec) or "")
    older = {"from": "bbbbbbbbbbbb", "to": "cccccccccccc", "rounds": "all"}
    assert revalidate.to_check("done", dict(rec, revalidated=[older])) is not None
    here = {"from": "aaaaaaaaaaaa", "to": "aaaaaaaaaaaa", "rounds": "all"}
    assert revalidate.to_check("done", dict(rec, revalidated=[older, here])) is None
    assert revalidate.to_check("pending", None) is None
    assert revalidate.to_check("waiting", rec) is None
