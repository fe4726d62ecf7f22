"""SeaweedFS's files live under the state folder and go when it stops: its log files, its
TMPDIR and the S3 gateway's socket in ``<state>/run/s3-<port>/``, and the sockets it creates
at paths it hardcodes in /tmp (named after its ports) are removed once it has stopped - for
the embedded S3 of a run (stopped by the run, or by its watchdog after kill -9) and for the
``s3`` service of ``fedapt up`` / ``fedapt down``."""

from __future__ import annotations

import contextlib
import glob
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flows import services as S
from flows.services import process
from flows.services.s3 import weed_leftovers

REPO = Path(__file__).resolve().parents[3]


def test_leftovers_name_the_scratch_folder_and_the_sockets_of_every_port():
    cmd = ["weed", "-logdir=/st/run/s3-9000", "mini", "-s3.port=9000", "-s3.port.grpc=9001",
           "-master.port.grpc=9002", "-volume.port.grpc=9003", "-filer.port=9004",
           "-filer.port.grpc=9005", "-admin.port=9006", "-master.port=9007"]  # fmt: skip
    assert weed_leftovers(cmd) == [
        "/st/run/s3-9000",
        "/tmp/seaweedfs-s3-9000.sock",
        "/tmp/seaweedfs-s3-grpc-9001.sock",
        "/tmp/seaweedfs-master-grpc-9002.sock",
        "/tmp/seaweedfs-volume-grpc-9003.sock",
        "/tmp/seaweedfs-filer-9004.sock",
        "/tmp/seaweedfs-filer-grpc-9005.sock",
        "/tmp/seaweedfs-admin-grpc-19006.sock",
    ]


def test_sweep_removes_a_dead_servers_files_but_no_live_socket(tmp_path):
    """What a server killed without cleaning up left (its watchdog SIGKILLed): removed at the
    next start, except a socket some process listens on (its port is someone else's now), and
    nothing while a server holds the data folder."""
    import fcntl
    import json
    import socket

    from flows.services.s3 import data_lock_path, sweep_scratch

    sd = tmp_path / "state"
    scratch = sd / "run" / "s3-1"
    scratch.mkdir(parents=True)
    dead, live = Path("/tmp/seaweedfs-s3-0.sock"), Path("/tmp/seaweedfs-filer-1.sock")
    (scratch / "leftovers.json").write_text(json.dumps([str(scratch), str(dead), str(live)]))
    listener = socket.socket(socket.AF_UNIX)
    try:
        dead.write_bytes(b"")
        live.unlink(missing_ok=True)
        listener.bind(str(live))
        listener.listen(1)
        fd = os.open(data_lock_path(sd), os.O_RDWR | os.O_CREAT)
        fcntl.flock(fd, fcntl.LOCK_EX)  # a server holds the data folder
        sweep_scratch(sd)
        assert scratch.exists() and dead.exists()
        os.close(fd)
        sweep_scratch(sd)
        assert not scratch.exists() and not dead.exists()
        assert live.exists()
    finally:
        listener.close()
        dead.unlink(missing_ok=True)
        live.unlink(missing_ok=True)


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    """The test's TMPDIR (inherited by the servers unless fedapt sets theirs), and no S3 of
    the user's."""
    tmp = tmp_path / "systmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    for var in S.USER_S3_VARS:
        monkeypatch.delenv(var, raising=False)
    return tmp


def _cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


def _ports(cmd: list[str]) -> set[int]:
    return {int(m) for arg in cmd for m in re.findall(r"=(\d{2,5})$", arg)}


T0 = time.time()


def _in_system_tmp(ports: set[int]) -> list[str]:
    """SeaweedFS sockets in /tmp named after one of ``ports`` and made while these tests ran
    (other programs' are ignored: a port may be one an older server used)."""
    found = []
    for f in glob.glob("/tmp/seaweedfs-*.sock"):
        with contextlib.suppress(FileNotFoundError):
            if any(f.endswith(f"-{p}.sock") for p in ports) and os.lstat(f).st_mtime >= T0 - 1:
                found.append(f)
    return found


def _check_running(sd: Path, pid: int) -> tuple[Path, set[int]]:
    cmd = _cmdline(pid)
    (logdir,) = [a.split("=", 1)[1] for a in cmd if a.startswith("-logdir=")]
    scratch = Path(logdir)
    assert scratch.parent == sd / "run", scratch
    deadline = time.monotonic() + 20
    while not (scratch / "s3.sock").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    names = os.listdir(scratch)
    assert "s3.sock" in names and any(n.startswith("weed.") for n in names), names
    return scratch, _ports(cmd)


def _check_gone(scratch: Path, ports: set[int], tmp: Path) -> None:
    assert not scratch.exists()
    assert _in_system_tmp(ports) == []
    assert os.listdir(tmp) == []  # nothing went to the TMPDIR of the process that started it


@pytest.mark.slow
def test_embedded_s3_keeps_its_files_in_the_state_folder_and_removes_them(tmp_path, private_tmp):
    sd = tmp_path / "state"
    pid = None
    try:
        with S.embedded_s3(sd) as s3:
            pid = s3.pid
            assert s3.pid is not None
            scratch, ports = _check_running(sd, s3.pid)
            S.s3_client(s3.endpoint).put_object(Bucket=S.DEFAULT_BUCKET, Key="k", Body=b"x")
        _check_gone(scratch, ports, private_tmp)
    finally:
        if pid and process.group_alive(pid):
            process.signal_group(pid, signal.SIGKILL)


@pytest.mark.slow
def test_the_watchdog_removes_them_after_kill_9_of_the_run(tmp_path, private_tmp):
    sd = tmp_path / "state"
    code = (
        "import sys, time\nfrom flows import services as S\n"
        f"with S.embedded_s3({str(sd)!r}) as s3:\n"
        "    print(s3.pid, flush=True)\n    time.sleep(120)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, env=env, text=True)
    pid = None
    try:
        assert run.stdout is not None
        pid = int(run.stdout.readline())
        scratch, ports = _check_running(sd, pid)
        run.kill()
        run.wait()
        deadline = time.monotonic() + 30
        while process.group_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not process.group_alive(pid)
        _check_gone(scratch, ports, private_tmp)
    finally:
        run.kill()
        if pid and process.group_alive(pid):
            process.signal_group(pid, signal.SIGKILL)


@pytest.mark.slow
def test_the_s3_service_removes_them_on_down(tmp_path, private_tmp):
    sd = tmp_path / "state"
    try:
        S.up(["s3"], state=sd, ports={"s3": 0})
        pid = S.read_state(sd)["s3"]["pid"]
        scratch, ports = _check_running(sd, pid)
    finally:
        S.down(state=sd)
    _check_gone(scratch, ports, private_tmp)
