"""Each service's command line, environment and working folder (``command``): fedapt's S3,
MLflow, Prefect server and worker, the Ray head and fedapt's PostgreSQL server; the
environment every server starts from (``base_env``) and the worker's limit of flow runs."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedcore.errors import ConfigError
from flows.services import auth, pgserver, pgstore
from flows.services.auth import Access
from flows.services.config import (
    HOST,
    QUIET_ENV,
    ROOT,
    WORK_POOL,
    WORK_POOL_TYPE,
    mlflow_config,
)
from flows.services.pgstore import Store
from flows.services.ports import base_url
from flows.services.rayhead import ensure_token, ray_cmd, ray_env, ray_record
from flows.services.s3 import s3_client_env, scratch_dir, weed_cmd
from flows.services.stores import store_server


def base_env(keep: tuple[str, ...] = ()) -> dict[str, str]:
    """The environment of a server: the user's, less the client settings of other services
    (``AWS_*``, ``MLFLOW_*``, ``PREFECT_*``) unless they start with one of ``keep``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AWS_", "MLFLOW_", "PREFECT_")) or k in QUIET_ENV or k.startswith(keep)
    }
    env.update(QUIET_ENV)
    return env


def worker_limit() -> int:
    """Flow runs the worker runs at once (``FEDAPT_WORKER_LIMIT``, default 1: a run already
    uses every core of a small machine)."""
    value = os.environ.get("FEDAPT_WORKER_LIMIT", "1")
    try:
        limit = int(value)
    except ValueError:
        limit = 0
    if limit < 1:
        raise ConfigError(f"FEDAPT_WORKER_LIMIT={value!r} is not a positive whole number")
    return limit


def command(
    name: str,
    sd: Path,
    port: int,
    records: Mapping[str, Any],
    store: Store | None = None,
    access: Access = auth.LOCAL,
) -> tuple[list, dict, Path]:
    """The command line, environment and working folder of service ``name`` on ``port``
    (``access``: the address and authentication, ``auth``; credentials only in the
    environment or in 0600 files, never on the command line)."""
    env = base_env()
    host = auth.bind_host(name, access)
    server = store_server(store, sd, records) if store and name in pgstore.STORE_USERS else None
    if name == "postgres":  # pgserver.py; run as the system user postgres under root
        bindir = pgserver.check_binaries("postgres")
        home = pgserver.home_dir(sd)
        return pgserver.server_cmd(sd, bindir, port), pgserver.server_env(env), home
    if name == "ray":  # rayhead.py; cwd: its session folder's root
        cmd, env = ray_cmd(sd, port, host), ray_env(env)
        ensure_token(env)
        return cmd, env, Path(ray_record(cmd)["temp_dir"])
    if name == "s3":  # its files live in its scratch folder, removed when it stops
        env["TMPDIR"] = str(scratch_dir(sd, port))
        keys = auth.s3_keys(sd) if access.auth else None
        if access.auth:  # its filer's HTTP API takes only requests its S3 gateway signed
            env.update(auth.seaweed_env(sd))
        return weed_cmd(sd, port, host, keys), env, scratch_dir(sd, port)
    bindir = Path(sys.executable).parent
    if name == "mlflow":  # configured in mlflow/server.toml
        conf = mlflow_config(sd)
        home = sd / "mlflow"
        home.mkdir(parents=True, exist_ok=True)
        s3_rec = records["s3"]
        s3_keys = auth.s3_keys(sd) if s3_rec.get("auth") else None
        env.update(s3_client_env(s3_rec["url"], s3_keys))
        backend = ["--backend-store-uri", conf["backend_store_uri"]]
        users_db = auth.mlflow_users_db(sd)
        if server is not None:  # in its environment: a command line is everyone's to read
            env["MLFLOW_BACKEND_STORE_URI"] = pgstore.db_url(server, "mlflow", "psycopg")
            users_db = env["MLFLOW_BACKEND_STORE_URI"]  # its users beside its runs
            backend = []
        app: list[str] = []
        if access.auth:  # MLflow's basic-auth app: its config file and admin, auth.py
            env.update(auth.mlflow_server_env(sd, users_db))
            app = ["--app-name", "basic-auth"]
        if not access.local:  # MLflow answers only the Host names it allows (403 else)
            env["MLFLOW_SERVER_ALLOWED_HOSTS"] = ",".join(
                f"{h},{h}:*" for h in dict.fromkeys((host, HOST, "localhost"))
            )
        cmd = [
            str(bindir / "mlflow"),
            "server",
            *app,
            "--host",
            host,
            "--port",
            str(port),
            "--workers",
            str(conf["workers"]),
            *backend,
            "--artifacts-destination",
            conf["artifacts_destination"],
            *conf["extra_args"],
        ]
        return cmd, env, home
    if name == "worker":
        # Scheduled runs are child processes of the worker and inherit this environment:
        # the user's own MLflow/S3 settings stay (as for `fedapt run`), the flow adds the
        # services that are up (services.run_environment). Working directory: this checkout.
        env = base_env(keep=("AWS_", "MLFLOW_", "PREFECT_WORKER_"))
        env["PREFECT_HOME"] = str(sd / "prefect")
        env["PREFECT_API_URL"] = records["prefect"]["api_url"]
        if records["prefect"].get("auth"):  # it and its flow runs send Prefect's auth string
            env["PREFECT_API_AUTH_STRING"] = auth.value(sd, "FEDAPT_PREFECT_AUTH_STRING")
        else:
            env.pop("PREFECT_API_AUTH_STRING", None)
        env["PREFECT_WORKER_WEBSERVER_HOST"] = HOST  # its health check: 127.0.0.1 always
        env["PREFECT_WORKER_WEBSERVER_PORT"] = str(port)
        cmd = [
            str(bindir / "prefect"),
            "worker",
            "start",
            "--pool",
            WORK_POOL,
            "--type",
            WORK_POOL_TYPE,  # the pool is created if it does not exist yet
            "--name",
            f"fedapt-worker-{port}",
            "--limit",
            str(worker_limit()),
            "--with-healthcheck",
            "--install-policy",
            "never",
        ]
        return cmd, env, ROOT
    home = sd / "prefect"
    home.mkdir(parents=True, exist_ok=True)
    # The server's own settings (e.g. PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS) are
    # the user's to choose; client settings (PREFECT_API_URL ...) are not passed on.
    env = base_env(keep=("PREFECT_SERVER_",))
    env["PREFECT_HOME"] = str(home)
    env["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    # The UI asks the API at this address (else Prefect's default port, 4200: on any other
    # port, FEDAPT_PREFECT_PORT, the UI showed "Can't connect to Server API")
    env["PREFECT_UI_API_URL"] = f"{base_url(port, host)}/api"
    env.pop("PREFECT_SERVER_API_AUTH_STRING", None)  # fedapt's, with --auth on, or none
    if access.auth:
        env["PREFECT_SERVER_API_AUTH_STRING"] = auth.value(sd, "FEDAPT_PREFECT_AUTH_STRING")
    if server is not None:  # Prefect's API database on PostgreSQL, with its async driver
        for k in [k for k in env if k.startswith("PREFECT_SERVER_DATABASE_")]:
            env.pop(k)
        env["PREFECT_SERVER_DATABASE_CONNECTION_URL"] = pgstore.db_url(server, "prefect", "asyncpg")
    cmd = [str(bindir / "prefect"), "server", "start", "--host", host, "--port", str(port)]
    return cmd, env, home
