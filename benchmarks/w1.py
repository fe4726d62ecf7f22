"""Workload W1, side by side (issue: the cohort engine), measured in one run, interleaved.

W1: FashionMNIST, 10 clients x 1,000 IID images, the Table 6.1 CNN (seed 004) on 1x28x28,
FedAvg, E=1, B=32, SGD lr 0.01 momentum 0.9, 5 rounds, central evaluation on 2,000 test images
after every round. Runners, each a fresh process (imports and data loading included in its
total wall), run in turn A B A B ... ``--repeats`` times:

* ``bare``: a hand-written PyTorch loop, one model, ``torch.optim.SGD``, 2 threads, the same
  clients and batch order as fedapt; evaluation in batches of 500 on 2 threads.
* ``sequential``: fedapt's engine (``fedcore.engine.Simulation``) with
  ``engine="sequential"``, one single-thread worker process per core.
* ``cohort``: the same engine with ``engine="cohort"``: the 10 clients as one batched
  computation per step (``fedcore.cohort``), in this process on every core.

Reported: median total wall and median round time (rounds 2-5) per runner, their ratios, and
the fraction of this CPU's measured matmul peak (sgemm 2048x2048 on 2 threads) each runner's
training reaches (FLOPs per training sample counted with torch's FlopCounterMode).

Run:  .venv/bin/python benchmarks/w1.py [--repeats 3]   (writes benchmarks/results/w1.json)
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CLIENTS, PER_CLIENT, ROUNDS, BATCH, LR, MOMENTUM, TEST = 10, 1000, 5, 32, 0.01, 0.9, 2000
THREADS = 2


def setup():  # type: ignore[no-untyped-def]
    """Data, shards and the model builder, shared by every runner (imports counted)."""
    import functools

    import numpy as np

    from fedcore.client import ImageData
    from fedcore.datasets import load_dataset
    from models import get_model

    tr = load_dataset("fashion_mnist", ROOT / "data/raw", "train", download=False)
    te = load_dataset("fashion_mnist", ROOT / "data/raw", "test", download=False)
    rng = np.random.default_rng(0)
    rows = rng.permutation(len(tr.labels))[: CLIENTS * PER_CLIENT]
    shards = np.array_split(rows, CLIENTS)  # IID
    test_rows = rng.permutation(len(te.labels))[:TEST]
    train = ImageData(tr.images, tr.labels, tr.info.mean, tr.info.std)
    test = ImageData(te.images[test_rows], te.labels[test_rows], te.info.mean, te.info.std)
    model_fn = functools.partial(
        get_model, "cifar_cnn", num_classes=10, in_channels=1, input_size=28
    )
    return train, test, shards, model_fn


def run_bare() -> dict:
    import functools

    import torch

    from benchmarks.engine_throughput import bare_client
    from fedcore.client import LocalConfig

    torch.set_num_threads(THREADS)
    train, test, shards, model_fn = setup()
    torch.manual_seed(0)
    model = model_fn()
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    cfg = LocalConfig(batch_size=BATCH, momentum=MOMENTUM)
    rounds, accs = [], []
    for r in range(1, ROUNDS + 1):
        t0 = time.perf_counter()
        opt = functools.partial(torch.optim.SGD, lr=LR, momentum=MOMENTUM)
        states = [
            bare_client(model, state, train, shard, cfg, opt, r, c)
            for c, shard in enumerate(shards)
        ]
        state = {
            k: (sum(s[k].double() for s in states) / len(states)).to(v.dtype)
            if v.is_floating_point()
            else v
            for k, v in states[0].items()
        }
        model.load_state_dict(state)
        model.eval()
        correct = 0
        with torch.no_grad():
            for i in range(0, len(test.labels), 500):
                x, y = test.batch(torch.arange(i, min(i + 500, len(test.labels))))
                correct += int((model(x).argmax(1) == y).sum())
        accs.append(correct / len(test.labels))
        rounds.append(time.perf_counter() - t0)
    return {"round_seconds": rounds, "accuracy": accs}


def run_sequential(engine: str = "sequential", adapter: str = "full") -> dict:
    import os

    from benchmarks.engine_throughput import RoundClock
    from fedcore.algorithms import FedAvg
    from fedcore.client import LocalConfig
    from fedcore.engine import FederationConfig, Simulation
    from fedcore.schedules import LRSchedule
    from models.adapters import adapted_model

    train, test, shards, model_fn = setup()
    payload_keys = trainable = None
    if adapter != "full":
        model_fn = functools.partial(
            adapted_model, "cifar_cnn", adapter, num_classes=10, in_channels=1, input_size=28
        )
        from models.adapters import get_adapter

        method, model = get_adapter(adapter), model_fn()
        payload_keys, trainable = method.payload_keys(model), method.trainable_keys(model)

    clock = RoundClock()
    sim = Simulation(
        model_fn=model_fn,
        algorithm=FedAvg(),
        train=train,
        test=test,
        shards=shards,
        local=LocalConfig(batch_size=BATCH, momentum=MOMENTUM),
        lr_schedule=LRSchedule(lr=LR),
        federation=FederationConfig(rounds=ROUNDS, clients_per_round=CLIENTS, eval_every=1),
        workers=os.cpu_count() or 1,
        callbacks=[clock],
        engine=engine,
        payload_keys=payload_keys,
        trainable=trainable,
    )
    clock.t = time.perf_counter()
    hist = sim.run()
    return {"round_seconds": clock.times, "accuracy": [r.accuracy for r in hist.rounds]}


RUNNERS = {"bare": run_bare}
for _adapter in ("full", "head", "lora"):
    for _engine in ("sequential", "cohort"):
        _name = _engine if _adapter == "full" else f"{_engine}-{_adapter}"
        RUNNERS[_name] = functools.partial(run_sequential, _engine, _adapter)


def flops_per_sample() -> float:
    """Training FLOPs (forward + backward) per sample of the W1 CNN, counted by torch."""
    import torch
    from torch import nn
    from torch.utils.flop_counter import FlopCounterMode

    _, _, _, model_fn = setup()
    model = model_fn()
    x, y = torch.randn(BATCH, 1, 28, 28), torch.randint(0, 10, (BATCH,))
    with FlopCounterMode(display=False) as counter:
        nn.functional.cross_entropy(model(x), y).backward()
    return counter.get_total_flops() / BATCH


def matmul_peak(threads: int = THREADS, n: int = 2048, reps: int = 10) -> float:
    """GFLOP/s of sgemm n x n on ``threads`` threads (the best of ``reps``)."""
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    for _ in range(3):
        a @ b
    best = min(_timed(lambda: a @ b) for _ in range(reps))
    return 2 * n**3 / best / 1e9


def _timed(fn) -> float:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def child(runner: str) -> None:
    t0 = time.perf_counter()
    out = RUNNERS[runner]()
    out["in_process_seconds"] = time.perf_counter() - t0
    print("W1-RESULT " + json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--runners", default="bare,sequential,cohort")
    ap.add_argument("--child", choices=sorted(RUNNERS))
    args = ap.parse_args()
    if args.child:
        child(args.child)
        return
    runners = args.runners.split(",")
    runs: dict[str, list[dict]] = {r: [] for r in runners}
    for _ in range(args.repeats):  # interleaved: A B A B ...
        for r in runners:
            t0 = time.perf_counter()
            proc = subprocess.run(
                [sys.executable, __file__, "--child", r],
                capture_output=True,
                text=True,
                check=True,
            )
            wall = time.perf_counter() - t0
            line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("W1-RESULT "))
            rec = json.loads(line[len("W1-RESULT ") :])
            rec["total_wall"] = wall
            runs[r].append(rec)
            print(
                f"{r:>10}: total {wall:6.2f} s, rounds "
                + ", ".join(f"{t:.2f}" for t in rec["round_seconds"]),
                flush=True,
            )
    peak = matmul_peak()
    fps = flops_per_sample()
    samples_per_round = CLIENTS * PER_CLIENT
    res: dict = {
        "machine": f"{platform.processor() or platform.machine()}, {THREADS} cores",
        "workload": "W1: FashionMNIST 10x1000 IID, cifar_cnn 1x28x28, FedAvg E=1 B=32 "
        "SGD 0.01/0.9, 5 rounds, eval on 2000 test images every round",
        "repeats": args.repeats,
        "matmul_peak_gflops_2_threads": peak,
        "train_mflop_per_sample": fps / 1e6,
        "runners": {},
    }
    for r, recs in runs.items():
        med_round = statistics.median(t for rec in recs for t in rec["round_seconds"][1:])
        res["runners"][r] = {
            "median_total_wall_s": statistics.median(rec["total_wall"] for rec in recs),
            "median_round_s": med_round,
            # training + evaluation per round against sgemm's rate (an upper bound on reach)
            "fraction_of_matmul_peak": samples_per_round * fps / med_round / 1e9 / peak,
            "final_accuracy": recs[0]["accuracy"][-1],
        }
    if "bare" in res["runners"]:
        base = res["runners"]["bare"]
        for v in res["runners"].values():
            v["round_vs_bare"] = v["median_round_s"] / base["median_round_s"]
            v["total_vs_bare"] = v["median_total_wall_s"] / base["median_total_wall_s"]
    from benchmarks.engine_throughput import save_result

    save_result("w1", res)


if __name__ == "__main__":
    main()
