"""Options of registry entries: frozen dataclasses, one pydantic path, one error line.

Every registry entry declares its options as a frozen dataclass whose field annotations carry
the allowed values:

* an algorithm *is* one (its hyper-parameters, ``fedcore.algorithms``);
* an adapter method names one (``AdapterMethod.Options``, ``models.adapters``);
* a partition scheme or a model builder declares keyword-only parameters, from which
  :func:`signature_options` derives one.

:func:`parse` validates a mapping (a ``params.yaml`` section, or keyword arguments) into that
dataclass with pydantic, and :func:`describe` turns pydantic's first error into the one line
every fedapt error uses: ``<key>: must be ... (got ...)`` or ``unknown key '<key>'; allowed:
...``. ``tasks.config`` embeds the same dataclasses in its ``Params`` model and formats with
the same :func:`describe`, adding the file and YAML line.

Numbers are strict (``"3"`` or ``true`` is not 3; an integer is a valid float), integers
fit int64 and floats are finite, through :data:`Int` and :data:`Float`.
"""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from functools import cache
from typing import Annotated, Any, TypeVar, Union

from pydantic import (
    AllowInfNan,
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    TypeAdapter,
    ValidationError,
)

from fedcore.errors import ConfigError

T = TypeVar("T")

# an integer that fits int64 (numpy, torch); not a bool, a float or a string
Int = Annotated[int, Strict(), Field(ge=-(2**63), le=2**63 - 1)]
Float = Annotated[float, Strict(), AllowInfNan(False)]  # a finite number (an integer is one)

# Set on each options dataclass (and inherited): a key the dataclass lacks is an error.
FORBID_EXTRA = ConfigDict(extra="forbid")


@cache
def _adapter(cls: type[Any]) -> TypeAdapter[Any]:
    return TypeAdapter(cls)


def option_names(cls: type[Any]) -> list[str]:
    """The options (init fields) of an options dataclass, in declaration order."""
    return [f.name for f in dataclasses.fields(cls) if f.init]


def parse(cls: type[T], raw: Mapping[str, Any] | T | None, key: str) -> T:
    """``raw`` validated into the options dataclass ``cls`` (an instance passes as it is);
    a bad key or value raises the one-line ConfigError naming ``key.<option>``."""
    if isinstance(raw, cls):
        return raw
    if raw is not None and not isinstance(raw, Mapping):
        raise ConfigError(f"{key}: must be a mapping of options (got {raw!r})")
    try:
        return typing.cast(T, _adapter(typing.cast(Any, cls)).validate_python(dict(raw or {})))
    except ValidationError as err:
        raise ConfigError(describe(err, cls, prefix=key)) from None


def dump(options: Any) -> dict[str, Any]:
    """An options dataclass as a plain mapping (tuples stay tuples)."""
    return {f: getattr(options, f) for f in option_names(type(options))}


def signature_options(fn: Callable[..., Any], name: str, skip: Iterable[str] = ()) -> type[Any]:
    """A frozen options dataclass from ``fn``'s parameters with defaults (minus ``skip``):
    their annotations (:data:`Int`, :data:`Float`, ``Literal``, ...) are the allowed values.

    It becomes ``fn.Options`` (its qualified name says so), so that it pickles by reference
    as long as ``fn`` is a module-level function whose registry derives it at import."""
    hints = typing.get_type_hints(fn, include_extras=True)
    params = inspect.signature(fn).parameters.values()
    spec = [
        (p.name, hints.get(p.name, Any), dataclasses.field(default=p.default))
        for p in params
        if p.default is not inspect.Parameter.empty and p.name not in set(skip)
    ]
    cls = dataclasses.make_dataclass(name, spec, frozen=True)
    cls.__pydantic_config__ = FORBID_EXTRA  # type: ignore[attr-defined]
    cls.__module__ = getattr(fn, "__module__", __name__)
    cls.__qualname__ = f"{getattr(fn, '__qualname__', name)}.Options"
    fn.Options = cls  # type: ignore[attr-defined]
    return cls


# ---- the one error formatter ----------------------------------------------------------------


def describe(
    err: ValidationError,
    root: type[Any],
    prefix: str = "",
    sections: Callable[[tuple[Any, ...]], list[str]] | None = None,
) -> str:
    """Pydantic's first error as one line: ``key: must be ... (got value)``, or
    ``unknown key 'key'; allowed: ...`` (the keys of the section at that place in ``root``,
    or as ``sections`` says for a section typed at run time)."""
    e = err.errors()[0]
    loc = location(e)
    key = ".".join([prefix, *map(str, loc)] if prefix else map(str, loc))
    if e["type"] in ("extra_forbidden", "unexpected_keyword_argument"):
        keys = (sections or (lambda where: fields_at(root, where)))(loc[:-1])
        allowed = ", ".join(keys) or "none"
        return f"unknown key {key!r}; allowed: {allowed}"
    msg = e["msg"].removeprefix("Value error, ").replace("Input should be", "must be")
    got = e.get("input")
    if e["type"] == "value_error" or isinstance(got, Mapping):  # a check of the whole section
        return f"{key}: {msg}" if key else msg
    return f"{key}: {msg} (got {got!r})"


def location(error: Mapping[str, Any]) -> tuple[Any, ...]:
    """An error's location without pydantic's internal steps (validator and union tags)."""
    return tuple(
        x
        for x in error["loc"]
        if not (isinstance(x, str) and (x.startswith("function-") or "[" in x))
    )


def fields_at(root: type[Any], loc: tuple[Any, ...]) -> list[str]:
    """The keys of the section at ``loc`` in ``root`` (a pydantic model or a dataclass)."""
    tp: Any = root
    for part in loc:
        tp = _field_type(_unwrap(tp), str(part))
        if tp is None:
            return []
    tp = _unwrap(tp)
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return list(tp.model_fields)
    if dataclasses.is_dataclass(tp):
        return option_names(typing.cast(type, tp))
    return []


def _unwrap(tp: Any) -> Any:
    """``Annotated[X, ...]`` and ``X | None`` -> ``X``."""
    while True:
        origin = typing.get_origin(tp)
        if origin is Annotated:
            tp = typing.get_args(tp)[0]
        elif origin in (Union, types.UnionType):
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            if len(args) != 1:
                return tp
            tp = args[0]
        else:
            return tp


def _field_type(tp: Any, name: str) -> Any:
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        field = tp.model_fields.get(name)
        return field.annotation if field else None
    if dataclasses.is_dataclass(tp):
        return typing.get_type_hints(tp, include_extras=True).get(name)
    if typing.get_origin(tp) in (dict, Mapping):
        return typing.get_args(tp)[1]
    return None
