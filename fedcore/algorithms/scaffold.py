"""SCAFFOLD (Karimireddy et al. 2020, "SCAFFOLD: Stochastic Controlled Averaging for
Federated Learning", Algorithm 1 with option II control variates).

The server holds x and a control variate c; client k holds its own c_k (zero at first,
kept between rounds). In a round the server sends x and c to each sampled client; the client
runs K local SGD steps from x at learning rate eta_l with the corrected gradient
g_k(y) + (c - c_k), reaching y_k, and updates its control variate (option II)

  c_k+ = c_k - c + (x - y_k) / (K eta_l),     delta c_k = c_k+ - c_k,

then uploads y_k (delta y_k = y_k - x has the same encoding) and delta c_k. With S the
clients whose upload the server accepted this round (sampled, reported, finite) and N the
number of clients of the federation, the server steps

  x += eta_g mean_{k in S} delta y_k,      c += (|S| / N) mean_{k in S} delta c_k,

which is c += (1/N) sum_{k in S} delta c_k: c stays the mean of all N c_k. Under dropout,
stragglers dropped by the deadline and rejected (non-finite) uploads, |S| counts the
accepted uploads only: a client that sent nothing keeps its c_k, and the sum has no term
for it. The means are uniform over S, as in the paper (FedAvg weights by samples).

* Traffic: c travels with every download and delta c_k with every upload, one tensor per
  trained parameter each way: about twice FedAvg's bytes, counted as ``len()`` of the real
  encoding like every payload (``fedcore.wire``). c_k itself never travels: the simulation
  keeps it on the server (``self.server``) and hands it to the client with its job
  (``ClientTask.private``), so worker processes see it whatever their number.
* K is the steps the client actually took (``max_steps``, a straggler's cut): the client
  counts them, as FedNova counts tau_i. A client that took no step keeps its c_k.
* Optimiser: SGD only (``check``): the correction is a gradient term and option II reads
  (x - y_k) / (K eta_l) as the mean corrected gradient, which AdamW's steps are not. Weight
  decay is part of every client's objective (its gradient is corrected like the loss's).
  Heavy-ball momentum rho: K is replaced by FedNova's momentum-corrected step count
  a(K, rho) = [K - rho (1 - rho^K) / (1 - rho)] / (1 - rho) (``sgd_normalizer``), so that
  (x - y_k) / (a eta_l) is again the mean corrected gradient; rho = 0 gives the paper's K.
* Adapters: the control variates cover the trained parameters (the adapter's, or all).
* c and every c_k are checkpointed (``state_dict``), so a resumed run equals an
  uninterrupted one. c_k is stored once a client has reported, one model's worth each.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Annotated, Any, ClassVar

import numpy as np
import torch
from annotated_types import Gt

from fedcore.aggregate import sgd_normalizer, stacked, weighted_average
from fedcore.algorithms.base import (
    UPLOAD,
    ClientTask,
    ClientUpdate,
    ClientView,
    FederatedAlgorithm,
    FederationSetup,
    RunSpec,
)
from fedcore.client import LocalConfig, Objective, cross_entropy
from fedcore.errors import ConfigError
from fedcore.options import Float
from fedcore.payload import StateDict


def corrected_loss(
    logits: torch.Tensor, targets: torch.Tensor, params: StateDict, ctx: Mapping[str, torch.Tensor]
) -> torch.Tensor:
    """Cross-entropy whose gradient carries + (c - c_k) (``ctx``) for every corrected
    parameter: the added term is s - stopgrad(s) with s = sum <w, c - c_k>, zero in value
    (the reported loss is the cross-entropy's) and (c - c_k) in gradient."""
    loss = cross_entropy(logits, targets, params)
    terms = [(params[k] * ctx[k].to(params[k].device)).sum() for k in ctx if k in params]
    if not terms:
        return loss
    s = torch.stack(terms).sum()
    return loss + (s - s.detach()).to(loss.dtype)


def control_delta(
    x: torch.Tensor, y: torch.Tensor, c: torch.Tensor, steps: int, lr: float, momentum: float
) -> torch.Tensor:
    """delta c_k = c_k+ - c_k = (x - y_k) / (a eta_l) - c (option II; a = K without momentum);
    zero when the client took no step."""
    a = sgd_normalizer(steps, momentum)
    if steps == 0 or a <= 0.0:
        return torch.zeros_like(y)
    return (x.to(y.device) - y) * (1.0 / (a * lr)) - c.to(y.device)


@dataclass(frozen=True)
class Scaffold(FederatedAlgorithm):
    name: ClassVar[str] = "scaffold"
    private_refusal: ClassVar[str | None] = (
        "its clients also upload control variates, which the clipping and noise would not cover"
    )

    server_lr: Annotated[Float, Gt(0)] = 1.0  # eta_g (the paper's global step size)

    def check(self, run: RunSpec) -> None:
        super().check(run)
        if run.optimizer != "sgd":
            raise ConfigError(
                "scaffold corrects local SGD gradients and reads (x - y_k) / (K eta_l) as their "
                f"mean (option II): client.optimizer must be sgd, not {run.optimizer}"
            )

    # ---- server state -------------------------------------------------------------------
    def setup(self, fed: FederationSetup) -> None:
        super().setup(fed)
        state = fed.model.state_dict()
        keys = tuple(
            n
            for n, _ in fed.model.named_parameters()
            if fed.trainable is None or n in fed.trainable
        )
        self.server["cv_keys"] = keys
        self.server["c"] = {k: torch.zeros_like(state[k], device="cpu") for k in keys}
        self.server["clients"] = {}  # client id -> c_k (absent: zero)
        self.server["num_clients"] = 0

    def control(self) -> dict[str, torch.Tensor]:
        """The server's c (CPU tensors)."""
        return self.server["c"]

    def client_control(self, client_id: int) -> dict[str, torch.Tensor]:
        """Client ``client_id``'s c_k (zeros before its first accepted upload)."""
        held = self.server["clients"].get(client_id)
        if held is None:
            return {k: torch.zeros_like(v) for k, v in self.control().items()}
        return held

    # ---- round plan ---------------------------------------------------------------------
    def server_message(self, round_: int, client_id: int) -> dict[str, torch.Tensor]:
        return self.control()  # one dict for all: the round's downloads share one encoding

    def plan_round(
        self, round_: int, clients: Sequence[int], shards: Sequence[np.ndarray], seed: int
    ) -> list[ClientTask]:
        self.server["num_clients"] = len(shards)  # N of the |S|/N rule
        tasks = super().plan_round(round_, clients, shards, seed)
        return [replace(t, private=self.client_control(t.client_id)) for t in tasks]

    # ---- client side (worker) -----------------------------------------------------------
    def client_objective(self, global_state: StateDict, client: ClientView) -> Objective:
        # c - c_k per corrected parameter: the client's own tensors, stacked by the cohort
        # engine along the client dimension.
        corr = {k: c - client.private[k] for k, c in client.message.items()}
        return Objective(corrected_loss, corr)

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
        return {
            k: control_delta(global_state[k], trained[k], c, num_steps, lr, local.momentum)
            for k, c in client.message.items()
        }

    # ---- server side --------------------------------------------------------------------
    def aggregation_weights(self, updates: list[ClientUpdate]) -> list[float]:
        return [1.0] * len(updates)  # the paper's uniform means over S

    def aggregate(self, global_state: StateDict, updates: list[ClientUpdate]) -> StateDict:
        """x + eta_g mean(delta y) for the parameters (buffers take the mean); moves c and
        the reporting clients' c_k on (the round's only accepted updates are these)."""
        mean = weighted_average([u.state for u in updates], self.aggregation_weights(updates))
        out: StateDict = {}
        for key, v in mean.items():
            if key.startswith(UPLOAD):
                continue
            if key in self.control():
                x = global_state[key].to(torch.float64)
                step = v.to(torch.float64) - x  # mean over S of delta y_k
                out[key] = (x + self.server_lr * step).to(global_state[key].dtype)
            else:
                out[key] = v
        self._update_controls(mean, updates)
        return out

    def _update_controls(self, mean: StateDict, updates: list[ClientUpdate]) -> None:
        """c += (|S|/N) mean_S delta c_k and c_k += delta c_k for k in S. Called from
        ``aggregate``: every update here is finite, so the new model is (short of a float32
        overflow of a mean, when the round's model is rejected but c has moved on)."""
        n = max(self.server["num_clients"], len(updates))
        frac = len(updates) / n  # |S| / N
        c = self.control()
        self.server["c"] = {
            k: (v.to(torch.float64) + frac * mean[UPLOAD + k].to("cpu", torch.float64)).to(v.dtype)
            for k, v in c.items()
        }
        held = self.server["clients"]
        stack = stacked([u.state for u in updates])  # a cohort's rows: one copy per tensor
        rows = None if stack is None else {k: stack[UPLOAD + k].to("cpu") for k in c}
        for i, u in enumerate(updates):
            ck = self.client_control(u.client_id)
            dc = {k: (u.state[UPLOAD + k] if rows is None else rows[k][i]) for k in c}
            held[u.client_id] = {k: v + dc[k].to("cpu") for k, v in ck.items()}

    def round_extra(self, round_: int, updates: list[ClientUpdate]) -> dict[str, float]:
        c = self.control()
        sq = sum(float(v.to(torch.float64).pow(2).sum()) for v in c.values())
        return {"control_norm": sq**0.5, "control_clients": float(len(self.server["clients"]))}

    # ---- checkpoint ---------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """c and every stored c_k, CPU copies (client ids as ints)."""
        return {
            "c": {k: v.detach().clone() for k, v in self.control().items()},
            "clients": {
                int(cid): {k: v.detach().clone() for k, v in ck.items()}
                for cid, ck in sorted(self.server["clients"].items())
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        unknown = sorted(set(state) - {"c", "clients"})
        if unknown:
            raise ValueError(f"scaffold server state has unknown keys {unknown}")
        keys = set(self.control())
        if set(state["c"]) != keys:
            raise ValueError("scaffold control variates cover other parameters than this model's")
        self.server["c"] = {k: state["c"][k].clone() for k in self.control()}
        self.server["clients"] = {
            int(cid): {k: ck[k].clone() for k in self.control()}
            for cid, ck in state["clients"].items()
        }
