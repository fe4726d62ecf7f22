"""What a torch.profiler Chrome trace of a cohort round says about the host and the GPU:
kernels and launches, synchronisations and blocking copies (with the repository frames that
caused them), scalar reads, allocations and the GPU's busy fraction. Used by
``cohort_gpu_profile.py``."""

from __future__ import annotations

import collections
import gzip
import json
from pathlib import Path

SYNC_NAMES = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")
REPO_MARKS = ("/fedcore/", "/benchmarks/", "/models/")


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
