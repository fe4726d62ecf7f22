"""``fedapt reproduce``: the seeds' claims, one experiment set per profile, and the
reproduction report (``reproduce/<profile>/reproduction.md``, from the committed records)."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from flows.cli.console import err, out
from flows.cli.guards import guarded
from flows.cli.logs import quiet_prefect_tracebacks
from flows.cli.params import ParamsOpt, SetOpt
from flows.cli.runguards import services_watched
from flows.cli.stopping import stop_on_signals

if TYPE_CHECKING:
    from tasks.reproduce.runs import Planned
    from tasks.reproduce.spec import Claim


@guarded
def reproduce(  # noqa: PLR0913  (typer: one parameter per option)
    profile: Annotated[
        str, typer.Option(help="ci (smoke test, minutes) | cpu (2 cores, ~6 h) | gpu (seeds)")
    ] = "cpu",
    params: ParamsOpt = None,
    set_: SetOpt = None,
    claim: Annotated[
        list[str] | None, typer.Option("--claim", "-c", help="only this claim (repeatable)")
    ] = None,
    plan_only: Annotated[
        bool, typer.Option("--plan", help="list the experiments and their status; run nothing")
    ] = False,
    out_dir: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="report, verdicts, figures and records (default: reproduce/<profile>)",
        ),
    ] = None,
    rerun_stale: Annotated[
        bool,
        typer.Option(
            "--rerun-stale",
            help="rerun experiments whose records another code version or numerics computed",
        ),
    ] = False,
    report_only: Annotated[
        bool,
        typer.Option(
            "--report",
            help="write the report from the records there are; run nothing",
        ),
    ] = False,
    revalidate: Annotated[
        bool,
        typer.Option(
            "--revalidate",
            help="check records of another code version, and current ones no second process "
            "has rerun: one whole seed (--seed) of each; identical ones are stamped with this "
            "code version",
        ),
    ] = False,
    seed: Annotated[
        int, typer.Option("--seed", min=0, help="the seed each --revalidate check reruns whole")
    ] = 0,
) -> None:
    """Run the experiments behind the seeds' claims and write the reproduction report.
    Rerun the same command to skip what finished and resume what did not."""

    from fedcore.errors import ConfigError
    from flows.services import runwatch
    from tasks.reproduce import registry, runs

    registry.check_profile(profile)  # a bad profile: one line, nothing loaded
    modes = [f for f, on in (("--plan", plan_only), ("--report", report_only),
                             ("--revalidate", revalidate)) if on]  # fmt: skip
    if len(modes) > 1:  # each is a command of its own: none silently wins
        raise ConfigError(f"{' and '.join(modes)} do different things; give one of them")
    if revalidate and rerun_stale:
        raise ConfigError("--revalidate checks stale records; it does not go with --rerun-stale")
    claims = registry.select(claim)
    params_file = str(params) if params is not None else None
    overrides = list(set_ or [])
    where = str(out_dir) if out_dir is not None else None
    items = runs.plan(claims, profile, params_file, overrides, where)
    if plan_only:
        out.print(_plan_table(items))
        return
    runwatch.grace_seconds()  # a bad FEDAPT_SERVICE_GRACE: one line, nothing started
    for name in runs.migrate(items):  # before anything reads a record's code version
        out.print(f"{name}: carried over to the imports code-version rule (same code)")
    if revalidate:
        _revalidate(profile, claims, params_file, overrides, where, seed)
        return
    stale = [it for it in items if runs.status(it) == "stale"]
    if stale and not rerun_stale:  # numbers of two code versions never mix in a report
        raise ConfigError(runs.stale_text(stale[0]))
    refused = [line for it in items if (line := runs.refusal(it, profile)) is not None]
    if refused and not rerun_stale:  # a verdict never reads a record it cannot stand on
        raise ConfigError(refused[0])
    words = ["fedapt reproduce", f"--profile {profile}"]
    words += [f"--claim {c}" for c in claim or []]
    words += [f"--params {params}"] if params is not None else []
    words += [f"--set {s}" for s in overrides]
    words += [f"--out {out_dir}"] if out_dir is not None else []
    if report_only:  # the claims without records say "not run yet"
        report = _report(profile, claims, items, " ".join(words), where)
        _print_verdicts(profile, claims, report)
        return
    if items:  # before anything computes (preflight builds models)
        from fedcore import numerics

        rt = items[0].params.runtime
        numerics.apply(rt.numerics, rt.threads)
    words += ["--rerun-stale"] if rerun_stale else []
    report = _run(
        profile, claims, items, params_file, overrides, " ".join(words), where, rerun_stale
    )
    _print_verdicts(profile, claims, report)


def _print_verdicts(profile: str, claims: Sequence[Claim], report: str) -> None:
    smoke = " (smoke test)" if profile == "ci" else ""
    decided = _verdicts(Path(report).parent)
    for c in claims:
        out.print(f"{c.id}: {decided.get(c.id, 'cannot say')}{smoke}", highlight=False)
    out.print(f"report: {report}")


def _report(
    profile: str,
    claims: Sequence[Claim],
    items: Sequence[Planned],
    command: str,
    where: str | None,
) -> str:
    """The report from the current records alone (``--report``): nothing runs, no server."""
    from tasks.io import check_writable
    from tasks.reproduce import report, runs

    root = runs.out_root(profile, where)
    check_writable("--out", root)
    return str(report.write_report(profile, claims, items, runs.results(items), root, command))


def _run(
    profile: str,
    claims: Sequence[Claim],
    items: Sequence[Planned],
    params_file: str | None,
    overrides: list[str],
    command: str,
    where: str | None,
    rerun_stale: bool,
) -> str:
    """The run itself, under `fedapt run`'s guards: inputs of every experiment still to run
    checked before anything starts, the reproduce folder locked, temporary servers tied to
    this process, MLflow runs ended KILLED/FAILED on a stop or an error."""
    from flows import services

    up_env = services.env_for_clients()
    with (
        stop_on_signals(cleanup=_runs_killed),
        services.patched_environ(up_env),
    ):
        from flows.plan import check_names, check_storage, prepare
        from flows.reproduce import reproduce_flow
        from tasks import tracking
        from tasks.config import experiment_dir
        from tasks.io import check_writable
        from tasks.reproduce import runs

        root = runs.reproduce_root(params_file, overrides, profile)
        todo = [it for it in items if runs.status(it) not in ("done", "finished")]
        for it in todo:
            check_names(it.params)
            check_writable("experiment.reports_dir", experiment_dir(it.params))
        check_writable("experiment.reports_dir", root)
        check_writable("--out", runs.out_root(profile, where))
        base = items[0].params if items else None
        need_s3 = any(bool(it.params.storage.bucket) for it in todo)
        with contextlib.ExitStack() as stack:
            stack.enter_context(services.run_lock(root, "fedapt reproduce"))
            for it in todo:  # every input checked before the first experiment starts (and
                # before any server: the buckets once S3 is up)
                prepare(it.params, storage=False, results=False, models=False, checked=True)
            stack.enter_context(services.run_environment(need_s3=need_s3))
            stack.enter_context(tracking.ended_on_error())
            for it in todo:
                check_storage(it.params, results=False)
            if base is not None and base.runtime.tracking:  # runs a killed run left RUNNING
                for name in [f"reproduce-{profile}", *(it.params.experiment.name for it in todo)]:
                    tracking.close_stale_runs(name)
            quiet_prefect_tracebacks()
            with (
                services.prefect_environment(),
                services_watched(
                    tuple(up_env),
                    "the experiments finished are kept, the one stopped resumes from its "
                    "checkpoints",
                    tracking=bool(base is not None and base.runtime.tracking),
                ),
            ):
                return reproduce_flow(
                    profile=profile,
                    params_file=params_file,
                    overrides=overrides,
                    claims=[c.id for c in claims],
                    command=command,
                    out=where,
                    rerun_stale=rerun_stale,
                )


def _revalidate(
    profile: str,
    claims: Sequence[Claim],
    params_file: str | None,
    overrides: list[str],
    where: str | None,
    seed: int,
) -> None:
    """``--revalidate``, under the run's guards; one line per record left stale, exit 1."""
    from flows import services

    with (
        stop_on_signals(cleanup=_runs_killed),
        services.patched_environ(services.env_for_clients()),
        services.run_environment(need_s3=False),
    ):
        from flows.reproduce import revalidate_flow
        from tasks import tracking

        quiet_prefect_tracebacks()
        with services.prefect_environment(), tracking.ended_on_error():
            failed = revalidate_flow(
                profile=profile,
                params_file=params_file,
                overrides=overrides,
                claims=[c.id for c in claims],
                out=where,
                seed=seed,
            )
    for line in failed:
        err.print(line, highlight=False, soft_wrap=True)
    if failed:
        raise typer.Exit(1)
    out.print("every record is revalidated at this code version (or there was none)")


def _runs_killed() -> None:
    from tasks import tracking

    tracking.end_active_runs("KILLED")


def _verdicts(root: Path) -> dict[str, str]:
    import json

    path = root / "verdicts.json"
    if not path.is_file():
        err.print(f"no verdicts in {root}", highlight=False)
        return {}
    words = {True: "holds", False: "does not hold", None: "cannot say"}
    return {
        k: v["text"].split(":")[0] if v["text"].startswith("not ") else words[v["holds"]]
        for k, v in json.loads(path.read_text()).items()
    }


def _plan_table(items: Sequence[Planned]) -> Table:
    from tasks.reproduce import runs

    t = Table(title="fedapt reproduce: experiments")
    for col in ("experiment", "claim", "cells", "rounds", "status", "folder"):
        t.add_column(col)
    for it in items:
        g = it.params.grid
        t.add_row(
            it.params.experiment.name,
            it.claim.id,
            " ".join(f"{a}-{d}" for a in g.algorithms for d in g.adapters),
            str(it.params.federation.rounds),
            runs.status(it),
            str(it.dir),
        )
    return t
