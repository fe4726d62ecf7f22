"""The pretrain stage: a backbone trained centrally on data the federation never sees, cached
as a versioned artifact and used as the frozen base of the FL stage (``model.base: pretrain``).

Seed 000 adapts a *pretrained* ResNet26 (Rebuffi's domain-agnostic base); offline there are no
ImageNet ResNet weights, so fedapt trains the base itself on a source disjoint from the
federated target (``pretrain`` in params.yaml):

* the training rows outside ``data.train_subset`` (same dataset, disjoint samples), optionally
  only ``pretrain.classes`` (e.g. half the classes: the base never saw the others' images); or
* another registered dataset (``pretrain.dataset``, a source domain), read the same way.

A next-token decoder (``gpt2_small`` on ``shakespeare``) pretrains by causal language
modelling on the plays held out of the federation instead: ``tasks/data/pretrain_lm.py``.

The base sees inputs exactly as the federation will (same size, channels and normalisation,
``tasks.data.backbone.model_input``); its classifier is sized for the source and dropped when the FL
model copies the base in. Outputs (``out_dir``): ``base.pt`` (the state dict, ``fedcore.payload``
bytes) and ``base.json`` (source, rows and their sha256, per-epoch loss and source-test accuracy,
the base's sha256; no timings, so a rerun writes the same bytes). DVC caches both and
``dvc push`` stores them in the S3 remote, addressed by content; ``fedapt run`` keeps them in
``reports/<experiment>/pretrain/`` (copied to S3 with the run) and logs them to MLflow.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from prefect import task
from prefect.cache_policies import NO_CACHE

from fedcore import payload
from fedcore.client import ImageData, LocalConfig, evaluate, train_locally
from fedcore.datasets import ArrayDataset, get_dataset_info, load_dataset
from fedcore.errors import ConfigError
from models import get_model
from tasks.data.backbone import BASE_FILE, backbone_options, model_input
from tasks.config import Params
from tasks.data.experiment import ExperimentData
from tasks.io import atomic_write_bytes, atomic_write_json

CARD_FILE = "base.json"
_SOURCE_STREAM = 11  # seed stream of the source subset (tasks.data.experiment uses 7 for the FL subset)


def fingerprint(params: Params) -> str:
    """sha256 of everything the base depends on (the flow reuses a base with the same one)."""
    keys = {
        "seed": params.experiment.seed,
        "data": params.data.model_dump(mode="json"),
        "model": params.model.model_dump(mode="json"),
        "pretrain": params.pretrain.model_dump(mode="json"),
    }
    return hashlib.sha256(json.dumps(keys, sort_keys=True).encode()).hexdigest()


def is_lm(params: Params) -> bool:
    """The federation's data is next-token windows: the decoder's stage applies."""
    return get_dataset_info(params.data.dataset).kind == "lm"


def check_source(params: Params, data: ExperimentData) -> None:
    """A pretrain source that cannot be used -> one line, before any training. ``data``: the
    experiment's (``load_experiment_data``)."""
    if not is_lm(params):
        source_split(params, data)
    else:
        from tasks.data.pretrain_lm import source_blocks

        source_blocks(params, data.tokenizer)


def _rows_sha256(ds: ArrayDataset, rows: np.ndarray) -> str:
    idx = torch.as_tensor(rows)
    digest = hashlib.sha256(ds.images.index_select(0, idx).contiguous().numpy().tobytes())
    digest.update(ds.labels.index_select(0, idx).numpy().astype(np.int64).tobytes())
    return digest.hexdigest()


def source_split(
    params: Params, data: ExperimentData
) -> tuple[ArrayDataset, np.ndarray, ArrayDataset, np.ndarray]:
    """(train split, its source rows, test split, its rows) of the pretrain source; ``data``:
    the experiment's (``load_experiment_data``)."""
    p, d = params.pretrain, params.data
    fl = data
    name = p.dataset or d.dataset
    if name == d.dataset:
        train, test = fl.train, fl.test
        # sorted; the FL rows include data.validation's (never pretrained on either)
        rows = np.setdiff1d(np.arange(len(train), dtype=np.int64), fl.selected_idx)
        if len(rows) == 0:
            raise ConfigError(
                f"pretrain: data.train_subset uses every training row of {name}; set "
                f"data.train_subset below {len(train)} or pretrain.dataset to another dataset"
            )
        # the FL test rows (data.test_subset); every row where the federation's verdict
        # window measures the whole split (federation.whole_test_last)
        test_rows = (
            np.arange(len(test), dtype=np.int64)
            if params.federation.whole_test_last > 0
            else np.asarray(fl.test_idx, dtype=np.int64)
        )
    else:
        train = load_dataset(name, d.root, "train", download=d.download)
        test = load_dataset(name, d.root, "test", download=d.download)
        rows = np.arange(len(train), dtype=np.int64)
        test_rows = np.arange(len(test), dtype=np.int64)
    if p.classes is not None:
        n = train.info.num_classes
        if max(p.classes) >= n:
            raise ConfigError(
                f"pretrain.classes: {name} has classes 0..{n - 1} (got {list(p.classes)})"
            )
        keep = list(p.classes)
        rows = rows[np.isin(train.labels.numpy()[rows], keep)]
        test_rows = test_rows[np.isin(test.labels.numpy()[test_rows], keep)]
    if p.max_samples is not None and p.max_samples < len(rows):
        seq = np.random.SeedSequence([params.experiment.seed, _SOURCE_STREAM])
        rows = np.sort(np.random.default_rng(seq).choice(rows, p.max_samples, replace=False))
    if len(rows) == 0:
        raise ConfigError(f"pretrain: no {name} training rows of classes {list(p.classes or [])}")
    if len(rows) % p.batch_size == 1:  # a last batch of one image breaks BatchNorm in training
        rows = rows[:-1]
    return train, rows.astype(np.int64), test, test_rows


def train_base(params: Params, out_dir: str | Path, data: ExperimentData) -> dict[str, Any]:
    """Train the base on the source; write base.pt and base.json; return the card. ``data``:
    the experiment's (``load_experiment_data``)."""
    if is_lm(params):
        from tasks.data.pretrain_lm import train_decoder_base

        return train_decoder_base(params, out_dir, fingerprint(params), data)
    p = params.pretrain
    train, rows, test, test_rows = source_split(params, data)
    fl_info = data.train.info
    inp = model_input(params, fl_info)  # the federation's input, so the base fits it
    if train.info.kind != "image":  # e.g. pretrain.dataset: tweet_sentiment
        raise ConfigError(
            f"pretrain.dataset {train.info.name!r} is text; the pretrain stage trains image "
            f"backbones on image data"
        )
    if train.info.input_shape[0] not in (1, inp.channels):
        raise ConfigError(
            f"pretrain.dataset {train.info.name!r} has {train.info.input_shape[0]} channels; "
            f"the model takes {inp.channels} ({params.data.dataset})"
        )

    def as_input(ds: ArrayDataset) -> ImageData:
        return ImageData(
            ds.images, ds.labels, inp.mean, inp.std, size=inp.size, channels=inp.channels
        )

    torch.manual_seed(params.experiment.seed)
    model = get_model(
        params.model.name,
        num_classes=train.info.num_classes,
        in_channels=inp.channels,
        input_size=inp.size,
        options=backbone_options(params),
    )
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    cfg = LocalConfig(
        local_epochs=1, batch_size=p.batch_size, momentum=p.momentum, weight_decay=p.weight_decay
    )
    epochs = []
    for epoch in range(p.epochs):
        result = train_locally(
            model,
            state,
            as_input(train),
            rows,
            lr=p.lr,
            cfg=cfg,
            seed=params.experiment.seed * 1000 + epoch,
        )
        state = result.state
        correct, loss_sum, n = evaluate(model, state, as_input(test), test_rows)
        epochs.append(
            {
                "epoch": epoch + 1,
                "train_loss": round(result.train_loss, 6),
                "test_accuracy": round(correct / max(n, 1), 6),
                "test_loss": round(loss_sum / max(n, 1), 6),
            }
        )
    blob = payload.encode(state)
    out = Path(out_dir)
    atomic_write_bytes(out / BASE_FILE, blob)
    card = {
        "used": True,
        "fingerprint": fingerprint(params),
        "model": params.model.name,
        "input_shape": list(inp.shape),
        "source": {
            "dataset": train.info.name,
            "rows": int(len(rows)),
            "classes": list(p.classes) if p.classes is not None else "all",
            "disjoint_from_fl_rows": train.info.name == params.data.dataset,
            "sha256": _rows_sha256(train, rows),
            "test_rows": int(len(test_rows)),
        },
        "epochs": epochs,
        "final_test_accuracy": epochs[-1]["test_accuracy"],
        "base_bytes": len(blob),
        "base_sha256": hashlib.sha256(blob).hexdigest(),
    }
    atomic_write_json(out / CARD_FILE, card)
    return card


def run_pretrain(
    params: Params,
    out_dir: str | Path,
    data: ExperimentData | None,
    *,
    reuse: bool = False,
    timing_file: str | Path | None = None,
) -> dict[str, Any]:
    """The stage: train the base when ``model.base`` is pretrain (else write a card saying it is
    unused, so the DVC pipeline stays one graph). ``data``: the experiment's
    (``load_experiment_data``; None where ``model.base`` is not pretrain). ``reuse``: keep a base
    whose card has the same fingerprint and whose bytes still match (the flow's cache; DVC does
    its own)."""
    out = Path(out_dir)
    if params.model.base != "pretrain":
        (out / BASE_FILE).unlink(missing_ok=True)
        card = {"used": False, "reason": f"model.base is {params.model.base}"}
        atomic_write_json(out / CARD_FILE, card)
        return card
    if reuse and (cached := cached_card(params, out)) is not None:
        return cached
    if data is None:
        raise ValueError("run_pretrain: model.base pretrain trains on the experiment's data")
    started = time.perf_counter()
    card = train_base(params, out, data)
    if timing_file is not None:
        atomic_write_json(timing_file, {"wall_seconds": round(time.perf_counter() - started, 3)})
    return card


def cached_card(params: Params, out: Path) -> dict[str, Any] | None:
    try:
        card = json.loads((out / CARD_FILE).read_text())
        blob = (out / BASE_FILE).read_bytes()
    except (OSError, ValueError):
        return None
    same = card.get("fingerprint") == fingerprint(params)
    if same and card.get("base_sha256") == hashlib.sha256(blob).hexdigest():
        return {**card, "cached": True}
    return None


@task(name="pretrain", cache_policy=NO_CACHE, retries=0)
def pretrain_task(params: Params, out_dir: str, data: ExperimentData) -> str:
    """Train (or reuse) the frozen base on the pretrain source; returns the base.pt path.
    ``data``: the experiment's (the run's plan's)."""
    run_pretrain(params, out_dir, data, reuse=True)
    return str(Path(out_dir) / BASE_FILE)


@task(name="log-pretrain-base", cache_policy=NO_CACHE)
def log_base_task(run_id: str, base_path: str, artifact_path: str = "pretrain") -> None:
    """The base and its card as artifacts (``pretrain/``; a sweep's ``seed-<s>/pretrain/``)
    of the experiment's MLflow run."""
    from tasks import tracking

    base = Path(base_path)
    tracking.log_artifacts(run_id, [str(base), str(base.with_name(CARD_FILE))], artifact_path)
