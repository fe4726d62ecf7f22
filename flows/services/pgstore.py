"""The store of Prefect's API and MLflow's tracking server: SQLite (the single-user default)
or PostgreSQL, either fedapt's own server (the ``postgres`` service, ``pgserver``) or a server
you run (a ``postgresql://`` URL).

The setting: ``fedapt up --store`` (``up(store=...)``), else ``FEDAPT_STORE``, else the store
of the mlflow/prefect services that are running, else ``sqlite``. Values: ``sqlite``,
``postgres`` or ``postgresql://user:password@host:port/database`` (the database is the one
fedapt connects to; Prefect and MLflow get databases ``prefect`` and ``mlflow`` on that server,
created when missing, with ``pg_trgm`` in ``prefect``: Prefect needs PostgreSQL 14.9+ with it).

Here: the setting, the database URLs, the drivers, the version check and a server's
databases. fedapt's own server (binaries, data folder, initdb, command line): ``pgserver``;
which store each service uses, and the checks before anything starts: ``stores``.

Every check that can fail (the value, the drivers, a URL that does not connect, a server too
old or without pg_trgm; ``pgserver``: the binaries and their version, the data folder) runs
before anything starts and is one line naming the setting; passwords are masked in every
message and record. psycopg is imported only here and only for a PostgreSQL store.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

from fedcore.errors import ConfigError, mask_credentials
from flows.settings import shorten

STORE_VAR = "FEDAPT_STORE"
ALLOWED = (
    "sqlite (the default), postgres (fedapt's own PostgreSQL server) or the postgresql:// "
    "URL of a server you run (user, password, host, port, database)"
)
MIN_VERSION = 140009  # Prefect 3: PostgreSQL 14.9 or later, with pg_trgm
DATABASES = ("prefect", "mlflow")
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
