"""The reproduction flow (Prefect 3, ``fedapt-reproduce``): every experiment the claims of a
profile need, each through the experiment flow exactly as ``fedapt run`` runs it (a subflow:
partition, validation, training tasks, MLflow, summary), then the reproduction report.

Finished experiments (a committed record for the same configuration, code version and
numerics, ``tasks.reproduce.records``) are skipped; an unfinished one resumes its cells from
their round checkpoints (the experiment flow's own resume), so the same command can be run
again after a stop, in another session or on a fresh clone, until everything is done. Each
experiment writes its record as soon as it finishes; the report is rewritten from the
records each time, and logged to MLflow as the run ``reproduce-<profile>`` with the report
and figures as artifacts.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from fedcore import numerics
from flows import services
from flows.experiment import experiment_flow
from tasks import tracking
from tasks.reproduce import recording, records, report, revalidate, runs
from tasks.reproduce.registry import select
from tasks.results.progress import clock

if TYPE_CHECKING:
    from tasks.reproduce.spec import Claim


def _run_name() -> str:
    from prefect.runtime import flow_run

    profile = flow_run.parameters.get("profile", "cpu")
    return f"reproduce-{profile}-{datetime.now(UTC).strftime('%Y%m%d-%H%M%S')}"


@task(name="reproduction-report", cache_policy=NO_CACHE)
def report_task(
    profile: str,
    claims: list[str] | None,
    params_file: str | None,
    overrides: list[str],
    command: str,
    out: str | None = None,
) -> str:
    """reproduction.md, verdicts.json and figures/ from every current record."""
    chosen = select(claims)
    items = runs.plan(chosen, profile, params_file, overrides, out)
    root = runs.out_root(profile, out)
    return str(report.write_report(profile, chosen, items, runs.results(items), root, command))


@task(name="log-reproduction", retries=2, retry_delay_seconds=2, cache_policy=NO_CACHE)
def log_report_task(profile: str, root: str) -> str:
    """The MLflow run ``reproduce-<profile>`` (experiment of the same name): the report,
    verdicts.json and the figures as artifacts, each claim's verdict as a tag."""
    import json

    out = Path(root)
    name = f"reproduce-{profile}"
    run_id = tracking.start_experiment_run(name, {"profile": profile})
    verdicts = json.loads((out / "verdicts.json").read_text())
    client = tracking.client()
    for claim, v in verdicts.items():
        word = {True: "holds", False: "does not hold", None: "cannot say"}[v["holds"]]
        client.set_tag(run_id, f"claim.{claim}", word)
    tracking.log_artifacts(run_id, [str(out / runs.REPORT), str(out / "verdicts.json")], "")
    figures = sorted(str(p) for p in (out / runs.FIGURES).glob("*.png"))
    if figures:
        tracking.log_artifacts(run_id, figures, runs.FIGURES)
    tracking.end_run(run_id)
    return run_id


@flow(name="fedapt-reproduce", flow_run_name=_run_name)
def reproduce_flow(
    profile: str = "cpu",
    params_file: str | None = None,
    overrides: list[str] | None = None,
    claims: list[str] | None = None,
    command: str = "fedapt reproduce",
    out: str | None = None,
    rerun_stale: bool = False,
) -> str:
    """Run what the profile's claims still need, then write (and track) the report.
    Returns the report's path."""
    records.loaded_sources()  # the code this run computes with, pinned before it starts
    records.loaded_drivers()  # ... and the code that drives it (what it can reach)
    records.checkout()  # ... and its commit and whether its tree was clean
    sets = list(overrides or [])
    chosen = select(claims)
    items = list(runs.plan(chosen, profile, params_file, sets, out))
    runs.migrate(items)  # a deployment's run: records of the former code-version rule
    if items:  # a deployment's run: the numerics before anything computes
        numerics.apply(items[0].params.runtime.numerics, items[0].params.runtime.threads)
    root = runs.reproduce_root(params_file, sets, profile)
    log = get_run_logger()
    with services.run_lock(root, "fedapt reproduce"):
        states = [runs.status(item) for item in items]
        left = sum(
            runs.work(i)
            for i, s in zip(items, states, strict=True)
            if s not in ("done", "finished")
        )
        done, spent = 0, 0.0  # this session's cell-rounds and seconds: the ETA's pace
        for k, (item, state) in enumerate(zip(items, states, strict=True), 1):
            name = f"experiment {k} of {len(items)}: {item.params.experiment.name}"
            if state == "waiting":  # its tuning runs (or those it derives from) came before it
                item = items[k - 1] = runs.replan(item, chosen, profile, params_file, sets, out)
                state = runs.status(item)
                log.info("%s: planned from the records before it: %s", name, item.overrides[-3:])
            if state == "done":
                if (refused := runs.refusal(item, profile)) is None:
                    log.info("%s: recorded for this configuration and code, skipped", name)
                    continue
                if not rerun_stale:
                    raise ValueError(refused)
                state = "stale"
            if state == "finished":  # ran to the end, its record not yet written
                recording.write_record(item)
                log.info("%s: finished earlier, recorded in %s", name, item.record)
                continue
            if state == "waiting":  # cannot be: what it waits for ran above, or stopped the flow
                raise RuntimeError(f"{name}: its tuning runs have no records")
            if state == "stale":
                if not rerun_stale:
                    raise ValueError(runs.stale_text(item))
                log.info("%s: its record cannot stand (%s): rerun from scratch", name, "stale")
                shutil.rmtree(item.dir, ignore_errors=True)
            log.info(
                "%s: %s (%d cell-rounds; %s)",
                name,
                "resuming" if state == "resume" else "running",
                runs.work(item),
                runs.eta_text(done, spent, left),
            )
            seconds = _run_experiment(item, root, params_file, name, resumed=state == "resume")
            recording.write_record(item)
            done, spent, left = done + runs.work(item), spent + seconds, left - runs.work(item)
            log.info("%s: done in %s", name, clock(seconds))
        if profile != "ci":  # the smoke test's verdicts mean nothing: no seeds added
            _more_seeds(chosen, items, profile, params_file, root, log)
        path = report_task(profile, claims, params_file, sets, command, out)
        if runs.base_params(params_file, sets).runtime.tracking:
            log_report_task(profile, str(runs.out_root(profile, out)))
    return path


def _run_experiment(
    item: runs.Planned, root: Path, params_file: str | None, name: str, resumed: bool
) -> float:
    """Pre-register ``item`` (the rules it runs under), run it through the experiment flow,
    stamp it; returns the seconds it took."""
    log = get_run_logger()
    recording.register(item)
    if (source := recording.share_base(item, root)) is not None:
        log.info("%s: frozen base from %s (same data, model, pretrain)", name, source)
    started = time.perf_counter()
    experiment_flow(
        params=item.params,
        params_file=params_file or "params.yaml",
        overrides=list(item.overrides),
        entry="reproduce",
    )
    seconds = time.perf_counter() - started
    recording.write_stamp(item, seconds, resumed=resumed)
    return seconds


def _more_seeds(
    chosen: Sequence[Claim],
    items: Sequence[runs.Planned],
    profile: str,
    params_file: str | None,
    root: Path,
    log: Any,
) -> None:
    """The seed policy: while a claim's verdict has a check whose interval straddles its
    threshold, run one seed more of each of its experiments (up to ``Claim.seeds.most``),
    each joining its experiment's record."""
    from tasks.reproduce.report import verdicts

    for claim in chosen:
        mine = [it for it in items if it.experiment.name in claim.needs_all()]
        if not mine or any(runs.status(it) != "done" for it in mine):
            continue
        while (v := verdicts([claim], mine, runs.results(mine), profile)[claim.id]).more_seeds:
            seed = v.seeds  # seeds 0 .. n-1 ran: the next one
            log.info(
                "claim %s: an interval straddles on %d seeds: seed %d", claim.id, v.seeds, seed
            )
            for it in mine:
                extra = recording.extra_seed(it, seed, params_file)
                if runs.status(extra) == "done":
                    continue
                name = f"{extra.params.experiment.name} (seed {seed} of {it.experiment.name})"
                _run_experiment(extra, root, params_file, name, resumed=False)
                recording.merge_seed(it, extra, seed)


@flow(name="fedapt-reproduce-revalidate", flow_run_name=_run_name)
def revalidate_flow(
    profile: str = "cpu",
    params_file: str | None = None,
    overrides: list[str] | None = None,
    claims: list[str] | None = None,
    out: str | None = None,
    seed: int = revalidate.SEED,
) -> list[str]:
    """Check the records of another code version by rerunning one whole seed of each
    (``tasks.reproduce.revalidate``); identical ones are stamped with this code version.
    Returns one line per record that could not be revalidated."""
    records.loaded_sources()
    records.loaded_drivers()
    where = records.checkout()
    sets = list(overrides or [])
    if profile != "ci" and not where["clean"]:
        return [
            "fedapt reproduce --revalidate: the checkout has uncommitted changes "
            f"({', '.join(where['changed'])}): commit them first (a revalidation stamps "
            "records with this commit's code)"
        ]
    chosen = select(claims)
    items = runs.plan(chosen, profile, params_file, sets, out)
    runs.migrate(items)
    if items:
        numerics.apply(items[0].params.runtime.numerics, items[0].params.runtime.threads)
    root = runs.reproduce_root(params_file, sets, profile)
    log = get_run_logger()
    failed = []
    with services.run_lock(root, "fedapt reproduce"):
        # Checks share a frozen base only with checks of this run (this code): an earlier
        # revalidation's folders hold bases an older pretrain code trained.
        shutil.rmtree(root / revalidate.REVALIDATE, ignore_errors=True)
        for k, item in enumerate(items, 1):
            name = f"record {k} of {len(items)}: {item.params.experiment.name}"
            if runs.status(item) == "waiting":  # its tuning runs' records, revalidated above
                item = runs.replan(item, chosen, profile, params_file, sets, out)
            state = runs.status(item)
            rec = records.read_record(item.record)
            why = revalidate.to_check(state, rec)
            if why is None or rec is None:
                word = "current and revalidated" if state == "done" else state
                log.info("%s: %s, nothing to check", name, word)
                continue
            if rec.get("numerics") != item.params.runtime.numerics:
                failed.append(
                    f"{item.record}: {rec.get('numerics')} numerics, not "
                    f"{item.params.runtime.numerics}: rerun it with --rerun-stale"
                )
                continue
            if str(seed) not in rec.get("seeds", {}):
                failed.append(f"{item.record}: has no seed {seed}: revalidate with another --seed")
                continue
            check = revalidate.check_item(item, seed, params_file, root)
            shutil.rmtree(check.dir, ignore_errors=True)  # a check never reuses an older one's
            recording.share_base(check, root / revalidate.REVALIDATE)
            log.info("%s: %s, rerunning seed %d whole", name, why, seed)
            experiment_flow(
                params=check.params,
                params_file=params_file or "params.yaml",
                overrides=list(check.overrides),
                entry="reproduce",
            )
            got = runs.finished_seeds(check.dir) or {}
            diffs = revalidate.compare(rec, got, seed)
            if diffs:
                failed.append(
                    f"{item.record}: {diffs[0]} (and {len(diffs) - 1} more); rerun "
                    "it with --rerun-stale"
                )
                log.info("%s: differs: %s", name, "; ".join(diffs[:3]))
                continue
            cells = sorted(rec["seeds"][str(seed)]["cells"])
            path = revalidate.restamp(item.record, rec, seed, cells)
            log.info("%s: identical, stamped %s", name, records.read_record(path)["code"])
    return failed
