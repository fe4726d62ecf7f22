"""Every registered algorithm: runs end to end, validates its options, pickles cleanly."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from fedcore.algorithms import ALGORITHMS, algorithm_options, build_algorithm, list_algorithms
from fedcore.errors import ConfigError
from tests.helpers import make_sim, tiny_layered

SHARDS = [np.arange(0, 60), np.arange(60, 200), np.arange(200, 400)]


@pytest.mark.parametrize("name", list_algorithms())
def test_two_rounds_finite(name):
    algo = build_algorithm(name)
    sim = make_sim(SHARDS, rounds=2, algorithm=algo, model_fn=tiny_layered)
    hist = sim.run()
    assert [r.round for r in hist.rounds] == [1, 2]
    assert all(torch.isfinite(v.float()).all() for v in sim.global_state.values())
    for r in hist.rounds:
        assert r.rejected == 0 and np.isfinite(r.train_loss) and np.isfinite(r.test_loss)
        assert r.upload_bytes > 0 and r.download_bytes > 0
        assert all(isinstance(v, float) and np.isfinite(v) for v in r.extra.values())
        assert r.to_dict()["extra"] == r.extra


@pytest.mark.parametrize("name", list_algorithms())
def test_registry_names_and_pickling(name):
    algo = build_algorithm(name)
    assert ALGORITHMS[name].name == name
    assert pickle.loads(pickle.dumps(algo)) == algo  # what the worker processes receive
    assert "_server" not in algorithm_options(name)


BAD_OPTIONS = [
    ("fedavg", {"mu": 0.1}, "mu"),
    ("fedprox", {"mu": -0.1}, "mu"),
    ("fedavgm", {"server_lr": 0.0}, "server_lr"),
    ("fedavgm", {"momentum": 1.0}, "momentum"),
    ("fedadagrad", {"beta2": 0.9}, "beta2"),  # Adagrad has no beta2
    ("fedadam", {"beta1": -0.1}, "beta1"),
    ("fedadam", {"beta2": 1.0}, "beta2"),
    ("fedyogi", {"server_lr": -1.0}, "server_lr"),
    ("fedyogi", {"tau": 0.0}, "tau"),
    ("fednova", {"momentum": 0.9}, "momentum"),  # FedNova reads it from the clients' config
    ("fedir", {"mu": 0.1}, "mu"),
    ("fedvc", {"n_vc": 0}, "n_vc"),
    ("fedvc", {"n_vc": 2.5}, "n_vc"),
    ("fednilo", {"K": -1}, "K"),
    ("fednilo", {"F": 0}, "F"),
    ("fednilo", {"comm_budget_cr": 0}, "comm_budget_cr"),
    ("fednilo", {"k": 3}, "k"),
]


@pytest.mark.parametrize(("name", "options", "key"), BAD_OPTIONS)
def test_bad_options_are_one_line_config_errors(name, options, key):
    with pytest.raises(ConfigError, match=key) as err:
        build_algorithm(name, **options)
    assert "\n" not in str(err.value)


# scaffold: c_k is kept in the main process and travels with the job (ClientTask.private)
DETERMINISM = {"fedir": {}, "fedvc": {"n_vc": 50}, "fednilo": {"K": 1, "F": 1}, "scaffold": {}}


@pytest.mark.parametrize("name", sorted(DETERMINISM))
def test_same_numbers_with_0_or_2_workers(name):
    """Plans (samples, messages, key sets) are built in the main process, so worker
    processes see hyper-parameters only and reproduce the in-process run exactly."""
    runs = []
    for workers in (0, 2):
        sim = make_sim(
            SHARDS,
            model_fn=tiny_layered,
            rounds=3,
            m=2,
            workers=workers,
            algorithm=build_algorithm(name, **DETERMINISM[name]),
        )
        hist = sim.run()
        runs.append((sim.global_state, [r.to_dict() for r in hist.rounds]))
    (a, ra), (b, rb) = runs
    for k in a:
        assert torch.equal(a[k], b[k]), k
    strip = [{k: v for k, v in r.items() if k != "seconds"} for r in ra]
    assert strip == [{k: v for k, v in r.items() if k != "seconds"} for r in rb]
