"""What portable numerics cost (fedcore/numerics.py), measured in one run, interleaved.

Each workload runs in a fresh process per repeat, portable and native in turn (P N P N ...),
and the median of each is reported with their ratio:

* ``w1-sequential`` and ``w1-cohort``: workload W1 of benchmarks/w1.py (FashionMNIST, 10
  clients x 1,000 IID images, the seed-004 CNN, FedAvg, E=1, B=32, 5 rounds), through
  ``fedcore.Simulation``; its median round (rounds 2-5) and the whole process.
* ``default``: the default experiment of params.yaml as the DVC train stage runs it
  (``fedapt train --algorithm fedavg``: 12,000 images over 10 Dir(0.5) clients, evaluated on
  the 10k test split), shortened to ``--rounds`` rounds; the whole process.

Then the kernels: one W1 training step (batch 32, one thread, as a client worker runs it)
under torch.profiler in each mode, the operators with the most self CPU time, so the table
says which kernels got slower. And this CPU's sgemm peak in each mode (MKL's COMPATIBLE
branch is SSE2 code).

Run:  .venv/bin/python benchmarks/numerics.py [--repeats 3] [--rounds 3]
      (writes benchmarks/results/numerics.json; docs/numerics.md reports it)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
MODES = ("portable", "native")


def _env(mode: str) -> dict[str, str]:
    from fedcore import numerics

    env = {k: v for k, v in os.environ.items() if k not in numerics.PORTABLE_ENV}
    env.pop(numerics.MODE_VAR, None)
    env.pop(numerics.THREADS_VAR, None)
    env["BENCH_NUMERICS"] = mode
    env["PYTHONPATH"] = str(ROOT)
    return env


def _run(cmd: list[str], mode: str, cwd: Path = ROOT) -> tuple[float, str]:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=cwd, env=_env(mode), capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} ({mode}) failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return wall, r.stdout


def child_w1(runner: str) -> None:
    """One W1 runner in this process, in the mode of BENCH_NUMERICS."""
    from fedcore import numerics

    numerics.apply(os.environ["BENCH_NUMERICS"])
    from benchmarks import w1

    w1.child(runner)


def child_kernels() -> None:
    """Self CPU time per operator of a W1 training step (batch 32, one thread)."""
    from fedcore import numerics

    numerics.apply(os.environ["BENCH_NUMERICS"], 1)
    import torch
    from torch.profiler import ProfilerActivity, profile

    from benchmarks import w1

    _, _, _, model_fn = w1._setup()
    torch.manual_seed(0)
    model = model_fn()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(w1.BATCH, 1, 28, 28), torch.randint(0, 10, (w1.BATCH,))

    def step() -> None:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    for _ in range(5):
        step()
    steps = 40
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    wall = time.perf_counter() - t0
    ops = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    table = {e.key: round(e.self_cpu_time_total / steps / 1e3, 3) for e in ops[:12]}
    peak = w1.matmul_peak(threads=1)
    print(
        "KERNELS "
        + json.dumps(
            {"ms_per_step": wall / steps * 1e3, "self_ms": table, "sgemm_gflops_1thread": peak}
        )
    )


def _w1(runner: str, mode: str) -> dict:
    wall, out = _run([sys.executable, __file__, "--child-w1", runner], mode)
    line = next(ln for ln in out.splitlines() if ln.startswith("W1-RESULT "))
    res = json.loads(line.removeprefix("W1-RESULT "))
    return {
        "wall": wall,
        "round": statistics.median(res["round_seconds"][1:]),
        "accuracy": res["accuracy"][-1],
    }


def _default(mode: str, rounds: int, work: Path) -> dict:
    sets = [
        f"federation.rounds={rounds}",
        "runtime.tracking=false",
        f"runtime.numerics={mode}",
        f"data.root={ROOT / 'data/raw'}",
    ]
    args = [a for s in sets for a in ("--set", s)]
    part = work / "part"
    if not part.exists():
        fedapt = [sys.executable, "-m", "flows.cli"]
        _run(
            [
                *fedapt,
                "partition",
                "--params",
                str(ROOT / "params.yaml"),
                "--out",
                str(part),
                *args,
            ],
            mode,
            work,
        )
        _run(
            [
                *fedapt,
                "validate",
                "--params",
                str(ROOT / "params.yaml"),
                "--partition",
                str(part),
                *args,
            ],
            mode,
            work,
        )
    out = work / f"run-{mode}"
    cmd = [
        sys.executable,
        "-m",
        "flows.cli",
        "train",
        "--params",
        str(ROOT / "params.yaml"),
        "--algorithm",
        "fedavg",
        "--partition",
        str(part),
        "--out",
        str(out),
        "--timing",
        str(work / f"timing-{mode}"),
        *args,
    ]
    wall, _ = _run(cmd, mode, work)
    metrics = json.loads((out / "metrics.json").read_text())
    return {"wall": wall, "accuracy": metrics["final_accuracy"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the default experiment")
    ap.add_argument("--workloads", default="w1-sequential,w1-cohort,default,kernels")
    ap.add_argument("--child-w1")
    ap.add_argument("--child-kernels", action="store_true")
    args = ap.parse_args()
    if args.child_w1:
        return child_w1(args.child_w1)
    if args.child_kernels:
        return child_kernels()
    wanted = args.workloads.split(",")
    samples: dict[str, dict[str, list[dict]]] = {}
    with tempfile.TemporaryDirectory(prefix="fedapt-numerics-") as tmp:
        for rep in range(args.repeats):
            for mode in MODES if rep % 2 == 0 else MODES[::-1]:
                for w in wanted:
                    if w == "kernels":
                        continue
                    if w.startswith("w1-"):
                        res = _w1(w.removeprefix("w1-"), mode)
                    else:
                        res = _default(mode, args.rounds, Path(tmp))
                    samples.setdefault(w, {}).setdefault(mode, []).append(res)
                    print(f"{w} {mode} #{rep}: {json.dumps(res)}", flush=True)
    report: dict = {
        "machine": platform.processor() or platform.machine(),
        "repeats": args.repeats,
        "rounds_default": args.rounds,
        "workloads": {},
    }
    from fedcore.numerics import cpu_isa, cpu_model

    report["cpu"], report["cpu_isa"] = cpu_model(), cpu_isa()
    for w, by_mode in samples.items():
        med = {
            m: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for m, rs in by_mode.items()
        }
        ratio = {
            k: med["portable"][k] / med["native"][k]
            for k in ("wall", "round")
            if k in med["native"]
        }
        report["workloads"][w] = {"median": med, "portable_over_native": ratio}
        print(f"{w}: " + ", ".join(f"{k} x{v:.2f}" for k, v in ratio.items()), flush=True)
    if "kernels" in wanted:
        for mode in MODES:
            _, out = _run([sys.executable, __file__, "--child-kernels"], mode)
            line = next(ln for ln in out.splitlines() if ln.startswith("KERNELS "))
            report.setdefault("kernels", {})[mode] = json.loads(line.removeprefix("KERNELS "))
            print(f"kernels {mode}: {line}", flush=True)
    path = ROOT / "benchmarks/results/numerics.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
