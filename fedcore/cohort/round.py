"""One round's clients trained as cohorts, for ``fedcore.engine.Simulation`` (engine cohort)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import cast

import numpy as np
import torch

from fedcore import payload
from fedcore.algorithms.base import UPLOAD, ClientTask, ClientView, FederatedAlgorithm
from fedcore.client import ImageData, LocalConfig
from fedcore.codecs import Codecs, apply_update, encode_update
from fedcore.cohort.layout import CohortResult
from fedcore.cohort.plan import CohortClient, shared_objective
from fedcore.cohort.trainer import CohortTrainer
from fedcore.jobs import ClientResult
from fedcore.payload import StateDict


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
    *,
    codecs: Codecs | None = None,
    start: StateDict | None = None,
    memories: Sequence[StateDict | None] | None = None,
) -> list[ClientResult]:
    """The round's ``tasks`` trained as cohorts on ``data`` (device-resident; ``labels`` the
    host copy of its labels): one result per task, in task order, as the server receives a
    client job's (``fedcore.jobs.receive``).

    Every client starts from the global model (what it downloads plus what it holds is the
    global state), so a cohort shares one start state. Clients with a different plan (trained
    or uploaded keys: FedNILO) train in separate cohorts. Upload bytes are
    ``len(payload.encode(upload))`` of each client's upload (``payload.encoded_size``). An
    upload is a row of its cohort's stacked states (``payload.Row``, not copied), which
    ``fedcore.aggregate`` reduces in one call per tensor; losses and finite flags are read
    back from the device once per cohort.
    ``max_steps``: per task, a straggler's cut (None: the configured local training); clients
    with different cuts train in separate cohorts, each with its own step cap.
    ``codecs``: through an upload codec each client's update is encoded and decoded row by
    row, as a client job does (``fedcore.codecs.encode_update``), the server's model plus the
    decoded update uploaded; ``start``: what the clients start from where a download codec
    rounded the global model; ``memories``: per task, its error-feedback memory.
    """
    server_state = global_state
    if start is not None:
        global_state = start  # the clients' model: what they decoded
    codecs = codecs or Codecs()
    codec = codecs.upload
    mems = [None] * len(tasks) if memories is None else list(memories)
    caps = [None] * len(tasks) if max_steps is None else list(max_steps)
    groups: dict[tuple, list[int]] = {}
    for i, t in enumerate(tasks):
        groups.setdefault((t.trainable, t.upload_keys, caps[i]), []).append(i)
    out: list[ClientResult | None] = [None] * len(tasks)
    for (trainable, upload_keys, cap), members in groups.items():
        cfg = local
        if cap is not None:
            steps = cap if local.max_steps is None else min(cap, local.max_steps)
            cfg = dataclasses.replace(local, max_steps=steps)
        objectives = []
        clients = []
        views: list[ClientView] = []
        for i in members:
            t = tasks[i]
            own = torch.as_tensor(shards[t.client_id], dtype=torch.int64)
            view = ClientView(
                labels=labels.index_select(0, own), message=t.message, private=t.private
            )
            views.append(view)
            objectives.append(algorithm.client_objective(global_state, view))
            clients.append(CohortClient(t.client_id, t.indices, seeds[i], noise_var[t.client_id]))
        fn, ctxs = shared_objective(algorithm.name, objectives)
        size = trainer.cohort_size(global_state, data, clients, cfg, trainable)
        for lo in range(0, len(members), size):
            part = slice(lo, lo + size)
            res = trainer.train(
                global_state,
                data,
                clients[part],
                lr=lr,
                cfg=cfg,
                fn=fn,
                ctxs=ctxs[part],
                trainable=trainable,
                check=upload_keys,
            )
            sent = res.states if upload_keys is None else {k: res.states[k] for k in upload_keys}
            extra = _uploads(algorithm, global_state, res, views[part], lr, cfg)
            if codec is not None:
                for j, i in enumerate(members[part]):
                    enc = encode_update(
                        codec,
                        global_state,
                        payload.Row(sent, j),
                        payload.Row(extra, j) if extra else {},
                        seed=seeds[i],
                        memory=mems[i],
                        raw=codecs.raw,
                    )
                    upload = apply_update(enc.decoded, server_state, UPLOAD, codecs.raw)
                    out[i] = ClientResult(
                        client_id=tasks[i].client_id,
                        upload=upload,
                        upload_bytes=payload.encoded_size(enc.wire, fresh=True),
                        num_samples=res.num_samples[j],
                        num_steps=res.num_steps[j],
                        train_loss=res.train_loss[j],
                        seconds=res.client_seconds(j),
                        finite=payload.is_finite(upload),  # what the server decoded
                        memory=enc.memory,
                    )
                continue
            if extra:  # SCAFFOLD's delta c_k, stacked like the states
                sent = {**sent, **extra}
            nbytes = payload.encoded_size(payload.Row(sent, 0), fresh=True)
            for j, i in enumerate(members[part]):
                out[i] = ClientResult(
                    client_id=tasks[i].client_id,
                    upload=cast(StateDict, payload.Row(sent, j)),  # a view, not a copy
                    upload_bytes=nbytes,
                    num_samples=res.num_samples[j],
                    num_steps=res.num_steps[j],
                    train_loss=res.train_loss[j],
                    seconds=res.client_seconds(j),
                    finite=res.finite[j],
                )
    assert all(r is not None for r in out), "every task belongs to a cohort"
    return cast(list[ClientResult], out)


def _uploads(
    algorithm: FederatedAlgorithm,
    global_state: StateDict,
    res: CohortResult,
    views: Sequence[ClientView],
    lr: float,
    cfg: LocalConfig,
) -> dict[str, torch.Tensor]:
    """The algorithm's extra uploads (``client_upload``, SCAFFOLD's delta c_k) of a cohort,
    computed row by row as a client job computes them, stacked ``UPLOAD``-prefixed."""
    rows = [
        algorithm.client_upload(
            global_state,
            payload.Row(res.states, j),
            view,
            num_steps=res.num_steps[j],
            lr=lr,
            local=cfg,
        )
        for j, view in enumerate(views)
    ]
    if not rows or not rows[0]:
        return {}
    return {UPLOAD + k: torch.stack([r[k] for r in rows]) for k in rows[0]}
