"""The federated simulation engine: sampling, download, local training, upload, aggregation.

Determinism: every random choice is derived from (seed, round, client) and every client's
local training runs single-threaded, so a run gives the same numbers whatever the number of
worker processes, their completion order or the machine's thread count. Updates are
aggregated in the order the server sampled the clients, never in completion order.

What travels: by default the whole model, every round. With ``payload_keys`` (an adapter
method's payload: ``models.adapters``) only those state-dict entries are downloaded, trained
(``trainable``) and uploaded each round; the rest is the frozen base, which a client
downloads once, the first time it is sampled. That one-time download is counted apart
(``History.base_download_bytes``), never in the per-round traffic. Algorithms see only the
payload: uploads hold nothing else, so their aggregation and server steps act on it alone.

Parallelism comes from worker processes (each one model, one thread): on this project's
2-core CPU two single-thread clients side by side outrun one client on two threads. On CUDA
the clients run one after another in this process. With ``engine="cohort"`` the round's
clients instead train together in this process as one batched computation per step
(``fedcore.cohort``); the downloads, uploads, byte counts, aggregation and events are the same.

The package, by job:

* ``config``: :class:`FederationConfig` and :func:`initial_model`;
* ``simulation``: :class:`Simulation`, the run loop, evaluation, checkpoints, events;
* ``round``: one round (sampling, downloads, who reports, aggregation, the record);
* ``backends``, ``pool`` and ``ray_pool``: where the clients train (:class:`Backend`: in
  this process, a process pool, Ray actors, or the cohort engine, here or on Ray actors);
  each client's result is a
  :class:`ClientResult`; ``ray_cluster``: connecting to Ray (lazily imported).
"""

from typing import Any

from fedcore.engine.backends import (
    BACKENDS,
    Backend,
    CohortBackend,
    Evaluation,
    Placement,
    SequentialBackend,
    WireBackend,
    Workload,
)
from fedcore.engine.config import FederationConfig, initial_model
from fedcore.engine.ray_cluster import RaySettings
from fedcore.engine.simulation import Simulation
from fedcore.events import History
from fedcore.jobs import ClientResult
from fedcore.sampling import derive_seed, sample_clients


def __getattr__(name: str) -> Any:
    """The backends of other modules (``PoolBackend``, ``RayBackend``, ``RayCohortBackend``),
    imported when first named: ``import fedcore.engine`` imports no backend a run may not use."""
    for path in BACKENDS.values():
        module, _, cls = path.partition(":")
        if cls == name:
            import importlib

            return getattr(importlib.import_module(module), cls)
    raise AttributeError(f"module 'fedcore.engine' has no attribute {name!r}")


__all__ = [
    "BACKENDS",
    "Backend",
    "ClientResult",
    "CohortBackend",
    "Evaluation",
    "FederationConfig",
    "History",
    "Placement",
    "PoolBackend",
    "RayBackend",
    "RayCohortBackend",
    "RaySettings",
    "SequentialBackend",
    "Simulation",
    "WireBackend",
    "Workload",
    "derive_seed",
    "initial_model",
    "sample_clients",
]
