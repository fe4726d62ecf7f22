"""Adapter methods through the pipeline's training cell on real FashionMNIST (small): per-round
traffic is the payload, the frozen base is counted apart, sizes and local training time are
in the record, and the model registered in MLflow is the merged plain backbone."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from fedcore import payload
from models.adapters import ResidualConv2d, adapted_model, get_adapter
from tasks.config import load_params
from tasks.training import modelfile
from tasks.training.cell import cell_of

REPO = Path(__file__).resolve().parents[3]


def small_params(tmp_path: Path, *extra: str):
    return load_params(
        REPO / "params.yaml",
        [
            f"experiment.reports_dir={tmp_path / 'reports'}",
            f"data.root={REPO / 'data/raw'}",
            "data.train_subset=200",
            "data.test_subset=100",
            "partition.num_clients=4",
            "partition.dirichlet_classwise.min_size=5",
            "validation.min_shard_size=5",
            "federation.rounds=2",
            "federation.last_rounds=2",
            "model.name=resnet26",
            "model.options.width=0.125",
            "runtime.workers=0",
            "runtime.tracking=false",
            "storage.bucket=null",
            *extra,
        ],
    )


@pytest.mark.parametrize("adapter", [pytest.param("full", marks=pytest.mark.slow), "residual"])
def test_cell_traffic_is_the_payload(tmp_path, adapter):
    from tasks.data.experiment import load_experiment_data
    from tasks.data.partitioning import build_partition
    from tasks.training.train import train_cell

    p = small_params(tmp_path)
    data = load_experiment_data(p)
    part = build_partition(p, data)
    record = train_cell(cell_of(p, data, "fedprox", adapter), data, part, tmp_path / "cell")
    model = adapted_model("resnet26", adapter, num_classes=10, in_channels=1, width=0.125)
    method = get_adapter(adapter)
    wire = len(payload.encode(method.payload(model)))
    assert record["payload_bytes"] == wire
    assert record["upload_bytes_per_round"] == record["download_bytes_per_round"] == 4 * wire
    assert record["upload_bytes"] == 2 * 4 * wire
    full = len(payload.encode(model.state_dict()))
    assert record["model_bytes"] == full
    if adapter == "full":
        assert record["base_bytes"] == record["base_download_bytes"] == 0
    else:
        base = {k: v for k, v in model.state_dict().items() if k not in method.payload(model)}
        assert record["base_bytes"] == len(payload.encode(base))
        assert record["base_download_bytes"] == 4 * record["base_bytes"]  # once per client
    assert record["local_train_seconds_mean"] > 0
    metrics = json.loads((tmp_path / "cell/metrics.json").read_text())
    assert "local_train_seconds_mean" not in metrics  # timings stay out of the hashed outputs
    assert metrics["payload_bytes"] == wire
    # The recorded accuracy is the saved model's, evaluated apart from the engine.
    from tasks.data.backbone import model_input
    from tests.helpers import independent_accuracy

    saved = modelfile.load_state(
        tmp_path / "cell/model.pt", modelfile.initial_model(p, data, adapter)
    )
    if adapter != "full":  # model.pt: the trained part (what travels) and the base's sha256
        assert (tmp_path / "cell/model.pt").stat().st_size < wire + 4096 < record["model_bytes"]
    test = data.image_data("test", model_input(p, data.train.info))
    acc = independent_accuracy(model, saved, test)
    assert record["final_accuracy"] == pytest.approx(acc, abs=1e-12)
    assert metrics["rounds"][-1]["accuracy"] == record["final_accuracy"]
    assert record["mean_accuracy_last_L"] == pytest.approx(
        np.mean([r["accuracy"] for r in metrics["rounds"]])
    )


def test_cell_personalization(tmp_path):
    """Personalization after FL: every client's before/after accuracy in the cell's record and
    metrics.json, on its own corrupted rows (seed 001 Table 4)."""
    from tasks.data.experiment import load_experiment_data
    from tasks.data.partitioning import build_partition
    from tasks.training.train import train_cell

    p = small_params(
        tmp_path,
        "federation.rounds=1",
        "federation.last_rounds=1",
        "personalize.enabled=true",
        "personalize.epochs=1",
        "personalize.scopes=[payload,client_token]",
        "personalize.severities=[1,4]",
    )
    data = load_experiment_data(p)
    part = build_partition(p, data)
    record = train_cell(cell_of(p, data, "fedavg", "residual"), data, part, tmp_path / "cell")
    personal = record["personalization"]
    assert list(personal) == ["payload"]  # client_token: no Accumulator in a ResNet, skipped
    clients = personal["payload"]["clients"]
    assert [c["client"] for c in clients] == [0, 1, 2, 3]
    assert [c["severity"] for c in clients] == [1, 4, 1, 4]
    sizes = [len(ix) for ix in part.client_indices]
    # Before fine-tuning a client tests the saved global model on its own corrupted rows:
    # the recorded accuracy is that model's, evaluated apart from the engine.
    from tasks.data.backbone import model_input
    from tests.helpers import independent_accuracy, personal_test_split

    model = adapted_model("resnet26", "residual", num_classes=10, in_channels=1, width=0.125)
    saved = modelfile.load_state(
        tmp_path / "cell/model.pt", modelfile.initial_model(p, data, "residual")
    )
    train = data.image_data("train", model_input(p, data.train.info))
    for c in clients:
        assert c["tune_samples"] + c["test_samples"] == sizes[c["client"]]
        own, rows = personal_test_split(
            train,
            part.client_indices[c["client"]],
            c["client"],
            c["severity"],
            p.experiment.seed,
            p.personalize.tune_fraction,
        )
        assert len(rows) == c["test_samples"]
        assert c["accuracy_before"] == pytest.approx(independent_accuracy(model, saved, own, rows))
        assert c["accuracy_after"] * c["test_samples"] == pytest.approx(
            round(c["accuracy_after"] * c["test_samples"])
        )  # a count of correct rows over test_samples
    metrics = json.loads((tmp_path / "cell/metrics.json").read_text())
    assert metrics["personalization"] == personal


@pytest.mark.slow
def test_registered_model_is_the_merged_plain_model(tmp_path, monkeypatch):
    import mlflow.pytorch

    from tasks.data.experiment import load_experiment_data
    from tasks.data.partitioning import build_partition, write_partition
    from tasks.training.train import run_cell

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    # 100 test images: registered because tracking.register says so (auto: whole split only)
    p = small_params(
        tmp_path, "runtime.tracking=true", "tracking.register=always", "federation.rounds=1"
    )
    data = load_experiment_data(p)
    write_partition(p, data, build_partition(p, data), tmp_path / "partition")
    cell = cell_of(p, data, "fedavg", "residual")
    record = run_cell(cell, tmp_path / "partition", tmp_path / "cell")
    loaded = mlflow.pytorch.load_model(f"models:/{record['registered_model']}@champion")
    names = [n for n, _ in loaded.named_parameters()] + list(loaded.state_dict())
    assert names and not any("adapter" in n for n in names)
    adapted = modelfile.load_cell_model(p, data, "residual", tmp_path / "cell")
    assert any(isinstance(m, ResidualConv2d) for m in adapted.modules())
    # The registered model takes images as stored (pixel/255, 1x28x28) and applies the
    # training input step itself (resize to resnet26's 72x72, normalise): its logits equal
    # the adapted model's on the engine's own test batches.
    from tasks.data.backbone import model_input

    test = data.image_data("test", model_input(p, data.train.info))
    idx = torch.arange(3)
    x, _ = test.batch(idx)
    assert tuple(x.shape) == (3, 1, 72, 72)
    stored = test.images.index_select(0, idx).float() / 255.0
    with torch.no_grad():
        assert torch.allclose(loaded(stored), adapted.eval()(x), atol=1e-5)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (
            ["--set", "grid.adapters=[residual]"],  # cifar_cnn: 5x5 convs only
            "adapter 'residual' does not apply to model 'cifar_cnn': it has no plain 3x3 "
            "nn.Conv2d (its convolutions are 5x5); methods that apply: full, head",
        ),
        (
            ["--set", "grid.algorithms=[fednilo]", "--set", "grid.adapters=[full,bn_head]"],
            "grid cell fednilo/bn_head: fednilo freezes layers of the whole model",
        ),
        (["--set", "grid.adapters=[lora9]"], "unknown adapter method 'lora9'"),
        (
            ["--set", "grid.algorithms=[fednova]", "--set", "client.optimizer=adamw"],
            "fednova normalises by local SGD steps (seed 004): it needs client.optimizer sgd",
        ),
        (
            ["--set", "grid.algorithms=[scaffold]", "--set", "client.optimizer=adamw"],
            "scaffold corrects local SGD gradients and reads (x - y_k) / (K eta_l) as their mean "
            "(option II): client.optimizer must be sgd, not adamw",
        ),
    ],
)
def test_bad_adapter_cells_stop_the_run_in_one_line(tmp_path, args, needle):
    from typer.testing import CliRunner

    from flows.cli import app

    res = CliRunner().invoke(
        app,
        [
            "run",
            "--params",
            str(REPO / "params.yaml"),
            "--set",
            "storage.bucket=null",
            "--set",
            f"experiment.reports_dir={tmp_path / 'reports'}",
            "--set",
            f"data.root={REPO / 'data/raw'}",
            *args,
        ],
    )
    text = res.output.strip()
    assert res.exit_code == 2, text
    assert needle in text and len(text.splitlines()) == 1, text
    assert not (tmp_path / "reports").exists()
