"""One round's clients trained as cohorts, for ``fedcore.engine.Simulation`` (engine cohort)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from fedcore import payload
from fedcore.algorithms.base import ClientTask, ClientView, FederatedAlgorithm
from fedcore.client import ImageData, LocalConfig
from fedcore.cohort.plan import CohortClient, shared_objective
from fedcore.cohort.trainer import CohortTrainer
from fedcore.payload import StateDict

# (client, upload, upload bytes, samples, steps, loss, seconds), as fedcore.jobs.client_job
Result = tuple[int, StateDict, int, int, int, float, float]


def cohort_round(
    trainer: CohortTrainer,
    algorithm: FederatedAlgorithm,
    global_state: StateDict,
    data: ImageData,
    labels: torch.Tensor,
    shards: Sequence[np.ndarray],
    noise_var: Sequence[float],
    local: LocalConfig,
    tasks: list[ClientTask],
    lr: float,
    seeds: list[int],
    max_steps: Sequence[int | None] | None = None,
) -> list[Result]:
    """The round's ``tasks`` trained as cohorts on ``data`` (device-resident; ``labels`` the
    host copy of its labels): one result per task, in task order, as ``client_job`` returns it.

    Every client starts from the global model (what it downloads plus what it holds is the
    global state), so a cohort shares one start state. Clients with a different plan (trained
    or uploaded keys: FedNILO) train in separate cohorts. Upload bytes are
    ``len(payload.encode(upload))`` of each client's upload (``payload.encoded_size``).
    ``max_steps``: per task, a straggler's cut (None: the configured local training); clients
    with different cuts train in separate cohorts, each with its own step cap.
    """
    caps = [None] * len(tasks) if max_steps is None else list(max_steps)
    groups: dict[tuple, list[int]] = {}
    for i, t in enumerate(tasks):
        groups.setdefault((t.trainable, t.upload_keys, caps[i]), []).append(i)
    out: list[Any] = [None] * len(tasks)
    for (trainable, upload_keys, cap), members in groups.items():
        cfg = local
        if cap is not None:
            steps = cap if local.max_steps is None else min(cap, local.max_steps)
            cfg = dataclasses.replace(local, max_steps=steps)
        objectives = []
        clients = []
        for i in members:
            t = tasks[i]
            own = torch.as_tensor(shards[t.client_id], dtype=torch.int64)
            view = ClientView(labels=labels.index_select(0, own), message=t.message)
            objectives.append(algorithm.client_objective(global_state, view))
            clients.append(CohortClient(t.client_id, t.indices, seeds[i], noise_var[t.client_id]))
        fn, ctxs = shared_objective(algorithm.name, objectives)
        size = trainer.cohort_size(global_state, data, clients, cfg, trainable)
        for lo in range(0, len(members), size):
            part = slice(lo, lo + size)
            results = trainer.train(
                global_state,
                data,
                clients[part],
                lr=lr,
                cfg=cfg,
                fn=fn,
                ctxs=ctxs[part],
                trainable=trainable,
            )
            for i, res in zip(members[part], results, strict=True):
                up = res.state if upload_keys is None else {k: res.state[k] for k in upload_keys}
                # Own copies, on the device: a view into the stacked cohort tensors would keep
                # the whole stack alive (and on the host serialise all of it).
                up = {k: v.detach().clone() for k, v in up.items()}
                out[i] = (
                    tasks[i].client_id, up, payload.encoded_size(up), res.num_samples,
                    res.num_steps, res.train_loss, res.seconds,
                )  # fmt: skip
    return out
