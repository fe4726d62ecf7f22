"""Prefect and MLflow on PostgreSQL (flows/services/pgstore.py, pgserver.py, stores.py): the
store setting, URLs and their masking, the version check, the command lines, bad input before
anything starts (one line each, through the CLI), and one run of the real servers (slow)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fedcore.errors import ConfigError, mask_credentials
from flows import services as S
from flows.cli import app
from flows.cli import services as cli_services
from flows.services import commands, embedded, pgserver, pgstore, process, stores, supervisor

runner = CliRunner()
SECRET = "s3cr3t-pw"
OTHERS_ANY_PORT = {
    "FEDAPT_S3_PORT": "0",
    "FEDAPT_MLFLOW_PORT": "0",
    "FEDAPT_PREFECT_PORT": "0",
    "FEDAPT_WORKER_PORT": "0",
}


@pytest.fixture
def sd(tmp_path):
    return tmp_path / "state"


@pytest.fixture
def no_spawn(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("a server process was started")

    for module in (supervisor, embedded):
        monkeypatch.setattr(module, "spawn", fail)
    monkeypatch.setattr(pgserver, "initdb", fail)


@pytest.fixture
def fresh_env(monkeypatch, sd):
    """The CLI on its own state folder, no store set, the other services on any port."""
    monkeypatch.setenv("FEDAPT_STATE_DIR", str(sd))
    monkeypatch.delenv("FEDAPT_STORE", raising=False)
    monkeypatch.delenv("FEDAPT_POSTGRES_PORT", raising=False)
    monkeypatch.delenv("FEDAPT_PG_BINDIR", raising=False)
    for key, value in OTHERS_ANY_PORT.items():
        monkeypatch.setenv(key, value)


def _closed_port() -> int:
    return S.free_port()  # nothing listens on it (bound and released)


# ----------------------------------------------------------------------------- unit tests


def test_store_setting_values_and_precedence(monkeypatch):
    monkeypatch.delenv("FEDAPT_STORE", raising=False)
    assert pgstore.resolve_store(None, {}).kind == "sqlite"
    monkeypatch.setenv("FEDAPT_STORE", "postgres")
    assert pgstore.resolve_store(None, {}) == pgstore.Store("postgres", "FEDAPT_STORE")
    given = pgstore.resolve_store(f"postgresql://team:{SECRET}@db.lab:5433/ops", {})
    assert (given.kind, given.setting) == ("url", "--store")
    assert given.url == f"postgresql://team:{SECRET}@db.lab:5433/ops"
    assert given.shown == "postgresql://team:***@db.lab:5433/ops"
    assert SECRET not in repr(given)
    # unset: the running services' store (a user's URL without its password: see up)
    monkeypatch.delenv("FEDAPT_STORE")
    running = {"prefect": {"store_kind": "postgres"}}
    assert pgstore.resolve_store(None, running).kind == "postgres"
    shown = "postgresql://team:***@db.lab:5433/ops"
    running = {"mlflow": {"store_kind": "url", "store_server": shown}}
    kept = pgstore.resolve_store(None, running)
    assert (kept.kind, kept.url, kept.shown) == ("url", None, shown)
    with pytest.raises(ConfigError, match="FEDAPT_STORE: unset, and the services"):
        stores.store_server(kept, Path("/nonexistent"), {})
    for bad in ("mysql", "postgresql://", "postgresql://u:p@h:port/x", ""):
        with pytest.raises(ConfigError, match="^--store: .* is not a store; allowed: sqlite"):
            pgstore.parse_store(bad, "--store")


def test_database_urls_and_masking():
    server = f"postgresql://fedapt:{SECRET}@127.0.0.1:5999/postgres?sslmode=disable"
    prefect = pgstore.db_url(server, "prefect", "asyncpg")
    assert prefect == f"postgresql+asyncpg://fedapt:{SECRET}@127.0.0.1:5999/prefect?sslmode=disable"
    assert pgstore.db_url(server, "mlflow", "psycopg").startswith("postgresql+psycopg://")
    assert mask_credentials(prefect) == (
        "postgresql+asyncpg://fedapt:***@127.0.0.1:5999/prefect?sslmode=disable"
    )


@pytest.mark.parametrize(
    ("num", "trgm", "match"),
    [
        (140008, True, "is PostgreSQL 14.8; Prefect needs PostgreSQL 14.9 or later"),
        (130015, True, "is PostgreSQL 13.15"),
        (150018, False, "has no pg_trgm extension"),
    ],
)
def test_version_check(num, trgm, match):
    with pytest.raises(ConfigError, match=f"^FEDAPT_STORE: db .*{match}") as info:
        pgstore.require_version(num, trgm, "db", "FEDAPT_STORE")
    assert "allowed: sqlite" in str(info.value)
    pgstore.require_version(140009, True, "db", "FEDAPT_STORE")  # the oldest that passes


def test_servers_get_their_database_in_the_environment_not_the_command_line(sd, monkeypatch):
    """MLflow's backend store and Prefect's API database point at PostgreSQL through their
    environment (a command line is everyone's to read) with their own drivers; fedapt's
    server listens on 127.0.0.1 only, without a Unix socket."""
    monkeypatch.setenv("PREFECT_SERVER_DATABASE_CONNECTION_URL", "sqlite:////tmp/other.db")
    pw = pgserver.password_path(sd)
    pw.parent.mkdir(parents=True)
    pw.write_text(SECRET + "\n")
    records = {"s3": {"url": "http://127.0.0.1:8333"}, "postgres": {"port": 5999}}
    store = pgstore.Store("postgres", "--store")
    cmd, env, _ = commands.command("mlflow", sd, 5055, records, store)
    assert "--backend-store-uri" not in cmd and not any(SECRET in a for a in cmd)
    assert env["MLFLOW_BACKEND_STORE_URI"] == (
        f"postgresql+psycopg://fedapt:{SECRET}@127.0.0.1:5999/mlflow"
    )
    cmd, env, _ = commands.command("prefect", sd, 4242, records, store)
    assert env["PREFECT_SERVER_DATABASE_CONNECTION_URL"] == (
        f"postgresql+asyncpg://fedapt:{SECRET}@127.0.0.1:5999/prefect"
    )
    rec = stores.store_record("prefect", store, sd, records, env)
    assert rec == {
        "store_kind": "postgres",
        "store_server": "postgresql://fedapt:***@127.0.0.1:5999/postgres",
        "store": "postgresql+asyncpg://fedapt:***@127.0.0.1:5999/prefect",
    }
    cmd, env, cwd = commands.command("postgres", sd, 5999, records)
    assert cmd[cmd.index("-p") + 1] == "5999" and cwd == sd / "postgres"
    assert "listen_addresses=127.0.0.1" in cmd and "unix_socket_directories=" in cmd
    # SQLite stays the default: the user's own Prefect database setting stays too
    cmd, env, _ = commands.command("prefect", sd, 4242, records)
    assert env["PREFECT_SERVER_DATABASE_CONNECTION_URL"] == "sqlite:////tmp/other.db"
    sqlite = pgstore.Store("sqlite")
    assert stores.store_record("mlflow", sqlite, sd, records, env)["store"].startswith("sqlite:///")


def _dead_pid() -> int:
    import subprocess

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_stopping_postgres_stops_the_services_whose_store_it_is(sd):
    """down postgres: also mlflow and prefect on it (and prefect's worker), not those on
    SQLite."""
    recs = {n: {"name": n, "pid": _dead_pid(), "port": 1} for n in S.SERVICES}
    recs["prefect"]["store_kind"] = "postgres"
    recs["mlflow"]["store_kind"] = "sqlite"
    S.write_state(sd, recs)
    assert sorted(S.down(["postgres"], state=sd)) == ["postgres", "prefect", "worker"]
    assert sorted(S.read_state(sd)) == ["mlflow", "ray", "s3"]


@pytest.mark.skipif(os.geteuid() != 0, reason="only root runs the server as postgres")
def test_under_root_the_state_folder_must_be_reachable_by_postgres(sd, fresh_env, no_spawn):
    """pytest's tmp_path lies under /tmp/pytest-of-root (mode 0700): the system user
    postgres cannot enter it, which is one line naming FEDAPT_STATE_DIR."""
    res = runner.invoke(app, ["up", "--store", "postgres", "postgres"])
    text = res.output.strip()
    assert res.exit_code != 0 and "Traceback" not in text, text
    assert text.splitlines()[-1].startswith("fedapt: error: FEDAPT_STATE_DIR: "), text
    assert "system user postgres" in text and not sd.exists()


# ----------------------------------------------------------------------------- bad input


def _assert_one_line(res, needle: str, sd: Path, bookkeeping: bool = False) -> None:
    text = res.output.strip()
    assert res.exit_code != 0, text
    assert "Traceback" not in text, text
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert needle in text, text
    assert text.splitlines()[-1].startswith("fedapt: error: "), text
    assert SECRET not in text, text
    # nothing written: no state folder, or (a port, checked under the state lock) only its
    # bookkeeping (services.json, the lock, .gitignore), never a data folder or a password
    files = {p.name for p in sd.rglob("*")} if sd.exists() else set()
    allowed = {".gitignore", "services.json", "services.lock"} if bookkeeping else set()
    assert files <= allowed, files


@pytest.mark.parametrize(
    ("args", "env", "needle"),
    [
        (
            ["--store", "postgresql://fedapt:{pw}@127.0.0.1:{port}/postgres"],
            {},
            "--store: postgresql://fedapt:***@127.0.0.1:",
        ),
        (
            [],
            {"FEDAPT_STORE": "postgresql://me:{pw}@127.0.0.1:{port}/x"},
            "FEDAPT_STORE: postgresql://me:***@127.0.0.1:",
        ),
        (["--store", "postgres://me:{pw}@nohost.invalid:5432/x"], {}, "cannot connect"),
        (["--store", "mysql://me:{pw}@127.0.0.1/x"], {}, "--store: 'mysql://me:***@"),
        ([], {"FEDAPT_STORE": "postgresq"}, "FEDAPT_STORE: 'postgresq' is not a store"),
    ],
)
def test_bad_store_url(sd, fresh_env, no_spawn, monkeypatch, args, env, needle):
    """A URL that does not connect (named, password masked) or is not a store at all."""
    port = _closed_port()
    for key, value in env.items():
        monkeypatch.setenv(key, value.format(pw=SECRET, port=port))
    args = [a.format(pw=SECRET, port=port) for a in args]
    res = runner.invoke(app, ["up", *args])
    _assert_one_line(res, needle, sd)
    assert "allowed: sqlite" in res.output
    if "cannot connect" in needle or "postgresql://" in needle:
        assert "cannot connect (" in res.output


def _fake_bindir(root: Path, version: str, trgm: bool) -> Path:
    """PostgreSQL's programs as scripts: `postgres --version` and `pg_config --sharedir`."""
    bindir = root / "bin"
    share = root / "share"
    (share / "extension").mkdir(parents=True)
    if trgm:
        (share / "extension" / "pg_trgm.control").write_text("")
    bindir.mkdir()
    scripts = {
        "postgres": f"echo 'postgres (PostgreSQL) {version}'",
        "pg_config": f"echo {share}",
        "initdb": "exit 1",
        "pg_isready": "exit 2",
    }
    for name, body in scripts.items():
        (bindir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bindir / name).chmod(0o755)
    return bindir


@pytest.mark.parametrize(
    ("version", "trgm", "setting", "needle"),
    [
        ("14.8", True, "--store", "is PostgreSQL 14.8; Prefect needs PostgreSQL 14.9 or later"),
        ("12.20 (Debian)", True, "FEDAPT_STORE", "is PostgreSQL 12.20"),
        ("16.4", False, "--store", "has no pg_trgm extension"),
        (None, True, "FEDAPT_STORE", "needs PostgreSQL's server programs (initdb"),
    ],
)
def test_postgres_too_old_or_without_pg_trgm(
    sd, fresh_env, no_spawn, monkeypatch, tmp_path, version, trgm, setting, needle
):
    """fedapt's own server: its binaries' version and pg_trgm, checked before it starts
    (FEDAPT_PG_BINDIR points at stand-ins; None: a folder without them)."""
    if version is None:
        bindir = tmp_path / "empty"
        bindir.mkdir()
    else:
        bindir = _fake_bindir(tmp_path / "pg", version, trgm)
    monkeypatch.setenv("FEDAPT_PG_BINDIR", str(bindir))
    if setting == "--store":
        res = runner.invoke(app, ["up", "--store", "postgres"])
    else:
        monkeypatch.setenv("FEDAPT_STORE", "postgres")
        res = runner.invoke(app, ["up"])
    _assert_one_line(res, f"{setting}: ", sd)
    assert needle in res.output


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"FEDAPT_POSTGRES_PORT": "{busy}"}, "FEDAPT_POSTGRES_PORT="),
        ({"FEDAPT_POSTGRES_PORT": "{busy}", "FEDAPT_STORE": "postgres"}, "FEDAPT_POSTGRES_PORT="),
        ({"FEDAPT_POSTGRES_PORT": "54321", "FEDAPT_PREFECT_PORT": "54321"}, "fedapt's postgres"),
        ({"FEDAPT_POSTGRES_PORT": "five"}, "FEDAPT_POSTGRES_PORT='five' is not a port"),
    ],
)
def test_postgres_port_in_use(sd, fresh_env, no_spawn, monkeypatch, busy_port, env, needle):
    """Its port is checked with the others', before anything starts."""
    if os.geteuid() == 0:  # under root, the server's user must reach the state folder
        base = Path(tempfile.mkdtemp(prefix="fedapt-pg-port-"))
        base.chmod(0o755)
        sd = base / "state"
        monkeypatch.setenv("FEDAPT_STATE_DIR", str(sd))
    try:
        for key, value in env.items():
            monkeypatch.setenv(key, value.format(busy=busy_port))
        args = [] if "FEDAPT_STORE" in env else ["--store", "postgres"]
        res = runner.invoke(app, ["up", *args])
        _assert_one_line(res, needle, sd, bookkeeping=True)
    finally:
        if os.geteuid() == 0:
            shutil.rmtree(sd.parent, ignore_errors=True)


@pytest.mark.parametrize(
    ("missing", "store"),
    [
        (["psycopg"], "postgres"),
        (["asyncpg"], "postgres"),
        (["psycopg", "asyncpg"], "postgresql://me:{pw}@127.0.0.1:5432/x"),
    ],
)
def test_missing_driver(sd, fresh_env, no_spawn, monkeypatch, missing, store):
    """psycopg (MLflow's) or asyncpg (Prefect's) not importable: named, with how to install."""
    for name in missing:
        monkeypatch.setitem(sys.modules, name, None)  # import raises ImportError
    res = runner.invoke(app, ["up", "--store", store.format(pw=SECRET)])
    _assert_one_line(res, f"not importable: {', '.join(missing)}", sd)
    assert "--store: a PostgreSQL store needs the Python packages" in res.output


@pytest.mark.parametrize(
    ("files", "needle"),
    [
        ({"data/PG_VERSION": "15\n"}, "is lost; move"),
        ({"data/PG_VERSION": "15\n", "data/base/1": ""}, "postgres/password is missing"),
        ({"data/notes.txt": "x"}, "is neither empty nor a PostgreSQL data folder"),
    ],
)
def test_postgres_data_folder_that_cannot_serve(sd, fresh_env, no_spawn, files, needle):
    """A data folder whose password is lost, or that is no data folder: before anything
    starts, nothing written."""
    for name, text in files.items():
        path = pgserver.home_dir(sd) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    before = sorted(sd.rglob("*"))
    res = runner.invoke(app, ["up", "--store", "postgres"])
    text = res.output.strip()
    assert res.exit_code != 0 and "Traceback" not in text, text
    assert text.splitlines()[-1].startswith("fedapt: error: postgres"), text
    assert needle in text and sorted(sd.rglob("*")) == before


# ----------------------------------------------------------------------------- the servers


def _gone(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return True
    return not process.any_member_alive(pid)


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


@pytest.mark.slow
def test_prefect_and_mlflow_on_postgres(monkeypatch):
    """`fedapt up --store postgres`: fedapt's PostgreSQL server (as postgres under root), a
    flow run of Prefect's API and an MLflow metric land in its databases, `fedapt status`
    shows the store with its password masked, and `fedapt down` leaves no process."""
    import psycopg

    for var in ("MLFLOW_TRACKING_URI", *S.USER_S3_VARS, "PREFECT_API_URL", "FEDAPT_STORE"):
        monkeypatch.delenv(var, raising=False)
    base = Path(tempfile.mkdtemp(prefix="fedapt-pg-"))
    base.chmod(0o755)  # the system user postgres enters it (tmp_path's parent is 0700)
    sd = base / "state"
    monkeypatch.setenv("FEDAPT_STATE_DIR", str(sd))
    for name in ("postgres", "s3", "mlflow", "prefect"):
        monkeypatch.setenv(S.port_env_var(name), "0")
    # not this checkout's .dvc/config.local (the s3 endpoint of `fedapt up`)
    monkeypatch.setattr(cli_services, "configure_dvc_remote", lambda endpoint: None)
    pids: list[int] = []
    try:
        t = time.monotonic()
        res = runner.invoke(app, ["up", "--store", "postgres", "mlflow", "prefect"])
        print(f"up: {time.monotonic() - t:.1f} s")
        st = {n: s for n, s in S.status(state=sd).items() if s.state != "stopped"}
        pids = [s.pid for s in st.values() if s.pid]
        assert res.exit_code == 0, res.output
        assert sorted(st) == ["mlflow", "postgres", "prefect", "s3"]
        assert all(s.state == "running" and s.healthy for s in st.values()), st
        password = pgserver.password_path(sd).read_text().strip()
        assert password not in res.output
        assert "Prefect store: postgresql+asyncpg://fedapt:***@127.0.0.1:" in res.output
        assert stat.S_IMODE(pgserver.password_path(sd).stat().st_mode) == 0o600
        if os.geteuid() == 0:
            assert pgserver.data_dir(sd).stat().st_uid != 0  # the server is not root
        server = pgserver.own_server_url(sd, st["postgres"].port)
        assert st["prefect"].store.startswith("postgresql+asyncpg://fedapt:***@127.0.0.1:")
        assert st["mlflow"].store.startswith("postgresql+psycopg://fedapt:***@127.0.0.1:")
        # the password: in no record, no command line, no output
        assert password not in (sd / "services.json").read_text()
        for pid in pids:
            assert password not in " ".join(process._cmdline(pid) or [])
        res = runner.invoke(app, ["status"])
        assert res.exit_code == 0, res.output
        assert "Prefect store: postgresql+asyncpg://fedapt:***@127.0.0.1:" in res.output
        assert "MLflow store: postgresql+psycopg://fedapt:***@127.0.0.1:" in res.output
        assert password not in res.output

        api = st["prefect"].url + "/api"
        assert S.probe(api + "/health")
        flow = _post(api + "/flows/", {"name": "pg-store-test"})
        run = _post(api + "/flow_runs/", {"flow_id": flow["id"], "name": "pg-store-run"})
        with psycopg.connect(server, dbname="prefect") as conn:
            row = conn.execute("SELECT name FROM flow_run WHERE id = %s", (run["id"],)).fetchone()
        assert row == ("pg-store-run",)

        from mlflow import MlflowClient

        client = MlflowClient(st["mlflow"].url)
        exp = client.create_experiment("pg-store-test")
        mrun = client.create_run(exp)
        client.log_metric(mrun.info.run_id, "acc", 0.625, step=3)
        with psycopg.connect(server, dbname="mlflow") as conn:
            rows = conn.execute(
                "SELECT key, value, step FROM metrics WHERE run_uuid = %s", (mrun.info.run_id,)
            ).fetchall()
        assert rows == [("acc", 0.625, 3)]

        # a server of the user's: this one's URL passes the checks (version, pg_trgm, the
        # databases there already); with a wrong password it is one line, before anything
        pgstore.prepare_server(server, "--store")
        wrong = server.replace(password, SECRET)
        res = runner.invoke(app, ["up", "--store", wrong, "prefect"])
        assert res.exit_code == 2 and "Traceback" not in res.output, res.output
        last = res.output.strip().splitlines()[-1]
        assert last.startswith("fedapt: error: --store: postgresql://fedapt:***@127.0.0.1:")
        assert "password authentication failed" in last and SECRET not in res.output
        assert S.status(state=sd)["prefect"].pid in pids  # still the one on fedapt's server

        again = S.up(["mlflow", "prefect"], state=sd)  # FEDAPT_STORE unset: the running store
        assert sorted(s.pid for s in again.values() if s.pid) == sorted(pids)
    finally:
        t = time.monotonic()
        res = runner.invoke(app, ["down"])
        print(f"down: {time.monotonic() - t:.1f} s")
        for pid in pids:
            if not _gone(pid):
                process.signal_group(pid, signal.SIGKILL)
        left = process.pids_with_arg(str(pgserver.data_dir(sd)))  # postgres -D <data>
        shutil.rmtree(base, ignore_errors=True)
    assert res.exit_code == 0, res.output
    assert all(s.state == "stopped" for s in S.status(state=sd).values())
    assert all(_gone(pid) for pid in pids)
    assert left == []
