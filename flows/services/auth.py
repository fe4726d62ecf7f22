"""The address the services listen on and their authentication (``fedapt up --host``,
``--auth``).

The default address is 127.0.0.1, where only this machine's users reach the services. Any
other address (``--host``, else ``FEDAPT_HOST``, else that of the services running) needs
``--auth on`` (else ``FEDAPT_AUTH``, else that of the services running): every service then
asks for credentials, each by its own project's mechanism:

- MLflow: its basic-auth app (``mlflow server --app-name basic-auth``), admin user fedapt's,
  users database beside its store (SQLite ``<state>/auth/mlflow-users.db``, or the ``mlflow``
  database of a PostgreSQL store); clients send ``MLFLOW_TRACKING_USERNAME``/``_PASSWORD``.
- Prefect: the server's auth string (``PREFECT_SERVER_API_AUTH_STRING``); clients, the worker
  and its flow runs send ``PREFECT_API_AUTH_STRING``.
- S3: SeaweedFS's identities file (``-s3.config``) with fedapt's keys, not the fixed local
  ones; its filer's HTTP API (on the same address: ``weed mini`` has one) takes only what the
  gateway signed (``seaweed_env``). Its master, volume server and gRPC ports stay open
  (docs/operations.md).
- Ray: token authentication, always on for the head (``rayhead.ray_env``).

The worker's health check and fedapt's PostgreSQL server stay on 127.0.0.1 whatever the host:
nobody else needs them.

Credentials: yours from ``FEDAPT_MLFLOW_USERNAME``/``FEDAPT_MLFLOW_PASSWORD``,
``FEDAPT_PREFECT_AUTH_STRING``, ``FEDAPT_S3_ACCESS_KEY``/``FEDAPT_S3_SECRET_KEY`` the first
time, else generated; kept in ``<state>/auth/`` (folder 0700, one file per value, 0600) for
the clients and the next start. A secret is never printed, logged, recorded or put on a
command line: the servers get them in their environment or in 0600 files, and ``fedapt env``
exports them by reading their file (``export X="$(cat <file>)"``).
"""

from __future__ import annotations

import errno
import ipaddress
import os
import secrets
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedcore.errors import ConfigError
from flows.services.config import HOST
from flows.settings import shorten

HOST_VAR = "FEDAPT_HOST"
AUTH_VAR = "FEDAPT_AUTH"
LOCAL_HOSTS = (HOST, "localhost")  # where no authentication is needed
AUTH_VALUES = ("off", "on")
HOST_ALLOWED = f"an IPv4 address of this machine, 0.0.0.0 (all) or localhost (unset: {HOST})"
SERVICES_WITH_AUTH = ("s3", "mlflow", "prefect", "worker", "ray")  # postgres: 127.0.0.1 only
LOOPBACK_ONLY = ("postgres", "worker")  # never on another address (see the module's text)

# The variables of your own credentials, by service; read once, at the first `--auth on`.
USER_VARS = {
    "mlflow": ("FEDAPT_MLFLOW_USERNAME", "FEDAPT_MLFLOW_PASSWORD"),
    "prefect": ("FEDAPT_PREFECT_AUTH_STRING",),
    "s3": ("FEDAPT_S3_ACCESS_KEY", "FEDAPT_S3_SECRET_KEY"),
}
# The file of each value in <state>/auth/, by the user variable that gives it.
FILES = {
    "FEDAPT_MLFLOW_USERNAME": "mlflow-username",
    "FEDAPT_MLFLOW_PASSWORD": "mlflow-password",
    "FEDAPT_PREFECT_AUTH_STRING": "prefect-auth-string",
    "FEDAPT_S3_ACCESS_KEY": "s3-access-key",
    "FEDAPT_S3_SECRET_KEY": "s3-secret-key",
}
MLFLOW_USERS_DB = "mlflow-users.db"
MLFLOW_INI = "mlflow-auth.ini"
S3_IDENTITIES = "s3-identities.json"


# ----------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class Access:
    """Where the services listen and whether they ask for credentials."""

    host: str = HOST
    auth: bool = False
    host_setting: str = HOST_VAR  # --host, FEDAPT_HOST (for the error lines)
    auth_setting: str = AUTH_VAR

    @property
    def local(self) -> bool:
        return self.host in LOCAL_HOSTS


LOCAL = Access()  # the default: 127.0.0.1, no authentication


def parse_host(value: str, setting: str) -> str:
    """``value`` of ``--host``/``FEDAPT_HOST``: an IPv4 address or localhost; one line else."""
    text = value.strip()
    if text == "localhost":
        return text
    try:
        address = str(ipaddress.IPv4Address(text))
    except ValueError:
        raise ConfigError(
            f"{setting}: {shorten(text)!r} is not an address to listen on; allowed: {HOST_ALLOWED}"
        ) from None
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((address, 0))  # (not "port in use" later, for an address not ours)
        except OSError as exc:
            if exc.errno == errno.EADDRNOTAVAIL:
                raise ConfigError(
                    f"{setting}: {address} is not an address of this machine, so nothing can "
                    f"listen on it; allowed: {HOST_ALLOWED}"
                ) from None
    return address


def parse_auth(value: str, setting: str) -> bool:
    text = value.strip().lower()
    if text not in AUTH_VALUES:
        raise ConfigError(
            f"{setting}: {shorten(value)!r} is not a value; allowed: on (credentials for every "
            f"service) or off (the default, only on {HOST})"
        )
    return text == "on"


def resolve_access(
    host: str | None,
    auth: str | None,
    running: Mapping[str, Mapping[str, Any]],
    environ: Mapping[str, str] | None = None,
) -> Access:
    """The address and authentication of the services to start: the options, else
    ``FEDAPT_HOST``/``FEDAPT_AUTH``, else those of the running services (``running``: their
    live records), else 127.0.0.1 without authentication. Another address than 127.0.0.1
    (or localhost) without authentication is one line naming the setting."""
    env = os.environ if environ is None else environ
    recs = [r for n, r in running.items() if n in SERVICES_WITH_AUTH and n != "worker"]
    if host is not None:
        chosen_host, host_setting = parse_host(host, "--host"), "--host"
    elif env.get(HOST_VAR):
        chosen_host, host_setting = parse_host(env[HOST_VAR], HOST_VAR), HOST_VAR
    else:
        chosen_host = next((str(r["host"]) for r in recs if r.get("host")), HOST)
        host_setting = HOST_VAR
    if auth is not None:
        chosen_auth, auth_setting = parse_auth(auth, "--auth"), "--auth"
    elif env.get(AUTH_VAR):
        chosen_auth, auth_setting = parse_auth(env[AUTH_VAR], AUTH_VAR), AUTH_VAR
    else:
        chosen_auth = any(r.get("auth") for r in recs)
        auth_setting = AUTH_VAR
    access = Access(chosen_host, chosen_auth, host_setting, auth_setting)
    if not access.local and not access.auth:
        raise ConfigError(
            f"{host_setting}: {chosen_host} is another address than {HOST}, where anyone who "
            f"reaches it could use the services; add --auth on ({AUTH_VAR}=on): every service "
            f"then asks for credentials, generated into <state dir>/auth/ (mode 0600) or yours "
            f"from {', '.join(v for vs in USER_VARS.values() for v in vs)}"
        )
    return access


def bind_host(name: str, access: Access) -> str:
    """The address service ``name`` listens on (the worker's health check and PostgreSQL:
    127.0.0.1 always)."""
    return HOST if name in LOOPBACK_ONLY else access.host


def check_packages(access: Access, names: Iterable[str]) -> None:
    """MLflow's basic-auth app needs Flask-WTF (``mlflow[auth]``): one line before anything
    starts when it is not importable."""
    import importlib.util

    if access.auth and "mlflow" in names and importlib.util.find_spec("flask_wtf") is None:
        raise ConfigError(
            f"{access.auth_setting}: on: MLflow's basic-auth app needs the package Flask-WTF, "
            "which is not importable (install it with: .venv/bin/pip install -c "
            "constraints.txt 'mlflow[auth]') or use --auth off on 127.0.0.1"
        )


# ----------------------------------------------------------------------------- credentials


def auth_dir(sd: Path) -> Path:
    return sd / "auth"


def _read(sd: Path, name: str) -> str | None:
    try:
        return (auth_dir(sd) / name).read_text().strip() or None
    except FileNotFoundError:
        return None


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path``, mode 0600 from its creation (atomically)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.parent.chmod(0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    tmp.replace(path)


def _generated(var: str) -> str:
    if var == "FEDAPT_MLFLOW_USERNAME":
        return "fedapt"
    if var == "FEDAPT_S3_ACCESS_KEY":
        return "fedapt-" + secrets.token_hex(8)
    if var == "FEDAPT_PREFECT_AUTH_STRING":
        return "fedapt:" + secrets.token_urlsafe(24)
    return secrets.token_urlsafe(24)


def check_credentials(
    sd: Path, names: Iterable[str], environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The credentials of the services ``names`` (by user variable): kept ones, yours, or
    new. Checked before anything starts; nothing is written here (``keep_credentials``).
    One line when a pair of your variables is half given, or one differs from what the
    services were first started with (MLflow keeps its admin user's password)."""
    env = os.environ if environ is None else environ
    out: dict[str, str] = {}
    for name in names:
        pair = USER_VARS.get(name, ())
        given = {v: env.get(v, "") for v in pair}
        if any(given.values()) and not all(given.values()):
            missing = next(v for v, x in given.items() if not x)
            raise ConfigError(
                f"{missing}: unset while {' and '.join(v for v in pair if given[v])} is set; "
                f"give both ({', '.join(pair)}) or neither (fedapt then generates them)"
            )
        for var in pair:
            kept = _read(sd, FILES[var])
            if kept and given[var] and given[var] != kept:
                raise ConfigError(
                    f"{var}: differs from the value the services were first started with, "
                    f"kept in {auth_dir(sd) / FILES[var]}; unset it, or stop the services "
                    f"(fedapt down) and remove {auth_dir(sd)} to start over with new credentials"
                )
            if var == "FEDAPT_PREFECT_AUTH_STRING" and given[var] and ":" not in given[var]:
                raise ConfigError(
                    f"{var}: not of the form user:password (Prefect's auth string, as the "
                    "Prefect UI's login asks for it)"
                )
            out[var] = kept or given[var] or _generated(var)
    return out


def keep_credentials(sd: Path, values: Mapping[str, str]) -> None:
    """Keep ``values`` (``check_credentials``) in ``<state>/auth/``, each file 0600, and the
    MLflow server's own secret (its Flask session key)."""
    for var, value in values.items():
        path = auth_dir(sd) / FILES[var]
        if _read(sd, FILES[var]) != value:
            write_private(path, value + "\n")
    if "FEDAPT_MLFLOW_PASSWORD" in values and _read(sd, "mlflow-flask-key") is None:
        write_private(auth_dir(sd) / "mlflow-flask-key", secrets.token_urlsafe(32) + "\n")


def value(sd: Path, var: str) -> str:
    """A kept credential (by its user variable); one line when its file is gone."""
    found = _read(sd, FILES.get(var, var))
    if found is None:
        raise ConfigError(
            f"{auth_dir(sd) / FILES.get(var, var)} is missing; stop the services (fedapt "
            "down) and start them again to make new credentials"
        )
    return found


def secret_path(sd: Path, var: str) -> Path:
    return auth_dir(sd) / FILES[var]


# ----------------------------------------------------------------------------- servers


def mlflow_server_env(sd: Path, users_db: str) -> dict[str, str]:
    """The MLflow server's variables for its basic-auth app: its config file (written here,
    0600: a PostgreSQL users database's URL holds a password), admin user and password, Flask
    session key."""
    ini = auth_dir(sd) / MLFLOW_INI
    text = (
        "[mlflow]\n"
        "default_permission = READ\n"
        f"database_uri = {users_db.replace('%', '%%')}\n"  # configparser's interpolation
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
    )
    write_private(ini, text)
    return {
        "MLFLOW_AUTH_CONFIG_PATH": str(ini),
        "MLFLOW_AUTH_ADMIN_USERNAME": value(sd, "FEDAPT_MLFLOW_USERNAME"),
        "MLFLOW_AUTH_ADMIN_PASSWORD": value(sd, "FEDAPT_MLFLOW_PASSWORD"),
        "MLFLOW_FLASK_SERVER_SECRET_KEY": value(sd, "mlflow-flask-key"),
    }


def mlflow_users_db(sd: Path) -> str:
    """The users database of a SQLite store (in the auth folder: removing it starts over)."""
    return f"sqlite:///{auth_dir(sd) / MLFLOW_USERS_DB}"


def seaweed_env(sd: Path) -> dict[str, str]:
    """SeaweedFS's JWT keys for its filer (``security.toml``'s ``jwt.filer_signing`` and
    ``jwt.filer_signing.read``, as its ``WEED_*`` variables): then the filer's HTTP API, which
    listens on the same address as the S3 gateway (``weed mini`` has one), answers only what
    the gateway signed."""
    key = _read(sd, "s3-filer-key")
    if key is None:
        key = secrets.token_urlsafe(32)
        write_private(auth_dir(sd) / "s3-filer-key", key + "\n")
    return {"WEED_JWT_FILER_SIGNING_KEY": key, "WEED_JWT_FILER_SIGNING_READ_KEY": key}


def s3_keys(sd: Path) -> tuple[str, str]:
    return value(sd, "FEDAPT_S3_ACCESS_KEY"), value(sd, "FEDAPT_S3_SECRET_KEY")


# ----------------------------------------------------------------------------- clients


def client_env(sd: Path, records: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """What a client of the running services with authentication sends (contains secrets:
    never print the values)."""
    out: dict[str, str] = {}
    if (records.get("mlflow") or {}).get("auth"):
        out["MLFLOW_TRACKING_USERNAME"] = value(sd, "FEDAPT_MLFLOW_USERNAME")
        out["MLFLOW_TRACKING_PASSWORD"] = value(sd, "FEDAPT_MLFLOW_PASSWORD")
    if (records.get("prefect") or {}).get("auth"):
        out["PREFECT_API_AUTH_STRING"] = value(sd, "FEDAPT_PREFECT_AUTH_STRING")
    return out


# Client variables whose value is a secret, and the file `fedapt env` reads it from.
SECRET_VARS = {
    "MLFLOW_TRACKING_PASSWORD": "FEDAPT_MLFLOW_PASSWORD",
    "PREFECT_API_AUTH_STRING": "FEDAPT_PREFECT_AUTH_STRING",
    "AWS_SECRET_ACCESS_KEY": "FEDAPT_S3_SECRET_KEY",
}
