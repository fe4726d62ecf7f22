"""Small, picklable builders shared by tests (worker processes import them by name), and the
callbacks that record a run or crash it after a round."""

from __future__ import annotations

import io

import numpy as np
import torch
from torch import nn

from fedcore.algorithms import FedAvg
from fedcore.client import ImageData, LocalConfig
from fedcore.engine import FederationConfig, Simulation
from fedcore.events import Callback, ClientRecord, RoundRecord
from fedcore.sampling import derive_seed
from fedcore.schedules import LRSchedule


def tiny_cnn(num_classes: int = 2) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 4, 3),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(4 * 10 * 10, num_classes),
    )


class TinyLayered(nn.Module):
    """A 3-layer net with ``layer_groups()`` (FedNILO's unit of freezing), BatchNorm included."""

    def __init__(self, num_classes: int = 2) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3)
        self.bn1 = nn.BatchNorm2d(4)
        self.fc1 = nn.Linear(4 * 5 * 5, 16)
        self.fc2 = nn.Linear(16, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.max_pool2d(torch.relu(self.bn1(self.conv1(x))), 2)  # (B, 4, 5, 5)
        return self.fc2(torch.relu(self.fc1(torch.flatten(x, 1))))

    def layer_groups(self) -> list[list[str]]:
        return [["conv1", "bn1"], ["fc1"], ["fc2"]]


def tiny_layered(num_classes: int = 2) -> nn.Module:
    return TinyLayered(num_classes)


def toy_data(n: int = 400, seed: int = 0, *, channels: int = 1, size: int = 12) -> ImageData:
    """size x size images whose label is 'brighter than average' (learnable, 2 classes)."""
    g = torch.Generator().manual_seed(seed)
    images = (torch.rand(n, channels, size, size, generator=g) * 255).to(torch.uint8)
    labels = (images.float().mean((1, 2, 3)) > 127.5).long()
    return ImageData(images, labels, (0.5,) * channels, (0.25,) * channels)


class Float64Images(ImageData):
    """Images served as float64 batches (for float64 models: exact comparisons)."""

    def batch(self, idx, **kw):  # type: ignore[no-untyped-def]
        x, y = super().batch(idx, **kw)
        return x.double(), y


def images64(n: int, seed: int) -> Float64Images:
    """``toy_data(n, seed)`` as float64 batches."""
    d = toy_data(n, seed=seed)
    return Float64Images(d.images, d.labels, (0.5,), (0.25,))


class TinyAdaptable(nn.Module):
    """3x3 convs of every alignment the residual merge must respect (padding 1, stride 2,
    padding 0 with a bias, padding 2 with groups), BatchNorm and a linear head; 12x12 in."""

    classifier_name = "fc"

    def __init__(self, num_classes: int = 2) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(4)
        self.conv2 = nn.Conv2d(4, 8, 3, stride=2, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(8)
        self.conv3 = nn.Conv2d(8, 8, 3, padding=0)
        self.conv4 = nn.Conv2d(8, 8, 3, padding=2, groups=2)
        self.fc = nn.Linear(8, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn1(self.conv1(x)))  # (B, 4, 12, 12)
        x = torch.relu(self.bn2(self.conv2(x)))  # (B, 8, 6, 6)
        x = torch.relu(self.conv3(x))  # (B, 8, 4, 4)
        x = torch.relu(self.conv4(x))  # (B, 8, 6, 6)
        return self.fc(x.mean((2, 3)))

    def layer_groups(self) -> list[list[str]]:
        return [["conv1", "bn1"], ["conv2", "bn2"], ["conv3"], ["conv4"], ["fc"]]


def tiny_adaptable(num_classes: int = 2) -> nn.Module:
    return TinyAdaptable(num_classes)


def tiny_adapted(adapter: str, num_classes: int = 2) -> nn.Module:
    from models.adapters import adapt

    return adapt(TinyAdaptable(num_classes), adapter)


def make_sim(
    shards,
    rounds=2,
    m=None,
    workers=0,
    callbacks=(),
    local=None,
    seed=0,
    algorithm=None,
    model_fn=tiny_cnn,
    data=None,
    test=None,
    eval_every=1,
    stop_after=None,
):
    return Simulation(
        model_fn=model_fn,
        algorithm=algorithm or FedAvg(),
        train=data or toy_data(),
        test=test or toy_data(100, seed=1),
        shards=shards,
        local=local or LocalConfig(batch_size=16, momentum=0.9, weight_decay=5e-4),
        lr_schedule=LRSchedule(lr=0.05),
        federation=FederationConfig(
            rounds=rounds,
            clients_per_round=m or len(shards),
            seed=seed,
            eval_every=eval_every,
            stop_after=stop_after,
        ),
        workers=workers,
        callbacks=callbacks,
    )


@torch.no_grad()
def independent_eval(
    model: nn.Module, state, data, rows=None, batch: int = 256
) -> tuple[float, float]:
    """(accuracy, mean cross-entropy) of ``state`` on ``data[rows]`` (all rows: None)."""
    model.load_state_dict(state)
    model.eval()
    if rows is None:
        idx = torch.arange(len(data))
    else:
        idx = torch.as_tensor(np.asarray(rows, dtype=np.int64))
    correct, loss = 0, 0.0
    for pos in idx.split(batch):
        x, y = data.batch(pos)
        logits = model(x)
        correct += int((logits.argmax(-1) == y).sum())
        loss += float(nn.functional.cross_entropy(logits, y, reduction="sum"))
    return correct / len(idx), loss / len(idx)


def independent_accuracy(model: nn.Module, state, data, rows=None) -> float:
    return independent_eval(model, state, data, rows)[0]


def personal_test_split(data, shard, client: int, severity: int, seed: int, tune_fraction):
    """A client's corrupted data and held-out rows, as fedcore.personalize documents them:
    corruption from derive_seed(seed, stream, c, 0), split from derive_seed(seed, stream, c, 1)."""
    from fedcore.personalize import PERSONALIZE_STREAM, corrupt

    shard = np.asarray(shard, dtype=np.int64)
    own = corrupt(data, shard, severity, derive_seed(seed, PERSONALIZE_STREAM, client, 0))
    order = np.random.default_rng(derive_seed(seed, PERSONALIZE_STREAM, client, 1)).permutation(
        len(shard)
    )
    n_tune = min(len(shard) - 1, max(1, round(tune_fraction * len(shard))))
    return own, np.sort(order[n_tune:])


H = 16  # width of the tiny BERT and ViT


def tiny_bert(num_classes: int = 3) -> nn.Module:
    from transformers import BertConfig, BertModel

    from models.minilm import TextEncoderClassifier

    config = BertConfig(
        vocab_size=40,
        hidden_size=H,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    bert = BertModel(config, add_pooling_layer=False)
    return TextEncoderClassifier(
        bert, num_classes=num_classes, pad_id=0, pooling="cls", max_length=16
    )


def tiny_vit(num_classes: int = 3) -> nn.Module:
    from models.timm_vit import ViTClassifier
    from models.vit import ViTConfig

    config = ViTConfig(None, embed_dim=H, depth=2, num_heads=2, patch_size=4)
    return ViTClassifier(config, num_classes=num_classes, in_channels=1, input_size=12)


class Crash(Exception):
    """Raised by ``CrashAfter``: the run dies where a killed process would."""


class CrashAfter(Callback):
    """Saves the engine's state after round ``k`` through a torch.save round trip (what a
    checkpoint file holds), then dies like a killed process would."""

    def __init__(self, sim: Simulation, k: int) -> None:
        self.sim, self.k, self.saved = sim, k, b""

    def on_round_end(self, record) -> None:
        if record.round == self.k:
            buf = io.BytesIO()
            torch.save(self.sim.state_dict(), buf)
            self.saved = buf.getvalue()
            raise Crash


class Records(Callback):
    """Every client's and every round's record of a run, in order."""

    def __init__(self) -> None:
        self.clients: list[ClientRecord] = []
        self.rounds: list[RoundRecord] = []

    def on_client_end(self, record: ClientRecord) -> None:
        self.clients.append(record)

    def on_round_end(self, record: RoundRecord) -> None:
        self.rounds.append(record)


def spec_cell(params, algorithm: str, adapter: str, codec: str = "none", base=None):
    """A resolved cell whose model keys do not matter (its fingerprint, names, lr)."""
    from tasks.grid import CellSpec
    from tasks.training.cell import resolve_cell

    return resolve_cell(params, CellSpec(algorithm, adapter, codec), (None, frozenset()), base)
