"""A grid's cells and their names: one cell per (algorithm, adapter, codec), and a cell as
``flows.plan.prepare`` resolved it (``ResolvedCell``): what a training task carries below the
flow, on every runner.

Light on purpose (no engine, no torch): the report and sweep summaries name cells too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tasks.config import Params


def cell_name(algorithm: str, adapter: str, codec: str = "none") -> str:
    """``<algorithm>-<adapter>``, and ``-<codec>`` for a cell with an update codec."""
    return f"{algorithm}-{adapter}" if codec == "none" else f"{algorithm}-{adapter}-{codec}"


def record_cell(record: dict[str, Any]) -> str:
    """The cell name of a cell's record (metrics.json, a summary's run)."""
    return cell_name(record["algorithm"], record["adapter"], record.get("codec", "none"))


@dataclass(frozen=True)
class CellSpec:
    """One grid cell (picklable: what a task on another worker needs to name it)."""

    algorithm: str
    adapter: str
    codec: str = "none"

    @property
    def name(self) -> str:
        return cell_name(self.algorithm, self.adapter, self.codec)


@dataclass(frozen=True)
class ResolvedCell:
    """One grid cell resolved once, by ``flows.plan.prepare`` (``tasks.training.cell.resolve_cell``):
    the only thing about the cell that travels below the flow, to a thread, a Dask or Ray
    worker or a DVC stage (picklable: no tensors, no model). Nothing below re-derives what it
    holds: its params (a sweep's seed's, shared with the runner: ``flows.runners.cell_params``),
    its names, its client lr, the pretrain base it starts from (written before it runs) and
    the keys its model transmits (None: the whole model) and trains."""

    params: Params
    spec: CellSpec
    lr: float  # its client lr: its grid.client_lr entry, else client.lr
    base: str | None  # the pretrain base file (model.base: pretrain), else None
    payload_keys: tuple[str, ...] | None  # what a client uploads (None: the whole model)
    trainable_keys: frozenset[str]  # the parameters a client trains (full: every one)
    seed: int | None = None  # its seed in a seed sweep (its MLflow run's name and tag)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def algorithm(self) -> str:
        return self.spec.algorithm

    @property
    def adapter(self) -> str:
        return self.spec.adapter

    @property
    def codec(self) -> str:
        return self.spec.codec

    @property
    def label(self) -> str:
        """Its progress lines' and MLflow run's name: ``<cell>``, ``<cell> seed <s>`` in a sweep."""
        return self.name if self.seed is None else f"{self.name} seed {self.seed}"

    @property
    def whole(self) -> bool:
        """The whole model travels and trains (full fine-tuning): the engine's default path."""
        return self.payload_keys is None

    def __repr__(self) -> str:  # (Prefect shows a task's inputs: not the whole params)
        return f"ResolvedCell({self.label!r})"


def grid_cells(params: Params) -> tuple[CellSpec, ...]:
    """The grid's cells in grid order: algorithm-major, then adapter, then codec."""
    g = params.grid
    return tuple(CellSpec(a, d, c) for a in g.algorithms for d in g.adapters for c in g.codecs)


def dvc_folder(spec: CellSpec) -> str:
    """A cell's folder under the DVC pipeline's artifacts/runs, ``<algorithm>-<adapter>-<codec>``:
    the train stage's ``matrix`` names it from all three values, ``none`` included."""
    return f"{spec.algorithm}-{spec.adapter}-{spec.codec}"


def cell_folder(spec: CellSpec) -> str:
    """A cell's folder under a run's ``runs/``: its name."""
    return spec.name
