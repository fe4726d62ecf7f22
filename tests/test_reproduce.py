"""`fedapt reproduce`: the profiles' experiments as typed params, what counts as finished,
shared frozen bases, the report, the DVC pipeline, the bad-profile line, and the gpu profile
against `fedapt run`'s preflight. Verdicts: tests/test_reproduce_verdicts.py; the ci profile
end to end: tests/test_reproduce_ci.py (slow)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli import app
from tasks.reproduce import claim_adapters, registry, report, runs
from tasks.reproduce.spec import PROFILES, dedupe
from tests.test_reproduce_verdicts import MB, _transformer, cell, exp

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


def test_status_done_rerun_resume(tmp_path):
    (it,) = runs.plan(
        registry.select(["adapters"]),
        "ci",
        REPO / "params.yaml",
        [f"experiment.reports_dir={tmp_path}"],
    )
    assert runs.status(it) == "pending"
    it.dir.mkdir(parents=True)
    (it.dir / "checkpoints").mkdir()
    (it.dir / "checkpoints" / "fedavg-full.pt").write_bytes(b"x")
    assert runs.status(it) == "resume"
    flat = it.params.flat()
    summary = {"experiment": "x", "params": {**flat, "runtime.workers": 7}, "runs": []}
    (it.dir / "summary.json").write_text(json.dumps(summary))
    assert runs.status(it) == "done"  # runtime.workers cannot change a number
    summary["params"]["client.lr"] = 0.5
    (it.dir / "summary.json").write_text(json.dumps(summary))
    assert runs.status(it) == "resume"  # another configuration's summary; checkpoints there
    (it.dir / "checkpoints" / "fedavg-full.pt").unlink()
    assert runs.status(it) == "rerun"


def test_load_result_reads_the_class_prior(tmp_path):
    summary = {"experiment": "x", "params": {"client.lr": 0.1}, "runs": []}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    assert runs.load_result(tmp_path).majority is None  # no partition stats
    (tmp_path / "partition").mkdir()
    (tmp_path / "partition" / "stats.json").write_text(json.dumps({"label_totals": [13, 4, 3]}))
    result = runs.load_result(tmp_path)
    assert result.majority == 0.65 and result.params == {"client.lr": 0.1} and not result.cells


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
    results = _transformer(0.61, 0.50)
    results["adapters-dir05"] = exp(
        {"fedavg-full": cell(0.94, per_round=9 * MB), "fedavg-residual": cell(0.93, per_round=MB)}
    )
    root = tmp_path / "reproduce" / "ci"
    path = report.write_report("ci", registry.CLAIMS, items, results, root, "fedapt reproduce")
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
    cpu = report.markdown(
        "cpu", registry.CLAIMS, [], results, report.verdicts(registry.CLAIMS, results), {}, "x"
    )
    assert "Smoke test" not in cpu and "| holds |" in cpu


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
    root = "reports/reproduce/${item}"
    assert outs == [f"{root}/{runs.REPORT}", f"{root}/verdicts.json", f"{root}/{runs.FIGURES}"]
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
    assert len(items) == 17  # the anytime-pa experiment runs now that its methods exist
    for it in items:
        check_names(it.params)
        preflight(it.params)
    assert not any(tmp_path.iterdir())  # checks only: nothing written
