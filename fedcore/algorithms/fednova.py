"""FedNova (Wang et al. 2020; seed 000 §II-B and §IV): normalized averaging.

FedAvg's weighted average of models lets a client that takes more local steps tau_i pull the
global model further (objective inconsistency). FedNova divides each client's update by its
normaliser a_i (tau_i for plain SGD, a momentum-corrected count for heavy-ball SGD), averages
these normalized updates and rescales by tau_eff = sum_i p_i a_i. With equal tau_i it is FedAvg.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from fedcore.aggregate import normalized_average, normalized_weights, sgd_normalizer
from fedcore.algorithms.base import ClientUpdate, FederatedAlgorithm, FederationSetup, RunSpec
from fedcore.errors import ConfigError
from fedcore.payload import StateDict


@dataclass(frozen=True)
class FedNova(FederatedAlgorithm):
    name: ClassVar[str] = "fednova"
    private_refusal: ClassVar[str | None] = (
        "its server weights each update by the client's local steps, not the equal weights the noise is calibrated to"
    )

    def check(self, run: RunSpec) -> None:
        super().check(run)
        if run.optimizer != "sgd":  # a_i counts SGD steps; AdamW's are not comparable
            raise ConfigError(
                "fednova normalises by local SGD steps (seed 004): it needs client.optimizer "
                f"sgd, not {run.optimizer}"
            )

    def setup(self, fed: FederationSetup) -> None:
        super().setup(fed)
        self.server["momentum"] = fed.local.momentum  # the clients' SGD momentum rho

    def normalizers(self, updates: list[ClientUpdate]) -> list[float]:
        rho = self.server.get("momentum", 0.0)
        return [sgd_normalizer(u.num_steps, rho) for u in updates]

    def aggregate(self, global_state: StateDict, updates: list[ClientUpdate]) -> StateDict:
        states = [u.state for u in updates]
        return normalized_average(
            global_state,
            states,
            self.aggregation_weights(updates),
            self.normalizers(updates),
            self.param_keys(states[0]),
        )

    def round_extra(self, round_: int, updates: list[ClientUpdate]) -> dict[str, float]:
        if not updates:
            return {}
        p = normalized_weights(self.aggregation_weights(updates))
        a = self.normalizers(updates)
        return {
            "tau_mean": float(np.mean([u.num_steps for u in updates])),
            "tau_eff": float(np.dot(p, a)),
        }
