"""Dataset loaders: real FashionMNIST offline, every other loader on torchvision-format fixtures.

The network is never touched: fixtures are written in torchvision's exact on-disk layout and
``download=False`` is passed wherever a miss would otherwise try the internet.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import scipy.io
import torch

import fedcore.datasets as ds
from fedcore.errors import DataUnavailableError, UnknownNameError

REPO = Path(__file__).resolve().parents[1]
RNG = np.random.default_rng(0)


def write_idx(path: Path, array: np.ndarray) -> None:
    """IDX format: zero bytes, dtype code 0x08 (uint8), ndim, big-endian dims, payload."""
    path.parent.mkdir(parents=True, exist_ok=True)
    header = bytes([0, 0, 8, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def test_fashion_mnist_real_files():
    train = ds.load_dataset("fashion_mnist", REPO / "data/raw", "train", download=False)
    test = ds.load_dataset("fashion_mnist", REPO / "data/raw", "test", download=False)
    assert train.images.shape == (60000, 1, 28, 28) and train.images.dtype == torch.uint8
    assert len(test) == 10000 and train.info.num_classes == 10
    assert torch.bincount(train.labels).tolist() == [6000] * 10
    x = train.normalized([0, 1])
    assert x.dtype == torch.float32 and x.shape == (2, 1, 28, 28)


def test_fashion_mnist_debian_fallback(tmp_path, monkeypatch):
    if not (ds.DEBIAN_FASHION_MNIST / "t10k-labels-idx1-ubyte.gz").exists():
        pytest.skip("Debian package dataset-fashion-mnist not installed")
    test = ds.load_dataset("fashion_mnist", tmp_path, "test", download=False)
    ref = ds.load_dataset("fashion_mnist", REPO / "data/raw", "test", download=False)
    assert torch.equal(test.images, ref.images) and torch.equal(test.labels, ref.labels)


def test_fashion_mnist_missing_says_how(tmp_path, monkeypatch):
    monkeypatch.setattr(ds, "DEBIAN_FASHION_MNIST", tmp_path / "none")
    with pytest.raises(DataUnavailableError) as exc:
        ds.load_dataset("fashion_mnist", tmp_path, "train", download=False)
    msg = str(exc.value)
    assert "apt-get install -y dataset-fashion-mnist" in msg and "\n" not in msg


@pytest.mark.parametrize(
    ("name", "folder", "prefix"),
    [
        ("mnist", "MNIST", ""),
        ("emnist", "EMNIST", "emnist-balanced-"),
    ],
)
def test_idx_datasets_on_fixtures(tmp_path, name, folder, prefix):
    images = RNG.integers(0, 256, size=(5, 28, 28), dtype=np.uint8)
    labels = np.array([3, 1, 4, 1, 5], dtype=np.uint8)
    raw = tmp_path / folder / "raw"
    for tag in ("train", "t10k" if not prefix else "test"):
        write_idx(raw / f"{prefix}{tag}-images-idx3-ubyte", images)
        write_idx(raw / f"{prefix}{tag}-labels-idx1-ubyte", labels)
    got = ds.load_dataset(name, tmp_path, "train", download=False)
    assert got.images.shape == (5, 1, 28, 28) and got.labels.tolist() == [3, 1, 4, 1, 5]
    if name == "emnist":  # torchvision stores EMNIST transposed; fedapt puts it upright
        assert torch.equal(got.images[0, 0], torch.from_numpy(images[0]).T)
    else:
        assert torch.equal(got.images[0, 0], torch.from_numpy(images[0]))


@pytest.mark.parametrize(
    ("name", "base", "files", "key"),
    [
        (
            "cifar10",
            "cifar-10-batches-py",
            ["data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5"],
            "labels",
        ),
        ("cifar100", "cifar-100-python", ["train"], "fine_labels"),
    ],
)
def test_cifar_on_fixtures(tmp_path, monkeypatch, name, base, files, key):
    import torchvision.datasets.cifar as tvc

    monkeypatch.setattr(tvc, "check_integrity", lambda *a, **k: True)  # fixture md5s differ
    folder = tmp_path / base
    folder.mkdir()
    flat = RNG.integers(0, 256, size=(2, 3 * 32 * 32), dtype=np.uint8)
    for f in files:
        with open(folder / f, "wb") as fh:
            pickle.dump({"data": flat, key: [7, 2]}, fh)
    meta_name, meta_key = (
        ("batches.meta", "label_names") if name == "cifar10" else ("meta", "fine_label_names")
    )
    with open(folder / meta_name, "wb") as fh:
        pickle.dump({meta_key: [str(i) for i in range(100)]}, fh)
    got = ds.load_dataset(name, tmp_path, "train", download=False)
    assert got.images.shape == (2 * len(files), 3, 32, 32)
    assert got.labels[:2].tolist() == [7, 2]
    # CIFAR rows are channel-major (R plane, G plane, B plane): check one pixel per channel
    assert got.images[0, 1, 0, 5].item() == flat[0, 1024 + 5]


def test_svhn_on_fixture(tmp_path, monkeypatch):
    import torchvision.datasets.svhn as tvs

    monkeypatch.setattr(tvs, "check_integrity", lambda *a, **k: True)
    X = RNG.integers(0, 256, size=(32, 32, 3, 3), dtype=np.uint8)  # (H, W, C, N) as SVHN ships
    y = np.array([[10], [1], [9]], dtype=np.uint8)  # SVHN labels the digit 0 as 10
    scipy.io.savemat(tmp_path / "test_32x32.mat", {"X": X, "y": y})
    got = ds.load_dataset("svhn", tmp_path, "test", download=False)
    assert got.images.shape == (3, 3, 32, 32) and got.labels.tolist() == [0, 1, 9]
    assert got.images[2, 0, 4, 7].item() == X[4, 7, 0, 2]


def test_missing_other_dataset_message(tmp_path):
    with pytest.raises(DataUnavailableError, match=r"torchvision.datasets.CIFAR10\("):
        ds.load_dataset("cifar10", tmp_path, "train", download=False)


def test_unknown_dataset_and_split(tmp_path):
    with pytest.raises(UnknownNameError, match="fashion_mnist"):
        ds.load_dataset("imagenet", tmp_path)
    with pytest.raises(Exception, match="train, test"):
        ds.load_dataset("mnist", tmp_path, "valid")
