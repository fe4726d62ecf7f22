"""fedapt's own PostgreSQL server (the ``postgres`` service, ``fedapt up --store postgres``):
Debian's binaries (``config.pg_bindir``) and their version, its data folder
``<state dir>/postgres/data`` (``initdb`` once, role ``fedapt`` with a generated password kept
in ``<state dir>/postgres/password``, mode 0600, never printed), its URL, its command line:
127.0.0.1 only, no Unix socket. PostgreSQL refuses to run as root: when fedapt runs as root the
server runs as the system user ``postgres`` (Debian's package creates it), which owns the data
folder.

The store setting, the checks of a server's URL and its databases: ``pgstore``. Every check
here that can fail runs before anything starts (``stores.preflight``) and is one line naming
the setting; the password is in no message, record or command line.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import secrets
import shutil
import stat
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

from fedcore.errors import ConfigError
from flows.services.config import HOST, PG_BINDIR_VAR, ServiceError, pg_bindir
from flows.services.pgstore import STORE_VAR, require_version
from flows.services.process import last_log_line

PG_USER = "fedapt"  # the role of fedapt's own server (its superuser)
SYSTEM_USER = "postgres"  # who runs fedapt's server when fedapt runs as root


def home_dir(sd: Path) -> Path:
    return sd / "postgres"


def data_dir(sd: Path) -> Path:
    return home_dir(sd) / "data"


def password_path(sd: Path) -> Path:
    return home_dir(sd) / "password"


def own_server_url(sd: Path, port: int) -> str:
    """The URL of fedapt's own server (role ``fedapt``, database ``postgres``): it holds the
    password; print or record only ``mask_credentials`` of it."""
    try:
        password = password_path(sd).read_text().strip()
    except FileNotFoundError:
        raise ServiceError(
            f"postgres: {password_path(sd)} is missing, so the password of {data_dir(sd)} is "
            f"lost; move {home_dir(sd)} away to start a new server (its databases go with it)"
        ) from None
    return f"postgresql://{PG_USER}:{quote(password, safe='')}@{HOST}:{port}/postgres"


def run_as() -> tuple[int, int] | None:
    """Who runs fedapt's server: None (this user), or (uid, gid) of the system user
    ``postgres`` when this process is root (PostgreSQL refuses root)."""
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        raise ConfigError(
            f"{STORE_VAR}: postgres: PostgreSQL refuses to run as root and there is no system "
            f"user {SYSTEM_USER} to run it as (Debian's postgresql package creates it); run "
            "fedapt as a normal user, or use --store sqlite"
        ) from None
    return entry.pw_uid, entry.pw_gid


def check_reachable(path: Path, user: tuple[int, int]) -> None:
    """The system user ``user`` may enter every existing folder above ``path`` (else its
    server cannot open its data folder)."""
    uid, gid = user
    for folder in [p for p in path.parents if p.exists()]:
        st = folder.stat()
        bits = stat.S_IXOTH
        if st.st_uid == uid:
            bits = stat.S_IXUSR
        elif st.st_gid == gid:
            bits = stat.S_IXGRP
        if not st.st_mode & bits:
            raise ConfigError(
                f"FEDAPT_STATE_DIR: fedapt runs as root, so its PostgreSQL server runs as the "
                f"system user {SYSTEM_USER}, which may not enter {folder} (mode "
                f"{stat.S_IMODE(st.st_mode):o}); choose a state folder it can reach, or run "
                "fedapt as a normal user"
            )


def check_binaries(setting: str) -> Path:
    """The folder of initdb, postgres and pg_isready, PostgreSQL 14.9+ with pg_trgm."""
    bindir = pg_bindir()
    missing = [
        p for p in ("initdb", "postgres", "pg_isready") if not bindir or not (bindir / p).is_file()
    ]
    if bindir is None or missing:
        where = f"{bindir}" if bindir else "/usr/lib/postgresql/<major>/bin"
        raise ConfigError(
            f"{setting}: postgres needs PostgreSQL's server programs ({', '.join(missing)}) in "
            f"{where}; install Debian's postgresql package or set {PG_BINDIR_VAR} to their "
            "folder, or use --store sqlite"
        )
    try:
        text = subprocess.run(
            [str(bindir / "postgres"), "--version"],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        text = ""
    found = re.search(r"(\d+)\.(\d+)", text)
    num = int(found[1]) * 10000 + int(found[2]) if found else 0
    share = _sharedir(bindir)
    trgm = share is not None and (share / "extension" / "pg_trgm.control").is_file()
    require_version(num, trgm, f"{bindir / 'postgres'}", setting)
    return bindir


def _sharedir(bindir: Path) -> Path | None:
    try:
        out = subprocess.run(
            [str(bindir / "pg_config"), "--sharedir"],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return Path(out) if out else None


def server_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment of initdb and the server: without the user's PG* client settings."""
    return {k: v for k, v in env.items() if not k.startswith("PG")}


def check_data(sd: Path) -> bool:
    """Whether the data folder is made (and its password kept); one line when it is something
    else, or its password is lost. (Before anything starts: ``stores.preflight``.)"""
    data = data_dir(sd)
    if (data / "PG_VERSION").is_file():
        own_server_url(sd, 0)  # its password is there
        return True
    if data.is_dir() and any(data.iterdir()):
        raise ServiceError(
            f"postgres cannot start: {data} is neither empty nor a PostgreSQL data folder (no "
            "PG_VERSION); move it away"
        )
    return False


def initdb(
    sd: Path, bindir: Path, env: Mapping[str, str], log: Path, user: tuple[int, int] | None
) -> None:
    """Create the data folder once: ``initdb`` (role ``fedapt``, a new password, password
    authentication over TCP, UTF-8, C locale), the folder owned by whoever runs the server.
    A data folder that exists is left as it is."""
    data, home = data_dir(sd), home_dir(sd)
    if check_data(sd):
        return
    home.mkdir(parents=True, exist_ok=True)
    data.mkdir(mode=0o700, exist_ok=True)
    if user is not None:
        home.chmod(0o711)  # its user enters it (whatever the umask), and lists nothing
        check_reachable(data, user)  # the folders made just now, too
        os.chown(data, *user)
    password = secrets.token_urlsafe(24)
    tmp = password_path(sd).with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(password + "\n")
    tmp.replace(password_path(sd))
    pwfile = home / ".initdb-password"
    cmd = [
        str(bindir / "initdb"),
        "-D",
        str(data),
        f"--username={PG_USER}",
        f"--pwfile={pwfile}",  # never an argument: a command line is everyone's to read
        "--auth-host=scram-sha-256",
        "--auth-local=peer",
        "--encoding=UTF8",
        "--no-locale",
        "--no-instructions",
    ]
    as_user: dict[str, Any] = {}
    if user is not None:
        as_user = {"user": user[0], "group": user[1], "extra_groups": []}
    log.parent.mkdir(parents=True, exist_ok=True)
    with _pwfile(pwfile, password, user), open(log, "ab") as fh:
        fh.write(f"\n=== fedapt: initdb {data}\n".encode())
        fh.flush()
        try:
            done = subprocess.run(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=fh,
                stderr=subprocess.STDOUT,
                env=server_env(env),
                cwd=home,
                timeout=300,
                check=False,
                **as_user,
            )
            code: int | str = done.returncode
        except (OSError, subprocess.SubprocessError) as exc:
            code = type(exc).__name__
    if code != 0:
        shutil.rmtree(data, ignore_errors=True)
        last = last_log_line(log)
        tail = f" (last log line: {last})" if last else ""
        raise ServiceError(f"postgres: initdb of {data} failed ({code}); see {log}{tail}")


@contextlib.contextmanager
def _pwfile(path: Path, password: str, user: tuple[int, int] | None) -> Iterator[None]:
    """The password in a file only initdb's user may read (mode 0600), for initdb's
    --pwfile, removed afterwards. (A pipe on its standard input is not one: a pipe made by
    root is root's, and initdb opens /dev/stdin anew.)"""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(password + "\n")
        if user is not None:
            os.chown(path, *user)
        yield
    finally:
        path.unlink(missing_ok=True)


def server_cmd(sd: Path, bindir: Path, port: int) -> list[str]:
    """The server on 127.0.0.1:``port`` only, no Unix socket (Debian's default folder,
    /var/run/postgresql, is the system server's), logging to its standard error (the log)."""
    return [
        str(bindir / "postgres"),
        "-D",
        str(data_dir(sd)),
        "-p",
        str(port),
        "-c",
        f"listen_addresses={HOST}",
        "-c",
        "unix_socket_directories=",
        "-c",
        "logging_collector=off",
    ]
