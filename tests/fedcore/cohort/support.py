"""What the cohort engine's tests share (tests/fedcore/cohort/, tests/fedcore/engine/,
tests/fedcore/test_codecs.py): float64 tiny models, ragged shards, a seeded two-round
federation on either engine and the comparison of two runs to 1e-9."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from torch import nn

from fedcore.algorithms import build_algorithm
from fedcore.client import LocalConfig
from fedcore.engine import FederationConfig, Simulation
from fedcore.schedules import LRSchedule
from models.adapters import ADAPTER_METHODS, adapt
from tests.helpers import Records, images64, tiny_adaptable, tiny_bert, tiny_vit

TOL = 1e-9


images = images64  # the toy images as float64 batches


def backbone(adapter: str) -> str:
    return "cnn" if ADAPTER_METHODS[adapter]().applies_to(tiny_adaptable()) is None else "vit"


class Model:
    """A picklable float64 model builder: backbone + adapter method (+ options)."""

    def __init__(self, adapter: str, options: dict | None = None, kind: str | None = None):
        self.adapter, self.options = adapter, options
        self.kind = kind or backbone(adapter)

    def __call__(self) -> nn.Module:
        base = {"cnn": tiny_adaptable, "vit": tiny_vit, "bert": tiny_bert}[self.kind]()
        return adapt(base, self.adapter, self.kind, self.options).double()


SHARDS = [(0, 30), (30, 100), (100, 105), (105, 250), (250, 400)]  # ragged: 5 to 150 samples


def simulate(
    engine: str,
    algorithm: str,
    adapter: str = "full",
    *,
    options: dict | None = None,
    kind: str | None = None,
    optimizer: str = "sgd",
    max_steps: int | None = None,
    data=None,
    test=None,
    noise: bool = True,
    cohort_size: int | None = None,
    rounds: int = 2,
    codecs=None,
    participation: int = 4,
    resume=None,
    stop_after: int | None = None,
    sims: list | None = None,
    privacy=None,
    sampling: str = "without_replacement",
):
    perm = np.random.default_rng(0).permutation(400)
    algo_options: dict[str, Any] = {"fednilo": {"K": 1, "F": 1}}.get(algorithm, {})
    records = Records()
    sim = Simulation(
        model_fn=Model(adapter, options, kind),
        algorithm=build_algorithm(algorithm, **algo_options),
        train=data or images(400, 0),
        test=test or images(100, 1),
        shards=[perm[a:b] for a, b in SHARDS],
        noise_var=[0.0, 0.1, 0.0, 0.2, 0.0] if noise else None,
        local=LocalConfig(
            batch_size=16,
            momentum=0.9 if optimizer == "sgd" else 0.0,
            weight_decay=5e-4,
            local_epochs=2,
            optimizer=optimizer,
            max_steps=max_steps,
        ),
        lr_schedule=LRSchedule(lr=0.05 if optimizer == "sgd" else 0.01),
        federation=FederationConfig(
            rounds=rounds,
            clients_per_round=participation,
            seed=1,
            stop_after=stop_after,
            sampling=sampling,
        ),
        workers=0,
        engine=engine,
        cohort_size=cohort_size,
        callbacks=[records],
        payload_keys=None if adapter == "full" else _payload(adapter, options, kind),
        trainable=None if adapter == "full" else _trainable(adapter, options, kind),
        codecs=codecs,
        privacy=privacy,
    )
    if resume is not None:
        sim.load_state_dict(resume)
    if sims is not None:
        sims.append(sim)
    history = sim.run()
    return sim.global_state, history, records.clients


def _payload(adapter, options, kind):
    model = Model(adapter, options, kind)()
    return ADAPTER_METHODS[adapter].from_options(options).payload_keys(model)


def _trainable(adapter, options, kind):
    model = Model(adapter, options, kind)()
    return ADAPTER_METHODS[adapter].from_options(options).trainable_keys(model)


def assert_same(a, b) -> None:
    (ga, ha, ca), (gb, hb, cb) = a, b
    assert list(ga) == list(gb)
    for k in ga:
        assert ga[k].dtype == gb[k].dtype, k
        diff = float((ga[k].double() - gb[k].double()).abs().max()) if ga[k].numel() else 0.0
        assert diff <= TOL, (k, diff)
    assert len(ha.rounds) == len(hb.rounds)
    for ra, rb in zip(ha.rounds, hb.rounds, strict=True):
        assert ra.clients == rb.clients
        assert (ra.download_bytes, ra.upload_bytes) == (rb.download_bytes, rb.upload_bytes)
        assert ra.train_loss == pytest.approx(rb.train_loss, abs=TOL)
        assert ra.accuracy == rb.accuracy
        assert ra.test_loss == pytest.approx(rb.test_loss, abs=TOL)
        assert {k: v for k, v in ra.extra.items()} == pytest.approx(rb.extra, abs=TOL)
    assert len(ca) == len(cb)
    for x, y in zip(ca, cb, strict=True):
        assert (x.round, x.client_id, x.num_samples, x.num_steps) == (
            y.round,
            y.client_id,
            y.num_samples,
            y.num_steps,
        )
        assert (x.download_bytes, x.upload_bytes, x.accepted) == (
            y.download_bytes,
            y.upload_bytes,
            y.accepted,
        )
        assert x.train_loss == pytest.approx(y.train_loss, abs=TOL)
