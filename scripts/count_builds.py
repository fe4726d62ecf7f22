"""How often one run builds each thing: preflight, then the experiment flow, in this process
(a temporary Prefect server; tracking and S3 off), for a two-cell grid (full, head).

Counts backbone builds (``get_model`` from tasks.backbone), partition draws, dataset splits read
from disk and cells built. Worker processes build their own model copy; run with
``runtime.workers=0`` (set below) so that every build is counted here.
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

import tasks.backbone as tb  # noqa: E402
import tasks.cell as tc  # noqa: E402
import tasks.data as td  # noqa: E402
import tasks.partitioning as tp  # noqa: E402

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
    from prefect.testing.utilities import prefect_test_harness

    from flows.experiment import check_names, experiment_flow, preflight
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
    check_names(params)
    preflight(params, None, storage=False)
    after_preflight = dict(COUNTS)
    with prefect_test_harness(server_startup_timeout=180):
        experiment_flow(params=params)
    for label in sorted(COUNTS):
        print(f"{label}: {COUNTS[label]} ({after_preflight.get(label, 0)} in preflight)")


if __name__ == "__main__":
    main()
