"""`fedapt reproduce`: the profiles' experiments as typed params, what counts as finished,
shared frozen bases, the report, the DVC pipeline, the bad-profile line, and the gpu profile
against `fedapt run`'s preflight. Verdicts: tests/test_reproduce_verdicts.py; the ci profile
end to end: tests/test_reproduce_ci.py (slow)."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli import app
from tasks.reproduce import claim_adapters, records, registry, report, runs
from tasks.reproduce.spec import PROFILES, ExperimentResult, dedupe
from tests.test_reproduce_verdicts import MB, _transformer, cell, exp


def two_seeds(result):
    """The same cells for seeds 0 and 1 (the ci profile's two)."""
    return ExperimentResult(result.params, {0: result.cells, 1: result.cells})


REPO = Path(__file__).resolve().parents[1]


# ---- the registry, the profiles, finished or not, the report --------------------------------


def test_every_profile_types_every_experiment():
    for profile in PROFILES:
        items = runs.plan(registry.CLAIMS, profile, REPO / "params.yaml")
        names = [it.params.experiment.name for it in items]
        assert len(names) == len(set(names)) and all(n.startswith(f"{profile}-") for n in names)
        assert {it.claim.id for it in items} == {
            c.id for c in registry.CLAIMS if c.experiments and not registry.unmet(c)
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


def _plan_adapters(tmp_path):
    (it,) = runs.plan(
        registry.select(["adapters"]),
        "ci",
        REPO / "params.yaml",
        [f"experiment.reports_dir={tmp_path / 'reports'}"],
        tmp_path / "out",
    )
    return it


def _finish(it, seeds=(0, 1), **changed):
    """A finished seed sweep in the experiment's folder, as the experiment flow leaves it."""
    flat = {**it.params.flat(), **changed}
    sweep = {"experiment": "x", "params": flat, "seeds": list(seeds), "runs": []}
    for s in seeds:
        d = it.dir / f"seed-{s}"
        (d / "runs" / "fedavg-full").mkdir(parents=True, exist_ok=True)
        (d / "partition").mkdir(exist_ok=True)
        (d / "partition" / "stats.json").write_text(json.dumps({"label_totals": [13, 4, 3]}))
        rounds = [{"round": 1, "accuracy": 0.5 + s / 10}]
        (d / "runs" / "fedavg-full" / "metrics.json").write_text(json.dumps({"rounds": rounds}))
        sweep["runs"].append({"algorithm": "fedavg", "adapter": "full", "seed": s})
    (it.dir / "summary.json").write_text(json.dumps(sweep))


def test_status_from_records_and_the_experiment_folder(tmp_path):
    it = _plan_adapters(tmp_path)
    assert it.record == tmp_path / "out" / "records" / f"{it.params.experiment.name}.json"
    assert runs.status(it) == "pending"
    (it.dir / "checkpoints").mkdir(parents=True)
    (it.dir / "checkpoints" / "fedavg-full.pt").write_bytes(b"x")
    assert runs.status(it) == "resume"
    _finish(it, **{"runtime.workers": 7})  # runtime.workers cannot change a number
    assert runs.status(it) == "resume"  # a summary, but no stamp of this code version
    runs.write_stamp(it, 12.5, resumed=False)
    assert runs.status(it) == "finished"
    runs.write_record(it)
    assert runs.status(it) == "done"
    rec = json.loads(it.record.read_text())
    assert rec["code"] == records.code_version() and rec["numerics"] == "portable"
    assert rec["seconds"] == 12.5 and sorted(rec["seeds"]) == ["0", "1"]
    result = runs.results([it])[it.experiment.name]
    assert result.seeds == (0, 1) and result.majorities == {0: 0.65, 1: 0.65}
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
    rec["code"], rec["config"]["client.lr"] = records.code_version(), 0.5
    it.record.write_text(json.dumps(rec))
    assert runs.status(it) == "pending"


def test_code_version_follows_the_number_code_only(tmp_path):
    for rel in ("fedcore/a.py", "models/b.py", "tasks/c.py", "tasks/report.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x = 1\n")
    (tmp_path / "tasks" / "reproduce").mkdir()
    (tmp_path / "tasks" / "reproduce" / "claim_x.py").write_text("y = 1\n")
    v = records.code_version(tmp_path)
    (tmp_path / "tasks" / "report.py").write_text("x = 2\n")  # writes reports: no number
    (tmp_path / "tasks" / "reproduce" / "claim_x.py").write_text("y = 2\n")
    assert records.code_version(tmp_path) == v
    (tmp_path / "fedcore" / "a.py").write_text("x = 2\n")
    assert records.code_version(tmp_path) != v


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
    import hashlib

    from tasks.pretrain import fingerprint

    m1, m3 = runs.plan(
        registry.select(["label-skew"]),
        "ci",
        REPO / "params.yaml",
        [f"experiment.reports_dir={tmp_path}"],
    )
    root = m1.dir.parent
    assert runs.share_base(m3, root) is None  # nothing trained yet
    blob = b"the frozen base"
    card = {"fingerprint": fingerprint(m1.params), "base_sha256": hashlib.sha256(blob).hexdigest()}
    (m1.dir / "pretrain").mkdir(parents=True)
    (m1.dir / "pretrain" / "base.pt").write_bytes(blob)
    (m1.dir / "pretrain" / "base.json").write_text(json.dumps(card))
    assert runs.share_base(m3, root) == m1.dir / "pretrain"
    assert (m3.dir / "pretrain" / "base.pt").read_bytes() == blob
    assert runs.share_base(m3, root) is None  # it has its own now
    (dir05,) = runs.plan(
        registry.select(["adapters"]),
        "ci",
        REPO / "params.yaml",
        [f"experiment.reports_dir={tmp_path}"],
    )
    assert runs.share_base(dir05, root) is None  # another partition size: another base


def test_report_from_hand_made_results(tmp_path):
    items = runs.plan(
        registry.CLAIMS, "ci", REPO / "params.yaml", [f"experiment.reports_dir={tmp_path}"]
    )
    results = {k: two_seeds(v) for k, v in _transformer(0.61, 0.50).items()}
    results["adapters-dir05"] = two_seeds(
        exp(
            {
                "fedavg-full": cell(0.94, per_round=9 * MB),
                "fedavg-residual": cell(0.93, per_round=MB),
            }
        )
    )
    root = tmp_path / "reproduce" / "ci"
    path = report.write_report("ci", registry.CLAIMS, items, results, root, "fedapt reproduce")
    assert "Over 2 seeds (0, 1)" in path.read_text()
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
    three = {k: ExperimentResult(v.params, {**v.runs, 2: v.runs[0]}) for k, v in results.items()}
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
    assert "cpu-fednilo-k500f75" in res.output and "pending" in res.output
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
    from flows.experiment import check_names, preflight

    sets = ["storage.bucket=null", "runtime.tracking=false", f"experiment.reports_dir={tmp_path}"]
    sets.append(f"data.root={REPO / 'data/raw'}")
    items = runs.plan(registry.CLAIMS, "gpu", REPO / "params.yaml", sets)
    # the anytime-pa experiment runs now that its methods exist; + cross-device-dir05,
    # label-skew-m2, gaussian-noise (seed 000)
    assert len(items) == 20
    for it in items:
        check_names(it.params)
        preflight(it.params)
    assert not any(tmp_path.iterdir())  # checks only: nothing written
