"""The parts of benchmarks/pfl_e2e.py that are not the run: the device sync, the model's
hash, the synthetic CIFAR-shaped data and the comparison of two runs."""

from __future__ import annotations

import hashlib


def sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def state_sha256(state) -> str:  # type: ignore[no-untyped-def]
    """sha256 over the state_dict: per key in sorted order, its name, dtype, shape and bytes."""
    import torch

    h = hashlib.sha256()
    for k in sorted(state):
        t = state[k].detach().to("cpu").contiguous()
        h.update(f"{k}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def synthetic(n: int, templates, seed: int):  # type: ignore[no-untyped-def]
    """n uint8 images 3x32x32: (15 * uniform noise + template[label]) / 16, and the labels."""
    import torch

    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (n,), generator=g)
    images = torch.empty((n, 3, 32, 32), dtype=torch.uint8)
    for s in range(0, n, 10_000):  # chunks: int16 working memory stays small
        e = min(n, s + 10_000)
        noise = torch.randint(0, 256, (e - s, 3, 32, 32), generator=g, dtype=torch.int16)
        mixed = (noise * 15 + templates[labels[s:e]]) // 16
        images[s:e] = mixed.to(torch.uint8)
    return images, labels


def compare(r1: dict, r2: dict) -> dict:
    """At the last round both ran (a hashed round when the second stopped early)."""
    at = min(r1["rounds_run"], r2["rounds_run"])
    h1, h2 = r1["sha256"].get(str(at)), r2["sha256"].get(str(at))
    acc1 = {r: v for r, v in r1["accuracy"].items() if int(r) <= at}
    acc2 = {r: v for r, v in r2["accuracy"].items() if int(r) <= at}
    # the second run's last round is evaluated even off the 10-round grid (stop_after)
    common = sorted(set(acc1) & set(acc2), key=int)
    diff = [r for r in common if acc1[r] != acc2[r]]
    shared_hashes = sorted(set(r1["sha256"]) & set(r2["sha256"]), key=int)
    return {
        "compared_at_round": at,
        "sha256_run1": h1,
        "sha256_run2": h2,
        "identical_model": h1 is not None and h1 == h2,
        "identical_init": r1["init_sha256"] == r2["init_sha256"],
        "accuracies_compared": len(common),
        "accuracy_rounds_differing": diff[:20],
        "identical_accuracies": bool(common) and not diff,
        "hash_rounds_differing": [r for r in shared_hashes if r1["sha256"][r] != r2["sha256"][r]],
    }
