"""Offline text: the tweet corpus, token batches, the pretrained MiniLM and a federated run."""

from __future__ import annotations

import functools
import json
import logging
import socket
from pathlib import Path

import numpy as np
import pytest
import torch

from fedcore import payload
from fedcore.algorithms import FedAvg
from fedcore.client import LocalConfig
from fedcore.datasets import get_dataset_info, load_dataset
from fedcore.engine import FederationConfig, Simulation
from fedcore.errors import ConfigError
from fedcore.events import Callback
from fedcore.schedules import LRSchedule
from fedcore.text import TextData, load_tweets, tokenize, tweet_split
from models import count_parameters, get_model
from models.registry import model_options_type
from models.text import check_tokenizer, cls_states, text_tokenizer

ENCODER_PARAMS = 22_565_376  # all-MiniLM-L6-v2 without its unused pooler


class WordEncoder:
    """A whitespace tokenizer: [CLS]=1, words=2.., [SEP]=3; pad 0 (no transformers needed)."""

    pad_id, vocab_size, max_length = 0, 100, 6

    def encode(self, texts, max_length):
        ids, cut = [], 0
        for t in texts:
            words = [4 + len(w) for w in t.split()]
            cut += len(words) + 2 > max_length
            ids.append([1, *words[: max_length - 2], 3])
        return ids, cut


@functools.cache
def minilm(num_classes: int = 3, pooling: str = "cls"):
    return get_model("minilm", num_classes=num_classes, max_length=32, pooling=pooling)


def test_tweet_corpus_fixed_split():
    info = get_dataset_info("tweet_sentiment")
    assert (info.kind, info.num_classes) == ("text", 3)
    train = load_dataset("tweet_sentiment", "unused-root", "train")
    test = load_dataset("tweet_sentiment", "unused-root", "test")
    assert (len(train), len(test)) == (30_269, 7_889)  # 38,158 rows, one in five by hash
    assert train.labels.bincount().tolist() == [12_923, 11_761, 5_585]
    assert test.labels.bincount().tolist() == [3_263, 3_257, 1_369]
    assert not set(train.texts) & set(test.texts)  # duplicates fall on one side
    assert all(tweet_split(t) == "test" for t in test.texts[:50])
    again, labels = load_tweets("test")
    assert tuple(again) == test.texts and torch.equal(labels, test.labels)
    sub = train.subset([5, 1])
    assert sub.texts == (train.texts[5], train.texts[1]) and sub.labels.tolist() == [
        int(train.labels[5]),
        int(train.labels[1]),
    ]


def test_text_batches_pad_trim_and_truncation_count(caplog):
    texts = ["a bb", "a bb ccc dddd eeeee ffffff", "x"]
    tokens, cut = tokenize(texts, WordEncoder(), 6)
    assert cut == 1
    assert tokens.tolist() == [[1, 5, 6, 3, 0, 0], [1, 5, 6, 7, 8, 3], [1, 5, 3, 0, 0, 0]]
    with caplog.at_level(logging.WARNING, logger="fedcore.text"):
        data = TextData.from_texts(texts, torch.tensor([0, 1, 2]), WordEncoder(), 6, name="toy")
    assert data.truncated == 1
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["toy: 1 of 3 texts are longer than max_length 6 tokens and were truncated"]
    x, y = data.batch(torch.tensor([2, 0]))
    assert x.dtype == torch.int64 and x.tolist() == [[1, 5, 3, 0], [1, 5, 6, 3]]  # trimmed
    assert y.tolist() == [2, 0]
    assert data.batch(torch.tensor([1]))[0].shape == (1, 6)
    with pytest.raises(ConfigError, match="noise"):
        data.batch(torch.tensor([0]), noise_var=0.1)
    # Only the experiment's rows are tokenized; the others stay padding.
    part = TextData.from_texts(texts, torch.tensor([0, 1, 2]), WordEncoder(), 6, rows=[2])
    assert part.tokens[2].tolist() == [1, 5, 3, 0, 0, 0] and part.tokens[0].eq(0).all()
    assert part.truncated == 0


def test_minilm_tokenizer_keeps_special_tokens_when_truncating():
    tok = text_tokenizer("minilm", max_length=8)
    assert (tok.pad_id, tok.vocab_size, tok.max_length) == (0, 30_522, 8)
    ids, cut = tok.encode(["hello world", "one two three four five six seven eight nine"], 8)
    assert cut == 1
    assert ids[0] == [101, 7592, 2088, 102]  # [CLS] hello world [SEP]
    assert len(ids[1]) == 8 and ids[1][0] == 101 and ids[1][-1] == 102


def test_minilm_loads_offline_with_its_parameter_count(monkeypatch):
    def no_network(*args, **kwargs):
        raise OSError("network disabled in this test")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    model = get_model("minilm", num_classes=3, max_length=32)
    assert count_parameters(model.bert) == ENCODER_PARAMS
    assert count_parameters(model) == ENCODER_PARAMS + 384 * 3 + 3  # 22,566,531
    assert (model.hidden_size, len(model.blocks), model.cls_index) == (384, 6, 0)
    assert model.block_names()[0] == "bert.encoder.layer.0"
    assert model.layer_groups()[0] == ["bert.embeddings"] and model.layer_groups()[-1] == [
        "classifier"
    ]
    state = model.state_dict()
    assert len(payload.encode(state)) == pytest.approx(86.12 * 2**20, rel=1e-3)  # full, MiB
    assert not any(k.startswith("bert.pooler") for k in state)
    # The packaged encoder, not a random one: an embedding row equals the checkpoint's.
    from models.minilm import minilm_state

    assert torch.equal(
        state["bert.embeddings.word_embeddings.weight"][101],
        minilm_state()["embeddings.word_embeddings.weight"][101],
    )


def test_minilm_outputs_deterministic_and_padding_invariant():
    tok = text_tokenizer("minilm", max_length=32)
    data = TextData.from_texts(
        ["what a great day", "worst service ever, never again"], torch.tensor([2, 0]), tok, 32
    )
    torch.manual_seed(0)
    a = get_model("minilm", num_classes=3, max_length=32).eval()
    torch.manual_seed(0)
    b = get_model("minilm", num_classes=3, max_length=32).eval()
    with torch.no_grad():
        x, _ = data.batch(torch.tensor([0, 1]))
        assert torch.equal(a(x), b(x))
        padded = data.tokens[:2]  # (2, 32): 24+ columns of padding the mask must hide
        assert torch.allclose(a(padded), a(x), atol=1e-5)
        states = cls_states(a, x)  # (B, blocks, H): the CLS token after every block
        assert states.shape == (2, 6, 384)
        last = a.bert(input_ids=x, attention_mask=(x != 0).long()).last_hidden_state[:, 0]
        assert torch.allclose(states[:, -1], last, atol=1e-6)
    mean = get_model("minilm", num_classes=3, max_length=32, pooling="mean").eval()
    with torch.no_grad():
        assert mean(x).shape == (2, 3)


class TinyViT(torch.nn.Module):
    """timm's ViT layout in miniature: patch tokens + a class token at 0, ``blocks`` as
    nn.Sequential (B, T, H) -> (B, T, H), a final norm and a head on the class token; it
    declares the CLS-encoder interface (fedcore.protocols.cls_blocks) as models/timm_vit.py does."""

    cls_index = 0

    def __init__(self, hidden: int = 8, depth: int = 3) -> None:
        super().__init__()
        self.patch = torch.nn.Linear(4, hidden)
        self.cls_token = torch.nn.Parameter(torch.randn(1, 1, hidden))
        layer = functools.partial(
            torch.nn.TransformerEncoderLayer, hidden, 2, 16, dropout=0.0, batch_first=True
        )
        self.blocks = torch.nn.Sequential(*[layer() for _ in range(depth)])
        self.norm = torch.nn.LayerNorm(hidden)
        self.head = torch.nn.Linear(hidden, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, P, 4) patches
        t = self.patch(x)  # (B, P, H)
        t = torch.cat([self.cls_token.expand(len(t), -1, -1), t], dim=1)  # (B, 1 + P, H)
        return self.head(self.norm(self.blocks(t))[:, 0])


def test_cls_states_on_a_vit_style_encoder():
    vit = TinyViT().eval()
    x = torch.randn(2, 5, 4)
    with torch.no_grad():
        states = cls_states(vit, x)  # (B, blocks, H)
        assert states.shape == (2, 3, 8)
        t = torch.cat([vit.cls_token.expand(2, -1, -1), vit.patch(x)], dim=1)
        for i, block in enumerate(vit.blocks):
            t = block(t)
            assert torch.allclose(states[:, i], t[:, 0])
    with pytest.raises(ConfigError, match="no ``blocks``"):
        cls_states(torch.nn.Linear(4, 3), x)


def test_mismatches_are_one_line():
    tok = text_tokenizer("minilm")
    with pytest.raises(ConfigError, match="has 30522 tokens but the model embeds 1000"):
        check_tokenizer(tok, 1000, 0)
    with pytest.raises(ConfigError, match="pads with id 0, the model with 1"):
        check_tokenizer(tok, 30_522, 1)
    with pytest.raises(ConfigError, match="takes images, not text"):
        text_tokenizer("cifar_cnn")
    bad_options = [
        ({"max_length": 1000}, "model.options.max_length: must be less than or equal to 512"),
        ({"max_length": 1}, "model.options.max_length: must be greater than or equal to 2"),
        ({"max_length": "64"}, "model.options.max_length: must be a valid integer"),
        ({"max_length": True}, "model.options.max_length: must be a valid integer"),
        ({"pooling": "max"}, r"model.options.pooling: must be 'cls' or 'mean' \(got 'max'\)"),
        ({"hf_name": "x"}, "unknown key 'model.options.hf_name'; allowed: max_length, pooling$"),
    ]
    for bad, match in bad_options:
        with pytest.raises(ConfigError, match=match):
            text_tokenizer("minilm", **bad)
    with pytest.raises(ConfigError, match="model.options.hf_name: must be a valid string"):
        text_tokenizer("text_hf", hf_name=3)  # refused before any hub call
    # the typed options the config holds pass as they are, keywords on top
    assert text_tokenizer("minilm", model_options_type("minilm")(max_length=8)).max_length == 8
    assert text_tokenizer("minilm", {"max_length": 8}, max_length=9).max_length == 9
    from tasks.config import Params
    from tasks.data.experiment import text_tokenizer_for

    tweets = load_dataset("tweet_sentiment", "unused", "test")
    p = Params.model_validate({"data": {"dataset": "tweet_sentiment"}})
    with pytest.raises(ConfigError, match="is text and model 'cifar_cnn' takes images"):
        text_tokenizer_for(p, tweets)
    p = Params.model_validate({"model": {"name": "minilm"}})
    with pytest.raises(ConfigError, match="takes text and dataset 'fashion_mnist' holds images"):
        text_tokenizer_for(p, object())


def test_text_hf_offline_is_one_line(monkeypatch):
    import huggingface_hub.constants as hub
    import transformers

    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)
    with pytest.raises(ConfigError) as err:
        get_model("text_hf", num_classes=3, hf_name="google-bert/bert-base-uncased")
    msg = str(err.value)
    assert "\n" not in msg and "could not load from the Hugging Face hub" in msg
    assert "offline use model minilm" in msg

    def hang_then_fail(*args, **kwargs):
        raise TimeoutError("read timed out")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", hang_then_fail)
    with pytest.raises(ConfigError, match=r"\(read timed out\)"):
        get_model("text_hf", num_classes=3, hf_name="some/model")
    with pytest.raises(ConfigError, match="needs model.options.hf_name"):
        get_model("text_hf", num_classes=3)


def tweet_run(seed: int = 3):
    """2 rounds of FedAvg with the whole MiniLM travelling: 16 tweets over 2 clients, tested on
    16 others (rows spread over each split: the corpus is sorted by sentiment)."""
    tok = text_tokenizer("minilm", max_length=32)
    train = load_dataset("tweet_sentiment", "x", "train")
    test = load_dataset("tweet_sentiment", "x", "test")
    rows = np.linspace(0, len(train) - 1, 16).astype(np.int64)
    train_data = TextData.from_texts(train.texts, train.labels, tok, 32, rows=rows)
    test_sub = test.subset(np.linspace(0, len(test) - 1, 16).astype(np.int64))
    test_data = TextData.from_texts(test_sub.texts, test_sub.labels, tok, 32)
    bytes_up: list[int] = []

    class Count(Callback):
        def on_client_end(self, record):
            bytes_up.append(record.upload_bytes)

    sim = Simulation(
        model_fn=functools.partial(get_model, "minilm", num_classes=3, max_length=32),
        algorithm=FedAvg(),
        train=train_data,
        test=test_data,
        shards=[rows[::2], rows[1::2]],
        local=LocalConfig(batch_size=8),
        lr_schedule=LRSchedule(lr=0.05),
        federation=FederationConfig(rounds=2, clients_per_round=2, seed=seed),
        workers=0,
        callbacks=[Count()],
    )
    history = sim.run()
    metrics = [(r.accuracy, r.test_loss) for r in history.rounds]
    return metrics, bytes_up, sim.global_state, test_data


def test_federated_tweets_two_rounds_full():
    metrics, up, state, test_data = tweet_run()
    state_bytes = len(payload.encode(minilm().state_dict()))
    assert up == [state_bytes] * 4  # 2 clients x 2 rounds, the whole model each time
    assert len(metrics) == 2
    # The final round's accuracy and loss are the final model's, evaluated apart from the
    # engine (16 test tweets: accuracy in sixteenths).
    from tests.helpers import independent_eval

    acc, loss = independent_eval(minilm(), state, test_data)
    assert metrics[-1][0] == pytest.approx(acc, abs=1e-12)
    assert metrics[-1][1] == pytest.approx(loss, rel=1e-4)


@pytest.mark.slow
def test_federated_tweets_deterministic():
    assert tweet_run()[0] == tweet_run()[0]  # same params and seed, same metrics


# ---- through the pipeline (fedapt run) ------------------------------------------------------
REPO = Path(__file__).resolve().parents[2]
TWEETS = ["--set", "data.dataset=tweet_sentiment", "--set", "model.name=minilm"]


def fedapt(tmp_path, command, *args):
    from typer.testing import CliRunner

    from flows.cli import app

    where = ["--set", f"experiment.reports_dir={tmp_path / 'reports'}"]
    local = ["--set", "storage.bucket=null", "--set", "runtime.tracking=false"]
    params = ["--params", str(REPO / "params.yaml")]
    return CliRunner().invoke(app, [command, *local, *args, *params, *where])


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--set", "data.dataset=tweet_sentiment"], "is text and model 'cifar_cnn' takes images"),
        (["--set", "model.name=minilm"], "takes text and dataset 'fashion_mnist' holds images"),
        (
            [*TWEETS, "--set", "model.options.max_length=1000"],
            "model.options.max_length: must be less than or equal to 512 (got 1000)",
        ),
        (
            [*TWEETS, "--set", "model.options.pooling=max"],
            "model.options.pooling: must be 'cls' or 'mean' (got 'max')",
        ),
        ([*TWEETS, "--set", "model.base=pretrain"], "text model 'minilm' starts from its own"),
        ([*TWEETS, "--set", "partition.scheme=gaussian_noise"], "not to token ids"),
    ],
)
def test_bad_text_input_one_line_no_outputs(tmp_path, args, needle):
    res = fedapt(tmp_path, "run", *args)
    text = res.output.strip()
    assert res.exit_code == 2 and needle in text and "Traceback" not in text, text
    assert len(text.splitlines()) == 1, text
    assert not (tmp_path / "reports").exists()


@pytest.mark.slow
def test_fedapt_run_on_tweets_registers_the_model(tmp_path, monkeypatch):
    """`fedapt run` on tweets with MiniLM (full): Prefect flow, MLflow run, registered model
    that computes what the final global model computes on token ids."""
    import mlflow.pytorch
    from prefect.testing.utilities import prefect_test_harness

    from tasks.config import load_params
    from tasks.data.experiment import load_experiment_data

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    small = [*TWEETS, "--set", "data.train_subset=24", "--set", "data.test_subset=24"]
    small += ["--set", "partition.scheme=iid", "--set", "partition.num_clients=2"]
    small += ["--set", "federation.rounds=1", "--set", "runtime.workers=0"]
    small += ["--set", "model.options.max_length=32", "--set", "validation.min_shard_size=1"]
    small += ["--set", "experiment.name=tweets-minilm"]
    with prefect_test_harness(server_startup_timeout=180):
        res = fedapt(
            tmp_path,
            "run",
            *small,
            "--set",
            "runtime.tracking=true",
            "--set",
            "tracking.register=always",  # a test subset: registered on request
        )
    assert res.exit_code == 0, res.output
    out = tmp_path / "reports" / "tweets-minilm"
    (run,) = json.loads((out / "summary.json").read_text())["runs"]
    assert run["model"] == "minilm" and run["total_params"] == ENCODER_PARAMS + 384 * 3 + 3
    assert run["upload_bytes_per_round"] == 2 * run["payload_bytes"]  # 2 clients, whole model
    loaded = mlflow.pytorch.load_model(f"models:/{run['registered_model']}@champion")
    ref = get_model("minilm", num_classes=3, max_length=32)
    ref.load_state_dict(payload.decode((out / "runs/fedavg-full/model.pt").read_bytes()))
    params = load_params(REPO / "params.yaml", [a for a in small if a != "--set"])
    x = load_experiment_data(params).text_example()  # (2, 32) ids, as logged
    with torch.no_grad():
        assert torch.allclose(loaded(x), ref.eval()(x), atol=1e-5)


def test_pretrain_on_text_is_one_line(tmp_path):
    from tasks.config import load_params
    from tasks.data.experiment import load_experiment_data
    from tasks.data.pretrain import train_base

    p = load_params(
        REPO / "params.yaml",
        ["pretrain.dataset=tweet_sentiment", "model.base=pretrain", "data.train_subset=1000"],
    )
    with pytest.raises(ConfigError, match="pretrain.dataset 'tweet_sentiment' is text"):
        train_base(p, tmp_path, load_experiment_data(p))
    assert not any(tmp_path.iterdir())
