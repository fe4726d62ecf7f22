"""What the engine's tests share (test_dropout, test_ray_pool, test_ray_cohort,
test_ray_multinode): a FedAvg whose chosen client kills its worker, and the float64 tiny
federation whose bytes the local and Ray backends must give alike. Worker processes and Ray
actors import these by name."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedcore import payload
from fedcore.algorithms import FedAvg
from fedcore.algorithms.base import ClientView
from fedcore.client import LocalConfig, cross_entropy
from fedcore.engine import FederationConfig, RaySettings, Simulation
from fedcore.schedules import LRSchedule
from tests.helpers import Records, images64, tiny_cnn


@dataclass(frozen=True)
class CrashingFedAvg(FedAvg):
    """FedAvg whose client with ``victim_samples`` samples kills its worker process: once
    (when ``marker`` does not exist yet; it is created) or every time (``marker`` empty)."""

    victim_samples: int = -1
    marker: str = ""

    def client_objective(self, global_state, client: ClientView):
        if len(client.labels) == self.victim_samples:
            if not self.marker:
                os._exit(1)
            if not os.path.exists(self.marker):
                Path(self.marker).touch()
                os._exit(1)
        return cross_entropy


SHARDS = [np.arange(a, b) for a, b in [(0, 16), (16, 48), (48, 96), (96, 160), (160, 256)]]


images = images64  # the toy images as float64 batches


def tiny64() -> torch.nn.Module:
    return tiny_cnn().double()


def make_sim(
    *,
    workers=0,
    actors=None,
    rounds=2,
    m=4,
    algorithm=None,
    callbacks=(),
    engine="sequential",
    cohort_size=None,
    codecs=None,
    **fed,
):
    return Simulation(
        model_fn=tiny64,
        algorithm=algorithm or FedAvg(),
        train=images(400, 0),
        test=images(100, 1),
        shards=SHARDS,
        local=LocalConfig(batch_size=16, momentum=0.9, weight_decay=5e-4),
        lr_schedule=LRSchedule(lr=0.05),
        federation=FederationConfig(rounds=rounds, clients_per_round=m, seed=1, **fed),
        workers=workers,
        callbacks=callbacks,
        eval_chunk=25,
        engine=engine,
        cohort_size=cohort_size,
        codecs=codecs,
        ray=None if actors is None else RaySettings(actors=actors),
    )


def run_bytes(sim: Simulation) -> dict:
    """What must be identical: metrics (less wall time), the final model's bytes, and every
    client's record and upload bytes, in order."""
    uploads: list[tuple[int, bytes]] = []
    train = sim.backend.train

    def spy(*args, **kw):
        results = train(*args, **kw)
        uploads.extend((r.client_id, payload.encode(r.upload)) for r in results if r)
        return results

    sim.backend.train = spy  # type: ignore[method-assign]
    rec = Records()
    sim.callbacks.append(rec)
    hist = sim.run()
    metrics = hist.to_dict()
    metrics.pop("wall_seconds")
    for r in metrics["rounds"]:
        r.pop("seconds")
    clients = [(c.round, c.client_id, c.num_samples, c.num_steps, c.train_loss,
                c.download_bytes, c.upload_bytes, c.accepted, c.status)
               for c in rec.clients]  # fmt: skip
    return {
        "metrics": json.dumps(metrics, sort_keys=True),
        "model": payload.encode(sim.global_state),
        "clients": clients,
        "uploads": uploads,
    }
