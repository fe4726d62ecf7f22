"""params.yaml -> frozen, validated configuration, parsed once at the flow edge.

The options of each registry entry (``grid.algorithm_options.<algorithm>``,
``grid.adapter_options.<method>``, ``partition.<scheme>``, ``model.options``) are typed by the
entry's own frozen options dataclass (``fedcore.options``), embedded in :class:`Params`, so the
whole file goes through one pydantic validation and tasks receive typed objects.

Errors come out as one line (``fedcore.options.describe``) naming the file, the YAML line, the
dotted key and what is allowed, e.g.
``params.yaml:14: federation.rounds: must be greater than or equal to 1 (got 0)``.

By job: ``base`` (the section base and shared bounds), ``sections`` (what is trained),
``registered`` (partition, model, grid: registry names with typed options), ``operations``
(runtime, storage, tracking, report), ``params`` (``Params`` and what derives from it) and
``load`` (reading, overrides, one-line errors).
"""

from __future__ import annotations

from tasks.config.load import from_flat, load_params
from tasks.config.operations import ReportSection
from tasks.config.params import MAX_NAME, Params, experiment_dir, in_force, resolved

__all__ = [
    "MAX_NAME",
    "Params",
    "ReportSection",
    "experiment_dir",
    "from_flat",
    "in_force",
    "load_params",
    "resolved",
]
