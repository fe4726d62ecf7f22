"""The sections of how a run executes and what it leaves: storage, report, runtime and
tracking."""

from __future__ import annotations

import warnings
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator

from tasks.config.base import MAX_PROCESSES, Section

MAX_PREFIX_BYTES = 512  # storage.prefix: half of an S3 key's 1024 bytes


class StorageSection(Section):
    """S3-compatible copy of the experiment's outputs (endpoint/credentials from AWS_* env)."""

    bucket: str | None = Field(None, pattern=r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
    # The folder of the bucket the experiments go to (s3://<bucket>/<prefix>/<experiment>/),
    # normalised as a POSIX path: "runs//a/./" is "runs/a"; null: the bucket's top.
    prefix: str | None = "fedapt"

    @field_validator("prefix")
    @classmethod
    def _relative_key(cls, v: str | None) -> str | None:
        """A relative folder inside the bucket: no ``..`` (S3 refuses such keys, or they
        name another folder than the one asked for), no leading ``/`` (an absolute path),
        no control characters (S3's XML listings cannot carry them), no backslash (S3 keys
        separate folders with /; a backslash would be part of one folder's name)."""
        if v is None:
            return None
        if any(ord(ch) < 32 or ord(ch) == 127 for ch in v):
            raise ValueError(f"a folder inside the bucket has no control characters (got {v!r})")
        if "\\" in v:
            raise ValueError(
                "a folder inside the bucket separates its parts with /, not \\ (e.g. "
                f"team/fedapt) (got {v!r})"
            )
        if v.startswith("/"):
            raise ValueError(
                "a folder inside the bucket, relative to its top: no leading / (e.g. fedapt "
                f"or team/fedapt) (got {v!r})"
            )
        if len(v.encode()) > MAX_PREFIX_BYTES:
            raise ValueError(
                f"a folder inside the bucket of at most {MAX_PREFIX_BYTES} bytes (an S3 key "
                "holds at most 1024, and the experiment's folder and files take the rest) (got "
                f"{len(v.encode())} bytes)"
            )
        parts = [s for s in v.split("/") if s not in ("", ".")]
        if ".." in parts:
            raise ValueError(
                "a folder inside the bucket: no .. (it would leave the folder asked for; "
                f"e.g. fedapt or team/fedapt) (got {v!r})"
            )
        return "/".join(parts)


class ReportSection(Section):
    """The grid's communication-cost report (seed 004 Tables 6.4-6.7, seed 001 Table 6)."""

    accuracy_levels: tuple[float, ...] = (0.5, 0.6, 0.7, 0.75, 0.8, 0.85)
    baseline: str | None = None  # a grid cell "algorithm-adapter"; null: fedavg's first cell
    style: Literal["seed004", "seed001"] = "seed004"
    # The accuracy a level is compared with (fedcore/commcost.py): "mean", seed 004 §6.1.5's
    # ACC, the mean test accuracy of the last `window` evaluated rounds; "round", the round's
    # own accuracy (seed 001 Table 6).
    accuracy: Literal["mean", "round"] = "mean"
    window: int = Field(30, ge=1)

    @field_validator("accuracy_levels")
    @classmethod
    def _fractions(cls, v: tuple[float, ...]) -> tuple[float, ...]:
        if not v or any(not 0.0 < x <= 1.0 for x in v):
            raise ValueError("accuracy levels are fractions in (0, 1], e.g. [0.7, 0.8]")
        return tuple(sorted(set(v)))


class RuntimeSection(Section):
    device: Literal["auto", "cpu", "cuda"] = "auto"
    workers: int | Literal["auto"] = "auto"  # CPU worker processes (0: in this process)
    # How a round's clients train: one after another ("sequential", the reference), or as one
    # batched computation ("cohort", fedcore.cohort); auto: whichever docs/performance.md
    # measured faster for this device and adapter method.
    engine: Literal["auto", "cohort", "sequential"] = "auto"
    cohort_size: int | Literal["auto"] = "auto"  # clients per cohort (auto: what memory holds)
    tracking: bool = True  # MLflow runs + model registry (MLFLOW_TRACKING_URI or mlruns/)
    # Where the grid's training tasks run: "thread" (this process, one cell at a time),
    # "dask" (prefect-dask: the cluster at dask_address, or a LocalCluster of dask_workers) or
    # "ray" (prefect-ray: the cluster at ray_address, or a local Ray of ray_workers CPUs).
    task_runner: Literal["thread", "dask", "ray"] = "thread"
    dask_address: str | None = None  # e.g. tcp://10.0.0.5:8786; null = start a LocalCluster
    dask_workers: int = Field(
        2, ge=1, le=MAX_PROCESSES
    )  # LocalCluster size (one single-thread worker process each)
    ray_address: str | None = None  # e.g. ray://10.0.0.5:10001 or auto; null = a local Ray
    ray_workers: int = Field(
        2, ge=1, le=MAX_PROCESSES
    )  # local Ray: CPUs, so cells trained at once (one CPU each)
    # GPUs each training task requests on Ray (Ray shows a task only the GPUs it requested);
    # auto: 1 when the cells may use one (device cuda or auto) and a node has one, else 0.
    ray_gpus: float | Literal["auto"] = "auto"
    # Where a cell's clients train: "local" (worker processes of this machine, or in this
    # process: runtime.workers) or "ray" (Ray actors, fedcore/engine/ray_pool.py: the cluster
    # at ray_address, or a local Ray of ray_actors CPUs); the same bytes either way.
    clients: Literal["local", "ray"] = "local"
    # Client actors (one model replica each); auto: what the cluster's CPUs (GPUs) hold, at
    # most the round's clients (a local Ray: as many as runtime.workers would be; the local
    # Ray runner's, shared with the cells: this machine's cores / ray_workers per cell).
    ray_actors: int | Literal["auto"] = "auto"
    # GPUs each client actor requests (Ray shows an actor only the GPUs it requested);
    # auto: 1 when the clients train on CUDA (runtime.device), else 0.
    ray_actor_gpus: float | Literal["auto"] = "auto"
    # Round checkpoints (tasks/training/checkpoint.py): every N rounds, 0 never, auto: after any round
    # that ends 5 s or more after the last checkpoint (so every round of a slow run).
    checkpoint_every: int | Literal["auto"] = "auto"
    resume: bool = True  # a rerun continues from the cell's checkpoint (false: start over)
    # A diverged run (every update rejected as non-finite, or a non-finite test loss) exits
    # with code 3 after writing its outputs; true: exit 0 (the warning is printed either way).
    allow_divergence: bool = False
    # Which CPU kernels compute (fedcore/numerics.py): portable gives the same bytes on every
    # x86-64 CPU with AVX2 (ATen at AVX2, oneDNN and NNPACK off, MKL's COMPATIBLE branch,
    # fixed threads); native lets each machine pick its fastest (exact on that machine only).
    # auto: portable in the DVC stages and `fedapt reproduce`, native in `fedapt run` and
    # deployments, or the mode of FEDAPT_NUMERICS when set (fedcore.numerics.resolve).
    numerics: Literal["auto", "portable", "native"] = "auto"
    # Intra-op threads of a process that computes outside the single-thread client workers
    # (cohort engine, pretraining); auto: 2 in portable numerics (results depend on it), the
    # library's default (the machine's cores) in native numerics.
    threads: int | Literal["auto"] = "auto"

    @field_validator("workers", "cohort_size", "threads", "ray_actors")
    @classmethod
    def _auto_or_count(cls, v: int | str, info: ValidationInfo) -> int | str:
        least, what = {
            "workers": (0, "worker processes"),
            "cohort_size": (1, "clients"),
            "threads": (1, "threads"),
            "ray_actors": (1, "Ray actors"),
        }[str(info.field_name)]
        most = None if info.field_name == "cohort_size" else MAX_PROCESSES
        if not isinstance(v, str) and (v < least or (most is not None and v > most)):
            within = f">= {least}" if most is None else f"in [{least}, {most}]"
            raise ValueError(f"{info.field_name} is auto or a number of {what} {within}")
        return v

    @field_validator("ray_gpus", "ray_actor_gpus")
    @classmethod
    def _gpus(cls, v: float | str, info: ValidationInfo) -> float | str:
        if not isinstance(v, str) and v < 0:
            who = "cells" if info.field_name == "ray_gpus" else "client actors"
            raise ValueError(
                f"{info.field_name} is auto or a number of GPUs >= 0 (0.5: two {who} share one)"
            )
        return v

    @field_validator("checkpoint_every")
    @classmethod
    def _rounds(cls, v: int | str) -> int | str:
        if not isinstance(v, str) and v < 0:
            raise ValueError("checkpoint_every is auto, 0 (never) or a number of rounds >= 1")
        return v


with warnings.catch_warnings():
    # ``tracking.register`` (the documented key) shadows BaseModel.register, the ABC
    # registration hook, which nothing calls on a params section.
    warnings.filterwarnings("ignore", message='Field name "register"', category=UserWarning)

    class TrackingSection(Section):
        # Which final models enter the MLflow model registry: "auto" those evaluated on the whole
        # test split (a run on data.test_subset is tracked but not registered), "always", "never".
        # A registered version is the alias challenger; champion moves to it only when it beats
        # the champion on the same evaluation set (docs/operations.md, "The model registry").
        register: Literal["auto", "always", "never"] = "auto"
