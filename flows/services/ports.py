"""Ports and health probes: whether a port is free, a free port (or pair), the check that
names the variable to change, HTTP probes and the URLs of a service."""

from __future__ import annotations

import random
import socket
import subprocess
import urllib.request
from collections.abc import Collection, Mapping

from flows.services.config import (
    DEFAULT_PORTS,
    HEALTH_PATHS,
    HOST,
    PortInUseError,
    ServiceError,
    pg_bindir,
    port_env_var,
)


def port_free(port: int, host: str = HOST) -> bool:
    """True when a server could listen on host:port now (bind test, like the servers do)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = HOST) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def free_port_pair(offset: int = 10000, taken: set[int] | None = None) -> int:
    """A port p with p + offset also free (SeaweedFS's admin worker dials admin.port + 10000),
    neither of them in ``taken``."""
    taken = set() if taken is None else taken
    for _ in range(200):
        p = random.randint(20000, 65535 - offset)
        if p in taken or p + offset in taken:
            continue
        if port_free(p) and port_free(p + offset):
            taken.update((p, p + offset))
            return p
    raise ServiceError("s3 cannot start: no free pair of ports for the SeaweedFS admin server")


def suggest_port(port: int, taken: Collection[int] = ()) -> int:
    """A port to suggest instead of ``port``: the nearest above it (else below it, not under
    1024) that is free now and not in ``taken`` (the other fedapt services' ports, running or
    default); 0 (any free port) when none is near."""
    above = range(port + 1, min(port + 100, 65535) + 1)
    below = range(port - 1, max(port - 100, 1024) - 1, -1)
    for candidate in (*above, *below):
        if candidate not in taken and port_free(candidate):
            return candidate
    return 0


def check_port(
    name: str, port: int, taken: Mapping[int, str] | None = None, host: str = HOST
) -> None:
    """Raise ``PortInUseError`` (one line naming the variable to change, with a port that is
    free now and no other fedapt service's) when ``port`` of service ``name`` is taken: by
    another program, or (``taken``: port -> service) by another fedapt service, running or
    about to start; 0 (any free port) passes."""
    taken = dict(taken or {})
    owner = taken.get(port)
    if not port or (owner in (None, name) and port_free(port, host)):
        return
    var = port_env_var(name)
    avoid = {*taken, *DEFAULT_PORTS.values()} - {port}
    alt = suggest_port(port, avoid)
    hint = f"e.g. {var}={alt}" if alt else f"{var}=0 (any free port)"
    if owner not in (None, name):
        by = f"fedapt's {owner} ({port_env_var(owner)})"
    else:
        by = "another program"
    raise PortInUseError(
        f"{name} cannot start: port {port} on {host} is already in use by {by}; "
        f"choose another port, {hint}"
    )


def probe(url: str, timeout: float = 1.0) -> bool:
    """HTTP GET; healthy when it answers 2xx. ``tcp://host:port`` (the Ray head's GCS, which
    speaks gRPC only): healthy when the port accepts a connection. ``postgresql://host:port``
    (fedapt's PostgreSQL server): healthy when ``pg_isready`` says it accepts connections (a
    server still starting or recovering accepts TCP but refuses sessions)."""
    if url.startswith("postgresql://"):
        return pg_isready(url, timeout)
    if url.startswith("tcp://"):
        host, _, port = url[len("tcp://") :].rpartition(":")
        try:
            with socket.create_connection((host, int(port)), timeout=timeout):
                return True
        except (OSError, ValueError):
            return False
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return 200 <= resp.status < 300
    except (OSError, ValueError):
        return False


def pg_isready(url: str, timeout: float = 1.0) -> bool:
    """``pg_isready`` on ``postgresql://host:port``: the server accepts connections (no
    password needed; nothing is printed)."""
    host, _, port = url[len("postgresql://") :].split("/")[0].rpartition(":")
    bindir = pg_bindir()
    if bindir is None:
        return False
    cmd = [
        str(bindir / "pg_isready"),
        "-q",
        "-h",
        host,
        "-p",
        port,
        "-t",
        str(max(1, round(timeout))),
    ]
    try:
        done = subprocess.run(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
            timeout=timeout + 5,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def health_url(name: str, port: int, host: str = HOST) -> str:
    """The health check of service ``name`` on ``host``:``port`` (the worker's and
    PostgreSQL's: on 127.0.0.1 whatever the host, ``auth.bind_host``)."""
    if name == "postgres":
        return f"postgresql://{HOST}:{port}"
    if name == "ray":
        return f"tcp://{host}:{port}"
    if name == "worker":
        host = HOST
    return f"http://{host}:{port}{HEALTH_PATHS[name]}"


def base_url(port: int, host: str = HOST) -> str:
    return f"http://{host}:{port}"
