"""What a training cell writes: its record (metrics.json, and each run's entry in
summary.json) and its output files: ``model.pt``, ``metrics.json``, ``scores.json``,
``rounds.csv`` and the figures, which hold only what the seed determines (DVC hashes them),
and ``timing.json``, which holds the times."""

from __future__ import annotations

import multiprocessing
import os
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from fedcore import numerics, payload
from fedcore.engine import History
from fedcore.partition import Partition
from tasks.config import Params
from tasks.data.experiment import ExperimentData
from tasks.grid import ResolvedCell
from tasks.io import atomic_write_bytes, atomic_write_json, atomic_write_text
from tasks.results import figures
from tasks.training import modelfile
from tasks.training.runtime import clients_per_round

_TIMING_KEYS = (
    "provenance",
    "wall_seconds",
    "process_seconds",
    "local_train_seconds_mean",
    "local_train_seconds_per_round",
)


def write_cell_outputs(
    out: Path,
    record: dict[str, Any],
    history: History,
    state: payload.StateDict,
    timing_file: str | Path | None = None,
    trained: Sequence[str] | None = None,
    base: dict[str, Any] | None = None,
    client_nodes: dict[str, Any] | None = None,
) -> None:
    """model.pt, metrics.json and rounds.csv hold only what the seed determines (DVC hashes
    them: a rerun gives the same bytes); times go to ``timing_file`` (default: timing.json
    beside them; the DVC stage keeps it outside the hashed folder). ``trained``: the entries a
    frozen-base cell trained (model.pt holds them and ``base``'s reference, tasks/training/modelfile.py);
    None: the whole state. ``client_nodes``: clients on Ray actors, the node that trained
    each (``fedcore.engine.ray_pool.ClientNodes``): Ray's choice, so beside the times."""
    atomic_write_bytes(out / modelfile.MODEL_FILE, modelfile.encode(state, trained, base))
    rounds = history.to_dict()["rounds"]
    exact = {k: v for k, v in record.items() if k not in _TIMING_KEYS}
    exact["rounds"] = [{k: v for k, v in r.items() if k != "seconds"} for r in rounds]
    atomic_write_json(out / "metrics.json", exact)
    atomic_write_json(out / "scores.json", scores(record))  # `dvc metrics show`: numbers only
    atomic_write_text(out / "rounds.csv", rounds_csv(history))
    figures.write_cell_figures(out, exact["rounds"])  # figures/*.png (DVC image plots)
    timing = {k: record[k] for k in _TIMING_KEYS if k in record}
    timing["round_seconds"] = [r["seconds"] for r in rounds]
    # The process the cell ran in (a Dask worker under runtime.task_runner: dask).
    timing["pid"], timing["process_name"] = os.getpid(), multiprocessing.current_process().name
    if client_nodes is not None:
        timing["client_nodes"] = client_nodes
    atomic_write_json(timing_file or out / "timing.json", timing)


def scores(record: dict[str, Any]) -> dict[str, Any]:
    """The cell's headline numbers (DVC's metrics file): accuracy in % (the unit of every
    table and of MLflow's metrics, named ``_pct`` as there), MiB transmitted, rounds. Hashes,
    versions and options stay in metrics.json (DVC params, MLflow tags)."""
    up, down = payload.mib(record["upload_bytes"]), payload.mib(record["download_bytes"])

    def pct(x: float | None) -> float | None:
        return None if x is None else round(100.0 * float(x), 6)

    return {
        "final_accuracy_pct": pct(record["final_accuracy"]),
        "mean_accuracy_last_L_pct": pct(record["mean_accuracy_last_L"]),
        "last_rounds_L": record["last_rounds_L"],  # the L of the mean above
        "rounds": record["rounds"],
        "upload_mib": round(up, 6),
        "download_mib": round(down, 6),
        "total_mib": round(up + down, 6),
        "diverged_at_round": record["diverged_at_round"],
    }


def rounds_csv(history: History) -> str:
    """Per-round curves for `dvc plots` (accuracy against round and against cumulative MiB).
    Accuracy in %, as every table, figure and MLflow metric shows it (``test_accuracy_pct``)."""
    lines = [
        "round,test_accuracy_pct,test_loss,train_loss,upload_bytes,download_bytes,"
        "cum_upload_mib,cum_download_mib,cum_total_mib"
    ]
    for r in history.rounds:
        up, down = payload.mib(r.cum_upload_bytes), payload.mib(r.cum_download_bytes)
        acc = "" if r.accuracy is None else f"{100.0 * r.accuracy:.4f}"
        loss = "" if r.test_loss is None else f"{r.test_loss:.6f}"
        lines.append(
            f"{r.round},{acc},{loss},{r.train_loss:.6f},{r.upload_bytes},{r.download_bytes},"
            f"{up:.6f},{down:.6f},{up + down:.6f}"
        )
    return "\n".join(lines) + "\n"


def exit_accuracies(h: History) -> list[float]:
    """Accuracy at every early exit at the last evaluation (seed 001; [] without exits)."""
    extra = h.evaluated[-1].extra if h.evaluated else {}
    accs: list[float] = []
    while f"test_accuracy_exit_{len(accs)}" in extra:
        accs.append(float(extra[f"test_accuracy_exit_{len(accs)}"]))
    return accs


def summary_record(
    cell: ResolvedCell,
    part: Partition,
    h: History,
    device: str,
    data: ExperimentData | None = None,
) -> dict[str, Any]:
    """The cell's record (metrics.json, summary.json); ``data``: the evaluated rows' count
    under data.evaluate: validation. The cell's update codec is recorded when it has one."""
    params = cell.params
    record = {
        "algorithm": cell.algorithm,
        "adapter": cell.adapter,
        **({} if cell.codec == "none" else {"codec": cell.codec}),
        "partition": part.scheme,
        "partition_params": part.params,
        "partition_hash": part.content_hash(),
        "model": params.model.name,
        "dataset": params.data.dataset,
        "num_clients": part.num_clients,
        "clients_per_round": clients_per_round(params),
        "seed": params.experiment.seed,
        "rounds": len(h.rounds),
        "stop_reason": h.stop_reason,  # "rounds", or the algorithm budget that ended it early
        "diverged_at_round": h.diverged_at_round,  # None, or the first round that diverged
        "final_accuracy": h.final_accuracy,
        # early exits (seed 001): accuracy at every exit at the last evaluation ([] without)
        "final_accuracy_exits": exit_accuracies(h),
        "mean_accuracy_last_L": h.mean_accuracy_last,
        "last_rounds_L": h.last_rounds_averaged,  # capped by the evaluations there are
        "upload_bytes": h.upload_bytes,
        "download_bytes": h.download_bytes,
        "upload_bytes_per_round": h.rounds[-1].upload_bytes if h.rounds else 0,
        "download_bytes_per_round": h.rounds[-1].download_bytes if h.rounds else 0,
        "wall_seconds": round(h.wall_seconds, 3),
        "device": device,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "numerics": numerics.mode_in_force(),  # portable | native (the same on every machine)
        # The CPU, its ISA and what computed on it: not hashed (timing.json, summary.json).
        "provenance": numerics.provenance(),
    }
    # Keys only when their params are set: records of runs without them stay as they were.
    if params.grid.client_lr:  # every cell's own lr, named in grid.client_lr or client.lr
        record["client_lr"] = cell.lr
    if params.privacy is not None:  # client-level DP: what the run spent
        record["privacy"] = privacy_spent(params, h)
    if params.data.evaluate != "test":  # accuracies and losses are of this split
        record["evaluated_on"] = params.data.evaluate
        if data is not None:
            record["evaluated_rows"] = int(len(data.eval_rows(params.data.evaluate)[1]))
    return record


def privacy_spent(params: Params, h: History) -> dict[str, Any]:
    """A DP run's epsilon(delta) after its last round, with the noise multiplier it ran with
    (calibrated or given) and the clip norm of its last round."""
    assert params.privacy is not None
    last = h.rounds[-1].extra if h.rounds else {}
    return {
        "epsilon": last.get("dp_epsilon", 0.0),
        "delta": params.privacy.delta,
        "noise_multiplier": last.get("dp_noise_multiplier"),
        "clip": last.get("dp_clip", params.privacy.clip),
        "accountant": params.privacy.accountant,
    }
