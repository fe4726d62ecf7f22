"""MLflow tracking and model registry: the only module that talks to MLflow.

One parent run per experiment, one child run per grid cell with ``step = round`` metrics,
the final model logged with ``mlflow.pytorch`` and registered; the best version of each
registered model (by final test accuracy) carries the alias ``champion``.

Where runs go: ``MLFLOW_TRACKING_URI`` when set (e.g. the server of ``fedapt up``), else a
local SQLite store at ``mlruns/mlflow.db`` with artifacts under ``mlruns/artifacts``
(open it with ``mlflow ui --backend-store-uri sqlite:///mlruns/mlflow.db``).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fedcore import numerics
from fedcore.events import Callback, RoundRecord
from fedcore.payload import mib
from tasks.io import pid_alive

ROOT = Path(__file__).resolve().parents[1]
CHAMPION = "champion"
CHALLENGER = "challenger"  # the newest registered version, whether or not it beat the champion
log = logging.getLogger("fedapt.tracking")

# Runs this process started and has not ended: ended KILLED/FAILED when the process stops on
# a signal or an error (``end_active_runs``), so the UI never shows them running forever.
_active: set[str] = set()
_ended: set[str] = set()  # ended by end_active_runs: a late end_run does not overwrite it
_active_lock = threading.Lock()


def _owner_tags() -> dict[str, str]:
    """Which process owns a run: a later run finds runs left RUNNING by a dead one."""
    return {"fedapt.pid": str(os.getpid()), "fedapt.host": socket.gethostname()}


def _started(run_id: str) -> str:
    with _active_lock:
        _active.add(run_id)
    return run_id


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{ROOT / 'mlruns' / 'mlflow.db'}"


def check_tracking_server(uri: str | None = None, timeout: float = 5.0) -> None:
    """The tracking URI names a store fedapt can use, checked before work starts
    (``tasks.tracking_store``: the allowed schemes, one line each)."""
    from tasks.tracking_store import check_store

    check_store(uri or tracking_uri(), timeout)


def _client() -> Any:
    import mlflow
    from mlflow import MlflowClient

    uri = tracking_uri()
    mlflow.set_tracking_uri(uri)
    if uri.startswith("sqlite:///") and uri not in _ready_stores:
        return _init_sqlite_store(uri)
    return MlflowClient(uri)


_ready_stores: set[str] = set()


def _init_sqlite_store(uri: str) -> Any:
    """Open (create, migrate) a local SQLite store one process at a time: two runs starting
    together on a new store would both create its tables ("table runs already exists")."""
    import fcntl

    from mlflow import MlflowClient

    db = Path(uri.removeprefix("sqlite:///").split("?", 1)[0])
    db.parent.mkdir(parents=True, exist_ok=True)
    with open(db.with_name(f".{db.name}.fedapt-init.lock"), "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        client = MlflowClient(uri)
        client.search_experiments(max_results=1)  # opens the store: tables, migrations
    _ready_stores.add(uri)
    return client


client = _client  # the MlflowClient of the tracking URI in use (tasks.artifacts)


# MLflow 3's UI opens an experiment without this tag in its GenAI (traces) view; this value
# (the UI's ``ExperimentKind.CUSTOM_MODEL_DEVELOPMENT``) opens the classic training view.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"


def _experiment_id(client: Any, name: str) -> str:
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


def provenance_tags() -> dict[str, str]:
    """git commit and DVC lock hash of the code and pipeline that produced a run."""
    tags = {}
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10
        )
        if out.returncode == 0:
            tags["git_commit"] = out.stdout.strip()
    except OSError:
        pass
    lock = ROOT / "dvc.lock"
    if lock.is_file():
        tags["dvc_lock_sha256"] = hashlib.sha256(lock.read_bytes()).hexdigest()
    # Where the numbers came from (a native run differs between CPUs): fedcore/numerics.py.
    for key, value in numerics.provenance().items():
        tags[f"fedapt.{key}"] = str(value)
    return tags


def parent_run_name(experiment: str, deployment: str | None = None, now: Any = None) -> str:
    """``<experiment> [<deployment>] <UTC YYYY-mm-dd HH:MM:SS>``: parent runs told apart."""
    import datetime as dt

    stamp = (now or dt.datetime.now(dt.UTC)).strftime("%Y-%m-%d %H:%M:%S")
    return " ".join(p for p in (experiment, deployment, stamp) if p)


def _deployment_name() -> str | None:
    """The Prefect deployment running this flow (None outside a deployment or Prefect)."""
    try:
        from prefect.runtime import deployment

        return deployment.name or None
    except Exception:  # noqa: BLE001 - no Prefect context: not a deployment run
        return None


def start_experiment_run(
    experiment: str,
    flat_params: dict[str, Any],
    *,
    run_name: str | None = None,
    tags: dict[str, str] | None = None,
) -> str:
    """Create the parent run of an experiment; returns its run id. Named
    :func:`parent_run_name` (time, and the Prefect deployment when one runs it) unless
    ``run_name`` is given; ``tags``: e.g. its origin (``tasks.origin``)."""
    client = _client()
    run = client.create_run(
        _experiment_id(client, experiment),
        run_name=run_name or parent_run_name(experiment, _deployment_name()),
        tags={"fedapt.kind": "experiment", **provenance_tags(), **_owner_tags(), **(tags or {})},
    )
    _started(run.info.run_id)
    _log_params(client, run.info.run_id, flat_params)
    return run.info.run_id


def _log_params(client: Any, run_id: str, flat: dict[str, Any]) -> None:
    from mlflow.entities import Param

    params = [Param(k, str(v)[:6000]) for k, v in sorted(flat.items())]
    for i in range(0, len(params), 100):
        client.log_batch(run_id, params=params[i : i + 100])


def start_cell_run(
    experiment: str,
    parent_run_id: str | None,
    name: str,
    flat_params: dict[str, Any],
    tags: dict[str, str],
) -> str:
    """A grid cell's run: a child of the experiment's run under the Prefect flow, or a
    run of its own when a DVC stage trains the cell."""
    client = _client()
    parent = {"mlflow.parentRunId": parent_run_id} if parent_run_id else {}
    run = client.create_run(
        _experiment_id(client, experiment),
        run_name=name,
        tags={**parent, "fedapt.kind": "cell", **provenance_tags(), **_owner_tags(), **tags},
    )
    _started(run.info.run_id)
    _log_params(client, run.info.run_id, flat_params)
    return run.info.run_id


def end_run(run_id: str, status: str = "FINISHED") -> None:
    with _active_lock:
        if run_id in _ended:  # already ended KILLED/FAILED by end_active_runs
            return
    _client().set_terminated(run_id, status=status)
    with _active_lock:
        _active.discard(run_id)


def end_active_runs(status: str) -> list[str]:
    """End every run this process started and did not end (``KILLED`` on a signal,
    ``FAILED`` on an error); best effort, never raises. Returns the run ids ended."""
    with _active_lock:
        runs = sorted(_active)
        _active.clear()
        _ended.update(runs)
    done = []
    for run_id in runs:
        try:
            _client().set_terminated(run_id, status=status)
            done.append(run_id)
        except Exception as exc:  # noqa: BLE001 - the store may be gone; the next run fixes it
            log.warning("could not mark MLflow run %s %s: %s", run_id, status, type(exc).__name__)
    return done


@contextlib.contextmanager
def ended_on_error() -> Iterator[None]:
    """Runs started in the block and still open when it fails are ended: ``KILLED`` on
    Ctrl-C / SIGTERM (a KeyboardInterrupt), ``FAILED`` on any other exception."""
    try:
        yield
    except KeyboardInterrupt:
        end_active_runs("KILLED")
        raise
    except BaseException:
        end_active_runs("FAILED")
        raise


def close_stale_runs(experiment: str) -> list[str]:
    """Mark ``KILLED`` the runs of ``experiment`` left RUNNING by a process that died (kill -9,
    power loss): their owner pid (tag ``fedapt.pid``) is dead on this host; runs from before
    that tag (no owner recorded) count as stale unless a DVC stage made them. Call it holding
    the experiment's lock (no other live ``fedapt run`` of it). Returns the run ids."""
    client = _client()
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return []
    host = socket.gethostname()
    stale = []
    for run in client.search_runs(
        [exp.experiment_id], filter_string="attributes.status = 'RUNNING'", max_results=1000
    ):
        tags = run.data.tags
        if tags.get("fedapt.kind") not in ("experiment", "cell") or run.info.run_id in _active:
            continue
        pid = tags.get("fedapt.pid")
        if pid is None:
            dead = tags.get("fedapt.entry") != "dvc"
        else:
            dead = tags.get("fedapt.host") == host and pid.isdigit() and not pid_alive(int(pid))
        if dead:
            client.set_terminated(run.info.run_id, status="KILLED")
            stale.append(run.info.run_id)
    return stale


class MlflowRounds(Callback):
    """Per-round metrics with step = round: accuracy, losses, bytes and cumulative MiB."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self._client = _client()

    def on_resume(self, history: Any) -> None:
        """The rounds a resumed run restored from its checkpoint: the run's curves are whole."""
        for record in history.rounds:
            self.on_round_end(record)

    def on_round_end(self, record: RoundRecord) -> None:
        from mlflow.entities import Metric

        values = {
            "train_loss": record.train_loss,
            "lr": record.lr,
            "upload_bytes": float(record.upload_bytes),
            "download_bytes": float(record.download_bytes),
            "cum_upload_mib": mib(record.cum_upload_bytes),
            "cum_download_mib": mib(record.cum_download_bytes),
            "rejected_updates": float(record.rejected),
            "round_seconds": record.seconds,
        }
        # Algorithm-specific series (FedNILO's freeze index, FedNova's tau, ...).
        values.update(getattr(record, "extra", None) or {})
        if record.accuracy is not None:
            values["test_accuracy"] = record.accuracy
        if record.test_loss is not None:
            values["test_loss"] = record.test_loss
        metrics = [Metric(k, float(v), 0, record.round) for k, v in values.items() if v == v]
        self._client.log_batch(self.run_id, metrics=metrics)


def log_final_metrics(run_id: str, record: dict[str, Any]) -> None:
    from mlflow.entities import Metric

    # Totals get their own names: "upload_bytes" is the per-round series (step = round).
    names = {
        "final_accuracy": "final_accuracy",
        "mean_accuracy_last_L": "mean_accuracy_last_L",
        "upload_bytes": "total_upload_bytes",
        "download_bytes": "total_download_bytes",
        "wall_seconds": "wall_seconds",
        # The adapter method's sizes and the measured local training time (seed 003 §4.4.1).
        "total_params": "total_params",
        "trainable_params": "trainable_params",
        "payload_bytes": "payload_bytes",
        "model_bytes": "model_bytes",
        "base_download_bytes": "base_download_bytes",
        "local_train_seconds_mean": "local_train_seconds_mean",
        "local_train_seconds_per_round": "local_train_seconds_per_round",
        "diverged_at_round": "diverged_at_round",  # logged only when the run diverged
    }
    metrics = [
        Metric(name, float(record[key]), 0, 0)
        for key, name in names.items()
        if record.get(key) is not None
    ]
    # Personalization (seed 001 Table 4): means, and one point per client (step = client id)
    for scope, result in (record.get("personalization") or {}).items():
        for key in ("mean_accuracy_before", "mean_accuracy_after", "mean_gain"):
            if result.get(key) is not None:
                metrics.append(Metric(f"personal_{scope}_{key}", float(result[key]), 0, 0))
        for c in result["clients"]:
            for key in ("accuracy_before", "accuracy_after", "gain"):
                metrics.append(Metric(f"personal_{scope}_{key}", float(c[key]), 0, c["client"]))
    client = _client()
    for i in range(0, len(metrics), 1000):  # MLflow's log_batch takes 1000 metrics at most
        client.log_batch(run_id, metrics=metrics[i : i + 1000])


def registered_name(dataset: str, model: str, adapter: str) -> str:
    return f"fedapt-{dataset}-{model}-{adapter}".replace("_", "-")


def log_and_register_model(
    run_id: str,
    model: Any,
    example: Any,
    name: str,
    accuracy: float | None,
    tags: dict[str, str] | None = None,
) -> str:
    """Log the (merged) model to the run and register it as a new version of ``name``, tagged
    with its final accuracy and ``tags`` (the evaluation set's hash, the experiment, the git
    commit); it becomes ``challenger``, and ``champion`` if it beats the champion
    (:func:`update_champion`). Returns the version."""
    import mlflow
    import mlflow.pytorch
    import torch

    client = _client()
    with (
        _registry_lock(name),
        _model_code() as code,
        _quiet_pickle_warning(),
        mlflow.start_run(run_id=run_id),
    ):
        # A pickled module, not MLflow 3's default ``pt2`` (a torch.export GraphModule whose
        # .eval() raises): ``load_model`` gives back the nn.Module itself. Its classes come
        # from fedapt's ``fedcore`` and ``models`` packages, logged beside it (``code_paths``:
        # MLflow puts them on sys.path when it loads the model).
        info = mlflow.pytorch.log_model(
            model.eval(),
            name="model",
            input_example=example.numpy(),
            pip_requirements=[f"torch=={torch.__version__.split('+')[0]}"],
            registered_model_name=name,
            serialization_format="pickle",
            code_paths=code,
        )
    version = str(info.registered_model_version)  # MLflow returns an int here
    if accuracy is not None:
        client.set_model_version_tag(name, version, "final_accuracy", f"{accuracy:.6f}")
    for key, value in (tags or {}).items():
        client.set_model_version_tag(name, version, key, value)
    with _registry_lock(name):  # compare-and-move: one run at a time per registered model
        client.set_registered_model_alias(name, CHALLENGER, version)
        update_champion(name, version)
    return version


MODEL_CODE = ("fedcore", "models")  # the packages a registered model's classes come from


@contextlib.contextmanager
def _model_code() -> Iterator[list[str]]:
    """Copies of :data:`MODEL_CODE` without their ``__pycache__`` (the ``code_paths``)."""
    import shutil
    import tempfile

    with tempfile.TemporaryDirectory(prefix="fedapt-model-code-") as tmp:
        paths = []
        for package in MODEL_CODE:
            dst = Path(tmp) / package
            shutil.copytree(ROOT / package, dst, ignore=shutil.ignore_patterns("__pycache__"))
            paths.append(str(dst))
        yield paths


class _PickleWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "Pickle or CloudPickle" not in record.getMessage()


@contextlib.contextmanager
def _quiet_pickle_warning() -> Iterator[None]:
    """MLflow warns on every pickled model; fedapt pickles its own modules on purpose."""
    logger, flt = logging.getLogger("mlflow.pytorch"), _PickleWarning()
    logger.addFilter(flt)
    try:
        yield
    finally:
        logger.removeFilter(flt)


@contextlib.contextmanager
def _registry_lock(name: str) -> Iterator[None]:
    """Serialise registrations of ``name`` on this machine: runs of different experiments
    register the same model (``fedapt-<dataset>-<model>-<adapter>``) at the same time, and
    the champion alias is read, compared and moved."""
    import fcntl
    import tempfile

    key = hashlib.sha256(f"{tracking_uri()}|{name}".encode()).hexdigest()[:16]
    with open(Path(tempfile.gettempdir()) / f"fedapt-registry-{key}.lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # blocks: a registration takes seconds
        yield


EVAL_SET_TAG = "eval_set_sha256"


def update_champion(name: str, candidate: str) -> str | None:
    """Move ``champion`` to version ``candidate`` when it beats the champion: a higher final
    accuracy on the same evaluation set (the ``eval_set_sha256`` tags are equal). A champion
    on another evaluation set stays (accuracies on different test sets do not compare; promote
    by hand if you mean it); one without the tag (registered before this rule) is compared by
    accuracy alone. Without a champion, a candidate with an accuracy becomes it. Returns the
    champion's version afterwards (None: there is none)."""
    from mlflow.exceptions import MlflowException

    client = _client()
    new = client.get_model_version(name, candidate)
    acc = float(new.tags.get("final_accuracy", "nan"))
    try:
        champ = client.get_model_version_by_alias(name, CHAMPION)
    except MlflowException:  # no champion yet
        champ = None
    if champ is not None:
        same = champ.tags.get(EVAL_SET_TAG) in (None, new.tags.get(EVAL_SET_TAG))
        if not (same and acc > float(champ.tags.get("final_accuracy", "-inf"))):
            return str(champ.version)
    elif acc != acc:  # never evaluated: not a champion
        return None
    client.set_registered_model_alias(name, CHAMPION, str(candidate))
    return str(candidate)


def log_artifacts(run_id: str, paths: list[str], artifact_path: str) -> None:
    """Attach files (e.g. the pretrain base and its card) to a run's artifacts."""
    client = _client()
    for path in paths:
        client.log_artifact(run_id, path, artifact_path)


def log_metrics(run_id: str, values: dict[str, float]) -> None:
    """Single-value metrics (step 0) of a run, e.g. a sweep's per-cell mean and std."""
    from mlflow.entities import Metric

    metrics = [Metric(k, float(v), 0, 0) for k, v in sorted(values.items())]
    client = _client()
    for i in range(0, len(metrics), 1000):  # MLflow's log_batch takes 1000 metrics at most
        client.log_batch(run_id, metrics=metrics[i : i + 1000])
