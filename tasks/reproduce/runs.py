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

from fedcore.errors import ConfigError
from tasks.checkpoint import significant
from tasks.config import Params, experiment_dir, load_params, resolved
from tasks.io import atomic_write_bytes, atomic_write_json
from tasks.reproduce import records
from tasks.reproduce.registry import CLAIMS, check_profile, unmet
from tasks.reproduce.spec import Claim, Experiment, ExperimentResult, dedupe
from tasks.reproduce.tuning import chosen_sets, tuning_sets

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
    records: Path  # the profile's committed records folder
    tunes: str | None = None  # a tuning run: the name of the experiment whose lr it tunes
    tried: float | None = None  # ... and the lr it tries
    tune_key: str = "client.lr"  # ... of the clients, or "server_lr" (Tune.key)
    waiting: bool = False  # an experiment whose lr waits for its tuning runs' records

    @property
    def lrs(self) -> dict[str, float]:
        """The client lr per grid cell (``grid.client_lr``; empty: ``client.lr`` for all)."""
        return dict(self.params.grid.client_lr)

    @property
    def dir(self) -> Path:
        return experiment_dir(self.params)

    @property
    def record(self) -> Path:
        return records.record_path(self.records, self.params.experiment.name)


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


def out_root(profile: str, out: str | Path | None = None) -> Path:
    """Where the report, verdicts.json, figures/ and the records go: ``--out``, by default
    ``reproduce/<profile>`` (committed: the evidence a fresh clone starts from)."""
    return Path(out) if out is not None else Path("reproduce") / check_profile(profile)


def plan(
    claims: Sequence[Claim],
    profile: str,
    params_file: str | Path | None = None,
    overrides: Sequence[str] = (),
    out: str | Path | None = None,
) -> list[Planned]:
    """Every experiment the claims run or read under ``profile`` (claims whose
    requirements this build lacks run none), each typed once: a bad override stops here in
    one line. The user's ``overrides`` apply after the claim's, so ``--set
    runtime.device=cuda`` wins."""
    root = reproduce_root(params_file, overrides, profile)
    kept = out_root(profile, out) / records.RECORDS
    owner = {e.name: (c, e) for c in CLAIMS for e in c.experiments}
    planned: list[Planned] = []
    seen = set()
    for claim in claims:
        if unmet(claim):
            continue
        wanted = [(claim, e) for e in claim.runs(profile)]
        wanted += [owner[n] for n in claim.reads if profile in owner[n][1].profiles]
        for owning, exp in wanted:
            if exp.name in seen:
                continue
            seen.add(exp.name)
            sets = (*exp.overrides(profile), *overrides)

            def typed(name: str, more: Sequence[str]) -> tuple[Params, tuple[str, ...]]:
                return _typed(params_file, [*sets, *more], root, f"{profile}-{name}")  # noqa: B023

            waiting, more = False, []
            if (tune := exp.tune.get(profile)) is not None:
                probes = []
                algorithms = typed(exp.name, [])[0].grid.algorithms
                for lr in tune.lrs:
                    name = f"{exp.name}-lr{lr:g}"
                    params, full = typed(name, tuning_sets(tune, lr, algorithms))
                    probe = Experiment(name, protocol=(), profiles=(profile,))
                    probes.append(
                        Planned(owning, probe, params, full, kept, exp.name, lr, tune.key)
                    )
                planned += probes
                lrs = chosen_lrs(probes)
                waiting = lrs is None
                more = [f"data.validation={tune.validation}", *chosen_sets(tune, lrs or {})]
            params, full = typed(exp.name, more)
            check_seeds(claim, profile, params)
            planned.append(Planned(owning, exp, params, full, kept, waiting=waiting))
    return planned


def _typed(
    params_file: str | Path | None, sets: Sequence[str], root: Path, name: str
) -> tuple[Params, tuple[str, ...]]:
    """The experiment ``name``'s params and overrides (each key once, its last value)."""
    full = (*dedupe(sets), f"experiment.reports_dir={root}", f"experiment.name={name}")
    # auto numerics: portable, the promise of a reproduction (its checks compare it)
    return resolved(load_params(params_file, list(full)), "portable"), full


def replan(
    item: Planned,
    claims: Sequence[Claim],
    profile: str,
    params_file: str | Path | None,
    overrides: Sequence[str],
    out: str | Path | None,
) -> Planned:
    """``item`` planned again, now that its tuning runs may have their records."""
    again = plan(claims, profile, params_file, overrides, out)
    return next(it for it in again if it.experiment.name == item.experiment.name)


def finished_seeds(directory: Path) -> dict[str, Any] | None:
    """Per seed, the cells' summary and round records of a finished experiment folder
    (``records.collect``); None when it has not finished."""
    summary = _summary(directory)
    return None if summary is None else records.collect(directory, summary)


def chosen_lrs(probes: Sequence[Planned]) -> dict[str, float] | None:
    """Per grid cell, the tuning lr with the best mean validation accuracy over the last L
    rounds (the first of the grid on a tie); None until every tuning run is recorded."""
    scores = tuning_scores(probes)
    if scores is None:
        return None
    best: dict[str, tuple[float, float]] = {}
    for lr, cells in scores.items():
        for cell, acc in cells.items():
            if acc is not None and (cell not in best or acc > best[cell][1]):
                best[cell] = (lr, acc)
    return {cell: lr for cell, (lr, _) in sorted(best.items())}


def tuning_scores(probes: Sequence[Planned]) -> dict[float, dict[str, float | None]] | None:
    """lr -> cell -> mean validation accuracy over the last L rounds, from the tuning runs'
    records; None until every one is recorded."""
    out: dict[float, dict[str, float | None]] = {}
    for probe in probes:
        if status(probe) != "done" or (rec := records.read_record(probe.record)) is None:
            return None
        result = records.result(rec)
        out[float(probe.tried or 0.0)] = {
            name: cell.record.get("mean_accuracy_last_L") for name, cell in result.cells.items()
        }
    return out


def check_seeds(claim: Claim, profile: str, params: Params) -> None:
    """A verdict stands on ``claim.seeds_needed(profile)`` seeds: fewer stop in one line."""
    seeds = params.experiment.seeds or (params.experiment.seed,)
    need = claim.seeds_needed(profile)
    if len(seeds) < need:
        raise ConfigError(
            f"experiment.seeds: claim {claim.id!r} needs at least {need} seeds under profile "
            f"{profile!r} (got {list(seeds)}); e.g. --set experiment.seeds=[0,1,2]"
        )


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
    """``tuning`` (its lr waits for its tuning runs), ``done`` (a record for this
    configuration, code version and numerics), ``stale`` (a
    record for this configuration by another code version or numerics), ``finished`` (its
    folder holds a summary for this configuration written by this code version, no record
    yet), ``resume`` (round checkpoints of an unfinished run), ``rerun`` (a summary of
    another configuration) or ``pending``."""
    if item.waiting:
        return "tuning"
    key = config_key(item.params.flat())
    rec = records.read_record(item.record)
    if rec is not None and rec.get("config") == key:
        same = (rec.get("code"), rec.get("numerics")) == (
            records.loaded_code_version(),
            item.params.runtime.numerics,
        )
        return "done" if same else "stale"
    summary = _summary(item.dir)
    if summary is not None and config_key(summary["params"]) == key:
        if read_stamp(item.dir).get("code") == records.loaded_code_version():
            return "finished"
    checkpoints = item.dir / "checkpoints"
    if checkpoints.is_dir() and any(checkpoints.rglob("*.pt")):
        return "resume"
    return "rerun" if summary is not None else "pending"


def stale_text(item: Planned) -> str:
    """One line on a stale record: whose code and numerics, and how to go on."""
    rec = records.read_record(item.record) or {}
    return (
        f"{item.record}: computed by code {rec.get('code')} in {rec.get('numerics')} numerics; "
        f"this checkout is code {records.loaded_code_version()} in {item.params.runtime.numerics}: "
        "rerun it with --rerun-stale (its numbers would not be this code's)"
    )


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
    train it once; in a seed sweep each seed's base (``seed-<s>/pretrain``, the seed's own
    subset and init) from the same seed's folder of another experiment. Returns the first
    folder copied from, or None."""
    from tasks.backbone import BASE_FILE
    from tasks.pretrain import CARD_FILE, cached_card
    from tasks.sweep import seed_params

    if item.params.model.base != "pretrain":
        return None
    seeds = item.params.experiment.seeds
    wanted = (
        [(seed_params(item.params, s), f"seed-{s}/pretrain") for s in seeds]
        if seeds
        else [(item.params, "pretrain")]
    )
    source = None
    for params, rel in wanted:
        target = item.dir / rel
        if cached_card(params, target) is not None:
            continue
        for other in sorted(root.glob(f"*/{rel}")):
            if other != target and cached_card(params, other) is not None:
                for name in (BASE_FILE, CARD_FILE):
                    atomic_write_bytes(target / name, (other / name).read_bytes())
                source = source or other
                break
    return source


def write_stamp(item: Planned, seconds: float, resumed: bool) -> Path:
    """reproduce.json in the experiment's folder: how long the run that finished it took (this
    session's seconds; a resumed run's earlier sessions are not counted), its overrides and
    the code version that computed it."""
    return atomic_write_json(
        item.dir / STAMP,
        {
            "claim": item.claim.id,
            "experiment": item.experiment.name,
            "overrides": list(item.overrides),
            "seconds": round(seconds, 1),
            "resumed": resumed,
            "code": records.loaded_code_version(),
            "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        },
    )


def write_record(item: Planned) -> Path:
    """The experiment's committed record, from its finished folder and stamp."""
    summary = _summary(item.dir)
    if summary is None:
        raise FileNotFoundError(f"{item.dir / 'summary.json'}: the experiment has not finished")
    stamp = read_stamp(item.dir)
    return records.write_record(
        item.record,
        experiment=item.params.experiment.name,
        claim=item.claim.id,
        config=config_key(item.params.flat()),
        params=json.loads(json.dumps(summary["params"], default=str)),
        numerics=item.params.runtime.numerics,
        overrides=list(item.overrides),
        seconds=float(stamp.get("seconds") or 0.0),
        resumed=bool(stamp.get("resumed")),
        seeds=records.collect(item.dir, summary),
    )


def read_stamp(directory: Path) -> dict[str, Any]:
    path = directory / STAMP
    try:
        return json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError):
        return {}


def results(items: Sequence[Planned]) -> dict[str, ExperimentResult]:
    """The experiments with a current record, by experiment name: what the verdicts read."""
    out = {}
    for item in items:
        if status(item) == "done" and (rec := records.read_record(item.record)) is not None:
            out[item.experiment.name] = records.result(rec)
    return out
