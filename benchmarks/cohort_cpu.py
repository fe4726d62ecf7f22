"""Cohort vs sequential engine at the seeds' scale, on this machine's CPU (issue 13, b and c).

b. ``resnet``: ResNet26 (seed 000) on FashionMNIST resized to 72x72, ``full`` and
   ``residual``, 10 clients x 64 images, FedAvg, E=1, B=32, SGD 0.01/0.9, 2 rounds, no
   evaluation: training samples per second of round 2 (round 1 includes spawning workers).
c. ``pfl``: the pfl-research benchmark shape. 1,000 clients x 50 images of CIFAR-10 shape
   (3x32x32: FashionMNIST resized to 32x32 and its gray channel repeated; the data is not what
   is measured), 50 clients per round sampled without replacement, B=10, E=1, SGD lr 0.1,
   evaluation every 10 rounds on the 10,000 test images, 20 rounds; the two-conv CNN of
   :class:`PflCNN` (1,626,442 parameters). Reported: median seconds per round.

Each (workload, engine) runs in a fresh process, in turn, ``--repeats`` times; medians.

Run:  .venv/bin/python benchmarks/cohort_cpu.py [--only resnet|pfl] [--repeats 1]
      (writes benchmarks/results/cohort_cpu.json)
GPU:  .venv/bin/python benchmarks/cohort_cpu.py --device cuda --only pfl --rounds 1500
      (the pfl-research benchmark end to end; writes benchmarks/results/cohort_gpu.json)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


class PflCNN(nn.Module):
    """pfl-research's CIFAR-10 benchmark CNN shape: conv3x3(3->32) ReLU, conv3x3(32->64) ReLU,
    maxpool 2, flatten (64x14x14), linear 12544->128 ReLU, linear 128->10. 1,626,442 params."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 32, 3)
        self.conv2 = nn.Conv2d(32, 64, 3)
        self.fc1 = nn.Linear(64 * 14 * 14, 128)
        self.fc2 = nn.Linear(128, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv2(torch.relu(self.conv1(x))))
        x = torch.flatten(nn.functional.max_pool2d(x, 2), 1)
        return self.fc2(torch.relu(self.fc1(x)))


def _data(size: int, channels: int):  # type: ignore[no-untyped-def]
    from fedcore.client import ImageData
    from fedcore.datasets import load_dataset

    tr = load_dataset("fashion_mnist", ROOT / "data/raw", "train", download=False)
    te = load_dataset("fashion_mnist", ROOT / "data/raw", "test", download=False)
    mean, std = tr.info.mean * channels, tr.info.std * channels
    train = ImageData(tr.images, tr.labels, mean, std, size=size, channels=channels)
    test = ImageData(te.images, te.labels, mean, std, size=size, channels=channels)
    return train, test


def run(workload: str, engine: str, adapter: str, device: str = "cpu", rounds: int = 0) -> dict:
    import functools
    import os

    import numpy as np

    from benchmarks.engine_throughput import RoundClock
    from fedcore.algorithms import FedAvg
    from fedcore.client import LocalConfig
    from fedcore.engine import FederationConfig, Simulation
    from fedcore.schedules import LRSchedule
    from models.adapters import adapted_model, get_adapter

    rng = np.random.default_rng(0)
    if workload == "resnet":
        train, test = _data(72, 3)
        rows = rng.permutation(len(train))[: 10 * 64]
        shards = np.array_split(rows, 10)
        model_fn = functools.partial(
            adapted_model, "resnet26", adapter, num_classes=10, in_channels=3, input_size=72
        )
        local, lr, m, eval_every = LocalConfig(batch_size=32, momentum=0.9), 0.01, 10, 0
        rounds = rounds or 2
    else:
        train, test = _data(32, 3)
        rows = rng.permutation(len(train))[: 1000 * 50]
        shards = np.array_split(rows, 1000)
        model_fn = PflCNN
        local, lr, m, eval_every = LocalConfig(batch_size=10), 0.1, 50, 10
        rounds = rounds or 20  # the pfl-research benchmark runs 1,500 (--rounds 1500 on a GPU)
    payload_keys = trainable = None
    if adapter != "full":
        method, model = get_adapter(adapter), model_fn()
        payload_keys, trainable = method.payload_keys(model), method.trainable_keys(model)
    clock = RoundClock()
    sim = Simulation(
        model_fn=model_fn,
        algorithm=FedAvg(),
        train=train,
        test=test,
        shards=shards,
        local=local,
        lr_schedule=LRSchedule(lr=lr),
        federation=FederationConfig(rounds=rounds, clients_per_round=m, eval_every=eval_every),
        workers=os.cpu_count() or 1,
        device=device,
        callbacks=[clock],
        engine=engine,
        payload_keys=payload_keys,
        trainable=trainable,
    )
    clock.t = time.perf_counter()
    hist = sim.run()
    samples = sum(len(shards[c]) for c in hist.rounds[-1].clients)
    return {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "rounds": rounds,
        "run_seconds": hist.wall_seconds,  # all rounds, evaluations included
        "round_seconds": clock.times,
        "samples_per_round": samples,
        "accuracy": hist.final_accuracy,
    }


CASES = {
    "resnet": [(e, a) for a in ("full", "residual") for e in ("sequential", "cohort")],
    "pfl": [(e, "full") for e in ("sequential", "cohort")],
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--only", choices=sorted(CASES))
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--rounds", type=int, default=0, help="0: the workload's default")
    ap.add_argument("--engines", default="sequential,cohort")
    ap.add_argument("--child", nargs=3, metavar=("WORKLOAD", "ENGINE", "ADAPTER"))
    args = ap.parse_args()
    if args.child:
        print("RESULT " + json.dumps(run(*args.child, args.device, args.rounds)), flush=True)
        return
    engines = args.engines.split(",")
    workloads = [args.only] if args.only else list(CASES)
    res: dict = {"threads": torch.get_num_threads(), "workloads": {}}
    for w in workloads:
        cases = [(e, a) for e, a in CASES[w] if e in engines]
        recs: dict[str, list[dict]] = {f"{e}/{a}": [] for e, a in cases}
        for _ in range(args.repeats):
            for e, a in cases:
                extra = ["--device", args.device, "--rounds", str(args.rounds)]
                proc = subprocess.run(
                    [sys.executable, __file__, "--child", w, e, a, *extra],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
                rec = json.loads(line[len("RESULT ") :])
                recs[f"{e}/{a}"].append(rec)
                print(w, e, a, [round(t, 2) for t in rec["round_seconds"]], flush=True)
        out = {}
        for name, rs in recs.items():
            later = [t for r in rs for t in r["round_seconds"][1:]]
            med = statistics.median(later)
            out[name] = {
                "median_round_s": med,
                "samples_per_s": rs[0]["samples_per_round"] / med,
                "final_accuracy": rs[0]["accuracy"],
                "median_run_s": statistics.median(r["run_seconds"] for r in rs),
                "rounds": rs[0]["rounds"],
                "device": rs[0]["device"],
            }
        res["workloads"][w] = out
        print(json.dumps(out, indent=1), flush=True)
    from benchmarks.engine_throughput import save_result

    save_result("cohort_cpu" if args.device == "cpu" else "cohort_gpu", res)


if __name__ == "__main__":
    main()
