"""What orchestration costs: the default grid through the full pipeline (Prefect flow, shard
validation, MLflow tracking + model registry, S3 upload) against the same training through
the engine alone, in one process, one after the other (ratios from one run, not a timed test).

Reported separately, because they are paid once and not per round:
- process start-up: importing fedapt's pipeline stack (torch, prefect, mlflow, GX, ...);
- server start: `fedapt up` of S3 (SeaweedFS), MLflow and Prefect servers on 127.0.0.1.

Run:  .venv/bin/python benchmarks/pipeline_overhead.py [--rounds 20]
writes benchmarks/results/pipeline_overhead.json. The target (issue 3) is an overhead of at
most 20% for a 20-round run of the default experiment.
"""

from __future__ import annotations

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
for key, value in {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DO_NOT_TRACK": "true",
    "MLFLOW_DISABLE_TELEMETRY": "true",
}.items():
    os.environ.setdefault(key, value)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--params", default=str(ROOT / "params.yaml"))
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/pipeline_overhead.json"))
    args = ap.parse_args()

    from flows import services

    work = Path(tempfile.mkdtemp(prefix="fedapt-bench-"))
    state = work / "state"
    t = time.perf_counter()
    services.up(state=state, ports={"s3": 0, "mlflow": 0, "prefect": 0})
    server_start = time.perf_counter() - t
    try:
        env = services.env_for_clients(state, environ={})
        os.environ.update(env)  # before Prefect is imported: it reads its settings once
        t = time.perf_counter()
        import flows.experiment as fx
        from tasks.config import load_params
        from tasks.data.experiment import load_experiment_data
        from tasks.data.partitioning import build_partition
        from tasks.training.cell import build_simulation, cell_of

        import_seconds = time.perf_counter() - t
        p = load_params(
            args.params,
            [
                f"federation.rounds={args.rounds}",
                f"experiment.reports_dir={work / 'reports'}",
                "experiment.name=overhead-bench",
                "storage.bucket=fedapt",
            ],
        )

        # 1. the full pipeline: Prefect flow on the Prefect server, validation, MLflow server
        #    tracking and registry (artifacts in S3), outputs uploaded to S3.
        t = time.perf_counter()
        records = fx.experiment_flow(params=p)
        pipeline_seconds = time.perf_counter() - t

        # 2. the same training through the engine alone: same data, partition, model, seed.
        t = time.perf_counter()
        data = load_experiment_data(p)
        part = build_partition(p, data)
        # the cell exactly as the flow's training task configures it (tasks.training.cell)
        sim = build_simulation(cell_of(p, data), data, part).sim
        history = sim.run()
        engine_seconds = time.perf_counter() - t
    finally:
        services.down(state=state)

    same = records[0]["final_accuracy"] == history.final_accuracy
    result = {
        "rounds": args.rounds,
        "experiment": "default params.yaml (fedavg/full, cifar_cnn, FashionMNIST 12k, Dir(0.5))",
        "pipeline_seconds": round(pipeline_seconds, 1),
        "engine_seconds": round(engine_seconds, 1),
        "overhead_percent": round(100 * (pipeline_seconds / engine_seconds - 1), 1),
        "same_final_accuracy": same,
        "final_accuracy": history.final_accuracy,
        "import_seconds": round(import_seconds, 1),
        "server_start_seconds": round(server_start, 1),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
