"""The Ray head of ``fedapt up ray`` (flows/services/rayhead.py): started only when named,
a busy port or a failed start is one line with nothing left running; which Ray a run uses
(``runtime.ray_address``, else ``RAY_ADDRESS``, else its own); and a real head (~10 s):
``fedapt up ray``, status healthy, a job connects to the address ``fedapt env`` exports,
``fedapt down ray`` leaves none of its processes (also after kill -9 of its ``ray start``)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from flows import services as S
from flows.services import commands, config, rayhead, supervisor

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def sd(tmp_path):
    return tmp_path / "state"


def _cli(*args: str, sd: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RAY_", "FEDAPT_ENV", "FEDAPT_RAY"))
    }
    env.update(FEDAPT_STATE_DIR=str(sd), PYTHONPATH=str(REPO), COLUMNS="250", **extra)
    return subprocess.run(
        [sys.executable, "-m", "flows.cli", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_a_plain_up_does_not_start_ray_but_down_and_status_cover_it(sd, monkeypatch):
    checked: list[str] = []

    def stop_at_ports(name, port, taken=None, host=None):  # type: ignore[no-untyped-def]
        checked.append(name)
        raise S.PortInUseError("stop here")

    monkeypatch.setattr(supervisor, "check_port", stop_at_ports)
    with pytest.raises(S.PortInUseError):
        S.up(state=sd)
    assert checked and "ray" not in checked
    # postgres: only for a PostgreSQL store (tests/flows/services/test_postgres.py)
    assert config.DEFAULT_SERVICES == tuple(n for n in S.SERVICES if n not in ("ray", "postgres"))
    assert "postgres" not in checked
    assert "ray" in S.status(state=sd)
    assert S.status(state=sd)["ray"].state == "stopped"


def test_ray_on_a_busy_port_is_one_line_naming_the_variable(sd, busy_port):
    res = _cli("up", "ray", sd=sd, FEDAPT_RAY_PORT=str(busy_port))
    assert res.returncode == 2, res.stdout + res.stderr
    text = (res.stdout + res.stderr).strip()
    assert len(text.splitlines()) == 1, text
    assert text.count("ray cannot start") == 1
    assert f"port {busy_port}" in text and "FEDAPT_RAY_PORT=" in text
    assert "Traceback" not in text
    assert S.read_state(sd) == {}


def test_a_ray_that_fails_to_start_is_one_line_and_leaves_nothing(sd, monkeypatch):
    script = "import sys; print('ValueError: no such option --bad'); sys.exit(1)"
    monkeypatch.setattr(
        commands,
        "ray_cmd",
        lambda sd, port, host: [
            sys.executable,
            "-c",
            script,
            "--port",
            str(port),
            "--temp-dir",
            "x",
        ],
    )
    (sd / "ray").mkdir(parents=True)
    for module in (commands, supervisor):  # command's, and up's record of the head
        monkeypatch.setattr(module, "ray_record", lambda cmd: {"temp_dir": str(sd / "ray")})
    monkeypatch.setattr(commands, "ensure_token", lambda env: None)
    with pytest.raises(S.ServiceError) as info:
        S.up(["ray"], state=sd, ports={"ray": 0})
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith("ray exited during start (code 1)")
    assert "no such option --bad" in msg and "ray.log" in msg
    assert S.read_state(sd) == {}


def test_the_heads_session_folder_fits_rays_socket_paths(tmp_path):
    assert rayhead.ray_temp_dir(Path("/r/.fedapt")) == Path("/r/.fedapt/ray")
    long = rayhead.ray_temp_dir(tmp_path / ("x" * 60))
    assert len(str(long)) <= 60 and long.name.startswith("fedapt-ray-")
    assert rayhead.ray_temp_dir(tmp_path / ("x" * 60)) == long  # one per state folder


# ----------------------------------------------------------------------------- runs


def _params(*sets: str):  # type: ignore[no-untyped-def]
    from tasks.config import load_params

    return load_params(REPO / "params.yaml", list(sets))


def test_a_run_on_ray_uses_ray_address_only_where_runtime_ray_address_is_null(monkeypatch):
    from flows.runners import cells_share_ray, grid_parallelism, grid_task_runner
    from tasks.training.runtime import ray_address, ray_settings, resolve_runtime

    both = ("runtime.task_runner=ray", "runtime.clients=ray", "runtime.device=cpu")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert ray_address(_params(*both)) is None  # a local Ray of the run's own
    assert cells_share_ray(_params(*both)) and grid_task_runner(_params(*both)).address is None

    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6390")  # eval "$(fedapt env)"
    run = _params(*both)
    assert run.runtime.ray_address is None  # the params stay as written
    assert ray_address(run) == "127.0.0.1:6390"
    assert grid_task_runner(run).address == "127.0.0.1:6390"
    settings = ray_settings(run, resolve_runtime(run))
    assert settings is not None and settings.address == "127.0.0.1:6390"
    assert not cells_share_ray(run) and grid_parallelism(run) is None  # a cluster's own size

    explicit = _params(*both, "runtime.ray_address=auto")  # always wins
    assert ray_address(explicit) == "auto" and grid_task_runner(explicit).address == "auto"
    assert ray_address(_params()) == "127.0.0.1:6390"  # only read by runs that use Ray


def test_a_ray_address_nothing_answers_at_is_one_line_never_a_local_ray(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from flows.cli import app

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{dead}")
    base = ["--params", str(REPO / "params.yaml"), "--set", f"data.root={REPO / 'data/raw'}"]
    base += ["--set", "storage.bucket=null", "--set", "runtime.tracking=false"]
    base += ["--set", f"experiment.reports_dir={tmp_path / 'reports'}"]
    for sets in (["runtime.clients=ray", "runtime.device=cpu"], ["runtime.task_runner=ray"]):
        args = [a for kv in sets for a in ("--set", kv)]
        res = CliRunner().invoke(app, ["run", *base, *args])
        text = res.output.strip()
        assert res.exit_code != 0 and "Traceback" not in text, text
        assert text.splitlines()[-1].startswith(
            f"fedapt: error: RAY_ADDRESS=127.0.0.1:{dead} (runtime.ray_address is null"
        ), text
        assert "fedapt up ray" in text
        assert not (tmp_path / "reports").exists() or not any(
            p.is_file() for p in (tmp_path / "reports").rglob("*")
        )


# ----------------------------------------------------------------------------- a real head

CONNECT = """
import ray
ray.init(configure_logging=False, log_to_driver=False)  # RAY_ADDRESS, from fedapt env
print("CPU", ray.cluster_resources().get("CPU", 0))
print("ANSWER", ray.get(ray.remote(lambda: 41 + 1).remote()))
ray.shutdown()
"""


def _ray_pids_of(temp: str, pgid: int) -> set[int]:
    rec = {"pid": pgid, "temp_dir": temp}
    return {p.pid for p in rayhead.ray_processes(rec)}


@pytest.mark.slow  # a real Ray head (8-10 s), as the other real-server tests
def test_up_ray_env_connect_down(sd, tmp_path):
    pids: set[int] = set()
    temp = ""
    pgid = 0
    home = tmp_path / "home"  # no Ray token yet: `fedapt up ray` has Ray make one
    home.mkdir()
    try:
        t = time.monotonic()
        res = _cli("up", "ray", sd=sd, FEDAPT_RAY_PORT="0", HOME=str(home))
        print(f"up ray: {time.monotonic() - t:.1f} s")
        assert res.returncode == 0, res.stdout + res.stderr
        rec = S.read_state(sd)["ray"]
        temp, pgid = rec["temp_dir"], rec["pid"]
        assert sorted(S.read_state(sd)) == ["ray"]  # nothing else was started
        token = (home / ".ray" / "auth_token").read_text().strip()
        assert token and token not in res.stdout + res.stderr
        assert token not in Path(rec["log"]).read_text()
        address = rec["address"]
        assert address.startswith("127.0.0.1:") and f"Ray head: {address}" in res.stdout

        st = S.status(["ray"], state=sd)["ray"]
        assert st.state == "running" and st.healthy and st.url == address
        res = _cli("status", sd=sd)
        assert res.returncode == 0 and address in res.stdout

        res = _cli("env", sd=sd)
        assert res.returncode == 0, res.stderr
        lines = res.stdout.splitlines()
        assert f"export RAY_ADDRESS={address}" in lines
        assert "export RAY_AUTH_MODE=token" in lines

        # a trivial job, in a process of its own, connects to the exported address
        script = f'eval "$({sys.executable} -m flows.cli env 2>/dev/null)"; '
        script += f'exec {sys.executable} -c "$1"'
        job = subprocess.run(
            ["bash", "-c", script, "job", CONNECT],
            cwd=REPO,
            env={
                **{k: v for k, v in os.environ.items() if not k.startswith("RAY_")},
                "FEDAPT_STATE_DIR": str(sd),
                "PYTHONPATH": str(REPO),
                "RAY_USAGE_STATS_ENABLED": "0",
                "HOME": str(home),
            },
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert job.returncode == 0, job.stdout + job.stderr
        assert "ANSWER 42" in job.stdout
        cpus = float(job.stdout.split("CPU", 1)[1].split()[0])
        assert cpus >= 1

        again = _cli("up", "ray", sd=sd, FEDAPT_RAY_PORT="0", HOME=str(home))  # idempotent
        assert again.returncode == 0 and S.read_state(sd)["ray"]["pid"] == pgid
        pids = _ray_pids_of(temp, pgid)
        assert pgid in pids and len(pids) >= 3  # ray start, the GCS, the raylet, ...
        names = " ".join(psutil.Process(p).name() for p in pids if psutil.pid_exists(p))
        assert "gcs_server" in names and "raylet" in names

        t = time.monotonic()
        res = _cli("down", "ray", sd=sd)
        print(f"down ray: {time.monotonic() - t:.1f} s")
        assert res.returncode == 0, res.stdout + res.stderr
        assert S.read_state(sd) == {}
        assert S.status(["ray"], state=sd)["ray"].state == "stopped"
        left = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]
        assert left == [], left
        assert _ray_pids_of(temp, pgid) == set()
        if not Path(temp).is_relative_to(sd):  # <tmp>/fedapt-ray-...: removed
            assert not Path(temp).exists()
        res = _cli("env", sd=sd, FEDAPT_ENV_VARS="RAY_ADDRESS RAY_AUTH_MODE")
        assert "unset RAY_ADDRESS" in res.stdout.splitlines()
        assert "ray" in res.stderr and "fedapt up ray" in res.stderr
    finally:
        if temp:  # whatever is left of this test's head, never another Ray
            rayhead.kill_stragglers({"pid": pgid, "temp_dir": temp})


@pytest.mark.slow  # a real Ray head (8-10 s), as the other real-server tests
def test_a_head_whose_ray_start_was_killed_is_stale_and_down_ends_the_rest(sd, tmp_path):
    """kill -9 of `ray start`: Ray's fate sharing ends the GCS and the raylet, not its agents;
    `fedapt status` says stale and `fedapt down ray` ends what is left (never by the dead
    process group's id, only by the head's session folder)."""
    temp = ""
    try:
        res = _cli("up", "ray", sd=sd, FEDAPT_RAY_PORT="0", HOME=str(tmp_path))
        assert res.returncode == 0, res.stdout + res.stderr
        rec = S.read_state(sd)["ray"]
        temp = rec["temp_dir"]
        os.kill(rec["pid"], 9)
        deadline = time.monotonic() + 30
        while S.status(["ray"], state=sd)["ray"].state != "stale":
            assert time.monotonic() < deadline, "the record never turned stale"
            time.sleep(0.2)
        res = _cli("down", "ray", sd=sd)
        assert res.returncode == 0, res.stdout + res.stderr
        assert S.read_state(sd) == {}
        assert rayhead.ray_processes({"pid": rec["pid"], "temp_dir": temp}, group=False) == []
    finally:
        if temp:
            rayhead.kill_stragglers({"pid": -1, "temp_dir": temp}, group=False)
