"""Registry of federated algorithms, one file each.

Adding one: a file here with a ``FederatedAlgorithm`` subclass (its options are its annotated
dataclass fields, its rules its ``check``), and its class in ``ALGORITHMS`` below.
"""

from __future__ import annotations

from collections.abc import Mapping
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
from fedcore.algorithms.scaffold import Scaffold
from fedcore.errors import UnknownNameError
from fedcore.options import dump, option_names, parse

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
        Scaffold,
    )
}


def list_algorithms() -> list[str]:
    return sorted(ALGORITHMS)


def algorithm_options(name: str) -> list[str]:
    """The options (hyper-parameters) an algorithm takes."""
    if name not in ALGORITHMS:
        raise UnknownNameError("algorithm", name, ALGORITHMS)
    return option_names(ALGORITHMS[name])


def build_algorithm(
    name: str, options: FederatedAlgorithm | Mapping[str, Any] | None = None, **kwargs: Any
) -> FederatedAlgorithm:
    """A fresh algorithm ``name`` with ``options`` (``grid.algorithm_options[name]``: a mapping,
    or the typed options ``tasks.config`` parsed) and/or keyword options; a bad key or value
    raises one line naming ``grid.algorithm_options.<name>.<option>``."""
    algorithm_options(name)  # an unknown name -> one line listing the known ones
    raw = dump(options) if isinstance(options, FederatedAlgorithm) else dict(options or {})
    return parse(ALGORITHMS[name], {**raw, **kwargs}, f"grid.algorithm_options.{name}")


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
