"""What the flows' tests share: polling, a real `fedapt run` (tiny configuration) in a
subprocess whose processes carry a mark, the CLI invoked in-process on the repository's params,
a Prefect server's logs read whole, and the run's own Ray in a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable


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
    from typer.testing import CliRunner

    from flows.cli import app

    reports = ["--set", f"experiment.reports_dir={tmp_path / 'reports'}"]
    data = ["--set", f"data.root={REPO / 'data/raw'}"]
    local = ["--set", "storage.bucket=null"]
    return CliRunner().invoke(
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


# ---- a run's own Ray, started in a fresh process (tests/flows/test_localray.py) -------------

VARS = ("RAY_AUTH_MODE", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")


def cpu_params(*sets: str):
    """The repository's params on the CPU, with ``sets``."""
    from tasks.config import load_params

    return load_params(REPO / "params.yaml", ["runtime.device=cpu", *sets])


def host(way: str, ray_first: bool) -> None:
    """In a fresh process: the run's own Ray, started the way ``way`` (clients, task_runner)
    starts it, prints its GCS address and the auth mode a worker sees, stops on a line on
    stdin, then prints the variables of ``VARS`` as they are after ``local_ray``."""
    if ray_first:
        import ray  # noqa: F401
    from flows.localray import local_ray
    from flows.runners import ray_task_runner
    from tasks.training.runtime import ray_settings, resolve_runtime

    p = cpu_params(f"runtime.{way}=ray", "runtime.ray_workers=1", "runtime.ray_actors=1")
    with local_ray(p):
        import ray

        if way == "clients":
            from fedcore.engine.ray_cluster import connect

            settings = ray_settings(p, resolve_runtime(p))
            assert settings is not None and connect(settings)
            stop = ray.shutdown
        else:
            runner = ray_task_runner(p).__enter__()

            def stop() -> None:
                runner.__exit__(None, None, None)

        def auth_mode() -> str | None:  # (pickled by value: the workers need no tests/)
            return os.environ.get("RAY_AUTH_MODE")

        seen = ray.get(ray.remote(auth_mode).remote())  # a worker runs it
        gcs = ray.get_runtime_context().gcs_address
        print(json.dumps({"gcs": gcs, "worker_auth": seen}), flush=True)
        sys.stdin.readline()
        stop()
    print(json.dumps({k: os.environ.get(k) for k in VARS}), flush=True)
