"""`dvc repro` in a temporary copy of the repository: exact reruns, no-op second run,
and a param change that reruns only the stages depending on it; `dvc exp run --temp`; and
every stage's deps against the code its command imports."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.repo.support import DVC, GRAPH, copy_data, modules, sh

REPO = Path(__file__).resolve().parents[2]
# The function behind each stage's command.
STAGE_COMMANDS = {
    "prepare": "flows/cli/stages.py",
    "partition": "flows/cli/experiment.py",
    "validate": "flows/cli/stages.py",
    "pretrain": "flows/cli/stages.py",
    "train": "flows/cli/stages.py",
    "report": "flows/cli/stages.py",
}


def code_of(stage: str) -> set[str]:
    """Files of the project modules a stage's command runs: those imported by its function
    and by its module, and everything they import (the whole CLI package is imported by
    `fedapt`)."""
    mods = modules()
    cli = {m for m in mods if m == "flows.cli" or m.startswith("flows.cli.")}

    def imported(nodes: list[ast.stmt]) -> set[str]:
        out: set[str] = set()
        for node in nodes:
            for n in ast.walk(node):
                if isinstance(n, ast.ImportFrom) and n.module:
                    subs = {f"{n.module}.{a.name}" for a in n.names} & set(mods)
                    out |= subs or {n.module}
                elif isinstance(n, ast.Import):
                    out |= {a.name for a in n.names}
        return out & set(mods)

    # `fedapt` imports every CLI module; a command's other imports run inside its function.
    start = set(cli)
    for m in cli:
        body = ast.parse(modules()[m].read_text()).body
        start |= imported([n for n in body if isinstance(n, (ast.Import, ast.ImportFrom))])
    tree = ast.parse((REPO / STAGE_COMMANDS[stage]).read_text())
    start |= imported([n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == stage])
    seen: set[str] = set(cli)
    todo = sorted(start - cli)
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(GRAPH[m])
    return {str(mods[m].relative_to(REPO)) for m in seen}


@pytest.mark.parametrize("stage", sorted(STAGE_COMMANDS))
def test_stage_deps_list_the_code_it_runs(stage):
    spec = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"][stage]
    spec = spec.get("do", spec)  # a foreach stage (train: one per cell)
    deps = [d.rstrip("/") for d in spec["deps"]]
    missing = sorted(
        f for f in code_of(stage) if not any(f == d or f.startswith(d + "/") for d in deps)
    )
    assert missing == [], f"dvc.yaml stage {stage!r} runs code its deps leave out"
    cmd = spec["cmd"]
    assert cmd.split()[0] == "fedapt", "stages call fedapt from the environment, not a venv path"


def test_one_train_stage_per_grid_cell_named_as_the_cell():
    """dvc.yaml's train stages and folders are params.yaml's dvc.cells, keyed by the names
    MLflow, Prefect and the report give the cells (no "-none"): every cell of the grid."""
    from tasks.config import load_params
    from tasks.grid import cell_name, grid_cells

    cells = yaml.safe_load((REPO / "params.yaml").read_text())["dvc"]["cells"]
    assert {n: cell_name(c["algorithm"], c["adapter"], c["codec"]) for n, c in cells.items()} == {
        n: n for n in cells
    }
    assert list(cells) == [s.name for s in grid_cells(load_params(REPO / "params.yaml"))]
    train = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]["train"]
    assert "--out artifacts/runs/${key}" in train["do"]["cmd"]


def test_the_accuracy_plot_is_in_percent():
    """`dvc plots show` draws rounds.csv's column named by the train stage's plot: accuracy
    in %, the unit of every table, figure and MLflow metric (it was a 0-1 fraction)."""
    import csv

    plots = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]["train"]["do"]["plots"]
    (csv_plot,) = [p for p in plots if isinstance(p, dict) and "rounds.csv" in next(iter(p))]
    y = next(iter(csv_plot.values()))["y"]
    assert y == "test_accuracy_pct", y
    rows = list(csv.DictReader((REPO / "artifacts/runs/fedavg-full/rounds.csv").open()))
    accuracy = [float(r[y]) for r in rows if r[y]]
    assert accuracy and all(0 <= a <= 100 for a in accuracy) and max(accuracy) > 1, accuracy


def test_the_deps_check_sees_missing_code():
    assert "tasks/training/train.py" in code_of("train")
    assert "fedcore/engine/round.py" in code_of("train")
    assert "tasks/results/report.py" in code_of("report")
    assert "fedcore/engine/round.py" not in code_of("report")


def accuracy_metrics(root: Path) -> list:
    s = json.loads((root / "artifacts/report/summary.json").read_text())
    keys = (
        "final_accuracy",
        "mean_accuracy_last_L",
        "upload_bytes",
        "download_bytes",
        "partition_hash",
    )
    return [{k: r[k] for k in keys} for r in s["runs"]]


def hashed_outputs(root: Path) -> dict[str, bytes]:
    """Every output DVC hashes, as bytes (timings are kept out of them)."""
    files = [
        "artifacts/prepare/dataset.json",
        "artifacts/partition/manifest.csv",
        "artifacts/partition/stats.json",
        "artifacts/partition/validation.json",
        "artifacts/runs/fedavg-full/model.pt",
        "artifacts/runs/fedavg-full/metrics.json",
        "artifacts/runs/fedavg-full/rounds.csv",
        "artifacts/runs/fedavg-full/scores.json",
        "artifacts/runs/fedavg-full/figures/accuracy_vs_mib.png",
        "artifacts/report/summary.json",
        "artifacts/report/results.md",
        "artifacts/report/accuracy_vs_mib.png",
        "artifacts/report/comm_cost.json",
        "artifacts/report/comm_cost.md",
        "artifacts/report/pareto_front.json",
        "artifacts/report/accuracy_vs_mib.json",
    ]
    return {f: (root / f).read_bytes() for f in files}


@pytest.mark.slow
def test_dvc_repro_exact_and_incremental(repo_copy):
    out = sh(DVC, "repro", cwd=repo_copy)
    for stage in ("prepare", "partition", "validate", "train@fedavg-full", "report"):
        assert f"Running stage '{stage}'" in out
    assert "cell 1 of 1: fedavg-full round 2/2" in out  # the train stage's grid position
    # the report stage: a row per cell, not its records (it printed ~300 lines before)
    report = out.split("Running stage 'report'")[1].split("Updating lock file")[0]
    assert "'accuracy'" not in report and len(report.splitlines()) < 20, report
    first = hashed_outputs(repo_copy)
    metrics = accuracy_metrics(repo_copy)
    assert metrics[0]["final_accuracy"] is not None
    lock = (repo_copy / "dvc.lock").read_text()

    out = sh(DVC, "repro", cwd=repo_copy)
    assert "Data and pipelines are up to date" in out  # second run: nothing to do

    sh(DVC, "repro", "--force", cwd=repo_copy)  # forced rerun: the same bytes everywhere
    assert hashed_outputs(repo_copy) == first
    assert (repo_copy / "dvc.lock").read_text() == lock

    params = yaml.safe_load((repo_copy / "params.yaml").read_text())
    params["federation"]["rounds"] = 3
    (repo_copy / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    out = sh(DVC, "repro", cwd=repo_copy)
    for stage in ("prepare", "partition", "validate"):
        assert f"Stage '{stage}' didn't change, skipping" in out
    assert "Running stage 'train@fedavg-full'" in out
    assert "Running stage 'report'" in out
    assert (
        hashed_outputs(repo_copy)["artifacts/partition/manifest.csv"]
        == first["artifacts/partition/manifest.csv"]
    )
    assert accuracy_metrics(repo_copy) != metrics  # three rounds now


@pytest.mark.slow
def test_committed_lock_reproduces_the_data_stages(tmp_path):
    """dvc.lock in git records the default experiment's outputs: on a copy of the checkout
    without them, `dvc repro validate` rebuilds dataset card, manifest, statistics and
    validation report with exactly the recorded hashes."""
    committed = yaml.safe_load((REPO / "dvc.lock").read_text())["stages"]
    dst = tmp_path / "repo"
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True).stdout
    for rel in files.split():
        if rel.startswith("artifacts/"):  # the committed outputs: rebuilt here, not copied
            continue
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, dst / rel)
    copy_data(dst)
    (dst / ".venv").symlink_to(REPO / ".venv")
    sh("git", "init", "-q", cwd=dst)
    sh(DVC, "repro", "validate", cwd=dst)
    rebuilt = yaml.safe_load((dst / "dvc.lock").read_text())["stages"]
    for stage in ("prepare", "partition", "validate"):
        want = {o["path"]: o["md5"] for o in committed[stage]["outs"]}
        got = {o["path"]: o["md5"] for o in rebuilt[stage]["outs"]}
        assert got == want, stage


@pytest.mark.slow
def test_dvc_exp_run_temp_with_a_param_override(repo_copy, tmp_path, monkeypatch):
    """`dvc exp run --temp -S key=value` runs the pipeline in DVC's temporary copy of the
    repository (no venv there: the stages call `fedapt` from the environment) and records
    the experiment's metrics. Tracked, on the whole test split, it is still a smoke run: its
    MLflow run names the DVC experiment and no model is registered (no alias moves)."""
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    sh(DVC, "commit", "--force", "data.dvc", cwd=repo_copy)  # the data into this copy's cache
    sh("git", "add", "-A", cwd=repo_copy)
    sh("git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base", cwd=repo_copy)
    sets = ["federation.rounds=1", "runtime.tracking=true", "data.test_subset=null"]
    out = sh(DVC, "exp", "run", "--temp", *[a for kv in sets for a in ("-S", kv)], cwd=repo_copy)
    assert "not registered: a smoke run (dvc exp run (" in out
    client = MlflowClient(uri)
    (cell,) = client.search_runs(
        [client.get_experiment_by_name("fmnist-dir05-fedavg").experiment_id]
    )
    assert cell.data.tags["fedapt.entry"] == "dvc" and cell.data.tags["fedapt.dvc_experiment"]
    assert client.search_registered_models() == []
    assert "Running stage 'train@fedavg-full'" in out
    shown = json.loads(sh(DVC, "exp", "show", "--json", cwd=repo_copy))
    exps = [
        e
        for commit in shown
        for e in (commit.get("experiments") or [])
        for e in (e.get("revs") or [])
    ]
    assert exps, shown
    data = exps[0]["data"]
    assert data["params"]["params.yaml"]["data"]["federation"]["rounds"] == 1
    metrics = data["metrics"]["artifacts/runs/fedavg-full/scores.json"]["data"]
    assert metrics["final_accuracy_pct"] is not None and metrics["rounds"] == 1
    assert sorted(data["metrics"]) == ["artifacts/runs/fedavg-full/scores.json"]  # numbers only
    numbers = {"final_accuracy_pct", "mean_accuracy_last_L_pct", "rounds", "upload_mib"}
    numbers |= {"download_mib", "last_rounds_L"}  # (the L of the mean, capped: 1 here)
    assert metrics["last_rounds_L"] == 1
    assert numbers | {"total_mib"} <= set(metrics) <= numbers | {"total_mib", "diverged_at_round"}


def test_dvc_train_and_pretrain_use_the_running_services(monkeypatch):
    """The same rule as `fedapt run`: with `fedapt up`'s MLflow server up, a `dvc repro` stage
    is tracked there (not in mlruns/); the variables are restored afterwards."""
    from flows import services
    from flows.cli.guards import guarded

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setattr(
        services,
        "env_for_clients",
        lambda *a, **k: {"MLFLOW_TRACKING_URI": "http://127.0.0.1:5999"},
    )
    seen: list = []
    guarded(services=True)(lambda: seen.append(os.environ.get("MLFLOW_TRACKING_URI")))()
    assert seen == ["http://127.0.0.1:5999"]
    assert "MLFLOW_TRACKING_URI" not in os.environ


def test_the_committed_lock_is_current():
    """dvc.lock matches the code, params and git-tracked outputs of this commit, so `dvc repro`
    on a fresh clone reruns nothing for a reason the commit could have avoided. Outputs kept
    in DVC's cache only (model.pt, the manifest, the data) are absent from a clone; they, and
    the deps of later stages that are those outputs, do not count: the stage that makes them
    is checked on its own deps. A failure names the stage and what changed: run `make repro`,
    then commit dvc.lock and artifacts/."""
    # The default pipeline and the data. reproduce/dvc.yaml has no committed lock: its stages
    # (hours to days) list as changed until run, which is true of every commit.
    r = subprocess.run(
        [DVC, "status", "--json", "dvc.yaml", "data.dvc"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    lock = yaml.safe_load((REPO / "dvc.lock").read_text())
    produced = {"data"} | {o["path"] for st in lock["stages"].values() for o in st.get("outs", [])}

    def made_by_a_stage(path: str) -> bool:  # an output, or a folder holding one
        return any(o == path or o.startswith(path.rstrip("/") + "/") for o in produced)

    absent = {"deleted", "not in cache"}
    stale = {}
    for stage, changes in json.loads(r.stdout or "{}").items():
        for change in changes if isinstance(changes, list) else [changes]:
            if not isinstance(change, dict):
                stale.setdefault(stage, []).append(change)
                continue
            for kind, what in change.items():
                if kind == "changed outs":
                    what = {p: s for p, s in what.items() if s not in absent}
                elif kind == "changed deps":
                    what = {p: s for p, s in what.items() if not made_by_a_stage(p)}
                if what:
                    stale.setdefault(stage, []).append({kind: what})
    assert not stale, (
        f"dvc.lock is stale (run `make repro`, commit dvc.lock and artifacts/): {stale}"
    )
