"""Library log records on the console: fedapt's errors without tracebacks, Prefect's failure
lines and other tracebacks in the run's log (``<state dir>/logs/fedapt.log``)."""

from __future__ import annotations

import contextlib
import logging
import sys
from pathlib import Path

from flows.streams import MaskedStream


class NoTracebackForFedaptErrors(logging.Filter):
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


_QUIET = NoTracebackForFedaptErrors()
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
