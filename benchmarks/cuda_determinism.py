"""CUDA determinism probe: the same seeded federation, run twice in one process and once in
each of two fresh processes on CUDA, for engine="sequential" and engine="cohort"; are the
final global_state bytes identical run to run? Also: max |CUDA - CPU| of the final weights.

    python3 cuda_determinism.py [--out result.json] [--devices cuda,cpu] [--models tiny,cifar_cnn]

A child process (--child) runs each CUDA configuration once and prints its digests as JSON.
Digest: sha256 over the final global_state tensors' numpy bytes, concatenated in key order.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the repo root (from .gpu_carry/ or benchmarks/)
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from fedcore.algorithms import build_algorithm  # noqa: E402
from fedcore.client import ImageData, LocalConfig  # noqa: E402
from fedcore.engine import FederationConfig, Simulation  # noqa: E402
from fedcore.schedules import LRSchedule  # noqa: E402
from tests.helpers import tiny_layered, toy_data  # noqa: E402

ENGINES = ("sequential", "cohort")


def toy10(n: int, seed: int, size: int = 28) -> ImageData:
    """size x size gray images, 10 classes by mean-brightness decile (learnable)."""
    g = torch.Generator().manual_seed(seed)
    images = (torch.rand(n, 1, size, size, generator=g) * 255).to(torch.uint8)
    m = images.float().mean((1, 2, 3))
    edges = torch.quantile(m, torch.linspace(0, 1, 11)[1:-1])
    labels = torch.bucketize(m, edges).long()
    return ImageData(images, labels, (0.5,), (0.25,))


def cifar_cnn_fn():
    import models  # imports every backbone module (efficientnet_lite_pytorch needed)

    return models.get_model("cifar_cnn", num_classes=10, in_channels=1, input_size=28)


def config(model: str):
    if model == "tiny":  # as tests/fedcore/engine/test_gpu.py cohort_on
        return dict(
            model_fn=tiny_layered,
            train=toy_data(400),
            test=toy_data(200, seed=1),
            shards=[np.arange(0, 30), np.arange(30, 150), np.arange(150, 400)],
            noise_var=[0.0, 0.01, 0.02],
            local=LocalConfig(batch_size=16, momentum=0.9, weight_decay=5e-4),
            federation=FederationConfig(rounds=3, clients_per_round=3, seed=7),
        )
    if model == "cifar_cnn":
        return dict(
            model_fn=functools.partial(cifar_cnn_fn),
            train=toy10(2000, 0),
            test=toy10(500, 1),
            shards=np.array_split(np.arange(2000), 5),
            noise_var=[0.0, 0.01, 0.02, 0.03, 0.04],
            local=LocalConfig(batch_size=32, momentum=0.9, weight_decay=5e-4),
            federation=FederationConfig(rounds=3, clients_per_round=4, seed=7),
        )
    raise ValueError(model)


def run_once(model: str, engine: str, device: str, algorithm: str = "fedavg"):
    c = config(model)
    sim = Simulation(
        algorithm=build_algorithm(algorithm),
        lr_schedule=LRSchedule(kind="exponential", lr=0.05, decay=0.9),
        workers=0,
        device=device,
        engine=engine,
        **c,
    )
    t = time.perf_counter()
    hist = sim.run()
    secs = time.perf_counter() - t
    state = {k: v.detach().to("cpu").contiguous() for k, v in sim.global_state.items()}
    h = hashlib.sha256()
    for k in state:
        h.update(state[k].numpy().tobytes())
    rounds = [r.to_dict() | {"seconds": 0} for r in hist.rounds]
    hh = hashlib.sha256(json.dumps(rounds, sort_keys=True, default=str).encode()).hexdigest()
    return state, {
        "state_sha256": h.hexdigest(),
        "history_sha256": hh,
        "final_accuracy": hist.rounds[-1].accuracy,
        "final_train_loss": hist.rounds[-1].train_loss,
        "seconds": round(secs, 3),
    }


def max_abs_diff(a: dict, b: dict) -> dict:
    out = {}
    for k in a:
        if a[k].is_floating_point():
            out[k] = float((a[k].double() - b[k].double()).abs().max())
    worst = max(out, key=out.get) if out else None
    return {"max": out[worst] if worst else 0.0, "worst_key": worst}


def child(models_: list[str]) -> None:
    res = {}
    for m in models_:
        for e in ENGINES:
            try:
                res[f"{m}/{e}"] = run_once(m, e, "cuda")[1]
            except Exception as exc:  # noqa: BLE001
                res[f"{m}/{e}"] = {"error": f"{type(exc).__name__}: {exc}"}
    print("CHILD_JSON " + json.dumps(res))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="cuda_determinism.json")
    p.add_argument("--devices", default="cuda,cpu")
    p.add_argument("--models", default="tiny,cifar_cnn")
    p.add_argument("--child", action="store_true")
    a = p.parse_args()
    models_ = a.models.split(",")
    if a.child:
        return child(models_)
    devices = a.devices.split(",")
    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "cpu_threads": torch.get_num_threads(),
    }
    results: dict = {"env": env, "configs": {}}
    for m in models_:
        for e in ENGINES:
            key = f"{m}/{e}"
            r: dict = {}
            try:
                states = {}
                for dev in devices:
                    runs = []
                    for _ in range(2 if dev == "cuda" else 1):
                        s, info = run_once(m, e, dev)
                        runs.append(info)
                        states.setdefault(dev, s)
                    r[dev] = runs
                if "cuda" in states:
                    r["cuda_same_process_identical"] = (
                        r["cuda"][0]["state_sha256"] == r["cuda"][1]["state_sha256"]
                    )
                    r["cuda_same_process_history_identical"] = (
                        r["cuda"][0]["history_sha256"] == r["cuda"][1]["history_sha256"]
                    )
                if "cuda" in states and "cpu" in states:
                    r["cuda_vs_cpu_same_engine"] = max_abs_diff(states["cpu"], states["cuda"])
                    r["cpu_sha256"] = r["cpu"][0]["state_sha256"]
                results["configs"][key] = r
                results["configs"][key]["_states"] = states  # dropped before writing
            except Exception as exc:  # noqa: BLE001
                r["error"] = f"{type(exc).__name__}: {exc}"
                r["traceback"] = traceback.format_exc()[-2000:]
                results["configs"][key] = r
    # CUDA cohort vs CPU sequential (the reference of tests/fedcore/engine/test_gpu.py)
    for m in models_:
        seq = results["configs"].get(f"{m}/sequential", {}).get("_states", {})
        coh = results["configs"].get(f"{m}/cohort", {}).get("_states", {})
        if "cpu" in seq and "cuda" in coh:
            results["configs"][f"{m}/cohort"]["cuda_cohort_vs_cpu_sequential"] = max_abs_diff(
                seq["cpu"], coh["cuda"]
            )
        if "cpu" in seq and "cpu" in coh:
            results["configs"][f"{m}/cohort"]["cpu_vs_cpu_sequential"] = max_abs_diff(
                seq["cpu"], coh["cpu"]
            )
        if "cuda" in seq and "cuda" in coh:
            results["configs"][f"{m}/cohort"]["cuda_cohort_vs_cuda_sequential"] = max_abs_diff(
                seq["cuda"], coh["cuda"]
            )
    for r in results["configs"].values():
        r.pop("_states", None)
    # two fresh processes, CUDA only
    if "cuda" in devices:
        kids = []
        for _ in range(2):
            cp = subprocess.run(
                [sys.executable, __file__, "--child", "--models", a.models],
                capture_output=True,
                text=True,
                env=os.environ.copy(),
            )
            line = [x for x in cp.stdout.splitlines() if x.startswith("CHILD_JSON ")]
            kids.append(json.loads(line[-1][11:]) if line else {"error": cp.stderr[-2000:]})
        results["child_processes"] = kids
        for key, r in results["configs"].items():
            if "cuda" not in r:
                continue
            shas = [k.get(key, {}).get("state_sha256") for k in kids]
            r["cuda_two_processes_identical"] = shas[0] is not None and shas[0] == shas[1]
            r["cuda_process_vs_in_process_identical"] = shas[0] == r["cuda"][0]["state_sha256"]
    Path(a.out).write_text(json.dumps(results, indent=1, default=str))
    summary = {
        k: {x: v.get(x) for x in v if x not in ("cuda", "cpu", "traceback")}
        for k, v in results["configs"].items()
    }
    print(json.dumps({"env": env, "summary": summary}, indent=1, default=str))


if __name__ == "__main__":
    main()
