"""FedIR (Hsu et al. 2020; seed 002 §3.1): importance reweighting of each client's loss.

A client's data follow q_k(x, y), the federation's target is p(x, y); assuming the same
p(x|y) everywhere, w_k(x, y) = p(y) / q_k(y) (seed 002 §3.1) and the client minimises the
reweighted empirical risk mean_i w_k(y_i) l(x_i, y_i), an unbiased estimate of E_p[l].

q_k(y) never leaves the client: it is computed in the worker from the client's own labels.
The server sends p(y) with the model, one float per class, counted in the download bytes.
p(y) is the label distribution of the union of the shards (``FederationSetup``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from fedcore.algorithms.base import ClientView, FederatedAlgorithm, FederationSetup
from fedcore.client import Objective
from fedcore.payload import StateDict


def importance_weights(p_y: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """w(y) = p(y) / q_k(y) per class, q_k the histogram of ``labels``; 0 where q_k(y) = 0
    (a class the client lacks never enters its loss)."""
    counts = torch.bincount(labels, minlength=p_y.numel()).to(torch.float64)
    q = counts / counts.sum().clamp_min(1.0)
    w = torch.where(q > 0, p_y.to(torch.float64) / q.clamp_min(1e-300), torch.zeros_like(q))
    return w.to(torch.float32)


@dataclass(frozen=True)
class FedIR(FederatedAlgorithm):
    name: ClassVar[str] = "fedir"
    private_refusal: ClassVar[str | None] = (
        "it sends every client the federation's label distribution, a statistic of all clients' data outside the mechanism"
    )

    def setup(self, fed: FederationSetup) -> None:
        super().setup(fed)
        self.server["p_y"] = torch.as_tensor(fed.label_distribution, dtype=torch.float32)

    def server_message(self, round_: int, client_id: int) -> dict[str, torch.Tensor]:
        return {"p_y": self.server["p_y"]}

    def client_objective(self, global_state: StateDict, client: ClientView) -> Objective:
        # The weights are the client's own (from its labels): per-client tensors of the
        # objective, which the cohort engine stacks along the client dimension.
        return Objective(
            _weighted_loss, {"w": importance_weights(client.message["p_y"], client.labels)}
        )


def _weighted_loss(
    logits: torch.Tensor, targets: torch.Tensor, params: StateDict, ctx: Mapping[str, torch.Tensor]
) -> torch.Tensor:
    """mean_i w(y_i) l(x_i, y_i) (seed 002 §3.1)."""
    per_sample = nn.functional.cross_entropy(logits, targets, reduction="none")
    return (ctx["w"].to(logits.device)[targets] * per_sample).mean()
