"""A run's own local Ray (``runtime.clients: ray`` or ``runtime.task_runner: ray``, with no
``runtime.ray_address`` and no ``RAY_ADDRESS``): token authentication, and every socket on
127.0.0.1.

Measured on Ray 2.60 (psutil, each process's listening sockets): ``ray.init`` with
``_node_ip_address="127.0.0.1"`` (``fedcore.engine.ray_cluster.connect``, prefect-ray's runner
of ``flows.runners``) replaces 127.0.0.1 by the machine's address
(``services.resolve_ip_for_localhost``), so the GCS, the raylet and each worker listen on every
interface (gRPC's wildcard, ``::``), the dashboard agent on ``0.0.0.0`` and the machine's
address, the runtime-env agent on the machine's address. Ray keeps a node on 127.0.0.1 where
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` is 0, its single-machine mode (the default on macOS and
Windows): then every one of those, the autoscaler monitor and the dashboard's metrics included,
listens on 127.0.0.1 alone. Token authentication (``RAY_AUTH_MODE=token``, the token of
``fedapt up ray``: ``rayhead.ensure_token``) refuses any client without the token, one of
another user of this machine included.

Both are environment variables, set around a run (``local_ray``) so that the Ray it starts and
every process of that Ray read them; a run on a cluster (``runtime.ray_address``,
``RAY_ADDRESS``) keeps the environment as it is (a driver on 127.0.0.1 could not serve the
cluster's other nodes).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

from flows.services.embedded import patched_environ
from flows.services.rayhead import AUTH_VAR, ensure_token
from tasks.config import Params
from tasks.training.runtime import check_local_ray, starts_local_ray

LOOPBACK_VAR = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # 0: a single-machine Ray, on 127.0.0.1


def local_ray_env() -> dict[str, str]:
    """The variables of a run's own Ray: token authentication, a single-machine node on
    127.0.0.1, no usage stats."""
    return {AUTH_VAR: "token", LOOPBACK_VAR: "0", "RAY_USAGE_STATS_ENABLED": "0"}


@contextlib.contextmanager
def local_ray(params: Params) -> Iterator[None]:
    """Around a run: where it starts its own Ray (``starts_local_ray``), that Ray's variables
    (``local_ray_env``) and a token (``ensure_token``, as ``fedapt up ray``); the environment
    as it was afterwards. A Ray already connected in this process is the run's (``connect``
    reuses it): left as it is."""
    if not starts_local_ray(params) or _ray_connected():
        yield
        return
    check_local_ray(params)
    ensure_token(os.environ)
    try:
        with patched_environ(local_ray_env()):
            _reread_environ()
            yield
    finally:
        if not _ray_connected():  # (a Ray still up keeps what it started with)
            _reread_environ()  # the variables as they were


def _ray_connected() -> bool:
    ray = sys.modules.get("ray")
    return ray is not None and bool(ray.is_initialized())


def _reread_environ() -> None:
    """Where Ray is imported already, have it read the variables again: it reads
    ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` once, on import (``ray_constants``), and
    ``RAY_AUTH_MODE`` into its C++ config, which ``Config.initialize`` refreshes (as Ray's own
    ``authentication_token_setup._enable_token_auth`` does). Not imported yet (``fedapt run``):
    nothing to do, Ray reads them when it starts."""
    if "ray" not in sys.modules:
        return
    import ray._private.ray_constants as ray_constants
    from ray._raylet import Config

    ray_constants.ENABLE_RAY_CLUSTER = ray_constants.env_bool(
        LOOPBACK_VAR, not ray_constants.IS_WINDOWS_OR_OSX
    )
    Config.initialize("")
