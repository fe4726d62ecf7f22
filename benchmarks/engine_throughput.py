"""Engine overhead and memory, measured (not a timed test).

1. Throughput: the engine's client training (sampling, download/upload serialization,
   aggregation, events) against a bare PyTorch loop doing the same work -- same model
   (cifar_cnn), same FashionMNIST batches in the same order, same single thread -- in this
   process. Reported as samples/s and the engine's overhead in percent.
2. Memory: peak RSS of a fresh process simulating 100 clients (all participating) against
   a fresh process training one model on the same data.

Run:  .venv/bin/python benchmarks/engine_throughput.py  (or `make bench`); writes
benchmarks/results/engine_throughput.json.
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fedcore.algorithms import FedAvg  # noqa: E402
from fedcore.client import ImageData, LocalConfig, batch_order  # noqa: E402
from fedcore.datasets import load_dataset  # noqa: E402
from fedcore.engine import FederationConfig, Simulation, derive_seed  # noqa: E402
from fedcore.events import Callback  # noqa: E402
from fedcore.schedules import LRSchedule  # noqa: E402
from models import get_model  # noqa: E402

LR, MOMENTUM, WD, BATCH = 0.05, 0.9, 5e-4, 32


def fmnist() -> ImageData:
    ds = load_dataset("fashion_mnist", ROOT / "data/raw", "train", download=False)
    return ImageData(ds.images, ds.labels, ds.info.mean, ds.info.std)


MODEL_FN = functools.partial(get_model, "cifar_cnn", num_classes=10, in_channels=1, input_size=28)


class _Clock(Callback):
    def __init__(self) -> None:
        self.train_seconds = 0.0

    def on_client_end(self, record) -> None:  # type: ignore[no-untyped-def]
        self.train_seconds += record.seconds


def engine_run(data: ImageData, shards: list[np.ndarray], rounds: int, workers: int) -> dict:
    clock = _Clock()
    sim = Simulation(
        model_fn=MODEL_FN,
        algorithm=FedAvg(),
        train=data,
        test=data,
        shards=shards,
        local=LocalConfig(batch_size=BATCH, momentum=MOMENTUM, weight_decay=WD),
        lr_schedule=LRSchedule(lr=LR),
        federation=FederationConfig(rounds=rounds, clients_per_round=len(shards), eval_every=0),
        workers=workers,
        callbacks=[clock],
    )
    init = {k: v.clone() for k, v in sim.global_state.items()}
    t0 = time.perf_counter()
    hist = sim.run()
    wall = time.perf_counter() - t0
    return {"wall": wall, "client_seconds": clock.train_seconds, "init": init, "history": hist}


def bare_client(model, state, data, shard, cfg, make_opt, round_, client) -> dict:  # type: ignore[no-untyped-def]
    """One client's local epoch the hand-written way: module + torch optimizer, the engine's
    batch order for (round, client); returns the trained state dict."""
    model.load_state_dict(state)
    model.train()
    opt = make_opt(model.parameters())
    gen = torch.Generator().manual_seed(derive_seed(0, 2, round_, client, client))
    idx = torch.as_tensor(shard)
    for pos in batch_order(len(idx), cfg, gen):
        x, y = data.batch(idx[pos], generator=gen)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def bare_run(data: ImageData, shards: list[np.ndarray], rounds: int, init: dict) -> float:
    """What a hand-written loop does for the same clients: no serialization, no events."""
    model = MODEL_FN()
    cfg = LocalConfig(batch_size=BATCH, momentum=MOMENTUM, weight_decay=WD)
    state = {k: v.clone() for k, v in init.items()}
    t0 = time.perf_counter()
    for r in range(1, rounds + 1):
        states, sizes = [], []
        for c, shard in enumerate(shards):
            opt = functools.partial(torch.optim.SGD, lr=LR, momentum=MOMENTUM, weight_decay=WD)
            states.append(bare_client(model, state, data, shard, cfg, opt, r, c))
            sizes.append(len(shard))
        w = [s / sum(sizes) for s in sizes]
        state = {
            k: (sum(wi * s[k].double() for wi, s in zip(w, states, strict=True))).to(v.dtype)
            if v.is_floating_point()
            else v
            for k, v in states[0].items()
        }
    return time.perf_counter() - t0


def peak_rss_child(mode: str, clients: int, samples: int) -> float:
    """Peak RSS (MiB) of a fresh process running one scenario."""
    code = f"""
import sys, resource, numpy as np
sys.path.insert(0, {str(ROOT)!r})
sys.argv = ['x']
from benchmarks.engine_throughput import fmnist, engine_run, bare_run, MODEL_FN
data = fmnist()
idx = np.arange({samples})
if {mode!r} == 'engine':
    engine_run(data, np.array_split(idx, {clients}), 1, 0)
else:
    bare_run(data, [idx], 1, MODEL_FN().state_dict())
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


class RoundClock(Callback):
    """An engine callback keeping each round's wall seconds; set ``t`` just before
    ``Simulation.run``."""

    def __init__(self) -> None:
        self.t = time.perf_counter()
        self.times: list[float] = []

    def on_round_end(self, record) -> None:  # type: ignore[no-untyped-def]
        now = time.perf_counter()
        self.times.append(now - self.t)
        self.t = now


def save_result(name: str, res: dict) -> None:
    """Write benchmarks/results/<name>.json and print it."""
    out = ROOT / f"benchmarks/results/{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res, indent=2))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--samples", type=int, default=6000, help="training samples over all clients")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--skip-memory", action="store_true")
    args = ap.parse_args()

    torch.set_num_threads(1)  # the engine's clients are single-threaded; compare like with like
    data = fmnist()
    shards = np.array_split(np.arange(args.samples), args.clients)
    seen = args.samples * args.rounds

    bare_run(data, shards[:1], 1, MODEL_FN().state_dict())  # warm-up (allocator, kernels)
    eng = engine_run(data, shards, args.rounds, workers=0)
    bare = bare_run(data, shards, args.rounds, eng["init"])
    eng2 = engine_run(data, shards, args.rounds, workers=2)
    res = {
        "machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} thread(s) per client",
        "torch": torch.__version__,
        "model": "cifar_cnn on FashionMNIST 1x28x28, batch 32, SGD m=0.9",
        "clients": args.clients,
        "rounds": args.rounds,
        "samples_trained": seen,
        "bare_loop_samples_per_s": seen / bare,
        "engine_samples_per_s": seen / eng["wall"],
        "engine_overhead_percent": 100 * (eng["wall"] / bare - 1),
        "engine_2_workers_samples_per_s": seen / eng2["wall"],
        "engine_2_workers_note": "includes spawning 2 worker processes",
    }
    if not args.skip_memory:
        one = peak_rss_child("bare", 1, 12000)
        hundred = peak_rss_child("engine", 100, 12000)
        res.update(
            {
                "peak_rss_one_model_mib": one,
                "peak_rss_100_clients_mib": hundred,
                "rss_ratio_100_clients_vs_one": hundred / one,
            }
        )
    save_result("engine_throughput", res)


if __name__ == "__main__":
    main()
