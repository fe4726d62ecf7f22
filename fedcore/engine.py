"""The federated simulation engine: sampling, download, local training, upload, aggregation.

Determinism: every random choice is derived from (seed, round, client) and every client's
local training runs single-threaded, so a run gives the same numbers whatever the number of
worker processes, their completion order or the machine's thread count. Updates are
aggregated in the order the server sampled the clients, never in completion order.

What travels: by default the whole model, every round. With ``payload_keys`` (an adapter
method's payload: ``models.adapters``) only those state-dict entries are downloaded, trained
(``trainable``) and uploaded each round; the rest is the frozen base, which a client
downloads once, the first time it is sampled. That one-time download is counted apart
(``History.base_download_bytes``), never in the per-round traffic. Algorithms see only the
payload: uploads hold nothing else, so their aggregation and server steps act on it alone.

Parallelism comes from worker processes (each one model, one thread): on 2 CPU cores two
single-thread clients outrun one two-thread client (DESIGN.md, CPU facts). On CUDA the clients
run one after another in this process. With ``engine="cohort"`` the round's clients instead
train together in this process as one batched computation per step (``fedcore.cohort``); the
downloads, uploads, byte counts, aggregation and events are the same.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import math
import multiprocessing as mp
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from fedcore import payload
from fedcore.algorithms.base import (
    ClientTask,
    ClientUpdate,
    FederatedAlgorithm,
    FederationSetup,
    RunSpec,
)
from fedcore.client import ImageData, LocalConfig
from fedcore.cohort import CohortTrainer, check_batchable
from fedcore.cohort.round import cohort_round
from fedcore.device import deterministic
from fedcore.errors import ConfigError
from fedcore.events import Callback, ClientRecord, History, RoundRecord
from fedcore.jobs import (
    ClientResult,
    Context,
    client_job,
    eval_job,
    eval_state,
    init_pool_worker,
    receive,
    worker_client_job,
    worker_eval_job,
)
from fedcore.sampling import CLIENT_STREAM as _CLIENT_STREAM
from fedcore.sampling import Outcome, derive_seed, dropout_active, round_outcomes, sample_clients
from fedcore.schedules import LRSchedule
from fedcore.wire import downloads, restrict

__all__ = [
    "FederationConfig",
    "History",
    "Simulation",
    "derive_seed",
    "initial_model",
    "sample_clients",
]


@dataclass(frozen=True)
class FederationConfig:
    rounds: int
    clients_per_round: int
    # "without_replacement": distinct clients each round (seed 004 §6.1.4, 10 of 100);
    # "with_replacement": independent uniform draws, a client drawn twice trains twice.
    sampling: str = "without_replacement"
    eval_every: int = 1  # 0: never evaluate (benchmarks)
    last_rounds: int = 5  # L of "mean accuracy of the last L rounds" (seed 004 §6.1.5)
    seed: int = 0
    # Clients that may not report (seed 000's cross-device setting; fedcore.sampling
    # round_outcomes, docs/accounting.md): a sampled client fails to report with probability
    # ``dropout`` (per client from Beta(k(1-d), k d) with ``availability_concentration`` k);
    # one whose local steps exceed ``deadline_steps`` x its speed (exp(speed_spread z) per
    # client) is a straggler: ``stragglers`` "drop" or "partial" (its update cut there).
    dropout: float = 0.0
    availability_concentration: float | None = None
    deadline_steps: int | None = None
    speed_spread: float = 0.0
    stragglers: str = "drop"
    # Train rounds 1..stop_after of a run configured for ``rounds`` (schedules and budgets
    # read ``rounds``), then end it as a budget would (stop_reason "stop_after"): the first
    # rounds of a run exactly, e.g. to check a record (``fedapt reproduce --revalidate``).
    stop_after: int | None = None

    def __post_init__(self) -> None:
        if self.stop_after is not None and not 1 <= self.stop_after <= self.rounds:
            raise ConfigError(
                f"federation.stop_after must be in [1, rounds={self.rounds}] (got {self.stop_after})"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"federation.dropout must be in [0, 1) (got {self.dropout})")
        k = self.availability_concentration
        if k is not None and not k > 0.0:
            raise ConfigError(f"federation.availability_concentration must be > 0 (got {k})")
        if self.deadline_steps is not None and self.deadline_steps < 1:
            raise ConfigError(f"federation.deadline_steps must be >= 1 (got {self.deadline_steps})")
        if not self.speed_spread >= 0.0:
            raise ConfigError(f"federation.speed_spread must be >= 0 (got {self.speed_spread})")
        if self.stragglers not in ("drop", "partial"):
            raise ConfigError(
                f"federation.stragglers must be one of drop, partial (got {self.stragglers!r})"
            )


def initial_model(model_fn: Callable[[], nn.Module], federation: FederationConfig) -> nn.Module:
    """The run's initial global model: built right after seeding torch with the run's seed, so
    its weights depend on the seed alone. A caller that needs the model before the Simulation
    exists (its payload keys, sizes) builds it here and passes it as ``model``."""
    torch.manual_seed(federation.seed)
    return model_fn()


class Simulation:
    """Runs ``federation.rounds`` rounds of ``algorithm`` over the client shards."""

    def __init__(
        self,
        *,
        model_fn: Callable[[], nn.Module],
        algorithm: FederatedAlgorithm,
        train: ImageData,
        test: ImageData,
        shards: Sequence[np.ndarray],
        local: LocalConfig,
        lr_schedule: LRSchedule,
        federation: FederationConfig,
        noise_var: Sequence[float] | None = None,
        workers: int = 1,
        device: str = "cpu",
        callbacks: Sequence[Callback] = (),
        eval_chunk: int = 500,
        payload_keys: Sequence[str] | None = None,
        trainable: frozenset[str] | None = None,
        engine: str = "sequential",
        cohort_size: int | None = None,
        model: nn.Module | None = None,
    ) -> None:
        """``model``: the initial global model from :func:`initial_model` (None: built here);
        it is the one model instance of this process's clients (worker processes build their
        own from ``model_fn``)."""
        if engine not in ("sequential", "cohort"):
            raise ConfigError(f"runtime.engine must be one of cohort, sequential (got {engine!r})")
        self.engine = engine
        self.cohort_size = cohort_size  # clients per cohort (None: as many as memory allows)
        self.model_fn = model_fn
        self.exit_accuracy: list[float] = []  # per early exit, at the last evaluation
        self.algorithm = algorithm
        self.train, self.test = train, test
        self.shards = [np.asarray(s, dtype=np.int64) for s in shards]
        self.noise_var = list(noise_var) if noise_var is not None else [0.0] * len(self.shards)
        self.local, self.schedule, self.cfg = local, lr_schedule, federation
        self.device = device
        # CUDA runs clients sequentially in-process; CPU fans out to single-thread workers.
        # The cohort engine trains in this process with every core (one batched computation).
        self.workers = 0 if device != "cpu" or engine == "cohort" else max(0, workers)
        self.callbacks = list(callbacks)
        # Test images per evaluation job: fixed (never derived from the worker count, so the
        # summed loss is the same whatever the workers); small enough that the workers share
        # a 2,000-image evaluation (W1) instead of one of them doing it all.
        self.eval_chunk = eval_chunk
        model = initial_model(model_fn, federation) if model is None else model
        self._model = model
        if engine == "cohort":
            check_batchable(model)
        self.global_state: dict[str, torch.Tensor] = {
            k: v.detach().clone() for k, v in model.state_dict().items()
        }
        algorithm.setup(
            FederationSetup(model=model, local=local, label_distribution=self._label_distribution())
        )
        # The adapter's payload (None: the whole model); the frozen base never changes.
        self.payload_keys = None if payload_keys is None else tuple(payload_keys)
        self.trainable = trainable
        self.base_bytes = 0
        self._base_holders: set[int] = set()
        self._base_cache: dict[tuple[str, ...], bytes] = {}
        # The algorithm's own rules (FedNILO: the whole model only; FedNova: SGD only).
        adapter = "full" if self.payload_keys is None else "adapter"
        algorithm.check(RunSpec(adapter=adapter, optimizer=local.optimizer))
        if self.payload_keys is not None:
            missing = sorted(set(self.payload_keys) - set(self.global_state))
            if missing:
                raise ConfigError(f"payload keys not in the model: {', '.join(missing[:4])}")
            sent = set(self.payload_keys)
            base = {k: v for k, v in self.global_state.items() if k not in sent}
            self.base_bytes = len(payload.encode(base)) if base else 0
        self._ctx_args = (algorithm, train, test, self.shards, self.noise_var, local, device)
        self._local_ctx: Context | None = None
        self._pool: cf.ProcessPoolExecutor | None = None
        self._cohort: CohortTrainer | None = None
        # The cohort engine keeps the data and the global model on its device for the run.
        self._train_dev: ImageData = train
        self._test_dev: ImageData = test
        self.history: History | None = None  # the run's records (set by run())
        self._resume: dict[str, Any] | None = None  # a checkpoint to continue from

    def _label_distribution(self) -> np.ndarray:
        """p(y) over the union of the client shards (the federation's training data)."""
        labels = self.train.labels.numpy()
        held = labels[np.concatenate(self.shards)] if self.shards else labels[:0]
        counts = np.bincount(held, minlength=int(labels.max()) + 1 if len(labels) else 0)
        return counts / max(1, counts.sum())

    # ---- execution back-ends -----------------------------------------------------------
    def _new_pool(self) -> cf.ProcessPoolExecutor:
        # Workers die with this process (jobs.die_with_parent), even when it is killed -9.
        return cf.ProcessPoolExecutor(
            max_workers=self.workers,
            mp_context=mp.get_context("spawn"),
            initializer=init_pool_worker,
            initargs=(os.getpid(), self.model_fn, *self._ctx_args),
        )

    def _start(self) -> None:
        self._lost_streak = 0
        if self.workers >= 1:
            self.train.share_memory_()
            self.test.share_memory_()
            self._pool = self._new_pool()
        else:
            model = self._model.to(self.device)  # the initial model trains the clients in turn
            self._local_ctx = Context(model, *self._ctx_args)
            if self.engine == "cohort":
                self._cohort = CohortTrainer(
                    model, device=self.device, max_clients=self.cohort_size
                )
                # Device-resident: uint8 images and labels are moved once; batches are
                # gathered, converted and normalised on the device, the global model stays
                # there and aggregation and server optimisers run there. Nothing crosses to
                # the host per round but byte counts (payload.encoded_size) and metrics.
                to = getattr(self.train, "to", None)
                self._train_dev = self.train.to(self.device) if to else self.train
                to = getattr(self.test, "to", None)
                self._test_dev = self.test.to(self.device) if to else self.test
                self.global_state = {k: v.to(self.device) for k, v in self.global_state.items()}

    def _map(
        self, fn_local: Callable, fn_worker: Callable, jobs: list[tuple], *, what: str = "job"
    ) -> list:
        """The jobs' results in submission order. With worker processes, a job lost to a
        dead worker (the pool broken: killed, out of memory, a crash in native code) is run
        again once, alone, on a restarted pool; lost again, its result is None (``what``
        "client": the engine counts it as dropped) or, for other jobs, an error."""
        if self._pool is not None:
            return self._map_pool(fn_worker, jobs, what)
        assert self._local_ctx is not None
        threads = torch.get_num_threads()
        if self.device == "cpu" and self.engine == "sequential":
            torch.set_num_threads(1)  # the same arithmetic as a single-thread worker
        try:
            return [fn_local(self._local_ctx, *job) for job in jobs]
        finally:
            torch.set_num_threads(threads)

    def _restart_pool(self) -> None:
        assert self._pool is not None
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._pool = self._new_pool()

    def _map_pool(self, fn: Callable, jobs: list[tuple], what: str) -> list:
        assert self._pool is not None
        futures: list[cf.Future | None] = []
        for job in jobs:
            try:
                futures.append(self._pool.submit(fn, *job))
            except cf.process.BrokenProcessPool:
                futures.append(None)  # broken while submitting: lost, retried below
        out: list[Any] = [None] * len(jobs)
        lost: list[int] = []
        for i, f in enumerate(futures):
            try:
                if f is None:
                    raise cf.process.BrokenProcessPool
                out[i] = f.result()
                self._lost_streak = 0
            except cf.process.BrokenProcessPool:
                lost.append(i)
        if not lost:
            return out
        print(
            f"fedapt: a worker process died; {len(lost)} {what} job(s) lost, the pool "
            f"restarted and each retried once, alone",
            file=sys.stderr,
            flush=True,
        )
        self._restart_pool()
        for i in lost:
            try:
                out[i] = self._pool.submit(fn, *jobs[i]).result()
                self._lost_streak = 0
                continue
            except cf.process.BrokenProcessPool:
                self._restart_pool()
            self._lost_streak += 1
            # A worker that cannot start (its initializer fails) loses every job: stop then.
            if what != "client" or self._lost_streak >= 3:
                raise RuntimeError(
                    f"worker processes died on {self._lost_streak} {what} job(s) in a row, "
                    f"each retried once: giving up (a worker's own error, if any, is above)"
                )
            client = getattr(jobs[i][0], "client_id", "?")
            print(
                f"fedapt: client {client} dropped: its worker process died again on the retry",
                file=sys.stderr,
                flush=True,
            )
        return out

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None
        # Callers get the global model on the host, whatever device the run used.
        self.global_state = {k: v.to("cpu") for k, v in self.global_state.items()}
        self._train_dev, self._test_dev = self.train, self.test

    # ---- the round loop ----------------------------------------------------------------
    def evaluate(self) -> tuple[float, float]:
        if self._cohort is not None:
            # Cached frozen features of the test set (head; the CLS history of lw_linear/lw_mlp).
            res = self._cohort.caches.evaluate(
                self.global_state, self._test_dev, np.arange(len(self.test)), self.trainable
            )
            if res is not None:
                correct, loss, n, per_exit = res
                self.exit_accuracy = [c / n for c in per_exit]
                return correct / n, loss / n
        chunks = np.array_split(
            np.arange(len(self.test)), max(1, -(-len(self.test) // self.eval_chunk))
        )
        if self._cohort is not None:  # in this process, on the device-resident test set
            assert self._local_ctx is not None
            ctx = dataclasses.replace(self._local_ctx, test=self._test_dev)
            parts = [eval_state(ctx, self.global_state, c) for c in chunks]
        else:
            blob = payload.encode(self.global_state)
            parts = self._map(eval_job, worker_eval_job, [(blob, c) for c in chunks])
        correct = sum(p[0] for p in parts)
        loss = sum(p[1] for p in parts)
        n = sum(p[2] for p in parts)
        # Early exits (seed 001 §5): accuracy at every exit, logged as round extras.
        self.exit_accuracy = [sum(c) / n for c in zip(*(p[3] for p in parts), strict=True)]
        return correct / n, loss / n

    def run(self) -> History:
        """Run the remaining rounds: all of them, or those after a checkpoint given to
        :meth:`load_state_dict` (the resumed run's outputs equal an uninterrupted run's).
        On CUDA, under deterministic settings for the run only (``fedcore.device``)."""
        with deterministic(self.device):
            return self._run()

    def _run(self) -> History:
        history = History(last_rounds=self.cfg.last_rounds, base_bytes=self.base_bytes)
        self._base_holders.clear()
        if self._resume is not None:
            self._apply_resume(self._resume, history)
            self._resume = None
        self.history = history
        start = time.perf_counter()
        self._emit(
            "on_fit_start",
            {
                "num_clients": len(self.shards),
                "rounds": self.cfg.rounds,
                "start_round": len(history.rounds) + 1,
            },
        )
        if history.rounds:
            self._emit("on_resume", history)
        self._start()
        try:
            last = history.rounds[-1] if history.rounds else None
            cum_down = last.cum_download_bytes if last else 0
            cum_up = last.cum_upload_bytes if last else 0
            # a checkpoint written after a budget ended the run: nothing is left to train
            done = history.stop_reason != "rounds"
            first = self.cfg.rounds + 1 if done else len(history.rounds) + 1
            final = self.cfg.rounds if self.cfg.stop_after is None else self.cfg.stop_after
            for r in range(first, final + 1):
                record = self._round(r, cum_down, cum_up)
                cum_down, cum_up = record.cum_download_bytes, record.cum_upload_bytes
                # A budget of the algorithm ran out (seed 004 §6.1.4), or the run stops where
                # it was told to: the last round is evaluated like the final round of a full run.
                reason = self.algorithm.stop_reason(record)
                if reason is None and r == final < self.cfg.rounds:
                    reason = "stop_after"
                if reason is not None and record.accuracy is None and self.cfg.eval_every:
                    acc, test_loss = self.evaluate()
                    record = dataclasses.replace(record, accuracy=acc, test_loss=test_loss)
                history.rounds.append(record)
                history.base_download_bytes = self.base_bytes * len(self._base_holders)
                if reason is not None:
                    history.stop_reason = reason
                self._emit("on_round_end", record)
                if reason is not None:
                    break
        finally:
            self.close()
        history.wall_seconds = time.perf_counter() - start
        self._emit("on_fit_end", history)
        return history

    # ---- checkpoints -------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything the rounds so far left behind that the next rounds read: the global
        model, the algorithm's server state (FedOpt's moments, FedNILO's holder map), the
        round records (cumulative bytes included) and which clients hold the frozen base.
        Every random choice is derived from (seed, round, client), so nothing else is needed
        to continue. Plain Python and CPU tensors: ``torch.load(weights_only=True)`` reads it.
        Valid between rounds (from an ``on_round_end`` callback, or after :meth:`run`)."""
        history = self.history
        assert history is not None, "state_dict() is read during or after run()"
        return {
            "round": len(history.rounds),
            "global_state": {k: v.detach().to("cpu").clone() for k, v in self.global_state.items()},
            "algorithm": self.algorithm.state_dict(),
            "rounds": [r.to_dict() for r in history.rounds],
            "base_holders": sorted(self._base_holders),
            "stop_reason": history.stop_reason,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (:meth:`state_dict` of an interrupted run of the same
        configuration): the next :meth:`run` starts at the round after it."""
        rounds = int(state["round"])
        if not 0 <= rounds <= self.cfg.rounds or len(state["rounds"]) != rounds:
            raise ConfigError(f"checkpoint holds {rounds} rounds, the run has {self.cfg.rounds}")
        missing = sorted(set(self.global_state) ^ set(state["global_state"]))
        if missing:
            raise ConfigError(f"checkpoint model differs from this run's: {', '.join(missing[:4])}")
        self._resume = state

    def _apply_resume(self, state: dict[str, Any], history: History) -> None:
        self.global_state = {k: state["global_state"][k] for k in self.global_state}
        self.algorithm.load_state_dict(state["algorithm"])
        history.rounds = [
            RoundRecord(**{**r, "clients": tuple(r["clients"])}) for r in state["rounds"]
        ]
        history.stop_reason = state.get("stop_reason", "rounds")
        self._base_holders.update(int(c) for c in state["base_holders"])
        history.base_download_bytes = self.base_bytes * len(self._base_holders)

    def _round(self, r: int, cum_down: int, cum_up: int) -> RoundRecord:
        t0 = time.perf_counter()
        lr = self.schedule.at(r)
        clients = self.algorithm.select_clients(self.cfg, [len(s) for s in self.shards], r)
        self._emit("on_round_start", r, clients, lr)
        tasks = [
            restrict(t, self.payload_keys, self.trainable)
            for t in self.algorithm.plan_round(r, clients, self.shards, self.cfg.seed)
        ]
        if self.payload_keys is not None:
            self._base_holders.update(t.client_id for t in tasks)  # first time: base download
        payloads = downloads(
            self.global_state,
            tasks,
            encode=self._cohort is None,
            # the frozen base of an adapter never changes: encoded once per run
            base_cache=self._base_cache if self.payload_keys is not None else None,
        )
        # Who reports (fedcore.sampling.round_outcomes), decided before anything trains from
        # (seed, round, client, slot): a client that does not report still downloaded.
        outcomes = round_outcomes(
            self.cfg, r, [t.client_id for t in tasks], [self._planned_steps(t) for t in tasks]
        )
        seeds = [
            derive_seed(self.cfg.seed, _CLIENT_STREAM, r, t.client_id, slot)
            for slot, t in enumerate(tasks)
        ]
        train = [i for i, o in enumerate(outcomes) if o.trains]
        results: list[ClientResult | None] = [None] * len(tasks)
        trained: list[ClientResult | None]
        if self._cohort is not None:
            trained = list(cohort_round(
                self._cohort, self.algorithm, self.global_state, self._train_dev,
                self.train.labels, self.shards, self.noise_var, self.local,
                [tasks[i] for i in train], lr, [seeds[i] for i in train],
                [outcomes[i].max_steps for i in train],
            ))  # fmt: skip
        else:
            jobs: list[tuple[Any, ...]] = [
                (tasks[i], lr, seeds[i], *payloads[i][:2])
                + (() if outcomes[i].max_steps is None else (outcomes[i].max_steps,))
                for i in train
            ]
            wire = self._map(client_job, worker_client_job, jobs, what="client")
            trained = [None if res is None else receive(res) for res in wire]
        for i, res in zip(train, trained, strict=True):
            if res is None:  # its worker died twice (_map_pool): counted as dropped
                outcomes[i] = Outcome("crashed")
            results[i] = res
        updates: list[ClientUpdate] = []
        rejected = 0
        up = 0
        for t, o, res, (_, _, down_bytes) in zip(tasks, outcomes, results, payloads, strict=True):
            if res is None:  # no upload: dropped, straggler or crashed
                record = ClientRecord(
                    r, t.client_id, len(t.indices), 0, math.nan, down_bytes, 0, 0.0, False,
                    o.status,
                )  # fmt: skip
                self._emit("on_client_end", record)
                continue
            up += res.upload_bytes
            if res.finite:
                updates.append(res.update())
            else:
                rejected += 1  # a NaN/Inf update never reaches the global model
            self._emit(
                "on_client_end",
                ClientRecord(
                    r, res.client_id, res.num_samples, res.num_steps, res.train_loss, down_bytes,
                    res.upload_bytes, res.seconds, res.finite, o.status,
                ),
            )  # fmt: skip
        dropped = tuple(t.client_id for t, res in zip(tasks, results, strict=True) if res is None)
        extra: dict[str, float] = {}
        if dropout_active(self.cfg) or dropped:
            # Only for runs that configure dropout or lose a worker: other records unchanged.
            for status in ("reported", "partial", "dropped", "straggler", "crashed"):
                extra[f"clients_{status}"] = float(sum(o.status == status for o in outcomes))
            if len(dropped) == len(tasks):
                extra["no_client_reported"] = 1.0  # the model and server state are unchanged
        if updates:  # else the model and any server optimiser state stay as they were
            aggregated = self.algorithm.aggregate(self.global_state, updates)
            new = self.algorithm.server_update(self.global_state, aggregated, r)
            merged = {**self.global_state, **new}  # layers nobody uploaded keep their value
            if payload.is_finite(merged):
                self.global_state = merged
            else:
                extra["nonfinite_global_rejected"] = 1.0
        extra.update(self.algorithm.round_extra(r, updates))
        down = sum(p[2] for p in payloads)  # every sampled client downloaded
        acc = test_loss = None
        if self.cfg.eval_every and (r % self.cfg.eval_every == 0 or r == self.cfg.rounds):
            acc, test_loss = self.evaluate()
            extra.update({f"test_accuracy_exit_{k}": a for k, a in enumerate(self.exit_accuracy)})
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

    def _planned_steps(self, task: ClientTask) -> int:
        """The local steps ``task``'s client would take (fedcore.client.batch_order)."""
        per_epoch = -(-len(task.indices) // self.local.batch_size)
        steps = self.local.local_epochs * per_epoch
        return steps if self.local.max_steps is None else min(steps, self.local.max_steps)

    def _emit(self, event: str, *args: Any) -> None:
        for cb in self.callbacks:
            getattr(cb, event)(*args)
