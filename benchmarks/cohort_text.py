"""MiniLM on tweets with early exits, cohort vs sequential engine (issue 13, a').

The README's text experiment (all-MiniLM-L6-v2, 400 tweets over 4 clients by Dir(0.5), 500
test tweets, FedAvg, E=1, B=32, SGD 0.01/0.9) with ``lw_linear`` (a linear head after every
block, seed 001) and ``accumulator`` (seed 001's Accumulator), 4 rounds, evaluation every
round, through ``tasks.training.train.train_cell`` as ``fedapt run`` calls it (tracking off). Each
(adapter, engine) runs in a fresh process, in turn; reported: every round's seconds and the
total wall (imports, tokenization and model loading included).

Run:  .venv/bin/python benchmarks/cohort_text.py [--repeats 1]
      (writes benchmarks/results/cohort_text.json)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SETTINGS = [
    "data.dataset=tweet_sentiment",
    "model.name=minilm",
    "data.train_subset=400",
    "data.test_subset=500",
    "partition.num_clients=4",
    "federation.rounds=4",
    "client.lr=0.01",
    "runtime.tracking=false",
]


def child(adapter: str, engine: str) -> None:
    from benchmarks.engine_throughput import RoundClock
    from tasks.config import load_params
    from tasks.data.experiment import load_experiment_data
    from tasks.data.partitioning import build_partition
    from tasks.training.cell import cell_of
    from tasks.training.train import train_cell

    params = load_params(
        ROOT / "params.yaml",
        [*SETTINGS, f"grid.adapters=[{adapter}]", f"runtime.engine={engine}"],
    )

    data = load_experiment_data(params)
    part = build_partition(params, data)
    clock = RoundClock()
    cell = cell_of(params, data, "fedavg", adapter)
    with tempfile.TemporaryDirectory() as out:
        clock.t = time.perf_counter()
        rec = train_cell(cell, data, part, out, callbacks=[clock])
    print(
        "RESULT "
        + json.dumps(
            {
                "round_seconds": clock.times,
                "accuracy": rec["final_accuracy"],
                "engine": rec["engine"],
            }
        ),
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--child", nargs=2, metavar=("ADAPTER", "ENGINE"))
    args = ap.parse_args()
    if args.child:
        child(*args.child)
        return
    cases = [(a, e) for a in ("lw_linear", "accumulator") for e in ("sequential", "cohort")]
    runs: dict[str, list[dict]] = {f"{a}/{e}": [] for a, e in cases}
    for _ in range(args.repeats):
        for a, e in cases:
            t0 = time.perf_counter()
            proc = subprocess.run(
                [sys.executable, __file__, "--child", a, e], capture_output=True, text=True
            )
            wall = time.perf_counter() - t0
            if proc.returncode != 0:
                raise SystemExit(f"{a}/{e} failed:\n{proc.stderr[-3000:]}")
            line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
            rec = json.loads(line[len("RESULT ") :])
            rec["total_wall"] = wall
            runs[f"{a}/{e}"].append(rec)
            print(a, e, f"total {wall:.1f} s", [round(t, 2) for t in rec["round_seconds"]])
    res = {}
    for name, recs in runs.items():
        res[name] = {
            "median_total_wall_s": statistics.median(r["total_wall"] for r in recs),
            "median_round_2_4_s": statistics.median(
                t for r in recs for t in r["round_seconds"][1:]
            ),
            "round_1_s": statistics.median(r["round_seconds"][0] for r in recs),
            "final_accuracy": recs[0]["accuracy"],
            "engine": recs[0]["engine"],
        }
    from benchmarks.engine_throughput import save_result

    save_result("cohort_text", {"settings": SETTINGS, "runners": res})


if __name__ == "__main__":
    main()
