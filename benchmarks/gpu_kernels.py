"""Kernel choices for the cohort step of the pfl-research shape, measured (the GPU issue's
items 1 and 2: CUDA graphs, and convolutions that keep determinism).

One local step of a cohort: 50 clients, B = 10 images of 3x32x32 each, the 1.6M-parameter
:class:`benchmarks.cohort_cpu.PflCNN`, cross-entropy, SGD lr 0.1 (``p.add_(g, alpha=-lr)``,
the engine's update). Every variant starts from the same stacked parameters and steps on the
same batches. Variants:

=============  ==============================================================================
strict         ``vmap(grad_and_value(loss))`` under ``fedcore.device.deterministic`` (what the
               cohort engine runs on CUDA: cuDNN deterministic, no autotuning, no TF32)
graph          strict, captured once in a CUDA graph (static inputs) and replayed
graph_tf32     graph under tf32's settings
bench          strict + ``cudnn.benchmark`` (autotuned among deterministic algorithms)
tf32           strict + TF32 for matrix products and convolutions
grouped        no vmap: the clients folded into channels, ``conv2d(groups=n)`` and ``bmm``,
               autograd of the summed client losses (each client's gradient its own)
grouped_cl     grouped, activations and weights channels-last
im2col         no vmap: convolutions as ``unfold`` + ``bmm`` (matrix products only)
fast           vmap, cuDNN non-deterministic with autotuning, TF32 on
=============  ==============================================================================

Per variant: the median and minimum step time over ``--steps`` steps (CUDA events around
each step), the host's time to issue a step (no wait), and, after ``--check`` steps from the
start: the sha256 of the parameters, the largest difference to strict's, whether a second
pass from the start gives the same bits, and any determinism warning PyTorch raised.

GPU:    python3 benchmarks/gpu_kernels.py --device cuda --out $OUT   (about 1 min)
Smoke:  .venv/bin/python benchmarks/gpu_kernels.py --device cpu --clients 4 --batch 2
        --steps 3 --check 2 --out /tmp/gk   (the variants a CPU has: strict, grouped,
        grouped_cl, im2col)
Writes OUT/gpu_kernels.json.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.cohort_cpu import PflCNN  # noqa: E402
from benchmarks.gpu_steps import Params, manual_step, vmap_step  # noqa: E402
from fedcore.device import deterministic  # noqa: E402

CUDA_ONLY = ("graph", "graph_tf32", "bench", "tf32", "fast")
VARIANTS = (
    "strict", "graph", "graph_tf32", "bench", "tf32", "grouped", "grouped_cl", "im2col", "fast"
)  # fmt: skip


@contextlib.contextmanager
def settings(variant: str, device: str) -> Iterator[None]:
    """The variant's CUDA settings on top of fedcore's deterministic ones."""
    if variant == "fast":
        cudnn, mm = torch.backends.cudnn, torch.backends.cuda.matmul
        saved = (cudnn.deterministic, cudnn.benchmark, cudnn.allow_tf32, mm.allow_tf32)
        cudnn.deterministic, cudnn.benchmark = False, True
        cudnn.allow_tf32 = mm.allow_tf32 = True
        try:
            yield
        finally:
            cudnn.deterministic, cudnn.benchmark, cudnn.allow_tf32, mm.allow_tf32 = saved
        return
    with deterministic(device):
        if variant == "bench":
            torch.backends.cudnn.benchmark = True
        if variant in ("tf32", "graph_tf32"):
            torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = True
        yield


def start_params(n: int, device: str) -> Params:
    """Every client starts from one model (as a cohort does: the global model), stacked."""
    torch.manual_seed(0)
    model = PflCNN()
    return {
        k: v.detach().to(device).unsqueeze(0).expand(n, *v.shape).contiguous()
        for k, v in model.named_parameters()
    }


def batches(n: int, b: int, count: int, device: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [
        (
            torch.randn(n, b, 3, 32, 32, generator=g).to(device),
            torch.randint(0, 10, (n, b), generator=g).to(device),
        )
        for _ in range(count)
    ]


def sha(P: Params) -> str:
    h = hashlib.sha256()
    for k in sorted(P):
        v = P[k].detach().contiguous().cpu()
        h.update(k.encode())
        h.update(v.numpy().tobytes())
    return h.hexdigest()[:16]


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


class Graphed:
    """``step`` captured once in a CUDA graph over static parameters and batch buffers;
    each call copies its batch into the buffers and replays."""

    def __init__(self, step, P: Params, x: torch.Tensor, y: torch.Tensor) -> None:  # type: ignore[no-untyped-def]
        self.P, self.x, self.y = P, x.clone(), y.clone()
        saved = {k: v.clone() for k, v in P.items()}
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):  # warm-up outside the graph (workspaces, lazy inits)
                step(self.P, self.x, self.y)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.loss = step(self.P, self.x, self.y)
        for k, v in saved.items():  # warm-up and capture stepped: back to the start
            self.P[k].copy_(v)

    def __call__(self, P: Params, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        assert P is self.P
        self.x.copy_(x)
        self.y.copy_(y)
        self.graph.replay()
        return self.loss


def timed(
    device: str, count: int, call: Callable[[int], object]
) -> tuple[list[float], list[float]]:
    """``call(i)`` for i < count: each call's milliseconds (CUDA events on a GPU, the wall
    clock on a CPU) and, on a GPU, the host's milliseconds to issue it (no wait)."""
    events, issue, wall = [], [], []
    for i in range(count):
        if device.startswith("cuda"):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            h0 = time.perf_counter()
            a.record()
            call(i)
            b.record()
            issue.append((time.perf_counter() - h0) * 1e3)
            events.append((a, b))
        else:
            h0 = time.perf_counter()
            call(i)
            wall.append((time.perf_counter() - h0) * 1e3)
    sync(device)
    return ([a.elapsed_time(b) for a, b in events] if events else wall), issue


def kernel_table(step, P: Params, data, path: Path) -> dict:  # type: ignore[no-untyped-def]
    """Ten steps under torch.profiler: the kernels' summed device time per step and the top
    kernels, written to ``path``."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(10):
            step(P, *data[i % len(data)])
        torch.cuda.synchronize()
    ka = prof.key_averages()
    path.write_text(
        ka.table(sort_by="self_device_time_total", row_limit=15, max_name_column_width=90)
    )
    kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
    total_us = sum(e.device_time for e in kernels)
    return {
        "kernel_ms_per_step": round(total_us / 10 / 1e3, 3),
        "kernels_per_step": len(kernels) / 10,
    }


def measure(variant: str, args: argparse.Namespace, data, reference: str | None) -> dict:  # type: ignore[no-untyped-def]
    device = args.device
    res: dict = {"variant": variant}
    with warnings.catch_warnings(record=True) as caught, settings(variant, device):
        warnings.simplefilter("always")
        model = PflCNN().to(device)
        base = start_params(args.clients, device)
        if variant in ("grouped", "grouped_cl", "im2col"):
            step = manual_step(variant)
        else:
            step = vmap_step(model)
        P = {k: v.clone() for k, v in base.items()}
        t0 = time.perf_counter()
        if variant.startswith("graph"):
            step = Graphed(step, P, *data[0])
        res["setup_s"] = round(time.perf_counter() - t0, 3)

        def run_from_start() -> tuple[str, Params]:
            for k, v in base.items():
                P[k].copy_(v)
            for x, y in data[: args.check]:
                step(P, x, y)
            sync(device)
            return sha(P), {k: v.clone() for k, v in P.items()}

        for x, y in data[:3]:  # warm-up (autotuning, workspaces)
            step(P, x, y)
        sync(device)
        h1, p1 = run_from_start()
        h2, _ = run_from_start()
        res["sha"], res["repeat_identical"] = h1, h1 == h2
        if reference is not None:
            ref = torch.load(reference, weights_only=True)
            res["max_abs_diff_vs_strict"] = max(
                float((p1[k].cpu() - ref[k]).abs().max()) for k in ref
            )
            res["identical_to_strict"] = all(torch.equal(p1[k].cpu(), ref[k]) for k in ref)
        else:
            torch.save({k: v.cpu() for k, v in p1.items()}, args.reference)
        # timing
        ms, issue = timed(device, args.steps, lambda i: step(P, *data[i % len(data)]))
        res["median_step_ms"] = round(statistics.median(ms), 3)
        if args.profile and device.startswith("cuda") and not variant.startswith("graph"):
            res["kernels"] = kernel_table(step, P, data, Path(args.out) / f"kernels_{variant}.txt")
        res["min_step_ms"] = round(min(ms), 3)
        if issue:
            res["median_issue_ms"] = round(statistics.median(issue), 3)
    res["warnings"] = sorted({str(w.message)[:160] for w in caught})[:5]
    return res


def measure_round(variant: str, args: argparse.Namespace) -> dict:
    """One whole cohort round of the pfl shape on the device: the global model broadcast to
    the clients, per step a gather of each client's batch from device-resident uint8 images
    (converted and normalised there, as ``ImageData.batch`` does), the vmapped step and SGD,
    then FedAvg's sample-weighted mean of the clients' models. ``round_eager`` runs it as
    the engine does today (less its bookkeeping and read-back); ``round_graph`` captures it
    in one CUDA graph over static index buffers and replays it. Times and bits as above."""
    device, n, b, steps = args.device, args.clients, args.batch, 5
    res: dict = {"variant": variant, "steps_per_round": steps}
    tf32 = variant.endswith("tf32")
    with settings("tf32" if tf32 else "strict", device):
        g = torch.Generator().manual_seed(2)
        images = torch.randint(
            0, 256, (n * b * steps * 4, 3, 32, 32), generator=g, dtype=torch.uint8
        )
        labels = torch.randint(0, 10, (len(images),), generator=g)
        images, labels = images.to(device), labels.to(device)
        mean = torch.tensor([0.49, 0.48, 0.45], device=device).view(1, 3, 1, 1)
        std = torch.tensor([0.25, 0.24, 0.26], device=device).view(1, 3, 1, 1)
        model = PflCNN().to(device)
        step = vmap_step(model)
        glob = {k: v[0].clone() for k, v in start_params(n, device).items()}
        P = {k: v.unsqueeze(0).expand(n, *v.shape).clone() for k, v in glob.items()}
        idx = torch.zeros(steps, n * b, dtype=torch.int64, device=device)
        weights = torch.full((n,), 1.0 / n, dtype=torch.float64, device=device)

        def one_round() -> None:
            for k, v in glob.items():
                P[k].copy_(v.unsqueeze(0).expand_as(P[k]))
            for s in range(steps):
                x = images.index_select(0, idx[s]).to(torch.float32).div_(255.0)
                x = ((x - mean) / std).view(n, b, 3, 32, 32)
                y = labels.index_select(0, idx[s]).view(n, b)
                step(P, x, y)
            with torch.no_grad():
                for k, v in glob.items():  # FedAvg in float64, as fedcore.aggregate does
                    w = weights.view(-1, *([1] * v.dim()))
                    v.copy_((P[k].to(torch.float64) * w).sum(0).to(v.dtype))

        plans = [
            torch.randint(0, len(images), (steps, n * b), generator=g).to(device) for _ in range(6)
        ]
        start = {k: v.clone() for k, v in glob.items()}
        run = one_round
        if variant.startswith("round_graph"):
            idx.copy_(plans[0])
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    one_round()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                one_round()
            run = graph.replay

        def from_start(count: int) -> str:
            for k, v in start.items():
                glob[k].copy_(v)
            for r in range(count):
                idx.copy_(plans[r % len(plans)])
                run()
            sync(device)
            return sha(glob)

        h1, h2 = from_start(3), from_start(3)
        res["sha_3_rounds"], res["repeat_identical"] = h1, h1 == h2

        def one(r: int) -> None:
            idx.copy_(plans[r % len(plans)])
            run()

        ms, issue = timed(device, args.rounds, one)
        res["median_round_ms"] = round(statistics.median(ms), 3)
        res["min_round_ms"] = round(min(ms), 3)
        if issue:
            res["median_issue_ms"] = round(statistics.median(issue), 3)
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--batch", type=int, default=10)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--check", type=int, default=5)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--profile", action="store_true", help="kernel tables of the eager variants")
    ap.add_argument("--rounds", type=int, default=0, help="also time whole rounds (round_*)")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/gpu_kernels"))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    args.reference = str(out / "strict_params.pt")
    cuda = args.device.startswith("cuda")
    wanted = [v for v in args.variants.split(",") if cuda or v not in CUDA_ONLY]
    if wanted[0] != "strict":
        wanted.insert(0, "strict")
    data = batches(args.clients, args.batch, max(args.check, 3), args.device)
    env = {
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "clients": args.clients,
        "batch": args.batch,
        "steps": args.steps,
        "check_steps": args.check,
    }
    rounds = ("round_eager", "round_graph", "round_graph_tf32") if cuda else ("round_eager",)
    results = []
    for v in [*dict.fromkeys(wanted), *(rounds if args.rounds else ())]:
        try:
            if v.startswith("round_"):
                r = measure_round(v, args)
            else:
                r = measure(v, args, data, None if v == "strict" else args.reference)
        except Exception as e:  # noqa: BLE001 - a variant that fails is a result too
            r = {"variant": v, "error": f"{type(e).__name__}: {str(e)[:300]}"}
        results.append(r)
        print(json.dumps(r), flush=True)
        (out / "gpu_kernels.json").write_text(
            json.dumps({"env": env, "results": results}, indent=1)
        )
    Path(args.reference).unlink(missing_ok=True)


if __name__ == "__main__":
    main()
