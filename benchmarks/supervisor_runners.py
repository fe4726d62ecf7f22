"""Helpers and the four runners of benchmarks/supervisors.py (fedapt, supervisord, honcho,
circus): each starts and stops the same service commands."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flows.services import config as svc_config  # noqa: E402
from flows.services.commands import command  # noqa: E402
from flows.services.ports import health_url  # noqa: E402

SERVICES = svc_config.SERVICES
PY = str(ROOT / ".venv" / "bin" / "python")
TAG = "FEDAPT_SUPBENCH_TAG"
START_LIMIT = 120.0
STOP_LIMIT = 40.0
CRASH_WINDOW = 60.0  # seconds to wait for a restarted MLflow
FEDAPT_CRASH_WINDOW = 15.0  # fedapt restarts nothing: a short window to verify that


def probe(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1.0) as resp:
            return 200 <= resp.status < 300
    except (OSError, ValueError):
        return False


def wait_healthy(urls: dict[str, str], t0: float, limit: float) -> dict[str, float | None]:
    """Seconds (from t0) until each URL first answered; None: not within the limit."""
    first: dict[str, float | None] = dict.fromkeys(urls)
    while time.monotonic() - t0 < limit and any(v is None for v in first.values()):
        for name, url in urls.items():
            if first[name] is None and probe(url):
                first[name] = round(time.monotonic() - t0, 2)
        time.sleep(0.2)
    return first


def tagged(tag: str) -> list[psutil.Process]:
    """The live processes started by this run (the tag is in their environment)."""
    out = []
    me = os.getpid()
    for p in psutil.process_iter(["pid"]):
        if p.pid == me:
            continue
        try:
            if p.environ().get(TAG) == tag and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (psutil.Error, OSError):
            continue
    return out


def describe(p: psutil.Process) -> str:
    try:
        return f"{p.pid} {' '.join(p.cmdline())[:120]}"
    except psutil.Error:
        return str(p.pid)


def alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            continue
    return out


def mlflow_main(tag: str) -> psutil.Process | None:
    procs = tagged(tag)
    pids = {p.pid for p in procs}
    for p in procs:
        try:
            cmd = " ".join(p.cmdline())
            if "mlflow server" in cmd or cmd.endswith("/mlflow server") or "/mlflow server " in cmd:
                if p.ppid() not in pids or "mlflow server" not in " ".join(
                    psutil.Process(p.ppid()).cmdline()
                ):
                    return p
        except psutil.Error:
            continue
    return None


def timed(cmd: list[str], env: dict[str, str] | None = None, check: bool = True) -> float:
    t0 = time.monotonic()
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    if check and res.returncode != 0:
        raise RuntimeError(f"{cmd[:3]} failed ({res.returncode}): {res.stderr[-400:]}")
    return round(time.monotonic() - t0, 3)


# ----------------------------------------------------------------------------- runners


class Runner:
    name = ""

    def __init__(self, sd: Path, ports: dict[str, int], tools: Path, tag: str) -> None:
        self.sd, self.ports, self.tools, self.tag = sd, ports, tools, tag
        self.env = dict(os.environ)
        self.env[TAG] = tag
        self.env["FEDAPT_STATE_DIR"] = str(sd)
        for n, port in ports.items():
            self.env[svc_config.port_env_var(n)] = str(port)
        self.launcher: subprocess.Popen[bytes] | None = None

    def health_urls(self) -> dict[str, str]:
        return {n: health_url(n, self.ports[n]) for n in SERVICES}

    def scripts(self) -> dict[str, Path]:
        """run-<name>.sh per service: fedapt's own command, environment and cwd."""
        host = svc_config.HOST
        records = {
            "s3": {"url": f"http://{host}:{self.ports['s3']}"},
            "prefect": {"api_url": f"http://{host}:{self.ports['prefect']}/api"},
        }
        saved = dict(os.environ)
        os.environ.clear()
        os.environ.update(self.env)  # command builds the env from os.environ
        try:
            out = {}
            for n in SERVICES:
                cmd, env, cwd = command(n, self.sd, self.ports[n], records)
                assigns = " ".join(shlex.quote(f"{k}={v}") for k, v in sorted(env.items()))
                argv = " ".join(shlex.quote(str(a)) for a in cmd)
                path = self.sd / f"run-{n}.sh"
                path.write_text(
                    f"cd {shlex.quote(str(cwd))} || exit 1\nexec env -i {assigns} {argv}\n"
                )
                out[n] = path
            return out
        finally:
            os.environ.clear()
            os.environ.update(saved)

    def start(self) -> None:
        raise NotImplementedError

    def start_done(self) -> float | None:
        """For a runner whose start command blocks: seconds it took (None: not applicable)."""
        return None

    def stop(self) -> None:
        raise NotImplementedError

    def control(self) -> list[str]:
        raise NotImplementedError

    def bin(self, name: str) -> str:
        return str(self.tools / "bin" / name)

    def log(self, name: str) -> Any:
        return open(self.sd / name, "ab")  # noqa: SIM115


class Fedapt(Runner):
    name = "fedapt"

    def start(self) -> None:
        self.t0 = time.monotonic()
        code = "from flows import services; services.up()"
        with self.log("bench-up.log") as fh:
            self.launcher = subprocess.Popen(
                [PY, "-c", code], cwd=ROOT, env=self.env, stdout=fh, stderr=subprocess.STDOUT
            )

    def start_done(self) -> float | None:
        assert self.launcher is not None
        rc = self.launcher.wait(timeout=START_LIMIT)
        if rc != 0:
            raise RuntimeError(f"fedapt up failed ({rc}); see {self.sd}/bench-up.log")
        return round(time.monotonic() - self.t0, 2)

    def stop(self) -> None:
        code = "from flows import services; services.down()"
        subprocess.run([PY, "-c", code], cwd=ROOT, env=self.env, check=True, capture_output=True)

    def control(self) -> list[str]:
        return [PY, "-m", "flows.cli", "status"]

    def status(self) -> dict[str, Any]:
        code = (
            "import json; from flows import services; "
            "print(json.dumps({n: s.as_dict() for n, s in services.status().items()}))"
        )
        res = subprocess.run(
            [PY, "-c", code], cwd=ROOT, env=self.env, capture_output=True, text=True, check=True
        )
        return json.loads(res.stdout.strip().splitlines()[-1])

    def up_again(self) -> float:
        code = "from flows import services; services.up()"
        return timed([PY, "-c", code], env=self.env)


class Supervisord(Runner):
    name = "supervisord"

    def conf(self) -> Path:
        sd = self.sd
        lines = [
            "[supervisord]",
            f"logfile={sd}/supervisord.log",
            f"pidfile={sd}/supervisord.pid",
            f"childlogdir={sd}/logs",
            "[unix_http_server]",
            f"file={sd}/supervisor.sock",
            "[rpcinterface:supervisor]",
            "supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface",
            "[supervisorctl]",
            f"serverurl=unix://{sd}/supervisor.sock",
        ]
        (sd / "logs").mkdir(exist_ok=True)
        # priority: lower starts first (s3 before mlflow, prefect before the worker); it
        # orders the spawns, it does not wait for health.
        for prio, (n, script) in zip((10, 20, 10, 30), self.scripts().items(), strict=True):
            lines += [
                f"[program:{n}]",
                f"command=/bin/sh {script}",
                f"priority={prio}",
                "autostart=true",
                "autorestart=true",
                "startsecs=1",
                "startretries=30",
                "stopasgroup=true",
                "killasgroup=true",
                "stopwaitsecs=15",
                "redirect_stderr=true",
                f"stdout_logfile={sd}/logs/{n}.log",
            ]
        path = sd / "supervisord.conf"
        path.write_text("\n".join(lines).replace("%", "%%") + "\n")
        return path

    def start(self) -> None:
        path = self.conf()
        subprocess.run([self.bin("supervisord"), "-c", str(path)], env=self.env, check=True)

    def stop(self) -> None:
        ctl = [self.bin("supervisorctl"), "-c", str(self.sd / "supervisord.conf"), "shutdown"]
        subprocess.run(ctl, env=self.env, check=True, capture_output=True)

    def control(self) -> list[str]:
        return [self.bin("supervisorctl"), "-c", str(self.sd / "supervisord.conf"), "status"]


class Honcho(Runner):
    name = "honcho"

    def start(self) -> None:
        # Procfile order is start order; honcho has no dependencies and no health checks.
        procfile = self.sd / "Procfile"
        procfile.write_text("".join(f"{n}: exec /bin/sh {s}\n" for n, s in self.scripts().items()))
        with self.log("honcho.log") as fh:
            self.launcher = subprocess.Popen(
                [self.bin("honcho"), "start", "-f", str(procfile), "-d", str(self.sd)],
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=fh,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def stop(self) -> None:
        assert self.launcher is not None
        if self.launcher.poll() is None:
            self.launcher.send_signal(signal.SIGTERM)

    def control(self) -> list[str]:
        return [self.bin("honcho"), "--version"]  # honcho has no control command


class Circus(Runner):
    name = "circus"

    def endpoint(self) -> str:
        return f"ipc://{self.sd}/circus-ctl.sock"

    def start(self) -> None:
        sd = self.sd
        lines = [
            "[circus]",
            f"endpoint = {self.endpoint()}",
            f"pubsub_endpoint = ipc://{sd}/circus-pub.sock",
            "statsd = false",
            f"pidfile = {sd}/circusd.pid",
            f"logoutput = {sd}/circusd.log",
        ]
        (sd / "logs").mkdir(exist_ok=True)
        # priority: higher starts first; circus starts the next watcher without waiting.
        for prio, (n, script) in zip((40, 30, 40, 20), self.scripts().items(), strict=True):
            lines += [
                f"[watcher:{n}]",
                "cmd = /bin/sh",
                f"args = {script}",
                f"priority = {prio}",
                "stop_children = true",
                "graceful_timeout = 15",
                "max_retry = 30",
                "stdout_stream.class = FileStream",
                f"stdout_stream.filename = {sd}/logs/{n}.log",
                "stderr_stream.class = FileStream",
                f"stderr_stream.filename = {sd}/logs/{n}.log",
            ]
        path = sd / "circus.ini"
        path.write_text("\n".join(lines) + "\n")
        subprocess.run(
            [self.bin("circusd"), "--daemon", str(path)], env=self.env, check=True, cwd=sd
        )

    def stop(self) -> None:
        ctl = [self.bin("circusctl"), "--endpoint", self.endpoint(), "quit"]
        subprocess.run(ctl, env=self.env, check=True, capture_output=True)

    def control(self) -> list[str]:
        return [self.bin("circusctl"), "--endpoint", self.endpoint(), "status"]


RUNNERS: dict[str, type[Runner]] = {
    "fedapt": Fedapt,
    "supervisord": Supervisord,
    "honcho": Honcho,
    "circus": Circus,
}


# ----------------------------------------------------------------------------- one run
