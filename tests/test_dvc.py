"""`dvc repro` in a temporary copy of the repository: exact reruns, no-op second run,
and a param change that reruns only the stages depending on it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
DVC = str(Path(sys.executable).parent / "dvc")


def sh(*cmd: str, cwd: Path) -> str:
    env = {**os.environ, "DVC_NO_ANALYTICS": "1", "DO_NOT_TRACK": "true"}
    res = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout + res.stderr


def copy_data(dst: Path) -> None:
    """The dataset the pipeline reads (``data/``, set up by ``make setup``): its absence is a
    failure that says how to fix it, not a copy error deep in shutil."""
    raw = REPO / "data" / "raw"
    assert raw.is_dir() and any(raw.iterdir()), (
        f"{raw} is missing or empty: run `make setup` (scripts/get-data.sh) first"
    )
    shutil.copytree(REPO / "data", dst / "data")


@pytest.fixture
def repo_copy(tmp_path):
    dst = tmp_path / "repo"
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True).stdout
    for rel in files.split():
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, dst / rel)
    copy_data(dst)
    (dst / ".venv").symlink_to(REPO / ".venv")
    params = yaml.safe_load((dst / "params.yaml").read_text())
    params["data"].update(train_subset=600, test_subset=300)
    params["federation"].update(rounds=2, last_rounds=2)
    params["runtime"].update(workers=0, tracking=False)
    (dst / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    sh("git", "init", "-q", cwd=dst)
    return dst


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
        "artifacts/report/summary.json",
        "artifacts/report/comm_cost.json",
        "artifacts/report/comm_cost.md",
    ]
    return {f: (root / f).read_bytes() for f in files}


@pytest.mark.slow
def test_dvc_repro_exact_and_incremental(repo_copy):
    out = sh(DVC, "repro", cwd=repo_copy)
    for stage in ("prepare", "partition", "validate", "train@fedavg-full", "report"):
        assert f"Running stage '{stage}'" in out
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
