"""Local services on 127.0.0.1 for the UI workflows: S3 (SeaweedFS), MLflow server, Prefect server
and a Prefect worker that runs the scheduled deployments (work pool ``fedapt-process``); and,
only when named (``up(["ray"])``), a local Ray head (``rayhead``).

``up`` starts each service as a detached server process (own session and process group,
stdout/stderr appended to ``<state_dir>/logs/<name>.log``), polls its health endpoint until a
deadline and records it in ``<state_dir>/services.json`` (written atomically). ``down`` sends
SIGTERM to the process group, waits, then SIGKILLs. ``status`` reports each service with a quick
health probe. ``env_for_clients`` gives the variables a client needs to use what is up, never
overriding what the user already set. ``embedded_s3`` runs SeaweedFS for the duration of a
``with`` block (``fedapt run`` when no S3 endpoint is configured).

Only the stdlib, boto3, psutil and filelock are used here (no mlflow/prefect imports):
importing this is cheap. The S3 credentials are fixed local-development values known to both
sides (with ``--auth on``: fedapt's own, ``auth``); they are written to a 0600 identities file
for SeaweedFS and never printed or logged.

Modules by job, each importing only those before it and only their public names:

- ``config``: names, ports, dependencies, the state directory, mlflow/server.toml, errors.
- ``state``: ``services.json`` (read, written atomically), ``state_lock`` (serialises
  up/down; a filelock), the records' timestamps.
- ``ports``: free ports, the port check that names the variable to change, health probes
  and URLs.
- ``process``: ``spawn`` (detached, own process group; ``tied=True`` puts it under the
  watchdog, ``watchdog.py``, so it dies with the run, kill -9 included), liveness of a pid and
  of a process group and whether a pid is still ours (psutil), ``terminate``, and
  ``flock_fd``, the package's one raw flock, for the locks a server inherits or shares.
- ``s3``: SeaweedFS (command line, data-folder lock, leftovers), the S3 client, buckets.
- ``auth``: the address the services listen on (``--host``) and their credentials
  (``--auth on``): the settings, the 0600 files in ``<state dir>/auth/``, what servers and
  clients get.
- ``pgstore``: the store of Prefect and MLflow (SQLite, fedapt's own PostgreSQL server, or
  a PostgreSQL URL): the setting, database URLs, drivers, the version check, a server's
  databases.
- ``pgserver``: fedapt's own PostgreSQL server: its binaries, data folder, initdb, password,
  URL and command line.
- ``rayhead``: the Ray head (``ray start --head --block``: command line, readiness, every
  process of it, its stop).
- ``stores``: which store mlflow and prefect use: the checks before anything starts, the
  server's URL, their records' store, whether a running one must restart on another store.
- ``commands``: each service's command line, environment and working folder.
- ``supervisor``: ``up``, ``down``, ``status``, each service's readiness.
- ``embedded``: the servers a run starts for itself (``embedded_s3``, ``temporary_prefect``)
  and ``patched_environ``.
- ``clients``: ``env_for_clients``, ``prefect_environment``, ``run_environment``.
- ``envfile``: the variables that point the ``prefect``/``mlflow`` CLIs at the services
  (``fedapt env``, ``<state_dir>/env``).
- ``locks``: the exclusive lock of an output directory (one run per experiment; a filelock).

This package re-exports their public API (``from flows import services``;
``services.up(...)``); a function is looked up in the module that calls it, so patch it there
(e.g. ``flows.services.supervisor.spawn``).
"""

from __future__ import annotations

from flows.services.auth import s3_keys
from flows.services.clients import (
    env_for_clients,
    prefect_environment,
    prefect_settings,
    run_environment,
    user_configured_s3,
)
from flows.services.commands import worker_limit
from flows.services.config import (
    DEFAULT_BUCKET,
    DEFAULT_PORTS,
    DEFAULT_SERVICES,
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
from flows.services.embedded import EmbeddedS3, embedded_s3, patched_environ, temporary_prefect
from flows.services.envfile import ENV_FILE, env_path, env_script, tool_env, write_env_file
from flows.services.locks import LOCK_NAME, DirectoryLocked, run_lock
from flows.services.ports import free_port, port_free, probe
from flows.services.s3 import s3_client, s3_client_env, weed_binary
from flows.services.state import read_state, write_state
from flows.services.supervisor import down, status, up, work_pool_status

__all__ = [
    "DEFAULT_BUCKET",
    "DEFAULT_PORTS",
    "DEFAULT_SERVICES",
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
    "prefect_settings",
    "probe",
    "read_state",
    "resolve_ports",
    "run_environment",
    "run_lock",
    "s3_client",
    "s3_client_env",
    "s3_keys",
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
