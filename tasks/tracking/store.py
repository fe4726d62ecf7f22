"""Where MLflow runs go, and whether fedapt can use that store: the tracking URI, the
client, the experiment of a name.

``MLFLOW_TRACKING_URI`` when set (e.g. the server of ``fedapt up``), else a local SQLite store
at ``mlruns/mlflow.db`` with artifacts under ``mlruns/artifacts`` (open it with
``mlflow ui --backend-store-uri sqlite:///mlruns/mlflow.db``).

Which stores fedapt can use is checked before any work: one line naming
``MLFLOW_TRACKING_URI`` (or the local store), with every password masked. MLflow 3 refuses its
file store (a bare path or ``file://``); fedapt runs on ``sqlite:///`` (an SQLite file, created
when missing), an http(s) server (``fedapt up``'s, or yours, with user:password in the URI or
``MLFLOW_TRACKING_USERNAME`` / ``_PASSWORD`` / ``_TOKEN``) or a database URL whose SQLAlchemy
driver is installed.
"""

from __future__ import annotations

import os
import urllib.request
from pathlib import Path
from typing import Any

from filelock import FileLock

from fedcore.errors import ConfigError, mask_credentials

ROOT = Path(__file__).resolve().parents[2]

# The stores fedapt runs on (MLflow 3 refuses its file store, ``./mlruns`` or ``file://``).
TRACKING_SCHEMES = ("sqlite", "http", "https", "postgresql", "mysql", "mssql")
_ALLOWED = (
    "allowed: sqlite:///PATH/mlflow.db, http(s)://HOST:PORT (an MLflow server, e.g. fedapt up) "
    "or a database URL (postgresql://, mysql://, mssql://)"
)


def check_store(uri: str, timeout: float = 5.0) -> None:
    """The tracking URI must name a store fedapt can use, checked before work starts: an
    http(s) server answers /health; a ``sqlite:///`` path is (or can become) an SQLite
    database; a database URL has its driver installed; anything else is one line naming
    the allowed forms. Passwords in the URI are masked in every message."""
    shown = mask_credentials(uri)
    where = "MLFLOW_TRACKING_URI" if os.environ.get("MLFLOW_TRACKING_URI") else "local store"
    scheme = uri.split("://", 1)[0].split("+", 1)[0].lower() if "://" in uri else ""
    if uri and not uri.strip():  # spaces: not a path of a file store
        raise ConfigError(f"{where}: {uri!r} is blank; {_ALLOWED} (or unset it)")
    if scheme not in TRACKING_SCHEMES:
        why = (
            "MLflow 3 no longer runs a file store"
            if scheme in ("", "file")
            else f"unsupported scheme {scheme!r}"
        )
        raise ConfigError(f"{where}: {shown}: {why}; {_ALLOWED}")
    if scheme == "sqlite":
        _check_sqlite_store(uri)
        return
    if scheme in ("postgresql", "mysql", "mssql"):
        _check_database_driver(uri, where, shown)
        return
    try:
        with urllib.request.urlopen(_health_request(uri), timeout=timeout) as resp:
            healthy = resp.status == 200
    except (OSError, ValueError):  # ValueError: a URL urllib cannot parse (no host, bad port)
        healthy = False
    if not healthy:
        raise ConfigError(
            f"MLflow tracking server {shown} is not reachable; start it with `fedapt up` or "
            "unset MLFLOW_TRACKING_URI to use the local store mlruns/"
        )
    _check_access(uri, shown)


def _health_request(uri: str) -> urllib.request.Request:
    """GET <uri>/health; user:password in the URI (which urllib does not take) become a
    basic-auth header, as MLflow's own client sends them."""
    import base64
    from urllib.parse import unquote, urlsplit, urlunsplit

    parts = urlsplit(uri)
    netloc = parts.netloc.rsplit("@", 1)[-1]
    url = urlunsplit(parts._replace(netloc=netloc)).rstrip("/") + "/health"
    headers = {}
    if parts.username is not None:
        token = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
        headers["Authorization"] = "Basic " + base64.b64encode(token).decode()
    return urllib.request.Request(url, headers=headers)


def _check_access(uri: str, shown: str) -> None:
    """The server answers its API, not only /health: refused credentials (a server with
    authentication) are one line now, not a traceback once training has started."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    try:
        MlflowClient(uri).search_experiments(max_results=1)
    except MlflowException as exc:
        first = str(exc.message).strip().splitlines()[0][:200] if exc.message else ""
        raise ConfigError(
            f"MLflow tracking server {shown} refused the request ({exc.error_code}: {first}); "
            "check the credentials (user:password in MLFLOW_TRACKING_URI, "
            "MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD or MLFLOW_TRACKING_TOKEN)"
        ) from None


def _check_database_driver(uri: str, where: str, shown: str) -> None:
    """A database URL needs its SQLAlchemy dialect and DB-API driver (psycopg2 for
    postgresql://, pymysql for mysql+pymysql://, ...) importable in this environment."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        url = make_url(uri)
        url.get_dialect().import_dbapi()
    except (ArgumentError, NoSuchModuleError, ValueError) as exc:
        raise ConfigError(
            f"{where}: {shown}: not a database URL SQLAlchemy knows ({exc})"
        ) from None
    except ImportError as exc:
        raise ConfigError(
            f"{where}: {shown}: its database driver {exc.name or 'module'!s} is not installed; "
            f"install it (e.g. pip install {_DRIVERS.get(exc.name or '', exc.name)}) or use "
            f"another store; {_ALLOWED}"
        ) from None


_DRIVERS = {"psycopg2": "psycopg2-binary", "MySQLdb": "mysqlclient"}


def _check_sqlite_store(uri: str) -> None:
    """A ``sqlite:///PATH`` store must be an SQLite database file (or not exist yet) in a
    folder that exists or can be made and written: one line naming where the URI came from
    and the path."""
    from tasks.io import check_writable

    where = "MLFLOW_TRACKING_URI" if os.environ.get("MLFLOW_TRACKING_URI") else "local store"
    shown = mask_credentials(uri)
    if not uri.startswith("sqlite:///") or uri == "sqlite:///":
        raise ConfigError(f"{where}: {shown}: give a database file, sqlite:///PATH/mlflow.db")
    db = Path(uri.removeprefix("sqlite:///").split("?", 1)[0])
    if db.is_dir():
        raise ConfigError(
            f"{where}: {uri}: {db} is a folder; give the path of a database file, e.g. "
            f"sqlite:///{db / 'mlflow.db'}"
        )
    if db.is_file() and db.stat().st_size > 0:
        try:
            with db.open("rb") as fh:
                header = fh.read(16)
        except OSError as exc:
            raise ConfigError(f"{where}: {uri}: cannot read {db} ({exc.strerror})") from None
        if header != b"SQLite format 3\x00":
            raise ConfigError(
                f"{where}: {uri}: {db} is not an SQLite database; give a database file "
                "(a new path is created)"
            )
    try:
        check_writable(where, db.parent)
    except ConfigError as exc:
        raise ConfigError(f"{exc} (in {uri})") from None
    _probe_folder(where, uri, db.parent)


def _probe_folder(where: str, uri: str, folder: Path) -> None:
    """Make and remove a folder where the store's would go (its nearest existing parent): a
    place that looks writable but is not (/proc, a read-only mount) is one line naming
    ``where``, not an OS error about a path later."""
    import tempfile

    existing = next((p for p in (folder, *folder.parents) if p.exists()), None)
    if existing is None:
        return
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".fedapt-probe-", dir=existing))
    except OSError as exc:
        raise ConfigError(
            f"{where}: {mask_credentials(uri)}: cannot create {folder} under {existing} "
            f"({exc.strerror}); choose a folder you can write"
        ) from None


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{ROOT / 'mlruns' / 'mlflow.db'}"


def check_tracking_server(uri: str | None = None, timeout: float = 5.0) -> None:
    """The tracking URI in use (or ``uri``) names a store fedapt can use (:func:`check_store`)."""
    check_store(uri or tracking_uri(), timeout)


_ready_stores: set[str] = set()


def client() -> Any:
    """The ``MlflowClient`` of the tracking URI in use (a new local store opened first)."""
    import mlflow
    from mlflow import MlflowClient

    uri = tracking_uri()
    mlflow.set_tracking_uri(uri)
    # MLflow prints "View run ... at: <url>" (the GenAI view, once per run it ends) itself;
    # fedapt prints one link, the training view's Runs table (views.runs_table_url)
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    if uri.startswith("sqlite:///") and uri not in _ready_stores:
        return _init_sqlite_store(uri)
    return MlflowClient(uri)


def _init_sqlite_store(uri: str) -> Any:
    """Open (create, migrate) a local SQLite store one process at a time: two runs starting
    together on a new store would both create its tables ("table runs already exists")."""
    from mlflow import MlflowClient

    db = Path(uri.removeprefix("sqlite:///").split("?", 1)[0])
    db.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(db.with_name(f".{db.name}.fedapt-init.lock")):
        client = MlflowClient(uri)
        client.search_experiments(max_results=1)  # opens the store: tables, migrations
    _ready_stores.add(uri)
    return client


# The experiment's kind (the UI's ``ExperimentKind.CUSTOM_MODEL_DEVELOPMENT``: model
# training). MLflow 3.17's UI keeps its view in the browser (GenAI by default) whatever this
# tag says: fedapt's links ask for the training view themselves (views.py).
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"


def experiment_id(client: Any, name: str) -> str:
    """The id of experiment ``name`` (created, its artifacts beside a local store, when new)."""
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        if EXPERIMENT_KIND_TAG not in exp.tags:  # made before the tag: a kind the user chose stays
            client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
        return exp.experiment_id
    location = None
    uri = tracking_uri()
    if uri.startswith("sqlite:///"):  # artifacts beside the database file
        location = (Path(uri.removeprefix("sqlite:///")).parent / "artifacts").as_uri()
    return client.create_experiment(
        name, artifact_location=location, tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND}
    )
