"""Which store each service uses (``pgstore``): the services a store brings along (fedapt's
PostgreSQL server), the checks of a store before anything starts, the server's URL for
mlflow/prefect, what their records say about it, whether a running one still uses the store
chosen (else ``supervisor.up`` restarts it), and the databases of fedapt's own server once it
answers. Passwords: in the URLs handed to the servers' environment only, masked in every
record and message."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedcore.errors import ConfigError, mask_credentials
from flows.services import pgserver, pgstore
from flows.services.config import SERVICES, mlflow_config
from flows.services.pgstore import Store


def with_store_server(store: Store, names: list[str]) -> list[str]:
    """``names`` and, when ``store`` is fedapt's own PostgreSQL server and mlflow or prefect
    is among them, the ``postgres`` service (in start order)."""
    if store.kind == "postgres" and set(names) & set(pgstore.STORE_USERS):
        return [n for n in SERVICES if n in {*names, "postgres"}]
    return names


def store_server(store: Store, sd: Path, records: Mapping[str, Any]) -> str | None:
    """The URL of the PostgreSQL server of ``store`` (it holds the password: never print or
    record it unmasked); None for SQLite."""
    if store.kind == "postgres":
        return pgserver.own_server_url(sd, int(records["postgres"]["port"]))
    if store.kind == "url":
        if store.url is None:  # resolve_store: a running service's, whose password is not kept
            raise ConfigError(
                f"{pgstore.STORE_VAR}: unset, and the services that are running use "
                f"{store.shown}; give that URL again (--store or {pgstore.STORE_VAR}) or stop "
                "them first (fedapt down)"
            )
        return store.url
    return None


def store_record(
    name: str, store: Store, sd: Path, records: Mapping[str, Any], env: Mapping[str, str]
) -> dict[str, Any]:
    """What the record of mlflow or prefect says about its store (passwords masked):
    ``store_kind``, ``store_server`` (the PostgreSQL server, or sqlite) and ``store`` (its
    database)."""
    server = store_server(store, sd, records)
    if server is not None:
        db = pgstore.db_url(server, name, "psycopg" if name == "mlflow" else "asyncpg")
        shown = {"store_server": mask_credentials(server), "store": mask_credentials(db)}
        return {"store_kind": store.kind, **shown}
    if name == "mlflow":
        db = mlflow_config(sd)["backend_store_uri"]
    else:  # the user's own Prefect database setting stays; else PREFECT_HOME/prefect.db
        db = env.get("PREFECT_SERVER_DATABASE_CONNECTION_URL") or (
            f"sqlite:///{sd / 'prefect' / 'prefect.db'}"
        )
    return {"store_kind": "sqlite", "store_server": "sqlite", "store": mask_credentials(db)}


def same_store(rec: Mapping[str, Any], store: Store, sd: Path, records: Mapping[str, Any]) -> bool:
    """The running mlflow/prefect of ``rec`` uses the server of ``store``."""
    if rec.get("store_kind", "sqlite") != store.kind:
        return False
    if store.kind == "sqlite":
        return True
    if store.kind == "postgres" and "postgres" not in records:
        return False
    if store.kind == "url" and store.url is None:
        return True  # the running one's (resolve_store)
    return bool(rec.get("store_server") == mask_credentials(str(store_server(store, sd, records))))


def preflight(store: Store, names: list[str], sd: Path, running: Mapping[str, Any]) -> None:
    """The checks of a PostgreSQL store, before anything starts: the drivers, fedapt's
    server's binaries and user, or the user's server (connects, version, pg_trgm, databases);
    the MLflow store of mlflow/server.toml left at its SQLite default."""
    users = [n for n in pgstore.STORE_USERS if n in names] if store.kind != "sqlite" else []
    if not (users or "postgres" in names):
        return
    # `fedapt up postgres` on its own (the store SQLite): the service is the setting
    setting = store.setting if users or store.kind == "postgres" else "postgres"
    pgstore.check_drivers(setting)
    if "postgres" in names and "postgres" not in running:
        pgserver.check_binaries(setting)
        pgserver.check_data(sd)
        user = pgserver.run_as()
        if user is not None:
            pgserver.check_reachable(pgserver.data_dir(sd), user)
    if "mlflow" in users:
        own = mlflow_config(sd)["backend_store_uri"]
        if not own.startswith("sqlite:"):
            raise ConfigError(
                f"{store.setting}: {store.kind} would move MLflow's store, which "
                f"mlflow/server.toml sets to {mask_credentials(own)} (server.backend_store_uri); "
                "leave that at its SQLite default or use --store sqlite"
            )
    if store.kind == "url" and store.url is not None:
        pgstore.prepare_server(store.url, store.setting, store.shown)
    elif store.kind == "url" and [n for n in users if n not in running]:
        store_server(store, sd, running)  # one line: the URL is needed again


def prepare_own_server(store: Store, sd: Path, port: int) -> None:
    """fedapt's server on ``port``, once it answers: Prefect's and MLflow's databases, pg_trgm
    (``pgstore.prepare_server``)."""
    url = pgserver.own_server_url(sd, port)
    setting = store.setting if store.kind == "postgres" else "postgres"
    pgstore.prepare_server(url, setting)
