"""Records of another code version checked instead of rerun (``fedapt reproduce
--revalidate``).

A record counts only for the code version that computed it (``records.code_version``), so a
change to the number code that leaves every number as it was (a refactor, a comment) would
otherwise cost a whole profile's rerun. A revalidation reruns, with this checkout's code,
the first ``rounds`` rounds of seed 0 of each such experiment (``federation.stop_after``:
the same run, its schedules still reading the full round count) and compares every round
record of every cell with the committed one, value for value (accuracy, losses, bytes,
clients, lr, the algorithm's series), and the pretrained base's accuracy. Identical: the
record is stamped with this code version and keeps what was checked under
``revalidated``. Any difference: the record stays stale, named in one line per experiment
(rerun it with ``--rerun-stale``).

What a revalidation does not check: the rounds after the first ``rounds``, the seeds after
the first, and what runs after training (personalization: switched off in the check).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tasks.config import load_params, resolved
from tasks.io import atomic_write_json
from tasks.reproduce import records
from tasks.reproduce.spec import dedupe

if TYPE_CHECKING:
    from tasks.reproduce.runs import Planned

REVALIDATE = "revalidate"  # under <reports_dir>/reproduce/<profile>: the check runs' folders
ROUNDS = 2  # rounds of seed 0 each check reruns, by default


def check_sets(record: Mapping[str, Any], rounds: int, total: int, root: Path) -> list[str]:
    """The overrides that turn an experiment into its check: seed 0 alone (a sweep of one seed
    when the record is a sweep's), ``rounds`` rounds of the ``total`` it is configured for,
    its own folder, no personalization, tracking or uploads (a check is not a result)."""
    sets = [
        f"experiment.reports_dir={root / REVALIDATE}",
        f"federation.stop_after={min(rounds, total)}",
        "personalize.enabled=false",
        "runtime.tracking=false",
        "storage.bucket=null",
    ]
    if record.get("params", {}).get("experiment.seeds") is not None:
        sets.append("experiment.seeds=[0]")
    return sets


def _timing(key: str) -> bool:
    return "seconds" in key or key.endswith("_time")


def compare(record: Mapping[str, Any], seeds: Mapping[str, Any], rounds: int) -> list[str]:
    """How the check run's seed 0 (``records.collect`` of its folder) differs from the
    record's, in its first ``rounds`` rounds; empty: identical. (The check's last round is
    evaluated as a stopped run's is: where the record did not evaluate it, that is skipped.)"""
    want = record.get("seeds", {}).get("0")
    got = seeds.get("0")
    if want is None:
        return ["the record has no seed 0"]
    if got is None:
        return ["the check run has no seed 0"]
    diffs = []
    if want.get("base_accuracy") != got.get("base_accuracy"):
        diffs.append(
            f"base accuracy {want.get('base_accuracy')} recorded, {got.get('base_accuracy')} now"
        )
    for cell, entry in sorted(want["cells"].items()):
        new = got["cells"].get(cell)
        if new is None:
            diffs.append(f"{cell}: not in the check run")
            continue
        old_rounds = entry["rounds"][:rounds]
        new_rounds = new["rounds"][: len(old_rounds)]
        if len(new_rounds) < len(old_rounds):
            diffs.append(f"{cell}: {len(new_rounds)} rounds, {len(old_rounds)} recorded")
        for i, (a, b) in enumerate(zip(old_rounds, new_rounds, strict=False)):
            skip = (
                {"accuracy", "test_loss"} if i == rounds - 1 and a.get("accuracy") is None else ()
            )
            for key in sorted(k for k in a if not _timing(k) and k not in skip):
                if a[key] != b.get(key):
                    diffs.append(
                        f"{cell} round {a.get('round')} {key}: {a[key]!r} recorded, "
                        f"{b.get(key)!r} now"
                    )
    return diffs


def restamp(path: Path, record: Mapping[str, Any], rounds: int, cells: Sequence[str]) -> Path:
    """``record`` stamped with this code version, what was checked appended to its
    ``revalidated`` list (earlier revalidations kept)."""
    checked = {
        "from": record.get("code"),
        "to": records.loaded_code_version(),
        "seed": 0,
        "rounds": rounds,
        "cells": sorted(cells),
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    new = dict(record)
    new["code"] = records.loaded_code_version()
    new["revalidated"] = [*record.get("revalidated", []), checked]
    return atomic_write_json(path, new)


def check_item(item: Planned, rounds: int, params_file: str | Path | None, root: Path) -> Planned:
    """``item``'s revalidation check (``tasks.reproduce.revalidate``): its configuration, seed
    0's first ``rounds`` rounds, in ``<root>/revalidate/<experiment>``."""
    rec = records.read_record(item.record) or {}
    sets = check_sets(rec, rounds, item.params.federation.rounds, root)
    full = tuple(dedupe([*item.overrides, *sets]))
    params = resolved(load_params(params_file, list(full)), "portable")
    return dataclasses.replace(item, params=params, overrides=full)
