"""Services that refuse strangers (flows/services/auth.py): ``fedapt up --host``/``--auth``,
the settings and their one-line refusals before anything starts, the credentials (0600 files,
yours or generated), where servers and clients get them (environment and files, never a
command line or an output), and one run of every service on 127.0.0.2 with authentication
(slow): unauthenticated requests refused, authenticated ones served, no secret in any log,
command line or output.

127.0.0.2 stands for "another address": it is not the default, so authentication is required,
yet it is on loopback (this machine's servers bind to loopback only)."""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest
from typer.testing import CliRunner

from fedcore.errors import ConfigError
from flows import services as S
from flows.cli import app
from flows.cli import services as cli_services
from flows.services import auth, commands, embedded, envfile, process, rayhead, supervisor
from flows.services.auth import Access
from flows.services.config import ServiceStatus

runner = CliRunner()
OTHER = "127.0.0.2"  # not the default address, still loopback
SECRET = "s3cr3t-Pw-given"
ANY_PORT = {S.port_env_var(n): "0" for n in ("s3", "mlflow", "prefect", "worker", "ray")}
AUTH_ENV = (
    auth.HOST_VAR,
    auth.AUTH_VAR,
    *(v for vs in auth.USER_VARS.values() for v in vs),
    "FEDAPT_STORE",
)


@pytest.fixture
def sd(tmp_path):
    return tmp_path / "state"


@pytest.fixture
def fresh_env(monkeypatch, sd):
    """The CLI on its own state folder, no host, auth or credentials set, any ports."""
    monkeypatch.setenv("FEDAPT_STATE_DIR", str(sd))
    for var in AUTH_ENV:
        monkeypatch.delenv(var, raising=False)
    for key, value in ANY_PORT.items():
        monkeypatch.setenv(key, value)


@pytest.fixture
def no_spawn(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("a server process was started")

    for module in (supervisor, embedded):
        monkeypatch.setattr(module, "spawn", fail)


# ----------------------------------------------------------------------------- bad input


def _kept(sd: Path, var: str, value: str) -> None:
    """A credential kept by an earlier `fedapt up --auth on`."""
    auth.write_private(auth.secret_path(sd, var), value + "\n")


@pytest.mark.parametrize(
    ("args", "env", "kept", "needle"),
    [
        (["--host", OTHER], {}, {}, f"--host: {OTHER} is another address than 127.0.0.1"),
        ([], {"FEDAPT_HOST": "0.0.0.0"}, {}, "FEDAPT_HOST: 0.0.0.0 is another address"),
        (["--host", "0.0.0.0", "s3"], {}, {}, "--host: 0.0.0.0 is another address"),
        (["--host", OTHER, "--auth", "off"], {}, {}, "--host: 127.0.0.2 is another address"),
        ([], {"FEDAPT_HOST": OTHER, "FEDAPT_AUTH": "off"}, {}, "FEDAPT_HOST: 127.0.0.2 is"),
        (["--host", "my host"], {}, {}, "--host: 'my host' is not an address to listen on"),
        (["--host", "::1"], {}, {}, "--host: '::1' is not an address to listen on"),
        ([], {"FEDAPT_HOST": "300.1.2.3"}, {}, "FEDAPT_HOST: '300.1.2.3' is not an address"),
        (["--auth", "yes"], {}, {}, "--auth: 'yes' is not a value; allowed: on"),
        ([], {"FEDAPT_AUTH": "maybe"}, {}, "FEDAPT_AUTH: 'maybe' is not a value; allowed: on"),
        (
            ["--host", OTHER, "--auth", "on"],
            {"FEDAPT_MLFLOW_USERNAME": "me"},
            {},
            "FEDAPT_MLFLOW_PASSWORD: unset while FEDAPT_MLFLOW_USERNAME is set",
        ),
        (
            ["--auth", "on", "s3"],
            {"FEDAPT_S3_SECRET_KEY": SECRET},
            {},
            "FEDAPT_S3_ACCESS_KEY: unset while FEDAPT_S3_SECRET_KEY is set",
        ),
        (
            ["--host", OTHER, "--auth", "on", "prefect"],
            {"FEDAPT_PREFECT_AUTH_STRING": SECRET},
            {},
            "FEDAPT_PREFECT_AUTH_STRING: not of the form user:password",
        ),
        (
            ["--host", OTHER, "--auth", "on"],
            {"FEDAPT_MLFLOW_USERNAME": "fedapt", "FEDAPT_MLFLOW_PASSWORD": SECRET},
            {"FEDAPT_MLFLOW_PASSWORD": "kept-earlier"},
            "FEDAPT_MLFLOW_PASSWORD: differs from the value the services were first started with",
        ),
    ],
)
def test_bad_host_auth_or_credentials_are_one_line_before_anything_starts(
    sd, fresh_env, no_spawn, monkeypatch, args, env, kept, needle
):
    """Every case: exit 2, no traceback, the setting named, the error the last line, no
    secret in the output, nothing written (a kept credential stays as it was)."""
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    for var, value in kept.items():
        _kept(sd, var, value)
    before = sorted(sd.rglob("*")) if sd.exists() else []
    res = runner.invoke(app, ["up", *args])
    text = res.output.strip()
    assert res.exit_code == 2, text
    assert "Traceback" not in text and needle in text, text
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert text.splitlines()[-1].startswith("fedapt: error: "), text
    assert SECRET not in text and "kept-earlier" not in text
    assert (sorted(sd.rglob("*")) if sd.exists() else []) == before
    if "another address" in needle:  # how to give credentials
        assert "--auth on" in text and "FEDAPT_S3_SECRET_KEY" in text


def test_auth_without_flask_wtf_is_one_line(sd, fresh_env, no_spawn, monkeypatch):
    """MLflow's basic-auth app needs Flask-WTF (mlflow[auth]): said before anything starts."""
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "flask_wtf" else find_spec(name, *a),
    )
    res = runner.invoke(app, ["up", "--host", OTHER, "--auth", "on", "mlflow"])
    text = res.output.strip()
    assert res.exit_code == 2 and "Traceback" not in text, text
    assert text.splitlines()[-1].startswith("fedapt: error: --auth: on: MLflow's basic-auth app")
    assert "Flask-WTF" in text and "mlflow[auth]" in text and not sd.exists()


# ----------------------------------------------------------------------------- unit tests


def test_access_settings_and_precedence():
    """--host/--auth, else FEDAPT_HOST/FEDAPT_AUTH, else the running services', else
    127.0.0.1 without; localhost needs no credentials, any other address does."""
    running = {"s3": {"host": OTHER, "auth": True}, "worker": {"host": "127.0.0.1"}}
    assert auth.resolve_access(None, None, {}, {}) == Access()
    assert auth.resolve_access("localhost", None, {}, {}).local
    assert auth.resolve_access(None, None, running, {}) == Access(OTHER, True)
    got = auth.resolve_access(None, None, running, {"FEDAPT_HOST": "127.0.0.1"})
    assert got.host == "127.0.0.1" and got.auth  # the running services' authentication stays
    got = auth.resolve_access("127.0.0.3", "on", running, {"FEDAPT_HOST": "127.0.0.4"})
    assert (got.host, got.auth, got.host_setting) == ("127.0.0.3", True, "--host")
    got = auth.resolve_access(None, None, {}, {"FEDAPT_HOST": " 0.0.0.0 ", "FEDAPT_AUTH": "ON"})
    assert (got.host, got.auth, got.auth_setting) == ("0.0.0.0", True, "FEDAPT_AUTH")
    assert auth.bind_host("worker", got) == auth.bind_host("postgres", got) == "127.0.0.1"
    assert auth.bind_host("mlflow", got) == "0.0.0.0"
    # an address of another machine: named as such, not "port in use" when a server starts
    with pytest.raises(ConfigError, match="--host: 192.0.2.1 is not an address of this machine"):
        auth.resolve_access("192.0.2.1", "on", {}, {})
    # a running service elsewhere, or with other authentication, is restarted by `up`
    same = supervisor._same_access
    assert same("s3", {"host": OTHER, "auth": True}, Access(OTHER, True))
    assert same("worker", {"host": "127.0.0.1", "auth": True}, Access(OTHER, True))
    assert same("mlflow", {}, Access())  # a record of before --host
    assert not same("mlflow", {}, Access("127.0.0.1", True))
    assert not same("prefect", {"host": OTHER, "auth": True}, Access("127.0.0.3", True))


def test_credentials_are_yours_or_generated_once_and_kept_0600(sd):
    """The first `--auth on` takes your variables or generates; later starts reuse what is
    kept, in <state>/auth/ (0700), each file 0600."""
    names = ["s3", "mlflow", "prefect"]
    mine = {"FEDAPT_PREFECT_AUTH_STRING": f"me:{SECRET}"}
    first = auth.check_credentials(sd, names, mine)
    assert not sd.exists()  # checking writes nothing
    assert first["FEDAPT_PREFECT_AUTH_STRING"] == f"me:{SECRET}"
    assert first["FEDAPT_MLFLOW_USERNAME"] == "fedapt" and len(first["FEDAPT_S3_SECRET_KEY"]) > 20
    auth.keep_credentials(sd, first)
    assert stat.S_IMODE(auth.auth_dir(sd).stat().st_mode) == 0o700
    files = sorted(auth.auth_dir(sd).iterdir())
    assert [f.name for f in files] == sorted([*auth.FILES.values(), "mlflow-flask-key"])
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files)
    again = auth.check_credentials(sd, names, {})  # kept: the same, nothing new
    assert again == first
    assert auth.check_credentials(sd, ["s3"], {}) == {
        k: v for k, v in first.items() if k.startswith("FEDAPT_S3_")
    }
    rec = {"mlflow": {"auth": True}, "prefect": {"auth": True}}
    env = auth.client_env(sd, rec)
    assert env["MLFLOW_TRACKING_PASSWORD"] == first["FEDAPT_MLFLOW_PASSWORD"]
    assert env["PREFECT_API_AUTH_STRING"] == f"me:{SECRET}"
    assert auth.client_env(sd, {"mlflow": {"auth": False}}) == {}


def test_servers_get_credentials_in_their_environment_or_0600_files(sd, monkeypatch):
    """On 127.0.0.2 with authentication: each server's address, MLflow's basic-auth app,
    Prefect's auth string, SeaweedFS's keys file, the worker's auth string and health check
    on 127.0.0.1; no secret on any command line."""
    monkeypatch.setattr(commands, "ensure_token", lambda env: None)
    access = Access(OTHER, True)
    values = auth.check_credentials(sd, ["s3", "mlflow", "prefect"], {})
    auth.keep_credentials(sd, values)
    secrets = [values[v] for v in ("FEDAPT_MLFLOW_PASSWORD", "FEDAPT_S3_SECRET_KEY")]
    secrets += [values["FEDAPT_PREFECT_AUTH_STRING"].split(":", 1)[1]]
    records = {
        "s3": {"url": f"http://{OTHER}:1", "auth": True},
        "prefect": {"api_url": f"http://{OTHER}:2/api", "auth": True},
    }
    got = {n: commands.command(n, sd, 3, records, None, access) for n in SERVICES_HERE}
    for name, (cmd, _env, _cwd) in got.items():
        line = " ".join(map(str, cmd))
        assert not any(s in line for s in secrets), name
    s3_cmd, env, _ = got["s3"]
    assert f"-ip.bind={OTHER}" in s3_cmd
    filer_key = auth.value(sd, "s3-filer-key")
    assert env["WEED_JWT_FILER_SIGNING_KEY"] == env["WEED_JWT_FILER_SIGNING_READ_KEY"] == filer_key
    assert filer_key not in " ".join(s3_cmd)
    keys_file = Path(next(a for a in s3_cmd if a.startswith("-s3.config=")).split("=", 1)[1])
    assert keys_file.parent == auth.auth_dir(sd) and stat.S_IMODE(keys_file.stat().st_mode) == 0o600
    ident = json.loads(keys_file.read_text())["identities"][0]["credentials"][0]
    assert ident == {
        "accessKey": values["FEDAPT_S3_ACCESS_KEY"],
        "secretKey": values["FEDAPT_S3_SECRET_KEY"],
    }
    cmd, env, _ = got["mlflow"]
    assert cmd[2:4] == ["--app-name", "basic-auth"] and cmd[cmd.index("--host") + 1] == OTHER
    assert env["MLFLOW_AUTH_ADMIN_PASSWORD"] == values["FEDAPT_MLFLOW_PASSWORD"]
    assert env["AWS_SECRET_ACCESS_KEY"] == values["FEDAPT_S3_SECRET_KEY"]
    assert f"{OTHER}:*" in env["MLFLOW_SERVER_ALLOWED_HOSTS"].split(",")
    ini = Path(env["MLFLOW_AUTH_CONFIG_PATH"])
    assert stat.S_IMODE(ini.stat().st_mode) == 0o600
    assert f"database_uri = sqlite:///{auth.auth_dir(sd)}/mlflow-users.db" in ini.read_text()
    cmd, env, _ = got["prefect"]
    assert cmd[cmd.index("--host") + 1] == OTHER
    assert env["PREFECT_SERVER_API_AUTH_STRING"] == values["FEDAPT_PREFECT_AUTH_STRING"]
    assert env["PREFECT_UI_API_URL"] == f"http://{OTHER}:3/api"
    cmd, env, _ = got["worker"]
    assert env["PREFECT_API_AUTH_STRING"] == values["FEDAPT_PREFECT_AUTH_STRING"]
    assert env["PREFECT_WORKER_WEBSERVER_HOST"] == "127.0.0.1"
    cmd, env, _ = got["ray"]
    assert cmd[cmd.index("--node-ip-address") + 1] == OTHER and env["RAY_AUTH_MODE"] == "token"
    # without authentication: no auth app, no auth string, the fixed local S3 keys
    cmd, env, _ = commands.command("mlflow", sd, 3, {"s3": {"url": "http://127.0.0.1:1"}})
    assert "--app-name" not in cmd and "MLFLOW_AUTH_CONFIG_PATH" not in env
    cmd, env, _ = commands.command("prefect", sd, 3, {})
    assert "PREFECT_SERVER_API_AUTH_STRING" not in env


SERVICES_HERE = ("s3", "mlflow", "prefect", "worker", "ray")


def test_clients_get_credentials_only_for_fedapts_servers_and_env_prints_no_secret(sd, monkeypatch):
    """`fedapt env` exports a secret by reading its 0600 file, never its value; a client
    whose own MLFLOW_TRACKING_URI / PREFECT_API_URL points elsewhere gets no credential of
    fedapt's."""
    values = auth.check_credentials(sd, ["s3", "mlflow", "prefect"], {})
    auth.keep_credentials(sd, values)
    S.write_state(sd, {"mlflow": {"auth": True}, "prefect": {"auth": True}})

    def up(names=None, *, state=None, probe_timeout=1.0):  # all healthy, on 127.0.0.2
        urls = {"s3": "http://127.0.0.2:1", "mlflow": "http://127.0.0.2:2"}
        urls |= {"prefect": "http://127.0.0.2:3", "ray": "127.0.0.2:4"}
        return {n: ServiceStatus(n, "running", True, url=urls.get(n), auth=True) for n in urls}

    monkeypatch.setattr(envfile, "status", up)
    monkeypatch.setattr(S.clients, "status", up)
    text, down = envfile.env_script(sd, environ={})
    assert down == []
    lines = text.splitlines()
    for var, own in auth.SECRET_VARS.items():
        assert f'export {var}="$(cat {auth.secret_path(sd, own)})"' in lines
    assert "export MLFLOW_TRACKING_USERNAME=fedapt" in lines
    assert f"export AWS_ACCESS_KEY_ID={values['FEDAPT_S3_ACCESS_KEY']}" in lines
    for own in auth.SECRET_VARS.values():
        assert values[own] not in text
    done = subprocess.run(  # what an eval gives a shell
        ["bash", "-c", 'eval "$1"; printf %s "$MLFLOW_TRACKING_PASSWORD"', "x", text],
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout == values["FEDAPT_MLFLOW_PASSWORD"]
    found = S.env_for_clients(sd, environ={})
    assert found["MLFLOW_TRACKING_PASSWORD"] == values["FEDAPT_MLFLOW_PASSWORD"]
    assert found["PREFECT_API_AUTH_STRING"] == values["FEDAPT_PREFECT_AUTH_STRING"]
    assert found["AWS_SECRET_ACCESS_KEY"] == values["FEDAPT_S3_SECRET_KEY"]
    mine = {"MLFLOW_TRACKING_URI": "http://elsewhere:5000", "PREFECT_API_URL": "http://x/api"}
    found = S.env_for_clients(sd, environ=mine)
    assert not {"MLFLOW_TRACKING_PASSWORD", "PREFECT_API_AUTH_STRING"} & set(found)


# ----------------------------------------------------------------------------- real servers


def _get(url: str, user: str | None = None, data: bytes | None = None) -> int:
    """HTTP status of a GET (POST with ``data``), with basic auth ``user`` ("name:pw")."""
    request = urllib.request.Request(url, data=data, method="POST" if data else "GET")
    request.add_header("Content-Type", "application/json")
    if user is not None:
        request.add_header("Authorization", "Basic " + base64.b64encode(user.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def _ray_call(address: str, token: str | None) -> str:
    """A call to the head's GCS over gRPC, with Ray's bearer token or without: its status."""
    import grpc

    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(
            "/ray.rpc.NodeInfoGcsService/GetAllNodeInfo",
            request_serializer=lambda b: b,
            response_deserializer=lambda b: b,
        )
        metadata = (("authorization", f"Bearer {token}"),) if token else None
        try:
            call(b"", metadata=metadata, timeout=15)
        except grpc.RpcError as exc:
            return str(exc.code().name)
    return "OK"


def _files_naming(root: Path, secrets: list[str], skip: Path) -> list[str]:
    found = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink() and not path.is_relative_to(skip):
            data = path.read_bytes()
            found += [f"{path}" for s in secrets if s.encode() in data]
    return found


@pytest.mark.slow
def test_every_service_on_another_address_refuses_strangers(monkeypatch):
    """One `fedapt up --host 127.0.0.2 --auth on` of s3, mlflow, prefect, the worker and
    ray: per service an unauthenticated request is refused (401/403, UNAUTHENTICATED) and an
    authenticated one served; fedapt's own clients track through them; no secret in a log,
    record, command line or output; `fedapt down` leaves no process."""
    for var in ("MLFLOW_TRACKING_URI", *S.USER_S3_VARS, "PREFECT_API_URL", *AUTH_ENV):
        monkeypatch.delenv(var, raising=False)
    for var in [
        v for v in os.environ if v.startswith(("RAY_", "MLFLOW_TRACKING_", "PREFECT_API_"))
    ]:
        monkeypatch.delenv(var)
    base = Path(tempfile.mkdtemp(prefix="fedapt-auth-"))
    sd, home = base / "state", base / "home"
    home.mkdir()
    monkeypatch.setenv("FEDAPT_STATE_DIR", str(sd))
    monkeypatch.setenv("HOME", str(home))  # Ray's token: made by `fedapt up ray`, here
    for key, value in ANY_PORT.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(cli_services, "configure_dvc_remote", lambda endpoint: None)
    recs: dict = {}
    try:
        t = time.monotonic()
        res = runner.invoke(app, ["up", "--host", OTHER, "--auth", "on", *SERVICES_HERE])
        print(f"up: {time.monotonic() - t:.1f} s")
        assert res.exit_code == 0, res.output
        recs = S.read_state(sd)
        st = S.status(state=sd)
        assert all(st[n].healthy and st[n].auth for n in SERVICES_HERE), st
        assert st["worker"].url.startswith("http://127.0.0.1:")  # its health check only
        for n in ("s3", "mlflow", "prefect", "ray"):
            assert recs[n]["host"] == OTHER and OTHER in recs[n]["url"], recs[n]
        values = {v: auth.value(sd, v) for v in auth.FILES}
        token = (home / ".ray" / "auth_token").read_text().strip()
        secrets = [values[v] for v in ("FEDAPT_MLFLOW_PASSWORD", "FEDAPT_S3_SECRET_KEY")]
        secrets += [values["FEDAPT_PREFECT_AUTH_STRING"].split(":", 1)[1], token]
        secrets += [auth.value(sd, "mlflow-flask-key"), auth.value(sd, "s3-filer-key")]

        # MLflow: the basic-auth app
        mlflow_api = f"{recs['mlflow']['url']}/api/2.0/mlflow/experiments/search?max_results=1"
        admin = f"{values['FEDAPT_MLFLOW_USERNAME']}:{values['FEDAPT_MLFLOW_PASSWORD']}"
        assert _get(mlflow_api) == 401
        assert _get(mlflow_api, f"{values['FEDAPT_MLFLOW_USERNAME']}:wrong") == 401
        assert _get(mlflow_api, admin) == 200
        # Prefect: the server's auth string (its health check stays open, for probes)
        flows_api = f"{recs['prefect']['api_url']}/flows/filter"
        assert _get(flows_api, data=b"{}") == 401
        assert _get(flows_api, "fedapt:wrong", data=b"{}") == 401
        assert _get(flows_api, values["FEDAPT_PREFECT_AUTH_STRING"], data=b"{}") == 200
        # S3: SeaweedFS checks the keys; its filer's HTTP API (on the same address) answers
        # only what the S3 gateway signed
        assert _get(recs["s3"]["url"] + "/") == 403
        weed = " ".join(_cmdline(psutil.Process(int(recs["s3"]["pid"]))))
        filer = weed.split("-filer.port=", 1)[1].split()[0]
        assert _get(f"http://{OTHER}:{filer}/buckets/") == 401
        wrong = S.s3_client(recs["s3"]["url"], (values["FEDAPT_S3_ACCESS_KEY"], "wrong"))
        with pytest.raises(Exception, match="SignatureDoesNotMatch|AccessDenied|403"):
            wrong.list_buckets()
        right = S.s3_client(recs["s3"]["url"], S.s3_keys(sd))
        assert "fedapt" in {b["Name"] for b in right.list_buckets()["Buckets"]}
        # Ray: token authentication on the GCS
        assert _ray_call(recs["ray"]["address"], None) == "UNAUTHENTICATED"
        assert _ray_call(recs["ray"]["address"], "wrong") == "UNAUTHENTICATED"
        assert _ray_call(recs["ray"]["address"], token) == "OK"

        # a plain `up` keeps them where they are, with their authentication
        again = S.up(list(SERVICES_HERE), state=sd)
        assert {n: again[n].pid for n in SERVICES_HERE} == {n: st[n].pid for n in SERVICES_HERE}

        # fedapt's own clients: Prefect's (fedapt deploy ls, on the server of fedapt up) ...
        out = runner.invoke(app, ["deploy", "ls"])
        assert out.exit_code == 0 and "no deployments on http://127.0.0.2:" in out.output, (
            out.output
        )
        # ... and MLflow's: a tracked run with an artifact (through MLflow's proxy, on S3).
        # fedapt's client (tracking.store.client), not a bare MlflowClient(): that one takes
        # the URI an earlier test of this process left in mlflow.set_tracking_uri, not the
        # environment's (CI's failure of sessions 25-26: the artifact went to a local store)
        from tasks.tracking import store as tracking_store

        client_env = S.env_for_clients(sd)
        assert client_env.get("MLFLOW_TRACKING_URI") == recs["mlflow"]["url"], client_env.keys()
        with S.patched_environ(client_env):
            client = tracking_store.client()
            assert client.tracking_uri == recs["mlflow"]["url"]
            run = client.create_run(client.create_experiment("auth-test"))
            client.log_metric(run.info.run_id, "acc", 0.5)
            client.log_text(run.info.run_id, "hello", "note.txt")
            assert client.get_run(run.info.run_id).data.metrics == {"acc": 0.5}
        # (SeaweedFS lists a new object a moment after its upload on a loaded machine)
        deadline = time.monotonic() + 30
        while True:
            listed = right.list_objects_v2(Bucket="fedapt", Prefix="mlflow/")
            keys = [o["Key"] for o in listed.get("Contents", [])]
            if any(k.endswith("note.txt") for k in keys) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert any(k.endswith("note.txt") for k in keys), keys

        # no secret in an output, a record, a log or a command line
        outputs = [res.output]
        for args in (["status"], ["env"]):
            out = runner.invoke(app, args)
            assert out.exit_code == 0, out.output
            outputs.append(out.output)
        assert '"$(cat ' in outputs[-1] and f"RAY_ADDRESS={recs['ray']['address']}" in outputs[-1]
        assert not [s for s in secrets if any(s in o for o in outputs)]
        roots = [sd, Path(recs["ray"]["temp_dir"])]
        assert not [f for r in roots for f in _files_naming(r, secrets, auth.auth_dir(sd))]
        procs = rayhead.ray_processes(recs["ray"]) + [
            p for n in SERVICES_HERE for p in _group(int(recs[n]["pid"]))
        ]
        assert len(procs) >= 6
        for proc in procs:
            with_secret = [s for s in secrets if s in " ".join(_cmdline(proc))]
            assert not with_secret, proc
    finally:
        t = time.monotonic()
        res = runner.invoke(app, ["down"])
        print(f"down: {time.monotonic() - t:.1f} s")
        left = [int(r["pid"]) for r in recs.values() if process.group_alive(int(r["pid"]))]
        for pid in left:
            process.signal_group(pid, signal.SIGKILL)
        if "ray" in recs:
            rayhead.kill_stragglers(recs["ray"])
        shutil.rmtree(base, ignore_errors=True)
    assert res.exit_code == 0, res.output
    assert left == []


def _group(pgid: int) -> list[psutil.Process]:
    out = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid:
                out.append(proc)
        except (OSError, psutil.Error):
            continue
    return out


def _cmdline(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline()
    except psutil.Error:
        return []
