"""The FederatedAlgorithm contract: client hooks and server hooks (pfl-research style).

FedAvg (McMahan et al. 2017; seed 004 Algorithms 1-2) is the base class. A variant overrides
only the hooks that differ: FedProx the client objective, FedNova the aggregation, FedOpt the
server step, FedVC the selection and the samples, FedIR the objective and the server message,
FedNILO the round plan (what each client downloads, trains and uploads).

An algorithm is the frozen dataclass of its hyper-parameters (its options): their annotations
say the allowed values, and ``build_algorithm`` validates them through ``fedcore.options``'
one pydantic path. An algorithm object can be pickled to worker processes. Server-side mutable state (FedOpt's moments,
FedNILO's holder map) lives in ``self.server``, a dict of the main process: it is reset by
``setup``, saved by ``state_dict`` and never pickled, so workers see hyper-parameters only.

Hook call order in one round (fedcore.engine.round.play_round):
  main:   select_clients -> plan_round (client_indices, server_message) -> encode downloads
  worker: client_objective(global_state, ClientView) -> local SGD -> client_upload -> encode
  main:   aggregate -> server_update -> round_extra -> stop_reason
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from fedcore.aggregate import weighted_average
from fedcore.client import LocalConfig, LossFn, cross_entropy
from fedcore.errors import ConfigError
from fedcore.events import RoundRecord
from fedcore.options import FORBID_EXTRA
from fedcore.payload import StateDict
from fedcore.sampling import SamplingConfig, sample_clients

# The keys of an algorithm's extras on the wire (``fedcore.wire`` puts them there):
MESSAGE = "__message__."  # server -> client, inside a download payload (``ClientTask.message``)
UPLOAD = "__upload__."  # client -> server, inside an upload (``client_upload``)


@dataclass
class ClientUpdate:
    """What the server holds about one client's round after decoding its upload."""

    client_id: int
    state: StateDict  # the uploaded tensors (every key, or the plan's upload_keys)
    num_samples: int  # samples the client trained on this round (FedAvg's n_k)
    num_steps: int  # local SGD steps (FedNova's tau_i)
    train_loss: float
    upload_bytes: int


@dataclass(frozen=True)
class ClientTask:
    """The server's instructions to one client for one round (built in the main process)."""

    client_id: int
    indices: np.ndarray  # dataset indices it trains on (its shard; FedVC: N_VC of them)
    download_keys: tuple[str, ...] | None = None  # None: the whole model
    trainable: frozenset[str] | None = None  # parameters it trains; None: all of them
    upload_keys: tuple[str, ...] | None = None  # None: every tensor of the model
    message: dict[str, torch.Tensor] = field(default_factory=dict)  # sent with the download
    # What the client keeps between rounds (SCAFFOLD's c_k): simulated on the server, handed
    # to the client with its job, never on the wire (not counted in any bytes).
    private: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass(frozen=True)
class ClientView:
    """What a client knows locally when it builds its objective (runs in the worker)."""

    labels: torch.Tensor  # labels of its whole shard: private, never uploaded (FedIR q_k)
    message: dict[str, torch.Tensor]  # what the server sent besides the model (FedIR p(y))
    private: dict[str, torch.Tensor] = field(default_factory=dict)  # ClientTask.private


@dataclass(frozen=True)
class FederationSetup:
    """What the server knows before round 1."""

    model: nn.Module  # a fresh instance of the trained architecture (layer_groups, names)
    local: LocalConfig  # the clients' optimiser (FedNova's momentum-corrected normaliser)
    label_distribution: np.ndarray  # p(y) of the federation's training data (FedIR target)
    trainable: frozenset[str] | None = None  # the adapter's trained parameters (None: all)


@dataclass(frozen=True)
class RunSpec:
    """What an algorithm may refuse to run with, known before any data is loaded: the
    adapter method of the cell (``full``: the whole model trains and travels) and the
    clients' optimiser. Preflight and the Simulation both ask :meth:`FederatedAlgorithm.check`.
    """

    adapter: str = "full"
    optimizer: str = "sgd"
    private: bool = False  # client-level DP (``privacy:``): updates clipped, averaged, noised


@dataclass(frozen=True)
class FederatedAlgorithm:
    """FedAvg; subclasses override the hooks that differ."""

    __pydantic_config__ = FORBID_EXTRA  # an unknown option is an error (fedcore.options)
    name: ClassVar[str] = "fedavg"
    # True for an algorithm that decides itself which layers train and travel (FedNILO):
    # it cannot run with an adapter method other than "full".
    whole_model_only: ClassVar[bool] = False
    # Why client-level DP (DP-FedAvg: the server averages the clipped updates of a uniformly
    # sampled cohort and adds noise) would not be DP with this algorithm; None: it composes.
    private_refusal: ClassVar[str | None] = None

    def check(self, run: RunSpec) -> None:
        """Raise a one-line ConfigError when this algorithm cannot run ``run``; each algorithm
        owns its rules (FedNILO: the whole model only; FedNova: SGD only)."""
        if self.whole_model_only and run.adapter != "full":
            raise ConfigError(
                f"grid cell {self.name}/{run.adapter}: {self.name} freezes layers of the whole "
                f"model and runs only with adapter 'full'; run it in a grid with "
                "grid.adapters: [full]"
            )
        if run.private and self.private_refusal is not None:
            raise ConfigError(
                f"grid cell {self.name}/{run.adapter}: privacy (client-level DP) cannot run "
                f"with {self.name}: {self.private_refusal}; use fedavg, fedprox, fedavgm, "
                "fedadam, fedadagrad or fedyogi, or set privacy: null"
            )

    # ---- server state (main process only) -----------------------------------------------
    @property
    def server(self) -> dict[str, Any]:
        state = self.__dict__.get("_server")
        if state is None:
            state = {}
            object.__setattr__(self, "_server", state)
        return state

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_server"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for k, v in state.items():
            object.__setattr__(self, k, v)

    def setup(self, fed: FederationSetup) -> None:
        """Called once by the Simulation before round 1; resets the server state."""
        self.server.clear()
        self.server["param_keys"] = frozenset(n for n, _ in fed.model.named_parameters())

    def param_keys(self, state: StateDict) -> frozenset[str]:
        """Trainable parameters among ``state``'s keys (the rest are buffers)."""
        known = self.server.get("param_keys")
        if known is None:  # not set up: every float tensor but BatchNorm statistics
            return frozenset(
                k for k, v in state.items() if v.is_floating_point() and "running_" not in k
            )
        return frozenset(k for k in state if k in known)

    # ---- round plan (main process) ------------------------------------------------------
    def select_clients(
        self, cfg: SamplingConfig, shard_sizes: Sequence[int], round_: int
    ) -> tuple[int, ...]:
        """FedAvg samples clients uniformly (seed 004 §6.1.4)."""
        return sample_clients(cfg, len(shard_sizes), round_)

    def client_indices(
        self, shard: np.ndarray, round_: int, client_id: int, slot: int, seed: int
    ) -> np.ndarray:
        """The samples a client trains on this round: its whole shard."""
        return shard

    def server_message(self, round_: int, client_id: int) -> dict[str, torch.Tensor]:
        """Tensors sent with the model (counted in the download bytes)."""
        return {}

    def plan_round(
        self, round_: int, clients: Sequence[int], shards: Sequence[np.ndarray], seed: int
    ) -> list[ClientTask]:
        return [
            ClientTask(
                client_id=c,
                indices=self.client_indices(shards[c], round_, c, slot, seed),
                message=self.server_message(round_, c),
            )
            for slot, c in enumerate(clients)
        ]

    # ---- client side (worker) -----------------------------------------------------------
    def client_objective(self, global_state: StateDict, client: ClientView) -> LossFn:
        """The loss each client minimises, given the model it downloaded."""
        return cross_entropy

    def client_upload(
        self,
        global_state: StateDict,
        trained: Mapping[str, torch.Tensor],
        client: ClientView,
        *,
        num_steps: int,
        lr: float,
        local: LocalConfig,
    ) -> dict[str, torch.Tensor]:
        """Tensors a client uploads besides its model (SCAFFOLD's delta c_k), computed after
        its ``num_steps`` local steps from ``global_state`` to ``trained``; counted in the
        upload bytes, read by the server as ``fedcore.wire.UPLOAD``-prefixed keys of
        ``ClientUpdate.state``. Both engines call it once per client, row by row."""
        return {}

    # ---- server side (main process) -----------------------------------------------------
    def aggregation_weights(self, updates: list[ClientUpdate]) -> list[float]:
        """FedAvg weights clients by their number of samples n_k."""
        return [float(u.num_samples) for u in updates]

    def aggregate(self, global_state: StateDict, updates: list[ClientUpdate]) -> StateDict:
        return weighted_average([u.state for u in updates], self.aggregation_weights(updates))

    def server_update(
        self, global_state: StateDict, aggregated: StateDict, round_: int
    ) -> StateDict:
        """FedAvg adopts the average (server learning rate 1, no server optimiser).

        Only called when at least one update was accepted; keys missing from the result
        (layers nobody uploaded) keep their global value.
        """
        return aggregated

    def round_extra(self, round_: int, updates: list[ClientUpdate]) -> dict[str, float]:
        """Algorithm-specific metrics of the round, stored in ``RoundRecord.extra``."""
        return {}

    def stop_reason(self, record: RoundRecord) -> str | None:
        """A reason to stop after this round (a budget), or None to go on."""
        return None

    # ---- server state (checkpointed with the model) -------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            raise ValueError(f"{self.name} keeps no server state, got keys {sorted(state)}")


FedAvg = FederatedAlgorithm
