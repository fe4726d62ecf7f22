"""Loading the experiment's data: its train and test splits (read once per process), the
seeded subsets and validation split, the tokenizers of text and next-token datasets, and the
dataset card (IO lives here, math in fedcore). The client partition drawn from it is
``tasks.data.partitioning``'s."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedcore.client import ImageData
from fedcore.datasets import ArrayDataset, get_dataset_info, load_dataset
from fedcore.errors import ConfigError
from fedcore.inputs import ModelInput
from fedcore.lm import WindowDataset
from fedcore.manifest import LABEL_COUNTS_MAX_CLASSES
from fedcore.text import TextData, TextDataset, tokenize
from tasks.config import Params

_SUBSET_STREAM = 7


def subset_indices(n: int, size: int | None, seed: int, key: str) -> np.ndarray:
    """A seeded random subset of ``range(n)`` (sorted), or everything when ``size`` is None."""
    if size is None or size >= n:
        return np.arange(n, dtype=np.int64)
    stream = {"train": 1, "test": 2}[key]
    rng = np.random.default_rng(np.random.SeedSequence([seed, _SUBSET_STREAM, stream]))
    return np.sort(rng.choice(n, size=size, replace=False)).astype(np.int64)


_VALIDATION_STREAM = 3  # beside subset_indices' train (1) and test (2) streams


def validation_split(rows: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(client rows, validation rows) of the selected train rows ``rows`` (sorted, unique):
    round(fraction x len(rows)) of them, at least 1, drawn from ``seed`` alone, are held out
    of every client shard (data.validation). Both sorted and disjoint; fraction 0 returns
    ``rows`` and no validation rows without drawing anything."""
    rows = np.asarray(rows, dtype=np.int64)
    if fraction <= 0.0:
        return rows, np.empty(0, dtype=np.int64)
    n = len(rows)
    k = max(1, round(fraction * n))
    if k >= n:
        raise ConfigError(
            f"data.validation: {fraction} of {n} training rows leaves no rows for the clients; "
            f"select more rows (data.train_subset) or set data.validation: 0"
        )
    rng = np.random.default_rng(np.random.SeedSequence([seed, _SUBSET_STREAM, _VALIDATION_STREAM]))
    held = np.zeros(n, dtype=bool)
    held[rng.choice(n, size=k, replace=False)] = True
    return rows[~held], rows[held]


@dataclass
class ExperimentData:
    train: ArrayDataset
    test: ArrayDataset
    train_idx: np.ndarray  # rows of the train split the clients hold (data.validation's left out)
    test_idx: np.ndarray
    num_classes: int  # the registry's, or a next-token dataset's vocabulary (dataset_num_classes)
    tokenizer: Any = None  # text datasets: the model's tokenizer (models.text.TextTokenizer)
    # rows of the train split held out as the validation split (data.validation; none at 0)
    val_idx: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))

    @property
    def selected_idx(self) -> np.ndarray:
        """Every row of the train split the experiment uses (data.train_subset): the clients'
        and the validation rows, sorted."""
        if not len(self.val_idx):
            return self.train_idx
        return np.union1d(self.train_idx, self.val_idx)

    def eval_rows(self, evaluate: str) -> tuple[Any, np.ndarray]:
        """(split, rows of it) that data.evaluate ``evaluate`` measures: the test split's
        test_idx, or (validation) the train split's val_idx."""
        if evaluate == "validation":
            return self.train, self.val_idx
        return self.test, self.test_idx

    def image_data(self, split: str, model_input: ModelInput | None = None) -> ImageData:
        """The split (train | test | validation | test_whole) as the engine reads it;
        ``model_input`` (``tasks.data.backbone.model_input``) resizes batches, repeats gray to RGB
        and sets the normalisation the backbone needs. train: the whole split (clients index
        their rows); test and validation: their rows only; test_whole: every test row
        (``test_idx`` are positions in it)."""
        if split == "train":
            ds, idx = self.train, self.train_idx
        elif split == "test_whole":
            ds, idx = self.test, np.arange(len(self.test))
        elif split == "validation":
            ds, idx = self.train.subset(self.val_idx), self.val_idx
        else:
            ds, idx = self.test, self.test_idx
            if len(idx) < len(ds):
                ds = ds.subset(idx)
        if isinstance(ds, WindowDataset):  # next-token windows: never padded (fedcore.lm)
            return TextData(ds.tokens, ds.labels, pad_id=-1)  # type: ignore[return-value]
        if isinstance(ds, TextDataset):  # token ids for a text model (fedcore.text)
            rows = idx if split == "train" else None
            return self.text_data(ds, rows, split)  # type: ignore[return-value]
        if model_input is None:
            return ImageData(ds.images, ds.labels, ds.info.mean, ds.info.std)
        m = model_input
        return ImageData(ds.images, ds.labels, m.mean, m.std, size=m.size, channels=m.channels)

    def text_data(self, ds: TextDataset, rows: np.ndarray | None, split: str = "") -> TextData:
        """Token ids of ``ds`` (only ``rows`` tokenized when given), padded to max_length."""
        tok = self.tokenizer
        name = f"{ds.info.name} {split or ('train' if rows is not None else 'test')}"
        return TextData.from_texts(ds.texts, ds.labels, tok, tok.max_length, rows=rows, name=name)

    def text_example(self) -> torch.Tensor:
        """Two test texts as token ids (2, max_length): MLflow's input example for a text
        model (its exported program takes ids padded to max_length)."""
        if isinstance(self.test, WindowDataset):
            return self.test.tokens[:2].clone()
        tok = self.tokenizer
        return tokenize(self.test.texts[:2], tok, tok.max_length)[0]


# Schemes that skew the label mix: with next-token labels (a vocabulary) they make no sense
# (class-wise Dirichlet would split each of 4,096 tokens over the clients).
_LABEL_SKEW = ("dirichlet_classwise", "dirichlet_clientwise", "labels_per_client")


def lm_tokenizer_for(params: Params) -> Any:
    """The decoder's tokenizer for a next-token dataset (``kind="lm"``), None for the others;
    a model, partition scheme or (overlapping windows) data.validation that does not fit ->
    one line, before anything is loaded."""
    from models.text import is_next_token_model, next_token_models, text_tokenizer

    name, dataset = params.model.name, params.data.dataset
    lm = get_dataset_info(dataset).kind == "lm"
    if is_next_token_model(name) and not lm:
        raise ConfigError(
            f"model {name!r} predicts the next token and dataset {dataset!r} has class labels; "
            f"next-token datasets: shakespeare"
        )
    if not lm:
        return None
    if not is_next_token_model(name):
        raise ConfigError(
            f"dataset {dataset!r} is next-token prediction: its classes are a decoder's "
            f"vocabulary; model {name!r} is not one (decoders: {', '.join(next_token_models())})"
        )
    scheme = params.partition.scheme
    if scheme in (*_LABEL_SKEW, "gaussian_noise"):
        why = (
            "adds Gaussian noise to image features"
            if scheme == "gaussian_noise"
            else ("skews each client's label mix, and the labels here are next-token ids")
        )
        raise ConfigError(
            f"partition.scheme: {scheme} {why}; on {dataset} use natural (one client per "
            f"speaking role), iid, quantity_normal or quantity_dirichlet"
        )
    tokenizer = text_tokenizer(name, params.model.options)
    n, s = int(tokenizer.max_length), int(tokenizer.stride)
    if params.data.validation > 0.0 and s < n:  # held-out windows would share their tokens
        raise ConfigError(
            f"data.validation: {dataset}'s windows overlap (stride {s} < context {n}), so a "
            f"held-out window's tokens are in the windows the clients train on; set the "
            f"model's stride to at least {n} or data.validation: 0"
        )
    return tokenizer


def text_tokenizer_for(params: Params, dataset: Any) -> Any:
    """The model's tokenizer for a text dataset; a model and dataset of different kinds (text
    vs images), or feature noise on text -> one line, before anything is trained."""
    from models.text import is_text_model, text_models, text_tokenizer

    name, text = params.model.name, isinstance(dataset, TextDataset)
    if text and not is_text_model(name):
        raise ConfigError(
            f"dataset {params.data.dataset!r} is text and model {name!r} takes images; "
            f"text models: {', '.join(text_models())}"
        )
    if text and params.partition.scheme == "gaussian_noise":
        raise ConfigError(
            "partition.scheme: gaussian_noise adds Gaussian noise to image features, not to "
            "token ids; choose another partition scheme for text datasets"
        )
    if not text and is_text_model(name):
        raise ConfigError(
            f"model {name!r} takes text and dataset {params.data.dataset!r} holds images; "
            f"choose a text dataset (tweet_sentiment) or an image model"
        )
    return text_tokenizer(name, params.model.options) if text else None


def data_sources(data: ExperimentData) -> str:
    """The files the experiment's splits were read from, e.g. the embedded copy (one line;
    empty for text datasets)."""
    got = [getattr(ds, "source", "") for ds in (data.train, data.test)]
    return "; ".join(dict.fromkeys(s for s in got if s))  # once when both splits share it


def load_experiment_data(params: Params, like: ExperimentData | None = None) -> ExperimentData:
    """The experiment's data: its splits read from disk (a run reads them once, in
    ``flows.plan.prepare``, and passes the data on), or ``like``'s splits where ``like`` is
    data of the same dataset (a seed sweep: every seed's subsets of the same splits); the
    subsets and the tokenizer are derived from ``params``."""
    d = params.data
    root = Path(d.root).resolve()
    lm_tokenizer = lm_tokenizer_for(params)  # next-token windows are in the decoder's tokens
    if like is not None:
        train, test = like.train, like.test  # (nothing writes to a split's tensors)
    else:
        train = load_dataset(d.dataset, root, "train", download=d.download, tokenizer=lm_tokenizer)
        test = load_dataset(d.dataset, root, "test", download=d.download, tokenizer=lm_tokenizer)
    for key, size, ds in (
        ("train_subset", d.train_subset, train),
        ("test_subset", d.test_subset, test),
    ):
        if size is not None and size > len(ds):
            split = key.removesuffix("_subset")
            raise ConfigError(
                f"data.{key}: {size} rows asked, but the {split} split of {d.dataset} has "
                f"{len(ds)}; use at most {len(ds)}, or null for the whole split"
            )
    seed = params.experiment.seed
    clients, validation = validation_split(
        subset_indices(len(train), d.train_subset, seed, "train"), d.validation, seed
    )
    return ExperimentData(
        train=train,
        test=test,
        train_idx=clients,
        test_idx=subset_indices(len(test), d.test_subset, seed, "test"),
        num_classes=(
            int(lm_tokenizer.vocab_size)
            if lm_tokenizer is not None
            else get_dataset_info(d.dataset).num_classes
        ),
        tokenizer=lm_tokenizer or text_tokenizer_for(params, train),
        val_idx=validation,
    )


def dataset_num_classes(params: Params) -> int:
    """The experiment's number of classes: the registry's, or for a next-token dataset the
    decoder's vocabulary (no data is loaded)."""
    tokenizer = lm_tokenizer_for(params)
    if tokenizer is not None:
        return int(tokenizer.vocab_size)
    return get_dataset_info(params.data.dataset).num_classes


def dataset_card(params: Params, data: ExperimentData) -> dict:
    """What the experiment trains and tests on: sizes, label histograms and sha256 of the exact
    rows used (train: the clients' rows; with data.validation also the validation rows). DVC
    hashes this file, so new raw data or another subset reruns what follows."""
    import hashlib

    card: dict = {
        "dataset": params.data.dataset,
        "num_classes": data.train.info.num_classes,
        "input_shape": list(data.train.info.input_shape),
    }
    splits = [("train", data.train, data.train_idx), ("test", data.test, data.test_idx)]
    if len(data.val_idx):  # data.validation: rows of the train split no client holds
        splits.append(("validation", data.train, data.val_idx))
    for split, ds, idx in splits:
        rows = torch.as_tensor(idx)
        labels = ds.labels.index_select(0, rows).numpy()
        if isinstance(ds, WindowDataset):  # tokens, labels and groups of the rows
            sha = ds.sha256(idx)
        else:
            if isinstance(ds, TextDataset):  # the texts, NUL-separated, in row order
                digest = hashlib.sha256("\x00".join(ds.texts[i] for i in idx).encode("utf-8"))
            else:
                images = ds.images.index_select(0, rows).contiguous().numpy()
                digest = hashlib.sha256(images.tobytes())
            digest.update(labels.astype(np.int64).tobytes())
            sha = digest.hexdigest()
        card[split] = {"rows_used": int(len(idx)), "rows_available": len(ds)}
        if ds.info.num_classes > LABEL_COUNTS_MAX_CLASSES:  # a vocabulary: distinct labels only
            card[split]["num_labels"] = len(np.unique(labels))
        else:
            card[split]["label_counts"] = np.bincount(
                labels, minlength=ds.info.num_classes
            ).tolist()
        card[split]["sha256"] = sha
    return card
