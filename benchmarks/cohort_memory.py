"""Peak memory of one round with 100 and 1,000 clients, cohort vs sequential engine.

Each client holds 50 FashionMNIST images (1,000 x 50 = 50,000 of the 60,000), the W1 model
(``cifar_cnn`` on 1x28x28, 815,892 parameters) trained whole, FedAvg, E=1, B=32 (2 steps per
client), SGD 0.01/0.9, every client sampled, no evaluation. Each (engine, clients) runs in a
fresh process; reported: peak RSS of that process (``ru_maxrss``), the round's wall time and,
for the cohort engine, the largest cohort it trained (``runtime.cohort_size: auto`` splits a
round into cohorts that fit in half the free memory).

Run:  .venv/bin/python benchmarks/cohort_memory.py   (writes benchmarks/results/cohort_memory.json)
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PER_CLIENT = 50


def child(engine: str, clients: int) -> None:
    import functools
    import resource

    import numpy as np

    from fedcore.algorithms import FedAvg
    from fedcore.client import ImageData, LocalConfig
    from fedcore.datasets import load_dataset
    from fedcore.engine import CohortBackend, FederationConfig, Simulation
    from fedcore.schedules import LRSchedule
    from models import get_model

    tr = load_dataset("fashion_mnist", ROOT / "data/raw", "train", download=False)
    rows = np.random.default_rng(0).permutation(len(tr.labels))[: clients * PER_CLIENT]
    train = ImageData(tr.images, tr.labels, tr.info.mean, tr.info.std)
    sim = Simulation(
        model_fn=functools.partial(
            get_model, "cifar_cnn", num_classes=10, in_channels=1, input_size=28
        ),
        algorithm=FedAvg(),
        train=train,
        test=train,
        shards=np.array_split(rows, clients),
        local=LocalConfig(batch_size=32, momentum=0.9),
        lr_schedule=LRSchedule(lr=0.01),
        federation=FederationConfig(rounds=1, clients_per_round=clients, eval_every=0),
        workers=2,
        engine=engine,
    )
    t0 = time.perf_counter()
    sim.run()
    wall = time.perf_counter() - t0
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kids_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # worker processes
    cohort = sim.backend.trainer if isinstance(sim.backend, CohortBackend) else None
    out = {
        "engine": engine,
        "clients": clients,
        "round_seconds": wall,
        "peak_rss_mib": peak_kib / 1024,
        "peak_worker_rss_mib": kids_kib / 1024,
        "largest_cohort": cohort.peak_clients if cohort is not None else None,
    }
    print("MEM-RESULT " + json.dumps(out))


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child(sys.argv[2], int(sys.argv[3]))
        return
    results = []
    for clients in (100, 1000):
        for engine in ("sequential", "cohort"):
            proc = subprocess.run(
                [sys.executable, __file__, "--child", engine, str(clients)],
                capture_output=True,
                text=True,
                check=True,
            )
            line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("MEM-RESULT "))
            rec = json.loads(line[len("MEM-RESULT ") :])
            print(rec, flush=True)
            results.append(rec)
    from benchmarks.engine_throughput import save_result

    save_result("cohort_memory", {"per_client_images": PER_CLIENT, "runs": results})


if __name__ == "__main__":
    main()
