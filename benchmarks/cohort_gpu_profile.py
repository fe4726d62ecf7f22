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
import collections
import gzip
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SYNC_NAMES = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")
REPO_MARKS = ("/fedcore/", "/benchmarks/", "/models/")


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


def analyze(path: Path, round_wall_s: float, prof_wall_s: float, keep: Path | None = None) -> dict:
    data = json.loads(path.read_text())
    evs = [e for e in data.get("traceEvents", []) if e.get("ph") == "X"]
    if keep is not None:  # a smaller trace to bring back: Python frames of the repo only
        small = [e for e in data.get("traceEvents", []) if e.get("cat") != "python_function"
                 or _is_repo(e.get("name", ""))]  # fmt: skip
        dst = keep / (path.stem + ".json.gz")
        with gzip.open(dst, "wt", compresslevel=6) as f:
            json.dump({**data, "traceEvents": small}, f)
        if dst.stat().st_size > 15e6:
            dst.unlink()
    cats = collections.Counter(e.get("cat", "") for e in evs)
    corr_gpu: dict = {}
    gpu = []
    for e in evs:
        c = e.get("cat", "")
        if c in ("kernel", "gpu_memcpy", "gpu_memset"):
            gpu.append(e)
            corr = (e.get("args") or {}).get("correlation")
            if corr is not None:
                corr_gpu[corr] = e
    kernels = [e for e in gpu if e.get("cat") == "kernel"]
    kernel_us = sum(float(e.get("dur", 0)) for e in kernels)
    memcpy_names = collections.Counter(e["name"] for e in gpu if e.get("cat") == "gpu_memcpy")
    memset_n = sum(1 for e in gpu if e.get("cat") == "gpu_memset")
    # union of GPU activity
    iv = sorted((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))) for e in gpu)
    busy, cur_s, cur_e = 0.0, None, None
    for s, t in iv:
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                busy += cur_e - cur_s
            cur_s, cur_e = s, t
        else:
            cur_e = max(cur_e, t)
    if cur_e is not None:
        busy += cur_e - cur_s
    span = (iv[-1][1] - iv[0][0]) if iv else 0.0
    top_kernels = collections.Counter()
    top_kernels_n = collections.Counter()
    for e in kernels:
        top_kernels[e["name"][:90]] += float(e.get("dur", 0))
        top_kernels_n[e["name"][:90]] += 1

    # CPU side: sweep each thread, innermost cpu_op and repo frames for each runtime call.
    host = [
        e
        for e in evs
        if e.get("cat")
        in ("cpu_op", "python_function", "cuda_runtime", "cuda_driver", "user_annotation")
    ]
    by_tid: dict = collections.defaultdict(list)
    for e in host:
        by_tid[(e.get("pid"), e.get("tid"))].append(e)
    runtime_n = collections.Counter()
    runtime_us = collections.Counter()
    sync_src = collections.Counter()
    d2h_src = collections.Counter()
    h2d_src = collections.Counter()
    launch_src = collections.Counter()
    malloc_src = collections.Counter()
    op_counts = collections.Counter()
    scalar_src = collections.Counter()
    for lst in by_tid.values():
        lst.sort(key=lambda e: (float(e["ts"]), -float(e.get("dur", 0))))
        stack: list = []
        for e in lst:
            ts = float(e["ts"])
            while stack and float(stack[-1]["ts"]) + float(stack[-1].get("dur", 0)) <= ts:
                stack.pop()
            cat = e.get("cat")
            name = e.get("name", "")
            if cat == "cpu_op":
                op_counts[name] += 1
                if name in ("aten::_local_scalar_dense", "aten::nonzero", "aten::is_nonzero"):
                    frames = [
                        s["name"]
                        for s in reversed(stack)
                        if s.get("cat") == "python_function" and _is_repo(s["name"])
                    ]
                    scalar_src[
                        f"{name} @ " + (" <- ".join(_short(f) for f in frames[:3]) or "-")
                    ] += 1
            if cat in ("cuda_runtime", "cuda_driver"):
                runtime_n[name] += 1
                runtime_us[name] += float(e.get("dur", 0))
                op = next((s["name"] for s in reversed(stack) if s.get("cat") == "cpu_op"), "-")
                outer_op = next((s["name"] for s in stack if s.get("cat") == "cpu_op"), "-")
                frames = [
                    s["name"]
                    for s in reversed(stack)
                    if s.get("cat") == "python_function" and _is_repo(s["name"])
                ]
                src = " <- ".join(_short(f) for f in frames[:3]) or "-"
                key = f"{outer_op}>{op} @ {src}" if outer_op != op else f"{op} @ {src}"
                if name in SYNC_NAMES:
                    sync_src[f"{name}: {key}"] += 1
                elif "Memcpy" in name:
                    g = corr_gpu.get((e.get("args") or {}).get("correlation"))
                    kind = g["name"] if g else "?"
                    if "DtoH" in kind or "Device -> Pageable" in kind or "Device -> Pinned" in kind:
                        d2h_src[f"{name}: {key}"] += 1
                    elif "HtoD" in kind:
                        h2d_src[f"{name}: {key}"] += 1
                    if name == "cudaMemcpy":  # synchronous by definition
                        sync_src[f"{name}({kind[:14]}): {key}"] += 1
                elif "Launch" in name or "launch" in name:
                    launch_src[src.split(" <- ")[0]] += 1
                elif "Malloc" in name or "Free" in name or "HostAlloc" in name:
                    malloc_src[f"{name}: {key}"] += 1
            stack.append(e)
    launches = sum(n for k, n in runtime_n.items() if "Launch" in k or "launch" in k)
    syncs = sum(runtime_n[k] for k in SYNC_NAMES)
    return {
        "event_categories": dict(cats),
        "kernels": len(kernels),
        "launch_runtime_calls": launches,
        "kernel_time_ms": kernel_us / 1e3,
        "gpu_active_union_ms": busy / 1e3,
        "gpu_span_ms": span / 1e3,
        "gpu_busy_fraction_vs_median_round": kernel_us / 1e6 / round_wall_s,
        "gpu_busy_fraction_vs_profiled_round": kernel_us / 1e6 / prof_wall_s,
        "memcpy_by_kind": dict(memcpy_names),
        "memsets": memset_n,
        "sync_calls": syncs,
        "blocking_cudaMemcpy": runtime_n.get("cudaMemcpy", 0),
        "host_wait_ms_in_syncs": sum(runtime_us[k] for k in SYNC_NAMES) / 1e3,
        "d2h_copies": sum(d2h_src.values()),
        "h2d_copies": sum(h2d_src.values()),
        "runtime_calls": dict(runtime_n.most_common()),
        "runtime_ms": {k: v / 1e3 for k, v in runtime_us.most_common(15)},
        "sync_sources": dict(sync_src.most_common(25)),
        "d2h_sources": dict(d2h_src.most_common(20)),
        "h2d_sources": dict(h2d_src.most_common(20)),
        "launch_sources": dict(launch_src.most_common(20)),
        "scalar_read_sources": dict(scalar_src.most_common(20)),
        "alloc_sources": dict(malloc_src.most_common(10)),
        "top_kernels_by_time_ms": {k: v / 1e3 for k, v in top_kernels.most_common(10)},
        "top_kernels_by_count": dict(top_kernels_n.most_common(10)),
        "aten_calls": sum(n for k, n in op_counts.items() if k.startswith("aten::")),
        "local_scalar_dense": op_counts.get("aten::_local_scalar_dense", 0),
        "top_cpu_ops_by_count": dict(op_counts.most_common(15)),
    }


def _is_repo(frame: str) -> bool:
    return any(m in "/" + frame for m in REPO_MARKS)


def _short(frame: str) -> str:
    for m in REPO_MARKS:
        i = ("/" + frame).find(m)
        if i >= 0:
            return ("/" + frame)[i + 1 :]
    return frame


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
