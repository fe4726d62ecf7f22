"""The scheme registry: ``PARTITIONERS``, each scheme's options type and
:func:`make_partition`. The schemes register themselves (``fedcore.partition.schemes``,
imported by the package) with :func:`register`."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, cast

import numpy as np

from fedcore.errors import UnknownNameError
from fedcore.options import dump, parse, signature_options
from fedcore.partition.core import Partition

PARTITIONERS: dict[str, Callable[..., Partition]] = {}  # name -> the wrapped scheme
_OPTIONS: dict[str, type[Any]] = {}  # name -> its options dataclass
_NOT_OPTIONS = ("labels", "num_clients", "seed", "groups")
_F = TypeVar("_F", bound=Callable[..., Partition])


def register(fn: _F) -> _F:
    """Register ``fn`` wrapped so that its keyword options pass :func:`parse` against its
    options dataclass, derived here from ``fn``'s signature and annotations (``wraps`` keeps
    both visible) and set as ``<scheme>.Options`` on the wrapper, where pickle finds it."""
    name = fn.__name__
    takes_groups = "groups" in inspect.signature(fn).parameters

    @functools.wraps(fn)
    def scheme(
        labels: Any, num_clients: Any, seed: Any, groups: Any = None, **options: Any
    ) -> Partition:
        valid = parse(_OPTIONS[name], options, f"partition.{name}")
        extra = {"groups": groups} if takes_groups else {}  # the others split by labels
        return fn(labels, num_clients, seed, **extra, **dump(valid))

    _OPTIONS[name] = signature_options(scheme, f"{name}_options", skip=_NOT_OPTIONS)
    PARTITIONERS[name] = scheme
    return cast(_F, scheme)


def scheme_options_type(scheme: str) -> type[Any]:
    """The frozen options dataclass of ``scheme`` (``<scheme>.Options``; see ``register``)."""
    if scheme not in PARTITIONERS:
        raise UnknownNameError("partition scheme", scheme, PARTITIONERS)
    return _OPTIONS[scheme]


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
    """Partition ``labels`` with the registered ``scheme``. Its options: ``options`` (a typed
    ``scheme_options_type(scheme)`` instance, or a mapping) updated by keyword arguments; the
    rest take their defaults. The scheme's wrapper parses them all, a hand-built instance too.
    ``groups``: each sample's natural client (``natural`` needs them; the others ignore them)."""
    cls = scheme_options_type(scheme)
    if options is None or isinstance(options, Mapping):
        given = dict(options or {})
    else:  # an instance of cls; anything else (another scheme's options) is refused here
        given = dump(parse(cls, options, f"partition.{scheme}"))
    return PARTITIONERS[scheme](labels, num_clients, seed, groups, **{**given, **kwargs})
