"""The base of every params section and the bounds the sections share."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator

INT64_MAX = 2**63 - 1  # every integer in the params fits a signed 64-bit integer
MAX_SEED = 2**32 - 1  # experiment.seed(s): seeds derive further seeds (seed x 1000 + epoch)
MAX_ROUNDS = 100_000  # federation.rounds: a sanity bound (records and metrics per round)
MAX_PROCESSES = 1024  # runtime.workers, threads, dask_workers, ray_workers: a sanity bound


class Section(BaseModel):
    # Floats are finite (.inf, .nan refused); integers fit int64 (numpy and torch take them).
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    @field_validator("*", mode="after", check_fields=False)
    @classmethod
    def _int64(cls, v: Any) -> Any:
        for x in v if isinstance(v, tuple) else (v,):
            if type(x) is int and not -INT64_MAX - 1 <= x <= INT64_MAX:
                raise ValueError(f"must be an integer in [{-INT64_MAX - 1}, {INT64_MAX}] (got {x})")
        return v
