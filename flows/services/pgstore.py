"""The store of Prefect's API and MLflow's tracking server: SQLite (the single-user default)
or PostgreSQL, either fedapt's own server (the ``postgres`` service) or a server you run (a
``postgresql://`` URL).

The setting: ``fedapt up --store`` (``up(store=...)``), else ``FEDAPT_STORE``, else the store
of the mlflow/prefect services that are running, else ``sqlite``. Values: ``sqlite``,
``postgres`` or ``postgresql://user:password@host:port/database`` (the database is the one
fedapt connects to; Prefect and MLflow get databases ``prefect`` and ``mlflow`` on that server,
created when missing, with ``pg_trgm`` in ``prefect``: Prefect needs PostgreSQL 14.9+ with it).

fedapt's own server: Debian's binaries (``config.pg_bindir``), its data folder
``<state dir>/postgres/data`` (``initdb`` once, role ``fedapt`` with a generated password kept
in ``<state dir>/postgres/password``, mode 0600, never printed), 127.0.0.1 only, no Unix
socket. PostgreSQL refuses to run as root: when fedapt runs as root the server runs as the
system user ``postgres`` (Debian's package creates it), which owns the data folder.

Every check that can fail (the value, the drivers, the binaries and their version, a URL that
does not connect, a server too old or without pg_trgm) runs before anything starts and is one
line naming the setting; passwords are masked in every message and record. psycopg is
imported only here and only for a PostgreSQL store.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import pwd
import re
import secrets
import shutil
import stat
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote, urlsplit, urlunsplit

from fedcore.errors import ConfigError, mask_credentials
from flows.services.config import HOST, PG_BINDIR_VAR, ServiceError, pg_bindir
from flows.services.process import last_log_line
from flows.settings import shorten

STORE_VAR = "FEDAPT_STORE"
ALLOWED = (
    "sqlite (the default), postgres (fedapt's own PostgreSQL server) or the postgresql:// "
    "URL of a server you run (user, password, host, port, database)"
)
MIN_VERSION = 140009  # Prefect 3: PostgreSQL 14.9 or later, with pg_trgm
DATABASES = ("prefect", "mlflow")
PG_USER = "fedapt"  # the role of fedapt's own server (its superuser)
SYSTEM_USER = "postgres"  # who runs fedapt's server when fedapt runs as root
DRIVERS = ("psycopg", "asyncpg")  # MLflow's (postgresql+psycopg), Prefect's (+asyncpg)
STORE_USERS = ("mlflow", "prefect")  # the services with a database

Kind = Literal["sqlite", "postgres", "url"]


@dataclass(frozen=True)
class Store:
    kind: Kind
    setting: str = STORE_VAR  # where it came from: --store, FEDAPT_STORE
    url: str | None = field(default=None, repr=False)  # "url": the user's (has the password)
    shown: str | None = None  # "url": the URL, password masked

    def __repr__(self) -> str:  # keep the password out of reprs
        return f"Store(kind={self.kind!r}, setting={self.setting!r}, shown={self.shown!r})"


def parse_store(value: str, setting: str) -> Store:
    """``value`` of ``setting`` (``--store`` or ``FEDAPT_STORE``) as a store; one line naming
    the setting and what it allows otherwise."""
    text = value.strip()
    if text == "sqlite":
        return Store("sqlite", setting)
    if text in ("postgres", "postgresql"):
        return Store("postgres", setting)
    if text.startswith(("postgresql://", "postgres://")):
        try:
            parts = urlsplit(text)
            port = parts.port
        except ValueError:
            port, parts = -1, None
        if parts is not None and parts.hostname and port != -1:
            return Store("url", setting, url=text, shown=mask_credentials(text))
    raise ConfigError(
        f"{setting}: {shorten(mask_credentials(text))!r} is not a store; allowed: {ALLOWED}"
    )


def resolve_store(given: str | None, running: Mapping[str, Mapping[str, Any]]) -> Store:
    """The store: ``given`` (``--store``), else ``$FEDAPT_STORE``, else that of the running
    mlflow/prefect services (``running``: their live records), else SQLite."""
    if given is not None:
        return parse_store(given, "--store")
    value = os.environ.get(STORE_VAR)
    if value:
        return parse_store(value, STORE_VAR)
    for n in STORE_USERS:
        rec = running.get(n) or {}
        kind = rec.get("store_kind")
        if kind == "postgres":
            return Store("postgres", STORE_VAR)
        if kind == "url":  # its password is in no record: given again when a service starts
            return Store("url", STORE_VAR, shown=rec.get("store_server"))
    return Store("sqlite", STORE_VAR)


def db_url(server: str, database: str, driver: str | None = None) -> str:
    """``server`` (a postgresql:// URL) pointed at ``database``, with SQLAlchemy's ``driver``
    (``postgresql+psycopg://``, ``postgresql+asyncpg://``) when given."""
    parts = urlsplit(server)
    scheme = "postgresql" + (f"+{driver}" if driver else "")
    return urlunsplit((scheme, parts.netloc, "/" + database, parts.query, ""))


def version_text(num: int) -> str:
    """A server_version_num as PostgreSQL writes it (150018 -> 15.18)."""
    return f"{num // 10000}.{num % 10000}"


def require_version(num: int, has_trgm: bool, where: str, setting: str) -> None:
    """Prefect's needs: PostgreSQL 14.9 or later, with the pg_trgm extension available."""
    need = f"Prefect needs PostgreSQL {version_text(MIN_VERSION)} or later with pg_trgm"
    if num < MIN_VERSION:
        raise ConfigError(
            f"{setting}: {where} is PostgreSQL {version_text(num)}; {need}; allowed: {ALLOWED}"
        )
    if not has_trgm:
        raise ConfigError(
            f"{setting}: {where} has no pg_trgm extension (Debian: it comes with the "
            f"postgresql package); {need}; allowed: {ALLOWED}"
        )


def check_drivers(setting: str) -> None:
    """psycopg (MLflow's driver) and asyncpg (Prefect's) import."""
    missing = []
    for name in DRIVERS:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise ConfigError(
            f"{setting}: a PostgreSQL store needs the Python packages psycopg and asyncpg; "
            f"not importable: {', '.join(missing)} (install them with: .venv/bin/pip install "
            "-c constraints.txt 'psycopg[binary]' asyncpg) or use --store sqlite"
        )


# ----------------------------------------------------------------------------- a server


def _why(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    text = lines[0] if lines else type(exc).__name__
    return shorten(mask_credentials(text.removeprefix("connection failed: ")), 200)


@contextlib.contextmanager
def _connect(url: str, setting: str, shown: str, dbname: str | None = None) -> Iterator[Any]:
    import psycopg

    extra = {"dbname": dbname} if dbname else {}
    try:
        conn = psycopg.connect(url, connect_timeout=5, autocommit=True, **extra)
    except psycopg.Error as exc:
        raise ConfigError(
            f"{setting}: {shown}: cannot connect ({_why(exc)}); allowed: {ALLOWED}"
        ) from None
    with conn:
        yield conn


def prepare_server(url: str, setting: str, shown: str | None = None) -> None:
    """The server of ``url`` serves a store: it connects, is PostgreSQL 14.9+ with pg_trgm,
    and has the databases of ``DATABASES`` (created when missing) with pg_trgm in Prefect's.
    One line naming ``setting`` (and the URL, password masked) otherwise."""
    import psycopg
    from psycopg import sql

    shown = shown or mask_credentials(url)
    try:
        with _connect(url, setting, shown) as conn:
            num = int(conn.info.server_version)
            trgm = conn.execute(
                "SELECT 1 FROM pg_available_extensions WHERE name = 'pg_trgm'"
            ).fetchone()
            require_version(num, trgm is not None, shown, setting)
            for db in DATABASES:
                if not conn.execute(
                    "SELECT 1 FROM pg_database WHERE datname = %s", (db,)
                ).fetchone():
                    conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(db)))
        with _connect(url, setting, shown, dbname=DATABASES[0]) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
    except psycopg.Error as exc:
        raise ConfigError(
            f"{setting}: {shown}: {_why(exc)}; fedapt needs databases "
            f"{' and '.join(DATABASES)} there (created when missing if the role may) and the "
            f"pg_trgm extension in {DATABASES[0]}; allowed: {ALLOWED}"
        ) from None


# ----------------------------------------------------------------------------- fedapt's own


def home_dir(sd: Path) -> Path:
    return sd / "postgres"


def data_dir(sd: Path) -> Path:
    return home_dir(sd) / "data"


def password_path(sd: Path) -> Path:
    return home_dir(sd) / "password"


def own_server_url(sd: Path, port: int) -> str:
    """The URL of fedapt's own server (role ``fedapt``, database ``postgres``): it holds the
    password; print or record only ``mask_credentials`` of it."""
    try:
        password = password_path(sd).read_text().strip()
    except FileNotFoundError:
        raise ServiceError(
            f"postgres: {password_path(sd)} is missing, so the password of {data_dir(sd)} is "
            f"lost; move {home_dir(sd)} away to start a new server (its databases go with it)"
        ) from None
    return f"postgresql://{PG_USER}:{quote(password, safe='')}@{HOST}:{port}/postgres"


def run_as() -> tuple[int, int] | None:
    """Who runs fedapt's server: None (this user), or (uid, gid) of the system user
    ``postgres`` when this process is root (PostgreSQL refuses root)."""
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        raise ConfigError(
            f"{STORE_VAR}: postgres: PostgreSQL refuses to run as root and there is no system "
            f"user {SYSTEM_USER} to run it as (Debian's postgresql package creates it); run "
            "fedapt as a normal user, or use --store sqlite"
        ) from None
    return entry.pw_uid, entry.pw_gid


def check_reachable(path: Path, user: tuple[int, int]) -> None:
    """The system user ``user`` may enter every existing folder above ``path`` (else its
    server cannot open its data folder)."""
    uid, gid = user
    for folder in [p for p in path.parents if p.exists()]:
        st = folder.stat()
        bits = stat.S_IXOTH
        if st.st_uid == uid:
            bits = stat.S_IXUSR
        elif st.st_gid == gid:
            bits = stat.S_IXGRP
        if not st.st_mode & bits:
            raise ConfigError(
                f"FEDAPT_STATE_DIR: fedapt runs as root, so its PostgreSQL server runs as the "
                f"system user {SYSTEM_USER}, which may not enter {folder} (mode "
                f"{stat.S_IMODE(st.st_mode):o}); choose a state folder it can reach, or run "
                "fedapt as a normal user"
            )


def check_binaries(setting: str) -> Path:
    """The folder of initdb, postgres and pg_isready, PostgreSQL 14.9+ with pg_trgm."""
    bindir = pg_bindir()
    missing = [
        p for p in ("initdb", "postgres", "pg_isready") if not bindir or not (bindir / p).is_file()
    ]
    if bindir is None or missing:
        where = f"{bindir}" if bindir else "/usr/lib/postgresql/<major>/bin"
        raise ConfigError(
            f"{setting}: postgres needs PostgreSQL's server programs ({', '.join(missing)}) in "
            f"{where}; install Debian's postgresql package or set {PG_BINDIR_VAR} to their "
            "folder, or use --store sqlite"
        )
    try:
        text = subprocess.run(
            [str(bindir / "postgres"), "--version"],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        text = ""
    found = re.search(r"(\d+)\.(\d+)", text)
    num = int(found[1]) * 10000 + int(found[2]) if found else 0
    share = _sharedir(bindir)
    trgm = share is not None and (share / "extension" / "pg_trgm.control").is_file()
    require_version(num, trgm, f"{bindir / 'postgres'}", setting)
    return bindir


def _sharedir(bindir: Path) -> Path | None:
    try:
        out = subprocess.run(
            [str(bindir / "pg_config"), "--sharedir"],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return Path(out) if out else None


def server_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment of initdb and the server: without the user's PG* client settings."""
    return {k: v for k, v in env.items() if not k.startswith("PG")}


def check_data(sd: Path) -> bool:
    """Whether the data folder is made (and its password kept); one line when it is something
    else, or its password is lost. (Before anything starts: ``supervisor.preflight``.)"""
    data = data_dir(sd)
    if (data / "PG_VERSION").is_file():
        own_server_url(sd, 0)  # its password is there
        return True
    if data.is_dir() and any(data.iterdir()):
        raise ServiceError(
            f"postgres cannot start: {data} is neither empty nor a PostgreSQL data folder (no "
            "PG_VERSION); move it away"
        )
    return False


def initdb(
    sd: Path, bindir: Path, env: Mapping[str, str], log: Path, user: tuple[int, int] | None
) -> None:
    """Create the data folder once: ``initdb`` (role ``fedapt``, a new password, password
    authentication over TCP, UTF-8, C locale), the folder owned by whoever runs the server.
    A data folder that exists is left as it is."""
    data, home = data_dir(sd), home_dir(sd)
    if check_data(sd):
        return
    home.mkdir(parents=True, exist_ok=True)
    data.mkdir(mode=0o700, exist_ok=True)
    if user is not None:
        home.chmod(0o711)  # its user enters it (whatever the umask), and lists nothing
        check_reachable(data, user)  # the folders made just now, too
        os.chown(data, *user)
    password = secrets.token_urlsafe(24)
    tmp = password_path(sd).with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(password + "\n")
    tmp.replace(password_path(sd))
    pwfile = home / ".initdb-password"
    cmd = [
        str(bindir / "initdb"),
        "-D",
        str(data),
        f"--username={PG_USER}",
        f"--pwfile={pwfile}",  # never an argument: a command line is everyone's to read
        "--auth-host=scram-sha-256",
        "--auth-local=peer",
        "--encoding=UTF8",
        "--no-locale",
        "--no-instructions",
    ]
    as_user: dict[str, Any] = {}
    if user is not None:
        as_user = {"user": user[0], "group": user[1], "extra_groups": []}
    log.parent.mkdir(parents=True, exist_ok=True)
    with _pwfile(pwfile, password, user), open(log, "ab") as fh:
        fh.write(f"\n=== fedapt: initdb {data}\n".encode())
        fh.flush()
        try:
            done = subprocess.run(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=fh,
                stderr=subprocess.STDOUT,
                env=server_env(env),
                cwd=home,
                timeout=300,
                check=False,
                **as_user,
            )
            code: int | str = done.returncode
        except (OSError, subprocess.SubprocessError) as exc:
            code = type(exc).__name__
    if code != 0:
        shutil.rmtree(data, ignore_errors=True)
        last = last_log_line(log)
        tail = f" (last log line: {last})" if last else ""
        raise ServiceError(f"postgres: initdb of {data} failed ({code}); see {log}{tail}")


@contextlib.contextmanager
def _pwfile(path: Path, password: str, user: tuple[int, int] | None) -> Iterator[None]:
    """The password in a file only initdb's user may read (mode 0600), for initdb's
    --pwfile, removed afterwards. (A pipe on its standard input is not one: a pipe made by
    root is root's, and initdb opens /dev/stdin anew.)"""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(password + "\n")
        if user is not None:
            os.chown(path, *user)
        yield
    finally:
        path.unlink(missing_ok=True)


def server_cmd(sd: Path, bindir: Path, port: int) -> list[str]:
    """The server on 127.0.0.1:``port`` only, no Unix socket (Debian's default folder,
    /var/run/postgresql, is the system server's), logging to its standard error (the log)."""
    return [
        str(bindir / "postgres"),
        "-D",
        str(data_dir(sd)),
        "-p",
        str(port),
        "-c",
        f"listen_addresses={HOST}",
        "-c",
        "unix_socket_directories=",
        "-c",
        "logging_collector=off",
    ]
