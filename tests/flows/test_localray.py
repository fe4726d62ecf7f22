"""A run's own local Ray is closed (``flows.localray``): each of its processes listens on
127.0.0.1 alone, and a client without its token is refused.

The Ray starts in a fresh process (``host``), the way a run starts it (``runtime.clients:
ray``: ``fedcore.engine.ray_cluster.connect``; ``runtime.task_runner: ray``: prefect-ray's
runner of ``flows.runners``), inside ``local_ray`` as ``fedapt run`` enters it: before Ray is
imported, or after (a process that imported Ray for something else). This process lists the
listening sockets of the host and its children (psutil), then two clients try to join:
one that knows nothing of tokens, one with a wrong token.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest

from fedcore.errors import ConfigError
from tests.flows.support import VARS, cpu_params

REPO = Path(__file__).resolve().parents[2]
LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}
REFUSED = "Authentication token is missing or incorrect"  # Ray's InvalidAuthToken

pytestmark = pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs ray")


_JOIN = """
import sys, ray
try:
    ray.init(address=sys.argv[1], configure_logging=False, log_to_driver=False)
except Exception as err:
    print("REFUSED", repr(err), repr(err.__cause__))
else:
    print("JOINED")
"""


def _listening(pid: int) -> list[tuple[str, str, int]]:
    """(process name, address, port) of every listening TCP socket of ``pid`` and of its
    children."""
    root = psutil.Process(pid)
    found = []
    for proc in [root, *root.children(recursive=True)]:
        try:
            name = proc.name()
            conns = proc.net_connections(kind="inet")
        except psutil.NoSuchProcess:
            continue
        found += [(name, *c.laddr) for c in conns if c.status == psutil.CONN_LISTEN]
    return found


def _own_addresses() -> list[str]:
    """This machine's IPv4 addresses other than loopback (those another machine reaches)."""
    return [
        a.address
        for addrs in psutil.net_if_addrs().values()
        for a in addrs
        if a.family == socket.AF_INET and not a.address.startswith("127.")
    ]


@pytest.fixture(scope="module")
def ray_home(tmp_path_factory) -> Path:
    """The HOME of the run's Ray: no token yet (``ensure_token`` makes one there)."""
    return tmp_path_factory.mktemp("ray-home")


@pytest.mark.slow  # about 30 s a case on 2 busy cores: a Ray start and two clients
@pytest.mark.parametrize(
    ("way", "ray_first"), [("clients", False), ("task_runner", False), ("clients", True)]
)
def test_a_runs_own_ray_listens_on_loopback_and_refuses_a_client_without_the_token(
    tmp_path, ray_home, way, ray_first
):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    # the session folder: short (Ray's socket paths), and not the /tmp/ray of other Rays
    temp = tempfile.mkdtemp(prefix="rl-")
    env.update(HOME=str(ray_home), PYTHONPATH=str(REPO), RAY_TMPDIR=temp)
    code = f"from tests.flows.support import host; host({way!r}, {ray_first})"
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        line = proc.stdout.readline()
        assert line, proc.communicate(timeout=60)
        started = json.loads(line)
        assert started["worker_auth"] == "token"
        sockets = _listening(proc.pid)
        open_ = [s for s in sockets if s[1] not in LOOPBACK]
        assert open_ == [], sockets
        names = {s[0] for s in sockets}
        assert {"gcs_server", "raylet"} <= names, sockets
        gcs_host, gcs_port = started["gcs"].rsplit(":", 1)
        assert gcs_host == "127.0.0.1", started
        assert any(n == "gcs_server" and p == int(gcs_port) for n, _, p in sockets), sockets
        token = ray_home / ".ray" / "auth_token"  # made for the run, as fedapt up ray does
        assert stat.S_IMODE(token.stat().st_mode) == 0o600

        # nothing answers at the machine's own addresses
        for addr in _own_addresses():
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection((addr, int(gcs_port)), timeout=5).close()
        # two clients on this machine, on 127.0.0.1 (Ray's single-machine mode, else Ray
        # itself resolves 127.0.0.1 to the machine's address): one that knows nothing of
        # tokens (none in its HOME), one with a wrong token; each refused by the GCS (one
        # attempt each: no retries)
        base = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        base.update(HOME=str(tmp_path), RAY_NUM_REDIS_GET_RETRIES="1")
        base["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
        guessed = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 32}
        joins = [
            subprocess.Popen(
                [sys.executable, "-c", _JOIN, started["gcs"]],
                cwd=tmp_path,
                env={**base, **extra},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for extra in ({}, guessed)
        ]
        for join in joins:
            out, _ = join.communicate(timeout=180)
            assert "JOINED" not in out and "REFUSED" in out, out
            assert REFUSED in out, out
        proc.stdin.write("\n")
        proc.stdin.flush()
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert json.loads(out.strip().splitlines()[-1]) == dict.fromkeys(VARS)  # restored
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        shutil.rmtree(temp, ignore_errors=True)


def test_local_ray_is_only_for_a_runs_own_ray(monkeypatch):
    """Where the run starts no Ray of its own (no Ray, or a cluster's address), the
    environment stays as it is and RAY_AUTH_MODE is the user's; where it does, a
    RAY_AUTH_MODE other than token is refused (tests/flows/cli/test_environment.py: the CLI's line)."""
    from flows.localray import local_ray
    from tasks.training.runtime import check_local_ray, starts_local_ray

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    cluster = ["runtime.clients=ray", "runtime.ray_address=127.0.0.1:1"]
    for sets, starts in (
        ([], False),
        (["runtime.task_runner=dask"], False),
        (cluster, False),
        (["runtime.task_runner=ray", "runtime.ray_address=auto"], False),
        (["runtime.clients=ray"], True),
        (["runtime.task_runner=ray"], True),
        (["runtime.task_runner=dask", "runtime.clients=ray"], True),
    ):
        p = cpu_params(*sets)
        assert starts_local_ray(p) is starts, sets
        if starts:
            with pytest.raises(ConfigError, match="^RAY_AUTH_MODE: 'disabled' is not token"):
                check_local_ray(p)
            for ok in ("token", "TOKEN"):
                check_local_ray(p, {"RAY_AUTH_MODE": ok})
            check_local_ray(p, {})
            continue
        check_local_ray(p)
        with local_ray(p):
            assert os.environ["RAY_AUTH_MODE"] == "disabled"
            assert "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER" not in os.environ
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")  # fedapt env's head: not the run's own
    assert not starts_local_ray(cpu_params("runtime.clients=ray"))
