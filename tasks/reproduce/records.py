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
import json
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tasks.io import atomic_write_json
from tasks.reproduce.codeversion import (
    CODE,
    NOT_NUMBERS,
    PLUGINS,
    RULE,
    all_files_version,
    code_files,
    code_version,
    driver_files,
    uses,
)
from tasks.reproduce.spec import Cell, ExperimentResult

__all__ = [
    "CODE",
    "NOT_NUMBERS",
    "PLUGINS",
    "RULE",
    "code_files",
    "code_version",
    "driver_files",
    "uses",
]

RECORDS = "records"
ROOT = Path(__file__).resolve().parents[2]


@functools.cache
def loaded_sources() -> tuple[tuple[str, bytes], ...]:
    """The number-computing source of this process, read once, at the first call (the start of
    a reproduce run), so source files changed on disk under a running reproduction (a pull, a
    merge) cannot stamp its records with code it did not run."""
    return tuple(sorted(code_files().items()))


@functools.cache
def loaded_drivers() -> tuple[tuple[str, bytes], ...]:
    """The drivers' source (``codeversion.driver_files``), read once like :func:`loaded_sources`."""
    return tuple(sorted(driver_files().items()))


@functools.cache
def loaded_code_version(used: frozenset[str] | None = None) -> str:
    """:func:`code_version` of the source this process loaded (:func:`loaded_sources`)."""
    return code_version(used=used, sources=dict(loaded_sources()), drivers=dict(loaded_drivers()))


def record_code(flat: Mapping[str, Any]) -> str:
    """The code version a record of these flat params is computed by (its plug-ins only)."""
    return loaded_code_version(uses(flat))


def same_code(code: object, flat: Mapping[str, Any]) -> bool:
    """Whether ``code``, a code version stamped under this rule or the former one, is this
    checkout's for ``flat`` (the former rule's equal means the same code, file for file)."""
    if code == record_code(flat):
        return True
    return code == all_files_version(used=uses(flat), sources=dict(loaded_sources()))


def is_current(rec: Mapping[str, Any], flat: Mapping[str, Any]) -> bool:
    """Whether ``rec``'s code version is this checkout's for ``flat``: under this rule, or,
    for a record the former rule stamped and :func:`migrate` has not carried over yet, under
    that one."""
    if rec.get("code_rule") == RULE:
        return rec.get("code") == record_code(flat)
    return rec.get("code") == all_files_version(used=uses(flat), sources=dict(loaded_sources()))


def migrate(path: Path) -> bool:
    """Carry a record stamped by the former code-version rule (every number-code file) over to
    this one (``codeversion.RULE``) when the former rule still gives its code version on this
    checkout: the code that computed it is then this code, file for file, so its version under
    this rule is this checkout's. Its ``code``, and the same value where ``computed_by`` and
    its revalidations name it, are restamped; ``migrated`` keeps the former value. A record of
    other code stays as it is (stale: revalidate or rerun it). Returns whether it was written."""
    rec = read_record(path)
    if rec is None or rec.get("code_rule") == RULE:
        return False
    flat = rec.get("params") or {}
    old = rec.get("code")
    if not is_current(rec, flat):
        return False
    new_code = record_code(flat)
    new = dict(rec)
    new["code"], new["code_rule"] = new_code, RULE
    by = rec.get("computed_by")
    if isinstance(by, dict) and by.get("code") == old:
        new["computed_by"] = {**by, "code": new_code}
    new["revalidated"] = [
        {**c, "to": new_code} if isinstance(c, dict) and c.get("to") == old else c
        for c in rec.get("revalidated") or []
    ]
    if not new["revalidated"]:
        del new["revalidated"]
    new["migrated"] = {
        "from": old,
        "rule": RULE,
        "commit": checkout()["commit"],
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    atomic_write_json(path, new)
    return True


def migrate_stamp(path: Path, flat: Mapping[str, Any]) -> bool:
    """A run's stamp (``reproduce.json``: its registration, and its code when it finished)
    carried over like :func:`migrate`, so a run registered under the former rule and resumed
    after the number code changed elsewhere is not taken for one whose code changed under it.
    Returns whether it was written."""
    stamp = read_record(path)
    if stamp is None or stamp.get("code_rule") == RULE:
        return False
    former = all_files_version(used=uses(flat), sources=dict(loaded_sources()))
    by = stamp.get("computed_by")
    new = dict(stamp)
    if isinstance(by, dict) and by.get("code") == former:
        new["computed_by"] = {**by, "code": record_code(flat)}
    if stamp.get("code") == former:
        new["code"] = record_code(flat)
    if new == stamp:
        return False
    new["code_rule"] = RULE
    atomic_write_json(path, new)
    return True


def _git(*args: str) -> str | None:
    import subprocess

    try:
        done = subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else the platform's word for it."""
    import platform

    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def checkout() -> dict[str, Any]:
    """The commit of this checkout and whether its tree was clean, read once, at the first call
    (the start of a run): no tracked file changed and no untracked file, outside the
    reproduction's own outputs (``reproduce/``). Not a git checkout: commit None, clean False.
    A copy of its own per call."""
    where = _checkout()
    return {**where, "changed": list(where["changed"])}


@functools.cache
def _checkout() -> dict[str, Any]:
    head = _git("rev-parse", "HEAD")
    if head is None:
        return {"commit": None, "clean": False, "changed": ["not a git checkout"]}
    lines = (_git("status", "--porcelain", "--untracked-files=normal") or "").splitlines()
    changed = [x[3:] for x in lines if not x[3:].startswith("reproduce/")]
    return {"commit": head.strip(), "clean": not changed, "changed": changed[:5]}


def computed_by(flat: Mapping[str, Any], numerics: str) -> dict[str, Any]:
    """Who computed a record: the commit, the record's code version, whether the tree was
    clean, the CPU model and the numerics mode."""
    where = checkout()
    return {
        "commit": where["commit"],
        "code": record_code(flat),
        "clean": where["clean"],
        "cpu": cpu_model(),
        "numerics": numerics,
    }


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
    code: str,
    computed_by: Mapping[str, Any],
    rules: Mapping[str, str],
) -> Path:
    """The record, with who computed it and the rules its run started under."""
    return atomic_write_json(
        path,
        {
            "experiment": experiment,
            "claim": claim,
            "code": code,
            "code_rule": RULE,
            "computed_by": dict(computed_by),
            "rules": dict(rules),
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
    return ExperimentResult(
        record["params"], runs, record.get("seconds"), majorities, bases, record.get("rules") or {}
    )
