"""The schemes in one table, ``PARTITIONERS``: each scheme's options type and
:func:`make_partition`. A scheme is a function of ``fedcore.partition.schemes`` wrapped by
:func:`scheme` (its options typed and parsed); adding one is that function and its line here
(docs/extending.md)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, cast

import numpy as np

from fedcore.errors import UnknownNameError
from fedcore.options import dump, parse
from fedcore.partition import schemes
from fedcore.partition.core import Partition

PARTITIONERS: dict[str, Callable[..., Partition]] = {  # name -> the wrapped scheme
    "iid": schemes.iid,
    "dirichlet_classwise": schemes.dirichlet_classwise,
    "dirichlet_clientwise": schemes.dirichlet_clientwise,
    "labels_per_client": schemes.labels_per_client,
    "gaussian_noise": schemes.gaussian_noise,
    "quantity_normal": schemes.quantity_normal,
    "quantity_dirichlet": schemes.quantity_dirichlet,
    "natural": schemes.natural,
}


def scheme_options_type(scheme: str) -> type[Any]:
    """The frozen options dataclass of ``scheme`` (``<scheme>.Options``; see ``core.scheme``)."""
    if scheme not in PARTITIONERS:
        raise UnknownNameError("partition scheme", scheme, PARTITIONERS)
    return cast(type[Any], PARTITIONERS[scheme].Options)  # type: ignore[attr-defined]


def make_partition(
    scheme: str,
    labels: np.ndarray,
    *,
    num_clients: int,
    seed: int,
    options: Mapping[str, Any] | object | None = None,
    groups: np.ndarray | None = None,
    **kwargs: Any,
) -> Partition:
    """Partition ``labels`` with ``scheme`` of the table. Its options: ``options`` (a typed
    ``scheme_options_type(scheme)`` instance, or a mapping) updated by keyword arguments; the
    rest take their defaults. The scheme's wrapper parses them all, a hand-built instance too.
    ``groups``: each sample's natural client (``natural`` needs them; the others ignore them)."""
    cls = scheme_options_type(scheme)
    if options is None or isinstance(options, Mapping):
        given = dict(options or {})
    else:  # an instance of cls; anything else (another scheme's options) is refused here
        given = dump(parse(cls, options, f"partition.{scheme}"))
    return PARTITIONERS[scheme](labels, num_clients, seed, groups, **{**given, **kwargs})
