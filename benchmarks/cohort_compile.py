"""torch.compile on the cohort engine's local step, against eager, on this machine's CPU
(issue 31: measure it now, keep what is faster or equal). The workload of
``benchmarks/cohort_ops.py``: 50 of 1,000 clients x 50 FashionMNIST images per round,
``cifar_cnn``, B=10, 5 local steps, FedAvg, no evaluation, engine cohort.

The vmapped ``grad_and_value`` step (``fedcore.cohort.trainer._vmapped``, built once per
cohort) is wrapped in ``torch.compile`` (inductor, static shapes) for the compiled mode; the
rest of the round is unchanged. Each mode runs in its own process, modes interleaved,
``--repeats`` times; per mode: the first round (compilation included) and the median of the
later rounds' seconds, and whether the final model equals eager's (max abs difference).

Run:  .venv/bin/python benchmarks/cohort_compile.py [--rounds 4] [--repeats 3]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, os.getcwd())
RESULTS = Path(__file__).resolve().parent / "results"


def run_mode(mode: str, rounds: int, out: Path) -> None:
    import numpy as np
    import torch

    import fedcore.cohort.trainer as trainer
    from fedcore.algorithms import build_algorithm
    from fedcore.client import ImageData, LocalConfig
    from fedcore.datasets import load_dataset
    from fedcore.engine import FederationConfig, Simulation
    from fedcore.events import Callback
    from fedcore.schedules import LRSchedule
    from models import get_model

    if mode == "compile":
        eager = trainer._vmapped

        def compiled(*args, **kwargs):  # type: ignore[no-untyped-def]
            return torch.compile(eager(*args, **kwargs), dynamic=False, fullgraph=True)

        trainer._vmapped = compiled
    seconds: list[float] = []

    class Clock(Callback):
        def on_round_start(self, round_: int, clients: tuple[int, ...], lr: float) -> None:
            self.t = time.perf_counter()

        def on_round_end(self, record: object) -> None:  # type: ignore[override]
            seconds.append(time.perf_counter() - self.t)

    tr = load_dataset("fashion_mnist", Path.cwd() / "data/raw", "train", download=False)
    rows = np.random.default_rng(0).permutation(len(tr.labels))[:50_000]
    train = ImageData(tr.images, tr.labels, tr.info.mean, tr.info.std)
    sim = Simulation(
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
        callbacks=[Clock()],
    )
    sim.run()
    state = {k: v.detach().double() for k, v in sim.global_state.items()}
    torch.save(state, out.with_suffix(".pt"))
    out.write_text(json.dumps({"mode": mode, "seconds": seconds}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--mode", choices=["eager", "compile"], help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.mode:
        run_mode(a.mode, a.rounds, a.out)
        return
    import tempfile

    import torch

    runs: dict[str, list[dict]] = {"eager": [], "compile": []}
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(a.repeats):
            for mode in ("eager", "compile"):
                out = Path(tmp) / f"{mode}-{k}.json"
                cmd = [sys.executable, __file__, "--mode", mode, "--rounds", str(a.rounds)]
                subprocess.run([*cmd, "--out", str(out)], check=True)
                runs[mode].append(json.loads(out.read_text()))
        ref = torch.load(Path(tmp) / "eager-0.pt")
        got = torch.load(Path(tmp) / "compile-0.pt")
        diff = max(float((ref[k] - got[k]).abs().max()) for k in ref)
    result: dict = {"rounds": a.rounds, "repeats": a.repeats, "max_abs_diff_vs_eager": diff}
    for mode, rs in runs.items():
        result[mode] = {
            "first_round_s": statistics.median(r["seconds"][0] for r in rs),
            "later_round_median_s": statistics.median(s for r in rs for s in r["seconds"][1:]),
        }
    result["compile_over_eager"] = (
        result["compile"]["later_round_median_s"] / result["eager"]["later_round_median_s"]
    )
    print(json.dumps(result, indent=2))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "cohort_compile.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
