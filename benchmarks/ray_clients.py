"""One federation's clients: the local worker pool vs fedapt's Ray actors vs Flower's
simulation on Ray, per round, interleaved (issue: one federation across a Ray cluster).

Two shapes, FedAvg on FashionMNIST with the Table 6.1 CNN (``cifar_cnn``, 1x28x28), SGD lr
0.01 momentum 0.9, no evaluation (the round is the clients' training, their transfers and
the aggregation):

* ``w1``: 10 clients x 1,000 images, B=32, one local epoch (31 steps);
* ``pfl``: pfl-research's shape, 50 clients x 50 images, B=10, one epoch (5 steps).

Runners, each a fresh process (``--runner``), run in turn A B C A B C ... ``--repeats`` times:

* ``sequential``: ``fedcore.engine.Simulation``, the clients one after another in this
  process (single-threaded);
* ``pool``: the same Simulation with 2 single-thread worker processes;
* ``ray``: the same Simulation with ``runtime.clients: ray``'s backend: 2 Ray actors on a
  local Ray of 2 CPUs (``fedcore.engine.ray_pool``);
* ``flower``: Flower's simulation runtime (``flwr.simulation.run_simulation``, Ray backend,
  one CPU per ClientApp, 2 at a time), its FedAvg strategy, the same model, shards and
  optimiser in a plain PyTorch client (single-threaded, as fedapt's clients). Flower is not
  a dependency of fedapt: it runs from a separate venv (``--flower-python``, made by
  ``benchmarks/flower_venv.sh``).

Reported per runner: median seconds per round (rounds 2..R; round 1 pays the start of the
workers/actors), the median over repeats, the ratio to ``pool``, and the resident memory of
each worker process or actor after the last round (psutil; on Linux RSS counts shared pages
once per process).

Run:  .venv/bin/python benchmarks/ray_clients.py --shape pfl --rounds 4 --repeats 3
      (writes benchmarks/results/ray_clients_<shape>.json)
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SHAPES = {"w1": (10, 1000, 32), "pfl": (50, 50, 10)}  # clients, images per client, batch
LR, MOMENTUM = 0.01, 0.9
WORKERS = 2


def _setup(shape: str) -> tuple[Any, list[Any], Any]:
    import functools

    import numpy as np

    from fedcore.client import ImageData
    from fedcore.datasets import load_dataset
    from models import get_model

    clients, per, _ = SHAPES[shape]
    tr = load_dataset("fashion_mnist", ROOT / "data/raw", "train", download=False)
    rows = np.random.default_rng(0).permutation(len(tr.labels))[: clients * per]
    shards = np.array_split(rows, clients)
    train = ImageData(tr.images, tr.labels, tr.info.mean, tr.info.std)
    model_fn = functools.partial(
        get_model, "cifar_cnn", num_classes=10, in_channels=1, input_size=28
    )
    return train, shards, model_fn


@functools.lru_cache(maxsize=1)
def _cached(shape: str) -> tuple[Any, list[Any], Any]:
    """``_setup`` once per process (a Flower actor reads the data once, as fedapt's workers)."""
    return _setup(shape)


_MODELS: dict[Any, Any] = {}


def _model(model_fn: Any) -> Any:
    """One model per Flower actor process, its state replaced by each message's (as a fedapt
    worker keeps one model)."""
    if model_fn not in _MODELS:
        _MODELS[model_fn] = model_fn()
    return _MODELS[model_fn]


def _memory(names: tuple[str, ...], pids: list[int] | None = None) -> list[float]:
    """MiB resident of the ``WORKERS`` largest processes named ``names`` (Ray actors) or
    among ``pids`` (the pool's children: its workers, not the resource tracker)."""
    import psutil

    out = []
    for p in psutil.process_iter(["pid", "name", "cmdline"]):
        try:
            label = " ".join([p.info["name"] or "", *(p.info["cmdline"] or [])[:1]])
            if (pids is not None and p.info["pid"] in pids) or any(n in label for n in names):
                out.append(round(p.memory_info().rss / 2**20, 1))
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return sorted(out, reverse=True)[:WORKERS]


def run_fedapt(shape: str, rounds: int, clients_on: str) -> dict[str, Any]:
    import shutil
    import tempfile

    import psutil

    from benchmarks.engine_throughput import RoundClock
    from fedcore.algorithms import FedAvg
    from fedcore.client import LocalConfig
    from fedcore.engine import FederationConfig, RaySettings, Simulation
    from fedcore.events import Callback
    from fedcore.schedules import LRSchedule

    train, shards, model_fn = _setup(shape)
    clients, _, batch = SHAPES[shape]
    ray = None
    temp = None
    if clients_on == "ray":
        import ray as ray_mod

        temp = tempfile.mkdtemp(prefix="rcb-")
        ray_mod.init(
            num_cpus=WORKERS,
            num_gpus=0,
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            _temp_dir=temp,
            configure_logging=False,
        )
        ray = RaySettings(None, WORKERS, 1.0, 0.0, WORKERS, 0)
    memory: list[float] = []

    class LastRound(Callback):
        def on_round_end(self, record: Any) -> None:
            if record.round == rounds:
                if clients_on == "ray":
                    memory.extend(_memory(("ray::ClientActor",)))
                elif clients_on == "pool":
                    kids = [c.pid for c in psutil.Process().children(recursive=True)]
                    memory.extend(_memory((), kids))

    clock = RoundClock()
    sim = Simulation(
        model_fn=model_fn,
        algorithm=FedAvg(),
        train=train,
        test=train,
        shards=shards,
        local=LocalConfig(batch_size=batch, momentum=MOMENTUM),
        lr_schedule=LRSchedule(lr=LR),
        federation=FederationConfig(rounds=rounds, clients_per_round=clients, eval_every=0),
        workers=0 if clients_on == "sequential" else WORKERS,
        callbacks=[clock, LastRound()],
        engine="sequential",
        ray=ray,
    )
    clock.t = time.perf_counter()
    try:
        sim.run()
    finally:
        sim.close()
        if temp is not None:
            import ray as ray_mod

            ray_mod.shutdown()
            shutil.rmtree(temp, ignore_errors=True)
    return {"round_seconds": clock.times, "worker_mib": memory}


def run_flower(shape: str, rounds: int) -> dict[str, Any]:
    import torch
    from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp
    from flwr.serverapp.strategy import FedAvg
    from flwr.simulation import run_simulation

    clients, _, batch = SHAPES[shape]
    stamps: list[float] = []
    memory: list[float] = []
    client_app = ClientApp()

    @client_app.train()
    def train(msg: Message, context: Context) -> Message:
        torch.set_num_threads(1)  # as fedapt's clients
        data, shards, model_fn = _cached(shape)  # read once per actor process
        cid = int(context.node_config["partition-id"])
        model = _model(model_fn)
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        model.train()
        opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
        idx = torch.as_tensor(shards[cid])
        gen = torch.Generator().manual_seed(cid)
        order = idx[torch.randperm(len(idx), generator=gen)]
        for i in range(0, len(order), batch):
            x, y = data.batch(order[i : i + batch])
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        content = RecordDict(
            {
                "arrays": ArrayRecord(model.state_dict()),
                "metrics": MetricRecord({"num-examples": len(idx)}),
            }
        )
        return Message(content=content, reply_to=msg)

    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        def stamp(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
            stamps.append(time.perf_counter())
            if server_round == rounds:
                memory.extend(_memory(("ray::ClientAppActor",)))
            return None

        torch.manual_seed(0)
        FedAvg(fraction_train=1.0, fraction_evaluate=0.0).start(
            grid=grid,
            initial_arrays=ArrayRecord(_setup(shape)[2]().state_dict()),
            num_rounds=rounds,
            evaluate_fn=stamp,
        )

    run_simulation(
        server_app=server_app,
        client_app=client_app,
        num_supernodes=clients,
        backend_config={
            "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
            "init_args": {"num_cpus": WORKERS, "include_dashboard": False},
        },
    )
    # evaluate_fn runs before round 1 (round 0) and after every round
    times = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    return {"round_seconds": times, "worker_mib": memory}


def one(runner: str, shape: str, rounds: int, flower_python: str) -> dict[str, Any]:
    python = flower_python if runner == "flower" else sys.executable
    code = (
        f"import json, sys; sys.path.insert(0, {str(ROOT)!r}); "
        "from benchmarks import ray_clients as b; "
        + (
            f"r = b.run_flower({shape!r}, {rounds})"
            if runner == "flower"
            else f"r = b.run_fedapt({shape!r}, {rounds}, {runner!r})"
        )
        + "; print('RESULT ' + json.dumps(r))"
    )
    env = {**os.environ, "RAY_DEDUP_LOGS": "0", "PYTHONWARNINGS": "ignore"}
    t0 = time.perf_counter()
    proc = subprocess.run([python, "-c", code], capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"{runner} failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
    res = json.loads(lines[-1].removeprefix("RESULT "))
    res["wall_seconds"] = round(wall, 2)
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", choices=sorted(SHAPES), default="pfl")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--runners", default="sequential,pool,ray,flower")
    ap.add_argument("--flower-python", default=str(ROOT / "benchmarks/.venv-flower/bin/python"))
    args = ap.parse_args()
    runners = args.runners.split(",")
    runs: dict[str, list[dict[str, Any]]] = {r: [] for r in runners}
    for rep in range(args.repeats):
        for r in runners:
            res = one(r, args.shape, args.rounds, args.flower_python)
            runs[r].append(res)
            later = statistics.median(res["round_seconds"][1:] or res["round_seconds"])
            print(f"repeat {rep + 1} {r}: {later:.3f} s per round (2..{args.rounds})", flush=True)
    summary = {}
    for r, rs in runs.items():
        per = [statistics.median(x["round_seconds"][1:] or x["round_seconds"]) for x in rs]
        summary[r] = {
            "median_round_seconds": round(statistics.median(per), 4),
            "first_round_seconds": round(statistics.median(x["round_seconds"][0] for x in rs), 3),
            "median_wall_seconds": round(statistics.median(x["wall_seconds"] for x in rs), 2),
            "worker_mib": rs[-1]["worker_mib"],
        }
    base = summary.get("pool", {}).get("median_round_seconds")
    for s in summary.values():
        s["round_vs_pool"] = round(s["median_round_seconds"] / base, 3) if base else None
    out = {
        "shape": args.shape,
        "clients_images_batch": SHAPES[args.shape],
        "rounds": args.rounds,
        "repeats": args.repeats,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "summary": summary,
        "runs": runs,
    }
    path = ROOT / f"benchmarks/results/ray_clients_{args.shape}.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
