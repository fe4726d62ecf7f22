"""``Params``, the whole params.yaml as one frozen model, and what is derived from it: the
flat view, the experiment's name and folder, and the numerics mode in force."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import model_validator

from fedcore import numerics
from fedcore.errors import mask_credentials
from tasks.config.base import Section
from tasks.config.operations import ReportSection, RuntimeSection, StorageSection, TrackingSection
from tasks.config.privacy import PrivacySection
from tasks.config.registered import GridSection, ModelSection, PartitionSection
from tasks.config.sections import (
    AUTO_NAME,
    ClientSection,
    DataSection,
    ExperimentSection,
    FederationSection,
    PersonalizeSection,
    PretrainSection,
    ScheduleSection,
    ValidationSection,
)

# Sections whose null means a mechanism is off (privacy): the flat view leaves them out, so
# a run without the mechanism has the flat params, results key and record key it had before
# the section existed.
OFF_WHEN_NULL = ("privacy",)


class Params(Section):
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
    privacy: PrivacySection | None = None  # null: no privacy mechanism
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

        dumped = self.model_dump(mode="json")
        for name in OFF_WHEN_NULL:  # off: not in the view (the view of a run before it existed)
            if dumped.get(name) is None:
                dumped.pop(name, None)
        walk("", dumped)
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


# Parameters that cannot change a run's numbers: where outputs go, tracking, storage,
# validation, the report, scale-out and checkpointing itself. Everything else counts.
NEUTRAL = (
    "experiment.name",
    "experiment.reports_dir",
    "runtime.workers",
    "runtime.tracking",
    "runtime.task_runner",
    "runtime.dask_",
    "runtime.ray_",
    "runtime.clients",  # Ray actors or local workers: the same bytes (tests/test_ray_clients.py)
    "runtime.checkpoint_every",
    "runtime.resume",
    "runtime.allow_divergence",
    "storage.",
    "report.",
    "tracking.",
    "validation.",
)


def significant(flat: dict[str, Any], neutral: tuple[str, ...] = NEUTRAL) -> dict[str, Any]:
    """The flat params whose keys start with none of ``neutral``."""
    return {k: v for k, v in flat.items() if not k.startswith(neutral)}
