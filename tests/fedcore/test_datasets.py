"""Dataset loaders: real FashionMNIST offline, every loader on fixtures in torchvision's format.

The network is never touched: an autouse fixture makes every socket connection fail, fixtures
are written in torchvision's exact on-disk layout, and the download path runs torchvision's own
download code against a local "mirror" (only the HTTP fetch is replaced).
"""

from __future__ import annotations

import gzip
import hashlib
import os
import pickle
import shutil
import socket
import zipfile
from collections.abc import Callable
from pathlib import Path
from urllib.error import URLError

import numpy as np
import pytest
import scipy.io
import torch
import torchvision.datasets as tvd
import torchvision.datasets.mnist as tv_mnist
from torchvision.datasets.utils import extract_archive

import fedcore.datasets as ds
from fedcore.errors import ConfigError, DataUnavailableError, UnknownNameError

# Image datasets; text ones (kind "text": tweet_sentiment) are tested in tests/fedcore/test_text.py.
IMAGE_DATASETS = [n for n in ds.list_datasets() if ds.get_dataset_info(n).kind == "image"]


REPO_RAW = Path(__file__).resolve().parents[2] / "data" / "raw"
Split = tuple[torch.Tensor, torch.Tensor]  # images uint8 (N, C, H, W) upright, labels int64 (N,)


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Any attempt to reach the internet fails at once, as on this machine, but never hangs."""

    def refuse(*args, **kwargs):
        raise OSError("network disabled in tests")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)


# ---- writers of torchvision's on-disk formats -------------------------------------------------


def md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def idx_bytes(array: np.ndarray) -> bytes:
    """IDX: two zero bytes, dtype code 0x08 (uint8), ndim, big-endian uint32 dims, payload."""
    dims = b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    return bytes([0, 0, 8, array.ndim]) + dims + np.ascontiguousarray(array, np.uint8).tobytes()


def idx_files(data: dict[str, Split], names: dict[str, str]) -> dict[str, bytes]:
    """File name -> IDX bytes; ``names`` maps split -> file prefix (MNIST's test split is t10k)."""
    out = {}
    for split, (x, y) in data.items():
        out[f"{names[split]}-images-idx3-ubyte"] = idx_bytes(x[:, 0].numpy())
        out[f"{names[split]}-labels-idx1-ubyte"] = idx_bytes(y.numpy())
    return out


def emnist_files(data: dict[str, Split]) -> dict[str, bytes]:
    # EMNIST's files store every image transposed, so write the upright fixture transposed.
    flipped = {s: (x.transpose(2, 3), y) for s, (x, y) in data.items()}
    return idx_files(flipped, {s: f"emnist-balanced-{s}" for s in data})


def write_files(folder: Path, files: dict[str, bytes]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, blob in files.items():
        (folder / name).write_bytes(blob)


def write_mnist_family(folder: str) -> Callable[..., None]:
    def write(root: Path, monkeypatch, data: dict[str, Split]) -> None:
        write_files(root / folder / "raw", idx_files(data, {"train": "train", "test": "t10k"}))

    return write


def write_emnist(root: Path, monkeypatch, data: dict[str, Split]) -> None:
    write_files(root / "EMNIST" / "raw", emnist_files(data))


def write_cifar(cls: type, label_key: str, meta_key: str) -> Callable[..., None]:
    """Python pickles of {data: (n, 3072) uint8 rows (R, G then B plane), labels: [int]}."""

    def write(root: Path, monkeypatch, data: dict[str, Split]) -> None:
        folder = root / cls.base_folder
        folder.mkdir(parents=True)
        lists = {}
        for split, files in (("train", cls.train_list), ("test", cls.test_list)):
            x, y = data[split]
            rows, labels = x.reshape(len(x), -1).numpy(), y.tolist()
            parts = np.array_split(np.arange(len(x)), len(files))  # one slice per batch file
            for (fname, _), part in zip(files, parts, strict=True):
                blob = {"data": rows[part], label_key: [labels[i] for i in part]}
                (folder / fname).write_bytes(pickle.dumps(blob))
            lists[split] = [[fname, md5(folder / fname)] for fname, _ in files]
        meta = folder / cls.meta["filename"]
        meta.write_bytes(pickle.dumps({meta_key: [f"class{i}" for i in range(100)]}))
        # torchvision checks every file's md5: give it the fixture's real ones, so its own
        # integrity check still runs (and would catch a missing or misnamed file).
        monkeypatch.setattr(cls, "train_list", lists["train"])
        monkeypatch.setattr(cls, "test_list", lists["test"])
        monkeypatch.setattr(cls, "meta", {**cls.meta, "md5": md5(meta)})

    return write


def write_svhn(root: Path, monkeypatch, data: dict[str, Split]) -> None:
    """scipy .mat: X (H, W, C, N) uint8, y (N, 1) with the digit 0 stored as 10."""
    split_list = dict(tvd.SVHN.split_list)
    for split, (x, y) in data.items():
        labels = np.where(y.numpy() == 0, 10, y.numpy()).astype(np.uint8)[:, None]
        path = root / f"{split}_32x32.mat"
        scipy.io.savemat(path, {"X": x.permute(2, 3, 1, 0).numpy(), "y": labels})
        split_list[split] = [split_list[split][0], path.name, md5(path)]
    monkeypatch.setattr(tvd.SVHN, "split_list", split_list)


TV_CLASS = {
    "mnist": "MNIST",
    "emnist": "EMNIST",
    "cifar10": "CIFAR10",
    "cifar100": "CIFAR100",
    "svhn": "SVHN",
}

# Registering a dataset without a fixture here fails test_every_dataset_round_trips.
FIXTURES: dict[str, Callable[..., None]] = {
    "fashion_mnist": write_mnist_family("FashionMNIST"),
    "mnist": write_mnist_family("MNIST"),
    "emnist": write_emnist,
    "cifar10": write_cifar(tvd.CIFAR10, "labels", "label_names"),
    "cifar100": write_cifar(tvd.CIFAR100, "fine_labels", "fine_label_names"),
    "svhn": write_svhn,
}


def fake_splits(info: ds.DatasetInfo, seed: int = 0) -> dict[str, Split]:
    rng = np.random.default_rng(seed)
    out = {}
    for split, n in (("train", 6), ("test", 4)):
        x = torch.from_numpy(rng.integers(0, 256, (n, *info.input_shape), dtype=np.uint8))
        y = torch.from_numpy(rng.integers(0, info.num_classes, n))
        y[0], y[-1] = 0, info.num_classes - 1  # both ends of the label range (SVHN's 0 is 10)
        out[split] = (x, y)
    return out


# ---- every registered dataset ------------------------------------------------------------------


@pytest.mark.parametrize("name", IMAGE_DATASETS)
def test_every_dataset_round_trips_its_torchvision_files(tmp_path, monkeypatch, name):
    assert name in FIXTURES, f"{name}: add a torchvision-format fixture writer to FIXTURES"
    info = ds.get_dataset_info(name)
    data = fake_splits(info)
    FIXTURES[name](tmp_path, monkeypatch, data)
    for split, (x, y) in data.items():
        # For fashion_mnist the Debian files (60k) exist too: getting the 6-row fixture back
        # also shows that files under root come first.
        got = ds.load_dataset(name, tmp_path, split, download=False)
        assert got.info == info and len(got) == len(x)
        assert got.images.dtype == torch.uint8 and got.images.is_contiguous()
        assert got.labels.dtype == torch.int64 and got.labels.shape == (len(x),)
        assert torch.equal(got.images, x) and torch.equal(got.labels, y)


@pytest.mark.parametrize("name", IMAGE_DATASETS)
def test_registry_info_is_consistent(name):
    info = ds.get_dataset_info(name)
    c = info.input_shape[0]
    assert info.name == name and len(info.mean) == len(info.std) == c
    assert c == (1 if name in ("fashion_mnist", "mnist", "emnist") else 3)
    assert info.num_classes == {"cifar100": 100, "emnist": 47}.get(name, 10)


@pytest.mark.parametrize("name", IMAGE_DATASETS)
def test_missing_data_says_how_to_get_it(tmp_path, monkeypatch, name):
    """download=True runs torchvision's real download code; the (disabled) network refuses it."""
    monkeypatch.setattr(ds, "DEBIAN_FASHION_MNIST", tmp_path / "no-debian")
    for download in (False, True):
        with pytest.raises(DataUnavailableError) as exc:
            ds.load_dataset(name, tmp_path / "root", "test", download=download)
        msg = str(exc.value)
        assert "\n" not in msg and str(tmp_path / "root") in msg
        if name == "fashion_mnist":
            assert "run: make setup" in msg and "apt-get install -y dataset-fashion-mnist" in msg
        else:
            assert f"torchvision.datasets.{TV_CLASS[name]}(" in msg and "download=True)" in msg
            assert ("download failed" in msg) == download


# ---- hand-placed pixels: where a byte sits on disk -> where it lands in (N, C, H, W) ----------


def test_emnist_is_turned_upright(tmp_path):
    stored = np.zeros((1, 28, 28), np.uint8)
    stored[0, 0, :] = 255  # first row of the file's image = first column of the upright letter
    write_files(
        tmp_path / "EMNIST" / "raw",
        {
            "emnist-balanced-train-images-idx3-ubyte": idx_bytes(stored),
            "emnist-balanced-train-labels-idx1-ubyte": idx_bytes(np.array([46], np.uint8)),
        },
    )
    got = ds.load_dataset("emnist", tmp_path, "train", download=False)
    assert got.images[0, 0, :, 0].eq(255).all() and int(got.images.sum()) == 28 * 255
    assert got.labels.tolist() == [46]


def test_cifar_rows_are_channel_major(tmp_path, monkeypatch):
    info = ds.get_dataset_info("cifar10")
    data = {
        s: (torch.zeros(5, 3, 32, 32, dtype=torch.uint8), torch.zeros(5, dtype=torch.int64))
        for s in ("train", "test")
    }
    FIXTURES["cifar10"](tmp_path, monkeypatch, data)
    path = tmp_path / "cifar-10-batches-py" / "data_batch_1"
    batch = pickle.loads(path.read_bytes())
    batch["data"][0, 1024 + 2 * 32 + 5] = 200  # G plane (1024 bytes per plane), row 2, col 5
    path.write_bytes(pickle.dumps(batch))
    monkeypatch.setattr(
        tvd.CIFAR10, "train_list", [[path.name, md5(path)], *tvd.CIFAR10.train_list[1:]]
    )
    got = ds.load_dataset("cifar10", tmp_path, "train", download=False)
    assert got.images[0, 1, 2, 5] == 200 and int(got.images.sum()) == 200
    assert got.info == info


def test_svhn_pixel_and_label_ten(tmp_path, monkeypatch):
    X = np.zeros((32, 32, 3, 3), np.uint8)  # (H, W, C, N) as SVHN ships it
    X[4, 7, 0, 2] = 99
    scipy.io.savemat(
        tmp_path / "test_32x32.mat", {"X": X, "y": np.array([[10], [1], [9]], np.uint8)}
    )
    entry = tvd.SVHN.split_list["test"]
    split_list = {**tvd.SVHN.split_list, "test": [entry[0], entry[1], md5(tmp_path / entry[1])]}
    monkeypatch.setattr(tvd.SVHN, "split_list", split_list)
    got = ds.load_dataset("svhn", tmp_path, "test", download=False)
    assert got.images[2, 0, 4, 7] == 99 and int(got.images.sum()) == 99
    assert got.labels.tolist() == [0, 1, 9]  # SVHN's label 10 is the digit 0


# ---- the download path, served from a local mirror (torchvision's code, no network) ----------


def serve_from(mirror: Path):
    """Stand-in for torchvision's download_and_extract_archive: the mirror replaces HTTP."""

    def fetch(
        url, download_root, extract_root=None, filename=None, md5=None, remove_finished=False
    ):
        src = mirror / os.path.basename(url)
        if not src.is_file():
            raise URLError(f"test mirror has no {url}")
        archive = Path(download_root) / (filename or src.name)
        shutil.copyfile(src, archive)
        extract_archive(str(archive), str(extract_root or download_root), remove_finished)

    return fetch


def test_download_path_mnist_gz_files(tmp_path, monkeypatch):
    data = fake_splits(ds.get_dataset_info("mnist"), seed=1)
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    for name, blob in idx_files(data, {"train": "train", "test": "t10k"}).items():
        (mirror / f"{name}.gz").write_bytes(gzip.compress(blob))  # torchvision's resource names
    monkeypatch.setattr(tv_mnist, "download_and_extract_archive", serve_from(mirror))
    got = ds.load_dataset("mnist", tmp_path / "root", "test")  # download=True by default
    assert torch.equal(got.images, data["test"][0]) and torch.equal(got.labels, data["test"][1])
    raw = tmp_path / "root" / "MNIST" / "raw"
    assert (raw / "t10k-images-idx3-ubyte.gz").is_file() and (
        raw / "t10k-images-idx3-ubyte"
    ).is_file()


def test_download_path_emnist_zip_of_gz(tmp_path, monkeypatch):
    data = fake_splits(ds.get_dataset_info("emnist"), seed=2)
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    with zipfile.ZipFile(mirror / "gzip.zip", "w") as zf:  # NIST's archive: gzip/<file>.gz
        for name, blob in emnist_files(data).items():
            zf.writestr(f"gzip/{name}.gz", gzip.compress(blob))
    monkeypatch.setattr(tv_mnist, "download_and_extract_archive", serve_from(mirror))
    got = ds.load_dataset("emnist", tmp_path / "root", "train")
    assert torch.equal(got.images, data["train"][0]) and torch.equal(got.labels, data["train"][1])


# ---- FashionMNIST, the embedded default: real files ----------------------------------------


def test_fashion_mnist_real_files():
    train = ds.load_dataset("fashion_mnist", REPO_RAW, "train", download=False)
    test = ds.load_dataset("fashion_mnist", REPO_RAW, "test", download=False)
    assert train.images.shape == (60000, 1, 28, 28) and train.images.dtype == torch.uint8
    assert test.images.shape == (10000, 1, 28, 28) and train.info.num_classes == 10
    assert torch.bincount(train.labels).tolist() == [6000] * 10
    assert torch.bincount(test.labels).tolist() == [1000] * 10
    # The registry's constants are this split's statistics (to the 4 decimals stored).
    x = train.images.to(torch.float64) / 255
    assert round(x.mean().item(), 4) == train.info.mean[0]
    assert round(x.std().item(), 4) == train.info.std[0]


def test_fashion_mnist_debian_fallback(tmp_path):
    if not (ds.DEBIAN_FASHION_MNIST / "t10k-labels-idx1-ubyte.gz").is_file():
        pytest.skip("Debian package dataset-fashion-mnist not installed")
    # an empty root: the embedded copy stands in only where asked (default: data/raw only)
    got = ds.load_dataset("fashion_mnist", tmp_path, "test", download=False, embedded=True)
    ref = ds.load_dataset("fashion_mnist", REPO_RAW, "test", download=False)
    assert got.images.is_contiguous() and got.images.dtype == torch.uint8
    assert torch.equal(got.images, ref.images) and torch.equal(got.labels, ref.labels)


def test_corrupt_debian_file_says_to_reinstall_it(tmp_path, monkeypatch):
    debian = tmp_path / "debian"
    debian.mkdir()
    for name in ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        (debian / name).write_bytes(gzip.compress(b"\x00\x00\x08\x01\x00\x00\x00\x09short"))
    monkeypatch.setattr(ds, "DEBIAN_FASHION_MNIST", debian)
    with pytest.raises(
        DataUnavailableError, match="apt-get install --reinstall dataset-fashion-mnist"
    ) as exc:
        ds.load_dataset("fashion_mnist", tmp_path / "root", "test", download=False, embedded=True)
    assert isinstance(exc.value.__cause__, ValueError)  # the parse error is kept for debugging


# ---- ArrayDataset helpers and argument errors ---------------------------------------------


def tiny() -> ds.ArrayDataset:
    info = ds.DatasetInfo("tiny", 3, (2, 1, 2), (0.5, 0.0), (0.25, 1.0))
    images = torch.tensor(
        [[[[0, 255]], [[51, 102]]], [[[255, 0]], [[0, 0]]], [[[1, 2]], [[3, 4]]]], dtype=torch.uint8
    )
    return ds.ArrayDataset(images, torch.tensor([0, 1, 2]), info)


def test_subset_keeps_the_given_order():
    d = tiny()
    s = d.subset([2, 0, 2])
    assert s.labels.tolist() == [2, 0, 2] and torch.equal(s.images[1], d.images[0])
    assert s.images.is_contiguous() and s.info is d.info and len(s) == 3
    assert len(d.subset([])) == 0 and d.subset(np.array([1])).labels.tolist() == [1]
    with pytest.raises(ConfigError, match="boolean mask"):
        d.subset([True, False, True])


def test_normalized_by_hand():
    x = tiny().normalized([0])
    assert x.dtype == torch.float32 and x.shape == (1, 2, 1, 2)
    # channel 0: (0/255 - 0.5)/0.25 = -2, (255/255 - 0.5)/0.25 = 2; channel 1: 51/255 = 0.2, 0.4
    torch.testing.assert_close(x, torch.tensor([[[[-2.0, 2.0]], [[0.2, 0.4]]]]))
    assert tiny().normalized().shape == (3, 2, 1, 2)


def test_unknown_name_and_split(tmp_path):
    with pytest.raises(UnknownNameError) as exc:
        ds.load_dataset("imagenet", tmp_path)
    assert (
        exc.value.valid == ds.list_datasets()
        and "fashion_mnist, mnist, shakespeare, svhn" in str(exc.value)
    )
    with pytest.raises(ConfigError, match="train, test"):
        ds.load_dataset("mnist", tmp_path, "valid")


def test_embedded_copy_only_for_the_default_root(tmp_path, monkeypatch):
    """An empty default root reads the Debian copy and says so; any other root never does."""
    if not (ds.DEBIAN_FASHION_MNIST / "t10k-labels-idx1-ubyte.gz").is_file():
        pytest.skip("the Debian package dataset-fashion-mnist is not installed")
    monkeypatch.setattr(ds, "DEFAULT_ROOT", tmp_path / "data/raw")
    got = ds.load_dataset("fashion_mnist", tmp_path / "data/raw", "test", download=False)
    assert len(got) == 10000 and "t10k-" in got.source and "embedded" in got.source
    with pytest.raises(DataUnavailableError, match="data.root: no FashionMNIST files under"):
        ds.load_dataset("fashion_mnist", tmp_path / "other", "test", download=False)


@pytest.mark.parametrize("root_there", [False, True])
def test_a_failed_download_leaves_nothing_it_made(tmp_path, monkeypatch, root_there):
    """The network fails mid-download (a part file written, then URLError): the error says
    how to get the files, and the folders and part files the download made are gone; what
    was in data.root before stays."""

    def fetch(url, download_root, extract_root=None, filename=None, md5=None, **kw):
        Path(download_root).mkdir(parents=True, exist_ok=True)
        (Path(download_root) / "train-images-idx3-ubyte.gz.part").write_bytes(b"\0" * 10)
        raise URLError("network unreachable")

    monkeypatch.setattr(tv_mnist, "download_and_extract_archive", fetch)
    root = tmp_path / "data" / "raw"
    if root_there:
        root.mkdir(parents=True)
        (root / "mine.txt").write_text("kept")
    with pytest.raises(DataUnavailableError, match="download failed"):
        ds.load_dataset("mnist", root, "train")
    left = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    assert left == (["data", "data/raw", "data/raw/mine.txt"] if root_there else []), left
