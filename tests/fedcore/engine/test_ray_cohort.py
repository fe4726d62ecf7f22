"""``runtime.engine: cohort`` with ``runtime.clients: ray``: each Ray actor trains a
contiguous slice of the round's clients as a cohort (fedcore.engine.ray_pool.RayCohortBackend).

On the float64 tiny model of ``tests/fedcore/engine/support.py`` the Ray cohorts give the bytes of
the local cohort engine cut into the same cohorts: metrics, the final model, every client's
record and upload (one slice per actor: the local engine with ``cohort_size`` the slice's
size; ``cohort_size`` set: the same bytes with 1 and 2 actors, dropout and partial stragglers
included). Cutting a cohort in two changes the last bits (measured here: the final models of
one cohort of 4 and two of 2 differ, within the cohort engine's 1e-9 of the sequential
reference). A lost slice is retried once on a restarted actor; lost again, its clients are
counted as crashed. The module's local Ray: ``local_ray`` of ``tests/fedcore/engine/conftest.py``.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from fedcore import payload
from fedcore.codecs import Codecs, make_codec
from fedcore.engine import RayCohortBackend, Simulation
from tests.fedcore.engine.support import CrashingFedAvg, make_sim, run_bytes

pytest.importorskip("ray")

FED = {"dropout": 0.3, "deadline_steps": 3, "speed_spread": 0.8, "stragglers": "partial"}


def cohort_sim(**kw):
    """``make_sim`` of the cohort engine (on Ray actors where ``actors`` is given)."""
    return make_sim(engine="cohort", **kw)


def own_host_tensors(sim: Simulation) -> list[int]:
    """Spy on the backend: every upload that comes back from an actor is a row of a stack
    of host tensors holding their own storage (not views of the actor's buffers); returns
    the number of distinct stacks per round (filled as the run goes)."""
    stacks: list[int] = []
    train = sim.backend.train

    def spy(*args, **kw):
        results = train(*args, **kw)
        seen = {id(r.upload.stack): r.upload.stack for r in results if r is not None}
        for stack in seen.values():
            for t in stack.values():
                assert t.device.type == "cpu"
                assert t.untyped_storage().nbytes() == t.numel() * t.element_size()
        stacks.append(len(seen))
        return results

    sim.backend.train = spy  # type: ignore[method-assign]
    return stacks


def ray_cohort_bytes(actors: int, cohort_size: int | None, **fed) -> dict:
    sim = cohort_sim(actors=actors, cohort_size=cohort_size, **fed)
    assert isinstance(sim.backend, RayCohortBackend) and not sim.backend.encodes
    stacks = own_host_tensors(sim)
    got = run_bytes(sim)
    # the round's global state and the evaluated state: one object each in the object store
    assert sim.backend.puts == [1, 1, 1, 1], sim.backend.puts
    trained = [cid for cid, _ in got["uploads"]]
    assert [cid for cid, _ in sim.backend.placements] == trained  # task order
    assert len(stacks) == 2 and min(stacks) >= 1  # rows of stacks, not one copy per client
    assert not sim.backend.actors  # killed at the end of the run
    return got


def max_model_diff(a: dict, b: dict) -> float:
    ga, gb = payload.decode(a["model"]), payload.decode(b["model"])
    return max(float((ga[k].double() - gb[k].double()).abs().max()) for k in ga)


def test_one_slice_per_actor_gives_the_bytes_of_the_same_local_cohorts(local_ray):
    """1 actor: the local cohort engine's one cohort; 2 actors: its cohorts of 2
    (``cohort_size: 2``, the same split). Splitting a cohort changes the last bits (float64
    sums in another order), within the cohort engine's tolerance of the whole cohort."""
    whole = run_bytes(cohort_sim())
    halves = run_bytes(cohort_sim(cohort_size=2))
    assert ray_cohort_bytes(1, None) == whole
    assert ray_cohort_bytes(2, None) == halves
    assert max_model_diff(whole, halves) <= 1e-9


def test_cohort_size_slices_give_the_same_bytes_whatever_the_actor_count(local_ray):
    """Dropout and partial stragglers: the local cohort engine's bytes with ``cohort_size``
    2, on 1 actor and on 2."""
    ref = run_bytes(cohort_sim(cohort_size=2, **FED))
    assert {c[-1] for c in ref["clients"]} >= {"reported", "dropped", "partial"}
    for actors in (1, 2):
        assert ray_cohort_bytes(actors, 2, **FED) == ref, actors


@pytest.mark.slow  # two codecs x two engines on Ray (~40 s); the codecs' engines: test_codecs
@pytest.mark.parametrize(("name", "options"), [("topk", {"fraction": 0.05}), ("int8", {})])
def test_update_codecs_through_ray_cohorts_give_the_local_cohort_bytes(local_ray, name, options):
    """Top-k with error feedback (each client's memory comes back from its actor, kept by
    the server for its next round) and int8 both ways with seeded stochastic rounding (the
    clients start from the decoded download, put once per round): the local cohort engine's
    bytes, with the same cohorts."""
    c = Codecs.of(make_codec(name, options))
    ref_sim = cohort_sim(cohort_size=2, codecs=c, rounds=3, m=5)
    ref = run_bytes(ref_sim)
    sim = cohort_sim(actors=2, cohort_size=2, codecs=c, rounds=3, m=5)
    got = run_bytes(sim)
    assert {k: got[k] for k in ("metrics", "model", "clients")} == {
        k: ref[k] for k in ("metrics", "model", "clients")
    }
    # each upload's tensors (the local engine's may be views of larger storages, which the
    # encoding keeps whole: the actors send compact copies)
    assert [(cid, same_values(a, b)) for (cid, a), (_, b) in zip(got["uploads"], ref["uploads"],
                                                                  strict=True)] == [
        (cid, True) for cid, _ in ref["uploads"]
    ]  # fmt: skip
    assert sim.codec_memory.keys() == ref_sim.codec_memory.keys()
    for cid, mem in ref_sim.codec_memory.items():
        assert {k: v.tolist() for k, v in sim.codec_memory[cid].items()} == {
            k: v.tolist() for k, v in mem.items()
        }
    if c.download is not None:  # the download's start state: one more object per round
        assert sim.backend.puts[0] == 2, sim.backend.puts


def same_values(a: bytes, b: bytes) -> bool:
    x, y = payload.decode(a), payload.decode(b)
    return list(x) == list(y) and all(torch.equal(x[k], y[k]) for k in x)


def test_ray_cohorts_equal_the_sequential_reference_within_the_cohort_tolerance(local_ray):
    seq = make_sim(workers=0, **FED)
    seq.run()
    sim = cohort_sim(actors=2, **FED)
    sim.run()
    for k, v in seq.global_state.items():
        assert float((v.double() - sim.global_state[k].double()).abs().max()) <= 1e-9, k


def test_a_slice_lost_once_costs_a_retry_not_the_run(local_ray, tmp_path, capfd):
    algo = CrashingFedAvg(victim_samples=48, marker=str(tmp_path / "crashed"))
    got = run_bytes(cohort_sim(actors=2, rounds=1, m=5, cohort_size=3, algorithm=algo))
    ref = run_bytes(cohort_sim(rounds=1, m=5, cohort_size=3))
    assert (tmp_path / "crashed").exists()
    err = capfd.readouterr().err
    assert "a Ray actor died; 1 cohort job(s) lost, each retried once" in err
    assert got == ref  # the retry gives the same bytes


@pytest.mark.parametrize("cohort_size", [1, None])
def test_a_slice_that_keeps_dying_drops_its_clients(local_ray, capfd, cohort_size):
    """``cohort_size`` 1: each client its own slice, the victim alone is dropped (as on the
    wire path); one slice per actor: the victim's slice is."""
    sim = cohort_sim(
        actors=2,
        rounds=1,
        m=5,
        cohort_size=cohort_size,
        algorithm=CrashingFedAvg(victim_samples=48),
    )
    got = run_bytes(sim)
    err = capfd.readouterr().err
    r = json.loads(got["metrics"])["rounds"][0]
    order = list(r["clients"])  # sampling order
    cuts = sim.backend.slices(len(order), 2)
    victim = next(order[s] for s in cuts if 2 in order[s])
    if cohort_size == 1:
        assert victim == [2]
        assert "fedapt: client 2 dropped: its Ray actor died again on the retry" in err
    else:
        assert len(victim) in (2, 3)  # 5 clients on 2 actors: slices of 3 and 2
        names = ", ".join(map(str, victim))
        assert f"fedapt: clients {names} dropped: their Ray actor died again on the retry" in err
    assert sorted(r["dropped"]) == sorted(victim)
    assert r["extra"]["clients_crashed"] == float(len(victim))
    lost = [c for c in got["clients"] if c[1] in victim]
    assert all(c[-1] == "crashed" and c[6] == 0 for c in lost)
    assert [cid for cid, _ in got["uploads"]] == [c for c in order if c not in victim]
    assert r["accuracy"] is not None and np.isfinite(r["train_loss"])


def test_the_slices_follow_cohort_size_else_the_actor_count():
    backend = cohort_sim(actors=3, cohort_size=2).backend
    assert isinstance(backend, RayCohortBackend)
    for actors in (1, 3, 8):
        assert backend.slices(5, actors) == [slice(0, 2), slice(2, 4), slice(4, 5)]
    backend.cohort_size = None
    assert backend.slices(5, 3) == [slice(0, 2), slice(2, 4), slice(4, 5)]
    assert backend.slices(5, 2) == [slice(0, 3), slice(3, 5)]
    assert backend.slices(2, 3) == [slice(0, 1), slice(1, 2)]
    assert backend.slices(4, 1) == [slice(0, 4)]


def test_uploads_are_materialised_once_per_stack():
    from fedcore.engine.ray_actors import materialised
    from fedcore.jobs import ClientResult

    big = torch.arange(24, dtype=torch.float64).reshape(2, 3, 4)
    stack = {"w": big[:, :2]}  # a view of a larger buffer
    rows = [
        ClientResult(i, payload.Row(stack, i), 10, 1, 1, 0.5, 0.0, True)  # type: ignore[arg-type]
        for i in range(2)
    ]
    out = materialised([rows[0], None, rows[1]])
    assert out[1] is None
    a, b = out[0], out[2]
    assert a is not None and b is not None
    assert a.upload.stack is b.upload.stack is not stack  # one copy per stack
    assert torch.equal(a.upload["w"], big[0, :2]) and torch.equal(b.upload["w"], big[1, :2])
    t = a.upload.stack["w"]
    assert t.untyped_storage().nbytes() == t.numel() * t.element_size()
