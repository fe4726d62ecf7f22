"""Local services on 127.0.0.1 for the UI workflows: S3 (SeaweedFS), MLflow server, Prefect server
and a Prefect worker that runs the scheduled deployments (work pool ``fedapt-process``).

``up`` starts each service as a detached server process (own session and process group,
stdout/stderr appended to ``<state_dir>/logs/<name>.log``), polls its health endpoint until a
deadline and records it in ``<state_dir>/services.json`` (written atomically). ``down`` sends
SIGTERM to the process group, waits, then SIGKILLs. ``status`` reports each service with a quick
health probe. ``env_for_clients`` gives the variables a client needs to use what is up, never
overriding what the user already set. ``embedded_s3`` runs SeaweedFS for the duration of a
``with`` block (``fedapt run`` when no S3 endpoint is configured).

Only the stdlib and boto3 are used here (no mlflow/prefect imports): importing this is cheap.
The S3 credentials are fixed local-development values known to both sides; they are written to
a 0600 identities file for SeaweedFS and never printed or logged.

Modules, each importing only those before it: ``config`` (names, ports, state directory,
mlflow/server.toml, errors), ``procs`` (state file, lock, processes, ports and probes), ``s3``
(SeaweedFS, S3 client, buckets), ``supervisor`` (commands, up, down, status), ``clients``
(env_for_clients, embedded_s3, temporary_prefect, run_environment), ``envfile`` (the
variables that point the ``prefect``/``mlflow`` CLIs at the services: ``fedapt env`` and
``<state_dir>/env``), ``locks`` (the exclusive
lock of an output directory: one run per experiment). Servers a run starts for itself are
tied to it (``procs._spawn(tied=True)``: a watchdog stops them when the run's process is gone,
kill -9 included). This package re-exports their public API
(``from flows import services``; ``services.up(...)``); a function is looked up in the module
that calls it, so patch it there (e.g. ``flows.services.supervisor._spawn``).
"""

from __future__ import annotations

from flows.services.clients import (
    EmbeddedS3,
    embedded_s3,
    env_for_clients,
    patched_environ,
    prefect_environment,
    run_environment,
    temporary_prefect,
    user_configured_s3,
)
from flows.services.config import (
    DEFAULT_BUCKET,
    DEFAULT_PORTS,
    DEPENDS,
    HEALTH_PATHS,
    HOST,
    MLFLOW_CONFIG,
    ROOT,
    SERVICES,
    START_TIMEOUT,
    STATE_FILE,
    STOP_TIMEOUT,
    USER_S3_VARS,
    WORK_POOL,
    WORK_POOL_TYPE,
    PortInUseError,
    ServiceError,
    ServiceStatus,
    State,
    artifact_bucket,
    mlflow_config,
    port_env_var,
    resolve_ports,
    state_dir,
)
from flows.services.envfile import ENV_FILE, env_path, env_script, tool_env, write_env_file
from flows.services.locks import LOCK_NAME, DirectoryLocked, run_lock
from flows.services.procs import free_port, port_free, probe, read_state, write_state
from flows.services.s3 import s3_client, s3_client_env, weed_binary
from flows.services.supervisor import down, status, up, work_pool_status, worker_limit

__all__ = [
    "DEFAULT_BUCKET",
    "DEFAULT_PORTS",
    "DEPENDS",
    "ENV_FILE",
    "LOCK_NAME",
    "HEALTH_PATHS",
    "HOST",
    "MLFLOW_CONFIG",
    "ROOT",
    "SERVICES",
    "START_TIMEOUT",
    "STATE_FILE",
    "STOP_TIMEOUT",
    "USER_S3_VARS",
    "WORK_POOL",
    "WORK_POOL_TYPE",
    "DirectoryLocked",
    "EmbeddedS3",
    "PortInUseError",
    "ServiceError",
    "ServiceStatus",
    "State",
    "artifact_bucket",
    "down",
    "embedded_s3",
    "env_path",
    "env_script",
    "env_for_clients",
    "free_port",
    "mlflow_config",
    "patched_environ",
    "port_env_var",
    "port_free",
    "prefect_environment",
    "probe",
    "read_state",
    "resolve_ports",
    "run_environment",
    "run_lock",
    "s3_client",
    "s3_client_env",
    "state_dir",
    "status",
    "temporary_prefect",
    "tool_env",
    "up",
    "user_configured_s3",
    "weed_binary",
    "work_pool_status",
    "worker_limit",
    "write_env_file",
    "write_state",
]
