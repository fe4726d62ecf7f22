"""The sections of what is trained: experiment, data, pretrain, federation, client,
lr_schedule, personalize and validation (their keys, defaults and bounds)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import (
    Field,
    SerializerFunctionWrapHandler,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from tasks.config.base import MAX_ROUNDS, MAX_SEED, Section

AUTO_NAME = "auto"  # experiment.name absent, null or "auto": derived by Params (derived_name)
# experiment.name is a folder under reports_dir (and <name>-v<k>): well within a file name's
# 255 bytes, and what an MLflow experiment's name holds
MAX_GIVEN_NAME = 200
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_SEEDS = (
    f"must be a list of distinct seeds >= 0 (at most {MAX_SEED}), e.g. [0, 1, 2, 3, 4], or "
    "null for experiment.seed alone"
)


class ExperimentSection(Section):
    # reports/<name>/ and the MLflow experiment; absent/null/auto: derived from the params
    name: str = AUTO_NAME
    seed: int = Field(0, ge=0, le=MAX_SEED)
    reports_dir: str = "reports"
    # A seed sweep (tasks/training/sweep.py): every grid cell once per seed, reported as mean +- std;
    # null: experiment.seed alone. In a sweep, seed (absent: the smallest of seeds) is the one
    # `fedapt partition` and the DVC stages use, so it must be one of them.
    seeds: tuple[int, ...] | None = None

    @field_validator("name", mode="before")
    @classmethod
    def _absent(cls, v: Any) -> Any:
        return AUTO_NAME if v is None else v

    @field_validator("name")
    @classmethod
    def _a_folder_name(cls, v: str) -> str:
        if len(v) > MAX_GIVEN_NAME or not _NAME.fullmatch(v):
            shown = repr(v) if len(v) <= 60 else f"{v[:40]!r}... ({len(v)} characters)"
            raise ValueError(
                f"a folder name: letters, digits, '.', '_' and '-', starting with a letter or "
                f"digit, at most {MAX_GIVEN_NAME} characters, or auto (derived from the "
                f"params) (got {shown})"
            )
        return v

    @model_validator(mode="before")
    @classmethod
    def _sweep_seed(cls, data: Any) -> Any:
        """In a sweep, an absent or null ``seed`` is the smallest of ``seeds``."""
        if isinstance(data, Mapping) and data.get("seed") is None:
            seeds = data.get("seeds")
            if isinstance(seeds, list | tuple) and seeds and all(type(s) is int for s in seeds):
                return {**data, "seed": min(seeds)}
        return data

    @field_validator("seeds", mode="before")
    @classmethod
    def _a_list(cls, v: Any) -> Any:
        if v is not None and not isinstance(v, list | tuple):
            raise ValueError(f"{_SEEDS} (got {v!r})")
        return v

    @field_validator("seeds")
    @classmethod
    def _sweep(cls, v: tuple[int, ...] | None, info: ValidationInfo) -> tuple[int, ...] | None:
        if v is None:
            return v
        if not v or min(v) < 0 or max(v) > MAX_SEED or len(set(v)) != len(v):
            raise ValueError(f"{_SEEDS} (got {list(v)})")
        seed = info.data.get("seed")
        if seed is not None and seed not in v:
            raise ValueError(
                f"experiment.seed {seed} is not one of the seeds {sorted(v)} (in a sweep, seed "
                f"is what fedapt partition and the DVC stages run): add {seed} to seeds, or set "
                "experiment.seed to one of them or to null"
            )
        return tuple(sorted(v))  # the order of the list never changes a result

    @model_serializer(mode="wrap")
    def _sweep_only(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """``seeds`` is dumped only in a sweep: single-seed params, fingerprints and reports
        stay as they were."""
        return {k: v for k, v in handler(self).items() if k != "seeds" or v is not None}


def known_dataset(name: str) -> str:
    """``name`` if a dataset of that name is registered (``fedcore.datasets.DATASETS``): an
    unknown one is refused when the params load, not when a stage first reads data (a
    pretrain source was read only with model.base: pretrain, and otherwise ignored)."""
    from fedcore.datasets import DATASETS
    from fedcore.errors import UnknownNameError

    if name not in DATASETS:
        raise ValueError(str(UnknownNameError("dataset", name, DATASETS)))
    return name


class DataSection(Section):
    dataset: str = "fashion_mnist"
    root: str = "data/raw"
    train_subset: int | None = Field(None, ge=1)  # a seeded random subset of the train split
    test_subset: int | None = Field(None, ge=1)
    download: bool = True
    # Fair tuning (tasks/data/experiment.py, validation_split): a seeded fraction of the train_subset
    # rows held out of every client shard; evaluate: which split the run is evaluated on.
    validation: float = Field(0.0, ge=0.0, lt=0.5)
    evaluate: Literal["test", "validation"] = "test"

    @field_validator("dataset")
    @classmethod
    def _known(cls, v: str) -> str:
        return known_dataset(v)

    @field_validator("evaluate")
    @classmethod
    def _split_exists(cls, v: str, info: ValidationInfo) -> str:
        if v == "validation" and info.data.get("validation") == 0.0:
            raise ValueError(
                "validation needs a validation split, but data.validation is 0 (no rows held "
                "out): set data.validation to a fraction in (0, 0.5), e.g. 0.1, or "
                "data.evaluate: test"
            )
        return v

    @model_serializer(mode="wrap")
    def _set_only(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """validation and evaluate are dumped only when set: the params, fingerprints and
        reports of runs without a validation split stay as they were."""
        defaults = {"validation": 0.0, "evaluate": "test"}
        return {k: v for k, v in handler(self).items() if k not in defaults or v != defaults[k]}


class PretrainSection(Section):
    """Central training of the frozen base (model.base: pretrain) on a source the federation
    never sees: training rows outside the FL subset, optionally only some classes, or another
    dataset (a source domain, as Rebuffi's domain-agnostic base in seed 000)."""

    dataset: str | None = None  # null: data.dataset (rows outside data.train_subset)
    classes: tuple[int, ...] | None = None  # source classes to train on; null: all
    max_samples: int | None = Field(12000, ge=1)  # seeded subset of the source rows
    epochs: int = Field(2, ge=1)
    lr: float = Field(0.05, gt=0.0)
    momentum: float = Field(0.9, ge=0.0, lt=1.0)
    weight_decay: float = Field(5e-4, ge=0.0)
    batch_size: int = Field(64, ge=1)

    @field_validator("dataset")
    @classmethod
    def _known(cls, v: str | None) -> str | None:
        return None if v is None else known_dataset(v)

    @field_validator("classes")
    @classmethod
    def _some_classes(cls, v: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if v is not None and (not v or min(v) < 0):
            raise ValueError("classes are label ids >= 0, e.g. [5, 6, 7, 8, 9], or null for all")
        return None if v is None else tuple(sorted(set(v)))


class FederationSection(Section):
    rounds: int = Field(20, ge=1, le=MAX_ROUNDS)
    participation: float = Field(1.0, gt=0.0, le=1.0)
    sampling: Literal["without_replacement", "with_replacement"] = "without_replacement"
    eval_every: int = Field(1, ge=1)
    last_rounds: int = Field(5, ge=1)
    # Clients that may not report (docs/accounting.md, "Dropout and stragglers"): a sampled
    # client fails to report with probability dropout; availability_concentration k (null:
    # the same for all) draws each client's report probability from Beta(k(1-d), k d).
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    availability_concentration: float | None = Field(None, gt=0.0)
    # A client whose local steps exceed deadline_steps x its speed (exp(speed_spread z) per
    # client; 0: all 1) is a straggler: dropped, or its update cut there (partial).
    deadline_steps: int | None = Field(None, ge=1)
    speed_spread: float = Field(0.0, ge=0.0)
    stragglers: Literal["drop", "partial"] = "drop"
    # Train only rounds 1..stop_after of this run (its schedules still read rounds), e.g. to
    # check a record: ``fedapt reproduce --revalidate``.
    stop_after: int | None = Field(None, ge=1)
    # The last whole_test_last evaluations measure the whole test split, the others its
    # data.test_subset rows: a reproduction's verdict window (the mean of its last k
    # evaluations) on every test image, its curve on a cheaper subset. 0: the subset always.
    whole_test_last: int = Field(0, ge=0)

    @model_validator(mode="after")
    def _stop_within_rounds(self) -> FederationSection:
        if self.stop_after is not None and self.stop_after > self.rounds:
            raise ValueError(
                f"stop_after must be <= rounds ({self.rounds}) (got {self.stop_after})"
            )
        return self

    @model_serializer(mode="wrap")
    def _set_only(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """The dropout and stop_after keys are dumped only when set: the params, fingerprints
        and reports of configurations without them stay as they were."""
        defaults = {
            "dropout": 0.0,
            "availability_concentration": None,
            "deadline_steps": None,
            "speed_spread": 0.0,
            "stragglers": "drop",
            "stop_after": None,
            "whole_test_last": 0,
        }
        return {k: v for k, v in handler(self).items() if k not in defaults or v != defaults[k]}


class ClientSection(Section):
    lr: float = Field(0.05, gt=0.0)
    momentum: float = Field(0.9, ge=0.0, lt=1.0)
    weight_decay: float = Field(5e-4, ge=0.0)
    local_epochs: int = Field(1, ge=1)
    batch_size: int = Field(32, ge=1)
    max_steps: int | None = Field(None, ge=1)
    # sgd: momentum + weight_decay; adamw: torch.optim.AdamW (betas 0.9/0.999, decoupled
    # weight_decay, momentum unused), fresh optimiser state every round
    optimizer: Literal["sgd", "adamw"] = "sgd"


class ScheduleSection(Section):
    kind: Literal["constant", "step", "exponential"] = "constant"
    gamma: float = Field(0.1, gt=0.0)
    milestones: tuple[int, ...] = ()
    decay: float = Field(0.998, gt=0.0, le=1.0)

    @field_validator("milestones")
    @classmethod
    def _positive(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if any(m < 1 for m in v):
            raise ValueError("milestones are rounds >= 1")
        return tuple(sorted(v))


class PersonalizeSection(Section):
    """After FL, every client fine-tunes on its own corrupted data (seed 001 Table 4)."""

    enabled: bool = False
    # payload: what the adapter trains (full: every parameter); client_token: the
    # Accumulator's client token only (cells of other adapters skip that scope)
    scopes: tuple[Literal["payload", "client_token"], ...] = ("payload",)
    epochs: int = Field(10, ge=1)
    lr: float = Field(0.01, gt=0.0)
    batch_size: int = Field(32, ge=1)
    severities: tuple[int, ...] = (0, 1, 2, 3, 4, 5)  # client c: severities[c % len], 0..5
    tune_fraction: float = Field(0.5, gt=0.0, lt=1.0)  # of a client's shard; the rest tests
    max_clients: int | None = Field(None, ge=1)  # the first N clients (null: all)

    @field_validator("severities")
    @classmethod
    def _severities(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if not v or any(not 0 <= s <= 5 for s in v):
            raise ValueError("severities are corruption levels 0..5, e.g. [0, 2, 4]")
        return v

    @field_validator("scopes")
    @classmethod
    def _scopes(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if not v:
            raise ValueError("name at least one scope: payload, client_token")
        return tuple(dict.fromkeys(v))


class ValidationSection(Section):
    min_shard_size: int = Field(1, ge=1)  # every client shard must hold at least this many
