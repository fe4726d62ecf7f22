"""The committed records of a reproduction: one small JSON file per finished experiment under
``reproduce/<profile>/records/`` (its configuration, the code and numerics that computed it,
and per seed every cell's summary record and round records: what the verdicts read, never a
model file). The report is assembled from these files alone, so a fresh clone holds the
profile's evidence, skips what they cover, and rebuilds the same report.

A record counts for an experiment when it was written for the same configuration (the flat
params that determine its numbers, ``runs.config_key``) by the same code version (a hash of
the source that computes numbers, ``code_version``) in the same numerics. A record of another
code version or numerics is *stale*: ``fedapt reproduce`` stops on it in one line unless told
``--rerun-stale``, since mixing numbers of two code versions in one report would be silent.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tasks.io import atomic_write_json
from tasks.reproduce.spec import Cell, ExperimentResult

RECORDS = "records"
ROOT = Path(__file__).resolve().parents[2]
# The source whose changes can change a number: the core, the models and the tasks that
# load data, partition, pretrain and train; not what only writes, tracks or reports.
CODE = ("fedcore", "models", "tasks")
NOT_NUMBERS = (
    "tasks/reproduce/",
    "tasks/report.py",
    "tasks/figures.py",
    "tasks/progress.py",
    "tasks/tracking/",
    "tasks/storage.py",
    "tasks/origin.py",
    "tasks/artifacts.py",
    "tasks/modelfile.py",
    "tasks/yamlfile.py",
    "tasks/validate.py",
)
PINS = ("numpy==", "peft==", "timm==", "torch==", "torchvision==", "transformers==")


def code_version(root: Path = ROOT) -> str:
    """12 hex digits of a hash over the number-computing source files (path and bytes) and
    the pins of the numeric libraries in constraints.txt."""
    h = hashlib.sha256()
    files = sorted(
        p
        for top in CODE
        for p in (root / top).rglob("*.py")
        if not p.relative_to(root).as_posix().startswith(NOT_NUMBERS)
    )
    for p in files:
        h.update(p.relative_to(root).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    pins = root / "constraints.txt"
    if pins.is_file():
        lines = [x for x in pins.read_text().splitlines() if x.startswith(PINS)]
        h.update("\n".join(lines).encode())
    return h.hexdigest()[:12]


@functools.cache
def loaded_code_version() -> str:
    """The code version of this process: read once, at the first call (the start of a
    reproduce run), so source files changed on disk under a running reproduction (a pull, a
    merge) cannot stamp its records with code it did not run."""
    return code_version()


def record_path(records_dir: Path, name: str) -> Path:
    return records_dir / f"{name}.json"


def read_record(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text()) if path.is_file() else None
    except (OSError, ValueError):
        return None  # a record that does not parse is rewritten by the rerun


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _majority(directory: Path) -> float | None:
    """The most frequent class's share of the partitioned training rows."""
    try:
        totals = _json(directory / "partition" / "stats.json")["label_totals"]
        return max(totals) / sum(totals)
    except (TypeError, KeyError, ValueError, ZeroDivisionError):
        return None


def _base_accuracy(directory: Path, params: Mapping[str, Any] | None = None) -> float | None:
    """The pretrained base's test accuracy before any round, on the federation's test rows
    (its card), None without one. A base that learned only some classes (``pretrain.classes``)
    was tested on the federation's test rows of those classes: on all of them it scores that
    accuracy times their share (it never predicts a class it never learned: the rows of the
    others count as wrong). A base of another dataset has no accuracy on these rows: None."""
    card = _json(directory / "pretrain" / "base.json")
    value = card.get("final_test_accuracy") if isinstance(card, dict) and card.get("used") else None
    if not isinstance(value, (int, float)):
        return None
    source = card.get("source") or {}
    dataset = (params or {}).get("data.dataset")
    if dataset is not None and source.get("dataset") not in (None, dataset):
        return None
    classes = source.get("classes", "all")
    if not isinstance(classes, list):
        return float(value)
    rows, tested = source.get("test_rows"), (params or {}).get("data.test_subset")
    if isinstance(rows, int) and isinstance(tested, int) and tested > 0:
        return float(value) * rows / tested
    stats = _json(directory / "partition" / "stats.json")
    total = stats.get("num_classes") if isinstance(stats, dict) else None
    return float(value) * len(classes) / total if isinstance(total, int) and total else None


def collect(directory: Path, summary: Mapping[str, Any]) -> dict[str, Any]:
    """Per seed, each cell's summary record and round records, the class prior and the
    pretrained base's test accuracy, from a finished experiment folder (a seed sweep's
    ``seed-<s>/`` or a single seed's own)."""
    seeds: dict[str, Any] = {}
    for record in summary["runs"]:
        seed = int(record.get("seed", summary["params"].get("experiment.seed", 0)))
        where = directory / f"seed-{seed}" if "seeds" in summary else directory
        cell = f"{record['algorithm']}-{record['adapter']}"
        metrics = _json(where / "runs" / cell / "metrics.json") or {}
        entry = seeds.setdefault(
            str(seed),
            {
                "majority": _majority(where),
                "base_accuracy": _base_accuracy(where, summary["params"]),
                "cells": {},
            },
        )
        entry["cells"][cell] = {"record": record, "rounds": metrics.get("rounds", [])}
    return seeds


def write_record(
    path: Path,
    *,
    experiment: str,
    claim: str,
    config: Mapping[str, Any],
    params: Mapping[str, Any],
    numerics: str,
    overrides: list[str],
    seconds: float,
    resumed: bool,
    seeds: Mapping[str, Any],
) -> Path:
    return atomic_write_json(
        path,
        {
            "experiment": experiment,
            "claim": claim,
            "code": loaded_code_version(),
            "numerics": numerics,
            "seconds": round(seconds, 1),
            "resumed": resumed,
            "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "overrides": overrides,
            "config": dict(config),
            "params": dict(params),
            "seeds": dict(seeds),
        },
    )


def result(record: Mapping[str, Any]) -> ExperimentResult:
    """The verdicts' view of a record."""
    runs, majorities, bases = {}, {}, {}
    for seed, entry in record["seeds"].items():
        runs[int(seed)] = {
            name: Cell(record=c["record"], rounds=c.get("rounds", []))
            for name, c in entry["cells"].items()
        }
        majorities[int(seed)] = entry.get("majority")
        bases[int(seed)] = entry.get("base_accuracy")
    return ExperimentResult(record["params"], runs, record.get("seconds"), majorities, bases)
