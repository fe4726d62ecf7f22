"""FedProx (Li et al. 2020; seed 000 §III-B, seed 003): FedAvg plus a proximal term.

Each client minimises f_k(w) + mu/2 * ||w - w_t||^2, where w_t is the global model it
downloaded (seed 000 eq. for FedProx's local objective). The term only changes the client
objective; aggregation and the server step are FedAvg's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, ClassVar

import torch
from annotated_types import Ge

from fedcore.algorithms.base import ClientView, FederatedAlgorithm
from fedcore.client import Objective, cross_entropy
from fedcore.options import Float
from fedcore.payload import StateDict


def proximal_term(params: StateDict, anchor: StateDict) -> torch.Tensor:
    """sum over the trained parameters of ||w - w_t||^2 (frozen ones are not in ``params``)."""
    total = torch.zeros(())
    for k, w in params.items():
        total = total + (w - anchor[k].to(w.device)).pow(2).sum()
    return total


@dataclass(frozen=True)
class FedProx(FederatedAlgorithm):
    name: ClassVar[str] = "fedprox"

    mu: Annotated[Float, Ge(0)] = 0.01  # NIID-Bench's grid: 0.001, 0.01, 0.1, 1 (seed 000 §IV)

    def client_objective(self, global_state: StateDict, client: ClientView) -> Objective:
        anchor = {k: v.detach() for k, v in global_state.items()}
        mu = self.mu

        def loss(
            logits: torch.Tensor, targets: torch.Tensor, params: StateDict, ctx: object
        ) -> torch.Tensor:
            prox = proximal_term(params, anchor)
            return cross_entropy(logits, targets, params) + 0.5 * mu * prox.to(logits.device)

        return Objective(loss)  # the same for every client: the anchor is the global model
