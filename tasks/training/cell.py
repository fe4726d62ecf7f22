"""A grid cell as fedcore sees it: the one place that maps typed params to the engine's
configuration (``build_simulation``), used by the training task, the DVC stage and the
benchmarks alike."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from torch import nn

from fedcore.algorithms import RunSpec
from fedcore.client import LocalConfig
from fedcore.codecs import check_sizes
from fedcore.cohort import resolve_engine
from fedcore.engine import FederationConfig, Simulation, initial_model
from fedcore.errors import ConfigError
from fedcore.events import Callback
from fedcore.partition import Partition
from fedcore.privacy.mechanisms import AdaptiveClipConfig
from fedcore.privacy.server import DpConfig, DpServer
from fedcore.schedules import LRSchedule
from models.adapters import AdapterMethod
from tasks.config import Params
from tasks.config.base import Section
from tasks.data.backbone import backbone_options, build_backbone, model_input
from tasks.data.experiment import ExperimentData
from tasks.data.partitioning import shards_of
from tasks.grid import CellSpec, ResolvedCell, grid_cells
from tasks.training.runtime import clients_per_round, ray_settings, resolve_runtime

T = TypeVar("T")


def model_factory(
    params: Params, data: ExperimentData, adapter: str = "full", base_path: str | None = None
) -> functools.partial:
    """A picklable builder of the backbone (its input as ``model_input`` says, the pretrain
    base copied in when ``base_path`` is given) with ``adapter`` injected (worker processes
    construct their own copy)."""
    info = data.train.info
    options = backbone_options(params)
    inp = model_input(params, info)
    return functools.partial(
        build_backbone,
        params.model.name,
        adapter,
        base_path,
        params.grid.adapter(adapter).options,
        num_classes=info.num_classes,
        in_channels=inp.channels,
        input_size=inp.size,
        options=options,
    )


def require_base(params: Params, base_path: str | Path | None) -> str | None:
    """The base file the cell starts from: needed exactly when ``model.base`` is pretrain."""
    if params.model.base != "pretrain":
        return None
    path = Path(base_path) if base_path else None
    if path is None or not path.is_file():
        raise ConfigError(
            f"model.base: pretrain: no pretrain base at {path or 'artifacts/pretrain/base.pt'}; "
            f"run: fedapt pretrain (or dvc repro pretrain)"
        )
    return str(path)


def check_cell(params: Params, algorithm: str, adapter: str) -> None:
    """A grid cell the algorithm refuses (its ``check`` hook; with ``privacy``, also the
    privacy settings against the federation) -> one line, before any data."""
    private = params.privacy is not None
    params.grid.algorithm(algorithm).check(
        RunSpec(adapter=adapter, optimizer=params.client.optimizer, private=private)
    )
    if private:
        check_privacy(params)


def check_privacy(params: Params) -> None:
    """The privacy settings against the federation (N clients, m per round): one line."""
    if params.federation.sampling != "without_replacement":
        raise ConfigError(
            "federation.sampling: privacy needs without_replacement (the accountant counts "
            f"each client once a round; got {params.federation.sampling})"
        )
    p = params.privacy
    assert p is not None
    n = params.partition.num_clients
    if not p.delta < 1 / n:
        raise ConfigError(
            f"privacy.delta must be < 1/N = {1 / n:.3g} for partition.num_clients={n} (a "
            f"larger delta lets the mechanism expose one client outright; got {p.delta:g})"
        )
    if p.accountant == "pld":
        raise ConfigError(
            "privacy.accountant: pld cannot account fedapt's cohorts drawn without replacement "
            "(dp-accounting's PLD has no such event); use privacy.accountant: rdp"
        )
    config = privacy_config(params)
    assert config is not None
    # the noise multiplier a target calibrates to (cached for the run), and a budget that
    # round 1 would already overspend: refused here, before any data
    DpServer(
        config, sampling="fixed", population=n, cohort=clients_per_round(params),
        rounds=params.federation.rounds, seed=params.experiment.seed,
    )  # fmt: skip


def privacy_config(params: Params) -> DpConfig | None:
    """The engine's DP settings of ``params`` (None: no privacy)."""
    p = params.privacy
    if p is None:
        return None
    adaptive = None
    if p.adaptive_clip is not None:
        a = p.adaptive_clip
        m = clients_per_round(params)
        adaptive = AdaptiveClipConfig(
            initial_clip=p.clip,
            target_quantile=a.target_quantile,
            learning_rate=a.learning_rate,
            count_stddev=a.count_stddev if a.count_stddev is not None else m / 20,
        )
    return DpConfig(
        clip=p.clip, noise_multiplier=p.noise_multiplier, target_epsilon=p.target_epsilon,
        delta=p.delta, accountant=p.accountant, adaptive_clip=adaptive,
    )  # fmt: skip


@dataclass
class Cell:
    """A cell ready to run: ``sim.run()`` trains it."""

    sim: Simulation
    method: AdapterMethod  # the adapter method, with the cell's options
    model_fn: functools.partial  # builds the adapted model (picklable)
    adapted: nn.Module  # one instance of it (sizes, payload and trainable keys)
    device: str


def engine_config(section: Section, config: type[T], **derived: Any) -> T:
    """The engine's ``config`` dataclass from a params section: the fields they share (typed
    and checked once, by ``tasks.config``), not copied key by key; ``derived``: the fields
    that come from other sections."""
    shared = {f.name for f in dataclasses.fields(config)} & set(type(section).model_fields)
    return config(**{k: getattr(section, k) for k in shared}, **derived)


def federation_config(params: Params) -> FederationConfig:
    """The engine's federation settings of ``params``."""
    return engine_config(
        params.federation,
        FederationConfig,
        clients_per_round=clients_per_round(params),
        seed=params.experiment.seed,
    )


def initial_cell_model(params: Params, data: ExperimentData, adapter: str) -> nn.Module:
    """A cell's initial global model as ``build_simulation`` builds it (seeded by the run's
    seed), without a pretrain base: built ahead by ``flows.plan.prepare``, which checks the
    adapter with it and hands it to the cell (``model.base`` other than pretrain)."""
    return initial_model(model_factory(params, data, adapter), federation_config(params))


def initial_models(
    params: Params, data: ExperimentData, built: dict[str, nn.Module]
) -> Callable[[str], nn.Module]:
    """``adapter`` -> its cells' initial model: ``built``'s, else built now
    (``initial_cell_model``) and kept in ``built``."""

    def model_of(adapter: str) -> nn.Module:
        if adapter not in built:
            built[adapter] = initial_cell_model(params, data, adapter)
        return built[adapter]

    return model_of


CellKeys = tuple[tuple[str, ...] | None, frozenset[str]]  # (payload keys, trainable keys)


def adapter_keys(params: Params, adapter: str, model: nn.Module) -> CellKeys:
    """What ``adapter``'s cells transmit (None: the whole model, full fine-tuning) and train,
    read off their initial ``model`` (the same on every seed: the structure, not the values)."""
    method = params.grid.adapter(adapter)
    return (None if adapter == "full" else method.payload_keys(model)), method.trainable_keys(model)


def resolve_cell(
    params: Params,
    spec: CellSpec,
    keys: CellKeys,
    base: str | Path | None = None,
    seed: int | None = None,
) -> ResolvedCell:
    """``spec`` resolved on ``params``: ``keys`` of its adapter (``adapter_keys``); ``base``:
    where the pretrain base is (or will be) written, kept only where ``model.base`` is
    pretrain; ``seed``: its seed in a seed sweep."""
    return ResolvedCell(
        params=params,
        spec=spec,
        lr=params.grid.lr(spec.algorithm, spec.adapter, params.client.lr),
        base=str(base) if base is not None and params.model.base == "pretrain" else None,
        payload_keys=keys[0],
        trainable_keys=keys[1],
        seed=seed,
    )


def resolve_cells(
    params: Params,
    models: Mapping[str, nn.Module],
    base: str | Path | None,
    seed: int | None = None,
    like: Sequence[ResolvedCell] = (),
) -> tuple[ResolvedCell, ...]:
    """Every grid cell of ``params`` resolved (``resolve_cell``): each adapter checked against
    the grid's codecs and its keys read off its initial model in ``models``, or (``like``: a
    sweep's first seed's cells, checked there) its keys taken from ``like``."""
    if like:
        keys = {c.adapter: (c.payload_keys, c.trainable_keys) for c in like}
    else:
        for adapter, model in models.items():
            check_codecs(params, adapter, model, params.grid.codecs)  # a top-k k above a tensor
        keys = {a: adapter_keys(params, a, m) for a, m in models.items()}
    return tuple(resolve_cell(params, s, keys[s.adapter], base, seed) for s in grid_cells(params))


def check_codecs(params: Params, adapter: str, model: nn.Module, codecs: Sequence[str]) -> None:
    """Each of ``codecs`` against what ``adapter``'s cells upload from ``model`` (a top-k k
    above a tensor's size: ``fedcore.codecs.check_sizes``)."""
    state = model.state_dict()
    if adapter != "full":
        state = {k: state[k] for k in params.grid.adapter(adapter).payload_keys(model)}
    for codec in codecs:
        check_sizes(params.grid.codec(codec).upload, state)


def cell_of(
    params: Params,
    data: ExperimentData,
    algorithm: str = "fedavg",
    adapter: str = "full",
    codec: str = "none",
    base: str | Path | None = None,
) -> ResolvedCell:
    """One cell checked and resolved on its own (what ``flows.plan.prepare`` does for a
    grid's): for benchmarks, tests and code that trains a cell outside a run."""
    check_cell(params, algorithm, adapter)
    model = initial_cell_model(params, data, adapter)
    check_codecs(params, adapter, model, [codec])
    return resolve_cell(
        params, CellSpec(algorithm, adapter, codec), adapter_keys(params, adapter, model), base
    )


def build_simulation(
    cell: ResolvedCell,
    data: ExperimentData,
    part: Partition,
    callbacks: Sequence[Callback] = (),
    model: nn.Module | None = None,
) -> Cell:
    """The Simulation of ``cell`` on ``part``, configured from its params (client optimiser,
    LR schedule at the cell's lr, federation, device, workers, engine, cohort size, update
    codec); it is evaluated on data.evaluate's split. ``model``: the cell's initial model
    when already built (``initial_cell_model``), else built here."""
    params = cell.params
    method = params.grid.adapter(cell.adapter)
    base = require_base(params, cell.base)  # written by now: the one check of it
    algo = params.grid.algorithm(cell.algorithm)
    runtime = resolve_runtime(params)  # the device and workers on this machine
    device = runtime.device
    model_fn = model_factory(params, data, cell.adapter, base)
    inp = model_input(params, data.train.info)
    federation = federation_config(params)
    # The cell's one model in this process: the Simulation's initial global model, its
    # in-process clients' model, and (trained state loaded) what registration logs. Given
    # (``model``): the one ``flows.plan.prepare`` built; it must be this cell's.
    adapted = initial_model(model_fn, federation) if model is None else model
    ray = ray_settings(params, runtime)
    engine = params.runtime.engine
    if ray is not None and engine == "auto":
        engine = "sequential"  # Ray actors train clients one by one
    # A reproduction's verdict window (federation.whole_test_last) measures the whole test
    # split; the other evaluations its data.test_subset rows.
    whole_test = federation.whole_test_last > 0 and params.data.evaluate == "test"
    trainable = None if cell.whole else cell.trainable_keys
    sim = Simulation(
        model_fn=model_fn,
        algorithm=algo,
        train=data.image_data("train", inp),
        test=data.image_data("test_whole" if whole_test else params.data.evaluate, inp),
        test_rows=data.test_idx if whole_test else None,
        shards=shards_of(part),
        noise_var=part.noise_var,
        local=engine_config(params.client, LocalConfig),
        lr_schedule=engine_config(params.lr_schedule, LRSchedule, lr=cell.lr),
        federation=federation,
        model=adapted,
        workers=runtime.workers,
        device=device,
        callbacks=list(callbacks),
        payload_keys=cell.payload_keys,
        trainable=trainable,
        engine=resolve_engine(engine, device, adapted, trainable, part.noise_var or ()),
        cohort_size=None if params.runtime.cohort_size == "auto" else params.runtime.cohort_size,
        ray=ray,
        codecs=params.grid.codec(cell.codec),
        checked=True,  # by prepare (or cell_of), when it resolved the cell
        privacy=privacy_config(params),
    )
    return Cell(sim, method, model_fn, adapted, device)
