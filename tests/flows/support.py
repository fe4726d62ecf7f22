"""What the flows' tests share: polling, a real `fedapt run` (tiny configuration) in a
subprocess whose processes carry a mark, the CLI invoked in-process on the repository's params,
and a Prefect server's logs read whole."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from typer.testing import CliRunner

from flows.cli import app

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable
runner = CliRunner()


def wait_for(predicate, timeout: float) -> bool:
    """Polls ``predicate`` every 0.1 s until it holds or ``timeout`` seconds pass: whether it
    held."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def invoke(tmp_path, command, *args):
    """Outputs under tmp_path; no S3 copy unless a test asks for a bucket (later --set wins)."""
    reports = ["--set", f"experiment.reports_dir={tmp_path / 'reports'}"]
    data = ["--set", f"data.root={REPO / 'data/raw'}"]
    local = ["--set", "storage.bucket=null"]
    return runner.invoke(
        app, [command, *local, *args, "--params", str(REPO / "params.yaml"), *reports, *data]
    )


def read_all_logs(client, log_filter=None) -> list:
    """Every log of ``log_filter``, page by page (the server caps a read at 200)."""
    logs: list = []
    while True:
        page = client.read_logs(log_filter, limit=200, offset=len(logs))
        logs += page
        if len(page) < 200:
            return logs


# ---- a real `fedapt run`, its processes found by their mark -----------------------------

TINY = {
    "data.train_subset": "600",
    "data.test_subset": "200",
    "federation.rounds": "8",
    "federation.last_rounds": "2",
    "runtime.workers": "0",
    "partition.num_clients": "4",
    "storage.bucket": "fedapt",  # the embedded SeaweedFS
}


def fedapt_run(
    tmp_path: Path, mark: str, env_extra: dict[str, str | None] | None = None, **overrides: str
) -> subprocess.Popen[str]:
    """`fedapt run` in its own session: temporary Prefect server, embedded S3, local MLflow
    store (``env_extra``: other variables, None removes one); every process it starts
    inherits FEDAPT_FAULT_MARK (found again in /proc)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PREFECT_API", "AWS_", "MLFLOW_TRACKING"))
    }
    env.update(
        FEDAPT_FAULT_MARK=mark,
        FEDAPT_STATE_DIR=str(tmp_path / "state"),
        MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}",
        PREFECT_HOME=str(tmp_path / "prefect"),
    )
    for k, v in (env_extra or {}).items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    args = [PY, "-m", "flows.cli", "run", "--params", str(REPO / "params.yaml")]
    sets = {
        **TINY,
        "experiment.reports_dir": str(tmp_path / "reports"),
        "experiment.name": "faults",
        "data.root": str(REPO / "data/raw"),
        **overrides,
    }
    for k, v in sets.items():
        args += ["--set", f"{k}={v}"]
    return subprocess.Popen(
        args,
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def marked(mark: str) -> list[str]:
    """Live processes whose environment carries the mark: the run and all it started."""
    found = []
    needle = f"FEDAPT_FAULT_MARK={mark}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()[:100]
        except (OSError, IndexError):
            continue
        if state != "Z":
            found.append(f"{entry.name} {cmd}")
    return found


def wait_for_round(proc: subprocess.Popen[str], timeout: float = 120, round_: int = 1) -> list[str]:
    """Read stderr until round ``round_`` is reported; returns the lines read."""
    assert proc.stderr is not None
    lines = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        if f"round {round_}/" in line:
            return lines
    proc.kill()
    raise AssertionError("no round reported:\n" + "".join(lines[-20:]))
