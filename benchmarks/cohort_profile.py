"""Where the time goes: one W1 round's local training, per kernel, cohort vs sequential.

The W1 clients (10 x 1,000 FashionMNIST images, ``cifar_cnn`` trained whole, B=32, SGD
0.01/0.9) trained (a) one client on one thread, as each of the sequential engine's two worker
processes does (x 10 clients / 2 processes = its round), and (b) all ten as one cohort on two
threads (``fedcore.cohort.CohortTrainer``). ``torch.profiler`` gives each kernel's time; the
table lists the kernels by self time.

Run:  .venv/bin/python benchmarks/cohort_profile.py   (writes benchmarks/results/cohort_profile.json)
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _table(prof, rows: int = 10) -> list[dict]:  # type: ignore[no-untyped-def]
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    return [
        {
            "kernel": e.key,
            "self_s": e.self_cpu_time_total / 1e6,
            "total_s": e.cpu_time_total / 1e6,
            "calls": e.count,
        }
        for e in events[:rows]
    ]


def main() -> None:
    from benchmarks.engine_throughput import save_result
    from benchmarks.w1 import setup
    from fedcore.client import LocalConfig, cross_entropy, train_locally
    from fedcore.cohort import CohortClient, CohortTrainer

    train, _, shards, model_fn = setup()
    torch.manual_seed(0)
    model = model_fn()
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    cfg = LocalConfig(batch_size=32, momentum=0.9)

    torch.set_num_threads(1)
    train_locally(model, state, train, shards[0][:64], lr=0.01, cfg=cfg, seed=1)  # warm-up
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as seq:
        train_locally(model, state, train, shards[0], lr=0.01, cfg=cfg, seed=1)
    one_client = time.perf_counter() - t0

    torch.set_num_threads(2)
    trainer = CohortTrainer(model)
    clients = [CohortClient(i, shards[i], seed=i) for i in range(len(shards))]

    def fn(logits, y, params, ctx):  # type: ignore[no-untyped-def]
        return cross_entropy(logits, y, params)

    ctxs = [{} for _ in clients]
    trainer.train(state, train, clients[:2], lr=0.01, cfg=cfg, fn=fn, ctxs=ctxs[:2])  # warm-up
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as coh:
        trainer.train(state, train, clients, lr=0.01, cfg=cfg, fn=fn, ctxs=ctxs)
    cohort = time.perf_counter() - t0
    n = len(clients)
    save_result(
        "cohort_profile",
        {
            "one_client_1_thread_s": one_client,
            "sequential_round_estimate_s": one_client * n / 2,  # 2 worker processes
            "cohort_10_clients_2_threads_s": cohort,
            "sequential_kernels_one_client": _table(seq),
            "cohort_kernels_10_clients": _table(coh),
        },
    )


if __name__ == "__main__":
    main()
