"""One training cell of the experiment grid: (algorithm, adapter) on the shared partition."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import platform
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from prefect import task
from prefect.cache_policies import NO_CACHE
from rich.console import Console
from torch import nn

from fedcore import numerics, payload
from fedcore.client import LocalConfig
from fedcore.engine import History, Simulation
from fedcore.events import Callback, ClientRecord
from fedcore.partition import Partition
from fedcore.personalize import ClientResult, PersonalizeConfig, personalize, summarize
from models.serving import ImageServing
from tasks import artifacts, checkpoint, figures, modelfile, tracking
from tasks.backbone import model_input
from tasks.cell import (
    Cell,
    build_simulation,
    cell_lr,
    cell_name,
    clients_per_round,
    require_base,
)
from tasks.config import Params
from tasks.data import ExperimentData, load_experiment_data
from tasks.io import atomic_write_bytes, atomic_write_json, atomic_write_text
from tasks.origin import Origin
from tasks.partitioning import load_partition
from tasks.progress import GridSlot, GridTracker, PrefectProgress, RichProgress, labelled

_err = Console(stderr=True)


def train_cell(
    params: Params,
    data: ExperimentData,
    part: Partition,
    algorithm: str,
    adapter: str,
    out_dir: str | Path,
    callbacks: Sequence[Callback] = (),
    timing_file: str | Path | None = None,
    base_path: str | Path | None = None,
) -> dict[str, Any]:
    """Simulate one grid cell; writes its outputs (see write_cell_outputs), returns its record."""
    record, _ = train_cell_model(
        params, data, part, algorithm, adapter, out_dir, callbacks, timing_file, base_path
    )
    return record


def train_cell_model(
    params: Params,
    data: ExperimentData,
    part: Partition,
    algorithm: str,
    adapter: str,
    out_dir: str | Path,
    callbacks: Sequence[Callback] = (),
    timing_file: str | Path | None = None,
    base_path: str | Path | None = None,
    checkpoint_file: str | Path | None = None,
    keep_checkpoint: bool = False,
) -> tuple[dict[str, Any], nn.Module]:
    """``train_cell``, and the trained (adapted) model in memory: the cell's one model
    instance with the final global state loaded (what registration logs).

    ``checkpoint_file``: round checkpoints (``tasks.checkpoint``); a checkpoint already there
    from an interrupted run of the same configuration is resumed (``runtime.resume``). It is
    deleted once the outputs are written, unless ``keep_checkpoint`` (the flow keeps the
    cells' final checkpoints until the whole grid is done, so a rerun skips finished cells).
    """
    timer = LocalTrainingTime()
    cell = build_simulation(
        params, data, part, algorithm, adapter, base_path, callbacks=[*callbacks, timer]
    )
    sim, method, model_fn, adapted, device = (
        cell.sim, cell.method, cell.model_fn, cell.adapted, cell.device
    )  # fmt: skip
    sizes = method.counts(adapted)
    saver = _checkpoints(params, cell, algorithm, adapter, part, base_path, checkpoint_file)
    history = sim.run()
    record = summary_record(params, algorithm, adapter, part, history, device, data)
    if params.personalize.enabled:
        record["personalization"] = personalize_cell(
            params, sim, model_fn(), method.trainable_keys(adapted), f"{algorithm}/{adapter}"
        )
    record.update(
        {
            "total_params": sizes.total_params,
            "trainable_params": sizes.trainable_params,
            "payload_bytes": sizes.payload_bytes,  # one client's upload (= download) per round
            "model_bytes": sizes.model_bytes,  # the whole adapted state dict
            "base_bytes": history.base_bytes,  # one download of the frozen base
            "base_download_bytes": history.base_download_bytes,  # once per client reached
            "engine": sim.engine,  # runtime.engine as resolved: cohort or sequential
            **timer.summary(),
        }
    )
    # A frozen-base cell stores what it trained (what the engine transmits) and a reference to
    # its base; full fine-tuning stores the whole model (tasks/modelfile.py).
    trained = None if sim.payload_keys is None else list(sim.payload_keys)
    base = None if trained is None else modelfile.base_reference(params, adapter, base_path)
    write_cell_outputs(Path(out_dir), record, history, sim.global_state, timing_file, trained, base)
    if saver is not None and not keep_checkpoint:
        saver.path.unlink(missing_ok=True)
    adapted.to("cpu").load_state_dict(sim.global_state)  # it trained the in-process clients
    return record, adapted


def _checkpoints(
    params: Params,
    cell: Cell,
    algorithm: str,
    adapter: str,
    part: Partition,
    base_path: str | Path | None,
    path: str | Path | None,
) -> checkpoint.Checkpointer | None:
    """Resume ``cell`` from the checkpoint at ``path`` (if there is one for this
    configuration and ``runtime.resume``) and subscribe the writer of its checkpoints."""
    if path is None:
        return None
    base = require_base(params, base_path)
    fp = checkpoint.fingerprint(params, algorithm, adapter, part.content_hash(), base)
    state = checkpoint.read(path, fp) if params.runtime.resume else None
    if state is not None:
        cell.sim.load_state_dict(state)
        _err.print(
            f"{cell_name(algorithm, adapter)}: resuming after round {state['round']} from {path}",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
    if params.runtime.checkpoint_every == 0:
        return None
    saver = checkpoint.Checkpointer(cell.sim, path, params.runtime.checkpoint_every, fp)
    cell.sim.callbacks.insert(0, saver)  # before tracking: a failing server loses no round
    return saver


def personalize_cell(
    params: Params, sim: Simulation, model: Any, trainable: frozenset[str], label: str
) -> dict[str, Any]:
    """Each client fine-tunes the final global model on its own corrupted data (seed 001
    Table 4), per scope; a scope the model lacks (client_token without an Accumulator) is
    skipped with a note."""
    p = params.personalize
    out: dict[str, Any] = {}
    has_token = any(n.endswith("client_token") for n, _ in model.named_parameters())
    for scope in p.scopes:
        if scope == "client_token" and not has_token:
            _err.print(f"{label}: personalization scope client_token skipped (no Accumulator)")
            continue
        cfg = PersonalizeConfig(
            scope=scope,
            local=LocalConfig(
                local_epochs=p.epochs,
                batch_size=p.batch_size,
                momentum=params.client.momentum,
                weight_decay=params.client.weight_decay,
                optimizer=params.client.optimizer,
            ),
            lr=p.lr,
            severities=p.severities,
            tune_fraction=p.tune_fraction,
            max_clients=p.max_clients,
            seed=params.experiment.seed,
        )

        def show(r: ClientResult, _state: Any, scope: str = scope) -> None:
            _err.print(
                f"{label} personalize {scope} client {r.client} (severity {r.severity}): "
                f"acc {r.accuracy_before:.4f} -> {r.accuracy_after:.4f}"
            )

        results = personalize(
            model,
            sim.global_state,
            sim.train,
            sim.shards,
            trainable,
            cfg,
            device=sim.device,
            on_client=show,
        )
        out[scope] = summarize(results, scope)
    return out


_TIMING_KEYS = (
    "provenance",
    "wall_seconds",
    "process_seconds",
    "local_train_seconds_mean",
    "local_train_seconds_per_round",
)


class LocalTrainingTime(Callback):
    """Measured local training time (seed 003 §4.4.1): seconds of each client's local
    epochs, from the engine's client records (decode and encode excluded)."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self.rounds: set[int] = set()

    def on_client_end(self, record: ClientRecord) -> None:
        self.seconds.append(record.seconds)
        self.rounds.add(record.round)

    def summary(self) -> dict[str, float]:
        if not self.seconds:
            return {}
        total = sum(self.seconds)
        return {
            "local_train_seconds_mean": round(total / len(self.seconds), 4),  # per client job
            "local_train_seconds_per_round": round(total / len(self.rounds), 4),  # all clients
        }


def write_cell_outputs(
    out: Path,
    record: dict[str, Any],
    history: History,
    state: payload.StateDict,
    timing_file: str | Path | None = None,
    trained: Sequence[str] | None = None,
    base: dict[str, Any] | None = None,
) -> None:
    """model.pt, metrics.json and rounds.csv hold only what the seed determines (DVC hashes
    them: a rerun gives the same bytes); times go to ``timing_file`` (default: timing.json
    beside them; the DVC stage keeps it outside the hashed folder). ``trained``: the entries a
    frozen-base cell trained (model.pt holds them and ``base``'s reference, tasks/modelfile.py);
    None: the whole state."""
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
    atomic_write_json(timing_file or out / "timing.json", timing)


def scores(record: dict[str, Any]) -> dict[str, Any]:
    """The cell's headline numbers (DVC's metrics file): accuracy, MiB transmitted, rounds.
    Hashes, versions and options stay in metrics.json (DVC params, MLflow tags)."""
    up, down = payload.mib(record["upload_bytes"]), payload.mib(record["download_bytes"])
    return {
        "final_accuracy": record["final_accuracy"],
        "mean_accuracy_last_L": record["mean_accuracy_last_L"],
        "rounds": record["rounds"],
        "upload_mib": round(up, 6),
        "download_mib": round(down, 6),
        "total_mib": round(up + down, 6),
        "diverged_at_round": record["diverged_at_round"],
    }


def rounds_csv(history: History) -> str:
    """Per-round curves for `dvc plots` (accuracy against round and against cumulative MiB)."""
    lines = [
        "round,accuracy,test_loss,train_loss,upload_bytes,download_bytes,"
        "cum_upload_mib,cum_download_mib,cum_total_mib"
    ]
    for r in history.rounds:
        up, down = payload.mib(r.cum_upload_bytes), payload.mib(r.cum_download_bytes)
        acc = "" if r.accuracy is None else f"{r.accuracy:.6f}"
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
    params: Params,
    algorithm: str,
    adapter: str,
    part: Partition,
    h: History,
    device: str,
    data: ExperimentData | None = None,
) -> dict[str, Any]:
    """The cell's record (metrics.json, summary.json); ``data``: the evaluated rows' count
    under data.evaluate: validation."""
    record = {
        "algorithm": algorithm,
        "adapter": adapter,
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
        "last_rounds_L": h.last_rounds,
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
        record["client_lr"] = cell_lr(params, algorithm, adapter)
    if params.data.evaluate != "test":  # accuracies and losses are of this split
        record["evaluated_on"] = params.data.evaluate
        if data is not None:
            record["evaluated_rows"] = int(len(data.eval_rows(params.data.evaluate)[1]))
    return record


def run_cell(
    params: Params,
    partition_dir: str | Path,
    algorithm: str,
    adapter: str,
    cell_dir: str | Path,
    parent_run_id: str | None = None,
    tags: dict[str, str] | None = None,
    timing_file: str | Path | None = None,
    base_path: str | Path | None = None,
    checkpoint_file: str | Path | None = None,
    keep_checkpoint: bool = False,
    label: str | None = None,
    run_origin: Origin | None = None,
    slot: GridSlot | None = None,
) -> dict[str, Any]:
    """Train one cell with progress output and, if ``runtime.tracking``, an MLflow run with
    per-round metrics and the final (merged) model registered. Returns the summary record.
    ``checkpoint_file``: see ``train_cell_model``. ``label``: the progress lines' and the
    MLflow run's name (default ``<algorithm>-<adapter>``). ``run_origin``: how the run was
    started (MLflow tags; a smoke run is not registered under ``tracking.register: auto``).
    ``slot``: the cell's place in its grid, shown as ``cell k of N`` with the grid's progress
    (display only)."""
    run_origin = run_origin or Origin()
    data = load_experiment_data(params)
    part = load_partition(partition_dir)
    name = label or cell_name(algorithm, adapter)
    grid, shown = GridTracker(slot), labelled(name, slot)
    callbacks: list[Callback] = [
        grid,  # first: the others show what it just wrote
        RichProgress(shown, Console(stderr=True), grid),
        PrefectProgress(shown, grid),
    ]
    run_id = None
    if params.runtime.tracking:
        flat = {**params.flat(), "algorithm": algorithm, "adapter": adapter}
        if params.grid.client_lr:  # the cell's own lr beside the grid's mapping
            flat["client_lr"] = cell_lr(params, algorithm, adapter)
        tags = {
            "partition_hash": part.content_hash(),
            "algorithm": algorithm,
            "adapter": adapter,
            **run_origin.tags(),
            **(tags or {}),
        }
        run_id = tracking.start_cell_run(params.experiment.name, parent_run_id, name, flat, tags)
        callbacks.append(tracking.MlflowRounds(run_id))
    started = time.perf_counter()
    try:
        record, model = train_cell_model(
            params, data, part, algorithm, adapter, cell_dir, callbacks, timing_file, base_path,
            checkpoint_file, keep_checkpoint,
        )  # fmt: skip
        record["process_seconds"] = round(time.perf_counter() - started, 3)
        warn_divergence(record)
        if run_id is not None:
            tracking.log_final_metrics(run_id, record)
            artifacts.log_cell(run_id, cell_dir, partition_dir)  # files, figures, partition
            if registers(params, data, record, run_origin, label=name):
                record.update(register_model(params, data, adapter, model, run_id, record))
            record["mlflow_run_id"] = run_id
            tracking.end_run(run_id)
    except BaseException as exc:
        if run_id is not None:  # Ctrl-C / SIGTERM: KILLED; any other failure: FAILED
            tracking.end_run(run_id, "KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED")
        raise
    return record


def eval_set_sha256(params: Params, data: ExperimentData) -> str:
    """Which rows the final accuracy was measured on: the dataset, the split's size, the
    selected row indices and their labels (equal hashes: comparable accuracies). Test rows,
    or (data.evaluate: validation) the validation rows of the train split."""
    evaluate = params.data.evaluate
    split, rows = (data.test, data.test_idx) if evaluate == "test" else data.eval_rows(evaluate)
    idx = np.ascontiguousarray(rows, dtype=np.int64)
    labels = np.asarray(split.labels)[idx].astype(np.int64)
    tag = "" if evaluate == "test" else f"{evaluate}:"
    h = hashlib.sha256(f"{params.data.dataset}:{tag}{len(split)}:".encode())
    h.update(idx.tobytes())
    h.update(labels.tobytes())
    return h.hexdigest()


def registers(
    params: Params,
    data: ExperimentData,
    record: dict[str, Any],
    run_origin: Origin | None = None,
    *,
    label: str | None = None,
) -> bool:
    """``tracking.register``: auto registers (and so may move ``challenger`` and ``champion``)
    a model evaluated on the whole test split that did not diverge and is not a smoke run
    (fewer rounds or training rows than its params file, or inside ``dvc exp run``:
    ``tasks.origin``); a run on data.test_subset or evaluated on the validation split
    (data.evaluate) is tracked, not registered. ``label``: a
    smoke run that would otherwise register says why it did not, in one line."""
    rule = params.tracking.register
    if rule == "never" or record.get("final_accuracy") is None:
        return False
    if rule == "always":
        return True
    whole = params.data.evaluate == "test" and len(data.test_idx) == len(data.test)
    if not (whole and record.get("diverged_at_round") is None):
        return False
    smoke = run_origin.smoke if run_origin is not None else ()
    if smoke and label is not None:
        _err.print(
            f"{label}: not registered: a smoke run ({'; '.join(smoke)}); "
            "--set tracking.register=always registers it",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
    return not smoke


def register_model(
    params: Params,
    data: ExperimentData,
    adapter: str,
    model: nn.Module,
    run_id: str,
    record: dict[str, Any],
) -> dict[str, str]:
    """Register the cell's final model: the merged plain model (adapters folded into the
    backbone) where the method allows it, else the adapted model, taking inputs as stored."""
    method = params.grid.adapter(adapter)
    model = method.merge(model) or model
    reg = tracking.registered_name(params.data.dataset, params.model.name, adapter)
    if data.tokenizer is not None:  # token ids (2, max_length)
        example = data.text_example()
    else:  # images as stored (pixel/255); the model resizes and normalises them
        model = ImageServing(model, model_input(params, data.train.info))
        example = torch.zeros(2, *data.train.info.input_shape)
    tags = {
        tracking.EVAL_SET_TAG: eval_set_sha256(params, data),
        "eval_set_rows": str(len(data.eval_rows(params.data.evaluate)[1])),
        "experiment": params.experiment.name,
        "cell": f"{record['algorithm']}-{adapter}",
        "partition": record["partition"],
        **{k: v for k, v in tracking.provenance_tags().items() if k == "git_commit"},
    }
    version = tracking.log_and_register_model(
        run_id, model, example, reg, record["final_accuracy"], tags
    )
    return {"registered_model": reg, "model_version": version}


def warn_divergence(record: dict[str, Any]) -> None:
    """One warning line for a cell whose training diverged (its outputs are still written)."""
    r = record.get("diverged_at_round")
    if r is not None:
        _err.print(
            f"warning: {record['algorithm']}-{record['adapter']} diverged at round {r} (every "
            "update rejected as non-finite, or a non-finite test loss); lower client.lr or "
            "set runtime.allow_divergence: true to accept it",
            highlight=False,
            markup=False,
        )


def diverged(records: Sequence[dict[str, Any]]) -> list[str]:
    """The cells of ``records`` that diverged, as ``<algorithm>-<adapter>@<round>`` (with
    `` seed <seed>`` when the records are of several seeds)."""
    seeds = len({r.get("seed") for r in records}) > 1
    return [
        f"{r['algorithm']}-{r['adapter']}@{r['diverged_at_round']}"
        + (f" seed {r['seed']}" if seeds else "")
        for r in records
        if r.get("diverged_at_round") is not None
    ]


@task(name="train", task_run_name="train-{algorithm}-{adapter}", cache_policy=NO_CACHE)
def train_task(
    params: Params,
    partition_dir: str,
    algorithm: str,
    adapter: str,
    runs_dir: str,
    parent_run_id: str | None = None,
    base_path: str | None = None,
    checkpoint_dir: str | None = None,
    seed: int | None = None,
    run_origin: Origin | None = None,
    slot: GridSlot | None = None,
) -> dict:
    """Simulate one (algorithm, adapter) cell on the partition; returns its summary record.
    Its round checkpoints go to ``checkpoint_dir/<cell>.pt`` and stay there (the flow
    removes them when the grid is done). ``seed``: the cell's seed in a seed sweep (its
    MLflow run is named ``<cell> seed <seed>`` and tagged ``seed``)."""
    # A Dask or Ray worker is a process of its own: the run's numerics before it computes.
    numerics.apply(numerics.resolve(params.runtime.numerics, "native"), params.runtime.threads)
    name = cell_name(algorithm, adapter)
    return run_cell(
        params,
        partition_dir,
        algorithm,
        adapter,
        Path(runs_dir) / name,
        parent_run_id,
        tags=None if seed is None else {"seed": str(seed)},
        base_path=base_path,
        checkpoint_file=Path(checkpoint_dir) / f"{name}.pt" if checkpoint_dir else None,
        keep_checkpoint=True,
        label=None if seed is None else f"{name} seed {seed}",
        run_origin=run_origin,
        slot=slot,
    )
