"""The environment a run starts in, bad values (MLflow's tracking URI, S3, Prefect, Ray,
fedapt's own variables): one clear line naming the variable, before anything starts; an
MLflow server that refuses the credentials too."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from flows.cli import app
from tests.cli_contract import REPO, assert_one_clear_line, invoke, runner

_S3_VARS = ("AWS_ENDPOINT_URL", "MLFLOW_S3_ENDPOINT_URL", "AWS_PROFILE", "AWS_DEFAULT_REGION")


_ALLOWED_STORES = "allowed: sqlite:///PATH/mlflow.db, http(s)://HOST:PORT"


def _environment_case(name: str, tmp_path: Path) -> tuple[dict[str, str], list[str], str]:
    """(environment, args, needle) of one bad-environment case."""
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    track, s3 = ["--set", "runtime.tracking=true"], ["--set", "storage.bucket=fedapt"]
    keys = {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"}
    if name == "sqlite-under-file":
        uri = f"sqlite:///{a_file}/x.db"
        return {"MLFLOW_TRACKING_URI": uri}, track, f"MLFLOW_TRACKING_URI: {a_file} is a file"
    if name == "sqlite-under-proc":  # looks writable to root, cannot hold a folder
        uri = "sqlite:////proc/fedapt-nope/mlflow.db"
        return {"MLFLOW_TRACKING_URI": uri}, track, f"MLFLOW_TRACKING_URI: {uri}: cannot create"
    if name == "sqlite-is-folder":
        uri = f"sqlite:///{tmp_path}"
        return {"MLFLOW_TRACKING_URI": uri}, track, f"{uri}: {tmp_path} is a folder"
    if name == "sqlite-not-a-database":
        uri = f"sqlite:///{a_file}"
        return {"MLFLOW_TRACKING_URI": uri}, track, f"{a_file} is not an SQLite database"
    if name == "bare-path":
        uri = str(tmp_path / "mlruns")
        return {"MLFLOW_TRACKING_URI": uri}, track, f"{uri}: MLflow 3 no longer runs a file store"
    if name == "file-store":
        uri = (tmp_path / "mlruns").as_uri()
        return {"MLFLOW_TRACKING_URI": uri}, track, _ALLOWED_STORES
    if name == "postgresql-without-driver":
        pytest.importorskip("sqlalchemy")
        if importlib.util.find_spec("psycopg2") is not None:
            pytest.skip("psycopg2 is installed")
        uri = "postgresql://fed:secret@127.0.0.1:1/mlflow"
        return {"MLFLOW_TRACKING_URI": uri}, track, "database driver psycopg2 is not installed"
    if name == "unknown-scheme":
        return {"MLFLOW_TRACKING_URI": "ftp://h/x"}, track, "unsupported scheme 'ftp'; allowed"
    if name == "password-in-uri":  # masked in the line (and never printed in clear)
        uri = "http://fed:secret@127.0.0.1:1"
        return {"MLFLOW_TRACKING_URI": uri}, track, "http://fed:***@127.0.0.1:1 is not reachable"
    if name == "endpoint-without-scheme":
        env = {"AWS_ENDPOINT_URL": "127.0.0.1:8333", **keys}
        return env, s3, "AWS_ENDPOINT_URL: 127.0.0.1:8333 is not an S3 endpoint URL"
    if name == "unknown-profile":
        env = {"AWS_PROFILE": "no-such-profile", "AWS_CONFIG_FILE": str(tmp_path / "cfg")}
        return env, s3, "AWS_PROFILE: unknown profile 'no-such-profile'; known: none"
    if name == "bad-region":
        env = {"AWS_ENDPOINT_URL": "http://127.0.0.1:1", "AWS_DEFAULT_REGION": "a b", **keys}
        return env, s3, "AWS_DEFAULT_REGION: 'a b' is not a region name"
    if name == "prefect-unreachable":
        url = "http://fed:secret@127.0.0.1:1/api"
        return {"PREFECT_API_URL": url}, [], "PREFECT_API_URL: http://fed:***@127.0.0.1:1/api is"
    if name == "prefect-not-a-url":
        return {"PREFECT_API_URL": "127.0.0.1:4200"}, [], "PREFECT_API_URL: 127.0.0.1:4200 is not"
    if name == "ray-auth-disabled":  # a run's own Ray always asks for the token
        env, ray = {"RAY_AUTH_MODE": "disabled"}, ["--set", "runtime.clients=ray"]
        return env, ray, "RAY_AUTH_MODE: 'disabled' is not token: the run's own local Ray"
    if name == "ray-auth-unknown":
        env, ray = {"RAY_AUTH_MODE": "none"}, ["--set", "runtime.task_runner=ray"]
        return env, ray, "unset RAY_AUTH_MODE or set it to token"
    if name == "numerics":
        return {"FEDAPT_NUMERICS": "fast"}, [], "FEDAPT_NUMERICS: 'fast' is not one of portable"
    if name.endswith("-empty"):  # the sweep of issue 45: set but empty was taken as unset
        var = {
            "state-dir-empty": "FEDAPT_STATE_DIR",
            "prefect-home-empty": "PREFECT_HOME",  # (Prefect wrote its database into ./)
            "mlflow-config-empty": "FEDAPT_MLFLOW_CONFIG",
        }[name]
        return {var: ""}, [], f"{var} is set but empty (''); allowed: a "
    if name.endswith("-file"):  # a file where the folder goes: every command stops
        a_file = tmp_path / "a-file"
        a_file.write_text("x")
        var, value = {
            "state-dir-file": ("FEDAPT_STATE_DIR", a_file),
            "state-dir-under-file": ("FEDAPT_STATE_DIR", a_file / "state"),
            "prefect-home-file": ("PREFECT_HOME", a_file),
        }[name]
        return {var: str(value)}, [], f"{var}={value} is "
    if name == "tracking-blank":
        return {"MLFLOW_TRACKING_URI": "  "}, track, "MLFLOW_TRACKING_URI: '  ' is blank; allowed"
    if name.startswith("service-grace-"):  # checked before anything starts
        value = {"zero": "0", "text": "3s", "too-long": "3600"}[name.removeprefix("service-grace-")]
        return (
            {"FEDAPT_SERVICE_GRACE": value},
            [],
            (f"FEDAPT_SERVICE_GRACE={value!r} is not a number of seconds in (0, 600]"),
        )
    raise AssertionError(name)


@pytest.mark.parametrize(
    "name",
    [
        "sqlite-under-file",
        "sqlite-under-proc",
        "sqlite-is-folder",
        "sqlite-not-a-database",
        "bare-path",
        "file-store",
        "postgresql-without-driver",
        "unknown-scheme",
        "password-in-uri",
        "endpoint-without-scheme",
        "unknown-profile",
        "bad-region",
        "prefect-unreachable",
        "prefect-not-a-url",
        "ray-auth-disabled",
        "ray-auth-unknown",
        "numerics",
        "service-grace-zero",
        "service-grace-text",
        "service-grace-too-long",
        "state-dir-empty",
        "prefect-home-empty",
        "mlflow-config-empty",
        "state-dir-file",
        "state-dir-under-file",
        "prefect-home-file",
        "tracking-blank",
    ],
)
def test_bad_environment(tmp_path, monkeypatch, name):
    env, args, needle = _environment_case(name, tmp_path)
    for var in (*_S3_VARS, "RAY_ADDRESS"):
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    res = invoke(tmp_path, "run", *args)
    assert_one_clear_line(res, needle, tmp_path / "reports")
    assert "secret" not in res.output, res.output
    assert not (REPO / "prefect.db").exists()  # (an empty PREFECT_HOME: the current folder)


def test_tracking_server_refusing_the_credentials_is_one_line(tmp_path, monkeypatch):
    """A server that answers /health but refuses the API (authentication on, wrong or no
    password): one line before any work, the password masked. The server is a stand-in
    that answers as MLflow's basic-auth app does (401 on every API call)."""
    import http.server
    import threading

    seen: list[str] = []

    class Refusing(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("Authorization", ""))
            ok = self.path == "/health"
            self.send_response(200 if ok else 401)
            self.end_headers()
            self.wfile.write(b"OK" if ok else b"You are not authenticated.")

        do_POST = do_GET

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refusing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        uri = f"http://fed:secret@127.0.0.1:{server.server_port}"
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        res = invoke(tmp_path, "run", "--set", "runtime.tracking=true")
    finally:
        server.shutdown()
        server.server_close()
    needle = f"http://fed:***@127.0.0.1:{server.server_port} refused the request (UNAUTH"
    assert_one_clear_line(res, needle, tmp_path / "reports")
    assert "secret" not in res.output, res.output
    assert seen[0] == "Basic ZmVkOnNlY3JldA==", seen  # /health asked with the URI's user


@pytest.mark.parametrize("command", [["env"], ["deploy", "ls"], ["status"], ["down"]])
def test_a_state_folder_that_is_a_file_stops_every_command(tmp_path, monkeypatch, command):
    """``FEDAPT_STATE_DIR`` naming a file: `fedapt env` said the services were "not
    running" and `fedapt deploy ls` asked for a server; every command stops in one line."""
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    monkeypatch.setenv("FEDAPT_STATE_DIR", str(a_file))
    res = runner.invoke(app, command)
    assert_one_clear_line(res, f"FEDAPT_STATE_DIR={a_file} is a file, not a folder", tmp_path / "x")
