"""What the adapter methods' tests share (tests/models/adapters/, tests/fedcore/test_exits_pa.py):
tiny backbones by kind (BERT, ViT, EfficientNet-Lite0) with an adapter method, their data and
inputs, and the state keys one client's local training changes."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from fedcore.client import LocalConfig, train_locally
from fedcore.text import TextData
from models import get_model
from models.adapters import adapt
from tests.helpers import tiny_bert, tiny_vit, toy_data


def effnet(num_classes: int = 3) -> nn.Module:
    return get_model(
        "efficientnet_lite0",
        num_classes=num_classes,
        in_channels=1,
        input_size=16,
        pretrained=True,  # the offline ImageNet weights (a random base has flat outputs)
    )


BUILDERS = {"bert": tiny_bert, "vit": tiny_vit, "efficientnet": effnet}


def build(kind: str, adapter: str | None = "lora", options: dict | None = None) -> nn.Module:
    torch.manual_seed(0)
    model = BUILDERS[kind]()
    return model if adapter is None else adapt(model, adapter, kind, options)


def data(kind: str, n: int = 64, seed: int = 0):
    if kind == "bert":
        g = torch.Generator().manual_seed(seed)
        tokens = torch.randint(1, 40, (n, 10), generator=g)
        tokens[:, 0] = 1  # [CLS]
        labels = (tokens[:, 1] % 3).long()  # learnable from the first real token
        return TextData(tokens, labels, pad_id=0)
    return toy_data(n, seed, size=12 if kind == "vit" else 16)


def inputs(kind: str, n: int = 8) -> torch.Tensor:
    return data(kind, n, seed=5).batch(torch.arange(n))[0]


def one_step_changes(model: nn.Module, method, kind: str, batch_size: int = 16) -> set[str]:
    """The state keys that one client's local training (32 rows, SGD with momentum and
    weight decay) changes, under ``method``'s trainable keys."""
    before = {k: v.clone() for k, v in model.state_dict().items()}
    res = train_locally(
        model,
        before,
        data(kind, 32),
        np.arange(32),
        lr=0.1,
        cfg=LocalConfig(batch_size=batch_size, momentum=0.9, weight_decay=5e-4),
        seed=1,
        trainable=method.trainable_keys(model),
    )
    return {k for k in before if not torch.equal(before[k], res.state[k])}
