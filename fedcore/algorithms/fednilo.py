"""FedNILO (seed 004 ch. 5): FedAvg with progressive layer freezing to cut communication.

The model's L layers (``model.layer_groups()``, in forward order) freeze one by one: in
round r the layers before the freezing index I_o(r, K, F) (§5.2.3) are neither trained nor
uploaded (Algorithm 4); the last layer never freezes. A frozen layer's global value is final,
so the server keeps, per frozen layer, the set of clients that already hold that final value
(§5.2.4, Algorithm 3 line 10) and sends each client only the layers it lacks: a client seen
since a layer froze skips it, a client never seen since downloads it once.

Budgets (§6.1.4): the round budget is ``FederationConfig.rounds``; ``comm_budget_cr`` stops
the run once the cumulative traffic reaches that many communication rounds, one CR being a
full-model download and upload by every client of a round, 2 M_s n_c c_f (§6.1.5).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Annotated, Any, ClassVar

import numpy as np
from annotated_types import Ge, Gt

from fedcore import payload
from fedcore.algorithms.base import (
    ClientTask,
    ClientUpdate,
    FederatedAlgorithm,
    FederationSetup,
)
from fedcore.errors import ConfigError
from fedcore.events import RoundRecord
from fedcore.options import Float, Int
from fedcore.protocols import layer_groups


def freeze_index(round_: int, K: int, F: int, num_layers: int) -> int:
    """I_o(r, K, F) of seed 004 §5.2.3: 0 for r <= K, ceil((r - K) / F) up to K + (L-1) F,
    then L - 1 (the index of the first layer still trained; layers are 0-based)."""
    if round_ <= K:
        return 0
    if round_ <= K + (num_layers - 1) * F:
        return -(-(round_ - K) // F)
    return num_layers - 1


def layer_keys(keys: Sequence[str], groups: Sequence[Sequence[str]]) -> list[tuple[str, ...]]:
    """The state-dict keys of each layer group (module prefixes, e.g. ``conv1``)."""

    def member(key: str, prefixes: Sequence[str]) -> bool:
        return any(key == p or key.startswith(p + ".") for p in prefixes)

    return [tuple(k for k in keys if member(k, g)) for g in groups]


@dataclass(frozen=True)
class FedNILO(FederatedAlgorithm):
    name: ClassVar[str] = "fednilo"
    private_refusal: ClassVar[str | None] = (
        "its server freezes layers from the clients' per-layer updates, a release outside the mechanism"
    )
    # Its layer freezing composes with the "full" adapter method only: under an adapter the
    # base is frozen already and its "communication round" (a full model) is no longer the
    # payload the clients exchange.
    whole_model_only: ClassVar[bool] = True

    K: Annotated[Int, Ge(0)] = 350  # kick-start: rounds of full training before the first freeze
    F: Annotated[Int, Ge(1)] = (
        25  # period: rounds between two freezes (seed 004: K 350-500, F 25-75)
    )
    # stop at this many communication rounds (§6.1.4); null: no budget
    comm_budget_cr: Annotated[Float, Gt(0)] | None = None

    def setup(self, fed: FederationSetup) -> None:
        super().setup(fed)
        groups = layer_groups(fed.model)
        if groups is None:
            raise ConfigError(
                f"fednilo needs a model with layer_groups(); {type(fed.model).__name__} has none"
            )
        state = fed.model.state_dict()
        layers = layer_keys(list(state), groups)
        self.server.update(
            keys=tuple(state),
            layers=layers,
            holders=[set() for _ in layers],
            model_bytes=len(payload.encode(state)),  # M_s, a full model on the wire
        )

    def freeze_index(self, round_: int) -> int:
        return freeze_index(round_, self.K, self.F, len(self.server["layers"]))

    def upload_keys(self, index: int) -> tuple[str, ...]:
        """What a client trains and uploads when layers [0, index) are frozen."""
        frozen = {k for layer in self.server["layers"][:index] for k in layer}
        return tuple(k for k in self.server["keys"] if k not in frozen)

    def plan_round(
        self, round_: int, clients: Sequence[int], shards: Sequence[np.ndarray], seed: int
    ) -> list[ClientTask]:
        tasks = super().plan_round(round_, clients, shards, seed)
        io = self.freeze_index(round_)
        if io == 0:
            return tasks  # FedAvg rounds [1, K]
        upload = self.upload_keys(io)
        trainable = frozenset(upload) & self.server["param_keys"]
        layers, holders = self.server["layers"], self.server["holders"]
        planned = []
        for t in tasks:
            held = {
                k
                for lay, who in zip(layers[:io], holders, strict=False)
                if t.client_id in who
                for k in lay
            }
            download = tuple(k for k in self.server["keys"] if k not in held) if held else None
            planned.append(
                replace(t, download_keys=download, trainable=trainable, upload_keys=upload)
            )
        for t in tasks:  # after this download each client holds every frozen layer's final value
            for who in holders[:io]:
                who.add(t.client_id)
        return planned

    def round_extra(self, round_: int, updates: list[ClientUpdate]) -> dict[str, float]:
        io = self.freeze_index(round_)
        return {"freeze_index": float(io), "trained_layers": float(len(self.server["layers"]) - io)}

    def stop_reason(self, record: RoundRecord) -> str | None:
        if self.comm_budget_cr is None:
            return None
        cr = 2 * self.server["model_bytes"] * max(1, len(record.clients))
        used = (record.cum_download_bytes + record.cum_upload_bytes) / cr
        return "comm_budget" if used >= self.comm_budget_cr else None

    def state_dict(self) -> dict[str, Any]:
        return {"holders": [sorted(who) for who in self.server.get("holders", [])]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        holders = state.get("holders", [])
        if len(holders) != len(self.server.get("layers", holders)):
            raise ValueError(
                f"fednilo holder map has {len(holders)} layers, the model another count"
            )
        self.server["holders"] = [set(map(int, who)) for who in holders]
