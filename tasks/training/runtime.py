"""Where a run computes, read from ``runtime.*`` in one place: the clients a round trains at
once, the Ray cluster (``runtime.ray_address``, else ``RAY_ADDRESS``, else a Ray of the run's
own), what the clients' actors and the training tasks ask of it (CPUs, GPUs), and the
preflight of all of it (``check_runtime``: one line before anything runs)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from fedcore.device import resolve_device, resolve_workers
from fedcore.engine import RaySettings
from fedcore.engine.ray_cluster import check_gpus as check_actor_gpus
from fedcore.engine.ray_cluster import check_reachable
from fedcore.errors import ConfigError
from tasks.config import Params

RAY_ADDRESS_VAR = "RAY_ADDRESS"  # Ray's own variable; `fedapt env` exports it (fedapt up ray)
AUTH_VAR = "RAY_AUTH_MODE"  # Ray's token authentication: token (fedapt up ray, a run's own Ray)


@dataclass(frozen=True)
class Runtime:
    """``runtime.device`` and ``runtime.workers`` resolved on this machine, once: the device
    training runs on, the CPU worker processes a round's clients use there (0: in this
    process) and those a CPU run would use (a local Ray's CPUs)."""

    device: str
    workers: int
    cpu_workers: int


def clients_per_round(params: Params) -> int:
    f = params.federation
    return max(1, round(f.participation * params.partition.num_clients))


def resolve_runtime(params: Params) -> Runtime:
    """The device (a CUDA device that is not there -> one line) and the worker processes of
    ``params.runtime`` on this machine."""
    rt = params.runtime
    device = resolve_device(rt.device)
    cpu_workers = resolve_workers(rt.workers, "cpu", clients_per_round(params))
    return Runtime(device, cpu_workers if device == "cpu" else 0, cpu_workers)


def check_runtime(params: Params) -> Runtime:
    """Every ``runtime.*`` check that needs no data, once: the device, a local Ray without
    the GPUs the cells would request, a Ray cluster nothing answers at, and the
    ``RAY_AUTH_MODE`` of a run's own Ray. Returns the runtime it resolved."""
    runtime = resolve_runtime(params)
    check_task_gpus(params)  # runtime.task_runner: ray
    check_ray_clients(params, runtime)  # runtime.clients: ray
    check_local_ray(params)
    return runtime


def ray_address(params: Params) -> str | None:
    """The Ray cluster a run that uses Ray (``runtime.clients`` or ``runtime.task_runner``
    ray) connects to: ``runtime.ray_address``; where that is null, ``RAY_ADDRESS`` from the
    environment (what ``ray.init()`` itself connects to; ``eval "$(fedapt env)"`` sets it to
    the head of ``fedapt up ray``); None where neither is set: a local Ray of the run's own."""
    return params.runtime.ray_address or os.environ.get(RAY_ADDRESS_VAR) or None


def check_ray_address(params: Params) -> None:
    """One line where nothing answers at the address of ``ray_address`` (before Ray spends
    minutes retrying), naming where it came from; never a fallback to a local Ray."""
    address = ray_address(params)
    if not address:
        return
    if params.runtime.ray_address:
        check_reachable(address)
        return
    try:
        check_reachable(address)
    except ConfigError as err:
        raise ConfigError(
            f"{RAY_ADDRESS_VAR}={address} (runtime.ray_address is null, so the run uses the "
            f"environment's RAY_ADDRESS): nothing answers there; start it (fedapt up ray) or "
            f'unset RAY_ADDRESS for a local Ray (eval "$(fedapt env)" does after fedapt down '
            f"ray)"
        ) from err


def ray_settings(params: Params, runtime: Runtime) -> RaySettings | None:
    """Where the clients train on Ray (``runtime.clients: ray``; the cluster of
    ``ray_address``); None: on this machine. ``runtime``: ``resolve_runtime(params)``."""
    rt, device = params.runtime, runtime.device
    if rt.clients != "ray":
        return None
    actors = None if rt.ray_actors == "auto" else rt.ray_actors
    if rt.ray_actor_gpus == "auto":
        gpus = 0.0 if device == "cpu" else 1.0
    else:
        gpus = float(rt.ray_actor_gpus)
    # A local Ray: the CPUs of the actors asked, else those runtime.workers would use.
    local_cpus = actors or max(1, runtime.cpu_workers)
    local_gpus = 0
    if device != "cpu":
        import torch

        local_gpus = torch.cuda.device_count()
    return RaySettings(ray_address(params), actors, 1.0, gpus, local_cpus, local_gpus)


def check_ray_clients(params: Params, runtime: Runtime) -> None:
    """Preflight of ``runtime.clients: ray``, one line before anything runs: a cluster
    address nothing answers at, or a local Ray without the GPUs the actors would request (a
    cluster's GPUs are checked when the cell's actors start)."""
    if params.runtime.clients != "ray":
        return
    settings = ray_settings(params, runtime)
    assert settings is not None
    if settings.address:
        check_ray_address(params)
    else:
        check_actor_gpus(settings, runtime.device, [{"GPU": float(settings.local_gpus)}])


def visible_gpus() -> list[str]:
    """The CUDA devices this process can use, named as ``CUDA_VISIBLE_DEVICES`` names them
    (its entries when it is set, else 0..n-1); empty without CUDA."""
    import torch

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    given = os.environ.get("CUDA_VISIBLE_DEVICES")
    if given is None:
        return [str(i) for i in range(n)]
    return [d.strip() for d in given.split(",") if d.strip()][:n]


def ray_gpus(params: Params, node_gpus: Sequence[float]) -> float:
    """The GPUs each training task requests on Ray (``runtime.ray_gpus``; auto: one when the
    cells may use a GPU, ``device`` cuda or auto, and some node of the cluster has one).
    ``node_gpus``: the GPUs of each node. A request no node can meet, or ``device: cuda``
    with none requested (Ray would hide every GPU from the task), is one line."""
    rt = params.runtime
    most = max(node_gpus, default=0.0)
    if rt.ray_gpus == "auto":
        asked = 1.0 if rt.device != "cpu" and most > 0 else 0.0
        if rt.device == "cuda" and most == 0:
            asked = 1.0  # refused just below, naming the device setting
    else:
        asked = float(rt.ray_gpus)
    address = ray_address(params)
    where = f"the Ray cluster at {address}" if address else "the local Ray"
    if asked > most:
        setting = "runtime.device: cuda" if rt.ray_gpus == "auto" else "runtime.ray_gpus"
        raise ConfigError(
            f"{setting}: {asked:g} GPU per cell asked, but no node of {where} has "
            f"{'any' if most == 0 else f'more than {most:g}'}; set runtime.device: cpu "
            f"(or runtime.ray_gpus at most {most:g})"
        )
    if rt.device == "cuda" and asked == 0:
        raise ConfigError(
            "runtime.ray_gpus: 0 with runtime.device: cuda: Ray hides the GPUs from a task "
            "that requests none; set runtime.ray_gpus to auto, 1 or a fraction such as 0.5"
        )
    return asked


def local_node_gpus(params: Params) -> list[float]:
    """The local Ray's GPUs (the one node ``ray_task_runner`` starts): known before it starts."""
    return [0.0 if params.runtime.device == "cpu" else float(len(visible_gpus()))]


def check_task_gpus(params: Params) -> None:
    """Preflight: a local Ray that cannot meet the cells' GPU request, or an environment's
    ``RAY_ADDRESS`` nothing answers at -> one line, before anything runs (a cluster's GPUs
    are asked when the grid starts)."""
    rt = params.runtime
    if rt.task_runner != "ray":
        return
    if not rt.ray_address and ray_address(params):  # RAY_ADDRESS (fedapt env)
        check_ray_address(params)
    elif not rt.ray_address:
        ray_gpus(params, local_node_gpus(params))


def starts_local_ray(params: Params) -> bool:
    """The run starts a Ray of its own: its cells or its clients run on Ray, and no cluster
    address is given."""
    rt = params.runtime
    return "ray" in (rt.clients, rt.task_runner) and not ray_address(params)


def check_local_ray(params: Params, environ: Mapping[str, str] | None = None) -> None:
    """Preflight: a run that starts its own Ray while ``RAY_AUTH_MODE`` asks for no token
    authentication -> one line (the run's own Ray always runs with it)."""
    env = os.environ if environ is None else environ
    mode = env.get(AUTH_VAR)
    if not starts_local_ray(params) or mode is None or mode.strip().lower() == "token":
        return
    raise ConfigError(
        f"{AUTH_VAR}: {mode!r} is not token: the run's own local Ray (runtime.clients or "
        f"runtime.task_runner ray, no runtime.ray_address or RAY_ADDRESS) always runs with "
        f"token authentication; unset {AUTH_VAR} or set it to token"
    )
