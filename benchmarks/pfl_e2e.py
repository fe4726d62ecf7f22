"""The pfl-research benchmark shape, whole, twice: end-to-end time and bit-identity.

The shape (as benchmarks/cohort_cpu.py and benchmarks/cohort_gpu_profile.py build it):
1,000 clients x 50 images, 50 clients per round sampled without replacement, B=10, E=1
(5 local steps), SGD lr 0.1 (no momentum), :class:`benchmarks.cohort_cpu.PflCNN`
(1,626,442 parameters), FedAvg, the cohort engine, 1,500 rounds, and a central evaluation of
the global model every 10 rounds (pfl-research evaluates every 10 rounds; here through
``FederationConfig.eval_every=10``) on a 10,000-image test set.

Data: synthetic uint8 images of CIFAR-10's shape (3x32x32, stored at that size: no resize),
labels 0..9. So that the accuracies move (and comparing them says something), each image is
15/16 uniform noise plus 1/16 of a fixed random per-class template; the test set is drawn the
same way from another stream. The data is not what is measured.

Two runs, each in a fresh process (so the comparison is across processes, and each run pays
its own CUDA start), one after the other. Per run: ``build_s`` (data generation, the
Simulation and its initial model), ``run_s`` (``Simulation.run()``, every round and
evaluation, torch.cuda.synchronize before the clock stops), their sum ``wall_s``, the
process's whole life ``process_s`` (imports and CUDA start too), rounds/s, per-round seconds
(the gaps between ``on_round_end`` events; the engine reads back from the device every round,
so no extra synchronisation is added), the evaluation accuracies, and the sha256 of the
global model's state_dict (sorted keys; name, dtype, shape and bytes) at a few rounds and at
the end. The two runs are identical when those hashes and every evaluation accuracy agree.

If the first run leaves too little of ``--budget-s`` for a second one as long, the second
runs the same configuration with ``FederationConfig.stop_after`` at the largest checkpoint
round that fits (e.g. 300: the first rounds of the same run exactly), and the two are
compared at that round; the JSON says so (``second_run_stop_after``).

Imports: torch, numpy and fedcore. fedcore pulls in pydantic (fedcore.options, through
fedcore.algorithms), with pydantic_core, annotated_types and typing_inspection; no Prefect,
MLflow, DVC, pandera, boto3, Ray or torchvision. The lent GPU machine's python3 has no
pydantic (seen 2026-11-27): carry its wheels (pydantic 2.14.3, pydantic_core 2.50.4 cp312,
annotated-types 0.8.0, typing-inspection 0.4.5) in an untracked .whl/ and install them with
``pip install --no-index --no-deps --target /tmp/site`` + ``PYTHONPATH=/tmp/site`` first.

GPU:    python3 benchmarks/pfl_e2e.py --device cuda --out $OUT
        (H200, 2026-11-27: two 1,500-round runs, 240 s in all; results/pfl_e2e_h200.json)
Smoke:  .venv/bin/python benchmarks/pfl_e2e.py --device cpu --rounds 2 --out /tmp/pfl
        (about 1-2 min on 2 cores; add --clients 20 --clients-per-round 5 --test-size 200
        for ~40 s)
Writes OUT/pfl_e2e.json (and OUT/run1.json, OUT/run2.json from the children).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.pfl_parts import compare, state_sha256, sync, synthetic  # noqa: E402

CHECKPOINTS = (1, 10, 100, 300, 500, 1000)  # rounds whose global model is hashed (+ the last)


def child(a: argparse.Namespace) -> dict:
    import numpy as np
    import torch

    from benchmarks.cohort_cpu import PflCNN
    from fedcore.algorithms import FedAvg
    from fedcore.client import ImageData, LocalConfig
    from fedcore.engine import FederationConfig, Simulation
    from fedcore.events import Callback
    from fedcore.schedules import LRSchedule

    device = a.device
    if device.startswith("cuda"):
        torch.cuda.init()
        torch.zeros(1, device=device)  # the CUDA context before the build clock starts
        sync(device)
    t0 = time.perf_counter()
    g = torch.Generator().manual_seed(1234)
    templates = torch.randint(0, 256, (10, 3, 32, 32), generator=g, dtype=torch.int16)
    tr_x, tr_y = synthetic(a.clients * a.per_client, templates, seed=1)
    te_x, te_y = synthetic(a.test_size, templates, seed=2)
    mean, std = (0.5,) * 3, (0.28,) * 3  # of pixel/255 for these images, near enough
    train = ImageData(tr_x, tr_y, mean, std)
    test = ImageData(te_x, te_y, mean, std)
    shards = np.array_split(np.random.default_rng(0).permutation(len(tr_y)), a.clients)
    rounds = a.rounds
    last = a.stop_after or rounds
    checkpoints = sorted({r for r in CHECKPOINTS if r <= last} | {last})

    class Probe(Callback):
        def __init__(self) -> None:
            self.sim: Simulation | None = None
            self.t_prev = 0.0
            self.t_start = 0.0
            self.times: list[float] = []
            self.hashes: dict[int, str] = {}
            self.acc: dict[int, float] = {}

        def on_fit_start(self, info) -> None:  # type: ignore[no-untyped-def]
            self.t_start = self.t_prev = time.perf_counter()

        def on_round_end(self, record) -> None:  # type: ignore[no-untyped-def]
            now = time.perf_counter()
            self.times.append(now - self.t_prev)
            if record.accuracy is not None:
                self.acc[record.round] = record.accuracy
            if record.round in checkpoints and record.round != last:
                assert self.sim is not None
                self.hashes[record.round] = state_sha256(self.sim.global_state)
            if record.round % a.print_every == 0 or record.round in (1, last):
                acc = "" if record.accuracy is None else f" acc {record.accuracy:.4f}"
                print(
                    f"  [run {a.tag}] round {record.round}: {now - self.t_start:.1f} s, "
                    f"last {self.times[-1] * 1e3:.1f} ms, loss {record.train_loss:.4f}{acc}",
                    flush=True,
                )
            # the hashing's own time is not the next round's
            self.t_prev = time.perf_counter() if record.round in checkpoints else now

    probe = Probe()
    sim = Simulation(
        model_fn=PflCNN,
        algorithm=FedAvg(),
        train=train,
        test=test,
        shards=shards,
        local=LocalConfig(batch_size=10),
        lr_schedule=LRSchedule(lr=0.1),
        federation=FederationConfig(
            rounds=rounds,
            clients_per_round=min(a.clients_per_round, a.clients),
            eval_every=a.eval_every,
            stop_after=a.stop_after,
        ),
        workers=0,
        device=device,
        callbacks=[probe],
        engine="cohort",
    )
    probe.sim = sim
    init_sha = state_sha256(sim.global_state)
    sync(device)
    build_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    hist = sim.run()
    sync(device)
    run_s = time.perf_counter() - t1
    probe.hashes[last] = state_sha256(sim.global_state)  # on the host after run()
    n = len(hist.rounds)
    times = probe.times
    eval_rounds = set(probe.acc)
    plain = [t for r, t in zip(range(1, n + 1), times, strict=True) if r not in eval_rounds]
    with_eval = [t for r, t in zip(range(1, n + 1), times, strict=True) if r in eval_rounds]
    return {
        "tag": a.tag,
        "device": torch.cuda.get_device_name() if device.startswith("cuda") else "cpu",
        "rounds_configured": rounds,
        "rounds_run": n,
        "stop_after": a.stop_after,
        "build_s": build_s,
        "run_s": run_s,
        "wall_s": build_s + run_s,
        "history_wall_s": hist.wall_seconds,
        "rounds_per_s": n / run_s,
        "first_round_s": times[0],
        "median_round_s": statistics.median(times),
        "median_round_s_after_first": statistics.median(times[1:]) if n > 1 else times[0],
        "median_round_s_without_eval": statistics.median(plain) if plain else None,
        "median_round_s_with_eval": statistics.median(with_eval) if with_eval else None,
        "max_round_s": max(times),
        "round_s": times,
        "accuracy": {str(r): v for r, v in sorted(probe.acc.items())},
        "final_accuracy": hist.final_accuracy,
        "final_train_loss": hist.rounds[-1].train_loss,
        "init_sha256": init_sha,
        "sha256": {str(r): h for r, h in sorted(probe.hashes.items())},
        "final_sha256": probe.hashes[last],
        "threads": torch.get_num_threads(),
        "peak_cuda_mem_gib": (
            torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else None
        ),
    }


def env(device: str) -> dict:
    import numpy as np
    import torch

    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "cpus": os.cpu_count(),
        "device_name": torch.cuda.get_device_name() if device.startswith("cuda") else "cpu",
    }
    try:
        import pydantic

        info["pydantic"] = pydantic.VERSION
    except ImportError:
        info["pydantic"] = None
    try:
        info["git_head"] = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        info["git_head"] = None
    return info


def spawn(a: argparse.Namespace, tag: str, stop_after: int | None, timeout: float, out: Path):  # type: ignore[no-untyped-def]
    res_file = out / f"run{tag}.json"
    res_file.unlink(missing_ok=True)
    cmd = [
        sys.executable, __file__, "--child", tag, "--device", a.device, "--rounds",
        str(a.rounds), "--clients", str(a.clients), "--per-client", str(a.per_client),
        "--clients-per-round", str(a.clients_per_round), "--test-size", str(a.test_size),
        "--eval-every", str(a.eval_every), "--print-every", str(a.print_every),
        "--out", str(out),
    ]  # fmt: skip
    if stop_after:
        cmd += ["--stop-after", str(stop_after)]
    print(
        f"### run {tag}: {a.rounds} rounds" + (f", stop after {stop_after}" if stop_after else ""),
        flush=True,
    )
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, timeout=max(1.0, timeout))  # output goes straight through
        rc = p.returncode
    except subprocess.TimeoutExpired:
        rc = "timeout"
    process_s = time.perf_counter() - t0
    if rc != 0 or not res_file.exists():
        return {"tag": tag, "error": f"rc={rc}", "process_s": process_s}
    res = json.loads(res_file.read_text())
    res["process_s"] = process_s
    print(
        f"### run {tag}: build {res['build_s']:.1f} s, run {res['run_s']:.1f} s "
        f"({res['rounds_per_s']:.2f} rounds/s, median round {res['median_round_s'] * 1e3:.1f} ms), "
        f"process {process_s:.1f} s, final acc {res['final_accuracy']}, sha {res['final_sha256'][:16]}",
        flush=True,
    )
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--rounds", type=int, default=1500)
    ap.add_argument("--clients", type=int, default=1000)
    ap.add_argument("--per-client", type=int, default=50)
    ap.add_argument("--clients-per-round", type=int, default=50)
    ap.add_argument("--test-size", type=int, default=10_000)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--print-every", type=int, default=100)
    ap.add_argument(
        "--budget-s", type=float, default=380.0,
        help="seconds for both runs together: the second is cut (stop_after) to fit",
    )  # fmt: skip
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/pfl_e2e"))
    ap.add_argument("--child")
    ap.add_argument("--stop-after", type=int)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.child:
        a.tag = a.child
        (out / f"run{a.child}.json").write_text(json.dumps(child(a), indent=1))
        return
    t_all = time.perf_counter()
    info = env(a.device)
    print(json.dumps(info), flush=True)
    res: dict = {
        "benchmark": "pfl_e2e",
        **info,
        "shape": {
            "clients": a.clients,
            "images_per_client": a.per_client,
            "image": [3, 32, 32],
            "clients_per_round": min(a.clients_per_round, a.clients),
            "batch_size": 10,
            "local_epochs": 1,
            "optimizer": "sgd lr 0.1",
            "model": "PflCNN (1,626,442 params)",
            "algorithm": "FedAvg",
            "engine": "cohort",
            "eval_every": a.eval_every,
            "test_images": a.test_size,
            "data": "synthetic uint8, 15/16 noise + 1/16 class template",
        },  # fmt: skip
        "rounds": a.rounds,
        "runs": [],
    }
    dest = out / "pfl_e2e.json"

    def save() -> None:
        dest.write_text(json.dumps(res, indent=1))

    r1 = spawn(a, "1", None, a.budget_s, out)
    res["runs"].append(r1)
    save()
    if "error" in r1:
        print(f"run 1 failed: {r1['error']}", flush=True)
        sys.exit(1)
    left = a.budget_s - (time.perf_counter() - t_all)
    # the second run's process: its fixed part (process - run) plus the rounds at run 1's rate
    fixed = r1["process_s"] - r1["run_s"]
    per_round = r1["run_s"] / r1["rounds_run"]
    stop_after = None
    if fixed + per_round * a.rounds * 1.1 > left:
        fits = [c for c in CHECKPOINTS if c < a.rounds and fixed + per_round * c * 1.1 <= left]
        stop_after = max(fits) if fits else 10
        print(f"### {left:.0f} s left: run 2 stops after round {stop_after}", flush=True)
    res["second_run_stop_after"] = stop_after
    r2 = spawn(a, "2", stop_after, left, out)
    res["runs"].append(r2)
    if "error" in r2:
        print(f"run 2 failed: {r2['error']}", flush=True)
        save()
        sys.exit(1)
    cmp = compare(r1, r2)
    res["comparison"] = cmp
    res["identical"] = cmp["identical_model"] and cmp["identical_accuracies"]
    res["wall_s"] = [r1["wall_s"], r2["wall_s"]]
    res["run_s"] = [r1["run_s"], r2["run_s"]]
    res["build_s"] = [r1["build_s"], r2["build_s"]]
    res["rounds_per_s"] = [r1["rounds_per_s"], r2["rounds_per_s"]]
    res["median_round_ms"] = [r1["median_round_s"] * 1e3, r2["median_round_s"] * 1e3]
    res["sha256"] = [r1["final_sha256"], r2["final_sha256"]]
    pick = [r for r in ("10", "100", "300", "500", "1000", "1500", str(r1["rounds_run"]))
            if r in r1["accuracy"]]  # fmt: skip
    res["accuracy_at"] = {
        r: [r1["accuracy"][r], r2["accuracy"].get(r)] for r in dict.fromkeys(pick)
    }
    res["total_script_s"] = time.perf_counter() - t_all
    save()
    print(
        json.dumps(
            {
                k: res[k]
                for k in (
                    "device_name",
                    "torch",
                    "rounds",
                    "wall_s",
                    "run_s",
                    "build_s",
                    "rounds_per_s",
                    "median_round_ms",
                    "identical",
                    "accuracy_at",
                    "second_run_stop_after",
                )
            },
            indent=1,
        ),  # fmt: skip
        flush=True,
    )
    print(json.dumps(cmp), flush=True)


if __name__ == "__main__":
    main()
