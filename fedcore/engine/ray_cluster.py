"""Connecting to Ray for the client backend (``fedcore.engine.ray_pool``): the settings, the
address check, a local Ray on 127.0.0.1, and what the cluster can give (CPUs, GPUs).

Ray is imported lazily, inside the functions: fedcore imports without it.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedcore import numerics
from fedcore.errors import ConfigError

REPO = str(Path(__file__).resolve().parents[2])  # the checkout: PYTHONPATH of local actors


@dataclass(frozen=True)
class RaySettings:
    """Where a cell's clients train on Ray (``runtime.clients: ray``)."""

    address: str | None = None  # None: a local Ray on 127.0.0.1; "auto", "host:port", "ray://"
    actors: int | None = None  # None: what the cluster's CPUs (GPUs) hold, at most the clients
    actor_cpus: float = 1.0  # CPUs each actor requests (it trains single-threaded on the CPU)
    actor_gpus: float = 0.0  # GPUs each actor requests (Ray shows it those alone)
    local_cpus: int = 1  # a local Ray's CPUs (address None)
    local_gpus: int = 0  # a local Ray's GPUs (address None)


def ray_module() -> Any:
    try:
        import ray
    except ImportError as err:  # pragma: no cover - ray comes with prefect-ray
        raise ConfigError(f"runtime.clients: ray, but ray cannot be imported ({err})") from err
    return ray


def _host_port(address: str) -> tuple[str, int] | None:
    """(host, port) of ``host:port`` or ``ray://host:port``; None for ``auto``."""
    if address == "auto":
        return None
    rest = address.removeprefix("ray://")
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ConfigError(
            f"runtime.ray_address: {address!r} is not auto, host:port or ray://host:port"
        )
    return host, int(port)


def check_reachable(address: str, timeout: float = 5.0) -> None:
    """One line where nothing answers at ``address`` (before Ray spends minutes retrying)."""
    hp = _host_port(address)
    if hp is None:
        return
    try:
        with socket.create_connection(hp, timeout=timeout):
            pass
    except OSError as err:
        raise ConfigError(
            f"runtime.ray_address: nothing answers at {address} ({err.strerror or err}); "
            f"start the cluster (ray start --head) or set runtime.ray_address: null for a "
            f"local Ray"
        ) from err


def actor_env() -> dict[str, str]:
    """The environment of every client actor: this process's numerics mode (its kernels, set
    before the actor's torch computes) and, for a local Ray, this checkout on PYTHONPATH."""
    keys = (numerics.MODE_VAR, numerics.THREADS_VAR, *numerics.PORTABLE_ENV)
    env = {k: os.environ[k] for k in keys if k in os.environ}
    path = os.environ.get("PYTHONPATH")
    env["PYTHONPATH"] = REPO if not path else f"{REPO}{os.pathsep}{path}"
    return env


def connect(settings: RaySettings) -> bool:
    """Ray initialised in this process: an existing connection (a cell already running on
    Ray), the cluster at ``settings.address``, or a local Ray. True: this call initialised it
    (the caller shuts it down)."""
    ray = ray_module()
    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    common: dict[str, Any] = {"configure_logging": False, "log_to_driver": True}
    if settings.address:
        check_reachable(settings.address)
        try:
            ray.init(address=settings.address, **common)
        except (ConnectionError, RuntimeError) as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise ConfigError(
                f"runtime.ray_address: cannot connect to the Ray cluster at "
                f"{settings.address} ({first})"
            ) from err
        return True
    ray.init(
        num_cpus=settings.local_cpus,
        num_gpus=settings.local_gpus,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        **common,
    )
    return True


def node_resources() -> list[dict[str, float]]:
    """The resources of each live node of the cluster."""
    ray = ray_module()
    return [dict(n["Resources"]) for n in ray.nodes() if n.get("Alive")]


def check_gpus(settings: RaySettings, device: str, nodes: list[dict[str, float]]) -> None:
    """One line where no node can hold an actor's GPUs, or where the clients train on CUDA
    with none requested (Ray hides every GPU from an actor that requests none)."""
    where = f"the Ray cluster at {settings.address}" if settings.address else "the local Ray"
    most = max((n.get("GPU", 0.0) for n in nodes), default=0.0)
    asked = settings.actor_gpus
    if asked > most:
        have = "any" if most == 0 else f"more than {most:g}"
        raise ConfigError(
            f"runtime.ray_actor_gpus: {asked:g} GPU per client actor asked, but no node of "
            f"{where} has {have}; set runtime.ray_actor_gpus: 0 and runtime.device: cpu"
        )
    if device != "cpu" and asked == 0:
        raise ConfigError(
            f"runtime.ray_actor_gpus: 0 with runtime.device: {device}: Ray hides the GPUs from "
            f"an actor that requests none; set runtime.ray_actor_gpus to 1 or a fraction"
        )


def actor_count(settings: RaySettings, clients: int, nodes: list[dict[str, float]]) -> int:
    """``settings.actors``, else as many actors as the cluster's CPUs (GPUs, where each asks
    some) hold, at most ``clients`` (the round's) and at least one."""
    if settings.actors is not None:
        return settings.actors
    fits = [
        n.get("GPU", 0.0) / settings.actor_gpus if settings.actor_gpus else float("inf")
        for n in nodes
    ]
    cpus = [n.get("CPU", 0.0) / settings.actor_cpus if settings.actor_cpus else 1.0 for n in nodes]
    held = sum(int(min(c, g)) for c, g in zip(cpus, fits, strict=True))
    return max(1, min(clients, held))
