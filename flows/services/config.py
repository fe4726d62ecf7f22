"""Configuration of the local services: names (``ray`` only when named), ports, dependencies,
the state directory, the MLflow server's settings (``mlflow/server.toml``), the errors and
``ServiceStatus``."""

from __future__ import annotations

import os
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from fedcore.errors import ConfigError, FedaptError
from flows.settings import setting_path, shorten

ROOT = Path(__file__).resolve().parents[2]  # the repository (flows/services/config.py)
HOST = "127.0.0.1"
SERVICES = ("postgres", "s3", "mlflow", "prefect", "worker", "ray")
# What a plain `fedapt up` starts: all but ray (a Ray head holds ~1 GB of memory and takes
# seconds to start, and a run starts its own local Ray unless told to use one), which starts
# only when named: `fedapt up ray`.
DEFAULT_SERVICES = ("s3", "mlflow", "prefect", "worker")
# worker: the port of the Prefect worker's health check (`prefect worker start --with-healthcheck`)
# ray: the port of the Ray head's GCS (its address: 127.0.0.1:<port>, what RAY_ADDRESS takes)
# postgres: only with a PostgreSQL store (`fedapt up --store postgres`, pgserver.py); 5433,
# not PostgreSQL's 5432, which the system server of Debian's postgresql package takes
DEFAULT_PORTS = {
    "postgres": 5433,
    "s3": 8333,
    "mlflow": 5000,
    "prefect": 4200,
    "worker": 4201,
    "ray": 6379,
}
DEFAULT_BUCKET = "fedapt"  # s3://fedapt/mlflow (MLflow artifacts), s3://fedapt/dvc, outputs
# mlflow and prefect also need postgres when their store is fedapt's PostgreSQL server: that
# dependency is the store's (stores.with_store_server and supervisor.down add it), not
# listed here.
DEPENDS = {
    "postgres": (),
    "s3": (),
    "mlflow": ("s3",),
    "prefect": (),
    "worker": ("prefect",),
    "ray": (),
}
HEALTH_PATHS = {
    "s3": "/healthz",
    "mlflow": "/health",
    "prefect": "/api/health",
    "worker": "/health",
}  # ray: no HTTP endpoint (no dashboard); healthy when its GCS port accepts a connection
# postgres: no HTTP either; healthy when pg_isready says it accepts connections
WORK_POOL = "fedapt-process"  # the process work pool of `fedapt deploy` and prefect.yaml
WORK_POOL_TYPE = "process"
STATE_FILE = "services.json"
START_TIMEOUT = 90.0
STOP_TIMEOUT = 15.0

# Local development credentials of the SeaweedFS S3 gateway (loopback only). Not secrets of
# any real account, but still kept out of logs, messages and reprs.
S3_ACCESS_KEY = "fedapt-local"
S3_SECRET_KEY = "fedapt-local-dev-secret"
S3_REGION = "us-east-1"

# Variables that mean "the user configured S3 themselves": then no S3 variable is injected.
USER_S3_VARS = (
    "AWS_ENDPOINT_URL",
    "MLFLOW_S3_ENDPOINT_URL",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_PROFILE",
)
QUIET_ENV = {
    "DO_NOT_TRACK": "true",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
}
# expected in the cmdline (guards against recycled pids)
CMDLINE_MARKERS = {
    "s3": "weed",
    "mlflow": "mlflow",
    "prefect": "prefect",
    "worker": "worker",
    "ray": "ray start --head",
    "postgres": "postgres -D",
}

State = Literal["running", "stopped", "stale"]


class ServiceError(FedaptError):
    """A local service cannot be started, checked or stopped; the message is one line."""


class PortInUseError(ServiceError):
    """The port of a service is taken by another program; the message says how to change it."""


@dataclass(frozen=True)
class ServiceStatus:
    name: str
    state: State  # running: recorded process alive; stale: recorded but dead; stopped: no record
    healthy: bool
    pid: int | None = None
    port: int | None = None
    url: str | None = None
    log: str | None = None
    started_at: str | None = None
    store: str | None = None  # mlflow, prefect: their database's URL, password masked
    auth: bool = False  # it asks for credentials (fedapt up --auth on)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# ----------------------------------------------------------------------------- configuration


_STATE_ALLOWED = f"a folder fedapt may create and write into (unset: {ROOT / '.fedapt'})"


def state_dir(path: str | os.PathLike[str] | None = None) -> Path:
    """The state directory: ``path``, else ``$FEDAPT_STATE_DIR``, else ``<repo>/.fedapt``
    (the variable is recorded for the CLI's error line, ``flows.settings``)."""
    if path:
        return Path(path).resolve()
    given = os.environ.get("FEDAPT_STATE_DIR")
    where = Path(given or ROOT / ".fedapt")
    value = given or f"unset, so {where}"
    # registered before resolving too: a loop of links there is named as this variable's
    setting_path("FEDAPT_STATE_DIR", value, where, _STATE_ALLOWED)
    resolved = where.resolve()
    setting_path("FEDAPT_STATE_DIR", value, resolved, _STATE_ALLOWED)
    return resolved


MLFLOW_CONFIG = ROOT / "mlflow" / "server.toml"
_MLFLOW_KEYS: dict[str, type] = {
    "backend_store_uri": str,
    "artifacts_destination": str,
    "workers": int,
    "extra_args": list,
}
_MLFLOW_OWN_FLAGS = ("--host", "--port", "--backend-store-uri", "--artifacts-destination")


def mlflow_config(sd: Path, path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """The tracking server's settings from ``mlflow/server.toml`` (or ``path``, or
    ``$FEDAPT_MLFLOW_CONFIG``), placeholders filled; a bad file is one ConfigError line."""
    given = None if path else os.environ.get("FEDAPT_MLFLOW_CONFIG")
    where = Path(path or given or MLFLOW_CONFIG)
    allowed = "a TOML file with one [server] table, as mlflow/server.toml (unset: that file)"
    label = str(where)  # each error's start: the file, and the variable that named it
    if given:  # an OS error reading it names the variable (flows.settings)
        setting_path("FEDAPT_MLFLOW_CONFIG", given, where, allowed)
        label = f"FEDAPT_MLFLOW_CONFIG: {shorten(given, 240)}"
    try:
        raw = tomllib.loads(where.read_text())
    except FileNotFoundError:
        if given:
            raise ConfigError(
                f"FEDAPT_MLFLOW_CONFIG: {shorten(given)}: no such file; allowed: {allowed}"
            ) from None
        raise ConfigError(
            f"{where}: the MLflow server configuration is missing "
            "(restore it with: git checkout mlflow/server.toml)"
        ) from None
    except UnicodeDecodeError:
        raise ConfigError(f"{label}: not UTF-8 text (a binary file?)") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{label}: not valid TOML ({exc})") from None
    server = raw.get("server")
    if set(raw) != {"server"} or not isinstance(server, dict):
        raise ConfigError(f"{label}: expected one [server] table (got {', '.join(raw) or 'none'})")
    for key, value in server.items():
        want = _MLFLOW_KEYS.get(key)
        if want is None:
            raise ConfigError(
                f"{label}: unknown key server.{key}; allowed: {', '.join(_MLFLOW_KEYS)}"
            )
        if not isinstance(value, want) or isinstance(value, bool):
            raise ConfigError(f"{label}: server.{key} must be a {want.__name__} (got {value!r})")
    missing = [k for k in ("backend_store_uri", "artifacts_destination") if k not in server]
    if missing:
        raise ConfigError(f"{label}: server.{missing[0]} is required")
    workers = server.get("workers", 1)
    if workers < 1:
        raise ConfigError(f"{label}: server.workers must be >= 1 (got {workers})")
    extra = server.get("extra_args", [])
    if not all(isinstance(a, str) for a in extra):
        raise ConfigError(f"{label}: server.extra_args must be a list of strings")
    own = [a for a in extra if a.split("=")[0] in _MLFLOW_OWN_FLAGS]
    if own:
        raise ConfigError(
            f"{label}: server.extra_args sets {own[0]}, which fedapt sets itself "
            f"({', '.join(_MLFLOW_OWN_FLAGS)})"
        )
    fill = {"home": str(sd / "mlflow"), "bucket": DEFAULT_BUCKET}
    out: dict[str, Any] = {"workers": workers, "extra_args": list(extra)}
    for key in ("backend_store_uri", "artifacts_destination"):
        try:
            out[key] = server[key].format(**fill)
        except (KeyError, IndexError, ValueError) as exc:
            raise ConfigError(
                f"{label}: server.{key} has an unknown placeholder {exc}; "
                f"allowed: {', '.join('{' + k + '}' for k in fill)}"
            ) from None
    return out


def artifact_bucket(destination: str) -> str | None:
    """The bucket of an ``s3://bucket/...`` artifact destination (None: not on S3)."""
    if not destination.startswith("s3://"):
        return None
    return destination[len("s3://") :].split("/", 1)[0] or None


PG_BINDIR_VAR = "FEDAPT_PG_BINDIR"


def pg_bindir() -> Path | None:
    """The folder of PostgreSQL's server programs (initdb, postgres, pg_isready):
    ``$FEDAPT_PG_BINDIR``, else the newest Debian one (/usr/lib/postgresql/<major>/bin);
    None when there is none."""
    given = os.environ.get(PG_BINDIR_VAR)
    if given:
        return Path(given)
    found = [p for p in Path("/usr/lib/postgresql").glob("*/bin") if (p / "postgres").is_file()]
    found.sort(key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else -1)
    return found[-1] if found else None


def port_env_var(name: str) -> str:
    return f"FEDAPT_{name.upper()}_PORT"


def resolve_ports(ports: Mapping[str, int] | None = None) -> dict[str, int]:
    """Port of each service: ``ports`` argument > ``FEDAPT_<NAME>_PORT`` > default (0 = any)."""
    out = {}
    for name in SERVICES:
        if ports and name in ports:
            value: Any = ports[name]
        else:
            value = os.environ.get(port_env_var(name), DEFAULT_PORTS[name])
        try:
            port = int(value)
        except (TypeError, ValueError):
            raise ConfigError(
                f"{port_env_var(name)}={shorten(repr(value))} is not a port number (0-65535)"
            ) from None
        if not 0 <= port <= 65535:
            raise ConfigError(f"{port_env_var(name)}={port} is not a port number (0-65535)")
        out[name] = port
    return out


def service_names(services: Iterable[str] | None, default: Iterable[str] = SERVICES) -> list[str]:
    names = list(default) if services is None else list(services)
    unknown = [n for n in names if n not in SERVICES]
    if unknown:
        raise ConfigError(f"unknown service {unknown[0]!r}; valid: {', '.join(SERVICES)}")
    return names


def with_dependants(names: Iterable[str]) -> list[str]:
    """``names`` plus the services that need one of them (stopping s3 stops mlflow)."""
    wanted = set(names)
    wanted.update(n for n in SERVICES if wanted.intersection(DEPENDS[n]))
    return [n for n in SERVICES if n in wanted]


def with_dependencies(names: Iterable[str]) -> list[str]:
    wanted = set(names)
    for n in list(wanted):
        wanted.update(DEPENDS[n])
    return [n for n in SERVICES if n in wanted]
