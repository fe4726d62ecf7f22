"""params.yaml -> frozen, validated configuration, parsed once at the flow edge.

The options of each registry entry (``grid.algorithm_options.<algorithm>``,
``grid.adapter_options.<method>``, ``partition.<scheme>``, ``model.options``) are typed by the
entry's own frozen options dataclass (``fedcore.options``), embedded in :class:`Params`, so the
whole file goes through one pydantic validation and tasks receive typed objects.

Errors come out as one line (``fedcore.options.describe``) naming the file, the YAML line, the
dotted key and what is allowed, e.g.
``params.yaml:14: federation.rounds: must be greater than or equal to 1 (got 0)``.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
    model_serializer,
    model_validator,
)

from fedcore import numerics
from fedcore.algorithms import ALGORITHMS, FederatedAlgorithm, build_algorithm
from fedcore.errors import ConfigError, UnknownNameError, mask_credentials
from fedcore.options import describe, fields_at, location
from fedcore.partition import PARTITIONERS, scheme_options_type
from models.adapters import ADAPTER_METHODS, AdapterMethod, get_adapter
from models.registry import list_models, model_options_type
from tasks.yamlfile import apply_overrides, read_mapping, where

DEFAULT_PARAMS = Path("params.yaml")


INT64_MAX = 2**63 - 1  # every integer in the params fits a signed 64-bit integer
MAX_SEED = 2**32 - 1  # experiment.seed(s): seeds derive further seeds (seed x 1000 + epoch)
MAX_ROUNDS = 100_000  # federation.rounds: a sanity bound (records and metrics per round)
MAX_PROCESSES = 1024  # runtime.workers, threads, dask_workers, ray_workers: a sanity bound


class _Section(BaseModel):
    # Floats are finite (.inf, .nan refused); integers fit int64 (numpy and torch take them).
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    @field_validator("*", mode="after", check_fields=False)
    @classmethod
    def _int64(cls, v: Any) -> Any:
        for x in v if isinstance(v, tuple) else (v,):
            if type(x) is int and not -INT64_MAX - 1 <= x <= INT64_MAX:
                raise ValueError(f"must be an integer in [{-INT64_MAX - 1}, {INT64_MAX}] (got {x})")
        return v


AUTO_NAME = "auto"  # experiment.name absent, null or "auto": derived by Params (derived_name)
_SEEDS = (
    f"must be a list of distinct seeds >= 0 (at most {MAX_SEED}), e.g. [0, 1, 2, 3, 4], or "
    "null for experiment.seed alone"
)


class ExperimentSection(_Section):
    # reports/<name>/ and the MLflow experiment; absent/null/auto: derived from the params
    name: str = Field(AUTO_NAME, min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    seed: int = Field(0, ge=0, le=MAX_SEED)
    reports_dir: str = "reports"
    # A seed sweep (tasks/sweep.py): every grid cell once per seed, reported as mean +- std;
    # null: experiment.seed alone. In a sweep, seed (absent: the smallest of seeds) is the one
    # `fedapt partition` and the DVC stages use, so it must be one of them.
    seeds: tuple[int, ...] | None = None

    @field_validator("name", mode="before")
    @classmethod
    def _absent(cls, v: Any) -> Any:
        return AUTO_NAME if v is None else v

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


class DataSection(_Section):
    dataset: str = "fashion_mnist"
    root: str = "data/raw"
    train_subset: int | None = Field(None, ge=1)  # a seeded random subset of the train split
    test_subset: int | None = Field(None, ge=1)
    download: bool = True
    # Fair tuning (tasks/data.py, validation_split): a seeded fraction of the train_subset
    # rows held out of every client shard; evaluate: which split the run is evaluated on.
    validation: float = Field(0.0, ge=0.0, lt=0.5)
    evaluate: Literal["test", "validation"] = "test"

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


class _ByName(_Section):
    """One optional, typed options entry per registered name; dumps only the entries given."""

    @model_serializer(mode="wrap")
    def _given(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None}

    def given(self, name: str) -> Any | None:
        return getattr(self, name, None)


def _registered(kind: str, registry: Iterable[str], *names: str) -> None:
    """The error listing the registered names, for a name that is not one of them."""
    for name in names:
        if name not in registry:
            raise ValueError(str(UnknownNameError(kind, name, registry)))


def _by_name(model: str, entries: Mapping[str, type[Any]], base: type[BaseModel] = _ByName) -> Any:
    fields: dict[str, Any] = {name: (cls | None, None) for name, cls in sorted(entries.items())}
    return create_model(model, __base__=base, **fields)


AlgorithmOptions = _by_name("AlgorithmOptions", ALGORITHMS)
AdapterOptions = _by_name("AdapterOptions", {n: c.Options for n, c in ADAPTER_METHODS.items()})
_SchemeOptions = _by_name("SchemeOptions", {s: scheme_options_type(s) for s in PARTITIONERS})


class PartitionSection(_SchemeOptions):  # type: ignore[misc,valid-type]
    """``scheme`` and ``num_clients``, plus one sub-section of options per scheme.

    Options live under the scheme's own name (``partition.dirichlet_classwise.beta``), so
    switching ``scheme`` never leaves another scheme's options in the way; every scheme's
    section is checked, the selected one's used.
    """

    scheme: str = "dirichlet_classwise"
    num_clients: int = Field(10, ge=1)

    @field_validator("scheme")
    @classmethod
    def _known(cls, v: str) -> str:
        _registered("partition scheme", PARTITIONERS, v)
        return v

    @property
    def options(self) -> Any:
        """The typed options of the selected scheme (its defaults when none are given)."""
        return self.given(self.scheme) or scheme_options_type(self.scheme)()


class ModelSection(_Section):
    name: str = "cifar_cnn"
    # the backbone's typed options (models.registry.model_options_type(name))
    options: Any = Field(None, validate_default=True)
    # Side length fed to the backbone (images are resized per batch); null: the backbone's
    # own (resnet26 72, ImageNet-pretrained 224) or else the data's.
    input_size: int | None = Field(None, ge=1, le=1024)
    # Initial weights: none (the builder's random init) | imagenet (the model's ImageNet
    # weights: efficientnet_lite0 offline, tv_resnet* downloaded) | pretrain (the pretrain
    # stage's backbone, trained on data the federation never sees).
    base: Literal["none", "imagenet", "pretrain"] = "none"

    @field_validator("name")
    @classmethod
    def _known(cls, v: str) -> str:
        _registered("model", list_models(), v)
        return v

    @field_validator("options", mode="before")
    @classmethod
    def _typed(cls, v: Any, info: ValidationInfo) -> Any:
        if isinstance(v, Mapping) and "pretrained" in v:
            raise ValueError("set model.base (none | imagenet | pretrain) instead of pretrained")
        name = info.data.get("name")
        if name is None:  # the name was refused: that is the error to report
            return v
        kind = model_options_type(name)
        return v if isinstance(v, kind) else TypeAdapter(kind).validate_python(dict(v or {}))


class PretrainSection(_Section):
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

    @field_validator("classes")
    @classmethod
    def _some_classes(cls, v: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if v is not None and (not v or min(v) < 0):
            raise ValueError("classes are label ids >= 0, e.g. [5, 6, 7, 8, 9], or null for all")
        return None if v is None else tuple(sorted(set(v)))


class FederationSection(_Section):
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
        }
        return {k: v for k, v in handler(self).items() if k not in defaults or v != defaults[k]}


class ClientSection(_Section):
    lr: float = Field(0.05, gt=0.0)
    momentum: float = Field(0.9, ge=0.0, lt=1.0)
    weight_decay: float = Field(5e-4, ge=0.0)
    local_epochs: int = Field(1, ge=1)
    batch_size: int = Field(32, ge=1)
    max_steps: int | None = Field(None, ge=1)
    # sgd: momentum + weight_decay; adamw: torch.optim.AdamW (betas 0.9/0.999, decoupled
    # weight_decay, momentum unused), fresh optimiser state every round
    optimizer: Literal["sgd", "adamw"] = "sgd"


class ScheduleSection(_Section):
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


class _Cells(dict[str, float]):
    """grid.client_lr as validated: a dict that hashes, so Params stays hashable (never
    changed after validation)."""

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(sorted(self.items())))


class GridSection(_Section):
    algorithms: tuple[str, ...] = ("fedavg",)
    adapters: tuple[str, ...] = ("full",)
    # per algorithm, e.g. {fedprox: {mu: 0.1}}: each typed by the algorithm's own dataclass
    algorithm_options: AlgorithmOptions = AlgorithmOptions()  # type: ignore[valid-type]
    # per adapter method, e.g. {lora: {r: 8, alpha: 16}}: typed by the method's Options
    adapter_options: AdapterOptions = AdapterOptions()  # type: ignore[valid-type]
    # per grid cell <algorithm>-<adapter>, e.g. {fedavg-lora: 0.01}: the client lr that cell
    # trains at instead of client.lr (lr_schedule applies to it); a cell not named: client.lr
    client_lr: dict[str, Annotated[float, Field(gt=0.0)]] = Field(default_factory=_Cells)

    @field_validator("algorithms", "adapters")
    @classmethod
    def _known(cls, v: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
        kind, registry = (
            ("algorithm", ALGORITHMS)
            if info.field_name == "algorithms"
            else ("adapter method", ADAPTER_METHODS)
        )
        if not v:
            raise ValueError(f"name at least one {kind}; allowed: {', '.join(sorted(registry))}")
        _registered(kind, registry, *v)
        twice = sorted({x for x in v if v.count(x) > 1})
        if twice:  # each cell would train twice into one folder
            raise ValueError(f"names {', '.join(twice)} more than once; list each {kind} once")
        return v

    @field_validator("client_lr")
    @classmethod
    def _cells(cls, v: dict[str, float], info: ValidationInfo) -> dict[str, float]:
        algorithms, adapters = info.data.get("algorithms"), info.data.get("adapters")
        if algorithms is None or adapters is None:  # refused already: that is the error
            return v
        cells = [f"{a}-{d}" for a in algorithms for d in adapters]
        for key in v:
            if key not in cells:
                raise ValueError(
                    f"{key!r} is not a cell of the grid (<algorithm>-<adapter>); "
                    f"cells: {', '.join(cells)}"
                )
        return _Cells(sorted(v.items()))

    @model_serializer(mode="wrap")
    def _lr_set_only(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """client_lr is dumped only when it names a cell: params and reports without it
        stay as they were."""
        return {k: v for k, v in handler(self).items() if k != "client_lr" or v}

    def lr(self, algorithm: str, adapter: str, default: float) -> float:
        """The client lr of cell ``algorithm``-``adapter``: its client_lr, else ``default``
        (client.lr)."""
        return self.client_lr.get(f"{algorithm}-{adapter}", default)

    def algorithm(self, name: str) -> FederatedAlgorithm:
        """A fresh algorithm ``name`` with its typed options (server state of its own)."""
        return build_algorithm(name, self.algorithm_options.given(name))

    def adapter(self, name: str) -> AdapterMethod:
        """Adapter method ``name`` with its typed options."""
        return get_adapter(name, self.adapter_options.given(name))


class PersonalizeSection(_Section):
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


class ValidationSection(_Section):
    min_shard_size: int = Field(1, ge=1)  # every client shard must hold at least this many


class StorageSection(_Section):
    """S3-compatible copy of the experiment's outputs (endpoint/credentials from AWS_* env)."""

    bucket: str | None = Field(None, pattern=r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
    prefix: str = "fedapt"


class ReportSection(_Section):
    """The grid's communication-cost report (seed 004 Tables 6.4-6.7, seed 001 Table 6)."""

    accuracy_levels: tuple[float, ...] = (0.5, 0.6, 0.7, 0.75, 0.8, 0.85)
    baseline: str | None = None  # a grid cell "algorithm-adapter"; null: fedavg's first cell
    style: Literal["seed004", "seed001"] = "seed004"
    # The accuracy a level is compared with (fedcore/commcost.py): "mean", seed 004 §6.1.5's
    # ACC, the mean test accuracy of the last `window` evaluated rounds; "round", the round's
    # own accuracy (seed 001 Table 6).
    accuracy: Literal["mean", "round"] = "mean"
    window: int = Field(30, ge=1)

    @field_validator("accuracy_levels")
    @classmethod
    def _fractions(cls, v: tuple[float, ...]) -> tuple[float, ...]:
        if not v or any(not 0.0 < x <= 1.0 for x in v):
            raise ValueError("accuracy levels are fractions in (0, 1], e.g. [0.7, 0.8]")
        return tuple(sorted(set(v)))


class RuntimeSection(_Section):
    device: Literal["auto", "cpu", "cuda"] = "auto"
    workers: int | Literal["auto"] = "auto"  # CPU worker processes (0: in this process)
    # How a round's clients train: one after another ("sequential", the reference), or as one
    # batched computation ("cohort", fedcore.cohort); auto: whichever docs/performance.md
    # measured faster for this device and adapter method.
    engine: Literal["auto", "cohort", "sequential"] = "auto"
    cohort_size: int | Literal["auto"] = "auto"  # clients per cohort (auto: what memory holds)
    tracking: bool = True  # MLflow runs + model registry (MLFLOW_TRACKING_URI or mlruns/)
    # Where the grid's training tasks run: "thread" (this process, one cell at a time),
    # "dask" (prefect-dask: the cluster at dask_address, or a LocalCluster of dask_workers) or
    # "ray" (prefect-ray: the cluster at ray_address, or a local Ray of ray_workers CPUs).
    task_runner: Literal["thread", "dask", "ray"] = "thread"
    dask_address: str | None = None  # e.g. tcp://10.0.0.5:8786; null = start a LocalCluster
    dask_workers: int = Field(
        2, ge=1, le=MAX_PROCESSES
    )  # LocalCluster size (one single-thread worker process each)
    ray_address: str | None = None  # e.g. ray://10.0.0.5:10001 or auto; null = a local Ray
    ray_workers: int = Field(
        2, ge=1, le=MAX_PROCESSES
    )  # local Ray: CPUs, so cells trained at once (one CPU each)
    # GPUs each training task requests on Ray (Ray shows a task only the GPUs it requested);
    # auto: 1 when the cells may use one (device cuda or auto) and a node has one, else 0.
    ray_gpus: float | Literal["auto"] = "auto"
    # Round checkpoints (tasks/checkpoint.py): every N rounds, 0 never, auto: after any round
    # that ends 5 s or more after the last checkpoint (so every round of a slow run).
    checkpoint_every: int | Literal["auto"] = "auto"
    resume: bool = True  # a rerun continues from the cell's checkpoint (false: start over)
    # A diverged run (every update rejected as non-finite, or a non-finite test loss) exits
    # with code 3 after writing its outputs; true: exit 0 (the warning is printed either way).
    allow_divergence: bool = False
    # Which CPU kernels compute (fedcore/numerics.py): portable gives the same bytes on every
    # x86-64 CPU with AVX2 (ATen at AVX2, oneDNN and NNPACK off, MKL's COMPATIBLE branch,
    # fixed threads); native lets each machine pick its fastest (exact on that machine only).
    # auto: portable in the DVC stages and `fedapt reproduce`, native in `fedapt run` and
    # deployments, or the mode of FEDAPT_NUMERICS when set (fedcore.numerics.resolve).
    numerics: Literal["auto", "portable", "native"] = "auto"
    # Intra-op threads of a process that computes outside the single-thread client workers
    # (cohort engine, pretraining); auto: 2 in portable numerics (results depend on it), the
    # library's default (the machine's cores) in native numerics.
    threads: int | Literal["auto"] = "auto"

    @field_validator("workers", "cohort_size", "threads")
    @classmethod
    def _auto_or_count(cls, v: int | str, info: ValidationInfo) -> int | str:
        least, what = {
            "workers": (0, "worker processes"),
            "cohort_size": (1, "clients"),
            "threads": (1, "threads"),
        }[str(info.field_name)]
        most = None if info.field_name == "cohort_size" else MAX_PROCESSES
        if not isinstance(v, str) and (v < least or (most is not None and v > most)):
            within = f">= {least}" if most is None else f"in [{least}, {most}]"
            raise ValueError(f"{info.field_name} is auto or a number of {what} {within}")
        return v

    @field_validator("ray_gpus")
    @classmethod
    def _gpus(cls, v: float | str) -> float | str:
        if not isinstance(v, str) and v < 0:
            raise ValueError("ray_gpus is auto or a number of GPUs >= 0 (0.5: two cells share one)")
        return v

    @field_validator("checkpoint_every")
    @classmethod
    def _rounds(cls, v: int | str) -> int | str:
        if not isinstance(v, str) and v < 0:
            raise ValueError("checkpoint_every is auto, 0 (never) or a number of rounds >= 1")
        return v


with warnings.catch_warnings():
    # ``tracking.register`` (the documented key) shadows BaseModel.register, the ABC
    # registration hook, which nothing calls on a params section.
    warnings.filterwarnings("ignore", message='Field name "register"', category=UserWarning)

    class TrackingSection(_Section):
        # Which final models enter the MLflow model registry: "auto" those evaluated on the whole
        # test split (a run on data.test_subset is tracked but not registered), "always", "never".
        # A registered version is the alias challenger; champion moves to it only when it beats
        # the champion on the same evaluation set (docs/operations.md, "The model registry").
        register: Literal["auto", "always", "never"] = "auto"


class Params(_Section):
    experiment: ExperimentSection = ExperimentSection()
    data: DataSection = DataSection()
    partition: PartitionSection = PartitionSection()
    model: ModelSection = ModelSection()
    pretrain: PretrainSection = PretrainSection()
    federation: FederationSection = FederationSection()
    client: ClientSection = ClientSection()
    lr_schedule: ScheduleSection = ScheduleSection()
    grid: GridSection = GridSection()
    personalize: PersonalizeSection = PersonalizeSection()
    validation: ValidationSection = ValidationSection()
    storage: StorageSection = StorageSection()
    runtime: RuntimeSection = RuntimeSection()
    report: ReportSection = ReportSection()
    tracking: TrackingSection = TrackingSection()

    def flat(self) -> dict[str, Any]:
        """Dotted-key view (for tracking params and the run summary); a password in a URI
        value (``runtime.dask_address``, ``ray_address``) is masked."""
        out: dict[str, Any] = {}

        def walk(prefix: str, value: Any) -> None:
            if isinstance(value, dict) and value:
                for k, v in value.items():
                    walk(f"{prefix}.{k}" if prefix else str(k), v)
            elif isinstance(value, str):
                out[prefix] = mask_credentials(value)
            else:
                out[prefix] = list(value) if isinstance(value, tuple) else value

        walk("", self.model_dump(mode="json"))
        return out

    @model_validator(mode="after")
    def _name(self) -> Params:
        if self.experiment.name == AUTO_NAME:  # frozen: set once, here, before anyone reads it
            named = self.experiment.model_copy(update={"name": derived_name(self)})
            object.__setattr__(self, "experiment", named)
        return self


# partition.scheme -> (tag, the option in the name): dirichlet_classwise beta 0.5 -> "dir05"
_SCHEME_TAGS: dict[str, tuple[str, str | None]] = {
    "iid": ("iid", None),
    "dirichlet_classwise": ("dir", "beta"),
    "dirichlet_clientwise": ("dirc", "alpha"),
    "labels_per_client": ("lpc", "m"),
    "gaussian_noise": ("noise", "sigma"),
    "quantity_normal": ("qn", "rel_std"),
    "quantity_dirichlet": ("qdir", "beta"),
    "natural": ("nat", None),
}
MAX_NAME = 96


def derived_name(params: Params) -> str:
    """The name of an experiment given no ``experiment.name``:
    ``<dataset>-<model>-<scheme tag><option>n<clients>-<algorithms>-<adapters>``, lists joined
    with ``.``, e.g. ``fashion_mnist-efficientnet_lite0-dir05n10-fedavg-full``. Numbers drop
    their point (0.5 -> 05, 1.0 -> 1); a name over MAX_NAME characters is cut and ends with 8
    hex digits of the full name's sha256, so two grids never share a directory."""
    import hashlib

    tag, key = _SCHEME_TAGS.get(params.partition.scheme, (params.partition.scheme, None))
    if key is not None:
        value = getattr(params.partition.options, key)
        tag += f"{value:g}".replace(".", "").replace("-", "m")
    parts = [
        params.data.dataset,
        params.model.name,
        f"{tag}n{params.partition.num_clients}",
        ".".join(params.grid.algorithms),
        ".".join(params.grid.adapters),
    ]
    name = "-".join(parts)
    if len(name) > MAX_NAME:
        digest = hashlib.sha256(name.encode()).hexdigest()[:8]
        name = f"{name[: MAX_NAME - 9]}-{digest}"
    return name


def experiment_dir(params: Params) -> Path:
    """Where a run of the experiment writes its outputs: reports_dir/name."""
    return Path(params.experiment.reports_dir) / params.experiment.name


# ---- loading ------------------------------------------------------------------------------


def _one_line(err: ValidationError, source: str, text: str, data: dict[str, Any]) -> str:
    """fedcore.options' one error line, prefixed with the file and the YAML line."""

    def sections(loc: tuple[Any, ...]) -> list[str]:
        if loc[:2] == ("model", "options"):  # typed by model.name, at run time
            name = (data.get("model") or {}).get("name", ModelSection().name)
            return fields_at(model_options_type(name), loc[2:]) if name in list_models() else []
        return fields_at(Params, loc)

    place = where(source, text, location(err.errors()[0]))
    return f"{place}: {describe(err, Params, sections=sections)}"


def in_force(params: Params, default: str) -> Params:
    """Put the run's numerics in force in this process (``fedcore.numerics.apply``, before
    anything computes) and return ``params`` naming the mode ``auto`` resolved to (``default``
    unless this process already runs one), so every task and record sees the mode itself."""
    params = resolved(params, default)
    numerics.apply(params.runtime.numerics, params.runtime.threads)
    return params


def resolved(params: Params, default: str) -> Params:
    """``params`` naming the numerics mode that ``auto`` resolves to (nothing applied)."""
    mode = numerics.resolve(params.runtime.numerics, default)
    if mode == params.runtime.numerics:
        return params
    runtime = params.runtime.model_copy(update={"numerics": mode})
    return params.model_copy(update={"runtime": runtime})


def from_flat(flat: Mapping[str, Any]) -> Params | None:
    """The Params of a flat view (``Params.flat``, e.g. a summary's ``params``); None when it
    does not validate (written by another fedapt version)."""
    nested: dict[str, Any] = {}
    for key, value in flat.items():
        *parents, last = key.split(".")
        node = nested
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                return None
        node[last] = value
    try:
        return Params.model_validate(nested)
    except (ValidationError, ValueError, TypeError):
        return None


def load_params(path: str | Path | None = None, overrides: list[str] | None = None) -> Params:
    """Read params.yaml (or only defaults when ``path`` is None and none exists)."""
    source = str(path or DEFAULT_PARAMS)
    text, raw = "", {}
    if path is not None or Path(source).exists():
        if not Path(source).exists():
            raise ConfigError(f"params file {source} not found")
        text, raw = read_mapping(source)
    data = apply_overrides(raw, overrides or [], Params.model_fields)
    try:
        return Params.model_validate(data)
    except ValidationError as err:
        label = source if not overrides else f"{source} (with --set)"
        raise ConfigError(_one_line(err, label, text, data)) from None
