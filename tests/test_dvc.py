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


@pytest.fixture
def repo_copy(tmp_path):
    dst = tmp_path / "repo"
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True).stdout
    for rel in files.split():
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, dst / rel)
    shutil.copytree(REPO / "data", dst / "data")
    (dst / ".venv").symlink_to(REPO / ".venv")
    params = yaml.safe_load((dst / "params.yaml").read_text())
    params["data"].update(train_subset=600, test_subset=300)
    params["federation"].update(rounds=2, last_rounds=2)
    params["runtime"]["workers"] = 0
    (dst / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    sh("git", "init", "-q", cwd=dst)
    return dst


def accuracy_metrics(root: Path, name: str) -> list:
    s = json.loads((root / f"artifacts/reports/{name}/summary.json").read_text())
    keys = (
        "final_accuracy",
        "mean_accuracy_last_L",
        "upload_bytes",
        "download_bytes",
        "partition_hash",
    )
    return [{k: r[k] for k in keys} for r in s["runs"]]


@pytest.mark.slow
def test_dvc_repro_exact_and_incremental(repo_copy):
    name = yaml.safe_load((repo_copy / "params.yaml").read_text())["experiment"]["name"]
    sh(DVC, "repro", cwd=repo_copy)
    manifest = (repo_copy / "artifacts/partition/manifest.csv").read_bytes()
    first = accuracy_metrics(repo_copy, name)
    assert first[0]["final_accuracy"] is not None

    out = sh(DVC, "repro", cwd=repo_copy)
    assert "up to date" in out  # second run: nothing to do

    sh(DVC, "repro", "--force", cwd=repo_copy)  # forced rerun: same partition, same numbers
    assert (repo_copy / "artifacts/partition/manifest.csv").read_bytes() == manifest
    assert accuracy_metrics(repo_copy, name) == first

    params = yaml.safe_load((repo_copy / "params.yaml").read_text())
    params["federation"]["rounds"] = 3
    (repo_copy / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    out = sh(DVC, "repro", cwd=repo_copy)
    assert "Stage 'partition' didn't change, skipping" in out
    assert "Running stage 'train'" in out
