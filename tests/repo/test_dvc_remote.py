"""The DVC remote on the S3-compatible server: `dvc push` then `dvc pull` into an empty cache
gives back the same bytes (real SeaweedFS, as `fedapt up` configures it)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DVC = str(Path(sys.executable).parent / "dvc")


def sh(*cmd: str, cwd: Path) -> str:
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    res = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout + res.stderr


@pytest.mark.slow
def test_dvc_push_pull_round_trip(tmp_path, monkeypatch):
    from flows import services
    from flows.cli.services import configure_dvc_remote

    for var in services.USER_S3_VARS:
        monkeypatch.delenv(var, raising=False)
    repo = tmp_path / "repo"
    repo.mkdir()
    shutil.copytree(REPO / ".dvc", repo / ".dvc", ignore=shutil.ignore_patterns("cache", "tmp"))
    (repo / ".dvc" / "config.local").unlink(missing_ok=True)
    sh("git", "init", "-q", cwd=repo)
    payload = os.urandom(300_000)
    (repo / "shard.bin").write_bytes(payload)
    sh(DVC, "add", "-q", "shard.bin", cwd=repo)

    with services.embedded_s3(tmp_path / "state", set_env=False) as s3:
        configure_dvc_remote(s3.endpoint, repo=repo)
        local = (repo / ".dvc" / "config.local").read_text()
        assert s3.endpoint in local
        assert oct((repo / ".dvc" / "config.local").stat().st_mode & 0o777) == "0o600"
        assert "s3://fedapt/dvc" in (repo / ".dvc" / "config").read_text()  # committed part
        assert "1 file pushed" in sh(DVC, "push", cwd=repo)
        keys = [
            o["Key"]
            for o in services.s3_client(s3.endpoint)
            .list_objects_v2(Bucket="fedapt", Prefix="dvc/")
            .get("Contents", [])
        ]
        md5 = hashlib.md5(payload).hexdigest()
        assert any(k.endswith(md5[2:]) for k in keys), keys

        shutil.rmtree(repo / ".dvc" / "cache")
        (repo / "shard.bin").unlink()
        sh(DVC, "pull", cwd=repo)
    assert (repo / "shard.bin").read_bytes() == payload
