"""Whole-process time of a few cohort rounds, to compare two checkouts (run it in each, in
turn): 50 of 1,000 clients x 50 FashionMNIST images per round, ``cifar_cnn``, B=10, 5 local
steps, FedAvg, no evaluation, engine cohort (the workload of ``benchmarks/cohort_ops.py``),
imported from the checkout of the current directory. Imports and data loading are included.

Run:  .venv/bin/python benchmarks/cohort_round_time.py [ROUNDS]   (from the repository root)
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

sys.path.insert(0, os.getcwd())

import numpy as np  # noqa: E402

from fedcore.algorithms import build_algorithm  # noqa: E402
from fedcore.client import ImageData, LocalConfig  # noqa: E402
from fedcore.datasets import load_dataset  # noqa: E402
from fedcore.engine import FederationConfig, Simulation  # noqa: E402
from fedcore.events import Callback  # noqa: E402
from fedcore.schedules import LRSchedule  # noqa: E402
from models import get_model  # noqa: E402


def pfl_simulation(rounds: int, callbacks: list[Callback] | None = None) -> Simulation:
    """The pfl-research shape as a cohort-engine Simulation (also benchmarks/cohort_compile.py)."""
    tr = load_dataset("fashion_mnist", Path.cwd() / "data/raw", "train", download=False)
    rows = np.random.default_rng(0).permutation(len(tr.labels))[:50_000]
    train = ImageData(tr.images, tr.labels, tr.info.mean, tr.info.std)
    return Simulation(
        model_fn=functools.partial(
            get_model, "cifar_cnn", num_classes=10, in_channels=1, input_size=28
        ),
        algorithm=build_algorithm("fedavg"),
        train=train,
        test=train,
        shards=np.array_split(rows, 1000),
        local=LocalConfig(batch_size=10),
        lr_schedule=LRSchedule(lr=0.1),
        federation=FederationConfig(rounds=rounds, clients_per_round=50, eval_every=0),
        workers=0,
        engine="cohort",
        callbacks=callbacks or [],
    )


def main() -> None:
    pfl_simulation(int(sys.argv[1]) if len(sys.argv) > 1 else 4).run()


if __name__ == "__main__":
    main()
