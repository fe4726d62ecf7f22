"""Update codecs: what encoding and decoding cost per round, against sending float32.

One round of the default experiment's traffic on this machine, per codec: 10 clients each
encode their update (``fedcore.codecs.encode_update``, then ``payload.encode``: the bytes on
the wire) and the server decodes it (``payload.decode``, ``decode_update``), plus the round's
one download through the download codec (encoded once, decoded by each client). ``none`` is
fedapt's default path: ``payload.encode`` / ``decode`` of the float32 tensors. Every codec's
round runs in turn, A B C ... A B C, ``--repeats`` times, in this process on one thread (a
client's arithmetic); reported: the median seconds per round, its ratio to ``none``, and the
bytes per client each way.

Model: the default experiment's (``cifar_cnn`` on 1x28x28, 10 classes) and its LoRA payload;
the update is a real one: the model after one local epoch of SGD on 1,200 FashionMNIST rows
minus the model before (the sizes of top-k's selections depend on it, the times barely).

Run:  .venv/bin/python benchmarks/codecs.py [--repeats 7]  (writes benchmarks/results/codecs.json)
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CLIENTS = 10
CODECS = ("none", "fp16", "bf16", "int8", "int4", "topk")


def _states(adapter: str):  # type: ignore[no-untyped-def]
    """(start, trained, raw keys) of one client of the default model under ``adapter``."""
    import numpy as np
    import torch

    from fedcore.client import ImageData, LocalConfig, train_locally
    from fedcore.datasets import load_dataset
    from models import get_model
    from models.adapters import adapt, get_adapter

    tr = load_dataset("fashion_mnist", ROOT / "data/raw", "train", download=False)
    rows = np.random.default_rng(0).permutation(len(tr.labels))[:1200]
    data = ImageData(tr.images, tr.labels, tr.info.mean, tr.info.std)
    torch.manual_seed(0)
    model = get_model("cifar_cnn", num_classes=10, in_channels=1, input_size=28)
    method = get_adapter(adapter)
    trainable = None
    if adapter != "full":
        model = adapt(model, adapter, "cifar_cnn")
        trainable = method.trainable_keys(model)
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    res = train_locally(
        model, start, data, rows, lr=0.05, cfg=LocalConfig(batch_size=32), seed=0,
        trainable=trainable,
    )  # fmt: skip
    keys = list(start) if adapter == "full" else list(method.payload_keys(model))
    params = {k for k, _ in model.named_parameters()}
    raw = frozenset(k for k in keys if k not in params)
    return {k: start[k] for k in keys}, {k: res.state[k] for k in keys}, raw


def _round(codecs, start, trained, raw) -> tuple[float, int, int]:  # type: ignore[no-untyped-def]
    """Seconds of one round's encodes and decodes; bytes up and down per client."""
    from fedcore import payload
    from fedcore.codecs import decode_state, decode_update, encode_state, encode_update

    t0 = time.perf_counter()
    down_codec = codecs.download
    if down_codec is None:
        blob = payload.encode(start)
        for _ in range(CLIENTS):
            payload.decode(blob)
    else:
        blob = payload.encode(encode_state(down_codec, start, upload=False, gen=None, raw=raw))
        for _ in range(CLIENTS):
            decode_state(down_codec, payload.decode(blob), next(iter(start.values())).dtype, raw)
    up = 0
    memory = None
    for c in range(CLIENTS):
        if codecs.upload is None:
            sent = payload.encode(trained)
            payload.decode(sent)
        else:
            enc = encode_update(codecs.upload, start, trained, {}, seed=c, memory=memory, raw=raw)
            sent = payload.encode(enc.wire)
            decode_update(codecs.upload, payload.decode(sent), start, "__upload__.", raw)
        up = len(sent)
    return time.perf_counter() - t0, up, len(blob)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--adapters", default="full,lora")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/codecs.json"))
    args = ap.parse_args()

    import torch

    from fedcore.codecs import Codecs, make_codec

    torch.set_num_threads(1)
    results: dict = {"machine": platform.processor() or platform.machine(), "clients": CLIENTS}
    for adapter in args.adapters.split(","):
        start, trained, raw = _states(adapter)
        codecs = {n: Codecs.of(make_codec(n)) for n in CODECS}
        times: dict[str, list[float]] = {n: [] for n in CODECS}
        sizes: dict[str, tuple[int, int]] = {}
        for _ in range(args.repeats):  # interleaved: every codec once per repeat
            for n in CODECS:
                s, up, down = _round(codecs[n], start, trained, raw)
                times[n].append(s)
                sizes[n] = (up, down)
        base = statistics.median(times["none"])
        rows = {}
        for n in CODECS:
            med = statistics.median(times[n])
            rows[n] = {
                "seconds_per_round": round(med, 4),
                "ratio_to_none": round(med / base, 2),
                "upload_bytes_per_client": sizes[n][0],
                "download_bytes_per_client": sizes[n][1],
            }
            print(
                f"{adapter:5s} {n:5s} {med * 1000:8.1f} ms/round  x{med / base:5.2f}  "
                f"up {sizes[n][0]:>9,} B  down {sizes[n][1]:>9,} B"
            )
        results[adapter] = rows
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
