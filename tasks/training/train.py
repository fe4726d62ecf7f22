"""One training cell of the experiment grid: (algorithm, adapter) on the shared partition.
The cell's task and entry points: train it (resuming from and writing round checkpoints),
run it with progress output and MLflow tracking, and report divergence. What it writes is
``tasks.training.outputs``'s, its personalization ``tasks.training.personalize``'s and the registration of its
model ``tasks.training.registration``'s."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE
from rich.console import Console
from torch import nn

from fedcore import numerics
from fedcore.events import Callback, ClientRecord
from fedcore.partition import Partition
from tasks import tracking
from tasks.config import Params
from tasks.data.experiment import ExperimentData, load_experiment_data
from tasks.data.partitioning import load_partition
from tasks.grid import ResolvedCell, record_cell
from tasks.results import artifacts
from tasks.results.origin import Origin
from tasks.results.progress import GridSlot, GridTracker, PrefectProgress, RichProgress, labelled
from tasks.training import checkpoint, modelfile
from tasks.training.cell import Cell, build_simulation
from tasks.training.outputs import summary_record, write_cell_outputs
from tasks.training.personalize import personalize_cell
from tasks.training.registration import register_model, registers

_err = Console(stderr=True)


def train_cell(
    cell: ResolvedCell,
    data: ExperimentData,
    part: Partition,
    out_dir: str | Path,
    callbacks: Sequence[Callback] = (),
    timing_file: str | Path | None = None,
) -> dict[str, Any]:
    """Simulate one grid cell; writes its outputs (see ``tasks.training.outputs.write_cell_outputs``),
    returns its record."""
    record, _ = train_cell_model(cell, data, part, out_dir, callbacks, timing_file)
    return record


def train_cell_model(
    cell: ResolvedCell,
    data: ExperimentData,
    part: Partition,
    out_dir: str | Path,
    callbacks: Sequence[Callback] = (),
    timing_file: str | Path | None = None,
    checkpoint_file: str | Path | None = None,
    keep_checkpoint: bool = False,
    model: nn.Module | None = None,
) -> tuple[dict[str, Any], nn.Module]:
    """``train_cell``, and the trained (adapted) model in memory: the cell's one model
    instance with the final global state loaded (what registration logs).

    ``checkpoint_file``: round checkpoints (``tasks.training.checkpoint``); a checkpoint already there
    from an interrupted run of the same configuration is resumed (``runtime.resume``). It is
    deleted once the outputs are written, unless ``keep_checkpoint`` (the flow keeps the
    cells' final checkpoints until the whole grid is done, so a rerun skips finished cells).
    ``model``: the cell's initial model when already built (``tasks.training.cell.initial_cell_model``).
    """
    params = cell.params
    timer = LocalTrainingTime()
    built = build_simulation(cell, data, part, [*callbacks, timer], model)
    sim, method, model_fn, adapted, device = (
        built.sim, built.method, built.model_fn, built.adapted, built.device
    )  # fmt: skip
    sizes = method.counts(adapted)
    saver = _checkpoints(cell, built, part, checkpoint_file)
    # clients on Ray actors: the node of each, recorded beside the times (timing.json)
    nodes = sim.backend.nodes()
    if nodes is not None:
        sim.callbacks.append(nodes)
    history = sim.run()
    record = summary_record(cell, part, history, device, data)
    if params.personalize.enabled:
        label = f"{cell.algorithm}/{cell.adapter}"
        if cell.codec != "none":
            label += f"/{cell.codec}"
        record["personalization"] = personalize_cell(
            params, sim, model_fn(), cell.trainable_keys, label
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
    # its base; full fine-tuning stores the whole model (tasks/training/modelfile.py).
    trained = None if cell.whole else list(cell.payload_keys or ())
    base = None if trained is None else modelfile.base_reference(params, cell.adapter, cell.base)
    write_cell_outputs(
        Path(out_dir), record, history, sim.global_state, timing_file, trained, base,
        None if nodes is None else nodes.to_dict(),
    )  # fmt: skip
    if saver is not None and not keep_checkpoint:
        saver.path.unlink(missing_ok=True)
    adapted.to("cpu").load_state_dict(sim.global_state)  # it trained the in-process clients
    return record, adapted


def _checkpoints(
    cell: ResolvedCell, built: Cell, part: Partition, path: str | Path | None
) -> checkpoint.Checkpointer | None:
    """Resume ``built`` from the checkpoint at ``path`` (if there is one for this
    configuration and ``runtime.resume``) and subscribe the writer of its checkpoints."""
    if path is None:
        return None
    params = cell.params
    fp = checkpoint.fingerprint(cell, part.content_hash())
    state = checkpoint.read(path, fp) if params.runtime.resume else None
    if state is not None:
        built.sim.load_state_dict(state)
        _err.print(
            f"{cell.name}: resuming after round {state['round']} from {path}",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
    if params.runtime.checkpoint_every == 0:
        return None
    saver = checkpoint.Checkpointer(built.sim, path, params.runtime.checkpoint_every, fp)
    built.sim.callbacks.insert(0, saver)  # before tracking: a failing server loses no round
    return saver


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


def run_cell(
    cell: ResolvedCell,
    partition_dir: str | Path,
    cell_dir: str | Path,
    parent_run_id: str | None = None,
    timing_file: str | Path | None = None,
    checkpoint_file: str | Path | None = None,
    keep_checkpoint: bool = False,
    run_origin: Origin | None = None,
    slot: GridSlot | None = None,
    data: ExperimentData | None = None,
    part: Partition | None = None,
    model: nn.Module | None = None,
) -> dict[str, Any]:
    """Train one cell with progress output and, if ``runtime.tracking``, an MLflow run with
    per-round metrics and the final (merged) model registered. Returns the summary record.
    ``checkpoint_file``: see ``train_cell_model``. The progress lines and the MLflow run are
    named by the cell's label (``<cell>``, ``<cell> seed <s>`` in a sweep, tagged ``seed``).
    ``run_origin``: how the run was started (MLflow tags; a smoke run is not registered
    under ``tracking.register: auto``). ``slot``: the cell's place in its grid, shown as
    ``cell k of N`` with the grid's progress (display only). ``data``, ``part``, ``model``:
    the run's plan's (``flows.plan``), when this process has them; else read from disk
    (``partition_dir``) and built here."""
    params = cell.params
    run_origin = run_origin or Origin()
    data = data or load_experiment_data(params)
    part = part or load_partition(partition_dir)
    name = cell.label
    grid, shown = GridTracker(slot), labelled(name, slot)
    callbacks: list[Callback] = [
        grid,  # first: the others show what it just wrote
        RichProgress(shown, Console(stderr=True), grid),
        PrefectProgress(shown, grid),
    ]
    run_id = None
    if params.runtime.tracking:
        flat = {**params.flat(), "algorithm": cell.algorithm, "adapter": cell.adapter}
        if cell.codec != "none":
            flat["codec"] = cell.codec
        if params.grid.client_lr:  # the cell's own lr beside the grid's mapping
            flat["client_lr"] = cell.lr
        tags = {
            "partition_hash": part.content_hash(),
            "algorithm": cell.algorithm,
            "adapter": cell.adapter,
            **({} if cell.codec == "none" else {"codec": cell.codec}),
            **run_origin.tags(),
            **({} if cell.seed is None else {"seed": str(cell.seed)}),
        }
        run_id = tracking.start_cell_run(params.experiment.name, parent_run_id, name, flat, tags)
        callbacks.append(tracking.MlflowRounds(run_id))
    started = time.perf_counter()
    try:
        record, model = train_cell_model(
            cell, data, part, cell_dir, callbacks, timing_file, checkpoint_file,
            keep_checkpoint, model,
        )  # fmt: skip
        record["process_seconds"] = round(time.perf_counter() - started, 3)
        warn_divergence(record)
        note_privacy_budget(params, record)
        if run_id is not None:
            tracking.log_final_metrics(run_id, record)
            artifacts.log_cell(run_id, cell_dir, partition_dir)  # files, figures, partition
            if registers(params, data, record, run_origin, label=name):
                record.update(register_model(params, data, cell.adapter, model, run_id, record))
            record["mlflow_run_id"] = run_id
            tracking.end_run(run_id)
    except BaseException as exc:
        if run_id is not None:  # Ctrl-C / SIGTERM: KILLED; any other failure: FAILED
            tracking.end_run(run_id, "KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED")
        raise
    return record


def warn_divergence(record: dict[str, Any]) -> None:
    """One warning line for a cell whose training diverged (its outputs are still written)."""
    r = record.get("diverged_at_round")
    if r is not None:
        _err.print(
            f"warning: {record_cell(record)} diverged at round {r} (every "
            "update rejected as non-finite, or a non-finite test loss); lower client.lr or "
            "set runtime.allow_divergence: true to accept it",
            highlight=False,
            markup=False,
        )


def note_privacy_budget(params: Params, record: dict[str, Any]) -> None:
    """One line for a DP cell that its privacy budget stopped before federation.rounds."""
    spent = record.get("privacy")
    if record.get("stop_reason") == "privacy_budget" and spent and params.privacy is not None:
        _err.print(
            f"note: {record_cell(record)} stopped after round {record['rounds']} of "
            f"{params.federation.rounds}: epsilon {spent['epsilon']:.4g} (delta "
            f"{spent['delta']:g}) spent, and one more round would exceed "
            f"privacy.target_epsilon={params.privacy.target_epsilon:g}",
            highlight=False,
            markup=False,
        )


def diverged(records: Sequence[dict[str, Any]]) -> list[str]:
    """The cells of ``records`` that diverged, as ``<algorithm>-<adapter>@<round>`` (with
    `` seed <seed>`` when the records are of several seeds)."""
    seeds = len({r.get("seed") for r in records}) > 1
    return [
        f"{record_cell(r)}@{r['diverged_at_round']}" + (f" seed {r['seed']}" if seeds else "")
        for r in records
        if r.get("diverged_at_round") is not None
    ]


def _run_name() -> str:
    """The Prefect task run's name: ``train-<cell>`` (``-seed-<s>`` in a sweep)."""
    from prefect.runtime import task_run

    cell = task_run.parameters["cell"]
    return f"train-{cell.name}" + ("" if cell.seed is None else f"-seed-{cell.seed}")


@task(name="train", task_run_name=_run_name, cache_policy=NO_CACHE)
def train_task(
    cell: ResolvedCell,
    partition_dir: str,
    runs_dir: str,
    parent_run_id: str | None = None,
    checkpoint_dir: str | None = None,
    run_origin: Origin | None = None,
    slot: GridSlot | None = None,
    data: ExperimentData | None = None,
    part: Partition | None = None,
    model: Callable[[], nn.Module | None] | None = None,
) -> dict:
    """Simulate ``cell`` on the partition; returns its summary record. Its round
    checkpoints go to ``checkpoint_dir/<cell>.pt`` and stay there (the flow removes them
    when the grid is done). In the flow's process, ``data``, ``part`` and ``model`` (called
    when the cell starts: its initial model) come from the run's plan."""
    # A Dask or Ray worker is a process of its own: the run's numerics before it computes.
    rt = cell.params.runtime
    numerics.apply(numerics.resolve(rt.numerics, "native"), rt.threads)
    return run_cell(
        cell,
        partition_dir,
        Path(runs_dir) / cell.name,
        parent_run_id,
        checkpoint_file=Path(checkpoint_dir) / f"{cell.name}.pt" if checkpoint_dir else None,
        keep_checkpoint=True,
        run_origin=run_origin,
        slot=slot,
        data=data,
        part=part,
        model=None if model is None else model(),
    )
