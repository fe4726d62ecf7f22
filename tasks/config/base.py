"""The base of every params section and the bounds the sections share."""

from __future__ import annotations

import types
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

INT64_MAX = 2**63 - 1  # every integer in the params fits a signed 64-bit integer
MAX_SEED = 2**32 - 1  # experiment.seed(s): seeds derive further seeds (seed x 1000 + epoch)
MAX_ROUNDS = 100_000  # federation.rounds: a sanity bound (records and metrics per round)
MAX_PROCESSES = 1024  # runtime.workers, threads, dask_workers, ray_workers: a sanity bound


def _allows_none(annotation: Any) -> bool:
    return get_origin(annotation) in (Union, types.UnionType) and type(None) in get_args(annotation)


class Section(BaseModel):
    # Floats are finite (.inf, .nan refused); integers fit int64 (numpy and torch take them).
    # Strict types, as fedcore.options types the registry entries' options: a bool is not a
    # number (``rounds: true`` is not 1), a float is not an integer (2.5 nor 2.0), a string
    # is not a number or a bool; an integer is a valid float. YAML and --set values arrive
    # typed by YAML (``5``, ``0.1``, ``1e-3``, ``true``), so strictness refuses only the
    # wrong kind. A YAML list is a tuple field's value (_lists_and_empty_strings).
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False, strict=True)

    @field_validator("*", mode="before", check_fields=False)
    @classmethod
    def _lists_and_empty_strings(cls, v: Any, info: ValidationInfo) -> Any:
        """A list is given where the section holds a tuple (YAML has no tuples); an empty
        string is refused (``--set experiment.name=``): it names nothing."""
        if isinstance(v, list):
            return tuple(v)
        if isinstance(v, str) and not v.strip():
            field = cls.model_fields[str(info.field_name)]
            given = field.get_default(call_default_factory=True)
            default = f"leave it out for its default, {given!r}"
            if _allows_none(field.annotation):
                default = f"null for none, or {default}"
            raise ValueError(f"must not be empty ({default}) (got {v!r})")
        return v

    @field_validator("*", mode="after", check_fields=False)
    @classmethod
    def _int64(cls, v: Any) -> Any:
        for x in v if isinstance(v, tuple) else (v,):
            if type(x) is int and not -INT64_MAX - 1 <= x <= INT64_MAX:
                raise ValueError(f"must be an integer in [{-INT64_MAX - 1}, {INT64_MAX}] (got {x})")
        return v
