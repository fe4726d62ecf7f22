"""The services' configuration, without starting anything: ports, the state directory and
the command line of each service (the worker's pool, the MLflow server from
mlflow/server.toml, the Prefect server's settings)."""

from __future__ import annotations

import pytest

from fedcore.errors import ConfigError
from flows import services as S
from flows.services import commands


@pytest.fixture
def sd(tmp_path):
    return tmp_path / "state"


def test_ports_from_argument_then_environment_then_default(monkeypatch):
    monkeypatch.setenv("FEDAPT_MLFLOW_PORT", "5123")
    monkeypatch.delenv("FEDAPT_PREFECT_PORT", raising=False)
    monkeypatch.delenv("FEDAPT_WORKER_PORT", raising=False)
    monkeypatch.delenv("FEDAPT_RAY_PORT", raising=False)
    monkeypatch.delenv("FEDAPT_POSTGRES_PORT", raising=False)
    ports = S.resolve_ports({"s3": 0})
    assert ports == {
        "postgres": 5433,
        "s3": 0,
        "mlflow": 5123,
        "prefect": S.DEFAULT_PORTS["prefect"],
        "worker": S.DEFAULT_PORTS["worker"],
        "ray": 6379,
    }
    monkeypatch.setenv("FEDAPT_MLFLOW_PORT", "fivethousand")
    with pytest.raises(ConfigError, match="FEDAPT_MLFLOW_PORT"):
        S.resolve_ports()
    with pytest.raises(ConfigError, match="unknown service 'minio'"):
        S.status(["minio"])


def test_state_dir_argument_environment_default(monkeypatch, tmp_path):
    monkeypatch.delenv("FEDAPT_STATE_DIR", raising=False)
    assert S.state_dir() == S.ROOT / ".fedapt"
    monkeypatch.setenv("FEDAPT_STATE_DIR", str(tmp_path / "env"))
    assert S.state_dir() == tmp_path / "env"
    assert S.state_dir(tmp_path / "arg") == tmp_path / "arg"


def test_worker_runs_the_pool_of_fedapt_deploy_in_this_checkout(sd, monkeypatch):
    """The worker polls fedapt's pool against the recorded Prefect server, keeps the user's
    MLflow/S3 settings for the runs it starts, and serves its health check on 127.0.0.1."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:////tmp/x.db")
    monkeypatch.setenv("PREFECT_API_URL", "http://elsewhere:1/api")
    monkeypatch.setenv("PREFECT_WORKER_QUERY_SECONDS", "2")
    monkeypatch.setenv("FEDAPT_WORKER_LIMIT", "2")
    records = {"prefect": {"api_url": "http://127.0.0.1:4242/api"}}
    cmd, env, cwd = commands.command("worker", sd, 4243, records)
    assert cmd[1:3] == ["worker", "start"]
    assert cmd[cmd.index("--pool") + 1] == S.WORK_POOL
    assert cmd[cmd.index("--type") + 1] == "process"
    assert cmd[cmd.index("--limit") + 1] == "2"
    assert "--with-healthcheck" in cmd
    assert cwd == S.ROOT
    assert env["PREFECT_API_URL"] == "http://127.0.0.1:4242/api"  # ours, not the user's
    assert env["PREFECT_WORKER_WEBSERVER_HOST"] == "127.0.0.1"
    assert env["PREFECT_WORKER_WEBSERVER_PORT"] == "4243"
    assert env["PREFECT_WORKER_QUERY_SECONDS"] == "2"
    assert env["MLFLOW_TRACKING_URI"] == "sqlite:////tmp/x.db"
    monkeypatch.setenv("FEDAPT_WORKER_LIMIT", "0")
    with pytest.raises(ConfigError, match="FEDAPT_WORKER_LIMIT"):
        commands.command("worker", sd, 4243, records)


def test_mlflow_server_is_configured_by_mlflow_server_toml(sd, monkeypatch, tmp_path):
    """`fedapt up` starts the tracking server from mlflow/server.toml (the repository's, or
    the file FEDAPT_MLFLOW_CONFIG names)."""
    records = {"s3": {"url": "http://127.0.0.1:8333"}}
    cmd, env, cwd = commands.command("mlflow", sd, 5055, records)
    assert cmd[1] == "server" and cwd == sd / "mlflow"
    assert cmd[cmd.index("--backend-store-uri") + 1] == f"sqlite:///{sd / 'mlflow' / 'mlflow.db'}"
    assert cmd[cmd.index("--artifacts-destination") + 1] == f"s3://{S.DEFAULT_BUCKET}/mlflow"
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1" and cmd[cmd.index("--port") + 1] == "5055"
    assert env["MLFLOW_S3_ENDPOINT_URL"] == "http://127.0.0.1:8333"
    own = tmp_path / "server.toml"
    own.write_text(
        "[server]\n"
        'backend_store_uri = "sqlite:///{home}/other.db"\n'
        'artifacts_destination = "s3://team-bucket/runs"\n'
        "workers = 2\n"
        'extra_args = ["--gunicorn-opts", "--timeout 120"]\n'
    )
    monkeypatch.setenv("FEDAPT_MLFLOW_CONFIG", str(own))
    cmd, _, _ = commands.command("mlflow", sd, 5055, records)
    assert cmd[cmd.index("--backend-store-uri") + 1].endswith("mlflow/other.db")
    assert cmd[cmd.index("--artifacts-destination") + 1] == "s3://team-bucket/runs"
    assert cmd[cmd.index("--workers") + 1] == "2"
    assert cmd[-2:] == ["--gunicorn-opts", "--timeout 120"]
    assert S.artifact_bucket("s3://team-bucket/runs") == "team-bucket"
    assert S.artifact_bucket("/srv/mlartifacts") is None


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("[server]\nbackend = 'x'\n", "unknown key server.backend; allowed: backend_store_uri"),
        ("[server]\nbackend_store_uri = 1\nartifacts_destination = 'a'\n", "must be a str"),
        ("[server]\nartifacts_destination = 'a'\n", "server.backend_store_uri is required"),
        (
            "[server]\nbackend_store_uri = 'b'\nartifacts_destination = 'a'\n"
            "extra_args = ['--port=1']\n",
            "sets --port=1, which fedapt sets itself",
        ),
        (
            "[server]\nbackend_store_uri = '{nowhere}/db'\nartifacts_destination = 'a'\n",
            "unknown placeholder 'nowhere'",
        ),
        ("[server]\nbackend_store_uri = 'b'\nartifacts_destination = 'a'\nworkers = 0\n", ">= 1"),
        ("[server\n", "not valid TOML"),
        ("", "expected one \\[server\\] table"),
        (b"\xff\xfe[server]", "not UTF-8 text"),
    ],
)
def test_bad_mlflow_config_is_one_line_before_anything_starts(
    sd, monkeypatch, tmp_path, text, match
):
    bad = tmp_path / "server.toml"
    bad.write_bytes(text if isinstance(text, bytes) else text.encode())
    monkeypatch.setenv("FEDAPT_MLFLOW_CONFIG", str(bad))
    with pytest.raises(ConfigError, match=match) as exc:
        S.up(["mlflow"], state=sd)
    # the variable that named the file, then the file (the sweep of session 30: the file alone)
    assert str(exc.value).startswith(f"FEDAPT_MLFLOW_CONFIG: {bad}: ")
    assert "\n" not in str(exc.value)
    assert S.read_state(sd) == {}  # nothing was started (not even s3)


def test_missing_mlflow_config_says_how_to_restore_it(sd, monkeypatch, tmp_path):
    """The repo's mlflow/server.toml missing: how to restore it; a FEDAPT_MLFLOW_CONFIG
    naming a missing file: the variable and what it takes (restoring the repo's file would
    not help)."""
    from flows.services import config

    monkeypatch.delenv("FEDAPT_MLFLOW_CONFIG", raising=False)
    monkeypatch.setattr(config, "MLFLOW_CONFIG", tmp_path / "mlflow" / "server.toml")
    with pytest.raises(ConfigError, match="git checkout mlflow/server.toml"):
        S.mlflow_config(sd)
    monkeypatch.setenv("FEDAPT_MLFLOW_CONFIG", str(tmp_path / "absent.toml"))
    with pytest.raises(ConfigError, match=r"^FEDAPT_MLFLOW_CONFIG: .*absent.toml: no such file; "):
        S.mlflow_config(sd)


def test_prefect_server_gets_its_server_settings_not_client_settings(sd, monkeypatch):
    monkeypatch.setenv("PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS", "2")
    monkeypatch.setenv("PREFECT_API_URL", "http://elsewhere:1/api")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:////tmp/x.db")
    cmd, env, _ = commands.command("prefect", sd, 4242, {})
    assert cmd[1:3] == ["server", "start"]
    assert env["PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS"] == "2"
    assert "PREFECT_API_URL" not in env and "MLFLOW_TRACKING_URI" not in env
