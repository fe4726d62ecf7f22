"""What every ``fedapt`` command shares: the Typer app, consoles, options, the one-line error
guard, params loading and the results table. Heavy imports happen inside commands."""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any, ParamSpec, TypeVar

import typer
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from flows.streams import MaskedStream, mask_streams, release_descriptors

# Offline and quiet by default; the project keeps its own Prefect home. Set when a command
# runs (the app's callback), before it imports Prefect or MLflow; never at import.
_ROOT = Path(__file__).resolve().parents[2]
OFFLINE_DEFAULTS = {
    "PREFECT_HOME": str(_ROOT / ".prefect"),
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    "DO_NOT_TRACK": "true",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DVC_NO_ANALYTICS": "1",
    # MLflow's HTTP client retries a request 7 times with a backoff factor of 2 (about 4
    # minutes a call; a run that lost its server stalled for 11): 3 retries, factor 1 (about
    # 7 s) ride out a blip; a server that is gone is the run's watch's to report (runwatch).
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "3",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
}


# cuBLAS reads its workspace size once, at its first call, and its deterministic mode needs
# this one: set before any CUDA work (fedcore.device.CUBLAS_WORKSPACE, which
# tests/test_engine.py keeps equal; not imported here, it would import torch for every command).
CUBLAS_WORKSPACE = ":4096:8"


# Variables that name a path: an empty value (`FEDAPT_STATE_DIR= fedapt ...`) is refused in one
# line. (Prefect took an empty PREFECT_HOME as the current folder and wrote its database there;
# the others fell back to their defaults without a word.)
EMPTY_REFUSED = {
    "FEDAPT_STATE_DIR": "a folder fedapt may create and write into",
    "PREFECT_HOME": "a folder Prefect may create and write into",
    "FEDAPT_MLFLOW_CONFIG": "a TOML file with one [server] table, as mlflow/server.toml",
}


def offline_defaults() -> None:
    """Every command: the environment defaults above, where the user set none, and what
    CUDA libraries read at their first call; and standard output and error masked
    (``mask_streams``)."""
    from flows import settings

    settings.forget()  # a new command (a test's CliRunner runs many in one process)
    for var, unset in EMPTY_REFUSED.items():  # set but empty: not "unset", never a guess
        if var in os.environ and not os.environ[var].strip():
            print_error(
                f"{var} is set but empty ({os.environ[var]!r}); allowed: {unset} "
                f"(unset {var} for its default)"
            )
            raise typer.Exit(2)
    given = os.environ.get("PREFECT_HOME")
    for key, value in {**OFFLINE_DEFAULTS, "CUBLAS_WORKSPACE_CONFIG": CUBLAS_WORKSPACE}.items():
        os.environ.setdefault(key, value)
    default = OFFLINE_DEFAULTS["PREFECT_HOME"]
    settings.setting_path(
        "PREFECT_HOME",
        given or f"unset, so {default}",
        os.environ["PREFECT_HOME"],
        f"a folder Prefect may create and write into (unset: {default})",
    )
    mask_streams()


P = ParamSpec("P")
R = TypeVar("R")

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="fedapt: communication-efficient federated learning with parameter-efficient adapters.",
)
out = Console(width=140) if not sys.stdout.isatty() else Console()
err = Console(stderr=True)

ParamsOpt = Annotated[
    Path | None, typer.Option("--params", "-p", help="params file (default: params.yaml)")
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", "-s", help="override a parameter, e.g. --set federation.rounds=5"),
]


class _NoTracebackForFedaptErrors(logging.Filter):
    """Prefect logs task/flow failures with tracebacks; a FedaptError is a user-facing
    message, so its records keep the message and lose the traceback. Any password in a URI
    is masked, on the console and in the logs sent to the Prefect API."""

    def filter(self, record: logging.LogRecord) -> bool:
        from fedcore.errors import FedaptError, mask_credentials

        if record.exc_info and isinstance(record.exc_info[1], FedaptError):
            record.exc_info = None
            record.exc_text = None
        with contextlib.suppress(Exception):  # a record whose args do not format: as it is
            message = record.getMessage()
            if (masked := mask_credentials(message)) != message:
                record.msg, record.args = masked, ()
        return True


class _TracebacksToLog(logging.Filter):
    """Library lines that would come before fedapt's own one-line error go to the run's log
    ``<state dir>/logs/fedapt.log`` (``FEDAPT_STATE_DIR``, default .fedapt/), not the console:

    - Prefect's failure lines (``prefect_failure``: "Task run failed ...", "Finished in state
      Failed(...)", "Crash detected! ...", "Encountered exception during execution"),
      tracebacks included, are appended there and not printed: the error line fedapt prints
      as the run stops says what failed. (A log that cannot be written, a full disk: they
      are dropped all the same.) Progress lines ("Finished in state Completed()") stay.
    - another library's traceback is one line on the console, the record's message and where
      its traceback went, the record appended to the log.

    The logs sent to the Prefect API keep everything."""

    def filter(self, record: logging.LogRecord) -> bool:
        if prefect_failure(record):
            _append_to_log(record)
            return False
        if not record.exc_info or record.exc_info[1] is None:
            return True
        if (path := _append_to_log(record)) is not None:
            record.exc_info = None
            record.exc_text = None
            record.msg, record.args = f"{record.getMessage()} (traceback in {path})", ()
        return True


# Prefect's terminal states that are not a success ("Finished in state Failed(...)")
_FAILED_STATES = ("Failed", "Crashed", "TimedOut", "Cancelled", "Cancelling", "Aborted")


def prefect_failure(record: logging.LogRecord) -> bool:
    """A line Prefect logs as a task or flow run fails or crashes: an error of a ``prefect``
    logger, or its "Finished in state <not a success>" (a flow run's is logged as INFO)."""
    if record.name != "prefect" and not record.name.startswith("prefect."):
        return False
    if record.levelno >= logging.ERROR:
        return True
    with contextlib.suppress(Exception):
        message = record.getMessage()
        if message.startswith("Finished in state "):
            return message.removeprefix("Finished in state ").startswith(_FAILED_STATES)
    return False


def _append_to_log(record: logging.LogRecord) -> Path | None:
    """Append ``record`` (its traceback too, passwords masked) to the run's log, once however
    many console handlers see it; its path, or None when it cannot be written (a full disk)."""
    path = run_log_path()
    if getattr(record, "fedapt_logged", False):
        return path
    record.fedapt_logged = True
    text = logging.Formatter("%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s")
    try:
        from fedcore.errors import mask_credentials
        from flows.services.state import prepare_dir

        entry = mask_credentials(text.format(record))
        prepare_dir(path.parent.parent)  # the state dir, kept out of git
        path.parent.mkdir(exist_ok=True)
        with path.open("a", encoding="utf-8") as fh:
            fh.write(entry + "\n")
    except Exception:
        return None
    return path


def run_log_path() -> Path:
    """The log of fedapt's own process: what libraries log with a traceback."""
    from flows.services.config import state_dir

    return state_dir() / "logs" / "fedapt.log"


def _is_console(handler: logging.Handler) -> bool:
    """A handler that writes to the terminal (Prefect's console handler, a stream handler on
    standard output or error), not to a file or a test's capture."""
    stream = getattr(handler, "stream", None)
    consoles = (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)
    return hasattr(handler, "console") or isinstance(stream, MaskedStream) or stream in consoles


_QUIET = _NoTracebackForFedaptErrors()
_TO_LOG = _TracebacksToLog()


def quiet_prefect_tracebacks() -> None:
    """Prefect's console handlers: fedapt's errors without tracebacks, other tracebacks in
    the run's log (``_TracebacksToLog``), and (a command run again in the same process, as a
    test's CliRunner does) a handler whose stream was closed writes to this call's standard
    error instead of printing a logging error per record."""
    names = ["prefect", *(n for n in logging.Logger.manager.loggerDict if n.startswith("prefect"))]
    for name in names:
        for handler in logging.getLogger(name).handlers:
            if _QUIET not in handler.filters:
                handler.addFilter(_QUIET)
    for handler in logging.getLogger().handlers:  # the console: what propagates reaches it
        if _is_console(handler):
            for flt in (_QUIET, _TO_LOG):
                if flt not in handler.filters:
                    handler.addFilter(flt)
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    for logger in loggers:
        for handler in getattr(logger, "handlers", ()):
            if getattr(getattr(handler, "stream", None), "closed", False):
                handler.stream = sys.stderr  # not setStream: it flushes the closed one
            console = getattr(handler, "console", None)
            if console is not None and getattr(console.file, "closed", False):
                console.file = sys.stderr


def print_error(message: str) -> None:
    """``fedapt: error: <message>`` on stderr, the prefix red; the message as plain text (a
    value such as ``[/x]`` or ``[full]`` is printed as is, never read as Rich markup), any
    password in a URI masked."""
    from fedcore.errors import mask_credentials

    line = Text("fedapt: error: ", style="red")
    message = mask_credentials(" ".join(message.splitlines())) if message else "(no message)"
    line.append(message)
    err.print(line, highlight=False, soft_wrap=True)


def guarded(fn: Callable[P, R] | None = None, *, services: bool = False) -> Any:
    """A command's error guard, as a decorator: a FedaptError becomes one line on stderr and
    exit code 2 (``guard``). ``services=True`` runs the command with the services of `fedapt
    up` that are up (the same rule as `fedapt run`: a `dvc repro` stage run while the MLflow
    server is up is tracked there, not in mlruns/)."""

    def wrap(f: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(f)
        def run(*args: P.args, **kwargs: P.kwargs) -> R:
            def body() -> R:
                if not services:
                    return f(*args, **kwargs)
                from flows import services as svc

                with svc.patched_environ(svc.env_for_clients()):
                    return f(*args, **kwargs)

            return guard(body)  # type: ignore[no-any-return]

        return run

    return wrap(fn) if fn is not None else wrap


def guard(fn: Callable[[], Any]) -> Any:
    """Run a command body; a FedaptError becomes one line on stderr and exit code 2."""
    from fedcore.errors import FedaptError

    try:
        return fn()
    except FedaptError as exc:
        print_error(str(exc))
        raise typer.Exit(2) from None
    except OSError as exc:  # at the edges: a path that cannot be read or written
        from flows import settings

        full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
        if exc.filename is None:
            if not full:
                raise
            print_error(_full_disk_without_a_path(exc))  # a write that names no file
            raise typer.Exit(2) from None
        path = exc.filename if exc.filename2 is None else f"{exc.filename} -> {exc.filename2}"
        # the setting (params key, variable) that made the path; a full disk too: the line
        # names the setting whose folder filled, and the file
        named = settings.explain(exc, FULL_DISK_ADVICE if full else None)
        if named is not None:
            print_error(named)
            raise typer.Exit(2) from None
        if full:
            hint = FULL_DISK_ADVICE
        else:
            hint = (
                "check that the path exists, is the right kind (file or folder) and that you "
                "may read and write it"
            )
        print_error(f"{path}: {exc.strerror or type(exc).__name__}; {hint}")
        raise typer.Exit(2) from None
    except KeyboardInterrupt as exc:
        if isinstance(exc, Interrupted):  # the command unwound: stop now, threads and all
            _exit_now(exc.exit_code, exc.signame)
        err.print("fedapt: interrupted")
        raise typer.Exit(130) from None


FULL_DISK_ADVICE = "free some space there (or raise the quota) and run again"


def _full_disk_without_a_path(exc: OSError) -> str:
    """A full disk whose error names no file: the folders the command's settings name."""
    from flows import settings

    problem = exc.strerror or "No space left on device"
    named = [f"{s.key} ({settings.shorten(str(s.path))})" for s in settings.registered()]
    where = ", ".join(named) or "the outputs"
    return f"{problem}; free some space (or raise the quota) on the disk of {where}, then run again"


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM under ``stop_on_signals``: unwinds like Ctrl-C; exit 128 + signal."""

    def __init__(self, signum: int) -> None:
        self.signame = signal.Signals(signum).name
        self.exit_code = 128 + signum
        super().__init__(self.signame)


_stop_line = threading.Lock()  # the one line of a stop, whoever prints it
CLEANUP_SECONDS = 3.0  # stop_on_signals: the most its cleanup may take once grace is over


def _exit_now(code: int, signame: str, cleanup: Callable[[], Any] | None = None) -> None:
    stop_now(code, f"fedapt: interrupted by {signame} (exit {code})", cleanup=cleanup)


def stop_now(
    code: int,
    line: str,
    *,
    error: bool = False,
    cleanup: Callable[[], Any] | None = None,
) -> None:
    """End the process now, threads and all: ``line`` on stderr, the last thing it prints
    (``error``: as ``print_error`` prints it), then exit ``code``. Whoever stops first prints
    the one line; others wait for the exit. From the start of the stop only this thread
    prints (``MaskedStream.seal``), and child processes print nowhere once their output so
    far is out (``release_descriptors``); ``cleanup`` runs first, for ``CLEANUP_SECONDS`` at
    most.
    The semaphores of its worker pools are unlinked (no "leaked semaphore objects" warning
    from multiprocessing's resource tracker)."""
    if not _stop_line.acquire(blocking=False):
        while True:  # another thread is stopping the process: its line, its exit code
            time.sleep(1)
    MaskedStream.seal()
    if cleanup is not None:
        bounded(cleanup, CLEANUP_SECONDS)
    _release_semaphores()
    # what the command's child processes printed is written out; from here on they print
    # nowhere, so the line below is the last on the terminal
    release_descriptors()
    if error:
        print_error(line)
    else:
        err.print(line, highlight=False, markup=False, soft_wrap=True)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _release_semaphores() -> None:
    """Unlink the named semaphores of this process's multiprocessing objects (a process
    pool's queues and locks), as their finalizers do at a normal exit: ``os._exit`` skips
    them, and the resource tracker would print a warning per run. The workers keep theirs."""
    synchronize = sys.modules.get("multiprocessing.synchronize")
    if synchronize is None:
        return
    from multiprocessing import util

    for finalizer in list(util._finalizer_registry.values()):
        if getattr(finalizer, "_callback", None) is synchronize.SemLock._cleanup:
            with contextlib.suppress(Exception):
                finalizer()


def bounded(fn: Callable[[], Any], seconds: float) -> None:
    """Run ``fn`` (best effort: its errors are ignored) for at most ``seconds``: e.g. marking
    MLflow runs KILLED while stopping, which must not wait on a server that is gone."""

    def body() -> None:
        with contextlib.suppress(Exception):
            fn()

    worker = threading.Thread(target=body, name="fedapt-bounded", daemon=True)
    worker.start()
    worker.join(seconds)


@contextlib.contextmanager
def stop_on_signals(
    grace: float = 4.0, cleanup: Callable[[], None] | None = None
) -> Iterator[None]:
    """SIGINT and SIGTERM raise ``Interrupted`` in the main thread, so the command unwinds:
    its temporary servers stop, its MLflow runs are marked KILLED, its lock is released.
    ``guard`` then prints one line and exits at once (130 / 143) without waiting for a
    training thread to finish its cell. If unwinding takes longer than ``grace`` seconds
    (a task runner waiting for the cell in training), ``cleanup`` runs (``CLEANUP_SECONDS``
    at most) and the process exits anyway, within ``grace + CLEANUP_SECONDS`` of the signal:
    its tied servers die with it, the kernel drops its locks.

    The grace timer starts from the signal itself, seen through ``signal.set_wakeup_fd``:
    while a flow runs, Prefect's own SIGTERM handler is installed instead of ours (it raises
    ``TerminationSignal`` and re-sends the signal once its engine has unwound).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    timer_started = threading.Event()
    raised = threading.Event()

    def start_timer(signum: int) -> None:
        if timer_started.is_set():
            return
        timer_started.set()

        def late() -> None:
            time.sleep(grace)  # (cleanup: bounded, a server that is gone must not hold it)
            _exit_now(128 + signum, signal.Signals(signum).name, cleanup)

        threading.Thread(target=late, name="fedapt-stop", daemon=True).start()

    def handler(signum: int, frame: Any) -> None:
        start_timer(signum)
        if raised.is_set():  # a second signal while stopping: the timer ends it
            return
        raised.set()
        raise Interrupted(signum)

    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)

    def watch() -> None:
        with contextlib.suppress(OSError):
            while data := os.read(read_end, 64):
                for signum in data:
                    if signum in (signal.SIGINT, signal.SIGTERM):
                        start_timer(signum)
        os.close(read_end)

    old = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    old_fd = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    threading.Thread(target=watch, name="fedapt-signals", daemon=True).start()
    try:
        yield
    finally:
        signal.set_wakeup_fd(old_fd)
        os.close(write_end)  # the watcher reads end-of-file and ends
        for sig, previous in old.items():
            signal.signal(sig, previous)


def services_watched(
    managed: tuple[str, ...], resume: str, *, tracking: bool
) -> contextlib.AbstractContextManager[None]:
    """For the block, the watch over the services a run uses (``flows.services.runwatch``):
    one that stops answering (`fedapt down`, a crash) stops the run within seconds in one
    line (``services_lost``), not after minutes of the clients' retries: after
    ``FEDAPT_SERVICE_GRACE`` seconds without an answer (default 3). ``managed``: the
    variables `fedapt up`'s services set; ``resume``: what the same command does then."""
    from flows.services import runwatch

    return runwatch.watch(
        runwatch.watched_services(managed=managed),
        lambda lost: services_lost(lost, resume, tracking=tracking),
        grace=runwatch.grace_seconds(),  # FEDAPT_SERVICE_GRACE (checked as the command starts)
    )


def services_lost(lost: list[Any], resume: str, *, tracking: bool) -> None:
    """Services of the run stopped answering: the run stops now, exit 2, in one line naming
    them, what to start and how to resume. Its MLflow runs are marked KILLED while the MLflow
    server still answers (else the rerun marks them)."""
    what = ", ".join(f"{s.name} ({s.var}={s.shown})" for s in lost)
    who = "they" if len(lost) > 1 else "it"
    if all(s.managed for s in lost):
        how = "start the services again (fedapt up), then run the same command"
    elif any(s.managed for s in lost):
        how = "once they answer again (fedapt up starts fedapt's), run the same command"
    else:
        how = f"once {who} {'answer' if len(lost) > 1 else 'answers'} again, run the same command"
    mlflow_up = not any(s.name == "mlflow" for s in lost)
    stop_now(
        2,
        f"{what} stopped answering during the run (`fedapt down`, or {who} crashed); "
        f"the run stopped: {how}; {resume}",
        error=True,
        cleanup=_runs_killed if tracking and mlflow_up else None,
    )


def _runs_killed() -> None:
    from tasks import tracking

    tracking.end_active_runs("KILLED")


EXIT_DIVERGED = 3  # the outputs were written, but training diverged (runtime.allow_divergence)


def exit_if_diverged(params: Any, records: list[dict[str, Any]]) -> None:
    """Exit with EXIT_DIVERGED when a cell diverged, unless ``runtime.allow_divergence``
    (each cell printed its warning line as it ended)."""
    from tasks.train import diverged

    cells = diverged(records)
    if cells and not params.runtime.allow_divergence:
        err.print(
            f"fedapt: diverged: {', '.join(cells)} (exit {EXIT_DIVERGED}; "
            "runtime.allow_divergence: true accepts it)",
            highlight=False,
            markup=False,
        )
        raise typer.Exit(EXIT_DIVERGED)


def load(
    params: Path | None,
    overrides: list[str] | None,
    extra: list[str] | None = None,
    *,
    numerics: str = "native",
) -> Any:
    """The typed params, their numerics in force (``numerics``: what ``runtime.numerics:
    auto`` means for this command; the DVC stages and ``fedapt reproduce`` say portable)."""
    from tasks.config import in_force, load_params

    p = load_params(params, [*(overrides or []), *(extra or [])])
    _setting_paths(p)
    # Before anything computes: ATen and MKL fix their kernels at their first call.
    return in_force(p, numerics)


def _setting_paths(p: Any) -> None:
    """The params keys that become paths, for ``guard``'s one line (``flows.settings``)."""
    from flows.settings import setting_path
    from tasks.config import experiment_dir

    reports = p.experiment.reports_dir
    setting_path(
        "experiment.reports_dir",
        reports,
        experiment_dir(p),
        "a folder fedapt may create and write into, e.g. reports (the experiment's folder "
        f"{p.experiment.name} goes in it)",
    )
    setting_path(
        "data.root",
        p.data.root,
        p.data.root,
        "a folder holding the dataset's files, or one fedapt may create and download into, "
        "e.g. data/raw",
    )


def results_table(records: list[dict[str, Any]]) -> Table:
    """One row per grid cell: accuracy in %, traffic in MiB (2**20 bytes) per round and in
    total, the round it diverged at. A record read from metrics.json (the report stage)
    carries its per-round list in ``rounds``: the table shows its length, never the list,
    and caps L by the rounds it evaluated (``tasks.figures.last_l``: a run's records need
    theirs, ``tasks.report.with_rounds``)."""
    from fedcore.payload import mib
    from tasks.figures import last_l
    from tasks.grid import record_cell

    t = Table(
        title="fedapt results (traffic in MiB = 2^20 bytes; acc last L: mean over the last L "
        "evaluated rounds; s: wall seconds)",
        box=box.SIMPLE_HEAD,
    )
    cols = [
        "cell",
        "partition",
        "rounds",
        "final acc",
        "acc last L",
        "up/rnd",
        "down/rnd",
        "up",
        "down",
        "total",
        "diverged at",
        "s",
    ]
    exits = any(r.get("final_accuracy_exits") for r in records)  # early-exit methods
    if exits:
        cols.append("acc per exit")
    personal = any(r.get("personalization") for r in records)  # seed 001 Table 4
    if personal:
        cols.append("personalized % (gain)")
    for col in cols:
        t.add_column(col, justify="left" if col in ("cell", "partition") else "right")
    for r in records:
        per_exit = " ".join(f"{100 * a:.1f}" for a in r.get("final_accuracy_exits") or [])
        up, down = mib(r["upload_bytes"]), mib(r["download_bytes"])
        t.add_row(
            record_cell(r),
            str(r["partition"]),
            str(rounds_run(r)),
            _pct(r["final_accuracy"]),
            f"{_pct(r['mean_accuracy_last_L'])} L={last_l(r)}",
            f"{mib(r['upload_bytes_per_round']):.2f}",
            f"{mib(r['download_bytes_per_round']):.2f}",
            f"{up:.1f}",
            f"{down:.1f}",
            f"{up + down:.1f}",
            str(r.get("diverged_at_round") or "-"),
            f"{r['wall_seconds']:.0f}" if "wall_seconds" in r else "-",
            *([per_exit or "-"] if exits else []),
            *([_personal(r.get("personalization") or {})] if personal else []),
        )
    return t


def rounds_run(record: dict[str, Any]) -> int:
    """The rounds a record ran: ``rounds`` is their number in a run's record and the list
    of per-round records in a cell's metrics.json."""
    rounds = record["rounds"]
    return rounds if isinstance(rounds, int) else len(rounds)


def sweep_table(cells: list[dict[str, Any]], seeds: list[int]) -> Table:
    """A seed sweep's table (``tasks.sweep.cell_stats``): one row per cell, mean ± sample
    std over the seeds (n seeds) of the accuracies in %, of the traffic in MiB."""
    from tasks.sweep import diverged_text, mean_std, rounds_text, with_n

    t = Table(
        title=f"fedapt results, mean ± std over seeds {', '.join(map(str, seeds))} "
        "(sample std; MiB = 2^20 bytes)"
    )
    cols = ("run", "partition", "rounds", "final acc %", "mean acc last L %", "up MiB", "down MiB")
    for col in (*cols, "diverged at"):
        t.add_column(col, justify="left" if col in ("run", "partition") else "right")
    for c in cells:
        t.add_row(
            f"{c['algorithm']}/{c['adapter']}" + (f"/{c['codec']}" if "codec" in c else ""),
            c["partition"],
            rounds_text(c["rounds"]),
            with_n(c["final_accuracy"], 100),
            with_n(c["mean_accuracy_last_L"], 100, L=c["last_rounds_L"]),
            mean_std(c["upload_mib"], digits=1),
            mean_std(c["download_mib"], digits=1),
            diverged_text(c),
        )
    return t


def _personal(by_scope: dict[str, Any]) -> str:
    """Mean personalized accuracy and its gain over the global model, per scope."""
    return (
        " ".join(
            f"{scope.removeprefix('client_')} {100 * r['mean_accuracy_after']:.1f} "
            f"({100 * r['mean_gain']:+.1f})"
            for scope, r in by_scope.items()
            if r.get("mean_gain") is not None
        )
        or "-"
    )


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f}%"
