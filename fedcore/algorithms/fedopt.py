"""FedOpt (Reddi et al. 2021, "Adaptive Federated Optimization"; seed 002 §3.3, Algorithm 1).

Clients run FedAvg's local SGD; the server treats the negated average update -Delta_t,
Delta_t = sum_k n_k/n (x_k - x_t), as a gradient and feeds it to a server optimiser:

  FedAvgM    m_t = beta m_{t-1} + Delta_t                     x_{t+1} = x_t + eta m_t
  FedAdagrad v_t = v_{t-1} + Delta_t^2                        x_{t+1} = x_t + eta m_t / (sqrt(v_t) + tau)
  FedAdam    v_t = beta2 v_{t-1} + (1 - beta2) Delta_t^2      (same step)
  FedYogi    v_t = v_{t-1} - (1 - beta2) Delta_t^2 sign(v_{t-1} - Delta_t^2)

with m_t = beta1 m_{t-1} + (1 - beta1) Delta_t for the adaptive three, m_{-1} = 0 and
v_{-1} = tau^2 (Reddi et al. Algorithm 2; no bias correction). FedAvg is FedAvgM with eta = 1,
beta = 0 (seed 002: "FedAVG is equivalent to applying SGD to -Delta_t with eta = 1").

``form: seed002`` gives seed 002's own server optimisers instead (§3.3, PyTorch's), with
g_t = -Delta_t, t = 1, 2, ... the server step and epsilon = tau:

  FedAdagrad (Algorithm 3)  gamma_t = eta / (1 + (t - 1) lr_decay)
                            s_t = s_{t-1} + g_t^2, s_0 = initial_accumulator (0 in the text)
                            x_{t+1} = x_t - gamma_t g_t / (sqrt(s_t) + epsilon)
  FedAdam (Algorithm 4)     m_t = beta1 m_{t-1} + (1 - beta1) g_t, v_t likewise with beta2,
                            m_0 = v_0 = 0, bias-corrected m_t / (1 - beta1^t), v_t / (1 - beta2^t)
                            x_{t+1} = x_t - eta m^_t / (sqrt(v^_t) + epsilon)

Algorithm 3 has no momentum (beta1 is unused there) and the transcribed text puts epsilon
inside the root, sqrt(s_t + epsilon); the algorithm is PyTorch's Adagrad (its source and its
rendered docs add epsilon outside, as Algorithm 4 does), which is what is implemented.
Algorithm 4 computes a decayed rate but steps with gamma (and lists no decay input): no
decay. The default form stays ``reddi`` (Reddi et al., the forms above); Yogi has only that.

The optimiser acts on trainable parameters only; BatchNorm running statistics and counters
adopt the average, as under FedAvg. Moments live in float64 in ``self.server`` (main process)
and round-trip through ``state_dict`` / ``load_state_dict`` with the checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

import torch
from annotated_types import Ge, Gt, Lt

from fedcore.algorithms.base import FederatedAlgorithm
from fedcore.options import Float
from fedcore.payload import StateDict


@dataclass(frozen=True)
class _ServerOptimizer(FederatedAlgorithm):
    """Shared plumbing: pseudo-gradient per parameter, moments, checkpointed state."""

    def step(self, key: str, x: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        """The new value of parameter ``key`` (float64) given Delta_t; updates moments."""
        raise NotImplementedError

    def server_update(
        self, global_state: StateDict, aggregated: StateDict, round_: int
    ) -> StateDict:
        out = dict(aggregated)
        self._moments_to(next(iter(global_state.values())).device)
        for key in sorted(self.param_keys(aggregated)):
            x = global_state[key].to(torch.float64)
            delta = aggregated[key].to(torch.float64) - x  # Delta_t = -pseudo-gradient
            out[key] = self.step(key, x, delta).to(global_state[key].dtype)
        self.server["step"] = self.server.get("step", 0) + 1
        return out

    def _moments_to(self, device: torch.device) -> None:
        """The moments where the global model is (a resumed run loads them on the CPU, and
        the cohort engine keeps the model on its device)."""
        for name in ("m", "v"):
            moments = self.server.get(name)
            if moments and next(iter(moments.values())).device != device:
                self.server[name] = {k: v.to(device) for k, v in moments.items()}

    def state_dict(self) -> dict[str, Any]:
        """The server state with its tensors on the CPU (copies)."""
        return {
            "step": self.server.get("step", 0),
            **{
                name: {
                    k: v.detach().to("cpu", copy=True) for k, v in self.server.get(name, {}).items()
                }
                for name in ("m", "v")
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        unknown = sorted(set(state) - {"step", "m", "v"})
        if unknown:
            raise ValueError(f"{self.name} server state has unknown keys {unknown}")
        self.server["step"] = int(state.get("step", 0))
        for name in ("m", "v"):
            self.server[name] = {k: v.clone() for k, v in state.get(name, {}).items()}


@dataclass(frozen=True)
class FedAvgM(_ServerOptimizer):
    name: ClassVar[str] = "fedavgm"

    server_lr: Annotated[Float, Gt(0)] = 1.0
    momentum: Annotated[Float, Ge(0), Lt(1)] = 0.9

    def step(self, key: str, x: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        m = self.server.setdefault("m", {})
        m[key] = delta if key not in m else self.momentum * m[key] + delta
        return x + self.server_lr * m[key]


@dataclass(frozen=True)
class _Adaptive(_ServerOptimizer):
    """Reddi et al.'s adaptive step (``form: reddi``); subclasses add seed 002's form."""

    server_lr: Annotated[Float, Gt(0)] = 0.01
    beta1: Annotated[Float, Ge(0), Lt(1)] = 0.9
    tau: Annotated[Float, Gt(0)] = 1e-3
    form: Literal["reddi", "seed002"] = "reddi"  # module docstring

    def second_moment(self, v: torch.Tensor, delta2: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def seed002_step(self, key: str, x: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def step(self, key: str, x: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        if self.form == "seed002":
            return self.seed002_step(key, x, delta)
        ms, vs = self.server.setdefault("m", {}), self.server.setdefault("v", {})
        m = ms.get(key, torch.zeros_like(x))
        v = vs.get(key, torch.full_like(x, self.tau**2))
        ms[key] = self.beta1 * m + (1.0 - self.beta1) * delta
        vs[key] = self.second_moment(v, delta * delta)
        return x + self.server_lr * ms[key] / (vs[key].sqrt() + self.tau)

    @property
    def t(self) -> int:
        """The server step being taken, 1-based (``server_update`` counts it afterwards)."""
        return int(self.server.get("step", 0)) + 1


@dataclass(frozen=True)
class FedAdagrad(_Adaptive):
    name: ClassVar[str] = "fedadagrad"

    # form seed002 only (Algorithm 3): learning-rate decay eta and the accumulator's start
    lr_decay: Annotated[Float, Ge(0)] = 0.0
    initial_accumulator: Annotated[Float, Ge(0)] = 0.0

    def second_moment(self, v: torch.Tensor, delta2: torch.Tensor) -> torch.Tensor:
        return v + delta2

    def seed002_step(self, key: str, x: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        vs = self.server.setdefault("v", {})
        s = vs.get(key, torch.full_like(x, self.initial_accumulator))
        g = -delta
        vs[key] = s + g * g
        lr = self.server_lr / (1.0 + (self.t - 1) * self.lr_decay)
        return x - lr * g / (vs[key].sqrt() + self.tau)


@dataclass(frozen=True)
class FedAdam(_Adaptive):
    name: ClassVar[str] = "fedadam"

    beta2: Annotated[Float, Ge(0), Lt(1)] = 0.99

    def second_moment(self, v: torch.Tensor, delta2: torch.Tensor) -> torch.Tensor:
        return self.beta2 * v + (1.0 - self.beta2) * delta2

    def seed002_step(self, key: str, x: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        ms, vs = self.server.setdefault("m", {}), self.server.setdefault("v", {})
        g, t = -delta, self.t
        ms[key] = self.beta1 * ms.get(key, torch.zeros_like(x)) + (1.0 - self.beta1) * g
        vs[key] = self.beta2 * vs.get(key, torch.zeros_like(x)) + (1.0 - self.beta2) * g * g
        m_hat = ms[key] / (1.0 - self.beta1**t)
        v_hat = vs[key] / (1.0 - self.beta2**t)
        return x - self.server_lr * m_hat / (v_hat.sqrt() + self.tau)


@dataclass(frozen=True)
class FedYogi(FedAdam):
    name: ClassVar[str] = "fedyogi"

    form: Literal["reddi"] = "reddi"  # Yogi is not in seed 002

    def second_moment(self, v: torch.Tensor, delta2: torch.Tensor) -> torch.Tensor:
        return v - (1.0 - self.beta2) * delta2 * torch.sign(v - delta2)
