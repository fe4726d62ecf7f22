"""params.yaml -> frozen, validated configuration, parsed once at the flow edge.

Errors come out as one line naming the file, the YAML line, the dotted key and what is
allowed, e.g. ``params.yaml:14: federation.rounds: must be >= 1 (got 0)``.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from fedcore.errors import ConfigError

DEFAULT_PARAMS = Path("params.yaml")


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ExperimentSection(_Section):
    name: str = Field("fedapt", min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    seed: int = Field(0, ge=0)
    reports_dir: str = "reports"


class DataSection(_Section):
    dataset: str = "fashion_mnist"
    root: str = "data/raw"
    train_subset: int | None = Field(None, ge=1)  # a seeded random subset of the train split
    test_subset: int | None = Field(None, ge=1)
    download: bool = True


class PartitionSection(BaseModel):
    """``scheme`` and ``num_clients``, plus one sub-section of options per scheme.

    Options live under the scheme's own name (``partition.dirichlet_classwise.beta``), so
    switching ``scheme`` never leaves another scheme's options in the way.
    """

    model_config = ConfigDict(frozen=True, extra="allow")
    scheme: str = "dirichlet_classwise"
    num_clients: int = Field(10, ge=1)

    @model_validator(mode="after")
    def _sections_are_mappings(self) -> PartitionSection:
        for key, value in (self.model_extra or {}).items():
            if not isinstance(value, dict):
                raise ValueError(
                    f"partition.{key} must be a mapping: scheme options go under the "
                    f"scheme's name, e.g. partition.dirichlet_classwise.beta"
                )
        return self

    @property
    def options(self) -> dict[str, Any]:
        """The options of the selected scheme."""
        return dict((self.model_extra or {}).get(self.scheme, {}))

    @property
    def option_sections(self) -> list[str]:
        return sorted(self.model_extra or {})


class ModelSection(_Section):
    name: str = "cifar_cnn"
    options: dict[str, Any] = Field(default_factory=dict)
    # Side length fed to the backbone (images are resized per batch); null: the backbone's
    # own (resnet26 72, ImageNet-pretrained 224) or else the data's.
    input_size: int | None = Field(None, ge=1, le=1024)
    # Initial weights: none (the builder's random init) | imagenet (the model's ImageNet
    # weights: efficientnet_lite0 offline, tv_resnet* downloaded) | pretrain (the pretrain
    # stage's backbone, trained on data the federation never sees).
    base: Literal["none", "imagenet", "pretrain"] = "none"

    @field_validator("options")
    @classmethod
    def _no_pretrained_option(cls, v: dict[str, Any]) -> dict[str, Any]:
        if "pretrained" in v:
            raise ValueError("set model.base (none | imagenet | pretrain) instead of pretrained")
        return v


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
    rounds: int = Field(20, ge=1)
    participation: float = Field(1.0, gt=0.0, le=1.0)
    sampling: Literal["without_replacement", "with_replacement"] = "without_replacement"
    eval_every: int = Field(1, ge=1)
    last_rounds: int = Field(5, ge=1)


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


class GridSection(_Section):
    algorithms: tuple[str, ...] = ("fedavg",)
    adapters: tuple[str, ...] = ("full",)
    algorithm_options: dict[str, dict[str, Any]] = Field(default_factory=dict)
    # per adapter method, e.g. {lora: {r: 8, alpha: 16}}; checked by the method before the flow
    adapter_options: dict[str, dict[str, Any]] = Field(default_factory=dict)


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
    # Where the grid's training tasks run: "thread" (this process, one cell at a time) or
    # "dask" (prefect-dask: the cluster at dask_address, or a LocalCluster of dask_workers).
    task_runner: Literal["thread", "dask"] = "thread"
    dask_address: str | None = None  # e.g. tcp://10.0.0.5:8786; null = start a LocalCluster
    dask_workers: int = Field(2, ge=1)  # LocalCluster size (one single-thread worker process each)

    @field_validator("cohort_size")
    @classmethod
    def _positive(cls, v: int | str) -> int | str:
        if not isinstance(v, str) and v < 1:
            raise ValueError("cohort_size is auto or a number of clients >= 1")
        return v


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

    def flat(self) -> dict[str, Any]:
        """Dotted-key view (for tracking params and the run summary)."""
        out: dict[str, Any] = {}

        def walk(prefix: str, value: Any) -> None:
            if isinstance(value, dict) and value:
                for k, v in value.items():
                    walk(f"{prefix}.{k}" if prefix else str(k), v)
            else:
                out[prefix] = list(value) if isinstance(value, tuple) else value

        walk("", self.model_dump(mode="json"))
        return out


def experiment_dir(params: Params) -> Path:
    """Where a run of the experiment writes its outputs: reports_dir/name."""
    return Path(params.experiment.reports_dir) / params.experiment.name


# ---- loading ------------------------------------------------------------------------------


def _yaml_line(text: str, path: tuple[Any, ...]) -> int | None:
    """1-based line of the YAML node at ``path`` (or of its deepest existing parent)."""
    try:
        node = yaml.compose(text)
    except yaml.YAMLError:
        return None
    line = None
    for key in path:
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if k.value == str(key):
                    line, node = k.start_mark.line + 1, v
                    break
            else:
                return line
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            node = node.value[key]
            line = node.start_mark.line + 1
        else:
            return line
    return line


def _where(source: str, text: str, path: tuple[Any, ...]) -> str:
    line = _yaml_line(text, path) if text else None
    return f"{source}:{line}" if line else source


def _one_line(err: ValidationError, source: str, text: str) -> str:
    e = err.errors()[0]
    loc = tuple(x for x in e["loc"] if not (isinstance(x, str) and x.startswith("function-")))
    key = ".".join(str(x) for x in loc)
    if e["type"] == "extra_forbidden":
        section = _section_model(loc[:-1])
        allowed = ", ".join(section.model_fields) if section else ""
        msg = f"unknown key {key!r}; allowed: {allowed}"
    else:
        msg = f"{key}: {e['msg'].removeprefix('Value error, ')} (got {e.get('input')!r})"
    return f"{_where(source, text, loc)}: {msg}"


def _section_model(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    model: type[BaseModel] = Params
    for part in loc:
        field = model.model_fields.get(str(part))
        ann = getattr(field, "annotation", None) if field else None
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return None
        model = ann
    return model


def parse_override(item: str) -> tuple[list[str], Any]:
    """``a.b=value`` -> (["a", "b"], yaml-parsed value)."""
    if "=" not in item:
        raise ConfigError(f"--set expects key=value (got {item!r})")
    key, raw = item.split("=", 1)
    parts = [p for p in key.strip().split(".") if p]
    if not parts:
        raise ConfigError(f"--set expects key=value (got {item!r})")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return parts, value


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    data = copy.deepcopy(raw)
    for item in overrides:
        parts, value = parse_override(item)
        if parts[0] not in Params.model_fields:
            raise ConfigError(
                f"--set {'.'.join(parts)}: unknown key {parts[0]!r}; allowed: "
                + ", ".join(Params.model_fields)
            )
        node = data
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {'.'.join(parts)}: {p!r} is not a section")
        node[parts[-1]] = value
    return data


def load_params(path: str | Path | None = None, overrides: list[str] | None = None) -> Params:
    """Read params.yaml (or only defaults when ``path`` is None and none exists)."""
    source = str(path or DEFAULT_PARAMS)
    text = ""
    p = Path(source)
    if p.exists():
        text = p.read_text()
    elif path is not None:
        raise ConfigError(f"params file {source} not found")
    try:
        raw = yaml.safe_load(text) if text else {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark else source
        problem = getattr(exc, "problem", None) or "malformed YAML"
        raise ConfigError(f"{where}: malformed YAML: {problem}") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a mapping of sections at the top level")
    data = apply_overrides(raw, overrides or [])
    try:
        return Params.model_validate(data)
    except ValidationError as err:
        label = source if not overrides else f"{source} (with --set)"
        raise ConfigError(_one_line(err, label, text)) from None
