"""Records of another code version checked instead of rerun (``fedapt reproduce
--revalidate``).

A record counts only for the code version that computes it (``records.record_code``: the
number code it runs, its unused plug-ins left out), so a change to that code that leaves every
number as it was (a refactor) would otherwise cost the record's whole rerun. A revalidation
reruns, with this checkout's code (a clean commit), one whole seed of each such experiment
(seed 0 unless ``--seed``): every round, with freezing, lr milestones and personalization as
the record ran them; and compares every round record of every cell with the committed one,
value for value (accuracy, losses, bytes, clients, lr, the algorithm's series), every cell's
summary record (personalization's accuracies included) and the pretrained base's accuracy.
Identical: the record is stamped with this code version and keeps what was checked, and by
whom, under ``revalidated``. Any difference: the record stays stale, named in one line per
experiment (rerun it with ``--rerun-stale``). Timings are never compared.

A current record that no revalidation at its code has checked is rerun the same way: a second
process reproducing one of its seeds whole is what stands behind it (the record of a code
version is stamped once; a later code version's changes are checked as above).
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
SEED = 0  # the seed each check reruns whole, by default


def revalidated_at(record: Mapping[str, Any], code: str | None) -> bool:
    """Whether a whole-seed revalidation stamped ``record`` with ``code``."""
    return any(
        c.get("to") == code and c.get("rounds") == "all" for c in record.get("revalidated") or []
    )


def to_check(state: str, record: Mapping[str, Any] | None) -> str | None:
    """Why ``--revalidate`` reruns a seed of an experiment in ``state`` with ``record`` (its
    ``runs.status``): a stale record, or a current one no revalidation at its code checked;
    None: nothing to check."""
    if record is None:
        return None
    if state == "stale":
        return f"code {record.get('code')}"
    if state == "done" and not revalidated_at(record, record.get("code")):
        return f"current (code {record.get('code')}), not yet rerun by a second process"
    return None


def check_sets(record: Mapping[str, Any], seed: int, root: Path) -> list[str]:
    """The overrides that turn an experiment into its check: ``seed`` alone (a sweep of one
    seed when the record is a sweep's), all of its rounds, its own folder, no tracking or
    uploads (a check is not a result)."""
    sets = [
        f"experiment.reports_dir={root / REVALIDATE}",
        "runtime.tracking=false",
        "storage.bucket=null",
    ]
    if record.get("params", {}).get("experiment.seeds") is not None:
        sets += [f"experiment.seeds=[{seed}]", f"experiment.seed={seed}"]
    else:
        sets.append(f"experiment.seed={seed}")
    return sets


def _timing(key: str) -> bool:
    return "seconds" in key or key.endswith("_time")


# What a cell's summary record holds besides numbers: where it was tracked (a check runs with
# tracking off) and on which machine (a revalidation may run on another CPU).
NOT_COMPARED = ("provenance",)


def _compared(key: str) -> bool:
    return not (_timing(key) or "mlflow" in key or key in NOT_COMPARED)


def _numbers(value: Any) -> Any:
    """``value`` with timings, tracking ids and provenance left out, at every depth."""
    if isinstance(value, dict):
        return {k: _numbers(v) for k, v in value.items() if _compared(k)}
    if isinstance(value, list):
        return [_numbers(v) for v in value]
    return value


def compare(record: Mapping[str, Any], seeds: Mapping[str, Any], seed: int = SEED) -> list[str]:
    """How the check run's ``seed`` (``records.collect`` of its folder) differs from the
    record's: every round of every cell, every cell's summary record and the base's accuracy,
    timings aside; empty: identical."""
    want = record.get("seeds", {}).get(str(seed))
    got = seeds.get(str(seed))
    if want is None:
        return [f"the record has no seed {seed}"]
    if got is None:
        return [f"the check run has no seed {seed}"]
    diffs = []
    for key in ("base_accuracy", "majority"):
        if want.get(key) != got.get(key):
            diffs.append(f"{key} {want.get(key)} recorded, {got.get(key)} now")
    for cell, entry in sorted(want["cells"].items()):
        new = got["cells"].get(cell)
        if new is None:
            diffs.append(f"{cell}: not in the check run")
            continue
        old_rounds, new_rounds = entry["rounds"], new["rounds"]
        if len(new_rounds) != len(old_rounds):
            diffs.append(f"{cell}: {len(new_rounds)} rounds, {len(old_rounds)} recorded")
        for a, b in zip(old_rounds, new_rounds, strict=False):
            a, b = _numbers(a), _numbers(b)
            for key in sorted({*a, *b}):
                if a.get(key) != b.get(key):
                    diffs.append(
                        f"{cell} round {a.get('round')} {key}: {a.get(key)!r} recorded, "
                        f"{b.get(key)!r} now"
                    )
        old_rec = _numbers(entry.get("record", {}))
        new_rec = _numbers(new.get("record", {}))
        for key in sorted({*old_rec, *new_rec}):
            if old_rec.get(key) != new_rec.get(key):
                diffs.append(
                    f"{cell} {key}: {old_rec.get(key)!r} recorded, {new_rec.get(key)!r} now"
                )
    return diffs


def restamp(path: Path, record: Mapping[str, Any], seed: int, cells: Sequence[str]) -> Path:
    """``record`` stamped with this code version, what was checked and by whom appended to its
    ``revalidated`` list (earlier revalidations kept)."""
    flat = record.get("params", {})
    code = records.record_code(flat)
    checked = {
        "from": record.get("code"),
        "to": code,
        "seed": seed,
        "rounds": "all",
        "cells": sorted(cells),
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "computed_by": records.computed_by(flat, str(record.get("numerics"))),
    }
    new = dict(record)
    new["code"], new["code_rule"] = code, records.RULE
    new["revalidated"] = [*record.get("revalidated", []), checked]
    return atomic_write_json(path, new)


def check_item(item: Planned, seed: int, params_file: str | Path | None, root: Path) -> Planned:
    """``item``'s revalidation check: its configuration, ``seed`` whole, in
    ``<root>/revalidate/<experiment>``."""
    rec = records.read_record(item.record) or {}
    sets = check_sets(rec, seed, root)
    full = tuple(dedupe([*item.overrides, *sets]))
    params = resolved(load_params(params_file, list(full)), "portable")
    return dataclasses.replace(item, params=params, overrides=full)
