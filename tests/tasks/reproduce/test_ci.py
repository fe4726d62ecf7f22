"""`fedapt reproduce --profile ci` end to end, so the reproduction pipeline cannot rot: every
claim's experiments run through the real experiment flow (Prefect test server, MLflow in a
local store), the report says it is a smoke test and has every claim with a direction, the
figures and the MLflow run exist; a rerun skips what finished and runs what is missing.
About 3-4 minutes on 2 cores."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli import app

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.slow
def test_ci_profile_end_to_end_then_rerun(tmp_path, monkeypatch):
    from prefect.testing.utilities import prefect_test_harness

    from tasks.reproduce import registry, runs

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    sets = [
        f"experiment.reports_dir={tmp_path / 'reports'}",
        f"data.root={REPO / 'data/raw'}",
        "storage.bucket=null",
    ]
    root = tmp_path / "out"  # the report, verdicts, figures and records
    args = ["reproduce", "--profile", "ci", "--params", str(REPO / "params.yaml")]
    args += [a for s in sets for a in ("--set", s)] + ["--out", str(root)]
    work = tmp_path / "reports" / "reproduce" / "ci"  # the experiments' folders
    items = runs.plan(registry.CLAIMS, "ci", REPO / "params.yaml", sets, root)
    with prefect_test_harness(server_startup_timeout=180):
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 0, res.output
        assert f"report: {root / 'reproduction.md'}" in res.output
        assert "adapters: " in res.output and "(smoke test)" in res.output
        # progress: experiment k of M, the second with an ETA at this session's pace; the
        # cells of each grid as cell k of N
        # (read from the flow runs' logs on the server: a CliRunner captures Prefect's console
        # logs only when its handler was set up on this call's stream)
        n = len(items)
        first = f"experiment 1 of {n}: {items[0].params.experiment.name}: running ("
        lines = _logs_with(first)
        assert any(first in x and "ETA after the first experiment" in x for x in lines), lines
        second = f"experiment 2 of {n}: {items[1].params.experiment.name}: running ("
        line = next(x for x in lines if second in x)
        assert "cell-rounds left, ETA " in line and "at this session's pace" in line, line
        assert any("cell 1 of " in x and "grid " in x for x in lines)

        text = (root / "reproduction.md").read_text()
        assert "Smoke test, not a reproduction" in text
        verdicts = json.loads((root / "verdicts.json").read_text())
        assert list(verdicts) == sorted(c.id for c in registry.CLAIMS)
        for i, claim in enumerate(registry.CLAIMS, 1):
            assert f"## {i}. {claim.id}" in text
            if claim.plot is not None and not registry.unmet(claim):
                assert (root / "figures" / f"{claim.id}.png").read_bytes()[:4] == b"\x89PNG"
        # every experiment finished for this configuration, its record written with its time
        # and both seeds (a tuning run: seed 0); the tuned experiments now have their lrs,
        # and the FedNILO ones their K and F, read off FedAvg's records
        waited = sorted(it.experiment.name for it in items if it.waiting)
        assert waited == [
            "adapters-dir05", "fednilo-iid-k350f25", "fednilo-k350f25", "server-opt-lenet5"
        ], waited  # fmt: skip
        items = runs.plan(registry.CLAIMS, "ci", REPO / "params.yaml", sets, root)
        assert not any(it.waiting for it in items)
        nilo = {it.experiment.name: it for it in items if it.experiment.after}
        for it in nilo.values():
            assert any(".K=" in o for o in it.overrides) and any(".F=" in o for o in it.overrides)
        assert {runs.status(it) for it in items} == {"done"}
        for it in items:
            rec = json.loads(it.record.read_text())
            assert rec["seconds"] > 0
            assert sorted(rec["seeds"]) == (["0"] if it.tunes else ["0", "1"])
        tuned = {it.experiment.name: it.params for it in items if it.experiment.tune}
        assert set(tuned["adapters-dir05"].grid.client_lr) == {"fedavg-full", "fedavg-residual"}
        opts = tuned["server-opt-lenet5"].grid.algorithm_options
        assert opts.fedadam.server_lr in (0.001, 0.01)
        assert "**Tuning of `adapters-dir05`.**" in (root / "reproduction.md").read_text()
        # --report rebuilds the same report from the records alone, running nothing
        before = (root / "verdicts.json").read_bytes(), (root / "reproduction.md").read_text()
        (root / "verdicts.json").unlink()
        res = CliRunner().invoke(app, [*args, "--report"])
        assert res.exit_code == 0, res.output
        assert (root / "verdicts.json").read_bytes() == before[0]

        def body(text: str) -> list[str]:  # all but the "Written <minute> by" line
            return [x for x in text.splitlines() if not x.startswith("Written ")]

        assert body((root / "reproduction.md").read_text()) == body(before[1])
        results = runs.results(items)
        assert sorted(results["transformer-adapters"].cells) == [
            "fedavg-head", "fedavg-houlsby", "fedavg-lora", "fedavg-pfeiffer"
        ]  # fmt: skip
        acc = results["anytime-exits"].cells["fedavg-accumulator"].record
        assert len(acc["final_accuracy_exits"]) == 6  # MiniLM: an exit after each block
        pa = results["anytime-exits-pa"].cells["fedavg-accumulator_pa"].record
        assert len(pa["final_accuracy_exits"]) == 6
        # every claim's verdict is read from both seeds of its experiments (any value: a
        # smoke test's numbers mean nothing)
        for claim in registry.CLAIMS:
            assert verdicts[claim.id]["text"].startswith("Over 2 seeds (0, 1)."), claim.id
        assert results["adapters-dir05"].seeds == (0, 1)
        _check_mlflow(tmp_path, verdicts)

        # a rerun: recorded experiments are skipped, a missing one runs again, and one whose
        # folder finished but whose record was lost is recorded without running
        stamps = {it.experiment.name: (it.dir / runs.STAMP).stat().st_mtime_ns for it in items}
        (work / "ci-fednilo-fedavg" / "summary.json").unlink()
        (root / "records" / "ci-fednilo-fedavg.json").unlink()
        (root / "records" / "ci-server-opt-lenet5.json").unlink()
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 0, res.output
        # another code version's record stops the run in one line, naming the way on
        rec = json.loads((root / "records" / "ci-label-skew-m1.json").read_text())
        rec["code"] = "0123456789ab"
        (root / "records" / "ci-label-skew-m1.json").write_text(json.dumps(rec))
        res = CliRunner().invoke(app, args)
        assert res.exit_code != 0 and "--rerun-stale" in res.output
        assert "Traceback" not in res.output
        # --revalidate: seed 0 rerun whole; identical -> stamped with this code, a record
        # whose numbers differ stays stale, named in one line
        other = root / "records" / "ci-label-skew-m3.json"
        rec = json.loads(other.read_text())
        rec["code"] = "0123456789ab"
        rec["seeds"]["0"]["cells"]["fedavg-full"]["rounds"][0]["train_loss"] += 1e-9
        other.write_text(json.dumps(rec))
        # an earlier revalidation's check folders (bases an older code trained) are not reused
        stale_base = work / "revalidate" / "old" / "pretrain"
        stale_base.mkdir(parents=True, exist_ok=True)
        res = CliRunner().invoke(app, [*args, "-c", "label-skew", "--revalidate", "--seed", "0"])
        assert not stale_base.exists()
        assert res.exit_code == 1, res.output
        assert "ci-label-skew-m3.json: fedavg-full round 1 train_loss: " in res.output
        assert "Traceback" not in res.output and "Logging error" not in res.output
        assert f"{root / 'records' / 'ci-label-skew-m1.json'}:" not in res.output  # current
        rec = json.loads((root / "records" / "ci-label-skew-m1.json").read_text())
        assert rec["revalidated"][0]["from"] == "0123456789ab" and rec["code"] != "0123456789ab"
        other.unlink()  # the report says which numbers an older code computed
        assert CliRunner().invoke(app, [*args, "--report"]).exit_code == 0
        line = next(x for x in (root / "reproduction.md").read_text().splitlines() if "m1`" in x)
        assert "computed by code 0123456789ab, revalidated at " in line, line
    again = {it.experiment.name: (it.dir / runs.STAMP).stat().st_mtime_ns for it in items}
    changed = sorted(n for n in stamps if stamps[n] != again[n])
    assert changed == ["fednilo-fedavg"]  # the checks ran in folders of their own
    assert sorted(it.experiment.name for it in items if runs.status(it) != "done") == [
        "label-skew-m3"  # its record deleted after its revalidation failed
    ]


def _logs_with(needle: str, timeout: float = 60.0) -> list[str]:
    """Every log message on the Prefect server in use, once one holds ``needle`` (the API log
    handler ships them in batches, after the flow returns)."""
    import time

    from prefect.client.orchestration import get_client

    from tests.flows.support import read_all_logs

    deadline = time.monotonic() + timeout
    while True:
        with get_client(sync_client=True) as client:
            lines = [log.message for log in read_all_logs(client)]
        if any(needle in x for x in lines) or time.monotonic() > deadline:
            return lines
        time.sleep(1.0)


def _check_mlflow(tmp_path: Path, verdicts: dict) -> None:
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("reproduce-ci")
    (run,) = client.search_runs([exp.experiment_id])
    assert run.info.status == "FINISHED"
    words = {True: "holds", False: "does not hold", None: "cannot say"}
    assert run.data.tags["claim.adapters"] == words[verdicts["adapters"]["holds"]]
    names = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"reproduction.md", "verdicts.json", "figures"} <= names
    figures = {a.path for a in client.list_artifacts(run.info.run_id, "figures")}
    assert "figures/adapters.png" in figures
    # each experiment is tracked as its own MLflow experiment, as `fedapt run` does
    assert client.get_experiment_by_name("ci-transformer-adapters") is not None
