"""How often one run builds and checks each thing: ``prepare`` (what `fedapt run` does before
the flow starts), then the experiment flow with its plan, in this process (a temporary
Prefect server; tracking and S3 off), for a two-cell grid (full, head).

Counts backbone builds (``get_model`` from tasks.data.backbone), partition draws, dataset splits
read from disk, cells built and the checks (each cell against its algorithm, the results
and checkpoints of the experiment folder, the seed-sweep rule). Worker processes build
their own model copy; run with ``runtime.workers=0`` (set below) so that every build is
counted here.
Run:  .venv/bin/python scripts/count_builds.py
"""

from __future__ import annotations

import collections
import functools
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.chdir(ROOT)
os.environ.pop("PREFECT_API_URL", None)

import flows.plan as fp  # noqa: E402
import tasks.data.backbone as tb  # noqa: E402
import tasks.data.experiment as td  # noqa: E402
import tasks.data.partitioning as tp  # noqa: E402
import tasks.training.cell as tc  # noqa: E402

COUNTS: collections.Counter[str] = collections.Counter()


def count(module: Any, name: str, label: str) -> None:
    fn = getattr(module, name)

    @functools.wraps(fn)
    def counted(*args: Any, **kwargs: Any) -> Any:
        COUNTS[label] += 1
        return fn(*args, **kwargs)

    setattr(module, name, counted)


def main() -> None:
    count(tb, "get_model", "backbone builds")
    count(tp, "make_partition", "partition draws")
    count(td, "load_dataset", "dataset splits read from disk")
    count(tc, "build_simulation", "cells built")
    count(fp, "check_cell", "check: a cell against its algorithm")
    count(fp, "check_results", "check: other params' results")
    count(fp, "check_checkpoints", "check: checkpoints of a rerun")
    count(fp, "check_sweep", "check: sweep and --partition")
    count(fp, "prepare", "plans prepared")
    from prefect.testing.utilities import prefect_test_harness

    from flows.experiment import experiment_flow
    from tasks.config import load_params

    out = tempfile.mkdtemp(prefix="count-builds-")
    overrides = [
        "federation.rounds=1",
        "data.train_subset=600",
        "data.test_subset=200",
        "runtime.workers=0",
        "runtime.tracking=false",
        "storage.bucket=null",
        f"experiment.reports_dir={out}",
        "grid.adapters=[full,head]",
    ]
    params = load_params("params.yaml", overrides)
    plan = fp.prepare(params, storage=False)
    before = dict(COUNTS)
    with prefect_test_harness(server_startup_timeout=180):
        experiment_flow(params=params, plan=plan)
    for label in sorted(COUNTS):
        print(f"{label}: {COUNTS[label]} ({before.get(label, 0)} in prepare)")
    caches = [
        name
        for module in (td, tp, tc, tb)
        for name, value in vars(module).items()
        if hasattr(value, "cache_info") or (name.isupper() and isinstance(value, dict) and value)
    ]
    print(
        f"process-level caches in tasks.data.experiment, partitioning, cell, backbone: {caches or 'none'}"
    )


if __name__ == "__main__":
    main()
