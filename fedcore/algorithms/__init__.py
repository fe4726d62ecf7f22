"""Registry of federated algorithms, one file each."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from fedcore.algorithms.base import (
    ClientTask,
    ClientUpdate,
    ClientView,
    FedAvg,
    FederatedAlgorithm,
    FederationSetup,
    RunSpec,
)
from fedcore.algorithms.fedir import FedIR
from fedcore.algorithms.fednilo import FedNILO
from fedcore.algorithms.fednova import FedNova
from fedcore.algorithms.fedopt import FedAdagrad, FedAdam, FedAvgM, FedYogi
from fedcore.algorithms.fedprox import FedProx
from fedcore.algorithms.fedvc import FedVC
from fedcore.errors import ConfigError, UnknownNameError

ALGORITHMS: dict[str, type[FederatedAlgorithm]] = {
    cls.name: cls
    for cls in (
        FedAvg,
        FedProx,
        FedNova,
        FedAvgM,
        FedAdagrad,
        FedAdam,
        FedYogi,
        FedIR,
        FedVC,
        FedNILO,
    )
}


def list_algorithms() -> list[str]:
    return sorted(ALGORITHMS)


def algorithm_options(name: str) -> list[str]:
    """The options (hyper-parameters) an algorithm takes."""
    if name not in ALGORITHMS:
        raise UnknownNameError("algorithm", name, ALGORITHMS)
    return [f.name for f in fields(ALGORITHMS[name]) if f.init]


def build_algorithm(name: str, **options: Any) -> FederatedAlgorithm:
    """Instantiate an algorithm by name; options must be fields of its hyper-parameters.

    Values are checked by the algorithm's ``__post_init__`` (ConfigError, one line).
    """
    allowed = algorithm_options(name)
    extra = sorted(set(options) - set(allowed))
    if extra:
        raise ConfigError(
            f"algorithm {name!r} takes no option {extra[0]!r}; allowed: {', '.join(allowed) or 'none'}"
        )
    return ALGORITHMS[name](**options)


__all__ = [
    "ALGORITHMS",
    "ClientTask",
    "ClientUpdate",
    "ClientView",
    "FedAvg",
    "FederatedAlgorithm",
    "FederationSetup",
    "RunSpec",
    "algorithm_options",
    "build_algorithm",
    "list_algorithms",
]
