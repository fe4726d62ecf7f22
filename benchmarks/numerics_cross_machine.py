"""Cross-machine check of fedcore.numerics: the same seeded federation (real cifar_cnn, synthetic
28x28 data) under portable and native numerics, each (mode, engine) in a fresh process.

Run it on two machines with the same torch build and compare the digests: the results of
2026-11-25 are in benchmarks/results/numerics_cross_machine/ (an AMD EPYC Zen 4 with AVX-512
and an Intel Xeon with AVX-512 and AMX, both torch 2.11.0, MKL 2024.2; docs/numerics.md).

    python cpu_numerics_probe.py [--out FILE]          # parent: runs the children, prints JSON
    python cpu_numerics_probe.py --child MODE ENGINE    # one run (apply() before any compute)

Prints/writes JSON: per (mode, engine) the sha256 of the final global_state (tensors in key
order: key, dtype, shape, numpy bytes), per-key and per-round digests, final accuracy, the
history, numerics.provenance(), and digests of single ops on fixed inputs (to localise a
difference).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = ("portable", "native")
ENGINES = (("sequential", 1), ("cohort", 0))
STRIP = (  # a fresh process on a fresh machine: no numerics settings inherited
    "FEDAPT_NUMERICS",
    "FEDAPT_NUMERICS_THREADS",
    "ATEN_CPU_CAPABILITY",
    "MKL_CBWR",
    "DNNL_MAX_CPU_ISA",
    "MKL_ENABLE_INSTRUCTIONS",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
)


def state_digest(state) -> str:
    h = hashlib.sha256()
    for k, v in state.items():
        a = v.detach().cpu().contiguous().numpy()
        h.update(k.encode())
        h.update(str(a.dtype).encode())
        h.update(str(a.shape).encode())
        h.update(a.tobytes())
    return h.hexdigest()


def tensor_digest(t) -> str:
    return hashlib.sha256(t.detach().cpu().contiguous().numpy().tobytes()).hexdigest()[:16]


def make_data(n: int, rng):
    import numpy as np
    import torch

    from fedcore.client import ImageData

    # Class templates (coarse 7x7 patterns upsampled to 28x28) plus pixel noise: learnable.
    tg = np.random.Generator(np.random.PCG64(12345))
    templates = np.kron(tg.uniform(-1, 1, (10, 7, 7)), np.ones((4, 4)))  # (10, 28, 28)
    labels = rng.integers(0, 10, n).astype(np.int64)
    pix = 128 + 60 * templates[labels] + 50 * rng.standard_normal((n, 28, 28))
    images = np.clip(np.rint(pix), 0, 255).astype(np.uint8)[:, None]
    return ImageData(torch.from_numpy(images), torch.from_numpy(labels), (0.5,), (0.29,))


def op_digests() -> dict[str, str]:
    """Single ops of the model on fixed float32 inputs (same bytes on every machine)."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    g = np.random.Generator(np.random.PCG64(7))

    def t(*shape, grad=False):
        x = torch.from_numpy(g.standard_normal(shape).astype(np.float32))
        return x.requires_grad_(grad)

    out: dict[str, str] = {}
    x, w1, b1 = t(32, 1, 28, 28, grad=True), t(64, 1, 5, 5, grad=True), t(64, grad=True)
    y1 = F.conv2d(x, w1, b1)
    out["conv1_fwd"] = tensor_digest(y1)
    y1.sum().backward()
    out["conv1_bwd_w"], out["conv1_bwd_b"] = tensor_digest(w1.grad), tensor_digest(b1.grad)
    x2, w2 = t(32, 64, 12, 12, grad=True), t(64, 64, 5, 5, grad=True)
    y2 = F.conv2d(x2, w2)
    out["conv2_fwd"] = tensor_digest(y2)
    y2.pow(2).sum().backward()
    out["conv2_bwd_w"], out["conv2_bwd_x"] = tensor_digest(w2.grad), tensor_digest(x2.grad)
    a, wl = t(32, 1024, grad=True), t(394, 1024, grad=True)
    yl = F.linear(a, wl)
    out["linear_fwd"] = tensor_digest(yl)
    yl.pow(2).sum().backward()
    out["linear_bwd_w"], out["linear_bwd_x"] = tensor_digest(wl.grad), tensor_digest(a.grad)
    out["mm_512"] = tensor_digest(t(512, 512) @ t(512, 512))
    out["maxpool"] = tensor_digest(F.max_pool2d(t(32, 64, 24, 24), 2))
    logits, lab = t(32, 10), torch.from_numpy(g.integers(0, 10, 32))
    out["cross_entropy"] = tensor_digest(F.cross_entropy(logits, lab))
    out["relu_exp_sum"] = tensor_digest(torch.relu(t(4096)).exp().sum())
    out["softmax"] = tensor_digest(torch.softmax(t(64, 394), 1))
    return out


def child(mode: str, engine: str, workers: int) -> dict:
    from fedcore import numerics

    numerics.apply(mode)  # before anything computes

    import numpy as np

    import models
    from fedcore.algorithms import build_algorithm
    from fedcore.client import LocalConfig
    from fedcore.engine import FederationConfig, Simulation
    from fedcore.events import Callback
    from fedcore.schedules import LRSchedule

    rng = np.random.Generator(np.random.PCG64(0))
    train, test = make_data(1200, rng), make_data(400, rng)
    model_fn = functools.partial(
        models.get_model, "cifar_cnn", num_classes=10, in_channels=1, input_size=28
    )
    sim = Simulation(
        model_fn=model_fn,
        algorithm=build_algorithm("fedavg"),
        train=train,
        test=test,
        shards=np.array_split(np.arange(1200), 4),
        noise_var=[0.0, 0.01, 0.02, 0.03],
        local=LocalConfig(batch_size=32, momentum=0.9, weight_decay=5e-4),
        lr_schedule=LRSchedule(kind="exponential", lr=0.05, decay=0.9),
        federation=FederationConfig(rounds=3, clients_per_round=4, seed=7),
        workers=workers,
        device="cpu",
        engine=engine,
    )
    per_round: list[dict] = []

    class Rec(Callback):
        def on_round_end(self, record) -> None:
            st = {k: v.detach().cpu() for k, v in sim.global_state.items()}
            per_round.append(
                {
                    "round": record.round,
                    "state_sha256": state_digest(st),
                    "keys": {k: tensor_digest(v) for k, v in st.items()},
                }
            )

    sim.callbacks.append(Rec())
    t0 = time.perf_counter()
    hist = sim.run()
    seconds = time.perf_counter() - t0
    final = {k: v.detach().cpu() for k, v in sim.global_state.items()}
    prov = numerics.provenance()
    return {
        "mode": mode,
        "engine": engine,
        "workers": sim.workers,
        "state_sha256": state_digest(final),
        "final_accuracy": hist.rounds[-1].accuracy,
        "history": [
            {k: r.to_dict()[k] for k in ("round", "train_loss", "accuracy", "test_loss")}
            for r in hist.rounds
        ],
        "per_round": per_round,
        "seconds": round(seconds, 2),
        "provenance": prov,
        "ops": op_digests(),
        "python": sys.version.split()[0],
    }


def parent(out_path: str | None) -> None:
    env = {k: v for k, v in os.environ.items() if k not in STRIP}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH", ""), ROOT) if p)
    results = []
    for mode in MODES:
        for engine, workers in ENGINES:
            cmd = [sys.executable, os.path.abspath(__file__), "--child", mode, engine, str(workers)]
            r = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
            if r.returncode != 0:
                results.append({"mode": mode, "engine": engine, "error": r.stderr[-3000:]})
                print(f"[{mode}/{engine}] FAILED\n{r.stderr[-3000:]}", file=sys.stderr)
                continue
            res = json.loads(r.stdout.strip().splitlines()[-1])
            results.append(res)
            print(
                f"[{mode}/{engine}] {res['state_sha256']} acc={res['final_accuracy']} "
                f"{res['seconds']}s isa={res['provenance']['aten_capability']} "
                f"cbwr={res['provenance']['mkl_cbwr']} threads={res['provenance']['threads']}",
                file=sys.stderr,
                flush=True,
            )
    text = json.dumps(results, indent=1)
    if out_path:
        with open(out_path, "w") as f:
            f.write(text)
    print(text)


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2], sys.argv[3], int(sys.argv[4]))))
    else:
        parent(sys.argv[2] if len(sys.argv) >= 3 and sys.argv[1] == "--out" else None)
