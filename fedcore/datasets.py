"""Dataset registry and offline-first loaders returning whole splits as uint8 NCHW tensors.

Where a split comes from (no silent fallback to data the user did not ask for):
  1. files under ``root`` in torchvision's own layout (e.g.
     ``root/FashionMNIST/raw/train-images-idx3-ubyte``), read with ``download=False``; files
     that are there but do not parse are an error naming the folder, never a reason to read
     something else;
  2. FashionMNIST only, and only when ``root`` is the default ``data/raw`` and holds no files:
     the Debian package ``dataset-fashion-mnist`` (gzip IDX files), the embedded default that
     this project can always install offline (the files read are logged and kept in
     ``ArrayDataset.source``);
  3. if ``download``: torchvision's real download into ``root``, for users with internet;
  4. otherwise ``DataUnavailableError`` with one line saying exactly how to get the data.

torchvision parses the file formats (IDX, CIFAR pickles, SVHN ``.mat`` via scipy); fedapt only
turns its arrays into one contiguous (N, C, H, W) uint8 tensor. Images stay uint8 in memory
(4x smaller than float32) and are normalized per batch; see ``ArrayDataset.normalized``.
"""

from __future__ import annotations

import gzip
import importlib
import logging
import math
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from fedcore.errors import ConfigError, DataUnavailableError, UnknownNameError

# Where Debian's dataset-fashion-mnist puts its files; a module constant so tests can point it
# at an empty directory to exercise the "missing" path.
DEBIAN_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
# The default data.root; only there may the embedded (Debian) copy stand in for missing files.
DEFAULT_ROOT = Path(__file__).resolve().parents[1] / "data" / "raw"
log = logging.getLogger("fedapt.data")
SPLITS = ("train", "test")
EMNIST_SPLIT = "balanced"  # 47 classes, equal counts per class: the FL literature's EMNIST


Layout = Literal["mnist", "emnist", "cifar", "svhn"]


@dataclass(frozen=True)
class TorchvisionFiles:
    """How torchvision reads an image dataset's files under ``data.root``: its class (also
    its folder's name), where the split's files are (``{cls}``, ``{split}`` filled in) and the
    layout of the arrays it returns (``LAYOUTS``)."""

    cls: str
    files: str = "{cls}/raw"
    layout: Layout = "mnist"


@dataclass(frozen=True)
class DatasetInfo:
    name: str  # its name in DATASETS, e.g. "fashion_mnist"
    num_classes: int
    input_shape: tuple[int, int, int]  # (C, H, W)
    mean: tuple[float, ...]  # per-channel normalisation constants of pixel/255
    std: tuple[float, ...]
    # "image": uint8 (N, C, H, W) arrays; "text": raw texts (fedcore.text), tokenized for the
    # model at load, and input_shape/mean/std are placeholders (1, 1, 1), (0,), (1,); "lm":
    # next-token windows of a decoder's tokens (fedcore.lm), num_classes 0 here and the
    # tokenizer's vocabulary size in the loaded split's info.
    kind: str = "image"
    # where its splits come from: an image dataset's files (read by torchvision), or a text
    # or next-token dataset's loader (``module:function``, imported when first loaded)
    torchvision: TorchvisionFiles | None = None
    loader: str | None = None


def _as_rows(indices: Any) -> torch.Tensor:
    """Row positions as a 1-D int64 tensor, in the given order."""
    idx = indices if isinstance(indices, torch.Tensor) else torch.as_tensor(np.asarray(indices))
    if idx.dtype == torch.bool:  # a mask would otherwise silently become rows 0 and 1
        raise ConfigError("dataset indices must be integer row positions, not a boolean mask")
    if idx.numel() == 0:  # np.asarray([]) is float64; an empty selection is still valid
        return torch.empty(0, dtype=torch.int64)
    if idx.is_floating_point() or idx.is_complex() or idx.ndim != 1:
        raise ConfigError(
            f"dataset indices must be a 1-D integer sequence (got {idx.dtype}, ndim {idx.ndim})"
        )
    return idx.to(torch.int64)


@dataclass(frozen=True)
class ArrayDataset:
    images: torch.Tensor  # uint8 (N, C, H, W), contiguous
    labels: torch.Tensor  # int64 (N,)
    info: DatasetInfo
    source: str = ""  # the files the split was read from (one line, for the user)

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def subset(self, indices: Any) -> ArrayDataset:
        """The given rows, in the given order (repeats allowed), as a new dataset."""
        idx = _as_rows(indices)
        return replace(self, images=self.images[idx].contiguous(), labels=self.labels[idx])

    def normalized(self, indices: Any = None) -> torch.Tensor:
        """float32 (N, C, H, W) = (x/255 - mean)/std, for all rows or the given ones."""
        x = self.images if indices is None else self.images[_as_rows(indices)]
        c = self.info.input_shape[0]
        mean = torch.tensor(self.info.mean, dtype=torch.float32).view(1, c, 1, 1)
        std = torch.tensor(self.info.std, dtype=torch.float32).view(1, c, 1, 1)
        # Same operation order as fedcore.client.ImageData, so both give bit-identical inputs.
        return (x.to(torch.float32).div_(255.0) - mean) / std


# The datasets, in one table. Adding one: its line here, and for a text or next-token dataset
# its loader function (docs/extending.md). mean/std: of pixel/255 over the train split
# (FashionMNIST checked here on the full 60k: 0.28604, 0.35302); the others are the values
# used throughout the literature.
DATASETS: dict[str, DatasetInfo] = {
    d.name: d
    for d in (
        DatasetInfo("fashion_mnist", 10, (1, 28, 28), (0.2860,), (0.3530,),
                    torchvision=TorchvisionFiles("FashionMNIST")),
        DatasetInfo("mnist", 10, (1, 28, 28), (0.1307,), (0.3081,),
                    torchvision=TorchvisionFiles("MNIST")),
        DatasetInfo("emnist", 47, (1, 28, 28), (0.1751,), (0.3332,),
                    torchvision=TorchvisionFiles("EMNIST", layout="emnist")),
        DatasetInfo("cifar10", 10, (3, 32, 32), (0.4914, 0.4822, 0.4465),
                    (0.2470, 0.2435, 0.2616),
                    torchvision=TorchvisionFiles("CIFAR10", "cifar-10-batches-py", "cifar")),
        DatasetInfo("cifar100", 100, (3, 32, 32), (0.5071, 0.4865, 0.4409),
                    (0.2673, 0.2564, 0.2762),
                    torchvision=TorchvisionFiles("CIFAR100", "cifar-100-python", "cifar")),
        DatasetInfo("svhn", 10, (3, 32, 32), (0.4377, 0.4438, 0.4728), (0.1980, 0.2010, 0.1970),
                    torchvision=TorchvisionFiles("SVHN", "{split}_32x32.mat", "svhn")),
        DatasetInfo("tweet_sentiment", 3, (1, 1, 1), (0.0,), (1.0,), kind="text",
                    loader="fedcore.text:load_tweet_sentiment"),
        DatasetInfo("shakespeare", 0, (1, 1, 1), (0.0,), (1.0,), kind="lm",
                    loader="fedcore.lm:load_shakespeare"),
    )
}  # fmt: skip


def list_datasets() -> list[str]:
    return sorted(DATASETS)


def get_dataset_info(name: str) -> DatasetInfo:
    if name not in DATASETS:
        raise UnknownNameError("dataset", name, list_datasets())
    return DATASETS[name]


Arrays = tuple[torch.Tensor, torch.Tensor]  # (images (N, C, H, W), labels (N,))


def _mnist(ds: Any) -> Arrays:
    return ds.data.unsqueeze(1), ds.targets  # MNIST family: (N, H, W) -> (N, 1, H, W)


def _emnist(ds: Any) -> Arrays:
    # EMNIST's IDX files store each image transposed (column-major) and torchvision keeps
    # them so; swap H and W so letters are upright like MNIST's digits.
    return ds.data.transpose(1, 2).unsqueeze(1), ds.targets


def _cifar(ds: Any) -> Arrays:
    images = torch.from_numpy(ds.data).permute(0, 3, 1, 2)  # torchvision's (N,H,W,C) -> NCHW
    return images, torch.as_tensor(ds.targets)


def _svhn(ds: Any) -> Arrays:
    # torchvision already transposed the .mat's (H, W, C, N) to (N, C, H, W) and mapped 10 -> 0
    return torch.from_numpy(ds.data), torch.from_numpy(ds.labels)


# Per layout: the arguments torchvision's class takes for a split, and its arrays as NCHW.
LAYOUTS: dict[str, tuple[Any, Any]] = {
    "mnist": (lambda split: {"train": split == "train"}, _mnist),
    "emnist": (lambda split: {"split": EMNIST_SPLIT, "train": split == "train"}, _emnist),
    "cifar": (lambda split: {"train": split == "train"}, _cifar),
    "svhn": (lambda split: {"split": split}, _svhn),
}


def _not_yet_there(root: Path) -> tuple[Path | None, set[Path]]:
    """What a download into ``root`` may add: when ``root`` is missing, the first missing
    folder on the way to it (all of it will be the download's); else the paths it holds."""
    if root.exists():
        return None, set(root.rglob("*"))
    top = root.absolute()
    while not top.parent.exists():
        top = top.parent
    return top, set()


def _remove_new(root: Path, made: tuple[Path | None, set[Path]]) -> None:
    """Remove what a failed download added (``_not_yet_there``'s snapshot): the folders it
    created on the way to ``root``, or the folders and part files it added under ``root``;
    never a path that was there before."""
    top, before = made
    if top is not None:
        shutil.rmtree(top, ignore_errors=True)
        return
    for path in sorted(set(root.rglob("*")) - before, key=lambda p: len(p.parts)):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)  # (what is under it is new too)
        elif path.exists() or path.is_symlink():
            path.unlink(missing_ok=True)


def _read_torchvision(info: DatasetInfo, root: Path, split: str, download: bool) -> Arrays:
    # Lazy import: torchvision costs about a second and only dataset files need it.
    import torchvision.datasets as tvd

    tv = _files(info)
    arguments, arrays = LAYOUTS[tv.layout]
    return arrays(getattr(tvd, tv.cls)(str(root), download=download, **arguments(split)))


def _files(info: DatasetInfo) -> TorchvisionFiles:
    assert info.torchvision is not None, f"{info.name}: not an image dataset"
    return info.torchvision


def _read_idx_gz(path: Path) -> torch.Tensor:
    """A gzip'd uint8 IDX file: magic 0x00 0x00 0x08 ndim, big-endian uint32 dims, payload."""
    with gzip.open(path, "rb") as fh:
        raw = bytearray(fh.read())  # writable, so the tensor can share it without a warning
    if len(raw) < 4 or raw[:3] != b"\x00\x00\x08":
        raise ValueError(f"{path}: not a uint8 IDX file")
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    offset = 4 + 4 * ndim
    if len(raw) - offset != math.prod(dims):
        raise ValueError(f"{path}: {len(raw) - offset} payload bytes for dims {dims}")
    return torch.frombuffer(raw, dtype=torch.uint8, offset=offset).view(*dims)


def _read_debian_fashion_mnist(split: str) -> Arrays:
    prefix = "train" if split == "train" else "t10k"  # the IDX files' own names for the splits
    images = _read_idx_gz(DEBIAN_FASHION_MNIST / f"{prefix}-images-idx3-ubyte.gz")
    labels = _read_idx_gz(DEBIAN_FASHION_MNIST / f"{prefix}-labels-idx1-ubyte.gz")
    return images.unsqueeze(1), labels


def _how_to_get(name: str, root: Path, split: str, download: bool) -> str:
    """One line (the CLI prints it as is) saying exactly how to get the missing data."""
    info = get_dataset_info(name)
    tv = _files(info).cls
    if name == "fashion_mnist" and is_default_root(root):
        return (
            f"{tv} not found under {root}; run: make setup  "
            f"(or: sudo apt-get install -y dataset-fashion-mnist)"
        )
    if name == "fashion_mnist":  # another root than the default: no silent stand-in
        return (
            f"data.root: no {tv} files under {root} (expected {_files_of(info, root, split)}); "
            "fix data.root, put the files there, or use the default data.root data/raw "
            "(run: make setup, or: sudo apt-get install -y dataset-fashion-mnist)"
        )
    given = {k: v for k, v in LAYOUTS[_files(info).layout][0](split).items() if k == "split"}
    args = "".join(f", {k}={v!r}" for k, v in given.items())
    tried = "download failed" if download else "download is off"
    return (
        f"{tv} not found under {root} and {tried}; fetch it with internet access: "
        f"python -c \"import torchvision; torchvision.datasets.{tv}('{root}'{args}, download=True)\""
    )


def _to_dataset(info: DatasetInfo, arrays: Arrays, where: str, source: str = "") -> ArrayDataset:
    images = arrays[0].to(torch.uint8).contiguous()  # one owned copy at most
    labels = arrays[1].to(torch.int64).reshape(-1)
    if (
        images.ndim != 4
        or tuple(images.shape[1:]) != info.input_shape
        or len(images) != len(labels)
    ):
        raise DataUnavailableError(
            f"{info.name}: files in {where} hold images {tuple(images.shape)} and "
            f"{len(labels)} labels; expected (N, {', '.join(map(str, info.input_shape))}) and N labels"
        )
    if len(labels) and (int(labels.min()) < 0 or int(labels.max()) >= info.num_classes):
        raise DataUnavailableError(
            f"{info.name}: labels in {where} span [{int(labels.min())}, {int(labels.max())}]; "
            f"expected [0, {info.num_classes - 1}]"
        )
    return ArrayDataset(images, labels, info, source)


def is_default_root(root: str | Path) -> bool:
    """``root`` is the default ``data/raw`` (of this checkout, or of the working directory,
    e.g. a ``dvc exp run --temp`` copy)."""
    here = Path(root).resolve()
    return here in (DEFAULT_ROOT.resolve(), Path("data/raw").resolve())


def _files_of(info: DatasetInfo, root: Path, split: str) -> Path:
    """Where torchvision keeps ``info``'s files under ``root`` (a folder, or SVHN's file)."""
    tv = _files(info)
    return root / tv.files.format(cls=tv.cls, split=split)


def _has_files(path: Path) -> bool:
    if path.is_file():
        return True
    try:
        return path.is_dir() and any(p.is_file() for p in path.rglob("*"))
    except OSError:
        return True  # unreadable: reading it says why


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:200]


def load_dataset(
    name: str,
    root: str | Path,
    split: str = "train",
    *,
    download: bool = True,
    embedded: bool | None = None,
    tokenizer: Any = None,
) -> ArrayDataset:
    """One split of a registered dataset, from the source the module docstring names.
    ``embedded``: whether the Debian copy of FashionMNIST may stand in when ``root`` holds no
    files (default: only when ``root`` is the default ``data/raw``). Text datasets
    (``kind="text"``) come back as ``fedcore.text.TextDataset``; next-token datasets
    (``kind="lm"``) as ``fedcore.lm.WindowDataset`` in ``tokenizer``'s tokens (a
    ``models.text.LMTokenizer``: its vocabulary, context and stride)."""
    info = get_dataset_info(name)
    if split not in SPLITS:
        raise ConfigError(f"split must be one of {', '.join(SPLITS)} (got {split!r})")
    if info.loader is not None:  # a text or next-token dataset: its own loader
        module, _, function = info.loader.partition(":")
        load = getattr(importlib.import_module(module), function)
        if info.kind == "lm":  # windows of the model's tokens
            return load(info, split, tokenizer)  # type: ignore[no-any-return]
        return load(info, split)  # type: ignore[no-any-return]
    root = Path(root)
    if root.exists() and not root.is_dir():
        raise DataUnavailableError(
            f"data.root: {root} is a file, not a folder; set data.root to the folder that "
            f"holds the {_files(info).cls} files (default: data/raw)"
        )
    files = _files_of(info, root, split)
    if _has_files(files):  # the user's files: read them or stop, never read something else
        try:
            arrays = _read_torchvision(info, root, split, download=False)
        except Exception as exc:
            raise DataUnavailableError(
                f"data.root: the {_files(info).cls} {split} files in {files} are "
                f"incomplete or corrupt ({_first_line(exc)}); replace them, or remove {files} "
                "and fetch them again"
            ) from exc  # the parse error is kept for debugging (the CLI prints one line)
        return _to_dataset(info, arrays, str(files), str(files))
    if embedded is None:
        embedded = is_default_root(root)
    if name == "fashion_mnist" and embedded and _has_files(DEBIAN_FASHION_MNIST):
        prefix = "train" if split == "train" else "t10k"
        where = f"{DEBIAN_FASHION_MNIST}/{prefix}-{{images-idx3,labels-idx1}}-ubyte.gz"
        try:
            arrays = _read_debian_fashion_mnist(split)
        except Exception as exc:
            raise DataUnavailableError(
                f"the embedded FashionMNIST in {DEBIAN_FASHION_MNIST} is incomplete or corrupt "
                f"({_first_line(exc)}); reinstall it: sudo apt-get install --reinstall "
                "dataset-fashion-mnist"
            ) from exc
        log.info("%s has no FashionMNIST files; read the embedded copy %s", root, where)
        return _to_dataset(info, arrays, str(DEBIAN_FASHION_MNIST), f"{where} (embedded copy)")
    if download:
        made = _not_yet_there(root)
        try:
            arrays = _read_torchvision(info, root, split, download=True)
        except Exception:
            _remove_new(root, made)  # a failed download leaves no folder or part file of its own
            raise DataUnavailableError(_how_to_get(name, root, split, download)) from None
        return _to_dataset(info, arrays, str(root), f"{files} (downloaded)")
    raise DataUnavailableError(_how_to_get(name, root, split, download))
