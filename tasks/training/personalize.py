"""Personalization after federated training (seed 001 Table 4): each client fine-tunes a
cell's final global model on its own corrupted data, per scope (``personalize`` params; the
math is ``fedcore.personalize``'s)."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from fedcore.client import LocalConfig
from fedcore.engine import Simulation
from fedcore.personalize import ClientResult, PersonalizeConfig, personalize, summarize
from tasks.config import Params

_err = Console(stderr=True)


def personalize_cell(
    params: Params, sim: Simulation, model: Any, trainable: frozenset[str], label: str
) -> dict[str, Any]:
    """Each client fine-tunes the final global model on its own corrupted data (seed 001
    Table 4), per scope; a scope the model lacks (client_token without an Accumulator) is
    skipped with a note."""
    p = params.personalize
    out: dict[str, Any] = {}
    has_token = any(n.endswith("client_token") for n, _ in model.named_parameters())
    for scope in p.scopes:
        if scope == "client_token" and not has_token:
            _err.print(f"{label}: personalization scope client_token skipped (no Accumulator)")
            continue
        cfg = PersonalizeConfig(
            scope=scope,
            local=LocalConfig(
                local_epochs=p.epochs,
                batch_size=p.batch_size,
                momentum=params.client.momentum,
                weight_decay=params.client.weight_decay,
                optimizer=params.client.optimizer,
            ),
            lr=p.lr,
            severities=p.severities,
            tune_fraction=p.tune_fraction,
            max_clients=p.max_clients,
            seed=params.experiment.seed,
        )

        def show(r: ClientResult, _state: Any, scope: str = scope) -> None:
            _err.print(
                f"{label} personalize {scope} client {r.client} (severity {r.severity}): "
                f"acc {100 * r.accuracy_before:.2f}% -> {100 * r.accuracy_after:.2f}%"
            )

        results = personalize(
            model,
            sim.global_state,
            sim.train,
            sim.shards,
            trainable,
            cfg,
            device=sim.device,
            on_client=show,
        )
        out[scope] = summarize(results, scope)
    return out
