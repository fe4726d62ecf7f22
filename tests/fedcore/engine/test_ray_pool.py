"""``runtime.clients: ray``: a cell's clients train on Ray actors (fedcore.engine.ray_pool).

On a float64 tiny model the Ray actors give the bytes of the local pool and of the sequential
reference: metrics, the final model and every client's upload, with 1 and 2 actors, dropout
and partial stragglers included. The global state goes into the object store once per round.
An actor that dies costs a retry on a restarted actor, then the client (counted as crashed).
One local Ray of 2 CPUs on 127.0.0.1 serves the module, in its own temp dir, shut down after.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fedcore.engine import RayBackend, RaySettings
from fedcore.errors import ConfigError
from tests.fedcore.engine.support import CrashingFedAvg, make_sim, run_bytes, tiny64
from tests.helpers import Records

ray = pytest.importorskip("ray")

REPO = Path(__file__).resolve().parents[3]


def test_ray_actors_give_the_bytes_of_the_local_pool(local_ray):
    fed = {"dropout": 0.3, "deadline_steps": 3, "speed_spread": 0.8, "stragglers": "partial"}
    seq = run_bytes(make_sim(workers=0, **fed))
    pool = run_bytes(make_sim(workers=2, **fed))
    assert seq["model"] == pool["model"] and seq == pool
    statuses = {c[-1] for c in seq["clients"]}
    assert {"reported", "dropped", "partial"} <= statuses, statuses  # the draws happened
    for actors in (1, 2):
        sim = make_sim(actors=actors, **fed)
        assert isinstance(sim.backend, RayBackend)
        got = run_bytes(sim)
        assert got["metrics"] == seq["metrics"], actors
        assert got["model"] == seq["model"], actors
        assert got["clients"] == seq["clients"] and got["uploads"] == seq["uploads"], actors
        # the round's download and the evaluated state: one object each in the object store
        assert sim.backend.puts == [1, 1, 1, 1], sim.backend.puts
        trained = [cid for cid, _ in got["uploads"]]
        assert [cid for cid, _ in sim.backend.placements] == trained  # job order
        assert len({node for _, node in sim.backend.placements}) == 1  # one local node
        assert not sim.backend.actors  # killed at the end of the run


def test_an_actor_that_dies_once_costs_a_retry_not_the_run(local_ray, tmp_path, capfd):
    algo = CrashingFedAvg(victim_samples=48, marker=str(tmp_path / "crashed"))
    sim = make_sim(actors=2, rounds=1, m=5, algorithm=algo)
    got = run_bytes(sim)
    ref = run_bytes(make_sim(workers=0, rounds=1, m=5))
    assert (tmp_path / "crashed").exists()
    err = capfd.readouterr().err
    assert "a Ray actor died; 1 client job(s) lost, each retried once" in err
    assert got == ref  # the retry gives the same bytes


def test_an_actor_that_keeps_dying_drops_its_client(local_ray, capfd):
    sim = make_sim(actors=2, rounds=1, m=5, algorithm=CrashingFedAvg(victim_samples=48))
    got = run_bytes(sim)
    err = capfd.readouterr().err
    assert "fedapt: client 2 dropped: its Ray actor died again on the retry" in err
    metrics = json.loads(got["metrics"])
    r = metrics["rounds"][0]
    assert r["dropped"] == [2] and r["extra"]["clients_crashed"] == 1.0
    victim = next(c for c in got["clients"] if c[1] == 2)
    assert victim[-1] == "crashed" and victim[6] == 0
    assert [cid for cid, _ in got["uploads"]] == [c[1] for c in got["clients"] if c[1] != 2]
    assert r["accuracy"] is not None and np.isfinite(r["train_loss"])


class ActorCannotImport:
    """A model builder that fails in a Ray actor as a node without fedapt would."""

    def __call__(self) -> torch.nn.Module:
        if ray.get_runtime_context().get_actor_id() is not None:
            import fedapt_is_not_installed_here  # noqa: F401
        return tiny64()


def test_bad_clusters_are_one_line_before_training(local_ray):
    """GPUs asked of a CPU-only cluster; an actor that cannot start (cannot import fedapt)."""
    sim = make_sim(actors=1)
    sim.ray = RaySettings(actors=1, actor_gpus=1.0)
    sim.backend = sim._backend(sim.backend.work)
    with pytest.raises(ConfigError, match=r"^runtime.ray_actor_gpus: 1 GPU per client actor ask"):
        sim.run()
    sim = make_sim(actors=1)
    sim.backend = RayBackend(
        dataclasses.replace(sim.backend.work, model_fn=ActorCannotImport()), sim.ray, 4
    )
    with pytest.raises(ConfigError) as info:
        sim.run()
    msg = str(info.value)
    assert msg.startswith("runtime.clients: ray: a client actor could not start on local Ray")
    assert "fedapt_is_not_installed_here" in msg and "\n" not in msg, msg
    assert not sim.backend.actors and ray.is_initialized()  # killed; the module's Ray stays


def test_fedcore_imports_without_ray():
    code = "import sys; sys.modules['ray'] = None; import fedcore.engine, fedcore.engine.ray_pool"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_where_the_clients_train_is_no_part_of_a_runs_fingerprint():
    """runtime.clients and runtime.ray_* place the clients, never change their bytes: a run
    checkpointed with local workers resumes on Ray actors and the other way round."""
    from tasks.config import load_params
    from tasks.training.checkpoint import fingerprint

    local = load_params(REPO / "params.yaml", [])
    on_ray = load_params(
        REPO / "params.yaml",
        ["runtime.clients=ray", "runtime.ray_actors=3", "runtime.ray_actor_gpus=0.5"],
    )
    assert on_ray.runtime.clients == "ray" and on_ray.runtime.ray_actors == 3
    from tests.helpers import spec_cell

    same = fingerprint(spec_cell(local, "fedavg", "full"), "h")
    assert same == fingerprint(spec_cell(on_ray, "fedavg", "full"), "h")


def test_the_node_of_each_client_is_recorded_per_round(local_ray):
    from fedcore.engine.ray_pool import ClientNodes

    sim = make_sim(actors=2, dropout=0.3)
    assert isinstance(sim.backend, RayBackend)
    nodes = ClientNodes(sim.backend)
    rec = Records()
    sim.callbacks += [nodes, rec]
    sim.run()
    trained = [[c.round, c.client_id] for c in rec.clients if c.status != "dropped"]
    out = nodes.to_dict()
    assert [row[:2] for row in out["clients"]] == trained  # per round, in task order
    assert {row[2] for row in out["clients"]} == set(out["nodes"])
    assert len(out["nodes"]) == 1 and "?" not in out["nodes"].values()  # the local node
    json.dumps(out)  # written into timing.json as it is
