"""``runtime.clients: ray`` on a Ray cluster of two nodes, both on this machine (127.0.0.1):
a head of 1 CPU and a second node of 1 CPU (resource ``node2``) started by ``ray start``; the
two client actors land one on each node (as the recorded node of each client says), and the
run's bytes are the local run's. Every Ray process of the cluster (found by its temp dir) is
ended after, whatever happened."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

RAY = str(Path(sys.executable).with_name("ray"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cluster_pids(temp: str) -> list[int]:
    """This user's processes that name ``temp`` (the cluster's temp dir) on their command
    line or hold a file under it open (Ray's agents rename themselves: ``ray::...``)."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            if d.stat().st_uid != os.getuid():
                continue
            if temp in (d / "cmdline").read_text(errors="ignore") or any(
                temp in os.readlink(fd) for fd in (d / "fd").iterdir()
            ):
                pids.append(int(d.name))
        except OSError:
            continue
    return pids


def end_cluster(temp: str) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in cluster_pids(temp):
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.monotonic() + 10
        while cluster_pids(temp) and time.monotonic() < deadline:
            time.sleep(0.2)
    shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture
def two_nodes():
    """The head's address; both nodes ended after. Without token authentication (a head
    turns it on where it finds a token in ~/.ray; an explicit address never sends one)."""
    temp = f"/tmp/rmn-{uuid.uuid4().hex[:8]}"
    port = free_port()
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    common = ["--num-cpus", "1", "--num-gpus", "0", "--node-ip-address", "127.0.0.1"]
    common += ["--temp-dir", temp, "--disable-usage-stats"]
    try:
        head = [RAY, "start", "--head", "--port", str(port), "--include-dashboard", "false"]
        done = subprocess.run(
            [*head, *common], env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stdout + done.stderr
        second = [RAY, "start", "--address", f"127.0.0.1:{port}", "--resources", '{"node2": 1}']
        done = subprocess.run(
            [*second, *common], env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stdout + done.stderr
        yield f"127.0.0.1:{port}"
    finally:
        if ray.is_initialized():
            ray.shutdown()
        end_cluster(temp)


# The driver runs in a fresh interpreter: a process that used another Ray session before
# (this suite's local Ray, Prefect's Ray runner) leaves state behind that cancels the actors'
# creation on the new cluster (ActorDiedError, "never ran"); a user's driver starts fresh.
DRIVER = r"""
import hashlib, json, sys, time
import ray
from fedcore.engine import RayBackend, RaySettings
from fedcore.engine.ray_pool import ClientNodes
from tests.fedcore.engine.support import make_sim, run_bytes

address = sys.argv[1]
ref = run_bytes(make_sim(workers=0, dropout=0.3))
ray.init(address=address, _node_ip_address="127.0.0.1", configure_logging=False)
deadline = time.monotonic() + 60
while len([n for n in ray.nodes() if n["Alive"]]) < 2 and time.monotonic() < deadline:
    time.sleep(0.5)
nodes = {n["NodeID"]: n["Resources"] for n in ray.nodes() if n["Alive"]}
sim = make_sim(actors=2, dropout=0.3)
sim.ray = RaySettings(address=address, actors=2)
sim.backend = sim._backend(sim.backend.work)
assert isinstance(sim.backend, RayBackend)
recorded = ClientNodes(sim.backend)
sim.callbacks.append(recorded)
got = run_bytes(sim)
digest = lambda r: {k: hashlib.sha256(repr(v).encode()).hexdigest() for k, v in r.items()}
print("RESULT " + json.dumps({
    "nodes": nodes,
    "used": sorted({node for _, node in sim.backend.placements}),
    "recorded": recorded.to_dict(),
    "ref": digest(ref),
    "got": digest(got),
    "round_clients": len(json.loads(got["metrics"])["rounds"][0]["clients"]),
}))
ray.shutdown()
"""


@pytest.mark.slow
def test_clients_on_two_nodes_give_the_local_bytes(two_nodes):
    repo = Path(__file__).resolve().parents[3]
    res = subprocess.run(
        [sys.executable, "-c", DRIVER, two_nodes],
        cwd=repo,
        env={**os.environ, "PYTHONPATH": str(repo), "RAY_AUTH_MODE": "disabled"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("RESULT ")]
    assert res.returncode == 0 and lines, res.stdout[-3000:] + res.stderr[-3000:]
    out = json.loads(lines[-1].removeprefix("RESULT "))
    nodes = out["nodes"]
    assert len(nodes) == 2, nodes
    assert set(out["used"]) == set(nodes), (out["used"], nodes)  # a client job on each node
    assert any("node2" in nodes[n] for n in out["used"])
    # what a cell writes into timing.json (ClientNodes): every trained client's node, per
    # round, and both nodes among them
    recorded = out["recorded"]
    assert set(recorded["nodes"]) == set(nodes), recorded
    assert "?" not in recorded["nodes"].values()  # each node's address
    assert {row[0] for row in recorded["clients"]} == {1, 2}, recorded  # both rounds
    assert out["got"] == out["ref"]  # metrics, final model, client records, upload bytes
    assert out["round_clients"]
