"""Issue 31 on a real GPU: the cohort round vs the sequential one, timed and profiled.

Workloads (synthetic uint8 images of the real shapes; the data is not what is measured):
* ``pfl``: pfl-research shape as benchmarks/cohort_cpu.py builds it: 1,000 clients x 50
  images (1x28x28 uint8 -> 3x32x32 via ImageData(size=32, channels=3)), 50 clients per round,
  B=10, E=1 (5 local steps), SGD lr 0.1, PflCNN (1,626,442 params), FedAvg, no evaluation.
* ``w1``: benchmarks/w1.py: 10 clients x 1,000 images 1x28x28, cifar_cnn, B=32, SGD 0.01/0.9,
  FedAvg, evaluation on 2,000 test images after every round (as W1 defines it).

Per (workload, engine), in a fresh process: ``--warmup`` rounds, ``--rounds`` timed rounds
(torch.cuda.synchronize at on_round_start and on_round_end), then one round under
torch.profiler (CPU + CUDA, with_stack). From the profiler's chrome trace: kernels, launches,
host syncs, memcpys by direction, each attributed to the innermost cpu op and repo frames.

Run (GPU machine):  python3 benchmarks/cohort_gpu_profile.py --out $OUT
Local smoke test:   .venv/bin/python benchmarks/cohort_gpu_profile.py --device cpu --warmup 1 --rounds 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.trace_analysis import analyze  # noqa: E402


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def build(workload: str, device: str):  # type: ignore[no-untyped-def]
    import functools

    import numpy as np
    import torch

    from fedcore.client import ImageData, LocalConfig
    from fedcore.schedules import LRSchedule

    g = torch.Generator().manual_seed(0)
    rng = np.random.default_rng(0)
    if workload == "pfl":
        from benchmarks.cohort_cpu import PflCNN

        n = 1000 * 50
        images = torch.randint(0, 256, (n, 1, 28, 28), generator=g, dtype=torch.uint8)
        labels = torch.randint(0, 10, (n,), generator=g)
        mean, std = (0.2860,) * 3, (0.3530,) * 3
        train = ImageData(images, labels, mean, std, size=32, channels=3)
        test = ImageData(images[:1000], labels[:1000], mean, std, size=32, channels=3)
        shards = np.array_split(rng.permutation(n), 1000)
        return dict(
            model_fn=PflCNN, train=train, test=test, shards=shards,
            local=LocalConfig(batch_size=10), lr_schedule=LRSchedule(lr=0.1),
            m=50, eval_every=0,
        )  # fmt: skip
    from models import get_model

    n = 10 * 1000
    images = torch.randint(0, 256, (n + 2000, 1, 28, 28), generator=g, dtype=torch.uint8)
    labels = torch.randint(0, 10, (n + 2000,), generator=g)
    mean, std = (0.2860,), (0.3530,)
    train = ImageData(images[:n], labels[:n], mean, std)
    test = ImageData(images[n:], labels[n:], mean, std)
    shards = np.array_split(rng.permutation(n), 10)
    model_fn = functools.partial(
        get_model, "cifar_cnn", num_classes=10, in_channels=1, input_size=28
    )
    return dict(
        model_fn=model_fn, train=train, test=test, shards=shards,
        local=LocalConfig(batch_size=32, momentum=0.9), lr_schedule=LRSchedule(lr=0.01),
        m=10, eval_every=1,
    )  # fmt: skip


def child(workload: str, engine: str, device: str, warmup: int, rounds: int, out: Path) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from fedcore.algorithms import FedAvg
    from fedcore.engine import FederationConfig, Simulation
    from fedcore.events import Callback

    w = build(workload, device)
    prof_round = warmup + rounds + 1
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])

    class Probe(Callback):
        def __init__(self) -> None:
            self.times: dict[int, float] = {}
            self.prof = None
            self.prof_wall = None
            self.t0 = 0.0

        def on_round_start(self, r, clients, lr) -> None:  # type: ignore[no-untyped-def]
            _sync(device)
            if r == prof_round:
                self.prof = profile(activities=acts, with_stack=True)
                self.prof.start()
            self.t0 = time.perf_counter()

        def on_round_end(self, record) -> None:  # type: ignore[no-untyped-def]
            _sync(device)
            t = time.perf_counter() - self.t0
            if record.round == prof_round:
                self.prof.stop()
                self.prof_wall = t
            else:
                self.times[record.round] = t
            print(f"  round {record.round}: {t * 1e3:.1f} ms", flush=True)

    probe = Probe()
    sim = Simulation(
        model_fn=w["model_fn"], algorithm=FedAvg(), train=w["train"], test=w["test"],
        shards=w["shards"], local=w["local"], lr_schedule=w["lr_schedule"],
        federation=FederationConfig(rounds=prof_round, clients_per_round=w["m"],
                                    eval_every=w["eval_every"]),
        workers=0, device=device, callbacks=[probe], engine=engine,
    )  # fmt: skip
    t0 = time.perf_counter()
    hist = sim.run()
    total = time.perf_counter() - t0
    timed = [probe.times[r] for r in range(warmup + 1, warmup + rounds + 1)]
    med = statistics.median(timed)
    res: dict = {
        "workload": workload,
        "engine": engine,
        "device": torch.cuda.get_device_name() if device.startswith("cuda") else "cpu",
        "torch": torch.__version__,
        "warmup_round_ms": [probe.times[r] * 1e3 for r in range(1, warmup + 1)],
        "timed_round_ms": [t * 1e3 for t in timed],
        "median_round_ms": med * 1e3,
        "min_round_ms": min(timed) * 1e3,
        "profiled_round_wall_ms": probe.prof_wall * 1e3,
        "run_total_s": total,
        "final_train_loss": hist.rounds[-1].train_loss,
    }
    prof = probe.prof
    tag = f"{workload}_{engine}"
    tables = [f"===== {tag}: {res['device']} torch {res['torch']} =====\n"]
    ka = prof.key_averages()
    for key in ("self_cuda_time_total", "self_device_time_total", "cuda_time_total"):
        try:
            tables.append(
                f"--- top 10 by {key}\n"
                + ka.table(sort_by=key, row_limit=10, max_name_column_width=70)
            )
            break
        except Exception as e:  # noqa: BLE001
            tables.append(f"(sort {key} failed: {e})\n")
    tables.append(
        "--- top 10 by self_cpu_time_total\n"
        + ka.table(sort_by="self_cpu_time_total", row_limit=10, max_name_column_width=70)
    )
    tables.append(
        "--- top 10 by cpu_time_total\n"
        + ka.table(sort_by="cpu_time_total", row_limit=10, max_name_column_width=70)
    )
    (out / f"tables_{tag}.txt").write_text("\n".join(tables))
    raw = Path(f"/tmp/trace_{tag}.json")
    prof.export_chrome_trace(str(raw))
    res["trace"] = analyze(raw, med, probe.prof_wall, out if workload == "pfl" else None)
    res["trace_mb_raw"] = raw.stat().st_size / 1e6
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--workloads", default="pfl,w1")
    ap.add_argument("--engines", default="cohort,sequential")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--w1-rounds", type=int, default=4)
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/cohort_gpu_out"))
    ap.add_argument("--child", nargs=2, metavar=("WORKLOAD", "ENGINE"))
    ap.add_argument("--timeout", type=int, default=200)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.child:
        wl, eng = a.child
        res = child(wl, eng, a.device, a.warmup, a.rounds, out)
        print("RESULT " + json.dumps(res), flush=True)
        return
    results = []
    for wl in a.workloads.split(","):
        for eng in a.engines.split(","):
            warm, rounds = (a.warmup, a.rounds) if wl == "pfl" else (2, a.w1_rounds)
            cmd = [sys.executable, __file__, "--child", wl, eng, "--device", a.device,
                   "--warmup", str(warm), "--rounds", str(rounds), "--out", str(out)]  # fmt: skip
            print(f"### {wl} {eng}", flush=True)
            t0 = time.perf_counter()
            try:
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
            except subprocess.TimeoutExpired as e:
                print(f"TIMEOUT {wl} {eng}: {(e.stdout or '')[-2000:]}", flush=True)
                results.append({"workload": wl, "engine": eng, "error": "timeout"})
                continue
            print(
                "\n".join(ln for ln in p.stdout.splitlines() if not ln.startswith("RESULT ")),
                flush=True,
            )
            line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
            if line is None:
                print(f"FAILED {wl} {eng} rc={p.returncode}\n{p.stderr[-4000:]}", flush=True)
                results.append({"workload": wl, "engine": eng, "error": p.stderr[-2000:]})
                continue
            warns = [ln for ln in p.stderr.splitlines() if "Warning" in ln]
            res = json.loads(line[len("RESULT ") :])
            res["child_wall_s"] = time.perf_counter() - t0
            res["stderr_warnings"] = sorted(set(warns))[:10]
            results.append(res)
            t = res["trace"]
            print(
                f"{wl}/{eng}: median {res['median_round_ms']:.1f} ms; kernels {t['kernels']}, "
                f"syncs {t['sync_calls']}, D2H {t['d2h_copies']}, H2D {t['h2d_copies']}, "
                f"busy {t['gpu_busy_fraction_vs_median_round']:.3f}",
                flush=True,
            )
            (out / "cohort_gpu_profile.json").write_text(json.dumps(results, indent=1))
    (out / "cohort_gpu_profile.json").write_text(json.dumps(results, indent=1))
    # the per-child tables in one file (fewer files come back)
    tabs = sorted(out.glob("tables_*.txt"))
    (out / "cohort_gpu_tables.txt").write_text("\n\n".join(p.read_text() for p in tabs))
    for p in tabs:
        p.unlink()


if __name__ == "__main__":
    main()
