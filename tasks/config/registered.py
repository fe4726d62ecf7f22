"""The sections whose entries are registry names, each with typed options: partition
(schemes), model (backbones) and grid (algorithms, adapter methods and the cells' client lr).

The options of each registry entry (``grid.algorithm_options.<algorithm>``,
``grid.adapter_options.<method>``, ``partition.<scheme>``, ``model.options``) are typed by the
entry's own frozen options dataclass (``fedcore.options``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    Field,
    SerializerFunctionWrapHandler,
    TypeAdapter,
    ValidationInfo,
    create_model,
    field_validator,
    model_serializer,
)

from fedcore.algorithms import ALGORITHMS, FederatedAlgorithm, build_algorithm
from fedcore.codecs import BUILTIN, Codecs, make_codec
from fedcore.errors import ConfigError, UnknownNameError
from fedcore.partition import PARTITIONERS, scheme_options_type
from models.adapters import ADAPTER_METHODS, AdapterMethod, get_adapter
from models.registry import list_models, model_options_type
from tasks.config.base import Section


class _ByName(Section):
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


class ModelSection(Section):
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
        if isinstance(v, kind):
            return v
        if v is not None and not isinstance(v, Mapping):
            raise ValueError(f"must be a mapping of {name}'s options (got {v!r})")
        return TypeAdapter(kind).validate_python(dict(v or {}))


class _Cells(dict[str, float]):
    """grid.client_lr as validated: a dict that hashes, so Params stays hashable (never
    changed after validation)."""

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(sorted(self.items())))


class _Codecs(dict[str, dict[str, Any]]):
    """grid.codec_options as validated: a dict that hashes (never changed after validation)."""

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(repr(sorted(self.items())))


CODEC_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


class GridSection(Section):
    algorithms: tuple[str, ...] = ("fedavg",)
    adapters: tuple[str, ...] = ("full",)
    # per algorithm, e.g. {fedprox: {mu: 0.1}}: each typed by the algorithm's own dataclass
    algorithm_options: AlgorithmOptions = AlgorithmOptions()  # type: ignore[valid-type]
    # per adapter method, e.g. {lora: {r: 8, alpha: 16}}: typed by the method's Options
    adapter_options: AdapterOptions = AdapterOptions()  # type: ignore[valid-type]
    # per grid cell <algorithm>-<adapter>, e.g. {fedavg-lora: 0.01}: the client lr that cell
    # trains at instead of client.lr (lr_schedule applies to it); a cell not named: client.lr
    client_lr: dict[str, Annotated[float, Field(gt=0.0)]] = Field(default_factory=_Cells)
    # update codecs (fedcore.codecs): one cell per (algorithm, adapter, codec); "none" sends
    # float32 as the model holds it. Built in: none, fp16, bf16, int8, int4, topk; options
    # per codec, or a codec of your own: {top10: {kind: topk, fraction: 0.1}}
    codec_options: dict[str, dict[str, Any]] = Field(default_factory=_Codecs)
    codecs: tuple[str, ...] = ("none",)

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

    @field_validator("codec_options")
    @classmethod
    def _codec_options(cls, v: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        for name, options in v.items():
            if not CODEC_NAME.match(name):
                raise ValueError(
                    f"codec name {name!r}: lower-case letters, digits and _ (a cell's name "
                    "ends with it)"
                )
            if not isinstance(options, Mapping):
                raise ValueError(f"{name}: a mapping of options (got {options!r})")
            builtin = BUILTIN.get(name, {}).get("kind")
            if builtin and options.get("kind", builtin) != builtin:  # (its options would mix)
                raise ValueError(
                    f"{name}.kind: {name} is the built-in codec of kind {builtin}; a codec of "
                    f"kind {options['kind']} needs a name of its own, e.g. my_{options['kind']}"
                )
            try:
                make_codec(name, options)
            except ConfigError as e:
                raise ValueError(str(e).removeprefix("grid.codec_options.")) from None
        return _Codecs(sorted((k, dict(o)) for k, o in v.items()))

    @field_validator("codecs")
    @classmethod
    def _known_codecs(cls, v: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
        defined = info.data.get("codec_options")
        if defined is None:  # refused already: that is the error
            return v
        known = [*BUILTIN, *(n for n in defined if n not in BUILTIN)]
        if not v:
            raise ValueError(f"name at least one codec; allowed: {', '.join(known)}")
        for name in v:
            if name not in known:
                raise ValueError(
                    f"unknown codec {name!r}; allowed: {', '.join(known)} (or define it "
                    "under grid.codec_options with a kind)"
                )
        twice = sorted({x for x in v if v.count(x) > 1})
        if twice:
            raise ValueError(f"names {', '.join(twice)} more than once; list each codec once")
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
        out = {k: v for k, v in handler(self).items() if k != "client_lr" or v}
        # the codec keys only when a grid uses them: params and reports without stay as they were
        if tuple(out.get("codecs", ())) == ("none",) and not out.get("codec_options"):
            out.pop("codecs", None)
            out.pop("codec_options", None)
        return out

    def lr(self, algorithm: str, adapter: str, default: float) -> float:
        """The client lr of cell ``algorithm``-``adapter``: its client_lr, else ``default``
        (client.lr)."""
        return self.client_lr.get(f"{algorithm}-{adapter}", default)

    def codec(self, name: str) -> Codecs:
        """The codecs of grid codec ``name`` on the directions it serves."""
        return Codecs.of(make_codec(name, self.codec_options.get(name)))

    def algorithm(self, name: str) -> FederatedAlgorithm:
        """A fresh algorithm ``name`` with its typed options (server state of its own)."""
        return build_algorithm(name, self.algorithm_options.given(name))

    def adapter(self, name: str) -> AdapterMethod:
        """Adapter method ``name`` with its typed options."""
        return get_adapter(name, self.adapter_options.given(name))
