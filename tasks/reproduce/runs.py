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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedcore.errors import ConfigError
from tasks.config import Params, experiment_dir, load_params, resolved
from tasks.config.params import significant
from tasks.reproduce import records
from tasks.reproduce.registry import CLAIMS, check_profile, unmet
from tasks.reproduce.spec import Claim, Experiment, ExperimentResult, Results, dedupe
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
    waiting: bool = False  # waits for its tuning runs' records, or those it derives from
    joins: str | None = None  # a seed added by the seed policy: the record it joins

    @property
    def lrs(self) -> dict[str, float]:
        """The client lr per grid cell (``grid.client_lr``; empty: ``client.lr`` for all)."""
        return dict(self.params.grid.client_lr)

    @property
    def dir(self) -> Path:
        return experiment_dir(self.params)

    @property
    def record(self) -> Path:
        return records.record_path(self.records, self.joins or self.params.experiment.name)


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
            sets = (*exp.overrides(profile), *whole_test(exp.name, profile), *overrides)

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
            if (derive := exp.derive.get(profile)) is not None:
                got = derived_sets(exp, derive, planned)
                waiting = waiting or got is None
                more += list(got or ())
            params, full = typed(exp.name, more)
            check_seeds(claim, profile, params)
            planned.append(Planned(owning, exp, params, full, kept, waiting=waiting))
    return planned


def whole_test(name: str, profile: str) -> tuple[str, ...]:
    """The verdict window of the claims that read experiment ``name`` measured on the whole
    test split: its last ``window`` evaluations (the largest of its readers'); the ``ci``
    smoke test keeps its few test rows."""
    windows = [c.window for c in readers(name)]
    if profile == "ci" or not windows:
        return ()
    return (f"federation.whole_test_last={max(windows)}",)


def derived_sets(
    exp: Experiment, derive: Callable[[Results], tuple[str, ...]], planned: Sequence[Planned]
) -> tuple[str, ...] | None:
    """``exp``'s settings read off the records of the experiments it runs ``after`` (planned
    before it); None until each of them has a current record."""
    by_name = {it.experiment.name: it for it in planned}
    found: dict[str, ExperimentResult] = {}
    for name in exp.after:
        it = by_name.get(name)
        if it is None:
            raise ValueError(f"experiment {exp.name!r} runs after {name!r}, not planned before it")
        if status(it) != "done" or (rec := records.read_record(it.record)) is None:
            return None
        found[name] = records.result(rec)
    return tuple(derive(found))


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
    summary = summary_of(directory)
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


# A record holds its seeds one by one (a seed added later joins the record), so which seeds
# ran is not part of the configuration.
SEED_KEYS = ("experiment.seeds", "experiment.seed")


def config_key(flat: dict[str, Any]) -> dict[str, Any]:
    """The flat params that determine an experiment's numbers (its seeds aside), as plain JSON
    values."""
    kept = {k: v for k, v in significant(flat).items() if k not in SEED_KEYS}
    return json.loads(json.dumps(kept, sort_keys=True, default=str))


def planned_seeds(item: Planned) -> tuple[int, ...]:
    p = item.params.experiment
    return tuple(p.seeds) if p.seeds else (p.seed,)


def readers(name: str) -> tuple[Claim, ...]:
    """The claims whose verdicts read the experiment ``name``."""
    return tuple(c for c in CLAIMS if name in c.needs_all())


def rules_for(item: Planned) -> dict[str, str]:
    """The rule hash of every claim that reads ``item``, as its run starts (pre-registered)."""
    return {c.id: c.rule_hash() for c in readers(item.experiment.name)}


def refusal(item: Planned, profile: str) -> str | None:
    """Why ``item``'s current record cannot stand behind a verdict, in one line naming the
    record and the fix; None when it can (or there is no current record)."""
    rec = records.read_record(item.record)
    if rec is None or status(item) != "done":
        return None
    by = rec.get("computed_by")
    if not isinstance(by, dict):
        return (
            f"{item.record}: no computed_by (commit, code, clean tree, CPU, numerics): "
            "rerun it with --rerun-stale"
        )
    # the code it is current for: its own run's, or that of its last whole-seed revalidation
    last = (rec.get("revalidated") or [{}])[-1]
    stamped = by if by.get("code") == rec.get("code") else None
    if stamped is None and last.get("to") == rec.get("code"):
        stamped = last.get("computed_by") if isinstance(last.get("computed_by"), dict) else None
    if stamped is None:
        return (
            f"{item.record}: its code {rec.get('code')} is neither the one that computed it "
            f"({by.get('code')}) nor a whole-seed revalidation's: revalidate it "
            "(--revalidate) or rerun it (--rerun-stale)"
        )
    if profile != "ci" and not (by.get("clean") is True and stamped.get("clean") is True):
        return (
            f"{item.record}: computed or revalidated from a checkout with uncommitted changes "
            f"(commit {stamped.get('commit')}): rerun it from a clean commit with --rerun-stale"
        )
    for claim_id, want in rules_for(item).items():
        got = (rec.get("rules") or {}).get(claim_id)
        if got != want:
            return (
                f"{item.record}: ran under rule {got} of claim {claim_id!r}, whose rule is now "
                f"{want}: rerun it with --rerun-stale (a verdict reads only records run under "
                "its rule)"
            )
    return None


def summary_of(directory: Path) -> dict[str, Any] | None:
    path = directory / "summary.json"
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # a summary that does not parse is rewritten by the rerun


def status(item: Planned) -> str:
    """``waiting`` (for its tuning runs' records, or those its settings derive from),
    ``done`` (a record for this
    configuration, code version and numerics), ``stale`` (a
    record for this configuration by another code version or numerics), ``finished`` (its
    folder holds a summary for this configuration written by this code version, no record
    yet), ``resume`` (round checkpoints of an unfinished run), ``rerun`` (a summary of
    another configuration) or ``pending``."""
    if item.waiting:
        return "waiting"
    flat = item.params.flat()
    key = config_key(flat)
    rec = records.read_record(item.record)
    if rec is not None and rec.get("config") == key:
        same = records.is_current(rec, flat) and rec.get("numerics") == item.params.runtime.numerics
        if not same:
            return "stale"
        if set(map(str, planned_seeds(item))) <= set(rec.get("seeds", {})):
            return "done"
    summary = summary_of(item.dir)
    if summary is not None and config_key(summary["params"]) == key:
        if records.same_code(read_stamp(item.dir).get("code"), flat):
            return "finished"
    # round checkpoints: <dir>/checkpoints/ (one seed), <dir>/seed-<s>/checkpoints/ (seeds)
    if any(item.dir.glob("checkpoints/*.pt")) or any(item.dir.glob("seed-*/checkpoints/*.pt")):
        return "resume"
    return "rerun" if summary is not None else "pending"


def migrate(items: Sequence[Planned]) -> list[str]:
    """The records of ``items`` the former code-version rule stamped, carried over to this one
    where that is sound (``records.migrate``), and their runs' stamps; returns the records'
    names."""
    for item in items:  # a run in progress: its registration
        records.migrate_stamp(item.dir / STAMP, item.params.flat())
    return [item.record.name for item in items if records.migrate(item.record)]


def stale_text(item: Planned) -> str:
    """One line on a stale record: whose code and numerics, and how to go on."""
    rec = records.read_record(item.record) or {}
    code = records.record_code(item.params.flat())
    return (
        f"{item.record}: computed by code {rec.get('code')} in {rec.get('numerics')} numerics; "
        f"this checkout is code {code} in {item.params.runtime.numerics}: "
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
    from tasks.results.progress import clock

    if left <= 0:
        return "nothing left"
    if done <= 0:
        return f"{left} cell-rounds left, ETA after the first experiment"
    return f"{left} cell-rounds left, ETA {clock(left * seconds / done)} at this session's pace"


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
