"""Next-token prediction through the pipeline: a tiny GPT-2 on federated Shakespeare, one
client per speaking role, pretrained on the held-out plays, fine-tuned with adapters."""

from __future__ import annotations

import json

import pytest

from fedcore.errors import ConfigError
from tasks.config import load_params
from tasks.data.experiment import dataset_card, dataset_num_classes, load_experiment_data
from tasks.data.partitioning import build_partition, write_partition
from tasks.data.pretrain import check_source, run_pretrain
from tasks.training.cell import build_simulation, cell_of
from tests.tasks.support import SETS


def params(*extra: str):
    return load_params(None, [*SETS, *extra])


def test_tiny_federation_gives_next_token_accuracy(tmp_path):
    p = params()
    data = load_experiment_data(p)
    assert data.train.info.num_classes == dataset_num_classes(p) == 512
    part = build_partition(p, data)
    assert part.scheme == "natural" and part.num_clients == 3
    write_partition(p, data, part, tmp_path / "partition")
    stats = json.loads((tmp_path / "partition" / "stats.json").read_text())
    assert len(stats["client_groups"]) == 3 and " / " in stats["client_groups"][0]
    assert len(stats["clients"][0]["label_counts"]) == 512  # up to 1,000 classes: per class
    assert (tmp_path / "partition" / "label_histogram.png").stat().st_size > 0
    assert len(dataset_card(p, data)["train"]["label_counts"]) == 512
    uploads = {}
    for adapter in ("full", "houlsby", "lora"):
        history = build_simulation(cell_of(p, data, "fedavg", adapter), data, part).sim.run()
        assert len(history.rounds) == 1
        assert all(0.0 <= r.accuracy <= 1.0 for r in history.rounds), adapter
        uploads[adapter] = history.rounds[-1].upload_bytes
    assert uploads["houlsby"] < uploads["full"] and uploads["lora"] < uploads["full"]


@pytest.mark.slow
def test_pretrained_base_on_held_out_plays_starts_the_federation(tmp_path):
    p = params("model.base=pretrain")
    card = run_pretrain(p, tmp_path / "pretrain", load_experiment_data(p))
    assert card["used"] and card["source"]["rows"] == 64 and card["context"] == 8
    assert card["source"]["plays"][0] == "Coriolanus"  # held out of the federation
    assert 0.0 <= card["final_test_accuracy"] <= 1.0 and card["epochs"][0]["train_loss"] > 0
    data = load_experiment_data(p)
    part = build_partition(p, data)
    base = str(tmp_path / "pretrain" / "base.pt")
    cell = build_simulation(cell_of(p, data, "fedavg", "houlsby", base=base), data, part)
    history = cell.sim.run()
    assert 0.0 <= history.rounds[0].accuracy <= 1.0
    assert (
        run_pretrain(p, tmp_path / "pretrain", load_experiment_data(p), reuse=True)["cached"]
        is True
    )


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["model.name=minilm", "model.options={}"], "dataset 'shakespeare' is next-token"),
        (["data.dataset=fashion_mnist"], "model 'gpt2_small' predicts the next token"),
        (["partition.scheme=dirichlet_classwise"], "partition.scheme: dirichlet_classwise skews"),
        (["partition.scheme=gaussian_noise"], "partition.scheme: gaussian_noise adds Gaussian"),
    ],
)
def test_mismatches_are_one_line(extra, needle):
    with pytest.raises(ConfigError, match=needle) as exc:
        load_experiment_data(params(*extra))
    assert "\n" not in str(exc.value)


def test_pretrain_refusals_are_one_line():
    with pytest.raises(ConfigError, match=r"^pretrain.lr: the decoder pretrains with AdamW"):
        p = params("model.base=pretrain", "pretrain.lr=0.05")
        check_source(p, load_experiment_data(p))
    with pytest.raises(ConfigError, match=r"^pretrain.classes: a decoder's classes"):
        p = params("model.base=pretrain", "pretrain.classes=[1]")
        check_source(p, load_experiment_data(p))
    with pytest.raises(ConfigError, match=r"^partition.num_clients: 5000 clients but only"):
        build_partition(params("partition.num_clients=5000"), load_experiment_data(params()))


@pytest.mark.slow
def test_fedapt_run_pretrains_federates_and_registers(tmp_path, monkeypatch):
    """`fedapt run` on Shakespeare: partition by role, validation over the vocabulary, the
    pretrain stage, a Houlsby cell, and a registered model that computes what the final
    adapted model computes on a window of ids."""
    from pathlib import Path

    import mlflow.pytorch
    import torch
    from prefect.testing.utilities import prefect_test_harness
    from typer.testing import CliRunner

    from flows.cli import app
    from tasks.training import modelfile

    repo = Path(__file__).resolve().parents[3]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    sets = [*SETS, "model.base=pretrain", "grid.adapters=[houlsby]", "runtime.tracking=true"]
    sets += ["tracking.register=always", "storage.bucket=null", "experiment.name=shk"]
    sets += [f"experiment.reports_dir={tmp_path / 'reports'}", "validation.min_shard_size=10"]
    args = ["run", "--params", str(repo / "params.yaml")]
    for s in sets:
        args += ["--set", s]
    with prefect_test_harness(server_startup_timeout=180):
        res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    out = tmp_path / "reports" / "shk"
    assert json.loads((out / "partition" / "validation.json").read_text())["success"]
    assert json.loads((out / "pretrain" / "base.json").read_text())["used"]
    (run,) = json.loads((out / "summary.json").read_text())["runs"]
    assert 0.0 <= run["final_accuracy"] <= 1.0
    loaded = mlflow.pytorch.load_model(f"models:/{run['registered_model']}@champion")
    # model.pt holds the trained part; the base is the pretrain file (its sha256 checked)
    p = params("model.base=pretrain", "grid.adapters=[houlsby]")
    data = load_experiment_data(p)
    ref = modelfile.load_cell_model(
        p, data, "houlsby", out / "runs/fedavg-houlsby", out / "pretrain" / "base.pt"
    )
    trained, base = modelfile.read(out / "runs/fedavg-houlsby/model.pt")
    assert base is not None and base["pretrain_file"] == "base.pt" and "head.weight" not in trained
    x = data.text_example()  # (2, 8) ids, as logged
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), ref.eval()(x), atol=1e-5, rtol=1e-5)
