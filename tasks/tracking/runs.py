"""MLflow runs: one parent run per experiment, one child run per grid cell with
``step = round`` metrics, and their end state whatever way the process ends."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import socket
import subprocess
import threading
from collections.abc import Iterator
from typing import Any

from fedcore import numerics
from fedcore.events import Callback, RoundRecord
from fedcore.payload import mib
from tasks.io import pid_alive
from tasks.tracking import store

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


def provenance_tags() -> dict[str, str]:
    """git commit and DVC lock hash of the code and pipeline that produced a run."""
    tags = {}
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=store.ROOT, capture_output=True, text=True, timeout=10
        )
        if out.returncode == 0:
            tags["git_commit"] = out.stdout.strip()
    except OSError:
        pass
    lock = store.ROOT / "dvc.lock"
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
    ``run_name`` is given; ``tags``: e.g. its origin (``tasks.results.origin``)."""
    client = store.client()
    run = client.create_run(
        store.experiment_id(client, experiment),
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
    client = store.client()
    parent = {"mlflow.parentRunId": parent_run_id} if parent_run_id else {}
    run = client.create_run(
        store.experiment_id(client, experiment),
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
    store.client().set_terminated(run_id, status=status)
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
            store.client().set_terminated(run_id, status=status)
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
    client = store.client()
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


def percent_named(name: str, value: float) -> tuple[str, float]:
    """A metric as MLflow gets it: an accuracy (or a personalization gain, a difference of
    accuracies) in percent, the unit of every results table, its name ending ``_pct``
    (``final_accuracy`` 0.8412 -> ``final_accuracy_pct`` 84.12; a sweep's
    ``<cell>/final_accuracy_mean`` -> ``<cell>/final_accuracy_mean_pct``); others as given."""
    if "accuracy" in name or name.endswith("gain"):  # (14.000000000000002 shown as 14)
        return f"{name}_pct", round(100.0 * float(value), 6)
    return name, float(value)


def _metric(name: str, value: float, step: int) -> Any:
    from mlflow.entities import Metric

    key, shown = percent_named(name, value)
    return Metric(key, shown, 0, step)


class MlflowRounds(Callback):
    """Per-round metrics with step = round: test accuracy (%), losses, the cumulative MiB
    each way, the seconds of the round; the cumulative count of rejected updates from the
    first round that rejected one (no line of zeros). The learning rate and the algorithm's
    own series (FedNILO's freeze index, FedNova's tau, ...) once they change; one that never
    did is a param of the run at the end (no flat line). A round's MiB (the same every round
    under full participation) are params too (``log_final_metrics``)."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self._client = store.client()
        self._rejected = 0
        self._unchanged: dict[str, list[tuple[int, float]]] = {}  # not seen to change yet
        self._changing: set[str] = set()

    def on_resume(self, history: Any) -> None:
        """The rounds a resumed run restored from its checkpoint: the run's curves are whole."""
        for record in history.rounds:
            self.on_round_end(record)

    def on_round_end(self, record: RoundRecord) -> None:
        values = {
            "train_loss": record.train_loss,
            "cum_upload_mib": round(mib(record.cum_upload_bytes), 6),
            "cum_download_mib": round(mib(record.cum_download_bytes), 6),
            "round_seconds": record.seconds,
        }
        self._rejected += int(record.rejected)
        if self._rejected:
            values["cum_rejected_updates"] = float(self._rejected)
        if record.accuracy is not None:
            values["test_accuracy"] = record.accuracy
        if record.test_loss is not None:
            values["test_loss"] = record.test_loss
        # The lr and the algorithm's series: logged from the round they first change
        series = {"lr": record.lr, **(getattr(record, "extra", None) or {})}
        for name, value in series.items():
            if "accuracy" in name or name in self._changing:  # (an exit's accuracy: a curve)
                values[name] = value
                continue
            seen = self._unchanged.setdefault(name, [])
            seen.append((record.round, float(value)))
            if any(v != seen[0][1] for _, v in seen):  # changed: its whole curve from now on
                self._changing.add(name)
                points = self._unchanged.pop(name)
                metrics = [_metric(name, v, step) for step, v in points[:-1] if v == v]
                if metrics:
                    self._client.log_batch(self.run_id, metrics=metrics)
                values[name] = value
        metrics = [_metric(k, v, record.round) for k, v in values.items() if v == v]
        self._client.log_batch(self.run_id, metrics=metrics)

    def on_fit_end(self, history: Any) -> None:
        """``last_rounds_L``: the L that ``mean_accuracy_last_L`` averaged, federation.last_rounds
        capped by the rounds evaluated (fedcore.events.History), as every report label names it.
        The series that never changed: params (``lr`` = 0.05), not flat lines."""
        from mlflow.entities import Metric, Param

        L = history.last_rounds_averaged
        self._client.log_batch(self.run_id, metrics=[Metric("last_rounds_L", float(L), 0, 0)])
        params = [Param(name, f"{seen[0][1]:g}") for name, seen in self._unchanged.items() if seen]
        if params:
            self._client.log_batch(self.run_id, params=params)
        self._unchanged.clear()


# A cell's results, one value each (step 0): its row in the Runs table and a bar per cell
_FINAL_METRICS = {
    "final_accuracy": "final_accuracy",
    "mean_accuracy_last_L": "mean_accuracy_last_L",
    "wall_seconds": "wall_seconds",
    "local_train_seconds_mean": "local_train_seconds_mean",  # measured (seed 003 §4.4.1)
    "local_train_seconds_per_round": "local_train_seconds_per_round",
    "diverged_at_round": "diverged_at_round",  # logged only when the run diverged
}
_TOTAL_MIB = {"upload_bytes": "upload_mib", "download_bytes": "download_mib"}
# What a cell's method and schedule fix (the adapter method's sizes, a round's traffic):
# params, not flat metric lines or one-point panels
_SIZE_PARAMS = {"total_params": "total_params", "trainable_params": "trainable_params"}
_MIB_PARAMS = {
    "payload_bytes": "payload_mib",
    "model_bytes": "model_mib",
    "base_download_bytes": "base_download_mib",
    "upload_bytes_per_round": "upload_mib_per_round",
    "download_bytes_per_round": "download_mib_per_round",
}


def log_final_metrics(run_id: str, record: dict[str, Any]) -> None:
    """A cell's results: accuracies in % and total MiB each way as metrics; the method's
    sizes (parameters, MiB of a payload, of the model, of the base sent once) and the MiB
    of a round as params (MiB = 2**20 bytes)."""
    from mlflow.entities import Param

    metrics = [
        _metric(name, record[key], 0)
        for key, name in _FINAL_METRICS.items()
        if record.get(key) is not None
    ]
    metrics += [
        _metric(name, round(mib(record[key]), 6), 0)
        for key, name in _TOTAL_MIB.items()
        if record.get(key) is not None
    ]
    params = [Param(n, str(int(record[k]))) for k, n in _SIZE_PARAMS.items() if k in record]
    params += [
        Param(name, f"{mib(record[key]):.4f}")
        for key, name in _MIB_PARAMS.items()
        if record.get(key) is not None
    ]
    # Personalization (seed 001 Table 4): means, and one point per client (step = client id)
    for scope, result in (record.get("personalization") or {}).items():
        for key in ("mean_accuracy_before", "mean_accuracy_after", "mean_gain"):
            if result.get(key) is not None:
                metrics.append(_metric(f"personal_{scope}_{key}", result[key], 0))
        for c in result["clients"]:
            for key in ("accuracy_before", "accuracy_after", "gain"):
                metrics.append(_metric(f"personal_{scope}_{key}", c[key], c["client"]))
    client = store.client()
    if params:
        client.log_batch(run_id, params=params)
    for i in range(0, len(metrics), 1000):  # MLflow's log_batch takes 1000 metrics at most
        client.log_batch(run_id, metrics=metrics[i : i + 1000])


def log_artifacts(run_id: str, paths: list[str], artifact_path: str) -> None:
    """Attach files (e.g. the pretrain base and its card) to a run's artifacts."""
    client = store.client()
    for path in paths:
        client.log_artifact(run_id, path, artifact_path)


def log_metrics(run_id: str, values: dict[str, float]) -> None:
    """Single-value metrics (step 0) of a run, e.g. a sweep's per-cell mean and std
    (accuracies in %: ``percent_named``)."""
    metrics = [_metric(k, v, 0) for k, v in sorted(values.items())]
    client = store.client()
    for i in range(0, len(metrics), 1000):  # MLflow's log_batch takes 1000 metrics at most
        client.log_batch(run_id, metrics=metrics[i : i + 1000])
