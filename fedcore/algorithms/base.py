"""The FederatedAlgorithm contract: a client hook and a server hook (pfl-research style).

FedAvg (McMahan et al. 2017; seed 004 Algorithms 1-2) is the base class. A variant overrides
only the hook that differs: FedProx the client objective, FedNova the aggregation weights,
FedOpt the server step. Hyper-parameters are frozen dataclasses so an algorithm object can be
pickled to worker processes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from fedcore.aggregate import weighted_average
from fedcore.client import LossFn, cross_entropy
from fedcore.payload import StateDict


@dataclass
class ClientUpdate:
    """What the server holds about one client's round after decoding its upload."""

    client_id: int
    state: StateDict
    num_samples: int
    num_steps: int
    train_loss: float
    upload_bytes: int


@dataclass(frozen=True)
class FederatedAlgorithm:
    """FedAvg; subclasses override the hooks that differ."""

    name: ClassVar[str] = "fedavg"

    # ---- client side -------------------------------------------------------------------
    def client_objective(self, global_state: StateDict) -> LossFn:
        """The loss each client minimises, given the model it downloaded."""
        return cross_entropy

    # ---- server side -------------------------------------------------------------------
    def aggregation_weights(self, updates: list[ClientUpdate]) -> list[float]:
        """FedAvg weights clients by their number of samples n_k."""
        return [float(u.num_samples) for u in updates]

    def aggregate(self, global_state: StateDict, updates: list[ClientUpdate]) -> StateDict:
        return weighted_average([u.state for u in updates], self.aggregation_weights(updates))

    def server_update(
        self, global_state: StateDict, aggregated: StateDict, round_: int
    ) -> StateDict:
        """FedAvg adopts the average (server learning rate 1, no server optimiser)."""
        return aggregated

    # ---- server optimiser state (checkpointed with the model) ---------------------------
    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            raise ValueError(f"{self.name} keeps no server state, got keys {sorted(state)}")


FedAvg = FederatedAlgorithm
