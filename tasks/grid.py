"""A grid's cells and their names: one cell per (algorithm, adapter, codec).

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
