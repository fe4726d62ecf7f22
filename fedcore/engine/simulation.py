"""The simulation: the run loop over the rounds, evaluation, checkpoints and events.

One round is ``fedcore.engine.round``; where the clients train, a backend
(``fedcore.engine.backends``), chosen here from ``engine``, ``workers`` and ``device``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from fedcore import payload
from fedcore.algorithms.base import FederatedAlgorithm, FederationSetup, RunSpec
from fedcore.client import ImageData, LocalConfig
from fedcore.codecs import Codecs, check_sizes, encode_state
from fedcore.device import deterministic
from fedcore.engine.backends import Backend, Placement, Workload, backend_name, make_backend
from fedcore.engine.config import FederationConfig, initial_model
from fedcore.engine.ray_cluster import RaySettings
from fedcore.engine.round import RoundSetup, ServerState, play_round
from fedcore.errors import ConfigError
from fedcore.events import Callback, History, RoundRecord
from fedcore.privacy.server import DpConfig, DpServer
from fedcore.schedules import LRSchedule


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
        test_rows: np.ndarray | None = None,
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
        ray: RaySettings | None = None,
        codecs: Codecs | None = None,
        checked: bool = False,
        privacy: DpConfig | None = None,
    ) -> None:
        """``model``: the initial global model from :func:`initial_model` (None: built here);
        it is the one model instance of this process's clients (worker processes build their
        own from ``model_fn``). ``ray``: the clients train on Ray actors
        (``fedcore.engine.ray_pool``) instead of this machine's worker processes.
        ``codecs``: how uploads and downloads are encoded (``fedcore.codecs``; None: as the
        model holds them). ``test_rows``: the rows of ``test`` an evaluation measures outside
        the last ``federation.whole_test_last`` evaluations (None: every row, always).
        ``checked``: the caller checked the algorithm's rules against this run and the upload
        codec against the payload (``tasks``: once per run, when it resolves the cell);
        False: they are checked here. ``privacy``: client-level DP-FedAvg
        (``fedcore.privacy.server``) on every round's average."""
        if engine not in ("sequential", "cohort"):
            raise ConfigError(f"runtime.engine must be one of cohort, sequential (got {engine!r})")
        self.ray = ray
        # the model's float buffers (BatchNorm's running statistics) travel as they are
        self.codecs = codecs or Codecs()
        self.engine = engine
        self.cohort_size = cohort_size  # clients per cohort (None: as many as memory allows)
        self.model_fn = model_fn
        self.exit_accuracy: list[float] = []  # per early exit, at the last evaluation
        self.algorithm = algorithm
        self.train, self.test = train, test
        self.test_rows = None if test_rows is None else np.asarray(test_rows, dtype=np.int64)
        self.shards = [np.asarray(s, dtype=np.int64) for s in shards]
        self.noise_var = list(noise_var) if noise_var is not None else [0.0] * len(self.shards)
        self.local, self.schedule, self.cfg = local, lr_schedule, federation
        self.device = device
        # CUDA runs clients sequentially in-process; CPU fans out to single-thread workers.
        # The cohort engine trains in this process with every core (one batched computation).
        self.workers = 0 if device != "cpu" or engine == "cohort" else max(0, workers)
        self.trainable = trainable
        self.callbacks = list(callbacks)
        # Test images per evaluation job: fixed (never derived from the worker count, so the
        # summed loss is the same whatever the workers); small enough that the workers share
        # a 2,000-image evaluation (W1) instead of one of them doing it all.
        self.eval_chunk = eval_chunk
        model = initial_model(model_fn, federation) if model is None else model
        if self.codecs.active:
            params = {k for k, _ in model.named_parameters()}
            raw = frozenset(k for k in model.state_dict() if k not in params)
            self.codecs = dataclasses.replace(self.codecs, raw=raw)
        work = Workload(
            model_fn, model, algorithm, train, test, self.shards, self.noise_var, local, device,
            self.codecs,
        )  # fmt: skip
        self.backend: Backend = self._backend(work)
        # What the server keeps from round to round: the global model, the clients holding the
        # frozen base, and per client its error-feedback memory (client state: checkpointed,
        # never counted).
        self.server = ServerState({k: v.detach().clone() for k, v in model.state_dict().items()})
        algorithm.setup(
            FederationSetup(
                model=model,
                local=local,
                label_distribution=self._label_distribution(),
                trainable=trainable,
            )
        )
        # The adapter's payload (None: the whole model); the frozen base never changes.
        self.payload_keys = None if payload_keys is None else tuple(payload_keys)
        self.base_bytes = 0
        self.base_cache: dict[tuple[str, ...], bytes] = {}  # its encodings (fedcore.wire)
        # The algorithm's own rules (FedNILO: the whole model only; FedNova: SGD only).
        adapter = "full" if self.payload_keys is None else "adapter"
        if not checked:
            spec = RunSpec(adapter=adapter, optimizer=local.optimizer, private=privacy is not None)
            algorithm.check(spec)
        if self.payload_keys is not None:
            missing = sorted(set(self.payload_keys) - set(self.global_state))
            if missing:
                raise ConfigError(f"payload keys not in the model: {', '.join(missing[:4])}")
            sent = set(self.payload_keys)
            base = {k: v for k, v in self.global_state.items() if k not in sent}
            if base and self.codecs.download is not None:  # the base through the codec too
                base = encode_state(
                    self.codecs.download, base, upload=False, gen=None, raw=self.codecs.raw
                )
            self.base_bytes = len(payload.encode(base)) if base else 0
        if not checked:  # a top-k k above a tensor's size
            uploaded = self.global_state
            if self.payload_keys is not None:
                uploaded = {k: self.global_state[k] for k in self.payload_keys}
            check_sizes(self.codecs.upload, uploaded)
        self.history: History | None = None  # the run's records (set by run())
        self._resume: dict[str, Any] | None = None  # a checkpoint to continue from
        self.private_keys: tuple[str, ...] = ()  # what DP clips and noises (none: no DP)
        if privacy is not None:
            self.server.privacy = self._private(privacy, model)

    def _private(self, config: DpConfig, model: nn.Module) -> DpServer:
        """The run's DP server, over the trained parameters the clients upload."""
        if self.cfg.sampling != "without_replacement":
            raise ConfigError(
                "privacy needs federation.sampling: without_replacement (the accountant counts "
                f"each client once a round; got {self.cfg.sampling})"
            )
        params = {k for k, _ in model.named_parameters()}
        sent = self.payload_keys if self.payload_keys is not None else tuple(self.global_state)
        self.private_keys = tuple(
            sorted(
                k for k in sent if k in params and (self.trainable is None or k in self.trainable)
            )
        )
        return DpServer(
            config, sampling="fixed", population=len(self.shards),
            cohort=self.cfg.clients_per_round, rounds=self.cfg.rounds, seed=self.cfg.seed,
        )  # fmt: skip

    def _label_distribution(self) -> np.ndarray:
        """p(y) over the union of the client shards (the federation's training data)."""
        labels = self.train.labels.numpy()
        held = labels[np.concatenate(self.shards)] if self.shards else labels[:0]
        counts = np.bincount(held, minlength=int(labels.max()) + 1 if len(labels) else 0)
        return counts / max(1, counts.sum())

    def _backend(self, work: Workload) -> Backend:
        """Where the clients train (``fedcore.engine.backends.BACKENDS``): the cohort
        engine, Ray actors, worker processes, or this process."""
        where = Placement(
            self.workers, self.cfg.clients_per_round, self.cohort_size, self.trainable, self.ray
        )
        return make_backend(backend_name(self.engine, where), work, where)

    def close(self) -> None:
        self.backend.close()
        # Callers get the global model on the host, whatever device the run used.
        self.global_state = {k: v.to("cpu") for k, v in self.global_state.items()}

    # ---- the round loop ----------------------------------------------------------------
    def evaluate(self, whole: bool = False) -> tuple[float, float]:
        """(top-1 accuracy, mean loss) of the global model on the test set's ``test_rows``
        (``whole``, or no ``test_rows``: every row); the accuracy at every early exit in
        ``exit_accuracy``."""
        rows = np.arange(len(self.test)) if whole or self.test_rows is None else self.test_rows
        # Test images per evaluation job: ``eval_chunk``, so the summed loss is the same
        # whatever the workers.
        chunks = np.array_split(rows, max(1, -(-len(rows) // self.eval_chunk)))
        ev = self.backend.evaluate(self.global_state, chunks)
        # Early exits (seed 001 §5): accuracy at every exit, logged as round extras.
        self.exit_accuracy = [c / ev.samples for c in ev.exit_correct]
        return ev.correct / ev.samples, ev.loss / ev.samples

    def run(self) -> History:
        """Run the remaining rounds: all of them, or those after a checkpoint given to
        :meth:`load_state_dict` (the resumed run's outputs equal an uninterrupted run's).
        On CUDA, under deterministic settings for the run only (``fedcore.device``)."""
        with deterministic(self.device):
            return self._run()

    def _run(self) -> History:
        history = History(last_rounds=self.cfg.last_rounds, base_bytes=self.base_bytes)
        self.base_holders.clear()
        self.codec_memory.clear()
        if self._resume is not None:
            self._apply_resume(self._resume, history)
            self._resume = None
        self.history = history
        start = time.perf_counter()
        self.emit(
            "on_fit_start",
            {
                "num_clients": len(self.shards),
                "rounds": self.cfg.rounds,
                "start_round": len(history.rounds) + 1,
            },
        )
        if history.rounds:
            self.emit("on_resume", history)
        self.global_state = self.backend.start(self.global_state)
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
                dp = self.server.privacy
                if reason is None and r < final and dp is not None and not dp.next_round_allowed():
                    reason = "privacy_budget"  # the next round would spend more than the target
                if reason is not None and record.accuracy is None and self.cfg.eval_every:
                    acc, test_loss = self.evaluate(whole=self.cfg.whole_test_last > 0)
                    record = dataclasses.replace(record, accuracy=acc, test_loss=test_loss)
                history.rounds.append(record)
                history.base_download_bytes = self.base_bytes * len(self.base_holders)
                if reason is not None:
                    history.stop_reason = reason
                self.emit("on_round_end", record)
                if reason is not None:
                    break
        finally:
            self.close()
        history.wall_seconds = time.perf_counter() - start
        self.emit("on_fit_end", history)
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
            "base_holders": sorted(self.base_holders),
            "stop_reason": history.stop_reason,
            **({"privacy": self.server.privacy.state_dict()} if self.server.privacy else {}),
            **(
                {"codec_memory": {str(c): m for c, m in sorted(self.codec_memory.items())}}
                if self.codec_memory
                else {}
            ),
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
        self.base_holders.update(int(c) for c in state["base_holders"])
        self.codec_memory = {int(c): m for c, m in state.get("codec_memory", {}).items()}
        if (self.server.privacy is None) != ("privacy" not in state):
            raise ConfigError(
                "the checkpoint's privacy differs from this run's (one has a privacy section, "
                "the other not); resume with the params the run started with"
            )
        if self.server.privacy is not None:
            self.server.privacy.load_state_dict(state["privacy"])
        history.base_download_bytes = self.base_bytes * len(self.base_holders)

    # ---- the server's state, and one round -------------------------------------------------
    @property
    def global_state(self) -> dict[str, torch.Tensor]:
        return self.server.global_state

    @global_state.setter
    def global_state(self, state: dict[str, torch.Tensor]) -> None:
        self.server.global_state = state

    @property
    def base_holders(self) -> set[int]:
        """The clients that downloaded the frozen base."""
        return self.server.base_holders

    @property
    def codec_memory(self) -> dict[int, dict[str, torch.Tensor]]:
        """Per client, its error-feedback memory."""
        return self.server.codec_memory

    @codec_memory.setter
    def codec_memory(self, memory: dict[int, dict[str, torch.Tensor]]) -> None:
        self.server.codec_memory = memory

    def _round(self, r: int, cum_down: int, cum_up: int) -> RoundRecord:
        """Round ``r`` (``fedcore.engine.round.play_round``) of this run's setup on its server
        state."""
        run = RoundSetup(
            self.cfg, self.schedule, self.local, self.algorithm, self.shards, self.payload_keys,
            self.trainable, self.codecs, self.backend, self.base_cache, self.emit,
            lambda whole: (*self.evaluate(whole=whole), list(self.exit_accuracy)),
            self.private_keys,
        )  # fmt: skip
        return play_round(run, self.server, r, cum_down, cum_up)

    def emit(self, event: str, *args: Any) -> None:
        """Call ``event`` on every callback, in order."""
        for cb in self.callbacks:
            getattr(cb, event)(*args)
