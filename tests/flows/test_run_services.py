"""A run and the services under it (issue 45, classes 4 and 5): the run's watch over its
services, the one-line stop (bounded cleanup, no leaked semaphores), port suggestions that
are free and no other service's, masked standard streams; and, slow, the real thing:
`fedapt down` under a running `fedapt run`, and a canary password that nobody prints.

Fast tests use stdlib HTTP servers in threads and small child processes; the slow ones run
the real `fedapt up` servers and `fedapt run` (tiny configuration) in subprocesses.
"""

from __future__ import annotations

import contextlib
import http.server
import io
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows import services as S
from flows.cli import app
from flows.services import config, ports, process, runwatch, supervisor
from flows.streams import MaskedStream
from tests.flows.support import TINY, fedapt_run, marked, wait_for, wait_for_round

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable
CANARY = "CANARYPASS"

# ----------------------------------------------------------------------------- helpers


class _Health(http.server.ThreadingHTTPServer):
    """A stand-in service on 127.0.0.1: answers every GET 200, counts them and keeps the
    last Authorization header."""

    def __init__(self) -> None:
        self.hits = 0
        self.auth: str | None = None
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
                outer.hits += 1
                outer.auth = self.headers.get("Authorization")
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"OK")

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.port = self.server_address[1]
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


@pytest.fixture
def servers():
    started: list[_Health] = []

    def make() -> _Health:
        started.append(_Health())
        return started[-1]

    yield make
    for s in started:
        s.stop()


# ----------------------------------------------------------------------------- the watch


def test_watched_services_come_from_the_environment_with_passwords_masked(servers):
    mlflow, prefect, s3 = servers(), servers(), servers()
    env = {
        "MLFLOW_TRACKING_URI": f"http://user:{CANARY}@127.0.0.1:{mlflow.port}",
        "PREFECT_API_URL": f"http://127.0.0.1:{prefect.port}/api",
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{s3.port}",
    }
    watched = runwatch.watched_services(env, managed=("PREFECT_API_URL",))
    assert [(w.name, w.var, w.managed) for w in watched] == [
        ("mlflow", "MLFLOW_TRACKING_URI", False),
        ("prefect", "PREFECT_API_URL", True),
        ("s3", "AWS_ENDPOINT_URL", False),
    ]
    assert watched[0].shown == f"http://user:***@127.0.0.1:{mlflow.port}"
    assert CANARY not in repr(watched)
    assert all(runwatch.answers(w) for w in watched)
    assert mlflow.auth and mlflow.auth.startswith("Basic ")  # the password as basic auth
    # a local store, a bare S3 (AWS itself) and an unset API are not services to watch
    for env in (
        {"MLFLOW_TRACKING_URI": "sqlite:///x/mlflow.db"},
        {"AWS_ACCESS_KEY_ID": "k"},
        {"PREFECT_API_URL": ""},
        {},
    ):
        assert runwatch.watched_services(env) == []


def test_a_service_that_goes_away_is_reported_once_within_seconds(servers):
    live, dying = servers(), servers()
    env = {
        "MLFLOW_TRACKING_URI": f"http://127.0.0.1:{live.port}",
        "PREFECT_API_URL": f"http://127.0.0.1:{dying.port}/api",
    }
    lost: list[list[runwatch.Watched]] = []
    seen = threading.Event()

    def on_lost(services: list[runwatch.Watched]) -> None:
        lost.append(services)
        seen.set()

    watched = runwatch.watched_services(env)
    with runwatch.watch(watched, on_lost, interval=0.1, grace=0.5, timeout=0.5):
        assert wait_for(lambda: live.hits >= 8 and dying.hits >= 8, 10)  # both answer: silence
        assert not lost
        dying.stop()
        t = time.monotonic()
        assert seen.wait(10)
        took = time.monotonic() - t
        # reported once: the watch ends there (the run is stopping)
        assert wait_for(lambda: "fedapt-runwatch" not in {t.name for t in threading.enumerate()}, 5)
    assert took < 3, took
    assert [[s.name for s in group] for group in lost] == [["prefect"]]


@pytest.mark.parametrize(
    ("value", "seconds"),
    [(None, 3.0), ("30", 30.0), ("0.5", 0.5), (" 7 ", 7.0), ("600", 600.0), ("1e2", 100.0)],
)
def test_service_grace_is_a_setting(monkeypatch, value, seconds):
    """FEDAPT_SERVICE_GRACE: the seconds a service may not answer before the run stops, the
    value the run's watch is given."""
    from flows.cli import runguards

    if value is None:
        monkeypatch.delenv(runwatch.GRACE_VAR, raising=False)
    else:
        monkeypatch.setenv(runwatch.GRACE_VAR, value)
    assert runwatch.grace_seconds() == seconds
    given: dict[str, object] = {}
    monkeypatch.setattr(runwatch, "watch", lambda services, on_lost, **kw: given.update(kw))
    runguards.services_watched((), "resume", tracking=False)
    assert given == {"grace": seconds}


@pytest.mark.parametrize("value", ["0", "-1", "abc", "", "nan", "inf", "600.5", "1e9", "9" * 500])
def test_a_bad_service_grace_is_one_line_naming_the_variable(value):
    from fedcore.errors import ConfigError

    with pytest.raises(ConfigError) as exc:
        runwatch.grace_seconds({runwatch.GRACE_VAR: value})
    text = str(exc.value)
    assert text.startswith(f"FEDAPT_SERVICE_GRACE={value!r}"[:40]), text
    assert "is not a number of seconds in (0, 600]" in text and "(unset: 3)" in text, text
    assert len(text) < 300, text


# ----------------------------------------------------------------------------- the stop

_STOPPER = """
import concurrent.futures as cf, multiprocessing as mp, sys, threading, time
from flows.cli.stopping import stop_now
from flows.streams import mask_streams
mask_streams()
pool = cf.ProcessPoolExecutor(1, mp_context=mp.get_context("spawn"))  # named semaphores
def chatter():
    while True:
        print("Traceback (most recent call last): a library, while the run stops", flush=True)
        time.sleep(0.01)
threading.Thread(target=chatter, daemon=True).start()
time.sleep(0.2)
stop = threading.Thread(
    target=stop_now,
    args=(2, "mlflow (MLFLOW_TRACKING_URI=http://u:{canary}@h:1) stopped answering"),
    kwargs=dict(error=True, cleanup=lambda: time.sleep(60)),
)
stop.start()
time.sleep(60)
"""


def test_stop_is_one_last_line_bounded_and_leaks_no_semaphores():
    """stop_now from another thread: the cleanup (a server that never answers) is cut short,
    nothing another thread prints comes after the line, the password is masked and the
    resource tracker finds no semaphores left over."""
    t = time.monotonic()
    res = subprocess.run(
        [PY, "-c", _STOPPER.format(canary=CANARY)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    took = time.monotonic() - t
    assert res.returncode == 2, res.stderr[-2000:]
    assert took < 10, took
    lines = res.stderr.strip().splitlines()
    assert lines == [
        "fedapt: error: mlflow (MLFLOW_TRACKING_URI=http://u:***@h:1) stopped answering"
    ]
    assert "leaked" not in res.stderr and "Warning" not in res.stderr
    assert CANARY not in res.stdout + res.stderr


def test_masked_stream_masks_every_write_and_keeps_the_rest_of_the_stream():
    buf = io.StringIO()
    stream = MaskedStream(buf)
    stream.write(f"🏃 View run x at: http://user:{CANARY}@127.0.0.1:5000/#/experiments/1\n")
    stream.writelines([f"s3://k:{CANARY}@host/b\n", "plain line\n"])
    print(f"postgresql://u:{CANARY}@db/x", file=stream)
    text = buf.getvalue()
    assert CANARY not in text
    assert "http://user:***@127.0.0.1:5000/#/experiments/1" in text and "plain line" in text
    assert stream.isatty() is False and stream.getvalue() == text  # the rest: the stream's
    try:  # sealed: only the sealing thread writes
        MaskedStream.seal()
        other = threading.Thread(target=stream.write, args=("from another thread\n",))
        other.start()
        other.join()
        stream.write("the last line\n")
    finally:
        MaskedStream._sealed_by = None
    assert buf.getvalue().endswith("plain line\n" + "postgresql://u:***@db/x\n" + "the last line\n")


def test_library_failure_lines_go_to_the_log_not_the_console(tmp_path, monkeypatch):
    """Prefect's lines for a failed task or flow run (a full disk) never reach the console:
    they are appended, tracebacks and all, passwords masked, to the run's log; Prefect's
    progress lines stay. Another library's traceback is one console line saying where it
    went."""
    import errno
    import logging

    from flows.cli import logs

    monkeypatch.setenv("FEDAPT_STATE_DIR", str(tmp_path / "state"))
    console = io.StringIO()
    handler = logging.StreamHandler(MaskedStream(console))
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        logs.quiet_prefect_tracebacks()
        try:
            raise OSError(errno.ENOSPC, "No space left on device", "/x/summary.json")
        except OSError:
            logging.getLogger("prefect.task_runs").error(
                "Task run failed (at http://u:%s@h:1)", CANARY, exc_info=True
            )
            logging.getLogger("a_library.store").error("upload failed", exc_info=True)
        flows_log = logging.getLogger("prefect.flow_runs")
        monkeypatch.setattr(flows_log, "level", logging.INFO)  # as Prefect's configuration
        flows_log.error("Crash detected! Execution was interrupted")
        flows_log.info("Finished in state Failed('Flow run encountered an exception')")
        flows_log.info("Finished in state Completed()")
        flows_log.warning("a warning stays")
    finally:
        root.removeHandler(handler)
    log = tmp_path / "state" / "logs" / "fedapt.log"
    assert console.getvalue().splitlines() == [
        f"upload failed (traceback in {log})",
        "Finished in state Completed()",
        "a warning stays",
    ]
    logged = log.read_text()
    assert "Task run failed (at http://u:***@h:1)" in logged and "Crash detected!" in logged
    assert "Finished in state Failed(" in logged and "Completed()" not in logged
    assert logged.count("Traceback (most recent call last)") == 2 and "No space left" in logged
    assert CANARY not in logged and CANARY not in console.getvalue()
    assert (tmp_path / "state" / ".gitignore").is_file()  # the state dir stays out of git


# A `fedapt` command (the real entry point, flows.cli.main) whose body prints a password in
# every way a command's process tree can: its own streams, a Python child, a shell child with
# a line left open, forked and spawned pool workers writing to the file descriptors; then
# its one-line error (or stop_now, as a lost service or SIGTERM ends a run).
_CHILDREN = """
import multiprocessing as mp, os, subprocess, sys
from fedcore.errors import ConfigError
from flows.cli import app, main
from flows.cli.guards import guarded
from flows.cli.stopping import stop_now

URI = "http://user:{canary}@127.0.0.1:5000"


def worker(name):
    os.write(1, f"worker {{name}} {{URI}}\\n".encode())


@guarded
def canary() -> None:
    print("tty", sys.stdout.isatty(), sys.stderr.isatty(), flush=True)
    for i in range(20):
        print(f"out {{i}}", flush=True)
        print(f"err {{i}} {{URI}}", file=sys.stderr, flush=True)
    code = f"import sys; print('child {{URI}}'); print('child-err {{URI}}', file=sys.stderr)"
    subprocess.run([sys.executable, "-c", code], check=True)
    subprocess.run(["sh", "-c", f"printf 'open {{URI}}'; sleep 0.3; echo ' closed'"], check=True)
    for how in ("fork", "spawn"):
        with mp.get_context(how).Pool(1) as pool:
            pool.map(worker, [how])
    if {stop!r}:
        stop_now(2, f"stopped {{URI}}", error=True)
    raise ConfigError(f"runtime.tracking: the end {{URI}}")


app.command()(canary)
if __name__ == "__main__":
    main()
"""

_MASKED = "http://user:***@127.0.0.1:5000"
_OUT = [
    "tty False False",
    *(line for i in range(20) for line in (f"out {i}", f"err {i} {_MASKED}")),
    f"child {_MASKED}",
    f"child-err {_MASKED}",
    f"open {_MASKED} closed",
    f"worker fork {_MASKED}",
    f"worker spawn {_MASKED}",
]


@pytest.mark.parametrize("case", ["one-terminal", "two-files", "stop", "tty"])
def test_what_child_processes_print_is_masked_in_order(tmp_path, case):
    """Masking holds at the file descriptors (``flows.streams.mask_descriptors``): no byte
    of the canary reaches the terminal, whoever writes it; every line arrives, in the order
    written (one pipe when standard output and error are the same file), the error line
    last; a terminal stays a terminal for the command (Rich's colours)."""
    script = tmp_path / "canary_cmd.py"
    script.write_text(_CHILDREN.format(canary=CANARY, stop=case == "stop"))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [PY, str(script), "canary"]
    end = "stopped" if case == "stop" else "runtime.tracking: the end"
    last = f"fedapt: error: {end} {_MASKED}"
    if case == "tty":
        import pty

        main, sub = pty.openpty()
        proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdin=sub, stdout=sub, stderr=sub)
        os.close(sub)
        raw = b""
        with contextlib.suppress(OSError):  # EIO: the command and its children are gone
            while data := os.read(main, 65536):
                raw += data
        os.close(main)
        assert proc.wait(timeout=60) == 2
        assert CANARY.encode() not in raw
        lines = raw.decode().replace("\r\n", "\n").splitlines()
        assert lines[0] == "tty True True" and lines[1:-1] == _OUT[1:], lines
        assert lines[-1].startswith("\x1b[31m"), lines[-1]  # colour: a terminal still
        assert re.sub("\x1b\\[[0-9;]*m", "", lines[-1]) == last, lines[-1]
        return
    merged = case != "two-files"
    res = subprocess.run(
        cmd,
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if merged else subprocess.PIPE,
        timeout=60,
    )
    assert res.returncode == 2
    raw = res.stdout + (res.stderr or b"")
    assert CANARY.encode() not in raw and b"Traceback" not in raw, raw.decode()
    if merged:
        assert res.stdout.decode().splitlines() == [*_OUT, last]
    else:  # each stream whole and in order
        out, err = res.stdout.decode().splitlines(), res.stderr.decode().splitlines()
        assert out == [ln for ln in _OUT if not ln.startswith(("err ", "child-err"))], out
        assert err == [*(ln for ln in _OUT if ln.startswith(("err ", "child-err"))), last], err


# ----------------------------------------------------------------------------- ports


@pytest.fixture
def no_spawn(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("a server process was started")

    monkeypatch.setattr(supervisor, "spawn", fail)


@pytest.mark.parametrize("case", ["busy", "twice"])
def test_port_in_use_suggests_a_free_port_of_no_other_service(
    case, tmp_path, busy_port, no_spawn, monkeypatch
):
    """`fedapt up` with a taken port (by another program; asked for by two services): one
    line naming the variable, suggesting a port that is free now and neither another fedapt
    service's port nor a default one (FEDAPT_PREFECT_PORT=4201 is the worker's default)."""
    sd = tmp_path / "state"
    monkeypatch.setenv("FEDAPT_STATE_DIR", str(sd))
    monkeypatch.setenv("FEDAPT_WORKER_PORT", "0")
    if case == "busy":
        names, who, var, port = ["prefect"], "prefect", "FEDAPT_PREFECT_PORT", busy_port
        monkeypatch.setenv("FEDAPT_PREFECT_PORT", str(busy_port))
        by = "another program"
    else:
        port = S.free_port()
        names, who, var = ["prefect", "worker"], "worker", "FEDAPT_WORKER_PORT"
        monkeypatch.setenv("FEDAPT_PREFECT_PORT", str(port))
        monkeypatch.setenv("FEDAPT_WORKER_PORT", str(port))
        by = "fedapt's prefect (FEDAPT_PREFECT_PORT)"
    res = CliRunner().invoke(app, ["up", *names])
    text = res.output.strip()
    assert res.exit_code == 2, text
    assert "Traceback" not in text and len(text.splitlines()) == 1, text
    assert text.startswith(f"fedapt: error: {who} cannot start: port {port} "), text
    assert f"already in use by {by}" in text and f"{var}=" in text
    suggested = int(text.rsplit(f"{var}=", 1)[1].split()[0])
    assert suggested not in (0, port) and ports.port_free(suggested)
    assert suggested not in config.DEFAULT_PORTS.values()
    assert S.read_state(sd) == {}  # nothing started, nothing recorded


def test_suggested_port_skips_taken_and_busy_ports(busy_port):
    """The port after a busy one is suggested only when free and nobody else's: 4200 busy
    never suggests 4201, the worker's."""
    below = busy_port - 1
    assert ports.suggest_port(below, set()) not in (below, busy_port)
    assert ports.suggest_port(below, {busy_port + 1}) not in (below, busy_port, busy_port + 1)
    assert ports.suggest_port(4200, set(config.DEFAULT_PORTS.values())) != 4201


# ----------------------------------------------------------------------------- slow: real runs


def _services_env(tmp_path: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PREFECT_API", "AWS_", "MLFLOW_TRACKING", "FEDAPT_"))
    }
    env["FEDAPT_STATE_DIR"] = str(tmp_path / "state")
    for name in ("s3", "mlflow", "prefect", "worker"):
        env[config.port_env_var(name)] = "0"
    return env


def _fedapt(env: dict[str, str], *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PY, "-m", "flows.cli", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _kill_recorded(state: Path) -> None:
    for rec in S.read_state(state).values():
        process.signal_group(int(rec["pid"]), signal.SIGKILL)


def _cell_files(exp: Path) -> dict[str, bytes]:
    runs = exp / "runs"
    return {
        str(f.relative_to(runs)): f.read_bytes()
        for f in sorted(runs.rglob("*"))
        if f.name in ("model.pt", "rounds.csv")
    }


@pytest.mark.slow
def test_fedapt_down_under_a_run_ends_it_in_one_line_and_a_rerun_resumes_byte_identical(
    tmp_path,
):
    mark = uuid.uuid4().hex
    env = _services_env(tmp_path)
    sets = {"federation.rounds": "6", "runtime.checkpoint_every": "1"}
    # the reference: the same cells, never interrupted (temporary servers, local store)
    ref = fedapt_run(
        tmp_path / "ref",
        uuid.uuid4().hex,
        **sets,
        **{"storage.bucket": "null", "runtime.tracking": "false"},
    )
    up = _fedapt(env, "up", "mlflow", "prefect")
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        run_env = {"MLFLOW_TRACKING_URI": None}  # fedapt up's server
        proc = fedapt_run(tmp_path, mark, run_env, **sets)
        try:
            wait_for_round(proc, timeout=240, round_=2)  # a checkpoint is on disk
            t = time.monotonic()
            down = _fedapt(env, "down")
            assert down.returncode == 0, down.stdout + down.stderr
            out, err = proc.communicate(timeout=30)
            took = time.monotonic() - t
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        assert proc.returncode == 2, err[-3000:]
        assert took < 30, took
        assert "Traceback" not in out + err
        ours = [ln for ln in err.splitlines() if ln.startswith("fedapt:")]
        assert len(ours) == 1 and err.strip().splitlines()[-1] == ours[0], err[-3000:]
        line = ours[0]
        print(f"stopped {took:.1f} s after `fedapt down`: {line}")
        assert "stopped answering during the run" in line
        assert any(f"{n} (" in line for n in ("mlflow", "prefect", "s3")), line
        assert "fedapt up" in line and "run the same command" in line
        assert str(tmp_path / "reports" / "faults") in line
        assert wait_for(lambda: not marked(mark), 20), marked(mark)
        # the services again, the same command: it resumes and ends as if never stopped
        up = _fedapt(env, "up", "mlflow", "prefect")
        assert up.returncode == 0, up.stdout + up.stderr
        again = fedapt_run(tmp_path, mark, run_env, **sets)
        out, err = again.communicate(timeout=300)
        assert again.returncode == 0, err[-3000:]
        assert "resumed: rounds 1-" in err
    finally:
        _fedapt(env, "down")
        _kill_recorded(tmp_path / "state")
    assert ref.wait(timeout=300) == 0, ref.stderr.read()[-3000:] if ref.stderr else ""
    want = _cell_files(tmp_path / "ref" / "reports" / "faults")
    assert want and _cell_files(tmp_path / "reports" / "faults") == want


@pytest.mark.slow
def test_no_password_is_printed_or_logged_by_anyone(tmp_path):
    """A run tracked to a real MLflow server through a URI with user:CANARYPASS: neither its
    standard output and error (the MLflow link it prints included) nor any file it or its
    servers wrote holds the password."""
    mark = uuid.uuid4().hex
    port = S.free_port()
    home = tmp_path / "mlflow-server"
    home.mkdir()
    server = subprocess.Popen(
        [
            str(Path(PY).parent / "mlflow"),
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
            "--backend-store-uri",
            f"sqlite:///{home / 'mlflow.db'}",
            "--artifacts-destination",
            str(home / "artifacts"),
        ],
        cwd=home,
        env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        assert wait_for(lambda: S.probe(f"http://127.0.0.1:{port}/health"), 120)
        uri = f"http://user:{CANARY}@127.0.0.1:{port}"
        proc = fedapt_run(
            tmp_path, mark, {"MLFLOW_TRACKING_URI": uri}, **{"federation.rounds": "2"}
        )
        out, err = proc.communicate(timeout=300)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    assert proc.returncode == 0, err[-3000:]
    # MLflow's own "View run" links are off (issue 46); fedapt's one link is masked
    assert "View run" not in out
    assert f"MLflow: http://user:***@127.0.0.1:{port}/#/experiments/" in out
    assert CANARY not in out and CANARY not in err
    # every file of the test: the state dir (service logs, fedapt.log), the run's folders,
    # the Prefect home and database, the MLflow server's store and artifacts
    files = [f for f in tmp_path.rglob("*") if f.is_file() and not f.is_symlink()]
    assert any(f.name == "summary.json" for f in files)
    assert not [str(f) for f in files if CANARY.encode() in f.read_bytes()]
    assert wait_for(lambda: not marked(mark), 20), marked(mark)


# A `fedapt run` whose flow fails in its first task (the partition's writer replaced): what a
# run that fails inside the flow prints, in a real process.
_FAILING_RUN = """
import errno, os, sys
import tasks.data.partitioning as tp
from fedcore.errors import ConfigError

def fail(params, data, part, out_dir):
    if {case!r} == "setting":
        raise ConfigError("partition.num_clients: refused inside the flow (a test)")
    raise OSError(errno.ENOSPC, "No space left on device", os.path.join(out_dir, "manifest.csv"))

tp.write_partition = fail
from flows.cli import main
sys.argv[0] = "fedapt"
main()
"""


@pytest.mark.slow
@pytest.mark.parametrize("case", ["setting", "full-disk"])
def test_a_run_failing_in_the_flow_prints_fedapts_line_last_and_no_library_line(tmp_path, case):
    """Prefect's "Task run failed ...", "Finished in state Failed(...)" and "Encountered
    exception" lines (with tracebacks) go to the state dir's fedapt.log; the terminal shows
    Prefect's progress, then fedapt's one line, last. Nothing is left under the reports."""
    reports = tmp_path / "reports"
    env = _services_env(tmp_path)
    env.update(PYTHONPATH=str(REPO), PREFECT_HOME=str(tmp_path / "prefect"))
    sets = {
        **TINY,
        "storage.bucket": "null",
        "runtime.tracking": "false",
        "experiment.reports_dir": str(reports),
        "experiment.name": "faults",
        "data.root": str(REPO / "data/raw"),
    }
    args = ["run", "--params", str(REPO / "params.yaml")]
    for k, v in sets.items():
        args += ["--set", f"{k}={v}"]
    res = subprocess.run(
        [PY, "-c", _FAILING_RUN.format(case=case), *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # the terminal's order
        text=True,
        timeout=240,
    )
    lines = res.stdout.strip().splitlines()
    assert res.returncode == 2, res.stdout[-3000:]
    assert "Traceback" not in res.stdout, res.stdout[-3000:]
    assert lines[-1].startswith("fedapt: error: "), lines
    assert [ln for ln in lines if ln.startswith("fedapt:")] == lines[-1:], lines
    assert not [ln for ln in lines if "| ERROR" in ln or "Failed(" in ln], lines
    assert "Beginning flow run" in res.stdout  # progress lines stay
    if case == "setting":
        assert lines[-1] == (
            "fedapt: error: partition.num_clients: refused inside the flow (a test)"
        ), lines
    else:  # the setting whose folder filled, its value, the file, and what to do
        from flows.settings import shorten

        manifest = reports / "faults" / "partition" / "manifest.csv"
        assert lines[-1] == (
            f"fedapt: error: experiment.reports_dir: {reports}: No space left on device at "
            f"{shorten(str(manifest))}; free some space there (or raise the quota) and run "
            "again"
        ), lines
    logged = (tmp_path / "state" / "logs" / "fedapt.log").read_text()
    assert "Task run failed with exception" in logged, logged
    assert "Finished in state Failed(" in logged and "Encountered exception" in logged
    assert not reports.exists() or not any(p.is_file() for p in reports.rglob("*"))
