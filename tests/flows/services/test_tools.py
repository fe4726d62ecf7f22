"""The tools follow the services, for real: after `fedapt up` (a real Prefect server, MLflow
server and SeaweedFS), the documented `eval "$(fedapt env)"` (or `. .fedapt/env`) points the
`prefect` and `mlflow` CLIs at them, and after `fedapt down` it points them nowhere; and
`fedapt deploy ls | pause | resume | delete` against a real Prefect server: pausing cancels
the runs that have not started and leaves a running one alone."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows import services as S
from flows.cli import app
from flows.cli import services as cli_services

REPO = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
runner = CliRunner()


def _shell(script: str, sd: Path, home: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    """``script`` in bash as a user's shell in this checkout: the venv's tools on PATH, none of
    the client variables set, a Prefect home of its own (no profile of the developer's)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PREFECT_", "MLFLOW_", "AWS_", "FEDAPT_ENV"))
    }
    env.update(
        PATH=f"{BIN}:{env['PATH']}",
        PYTHONPATH=str(REPO),
        FEDAPT_STATE_DIR=str(sd),
        PREFECT_HOME=str(home),
        COLUMNS="250",
        **extra,
    )
    return subprocess.run(
        ["bash", "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=180
    )


def test_env_with_nothing_up_unsets_only_what_fedapt_set(tmp_path, monkeypatch):
    sd = tmp_path / "state"
    monkeypatch.setenv("FEDAPT_STATE_DIR", str(sd))
    monkeypatch.setenv("FEDAPT_ENV_VARS", "PREFECT_API_URL MLFLOW_TRACKING_URI")
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://minio:9000")  # the user's, not in the list
    res = runner.invoke(app, ["env"])
    assert res.exit_code == 0, res.output
    assert res.stdout.splitlines()[1:] == [
        "unset PREFECT_API_URL",
        "unset MLFLOW_TRACKING_URI",
        "unset FEDAPT_ENV_VARS",
    ]
    assert (
        res.stderr.strip() == "fedapt env: not running: prefect, mlflow, s3 (start with: fedapt up)"
    )
    sd.mkdir()
    (sd / "env").write_text("export PREFECT_API_URL=http://127.0.0.1:9/api\n")  # a stale one
    res = runner.invoke(app, ["status"])
    assert res.exit_code == 0 and not (sd / "env").exists()


def test_env_script_quotes_values_and_keeps_the_users_s3(tmp_path, monkeypatch):
    """Unit test of the script (a stand-in status: every service healthy)."""
    from flows.services import envfile

    def healthy(names, state=None):  # type: ignore[no-untyped-def]
        urls = {"s3": "http://127.0.0.1:1", "mlflow": "http://127.0.0.1:2", "prefect": "x y"}
        urls["ray"] = "127.0.0.1:3"
        return {n: S.ServiceStatus(n, "running", True, url=urls[n]) for n in names}

    monkeypatch.setattr(envfile, "status", healthy)
    text, down = envfile.env_script(tmp_path, environ={})
    assert down == []
    assert "export PREFECT_API_URL='x y/api'" in text.splitlines()
    assert "export AWS_ENDPOINT_URL=http://127.0.0.1:1" in text.splitlines()
    assert "export RAY_ADDRESS=127.0.0.1:3" in text.splitlines()
    assert "export RAY_AUTH_MODE=token" in text.splitlines()
    assert text.splitlines()[-1].startswith("export FEDAPT_ENV_VARS='PREFECT_API_URL ")
    text, _ = envfile.env_script(tmp_path, environ={"AWS_PROFILE": "work"})
    assert "AWS_" not in text and "MLFLOW_S3" not in text  # the user's S3 wins
    ours = {"AWS_ENDPOINT_URL": "http://127.0.0.1:7", "FEDAPT_ENV_VARS": "AWS_ENDPOINT_URL"}
    text, _ = envfile.env_script(tmp_path, environ=ours)  # set by an earlier eval: refreshed
    assert "export AWS_ENDPOINT_URL=http://127.0.0.1:1" in text.splitlines()
    path = envfile.write_env_file(tmp_path, environ={})
    assert path is not None and path.stat().st_mode & 0o777 == 0o600
    assert "unset" not in path.read_text() and "export MLFLOW_TRACKING_URI" in path.read_text()


def test_deploy_without_cron_or_with_options_of_another_subcommand_is_one_line():
    text = _one_line(runner.invoke(app, ["deploy"]))
    assert "needs --cron" in text and "ls, pause NAME, resume NAME, delete NAME" in text
    text = _one_line(runner.invoke(app, ["deploy", "--cron", "0 3 * * *", "pause", "nightly"]))
    assert "`fedapt deploy pause` takes none" in text


def _tiny_flow_run(api: str, home: Path) -> str:
    """A real flow run on the server: a one-task flow run in a process of its own."""
    code = (
        "from prefect import flow\n"
        "@flow(name='fedapt-env-probe')\n"
        "def probe():\n    return 1\n"
        "state = probe(return_state=True)\n"
        "print(state.state_details.flow_run_id)\n"
    )
    env = {**os.environ, "PREFECT_API_URL": api, "PREFECT_HOME": str(home)}
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=180
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.split()[-1]


@pytest.mark.slow
def test_prefect_and_mlflow_clis_list_what_is_on_the_servers_of_fedapt_up(tmp_path, monkeypatch):
    import mlflow
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    sd, home = tmp_path / "state", tmp_path / "prefect-home"
    monkeypatch.setenv("FEDAPT_STATE_DIR", str(sd))
    for var in (*S.USER_S3_VARS, "PREFECT_API_URL", "MLFLOW_TRACKING_URI", "FEDAPT_ENV_VARS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(cli_services, "configure_dvc_remote", lambda url: None)  # the repo's
    try:
        res = runner.invoke(app, ["up", "mlflow", "prefect"], env={"FEDAPT_S3_PORT": "0",
                            "FEDAPT_MLFLOW_PORT": "0", "FEDAPT_PREFECT_PORT": "0"})  # fmt: skip
        assert res.exit_code == 0, res.output
        assert 'eval "$(.venv/bin/fedapt env)"' in res.output
        env_file = sd / "env"
        assert env_file.stat().st_mode & 0o777 == 0o600  # it holds the local S3 keys
        records = S.read_state(sd)
        api, tracking = records["prefect"]["api_url"], records["mlflow"]["url"]

        run_id = _tiny_flow_run(api, home)
        with temporary_settings(updates={PREFECT_API_URL: api}):
            with get_client(sync_client=True) as client:
                run_name = client.read_flow_run(run_id).name
        mlflow.MlflowClient(tracking_uri=tracking).create_experiment("fedapt-env-probe")

        # the README's way: eval "$(fedapt env)", then the tools
        listing = "prefect flow-run ls && mlflow experiments search"
        for setup in ('eval "$(fedapt env)"', f". {env_file}"):
            proc = _shell(f"set -e; {setup}; {listing}", sd, home)
            assert proc.returncode == 0, proc.stdout + proc.stderr
            assert run_name in proc.stdout and "fedapt-env-probe" in proc.stdout, proc.stdout
            assert "Traceback" not in proc.stderr
        proc = _shell('eval "$(fedapt env)"; echo "$PREFECT_API_URL $AWS_ENDPOINT_URL"', sd, home)
        assert proc.stdout.split() == [api, records["s3"]["url"]], proc.stdout

        # The user's own S3 wins: no fedapt keys next to their endpoint.
        proc = _shell('eval "$(fedapt env)"; echo "$AWS_ENDPOINT_URL/$AWS_ACCESS_KEY_ID"', sd,
                      home, AWS_ENDPOINT_URL="http://minio:9000")  # fmt: skip
        assert proc.stdout.strip() == "http://minio:9000/", proc.stdout
    finally:
        res = runner.invoke(app, ["down"])
    assert res.exit_code == 0, res.output
    assert not (sd / "env").exists()  # nothing left to source that names a stopped server

    # A shell that evaluated it before `fedapt down`: the next eval unsets exactly those
    # variables (not the user's) and says the services are down.
    stale = (
        f"export PREFECT_API_URL={api} MLFLOW_TRACKING_URI={tracking} MY_VAR=kept "
        "FEDAPT_ENV_VARS='PREFECT_API_URL MLFLOW_TRACKING_URI'; "
        'eval "$(fedapt env)"; echo "[${PREFECT_API_URL-unset}] [${MLFLOW_TRACKING_URI-unset}]'
        ' [$MY_VAR]"'
    )
    proc = _shell(stale, sd, home)
    assert proc.stdout.strip() == "[unset] [unset] [kept]", proc.stdout + proc.stderr
    assert proc.stderr.strip() == (
        "fedapt env: not running: prefect, mlflow, s3 (start with: fedapt up)"
    )


def _wait(predicate, timeout: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.5)
    return value


def _one_line(res) -> str:  # type: ignore[no-untyped-def]
    text = res.output.strip()
    assert res.exit_code == 2 and len(text.splitlines()) == 1, text
    assert "Traceback" not in text
    return text


@pytest.mark.slow
def test_deploy_pause_resume_delete_on_a_real_server(tmp_path, monkeypatch):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.objects import StateType
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from prefect.states import Pending, Running

    sd = tmp_path / "state"
    monkeypatch.setenv("FEDAPT_STATE_DIR", str(sd))
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv("PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS", "2")
    try:
        S.up(["prefect"], state=sd, ports={"prefect": 0})
        api = S.read_state(sd)["prefect"]["api_url"]
        res = runner.invoke(app, ["deploy", "ls"])
        assert res.exit_code == 0 and "no deployments on" in res.output, res.output
        text = _one_line(runner.invoke(app, ["deploy", "pause", "nightly"]))
        assert "no deployment 'nightly'" in text and "none yet" in text

        res = runner.invoke(app, ["deploy", "--cron", "* * * * *", "--name", "every-minute",
                                  "--params", str(REPO / "params.yaml")])  # fmt: skip
        assert res.exit_code == 0, res.output
        with (
            temporary_settings(updates={PREFECT_API_URL: api}),
            get_client(sync_client=True) as client,
        ):
            dep = client.read_deployment_by_name("fedapt-experiment/every-minute")
            # runs that have not started: one created by hand (Scheduled, due now: not one
            # the server deletes on pause), one a worker took (Pending); and one Running
            due = client.create_flow_run_from_deployment(dep.id)
            taken = client.create_flow_run_from_deployment(dep.id)
            client.set_flow_run_state(taken.id, Pending(), force=True)
            running = client.create_flow_run_from_deployment(dep.id)
            client.set_flow_run_state(running.id, Running(), force=True)
            _wait(lambda: [r for r in _deployment_runs(client, dep.id) if r.auto_scheduled],
                  60, "the scheduler to create runs")  # fmt: skip

            res = runner.invoke(app, ["deploy", "ls"])
            assert res.exit_code == 0 and "every-minute" in res.output, res.output
            assert "active" in res.output and "* * * * *" in res.output

            text = _one_line(runner.invoke(app, ["deploy", "resume", "nope"]))
            assert "no deployment 'nope'" in text and "known: every-minute" in text

            res = runner.invoke(app, ["deploy", "pause", "every-minute"])
            assert res.exit_code == 0, res.output
            assert client.read_deployment(dep.id).paused
            states = {r.id: r.state_type for r in _deployment_runs(client, dep.id)}
            assert states[due.id] == states[taken.id] == StateType.CANCELLED
            assert states[running.id] == StateType.RUNNING  # left to finish
            assert StateType.SCHEDULED not in states.values(), states
            assert StateType.PENDING not in states.values(), states
            # the scheduler's own runs are deleted (as the server's pause does), not cancelled
            assert not [r for r in _deployment_runs(client, dep.id)
                        if r.auto_scheduled and r.state_type == StateType.CANCELLED]  # fmt: skip
            assert f"prefect flow-run cancel {running.id}" in res.output, res.output
            time.sleep(5)  # two scheduler loops: a paused deployment gets no new run
            assert not [r for r in _deployment_runs(client, dep.id)
                        if r.state_type == StateType.SCHEDULED]  # fmt: skip
            assert "paused" in runner.invoke(app, ["deploy", "ls"]).output

            res = runner.invoke(app, ["deploy", "resume", "fedapt-experiment/every-minute"])
            assert res.exit_code == 0, res.output
            assert not client.read_deployment(dep.id).paused
            _wait(lambda: [r for r in _deployment_runs(client, dep.id)
                           if r.state_type == StateType.SCHEDULED], 60,
                  "the scheduler to create runs again")  # fmt: skip

            # (the scheduler's runs are deleted, as the server's pause deletes them, even those a
            # scheduler iteration in flight inserts after it; one made by hand is cancelled)
            due = client.create_flow_run_from_deployment(dep.id)
            res = runner.invoke(app, ["deploy", "delete", "every-minute"])
            assert res.exit_code == 0, res.output
            assert f"prefect flow-run cancel {running.id}" in res.output, res.output
            assert f"cancelled 1 run(s) that had not started: {due.name}" in res.output
            assert client.read_flow_run(due.id).state_type == StateType.CANCELLED
            assert [d.name for d in client.read_deployments()] == []
            assert client.read_flow_run(running.id).state_type == StateType.RUNNING
            assert not [r for r in client.read_flow_runs()
                        if r.state_type in (StateType.SCHEDULED, StateType.PENDING)]  # fmt: skip
    finally:
        S.down(state=sd)


def _deployment_runs(client, deployment_id):  # type: ignore[no-untyped-def]
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    ids = DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id]))
    return client.read_flow_runs(deployment_filter=ids, limit=200)
