"""Faults: the experiment lock, servers that die with their run (kill -9 included), SIGTERM
and Ctrl-C, MLflow runs left RUNNING, `fedapt up NAME` alone.

Fast tests use child processes as lock holders and stand-in servers; the slow ones run the
real `fedapt run` (tiny configuration) in a subprocess and kill it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows import services as S
from flows.cli import app
from flows.services import process
from tests.flows.support import fedapt_run, marked, wait_for, wait_for_round

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _holder(directory: Path, *extra: str) -> subprocess.Popen[str]:
    """A child process holding the lock of ``directory`` until it is killed."""
    code = (
        "import sys, time\n"
        "from flows.services.locks import run_lock\n"
        f"with run_lock({str(directory)!r}, 'fedapt run'):\n"
        "    print('ready', flush=True)\n"
        "    time.sleep(120)\n"
    )
    proc = subprocess.Popen([PY, "-c", code, *extra], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


# ----------------------------------------------------------------------------- the lock


def test_second_holder_is_refused_in_one_line_naming_the_pid(tmp_path):
    target = tmp_path / "reports" / "exp"
    proc = _holder(target)
    try:
        with pytest.raises(S.DirectoryLocked) as info:
            with S.run_lock(target):
                pass
        msg = str(info.value)
        assert "\n" not in msg
        assert f"pid {proc.pid}" in msg and "fedapt run" in msg and str(target) in msg
        assert socket.gethostname() in msg
        # what the lock file records about the holder
        from flows.services.locks import holder as read_holder

        holder = read_holder(target)
        assert holder["pid"] == proc.pid and holder["what"] == "fedapt run"
    finally:
        proc.kill()
        proc.wait()
    # the holder died (kill -9): its lock does not block, its dead pid is not "in use"
    with S.run_lock(target) as path:
        assert json.loads(path.read_text())["pid"] == os.getpid()
        with S.run_lock(target):  # re-entrant in the process that holds it
            pass


def test_a_second_open_file_description_in_the_same_process_is_refused(tmp_path):
    import fcntl

    target = tmp_path / "exp"
    target.mkdir()
    fd = os.open(target / S.LOCK_NAME, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with pytest.raises(S.DirectoryLocked, match="is in use by"):
            with S.run_lock(target):
                pass
    finally:
        os.close(fd)


def test_lock_leaves_no_folder_when_nothing_was_written(tmp_path):
    target = tmp_path / "reports" / "exp"
    with S.run_lock(target):
        assert (target / S.LOCK_NAME).is_file()
    assert not (tmp_path / "reports").exists()
    with S.run_lock(target):
        (target / "summary.json").write_text("{}")
    assert (target / "summary.json").is_file()


def test_forked_children_do_not_keep_the_lock_of_a_killed_run(tmp_path):
    """The holder forks a worker, then dies by kill -9: the worker (still alive) must not keep
    the experiment locked."""
    target = tmp_path / "exp"
    code = (
        "import os, signal, sys, time\n"
        "from flows.services.locks import run_lock\n"
        f"with run_lock({str(target)!r}):\n"
        "    r, w = os.pipe()\n"
        "    child = os.fork()\n"
        "    if child == 0:\n"  # the at-fork handlers have run once the child runs code
        "        os.write(w, b'1')\n"
        "        time.sleep(60)\n"
        "        os._exit(0)\n"
        "    os.read(r, 1)\n"
        "    print(child, flush=True)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = subprocess.Popen([PY, "-c", code], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    worker = int(proc.stdout.readline())
    proc.wait()
    try:
        assert _alive(worker)
        with S.run_lock(target):
            pass
    finally:
        os.kill(worker, signal.SIGKILL)


def test_fedapt_run_refused_before_anything_when_the_experiment_is_running(tmp_path, monkeypatch):
    """A second `fedapt run` of the same experiment stops in one line naming the first, before
    it writes a file or starts a server."""
    reports = tmp_path / "reports"
    proc = _holder(reports / "busy")

    def no_servers(*args, **kwargs):
        raise AssertionError("a server was started")

    monkeypatch.setattr(S, "run_environment", no_servers)
    try:
        args = ["run", "--params", str(REPO / "params.yaml")]
        for kv in (
            f"experiment.reports_dir={reports}",
            "experiment.name=busy",
            f"data.root={REPO / 'data/raw'}",
            "storage.bucket=null",
        ):
            args += ["--set", kv]
        res = CliRunner().invoke(app, args)
    finally:
        proc.kill()
        proc.wait()
    assert res.exit_code == 2, res.output
    text = res.output.strip()
    assert len(text.splitlines()) == 1, text
    assert f"pid {proc.pid}" in text and "fedapt run" in text
    assert sorted(p.name for p in (reports / "busy").iterdir()) == [S.LOCK_NAME]


def test_upload_skips_the_lock_file(tmp_path, s3_env):
    from tasks.results import storage

    root = tmp_path / "exp"
    with S.run_lock(root):
        (root / "summary.json").write_text("{}")
        keys = storage.upload_tree(root, "fedapt-faults", "runs/exp")
    assert keys == ["runs/exp/summary.json"]


# ----------------------------------------------------------------------------- tied servers


def _tied_parent(tmp_path: Path, lock: bool = False) -> tuple[subprocess.Popen[str], int]:
    """A child process that starts a tied stand-in server (sleep) and prints its pid."""
    code = (
        "import os, sys, time\n"
        "from pathlib import Path\n"
        "from flows.services import process\n"
        f"tmp = Path({str(tmp_path)!r})\n"
        f"lock = tmp / 'data.lock' if {lock} else None\n"
        "pid = process.spawn(['/bin/sleep', '120'], os.environ, tmp, tmp / 'x.log', lock, "
        "tied=True)\n"
        "print(pid, flush=True)\n"
        "time.sleep(120)\n"
    )
    proc = subprocess.Popen([PY, "-c", code], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def _group(pgid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                out.append(int(entry.name))
    return out


def test_tied_server_dies_with_its_parent_on_kill_9(tmp_path):
    proc, pid = _tied_parent(tmp_path, lock=True)
    try:
        assert wait_for(lambda: len(_group(pid)) == 2, 10)  # the watchdog and the server
        lock = json.loads((tmp_path / "data.lock").read_text())
        assert lock["owner"] == proc.pid and lock["kind"] == "embedded"
        proc.kill()
        proc.wait()
        assert wait_for(lambda: not _group(pid), 15), _group(pid)
    finally:
        process.signal_group(pid, signal.SIGKILL)


def test_tied_server_stops_with_down_like_any_other(tmp_path):
    pid = process.spawn(["/bin/sleep", "120"], os.environ, tmp_path, tmp_path / "x.log", tied=True)
    try:
        assert wait_for(lambda: len(_group(pid)) == 2, 10)
        t = time.monotonic()
        process.terminate(pid, timeout=5)
        assert time.monotonic() - t < 5 and not _group(pid)
        assert not process.tied(pid)
    finally:
        process.signal_group(pid, signal.SIGKILL)


def test_stale_data_lock_of_a_dead_run_is_recovered(tmp_path):
    """A server whose run died (an orphan from before the watchdog) still holds the data lock:
    the next start stops it and takes the lock instead of reporting "in use"."""
    dead = subprocess.Popen([PY, "-c", "pass"])
    dead.wait()
    lock = tmp_path / "data.lock"
    code = (
        "import fcntl, json, os, socket, sys, time\n"
        f"fd = os.open({str(lock)!r}, os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        f"info = dict(pid=os.getpid(), owner={dead.pid}, kind='embedded', "
        "host=socket.gethostname())\n"
        "os.write(fd, json.dumps(info).encode())\n"
        "print('ready', flush=True)\n"
        "time.sleep(120)\n"
    )
    orphan = subprocess.Popen(
        [PY, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert orphan.stdout is not None and orphan.stdout.readline().strip() == "ready"
    fd = os.open(lock, os.O_RDWR)
    try:
        process.take_data_lock(lock, fd, ["weed"], wait=10)
        assert orphan.wait(timeout=5) is not None
    finally:
        os.close(fd)
        if orphan.poll() is None:
            orphan.kill()
            orphan.wait()


def test_data_lock_of_a_live_run_is_in_use_naming_it(tmp_path):
    proc, pid = _tied_parent(tmp_path, lock=True)
    fd = os.open(tmp_path / "data.lock", os.O_RDWR)
    try:
        with pytest.raises(S.ServiceError) as info:
            process.take_data_lock(tmp_path / "data.lock", fd, ["/x/weed"], wait=1)
        msg = str(info.value)
        assert msg.startswith("weed cannot start:") and "\n" not in msg
        assert f"pid {pid} of `fedapt run` pid {proc.pid}" in msg
    finally:
        os.close(fd)
        proc.kill()
        proc.wait()
        wait_for(lambda: not _group(pid), 15)
        process.signal_group(pid, signal.SIGKILL)


# ----------------------------------------------------------------------------- MLflow runs


@pytest.fixture
def local_mlflow(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    from mlflow import MlflowClient

    return MlflowClient(uri)


def test_open_runs_end_killed_on_interrupt_and_failed_on_error(local_mlflow):
    from tasks import tracking

    with pytest.raises(KeyboardInterrupt), tracking.ended_on_error():
        parent = tracking.start_experiment_run("faults", {"a": 1})
        child = tracking.start_cell_run("faults", parent, "fedavg-full", {}, {})
        raise KeyboardInterrupt
    assert local_mlflow.get_run(parent).info.status == "KILLED"
    assert local_mlflow.get_run(child).info.status == "KILLED"
    tracking.end_run(child, "FAILED")  # a late end does not overwrite KILLED
    assert local_mlflow.get_run(child).info.status == "KILLED"
    with pytest.raises(ValueError), tracking.ended_on_error():
        run = tracking.start_experiment_run("faults", {})
        raise ValueError("boom")
    assert local_mlflow.get_run(run).info.status == "FAILED"


def test_runs_left_running_by_a_dead_process_are_marked_killed(local_mlflow):
    from tasks import tracking

    exp = tracking.experiment_id(local_mlflow, "stale")
    dead = subprocess.Popen([PY, "-c", "pass"])
    dead.wait()
    host = socket.gethostname()

    def run(**tags):
        return local_mlflow.create_run(exp, tags={"fedapt.kind": "cell", **tags}).info.run_id

    killed = run(**{"fedapt.pid": str(dead.pid), "fedapt.host": host})
    old = run()  # before the owner tags: stale unless a DVC stage made it
    live = run(**{"fedapt.pid": str(os.getpid()), "fedapt.host": host})
    dvc = run(**{"fedapt.entry": "dvc"})
    elsewhere = run(**{"fedapt.pid": str(dead.pid), "fedapt.host": host + "-other"})
    assert sorted(tracking.close_stale_runs("stale")) == sorted([killed, old])
    status = {r: local_mlflow.get_run(r).info.status for r in (killed, old, live, dvc, elsewhere)}
    assert status == {
        killed: "KILLED",
        old: "KILLED",
        live: "RUNNING",
        dvc: "RUNNING",
        elsewhere: "RUNNING",
    }


# ----------------------------------------------------------------------------- real runs


def _statuses(tmp_path: Path) -> dict[str, str]:
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("faults")
    runs = client.search_runs([exp.experiment_id])
    return {r.info.run_id: (r.data.tags.get("fedapt.kind"), r.info.status) for r in runs}


@pytest.mark.slow
def test_kill_9_of_fedapt_run_leaves_no_process_and_a_rerun_succeeds(tmp_path):
    mark = uuid.uuid4().hex
    proc = fedapt_run(tmp_path, mark)
    try:
        wait_for_round(proc)
        started = marked(mark)
        assert any("weed" in p for p in started) and any("uvicorn" in p for p in started)
        os.kill(proc.pid, signal.SIGKILL)  # the main process alone: its servers must follow
        proc.wait()
        assert wait_for(lambda: not marked(mark), 20), marked(mark)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    # the same command again: no "in use", the stale MLflow runs are closed, the run completes
    again = fedapt_run(tmp_path, mark)
    out, err = again.communicate(timeout=240)
    assert again.returncode == 0, err[-3000:]
    assert "marked 2 run(s) of faults KILLED" in err
    assert (tmp_path / "reports" / "faults" / "summary.json").is_file()
    kinds = sorted(_statuses(tmp_path).values())
    assert kinds == [
        ("cell", "FINISHED"),
        ("cell", "KILLED"),
        ("experiment", "FINISHED"),
        ("experiment", "KILLED"),
    ]
    assert wait_for(lambda: not marked(mark), 20), marked(mark)


@pytest.mark.slow
def test_sigterm_stops_fast_in_one_line_with_runs_killed(tmp_path):
    """SIGTERM under a run whose clients train in worker processes: it ends within 10 s in
    one line, its checkpoint kept, without warnings (no "leaked semaphore objects" from the
    pool's queues)."""
    mark = uuid.uuid4().hex
    sets = {"federation.rounds": "200", "runtime.workers": "2", "runtime.checkpoint_every": "1"}
    proc = fedapt_run(tmp_path, mark, **sets)
    try:
        wait_for_round(proc, round_=2)
        t = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        took = time.monotonic() - t
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 143, err[-3000:]
    assert took < 10, took
    ours = [ln for ln in err.splitlines() if ln.startswith("fedapt:")]
    assert ours == ["fedapt: interrupted by SIGTERM (exit 143)"], err[-3000:]
    assert err.strip().splitlines()[-1] == ours[0], err[-3000:]
    assert "Traceback" not in err and "Warning" not in err and "leaked" not in err
    exp = tmp_path / "reports" / "faults"
    assert not (exp / "summary.json").exists()
    assert list((exp / "checkpoints").glob("*.pt"))  # what a rerun resumes from
    assert not list(exp.rglob("*.tmp"))  # nothing half-written
    assert sorted(_statuses(tmp_path).values()) == [("cell", "KILLED"), ("experiment", "KILLED")]
    assert wait_for(lambda: not marked(mark), 20), marked(mark)


@pytest.mark.slow
def test_up_s3_alone_then_status_and_down(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FEDAPT_")}
    env.update(FEDAPT_STATE_DIR=str(tmp_path / "state"), FEDAPT_S3_PORT="0")

    def fedapt(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [PY, "-m", "flows.cli", *args],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    try:
        up = fedapt("up", "s3")
        assert up.returncode == 0, up.stdout + up.stderr
        st = S.status(state=tmp_path / "state")
        assert st["s3"].state == "running" and st["s3"].healthy
        assert all(st[n].state == "stopped" for n in ("mlflow", "prefect", "worker"))
        status = fedapt("status")
        assert status.returncode == 0 and "running" in status.stdout
        down = fedapt("down")
        assert down.returncode == 0, down.stdout + down.stderr
        assert wait_for(lambda: not process.group_alive(st["s3"].pid), 10)
        assert S.status(state=tmp_path / "state")["s3"].state == "stopped"
    finally:
        for rec in S.read_state(tmp_path / "state").values():
            process.signal_group(int(rec["pid"]), signal.SIGKILL)


@pytest.mark.slow
def test_two_experiments_run_side_by_side_without_collisions(tmp_path):
    """Different experiment names at once: both complete, each with its own outputs, MLflow
    runs, registry version and S3 prefix; they share one embedded SeaweedFS, which stops after
    the last of them."""
    mark = uuid.uuid4().hex
    runs = {
        name: fedapt_run(
            tmp_path,
            mark,
            **{
                "experiment.name": name,
                "experiment.seed": str(seed),
                "federation.rounds": "3",
                "tracking.register": "always",
            },
        )
        for seed, name in enumerate(("side-a", "side-b"))
    }
    try:
        for name, proc in runs.items():
            out, err = proc.communicate(timeout=240)
            assert proc.returncode == 0, f"{name}: {err[-3000:]}"
            assert f"outputs: s3://fedapt/runs/{name}/" in out
    finally:
        for proc in runs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    versions = set()
    for seed, name in enumerate(runs):
        summary = json.loads((tmp_path / "reports" / name / "summary.json").read_text())
        assert summary["experiment"] == name and summary["params"]["experiment.seed"] == seed
        (record,) = summary["runs"]
        run = client.get_run(record["mlflow_run_id"])
        assert run.info.status == "FINISHED"
        assert client.get_experiment(run.info.experiment_id).name == name
        versions.add(record["model_version"])
    assert len(versions) == 2
    assert wait_for(lambda: not marked(mark), 20), marked(mark)
