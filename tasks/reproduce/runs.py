"""The experiments of a profile as typed params, what each one's folder holds (finished for
this configuration, resumable, to run) and the finished results the verdicts read.

Each experiment is its own ``fedapt run``: ``experiment.name`` ``<profile>-<experiment>``
under ``experiment.reports_dir`` ``<reports_dir>/reproduce/<profile>`` (so its summary,
cells, round checkpoints and MLflow experiment are the usual ones). It counts as finished
when its ``summary.json`` was written for the same configuration: the same flat params except
where outputs go, tracking, storage, validation and the communication-cost report (keys that
cannot change a cell's numbers). ``reproduce.json`` beside it records how long the run took.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tasks.checkpoint import significant
from tasks.config import Params, experiment_dir, load_params, resolved
from tasks.io import atomic_write_bytes, atomic_write_json
from tasks.reproduce.registry import CLAIMS, check_profile, unmet
from tasks.reproduce.spec import Cell, Claim, Experiment, ExperimentResult, dedupe

STAMP = "reproduce.json"
REPORT = "reproduction.md"
FIGURES = "figures"


@dataclass(frozen=True)
class Planned:
    """An experiment of a claim under a profile, with its typed params."""

    claim: Claim
    experiment: Experiment
    params: Params
    overrides: tuple[str, ...]

    @property
    def dir(self) -> Path:
        return experiment_dir(self.params)


def base_params(params_file: str | Path | None, overrides: Sequence[str]) -> Params:
    """The base params with the user's overrides of the sections that hold for the whole
    reproduction (where outputs go, the runtime, tracking, storage); the others, such as
    ``model.options.width``, may only make sense on top of a claim's model."""
    whole = ("experiment.", "runtime.", "tracking.", "storage.")
    return load_params(params_file, [o for o in overrides if o.strip().startswith(whole)])


def reproduce_root(params_file: str | Path | None, overrides: Sequence[str], profile: str) -> Path:
    """``<experiment.reports_dir>/reproduce/<profile>``, reports_dir from the base params."""
    base = base_params(params_file, overrides)
    return Path(base.experiment.reports_dir) / "reproduce" / check_profile(profile)


def plan(
    claims: Sequence[Claim],
    profile: str,
    params_file: str | Path | None = None,
    overrides: Sequence[str] = (),
) -> list[Planned]:
    """Every experiment the claims run or read under ``profile`` (claims whose
    requirements this build lacks run none), each typed once: a bad override stops here in
    one line. The user's ``overrides`` apply after the claim's, so ``--set
    runtime.device=cuda`` wins."""
    root = reproduce_root(params_file, overrides, profile)
    owner = {e.name: (c, e) for c in CLAIMS for e in c.experiments}
    out, seen = [], set()
    for claim in claims:
        if unmet(claim):
            continue
        wanted = [(claim, e) for e in claim.runs(profile)]
        wanted += [owner[n] for n in claim.reads if profile in owner[n][1].profiles]
        for owning, exp in wanted:
            if exp.name in seen:
                continue
            seen.add(exp.name)
            sets = (
                *dedupe([*exp.overrides(profile), *overrides]),
                f"experiment.reports_dir={root}",
                f"experiment.name={profile}-{exp.name}",
            )
            # auto numerics: portable, the promise of a reproduction (its checks compare it)
            params = resolved(load_params(params_file, list(sets)), "portable")
            out.append(Planned(owning, exp, params, sets))
    return out


def config_key(flat: dict[str, Any]) -> dict[str, Any]:
    """The flat params that determine an experiment's numbers, as plain JSON values."""
    return json.loads(json.dumps(significant(flat), sort_keys=True, default=str))


def _summary(directory: Path) -> dict[str, Any] | None:
    path = directory / "summary.json"
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # a summary that does not parse is rewritten by the rerun


def status(item: Planned) -> str:
    """``done`` (summary for this configuration), ``resume`` (round checkpoints of an
    unfinished run), ``rerun`` (a summary of another configuration) or ``pending``."""
    summary = _summary(item.dir)
    if summary is not None and config_key(summary["params"]) == config_key(item.params.flat()):
        return "done"
    checkpoints = item.dir / "checkpoints"
    if checkpoints.is_dir() and any(checkpoints.glob("*.pt")):
        return "resume"
    return "rerun" if summary is not None else "pending"


def work(item: Planned) -> int:
    """An experiment's size in cell-rounds: grid cells x rounds (x seeds of a sweep)."""
    p = item.params
    cells = len(p.grid.algorithms) * len(p.grid.adapters) * len(p.experiment.seeds or [0])
    return cells * p.federation.rounds


def eta_text(done: int, seconds: float, left: int) -> str:
    """The reproduction's ETA at this session's pace: ``seconds`` for the ``done``
    cell-rounds of the experiments run so far, times the ``left`` ones (their models and
    data differ, so it is a rough guide; a resumed experiment makes it optimistic)."""
    from tasks.progress import clock

    if left <= 0:
        return "nothing left"
    if done <= 0:
        return f"{left} cell-rounds left, ETA after the first experiment"
    return f"{left} cell-rounds left, ETA {clock(left * seconds / done)} at this session's pace"


def share_base(item: Planned, root: Path) -> Path | None:
    """Give ``item`` the frozen base another experiment under ``root`` trained for the same
    data, model and pretrain params (the pretrain stage's own cache check: same fingerprint,
    same bytes), so experiments that differ only after the base (the two #M partitions)
    train it once. Returns the folder copied from, or None."""
    from tasks.backbone import BASE_FILE
    from tasks.pretrain import CARD_FILE, cached_card

    target = item.dir / "pretrain"
    if item.params.model.base != "pretrain" or cached_card(item.params, target) is not None:
        return None
    for other in sorted(root.glob("*/pretrain")):
        if other != target and cached_card(item.params, other) is not None:
            for name in (BASE_FILE, CARD_FILE):
                atomic_write_bytes(target / name, (other / name).read_bytes())
            return other
    return None


def write_stamp(item: Planned, seconds: float, resumed: bool) -> Path:
    """reproduce.json: how long the run that finished the experiment took (this session's
    seconds; a resumed run's earlier sessions are not counted) and its overrides."""
    return atomic_write_json(
        item.dir / STAMP,
        {
            "claim": item.claim.id,
            "experiment": item.experiment.name,
            "overrides": list(item.overrides),
            "seconds": round(seconds, 1),
            "resumed": resumed,
            "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        },
    )


def read_stamp(directory: Path) -> dict[str, Any]:
    path = directory / STAMP
    try:
        return json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError):
        return {}


def load_result(directory: Path) -> ExperimentResult | None:
    """A finished experiment's records: summary.json's runs with each cell's round records."""
    summary = _summary(directory)
    if summary is None:
        return None
    cells = {}
    for record in summary["runs"]:
        name = f"{record['algorithm']}-{record['adapter']}"
        metrics = directory / "runs" / name / "metrics.json"
        rounds = json.loads(metrics.read_text())["rounds"] if metrics.is_file() else []
        cells[name] = Cell(record=record, rounds=rounds)
    return ExperimentResult(
        summary["params"], cells, read_stamp(directory).get("seconds"), _majority(directory)
    )


def _majority(directory: Path) -> float | None:
    """The most frequent class's share of the partitioned training rows."""
    try:
        totals = json.loads((directory / "partition" / "stats.json").read_text())["label_totals"]
        return max(totals) / sum(totals)
    except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError):
        return None


def results(items: Sequence[Planned]) -> dict[str, ExperimentResult]:
    """The finished experiments (for this configuration) by experiment name."""
    out = {}
    for item in items:
        if status(item) == "done" and (r := load_result(item.dir)) is not None:
            out[item.experiment.name] = r
    return out
