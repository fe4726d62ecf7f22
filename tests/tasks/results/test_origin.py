"""A run never overwrites another run's results (tasks/results/origin.py), and every run records how it
was started: collisions found locally and on S3, versions, smoke runs, MLflow tags."""

from __future__ import annotations

import json

import pytest

from fedcore.errors import ConfigError
from tasks.config import load_params
from tasks.results.origin import Origin, check_results, origin, smoke_reasons, version
from tasks.results.report import write_summary


def _params(tmp_path, *sets: str):
    """Defaults (an empty params file) with ``sets``, writing under ``tmp_path/exp``."""
    file = tmp_path / "empty.yaml"
    file.write_text("{}\n")
    return load_params(file, [f"experiment.reports_dir={tmp_path}", "experiment.name=exp", *sets])


def _finish(p) -> None:
    """A finished experiment: its summary.json (what check_results reads)."""
    write_summary(p, [], str(tmp_dir(p) / "summary.json"))


def tmp_dir(p):
    from tasks.config import experiment_dir

    return experiment_dir(p)


def test_other_params_results_are_refused_in_one_line_naming_the_keys(tmp_path):
    done = _params(tmp_path, "federation.rounds=15", "storage.bucket=null")
    _finish(done)
    check_results(done)  # the same params: a rerun writes the same bytes, allowed
    # Keys that cannot change the numbers (workers, tracking, storage) are not a collision.
    check_results(_params(tmp_path, "federation.rounds=15", "runtime.workers=3"), s3=False)
    other = _params(
        tmp_path, "federation.rounds=1", "data.train_subset=1000", "storage.bucket=null"
    )
    with pytest.raises(ConfigError) as err:
        check_results(other)
    msg = str(err.value)
    assert "\n" not in msg and str(tmp_path / "exp") in msg
    assert "federation.rounds 15 -> 1" in msg and "data.train_subset None -> 1000" in msg
    assert "--new-version" in msg and "experiment exp-v2" in msg


def test_a_new_version_is_the_first_free_or_same_params_one(tmp_path):
    a = _params(tmp_path, "federation.rounds=15", "storage.bucket=null")
    b = _params(tmp_path, "federation.rounds=2", "storage.bucket=null")
    c = _params(tmp_path, "federation.rounds=3", "storage.bucket=null")
    assert version(a).experiment.name == "exp"  # free
    _finish(a)
    assert version(a).experiment.name == "exp"  # holds a's own results: a rerun in place
    vb = version(b)
    assert vb.experiment.name == "exp-v2"
    _finish(vb)
    assert version(b).experiment.name == "exp-v2"  # b again: the same version
    assert version(c).experiment.name == "exp-v3"
    vc = version(c)
    assert vc.experiment.reports_dir == c.experiment.reports_dir
    assert vc.federation.rounds == 3 and vc.flat() == {**c.flat(), "experiment.name": "exp-v3"}


def test_results_on_s3_count_too(tmp_path, s3_env):
    from tasks.results import storage

    done = _params(tmp_path, "federation.rounds=15", "storage.bucket=owners", "storage.prefix=runs")
    storage.ensure_bucket("owners")
    body = json.dumps({"experiment": "exp", "params": done.flat(), "runs": []}).encode()
    storage.s3_client().put_object(Bucket="owners", Key="runs/exp/summary.json", Body=body)
    check_results(done)  # nothing local; S3 holds these params' results
    other = _params(tmp_path, "federation.rounds=4", "storage.bucket=owners", "storage.prefix=runs")
    with pytest.raises(ConfigError, match=r"s3://owners/runs/exp/ holds the finished results"):
        check_results(other)
    check_results(other, s3=False)
    assert version(other).experiment.name == "exp-v2"


def test_an_unreadable_summary_is_one_line(tmp_path):
    p = _params(tmp_path, "storage.bucket=null")
    tmp_dir(p).mkdir(parents=True)
    (tmp_dir(p) / "summary.json").write_text("{not json")
    with pytest.raises(ConfigError, match="is not a readable summary; move it away"):
        check_results(p)


def test_smoke_runs_are_fewer_rounds_or_rows_than_the_file_or_a_dvc_experiment(
    tmp_path, monkeypatch
):
    monkeypatch.delenv("DVC_EXP_NAME", raising=False)
    file = tmp_path / "params.yaml"
    file.write_text("federation:\n  rounds: 15\ndata:\n  train_subset: 12000\n")
    base = load_params(file)
    assert smoke_reasons(base, base) == ()
    more = load_params(file, ["federation.rounds=50", "grid.adapters=[head]"])
    assert smoke_reasons(more, base) == ()
    short = load_params(file, ["federation.rounds=1", "data.train_subset=1000"])
    assert smoke_reasons(short, base) == (
        "federation.rounds 1 < 15 in the params file",
        "data.train_subset 1000 < 12000 in the params file",
    )
    o = origin("deployment", short, file, ["federation.rounds=1", "data.train_subset=1000"])
    assert o.smoke and o.entry == "deployment"
    assert origin("run", base, file).smoke == ()  # no overrides: the file itself
    monkeypatch.setenv("DVC_EXP_NAME", "smoky-exp")
    dvc = origin("dvc", base, file)
    assert dvc.smoke == ("dvc exp run (smoky-exp)",) and dvc.dvc_experiment == "smoky-exp"
    with pytest.raises(ValueError, match="one of run, deployment, dvc, reproduce"):
        origin("cron", base, file)


def test_origin_tags_and_record():
    o = Origin(
        entry="deployment",
        overrides=("federation.rounds=1",),
        deployment="fedapt-experiment/nightly",
        flow_run_id="abc",
        smoke=("federation.rounds 1 < 15 in the params file",),
    )
    assert o.tags() == {
        "fedapt.entry": "deployment",
        "fedapt.overrides": '["federation.rounds=1"]',
        "fedapt.deployment": "fedapt-experiment/nightly",
        "fedapt.flow_run_id": "abc",
        "fedapt.smoke": "federation.rounds 1 < 15 in the params file",
    }
    assert Origin().tags() == {"fedapt.entry": "run"}
    rec = o.record()
    assert rec["overrides"] == ["federation.rounds=1"] and rec["dvc_experiment"] is None
    json.dumps(rec)


def test_fedapt_run_refuses_in_one_line_before_it_writes(tmp_path, monkeypatch):
    """`fedapt run` whose experiment holds other params' finished results stops before any
    work: one line, exit 2, nothing written beside the summary that was there."""
    from pathlib import Path

    from typer.testing import CliRunner

    from flows.cli import app

    repo = Path(__file__).resolve().parents[3]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    sets = [f"experiment.reports_dir={tmp_path}", "storage.bucket=null", "federation.rounds=3"]
    sets.append("runtime.numerics=portable")  # (what auto resolves to in this suite)
    done = load_params(repo / "params.yaml", sets)
    _finish(done)
    before = sorted(p.name for p in tmp_dir(done).iterdir())
    args = ["run", "--params", str(repo / "params.yaml")]
    args += [a for kv in [*sets, "federation.rounds=1"] for a in ("--set", kv)]
    res = CliRunner().invoke(app, args)
    text = res.output.strip()
    assert res.exit_code == 2 and len(text.splitlines()) == 1 and "Traceback" not in text, text
    assert "holds the finished results of other params (federation.rounds 3 -> 1)" in text
    assert f"experiment {done.experiment.name}-v2" in text
    after = sorted(p.name for p in tmp_dir(done).iterdir() if p.name != ".fedapt.lock")
    assert after == before  # (the run's lock file aside)


@pytest.mark.slow
def test_fedapt_run_new_version_runs_beside_the_finished_results(tmp_path, monkeypatch):
    """--new-version: the run goes to <experiment>-v2 and the finished results stay as they
    were; the same command again reruns v2 in place (same params), not v3."""
    from pathlib import Path

    from typer.testing import CliRunner

    from flows.cli import app

    repo = Path(__file__).resolve().parents[3]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    sets = [f"experiment.reports_dir={tmp_path}", "storage.bucket=null", "runtime.workers=0"]
    sets += [f"data.root={repo / 'data/raw'}", "data.train_subset=300", "data.test_subset=200"]
    sets += ["partition.num_clients=3", "federation.last_rounds=1", "runtime.tracking=false"]
    done = load_params(repo / "params.yaml", [*sets, "federation.rounds=2"])
    _finish(done)
    name = done.experiment.name
    summary = (tmp_dir(done) / "summary.json").read_bytes()
    args = ["run", "--params", str(repo / "params.yaml"), "--new-version"]
    args += [a for kv in [*sets, "federation.rounds=1"] for a in ("--set", kv)]
    for _ in range(2):
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 0, res.output
        assert f"running experiment {name}-v2" in res.output
        v2 = json.loads((tmp_path / f"{name}-v2" / "summary.json").read_text())
        assert v2["runs"][0]["rounds"] == 1 and v2["origin"]["entry"] == "run"
        assert f"experiment.name={name}-v2" in v2["origin"]["overrides"]
    assert (tmp_dir(done) / "summary.json").read_bytes() == summary
    assert not (tmp_path / f"{name}-v3").exists()
