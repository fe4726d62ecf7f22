"""Registry of federated algorithms, one file each."""

from __future__ import annotations

from typing import Any

from fedcore.algorithms.base import ClientUpdate, FedAvg, FederatedAlgorithm
from fedcore.errors import ConfigError, UnknownNameError

ALGORITHMS: dict[str, type[FederatedAlgorithm]] = {"fedavg": FedAvg}


def list_algorithms() -> list[str]:
    return sorted(ALGORITHMS)


def build_algorithm(name: str, **options: Any) -> FederatedAlgorithm:
    """Instantiate an algorithm by name; options must be fields of its hyper-parameters."""
    if name not in ALGORITHMS:
        raise UnknownNameError("algorithm", name, ALGORITHMS)
    cls = ALGORITHMS[name]
    allowed = sorted(getattr(cls, "__dataclass_fields__", {}))
    extra = sorted(set(options) - set(allowed))
    if extra:
        raise ConfigError(
            f"algorithm {name!r} takes no option {extra[0]!r}; allowed: {', '.join(allowed) or 'none'}"
        )
    return cls(**options)


__all__ = [
    "ALGORITHMS",
    "ClientUpdate",
    "FedAvg",
    "FederatedAlgorithm",
    "build_algorithm",
    "list_algorithms",
]
