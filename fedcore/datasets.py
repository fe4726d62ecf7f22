"""Dataset registry and offline-first loaders, returning uint8 NCHW tensors.

Loading order for every dataset: the torchvision files under ``root`` (no network), then
(FashionMNIST only) the Debian package files, then torchvision's download for users with
internet, and otherwise one line saying exactly how to get the data. torchvision reads the
files; fedapt only converts its arrays to one (N, C, H, W) uint8 tensor kept in memory.
"""

from __future__ import annotations

import gzip
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedcore.errors import ConfigError, DataUnavailableError, UnknownNameError

# Debian's dataset-fashion-mnist package (the embedded default data set).
DEBIAN_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
SPLITS = ("train", "test")


@dataclass(frozen=True)
class DatasetInfo:
    name: str
    num_classes: int
    input_shape: tuple[int, int, int]  # (C, H, W)
    mean: tuple[float, ...]  # per-channel constants of pixel/255
    std: tuple[float, ...]
    torchvision_class: str


@dataclass(frozen=True)
class ArrayDataset:
    images: torch.Tensor  # uint8 (N, C, H, W)
    labels: torch.Tensor  # int64 (N,)
    info: DatasetInfo

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def subset(self, indices: Any) -> ArrayDataset:
        idx = torch.as_tensor(np.asarray(indices), dtype=torch.int64)
        return replace(self, images=self.images[idx].contiguous(), labels=self.labels[idx])

    def normalized(self, indices: Any = None) -> torch.Tensor:
        x = self.images if indices is None else self.images[torch.as_tensor(np.asarray(indices))]
        c = self.info.input_shape[0]
        mean = torch.tensor(self.info.mean).view(1, c, 1, 1)
        std = torch.tensor(self.info.std).view(1, c, 1, 1)
        return (x.float() / 255.0 - mean) / std


_REGISTRY: dict[str, DatasetInfo] = {
    d.name: d
    for d in (
        DatasetInfo("fashion_mnist", 10, (1, 28, 28), (0.2860,), (0.3530,), "FashionMNIST"),
        DatasetInfo("mnist", 10, (1, 28, 28), (0.1307,), (0.3081,), "MNIST"),
        DatasetInfo("emnist", 47, (1, 28, 28), (0.1751,), (0.3332,), "EMNIST"),
        DatasetInfo(
            "cifar10",
            10,
            (3, 32, 32),
            (0.4914, 0.4822, 0.4465),
            (0.2470, 0.2435, 0.2616),
            "CIFAR10",
        ),
        DatasetInfo(
            "cifar100",
            100,
            (3, 32, 32),
            (0.5071, 0.4865, 0.4409),
            (0.2673, 0.2564, 0.2762),
            "CIFAR100",
        ),
        DatasetInfo(
            "svhn", 10, (3, 32, 32), (0.4377, 0.4438, 0.4728), (0.1980, 0.2010, 0.1970), "SVHN"
        ),
    )
}


def list_datasets() -> list[str]:
    return sorted(_REGISTRY)


def get_dataset_info(name: str) -> DatasetInfo:
    if name not in _REGISTRY:
        raise UnknownNameError("dataset", name, _REGISTRY)
    return _REGISTRY[name]


# ---- torchvision readers: (root, split, download) -> (images NCHW uint8, labels int64) ----


def _torchvision(info: DatasetInfo, root: Path, split: str, download: bool) -> tuple[Any, Any]:
    import torchvision.datasets as tvd

    cls = getattr(tvd, info.torchvision_class)
    train = split == "train"
    if info.name == "svhn":
        ds = cls(str(root), split=split, download=download)
        return np.asarray(ds.data), np.asarray(ds.labels)  # data already (N, 3, 32, 32)
    if info.name == "emnist":
        ds = cls(str(root), split="balanced", train=train, download=download)
        # torchvision's EMNIST tensors are stored transposed (W, H): put them upright.
        return ds.data.transpose(1, 2).unsqueeze(1), ds.targets
    ds = cls(str(root), train=train, download=download)
    data = ds.data
    if isinstance(data, np.ndarray):  # CIFAR: (N, H, W, C) uint8
        return np.ascontiguousarray(data.transpose(0, 3, 1, 2)), np.asarray(ds.targets)
    return data.unsqueeze(1), ds.targets  # MNIST family: (N, H, W) uint8 tensor


def _read_idx_gz(path: Path) -> np.ndarray:
    """An IDX file (big-endian header, uint8 payload) as torchvision's MNIST reads it."""
    with gzip.open(path, "rb") as fh:
        raw = fh.read()
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def _debian_fashion_mnist(split: str) -> tuple[Any, Any]:
    prefix = "train" if split == "train" else "t10k"
    images = DEBIAN_FASHION_MNIST / f"{prefix}-images-idx3-ubyte.gz"
    labels = DEBIAN_FASHION_MNIST / f"{prefix}-labels-idx1-ubyte.gz"
    if not (images.is_file() and labels.is_file()):
        raise FileNotFoundError(images)
    return _read_idx_gz(images)[:, None], _read_idx_gz(labels)


def _how_to_get(info: DatasetInfo, root: Path) -> str:
    if info.name == "fashion_mnist":
        return (
            f"FashionMNIST not found under {root} and could not be downloaded; run: make setup  "
            f"(or: sudo apt-get install -y dataset-fashion-mnist)"
        )
    extra = ", split='balanced'" if info.name == "emnist" else ""
    split = ", split='train'" if info.name == "svhn" else ""
    return (
        f"{info.torchvision_class} not found under {root} and download failed; fetch it with "
        f'internet access: python -c "import torchvision; torchvision.datasets.'
        f"{info.torchvision_class}('{root}'{extra}{split}, download=True)\""
    )


def load_dataset(
    name: str, root: str | Path, split: str = "train", *, download: bool = True
) -> ArrayDataset:
    info = get_dataset_info(name)
    if split not in SPLITS:
        raise ConfigError(f"split must be one of {', '.join(SPLITS)} (got {split!r})")
    root = Path(root)
    attempts: list[Callable[[], tuple[Any, Any]]] = [
        lambda: _torchvision(info, root, split, download=False)
    ]
    if name == "fashion_mnist":
        attempts.append(lambda: _debian_fashion_mnist(split))
    if download:
        attempts.append(lambda: _torchvision(info, root, split, download=True))
    for attempt in attempts:
        try:
            images, labels = attempt()
        except Exception:  # missing/corrupt files or no network: try the next source
            continue
        x = torch.as_tensor(np.array(images), dtype=torch.uint8).contiguous()  # own, writable copy
        y = torch.as_tensor(np.array(labels), dtype=torch.int64).reshape(-1)
        if x.ndim != 4 or tuple(x.shape[1:]) != info.input_shape or len(x) != len(y):
            raise DataUnavailableError(f"{name}: unexpected array shape {tuple(x.shape)} in {root}")
        return ArrayDataset(x, y, info)
    raise DataUnavailableError(_how_to_get(info, root))
