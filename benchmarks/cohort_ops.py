"""What a GPU would wait on, counted on the CPU: ATen calls and host reads per cohort round.

The GPU round is host-bound when it launches too many kernels or reads values back: on CUDA
every ATen call is a launch (or more), every ``aten::_local_scalar_dense`` (``.item()``,
``float(t)``, ``int(t)``, ``bool(t)``) a wait for the device. Both counts are properties of the
code path, not of the device, so a CPU ``torch.profiler`` trace counts them here.

Workload (issue 31's proxy): one cohort round of 50 clients x 50 FashionMNIST images
(``cifar_cnn`` for 1x28x28, B=10, E=1: 5 local steps), FedAvg, no evaluation, engine cohort.
A run of 1 and a run of 2 rounds are profiled, each in full; the difference is one round with
everything a round does (sampling, training, uploads, aggregation), without the set-up. Also
the median CPU seconds of the timed rounds (``--rounds``, after one warm-up round).

Run:  .venv/bin/python benchmarks/cohort_ops.py   (writes benchmarks/results/cohort_ops.json)
"""

from __future__ import annotations

import argparse
import collections
import functools
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CLIENTS, PER_CLIENT, COHORT, BATCH = 1000, 50, 50, 10


def simulation(rounds: int, callbacks=(), algorithm: str = "fedavg"):  # type: ignore[no-untyped-def]
    import numpy as np

    from fedcore.algorithms import build_algorithm
    from fedcore.client import ImageData, LocalConfig
    from fedcore.datasets import load_dataset
    from fedcore.engine import FederationConfig, Simulation
    from fedcore.schedules import LRSchedule
    from models import get_model

    tr = load_dataset("fashion_mnist", ROOT / "data/raw", "train", download=False)
    rng = np.random.default_rng(0)
    rows = rng.permutation(len(tr.labels))[: CLIENTS * PER_CLIENT]
    train = ImageData(tr.images, tr.labels, tr.info.mean, tr.info.std)
    return Simulation(
        model_fn=functools.partial(
            get_model, "cifar_cnn", num_classes=10, in_channels=1, input_size=28
        ),
        algorithm=build_algorithm(algorithm),
        train=train,
        test=train,  # never evaluated (eval_every=0)
        shards=np.array_split(rows, CLIENTS),
        local=LocalConfig(batch_size=BATCH),
        lr_schedule=LRSchedule(lr=0.1),
        federation=FederationConfig(rounds=rounds, clients_per_round=COHORT, eval_every=0),
        workers=0,
        engine="cohort",
        callbacks=list(callbacks),
    )


def count(rounds: int, algorithm: str) -> collections.Counter:
    sim = simulation(rounds, algorithm=algorithm)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        sim.run()
    return collections.Counter(e.name for e in prof.events() if e.name.startswith("aten::"))


def seconds_per_round(rounds: int) -> list[float]:
    from fedcore.events import Callback

    class Clock(Callback):
        def __init__(self) -> None:
            self.t0, self.times = 0.0, []

        def on_round_start(self, r, clients, lr) -> None:  # type: ignore[no-untyped-def]
            self.t0 = time.process_time()

        def on_round_end(self, record) -> None:  # type: ignore[no-untyped-def]
            self.times.append(time.process_time() - self.t0)

    clock = Clock()
    simulation(rounds + 1, [clock]).run()
    return clock.times[1:]  # the first round warms up


def main() -> None:
    from benchmarks.engine_throughput import save_result

    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds (after one warm-up)")
    ap.add_argument("--algorithms", default="fedavg,fednova,fedadam")
    ap.add_argument("--name", default="cohort_ops")
    a = ap.parse_args()
    steps = PER_CLIENT // BATCH
    out: dict = {
        "workload": f"{COHORT} clients x {PER_CLIENT} FashionMNIST images, cifar_cnn, "
        f"B={BATCH}, {steps} local steps, no evaluation, engine cohort",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }
    for alg in a.algorithms.split(","):
        one, two = count(1, alg), count(2, alg)
        diff = two - one
        calls = sum(diff.values())
        out[alg] = {
            "aten_calls_per_round": calls,
            "aten_calls_per_local_step": round(calls / steps, 1),
            "scalar_reads_per_round": diff["aten::_local_scalar_dense"],
            "top_ops": dict(diff.most_common(15)),
        }
        print(f"{alg}: {calls} aten calls per round ({calls / steps:.0f} per local step), "
              f"{diff['aten::_local_scalar_dense']} scalar reads", flush=True)  # fmt: skip
    times = seconds_per_round(a.rounds)
    out["cpu_seconds_per_round"] = {"median": statistics.median(times), "all": times}
    print(f"fedavg: {statistics.median(times):.2f} CPU s per round (median of {a.rounds})")
    save_result(a.name, out)


if __name__ == "__main__":
    main()
