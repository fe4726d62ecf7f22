"""One round: sampling, the downloads, who reports, training on the backend, the uploads,
aggregation, evaluation and the round's record.

The algorithm's hooks are called in the order ``fedcore.algorithms.base`` documents:
``select_clients`` -> ``plan_round`` -> (the clients train) -> ``aggregate`` ->
``server_update`` -> ``round_extra``. Updates are aggregated in the order the server sampled
the clients, never in completion order.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedcore import payload
from fedcore.algorithms.base import ClientTask, ClientUpdate, FederatedAlgorithm
from fedcore.client import LocalConfig
from fedcore.codecs import Codecs, download_state
from fedcore.engine.backends import Backend, Download
from fedcore.engine.config import FederationConfig
from fedcore.events import ClientRecord, RoundRecord
from fedcore.jobs import ClientResult
from fedcore.payload import StateDict
from fedcore.privacy.server import DpServer
from fedcore.sampling import CLIENT_STREAM, Outcome, derive_seed, dropout_active, round_outcomes
from fedcore.schedules import LRSchedule
from fedcore.wire import downloads, received, restrict


@dataclass(frozen=True)
class RoundSetup:
    """What every round of a run reads, fixed for the run (``Simulation`` makes it once):
    the federation, the lr schedule, local training, the algorithm, the client shards, the
    adapter's payload and trainable keys (None: the whole model), the codecs, the backend, the
    frozen base's encodings (filled once), the events and the evaluation (accuracy, loss and
    the accuracy at each early exit)."""

    cfg: FederationConfig
    schedule: LRSchedule
    local: LocalConfig
    algorithm: FederatedAlgorithm
    shards: Sequence[np.ndarray]
    payload_keys: tuple[str, ...] | None
    trainable: frozenset[str] | None
    codecs: Codecs
    backend: Backend
    base_cache: dict[tuple[str, ...], bytes]
    emit: Callable[..., None]
    evaluate: Callable[[bool], tuple[float, float, list[float]]]
    # The entries client-level DP clips and noises: the trained parameters the clients
    # upload (buffers keep the global value); empty without ``privacy``.
    private_keys: tuple[str, ...] = ()


@dataclass
class ServerState:
    """What the server keeps from round to round (checkpointed): the global model, the
    clients that hold the frozen base, and each client's error-feedback memory."""

    global_state: StateDict
    base_holders: set[int] = field(default_factory=set)
    codec_memory: dict[int, StateDict] = field(default_factory=dict)
    privacy: DpServer | None = None  # client-level DP: its accountant and clip norm


def play_round(
    run: RoundSetup, server: ServerState, r: int, cum_down: int, cum_up: int
) -> RoundRecord:
    """Round ``r``: ``server``'s global model and memory move on; its record back
    (``cum_down``, ``cum_up``: the bytes of the rounds before it)."""
    t0 = time.perf_counter()
    cfg = run.cfg
    lr = run.schedule.at(r)
    clients = run.algorithm.select_clients(cfg, [len(s) for s in run.shards], r)
    run.emit("on_round_start", r, clients, lr)
    tasks = [
        restrict(t, run.payload_keys, run.trainable)
        for t in run.algorithm.plan_round(r, clients, run.shards, cfg.seed)
    ]
    if run.payload_keys is not None:
        server.base_holders.update(t.client_id for t in tasks)  # first time: base download
    codecs = run.codecs
    # Through a download codec the clients start from the global model as they decode it.
    start = None
    if codecs.download is not None:
        start = download_state(codecs.download, server.global_state, codecs.raw)[1]
    payloads = downloads(
        server.global_state,
        tasks,
        encode=run.backend.encodes,
        # the frozen base of an adapter never changes: encoded once per run
        base_cache=run.base_cache if run.payload_keys is not None else None,
        codec=codecs.download,
        start=start,
        raw=codecs.raw,
    )
    # Who reports (fedcore.sampling.round_outcomes), decided before anything trains from
    # (seed, round, client, slot): a client that does not report still downloaded.
    outcomes = round_outcomes(
        cfg, r, [t.client_id for t in tasks], [planned_steps(run.local, t) for t in tasks]
    )
    seeds = [
        derive_seed(cfg.seed, CLIENT_STREAM, r, t.client_id, slot) for slot, t in enumerate(tasks)
    ]
    memories = None
    if codecs.upload is not None and codecs.upload.uses_memory:
        memories = [server.codec_memory.get(t.client_id) for t in tasks]
    results = dispatch(
        run.backend, server.global_state, received(codecs.download, tasks), outcomes, lr, seeds,
        payloads, start=start, memories=memories,
    )  # fmt: skip
    updates, rejected, up = receive_uploads(run.emit, r, tasks, outcomes, results, payloads)
    for res in results:  # the clients' error-feedback memory, kept where the server accepted
        if res is not None and res.memory is not None and res.finite:
            server.codec_memory[res.client_id] = res.memory
    dropped = tuple(t.client_id for t, res in zip(tasks, results, strict=True) if res is None)
    extra: dict[str, float] = {}
    if dropout_active(cfg) or dropped:
        # Only for runs that configure dropout or lose a worker: other records unchanged.
        for status in ("reported", "partial", "dropped", "straggler", "crashed"):
            extra[f"clients_{status}"] = float(sum(o.status == status for o in outcomes))
        if len(dropped) == len(tasks):
            extra["no_client_reported"] = 1.0  # the model and server state are unchanged
    if server.privacy is not None:  # every round releases a noisy model, reports or not
        release = server.privacy.release(server.global_state, updates, r, run.private_keys)
        extra.update(release.extra)
        merged = adopt(run.algorithm, server.global_state, release.aggregated, r)
        if merged is not None:
            server.global_state = merged
        else:
            extra["nonfinite_global_rejected"] = 1.0
    elif updates:  # else the model and any server optimiser state stay as they were
        merged = server_step(run.algorithm, server.global_state, updates, r)
        if merged is not None:
            server.global_state = merged
        else:
            extra["nonfinite_global_rejected"] = 1.0
    extra.update(run.algorithm.round_extra(r, updates))
    if memories is not None:  # client memory, not traffic: what error feedback holds
        extra["codec_memory_bytes"] = float(
            sum(payload.tensor_nbytes(m) for m in server.codec_memory.values())
        )
    down = sum(p[2] for p in payloads)  # every sampled client downloaded
    acc = test_loss = None
    if cfg.eval_every and (r % cfg.eval_every == 0 or r == cfg.rounds):
        acc, test_loss, exits = run.evaluate(r in cfg.whole_test_rounds())
        extra.update({f"test_accuracy_exit_{k}": a for k, a in enumerate(exits)})
    weights = [u.num_samples for u in updates]
    train_loss = (
        float(np.average([u.train_loss for u in updates], weights=weights))
        if updates
        else float("nan")
    )
    return RoundRecord(
        round=r,
        lr=lr,
        clients=clients,
        download_bytes=down,
        upload_bytes=up,
        cum_download_bytes=cum_down + down,
        cum_upload_bytes=cum_up + up,
        train_loss=train_loss,
        accuracy=acc,
        test_loss=test_loss,
        rejected=rejected,
        seconds=time.perf_counter() - t0,
        extra=extra,
        dropped=dropped,
    )


def planned_steps(local: LocalConfig, task: ClientTask) -> int:
    """The local steps ``task``'s client would take (fedcore.client.batch_order)."""
    per_epoch = -(-len(task.indices) // local.batch_size)
    steps = local.local_epochs * per_epoch
    return steps if local.max_steps is None else min(steps, local.max_steps)


def dispatch(
    backend: Backend,
    global_state: StateDict,
    tasks: list[ClientTask],
    outcomes: list[Outcome],
    lr: float,
    seeds: list[int],
    payloads: Sequence[Download],
    *,
    start: StateDict | None = None,
    memories: Sequence[StateDict | None] | None = None,
) -> list[ClientResult | None]:
    """The clients that train (``outcomes``) trained on ``backend``: one result per task,
    None for a client with no upload (dropped, straggler, or crashed: its worker died twice,
    which ``outcomes`` records). ``start`` and ``memories``: ``Backend.train``'s."""
    train = [i for i, o in enumerate(outcomes) if o.trains]
    results: list[ClientResult | None] = [None] * len(tasks)
    trained = backend.train(
        global_state,
        [tasks[i] for i in train],
        lr=lr,
        seeds=[seeds[i] for i in train],
        max_steps=[outcomes[i].max_steps for i in train],
        downloads=[payloads[i] for i in train],
        start=start,
        memories=None if memories is None else [memories[i] for i in train],
    )
    for i, res in zip(train, trained, strict=True):
        if res is None:  # its worker died twice (PoolBackend): counted as dropped
            outcomes[i] = Outcome("crashed")
        results[i] = res
    return results


def receive_uploads(
    emit: Callable[..., Any],
    r: int,
    tasks: list[ClientTask],
    outcomes: list[Outcome],
    results: list[ClientResult | None],
    payloads: Sequence[Download],
) -> tuple[list[ClientUpdate], int, int]:
    """(the accepted updates, in sampling order; how many were rejected: a NaN/Inf update
    never reaches the global model; the upload bytes), one ``on_client_end`` per client."""
    updates: list[ClientUpdate] = []
    rejected = 0
    up = 0
    for t, o, res, (_, _, down_bytes) in zip(tasks, outcomes, results, payloads, strict=True):
        if res is None:  # no upload: dropped, straggler or crashed
            record = ClientRecord(
                r, t.client_id, len(t.indices), 0, math.nan, down_bytes, 0, 0.0, False,
                o.status,
            )  # fmt: skip
            emit("on_client_end", record)
            continue
        up += res.upload_bytes
        if res.finite:
            updates.append(res.update())
        else:
            rejected += 1
        emit(
            "on_client_end",
            ClientRecord(
                r, res.client_id, res.num_samples, res.num_steps, res.train_loss, down_bytes,
                res.upload_bytes, res.seconds, res.finite, o.status,
            ),
        )  # fmt: skip
    return updates, rejected, up


def server_step(
    algorithm: FederatedAlgorithm, global_state: StateDict, updates: list[ClientUpdate], r: int
) -> StateDict | None:
    """The next global model from the round's updates; None where it is not finite (the
    caller keeps the model it has)."""
    return adopt(algorithm, global_state, algorithm.aggregate(global_state, updates), r)


def adopt(
    algorithm: FederatedAlgorithm, global_state: StateDict, aggregated: StateDict, r: int
) -> StateDict | None:
    """The algorithm's server step on ``aggregated`` (its average, or DP's noisy one); None
    where the result is not finite."""
    new = algorithm.server_update(global_state, aggregated, r)
    merged = {**global_state, **new}  # layers nobody uploaded keep their value
    return merged if payload.is_finite(merged) else None
