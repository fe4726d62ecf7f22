"""Local services (flows/services/): fast tests of the bookkeeping, slow tests with the real
SeaweedFS, MLflow and Prefect servers (each started once, stopped in a finally)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from fedcore.errors import FedaptError
from flows import services as S
from flows.services import clients, config, embedded, process, supervisor

# ----------------------------------------------------------------------------- helpers


@pytest.fixture
def sd(tmp_path):
    return tmp_path / "state"


@pytest.fixture
def no_spawn(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("a server process was started")

    for module in (supervisor, embedded):  # where up and embedded_s3 look spawn up
        monkeypatch.setattr(module, "spawn", fail)


@pytest.fixture
def bystander():
    """An unrelated live process (what a recycled pid would point at)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield proc
    proc.kill()
    proc.wait()


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _record(name: str, pid: int, port: int = 1) -> dict:
    return {
        "name": name,
        "pid": pid,
        "port": port,
        "url": f"http://127.0.0.1:{port}",
        "log": "/nonexistent.log",
        "started_at": "2026-01-01T00:00:00+00:00",
    }


def _gone(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return True
    return not process.any_member_alive(pid)


# ----------------------------------------------------------------------------- fast tests


def test_port_in_use_is_one_line_naming_service_port_and_variable(sd, busy_port, no_spawn):
    with pytest.raises(S.PortInUseError) as info:
        S.up(["s3"], state=sd, ports={"s3": busy_port})
    msg = str(info.value)
    assert isinstance(info.value, FedaptError)
    assert "\n" not in msg
    assert msg.startswith("s3 cannot start")
    assert f"port {busy_port}" in msg
    assert "FEDAPT_S3_PORT=" in msg
    assert "s3" not in S.read_state(sd)


def test_every_port_is_checked_before_anything_starts(sd, busy_port, no_spawn, monkeypatch):
    monkeypatch.setenv("FEDAPT_PREFECT_PORT", str(busy_port))
    with pytest.raises(S.PortInUseError, match="prefect cannot start.*FEDAPT_PREFECT_PORT="):
        S.up(["s3", "prefect"], state=sd, ports={"s3": 0})


def test_dead_pid_is_stale_and_cleaned(sd, busy_port, no_spawn):
    S.write_state(sd, {"s3": _record("s3", _dead_pid()), "mlflow": _record("mlflow", _dead_pid())})
    st = S.status(state=sd)
    assert st["s3"].state == "stale" and not st["s3"].healthy
    assert st["mlflow"].state == "stale"
    assert st["prefect"].state == "stopped"
    # up drops stale records before checking ports (here: busy, so nothing starts)
    with pytest.raises(S.PortInUseError):
        S.up(["s3"], state=sd, ports={"s3": busy_port})
    assert S.read_state(sd) == {}
    S.write_state(sd, {"prefect": _record("prefect", _dead_pid())})
    assert S.down(state=sd)["prefect"].state == "stopped"
    assert S.read_state(sd) == {}


def test_stopping_s3_stops_mlflow_that_stores_artifacts_in_it(sd):
    S.write_state(
        sd,
        {n: _record(n, _dead_pid()) for n in S.SERVICES},
    )
    st = S.down(["s3"], state=sd)
    assert sorted(st) == ["mlflow", "s3"]
    # ray needs neither; postgres is no store of theirs here
    assert sorted(S.read_state(sd)) == ["postgres", "prefect", "ray", "worker"]


def test_stopping_prefect_stops_its_worker(sd):
    S.write_state(sd, {n: _record(n, _dead_pid()) for n in S.SERVICES})
    st = S.down(["prefect"], state=sd)
    assert sorted(st) == ["prefect", "worker"]
    assert sorted(S.read_state(sd)) == ["mlflow", "postgres", "ray", "s3"]


def test_recycled_pid_is_stale_and_never_killed(sd, bystander):
    S.write_state(sd, {"mlflow": _record("mlflow", bystander.pid)})
    assert S.status(state=sd)["mlflow"].state == "stale"
    S.down(state=sd)
    time.sleep(0.2)
    assert bystander.poll() is None  # still alive: it is not our server
    assert S.read_state(sd) == {}


def test_state_file_is_written_atomically(sd, monkeypatch):
    S.write_state(sd, {"s3": _record("s3", 123)})
    path = sd / S.STATE_FILE
    before = path.read_text()
    assert json.loads(before)["services"]["s3"]["pid"] == 123

    from fedcore import files

    def broken_fsync(fd):  # written to the temporary file, then the disk fills
        raise OSError("disk full")

    monkeypatch.setattr(files.os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="disk full"):
        S.write_state(sd, {"s3": _record("s3", 456)})
    monkeypatch.undo()
    assert path.read_text() == before  # the old state is intact
    assert sorted(p.name for p in sd.iterdir()) == [".gitignore", S.STATE_FILE]  # no temp left
    assert S.read_state(sd)["s3"]["pid"] == 123
    path.unlink()
    assert S.read_state(sd) == {}  # no state file: no services


CORRUPT_STATES = [
    "{not json",
    "",
    "[1, 2, 3]",
    '{"version": 1, "services": [1]}',
    '{"version": 1, "services": {"s3": 5}}',
    '{"version": 1, "services": {"s3": {"pid": "abc", "port": 8333}}}',
    '{"version": 1, "services": {"s3": {"pid": [1]}}}',
    '{"version": 1, "services": {"s3": {"pid": 1, "port": true}}}',
    '{"version": 1, "services": {"s3": {"pid": 1, "leftovers": "/tmp"}}}',
]


@pytest.mark.parametrize("text", CORRUPT_STATES)
@pytest.mark.parametrize("command", ["status", "down", "env"])
def test_a_state_file_fedapt_did_not_write_is_one_line_never_no_services(
    tmp_path, monkeypatch, command, text
):
    """status/down/env on a corrupt services.json: one line naming it, never "stopped" (a
    running service would be left behind unseen) and never a traceback."""
    from flows.cli import app
    from tests.cli_contract import runner

    sd = tmp_path / "state"
    sd.mkdir()
    (sd / S.STATE_FILE).write_text(text)
    monkeypatch.setenv("FEDAPT_STATE_DIR", str(sd))
    res = runner.invoke(app, [command])
    out = res.output.strip()
    assert res.exit_code != 0 and "Traceback" not in out, out
    assert out.splitlines()[-1].startswith("fedapt: error: "), out
    assert f"{sd / S.STATE_FILE} is not a services state file" in out, out
    assert (sd / S.STATE_FILE).read_text() == text  # nothing rewritten


def test_leftovers_named_by_a_state_file_are_removed_only_in_their_own_shape(tmp_path):
    """`fedapt down` removes what a stopped SeaweedFS left (its scratch folder, its /tmp
    sockets); a state file naming any other path removes nothing."""
    from flows.services.s3 import remove_leftovers

    scratch = tmp_path / "state" / "run" / "s3-8333"
    scratch.mkdir(parents=True)
    (scratch / "weed.log").write_text("log")
    victims = [tmp_path / "victim.txt", tmp_path / "run" / "notes", tmp_path / "s3-1"]
    for v in victims:
        v.parent.mkdir(parents=True, exist_ok=True)
        v.write_text("mine")
    tmp = tempfile.gettempdir()
    ray = Path(tempfile.mkdtemp(prefix="fedapt-ray-x", dir=tmp))  # not hex: not a head's
    head = Path(tmp) / f"fedapt-ray-{os.urandom(6).hex()}"  # a Ray head's session folder
    (head / "session_latest").mkdir(parents=True)
    # look-alikes: another length of hex, another parent than the temp folder
    short = Path(tempfile.mkdtemp(prefix=f"fedapt-ray-{os.urandom(4).hex()}", dir=tmp))
    short = short.rename(Path(tmp) / f"fedapt-ray-{os.urandom(4).hex()}")
    elsewhere = tmp_path / f"fedapt-ray-{os.urandom(6).hex()}"
    elsewhere.mkdir()
    try:
        remove_leftovers(
            [
                str(scratch),
                *map(str, victims),
                "/tmp/other.sock",
                "relative/run/s3-1",
                str(ray),
                str(head),
                str(short),
                str(elsewhere),
            ]
        )
        assert not scratch.exists() and not head.exists()
        assert all(v.read_text() == "mine" for v in victims) and ray.is_dir()
        assert short.is_dir() and elsewhere.is_dir()
    finally:
        for folder in (ray, head, short):
            shutil.rmtree(folder, ignore_errors=True)


def _healthy(monkeypatch, names=("s3", "mlflow", "prefect")):
    ports = {"s3": 18333, "mlflow": 15000, "prefect": 14200}

    def fake_status(services=None, *, state=None, probe_timeout=1.0):
        return {
            n: S.ServiceStatus(n, "running", True, 1, ports[n], f"http://127.0.0.1:{ports[n]}")
            if n in names
            else S.ServiceStatus(n, "stopped", False)
            for n in S.SERVICES
        }

    monkeypatch.setattr(clients, "status", fake_status)  # env_for_clients looks it up


def test_env_for_clients_gives_what_is_up(monkeypatch):
    _healthy(monkeypatch)
    env = S.env_for_clients(environ={})
    assert env["AWS_ENDPOINT_URL"] == env["MLFLOW_S3_ENDPOINT_URL"] == "http://127.0.0.1:18333"
    assert env["AWS_ACCESS_KEY_ID"] and env["AWS_SECRET_ACCESS_KEY"]
    assert env["AWS_DEFAULT_REGION"] == "us-east-1"
    assert env["MLFLOW_TRACKING_URI"] == "http://127.0.0.1:15000"
    assert env["PREFECT_API_URL"] == "http://127.0.0.1:14200/api"
    _healthy(monkeypatch, names=("prefect",))
    assert S.env_for_clients(environ={}) == {"PREFECT_API_URL": "http://127.0.0.1:14200/api"}


def test_env_for_clients_waits_for_a_running_service_that_is_slow_to_answer(monkeypatch, capsys):
    """A loaded machine: mlflow's process runs but misses the quick probe. Its clients get
    it once it answers; one that never answers is left out with a line on stderr, never
    silently (its clients would track to a local store)."""
    answers = iter([False, False, True])

    def slow_status(services=None, *, state=None, probe_timeout=1.0):
        healthy = next(answers, False)
        return {
            n: S.ServiceStatus(n, "running", healthy, 7, 15000, "http://127.0.0.1:15000")
            if n == "mlflow"
            else S.ServiceStatus(n, "stopped", False)
            for n in (services or S.SERVICES)
        }

    monkeypatch.setattr(clients, "status", slow_status)
    monkeypatch.setattr(clients.time, "sleep", lambda s: None)
    assert S.env_for_clients(environ={}) == {"MLFLOW_TRACKING_URI": "http://127.0.0.1:15000"}
    assert capsys.readouterr().err == ""
    answers = iter([])
    assert S.env_for_clients(environ={}, patience=0.2) == {}
    err = capsys.readouterr().err
    assert "mlflow runs (pid 7) but did not answer its health check" in err, err


def test_env_for_clients_never_overrides_the_user(monkeypatch):
    _healthy(monkeypatch)
    user = {
        "AWS_ENDPOINT_URL": "https://minio.example.org",
        "MLFLOW_TRACKING_URI": "http://mlflow.example.org",
    }
    env = S.env_for_clients(environ=user)
    # the user's S3 wins as a whole: none of our S3 variables, above all not our keys
    assert not any(k.startswith("AWS_") or k == "MLFLOW_S3_ENDPOINT_URL" for k in env)
    assert env == {"PREFECT_API_URL": "http://127.0.0.1:14200/api"}
    # keys alone (real AWS) also win; the empty string counts as unset
    env = S.env_for_clients(environ={"AWS_PROFILE": "work", "PREFECT_API_URL": ""})
    assert "AWS_ENDPOINT_URL" not in env and "PREFECT_API_URL" in env
    env = S.env_for_clients(environ={"AWS_DEFAULT_REGION": "eu-west-1"})
    assert "AWS_DEFAULT_REGION" not in env and "AWS_ENDPOINT_URL" in env


def test_run_environment_applies_and_restores(monkeypatch):
    _healthy(monkeypatch, names=("mlflow",))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("PREFECT_API_URL", "http://user-prefect/api")
    with S.run_environment() as added:
        assert added == {"MLFLOW_TRACKING_URI": "http://127.0.0.1:15000"}
        assert os.environ["MLFLOW_TRACKING_URI"] == "http://127.0.0.1:15000"
        assert os.environ["PREFECT_API_URL"] == "http://user-prefect/api"
    assert "MLFLOW_TRACKING_URI" not in os.environ


def test_server_that_dies_reports_service_and_log(tmp_path):
    log = tmp_path / "logs" / "mlflow.log"
    cmd = [sys.executable, "-c", "import sys; print('Error: no such option --wrong'); sys.exit(3)"]
    pid = process.spawn(cmd, os.environ, tmp_path, log)
    with pytest.raises(S.ServiceError) as info:
        supervisor.wait_healthy("mlflow", pid, S.free_port(), log, time.monotonic() + 30)
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith("mlflow exited during start (code 3)")
    assert str(log) in msg and "no such option --wrong" in msg
    assert _gone(pid)


def test_server_that_never_answers_is_stopped(tmp_path):
    log = tmp_path / "prefect.log"
    pid = process.spawn(
        [sys.executable, "-c", "import time; time.sleep(120)"], os.environ, tmp_path, log
    )
    try:
        with pytest.raises(S.ServiceError, match=r"prefect did not answer .*/api/health in time"):
            supervisor.wait_healthy("prefect", pid, S.free_port(), log, time.monotonic() + 1.0)
        assert _gone(pid)
    finally:
        process.signal_group(pid, signal.SIGKILL)


def test_stop_escalates_to_sigkill_for_the_whole_group(tmp_path):
    script = "trap '' TERM; sleep 120 & sleep 120"  # ignores SIGTERM, has a child
    pid = process.spawn(["sh", "-c", script], os.environ, tmp_path, tmp_path / "x.log")
    try:
        time.sleep(0.3)
        t = time.monotonic()
        process.terminate(pid, timeout=0.5)
        assert time.monotonic() - t < 5
        assert _gone(pid)
    finally:
        process.signal_group(pid, signal.SIGKILL)


def test_credentials_stay_out_of_reprs():
    info = S.EmbeddedS3("http://127.0.0.1:1", S.s3_client_env("http://127.0.0.1:1"), True, 1)
    assert config.S3_SECRET_KEY not in repr(info) and config.S3_ACCESS_KEY not in repr(info)
    assert config.S3_SECRET_KEY not in repr(S.ServiceStatus("s3", "running", True, 1, 1, "u"))


# ----------------------------------------------------------------------------- slow tests


@pytest.mark.slow
def test_up_status_mlflow_artifact_in_seaweedfs_down(sd, monkeypatch):
    for var in ("MLFLOW_TRACKING_URI", *S.USER_S3_VARS, "PREFECT_API_URL"):
        monkeypatch.delenv(var, raising=False)
    ports = {"s3": 0, "mlflow": 0, "prefect": 0, "worker": 0}
    pids: list[int] = []
    try:
        t = time.monotonic()
        st = S.up(state=sd, ports=ports)
        print(f"up: {time.monotonic() - t:.1f} s")
        pids = [s.pid for s in st.values() if s.pid]
        assert all(s.state == "running" and s.healthy for s in st.values()), st
        assert len(set(pids)) == 4
        # the worker created the work pool of `fedapt deploy` and polls it
        assert S.work_pool_status(S.read_state(sd)["prefect"]["api_url"]) == "READY"
        again = S.up(state=sd, ports=ports)  # idempotent: same processes
        assert [s.pid for s in again.values()] == pids

        env = S.env_for_clients(sd)
        assert set(env) == {
            "AWS_ENDPOINT_URL",
            "MLFLOW_S3_ENDPOINT_URL",
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_DEFAULT_REGION",
            "MLFLOW_TRACKING_URI",
            "PREFECT_API_URL",
        }
        assert S.probe(env["PREFECT_API_URL"] + "/health")

        from mlflow import MlflowClient

        client = MlflowClient(env["MLFLOW_TRACKING_URI"])
        exp = client.create_experiment("services-test")
        run = client.create_run(exp)
        client.log_metric(run.info.run_id, "acc", 0.5, step=1)
        artifact = sd.parent / "note.txt"
        artifact.write_text("federated")
        client.log_artifact(run.info.run_id, str(artifact))
        assert [f.path for f in client.list_artifacts(run.info.run_id)] == ["note.txt"]

        s3 = S.s3_client(env["AWS_ENDPOINT_URL"])
        keys = [
            o["Key"]
            for o in s3.list_objects_v2(Bucket=S.DEFAULT_BUCKET, Prefix="mlflow/").get(
                "Contents", []
            )
        ]
        key = next(k for k in keys if k.endswith(f"{run.info.run_id}/artifacts/note.txt"))
        body = s3.get_object(Bucket=S.DEFAULT_BUCKET, Key=key)["Body"].read()
        assert body == b"federated"
    finally:
        t = time.monotonic()
        stopped = S.down(state=sd)
        print(f"down: {time.monotonic() - t:.1f} s")
        for pid in pids:
            if not _gone(pid):
                process.signal_group(pid, signal.SIGKILL)
    assert all(s.state == "stopped" for s in stopped.values())
    assert all(_gone(pid) for pid in pids)
    assert S.read_state(sd) == {}


@pytest.mark.slow
def test_embedded_s3_round_trip_and_cleanup(sd, monkeypatch):
    for var in S.USER_S3_VARS:
        monkeypatch.delenv(var, raising=False)
    pid = None
    try:
        with S.embedded_s3(sd) as s3:
            pid = s3.pid
            assert s3.started and s3.endpoint.startswith("http://127.0.0.1:")
            assert os.environ["AWS_ENDPOINT_URL"] == s3.endpoint
            from tasks.results import storage

            keys = storage.upload_tree(_tree(sd.parent), S.DEFAULT_BUCKET, "run1")
            assert keys == ["run1/a.txt"]
            client = storage.s3_client()
            got = client.get_object(Bucket=S.DEFAULT_BUCKET, Key="run1/a.txt")["Body"].read()
            assert got == b"payload"
            # one SeaweedFS per data dir: a second run on the same state dir shares it, and
            # it keeps serving the first when the second is done
            with S.embedded_s3(sd) as again:
                assert not again.started and (again.endpoint, again.pid) == (s3.endpoint, pid)
            assert not _gone(pid)
            assert client.list_buckets()["Buckets"]
        assert "AWS_ENDPOINT_URL" not in os.environ
        assert _gone(pid)
    finally:
        if pid and not _gone(pid):
            process.signal_group(pid, signal.SIGKILL)


def _tree(base: Path) -> Path:
    root = base / "out"
    root.mkdir()
    (root / "a.txt").write_bytes(b"payload")
    return root
