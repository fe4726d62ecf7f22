"""The pretrain stage: a base trained on rows/classes the federation never sees, written
deterministically, reused by its fingerprint, copied into the FL model (all but the head);
model.base and model.input_size in params, with one-line errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from fedcore import payload
from fedcore.errors import ConfigError
from tasks.config import load_params
from tasks.data.backbone import backbone_options, load_base, model_input
from tasks.data.experiment import load_experiment_data
from tasks.data.pretrain import run_pretrain, source_split
from tasks.training.cell import model_factory, require_base

REPO = Path(__file__).resolve().parents[3]
SMALL = [
    f"data.root={REPO / 'data/raw'}",
    "data.train_subset=600",
    "data.test_subset=200",
    "model.base=pretrain",
    "pretrain.max_samples=256",
    "pretrain.epochs=1",
    "pretrain.batch_size=32",
    "pretrain.classes=[5, 6, 7, 8, 9]",
]


def _split(p):
    return source_split(p, load_experiment_data(p))


def params(*extra: str):
    return load_params(REPO / "params.yaml", [*SMALL, *extra])


def test_source_rows_are_disjoint_from_the_federation():
    p = params()
    train, rows, test, test_rows = source_split(p, load_experiment_data(p))
    fl = load_experiment_data(p)
    assert len(rows) == 256 and not set(rows) & set(fl.train_idx)
    assert set(train.labels[rows].tolist()) <= {5, 6, 7, 8, 9}
    assert set(test.labels[test_rows].tolist()) <= {5, 6, 7, 8, 9}
    assert set(test_rows) <= set(fl.test_idx)  # evaluated on the FL test subset's rows
    again = source_split(p, load_experiment_data(p))[1]
    assert np.array_equal(rows, again)  # seeded


def test_source_errors_are_one_line():
    with pytest.raises(ConfigError, match="uses every training row of fashion_mnist"):
        _split(params("data.train_subset=null"))
    with pytest.raises(ConfigError, match=r"pretrain.classes: fashion_mnist has classes 0..9"):
        _split(params("pretrain.classes=[3, 12]"))
    with pytest.raises(ConfigError, match="pretrain.classes: classes are label ids >= 0"):
        params("pretrain.classes=[]")
    with pytest.raises(ConfigError, match="unknown dataset 'imagenet'"):
        _split(params("pretrain.dataset=imagenet"))


def test_base_options_and_input():
    with pytest.raises(ConfigError, match="model.options: set model.base"):
        params("model.options={pretrained: true}")
    with pytest.raises(ConfigError, match="model 'cifar_cnn' has no ImageNet weights; models"):
        backbone_options(params("model.base=imagenet"))
    lite = params("model.name=efficientnet_lite0", "model.base=imagenet")
    assert backbone_options(lite).pretrained is True
    info = load_experiment_data(lite).train.info
    assert model_input(lite, info).shape == (1, 224, 224)  # gray kept: the summed stem
    assert model_input(
        params("model.name=efficientnet_lite0", "model.input_size=64"), info
    ).shape == (
        1,
        64,
        64,
    )  # base pretrain: trained from scratch on the data's own statistics, at 64x64
    assert model_input(params("model.name=resnet26"), info).shape == (1, 72, 72)
    with pytest.raises(ConfigError, match="model.input_size: must be less than"):
        params("model.input_size=5000")


def test_pretrain_writes_a_deterministic_base_that_the_fl_model_starts_from(tmp_path):
    p = params()
    card = run_pretrain(p, tmp_path / "a", load_experiment_data(p))
    assert (
        card["used"] and card["source"]["rows"] == 256 and card["source"]["disjoint_from_fl_rows"]
    )
    assert 0.2 < card["final_test_accuracy"] <= 1.0  # 5 classes: chance is 0.2
    # The card's accuracy is base.pt's on the source test rows, evaluated apart from the stage.
    from fedcore.client import ImageData
    from models.registry import get_model
    from tests.helpers import independent_accuracy

    _, _, source_test, test_rows = source_split(p, load_experiment_data(p))
    inp = model_input(p, load_experiment_data(p).train.info)
    test_data = ImageData(
        source_test.images,
        source_test.labels,
        inp.mean,
        inp.std,
        size=inp.size,
        channels=inp.channels,
    )
    net = get_model(
        p.model.name,
        num_classes=source_test.info.num_classes,
        in_channels=inp.channels,
        input_size=inp.size,
        options=backbone_options(p),
    )
    saved = payload.decode((tmp_path / "a/base.pt").read_bytes())
    acc = independent_accuracy(net, saved, test_data, test_rows)
    assert card["final_test_accuracy"] == pytest.approx(acc, abs=1e-6)  # stored to 6 digits
    run_pretrain(p, tmp_path / "b", load_experiment_data(p))
    for f in ("base.pt", "base.json"):  # a rerun writes the same bytes
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()
    assert run_pretrain(p, tmp_path / "a", load_experiment_data(p), reuse=True).get("cached") is True
    changed = params("pretrain.lr=0.01")
    assert run_pretrain(changed, tmp_path / "a", load_experiment_data(changed), reuse=True).get("cached") is None  # retrained

    base_path = run_pretrain(p, tmp_path / "a", load_experiment_data(p), reuse=True) and str(tmp_path / "a/base.pt")
    base = payload.decode(Path(base_path).read_bytes())
    data = load_experiment_data(p)
    model = model_factory(p, data, "full", require_base(p, base_path))()
    state = model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in base.items() if not k.startswith("fc3."))
    assert not torch.equal(state["fc3.weight"], base["fc3.weight"])  # a fresh head

    with pytest.raises(ConfigError, match="no pretrain base at .*run: fedapt pretrain"):
        require_base(p, tmp_path / "missing.pt")
    assert require_base(params("model.base=none"), None) is None
    lenet = model_factory(params("model.name=lenet5"), data)()
    with pytest.raises(
        ConfigError, match=r"does not fit model 'lenet5' \(shape differs: fc1.bias\)"
    ):
        load_base(lenet, base_path, "lenet5")


def test_unused_pretrain_writes_only_a_card(tmp_path):
    (tmp_path / "base.pt").write_bytes(b"stale")
    card = run_pretrain(params("model.base=none"), tmp_path, None)
    assert card == {"used": False, "reason": "model.base is none"}
    assert not (tmp_path / "base.pt").exists()


@pytest.mark.slow
def test_flow_pretrains_once_and_federates_from_the_base(tmp_path, monkeypatch):
    """fedapt run with model.base: pretrain: the pretrain task writes the base into the
    experiment's reports (copied to S3 with them), the cells start from it; a second run
    reuses it by fingerprint."""
    from prefect.testing.utilities import prefect_test_harness

    from flows.experiment import experiment_flow
    from tasks.config import experiment_dir

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    p = params(
        f"experiment.reports_dir={tmp_path / 'reports'}",
        "federation.rounds=1",
        "federation.last_rounds=1",
        "partition.num_clients=3",
        "runtime.workers=0",
        "storage.bucket=null",
    )
    with prefect_test_harness(server_startup_timeout=180):
        records = experiment_flow(params=p)
        base = experiment_dir(p) / "pretrain/base.pt"
        first = base.read_bytes()
        mtime = base.stat().st_mtime_ns
        experiment_flow(params=p)
    assert records[0]["final_accuracy"] is not None
    assert base.read_bytes() == first and base.stat().st_mtime_ns == mtime  # reused, not retrained
    logged = sorted((tmp_path / "artifacts").glob("**/artifacts/pretrain/*"))
    assert [f.name for f in logged] == ["base.json", "base.pt"] * 2  # on both parent runs
    assert logged[1].read_bytes() == first


def test_pretrain_command_and_train_without_a_base(tmp_path):
    from typer.testing import CliRunner

    from flows.cli import app

    runner = CliRunner()
    common = ["--params", str(REPO / "params.yaml"), "--set", f"data.root={REPO / 'data/raw'}"]
    res = runner.invoke(
        app,
        ["pretrain", *common, "--set", "model.base=pretrain", "--set", "pretrain.classes=[11]"]
        + ["--out", str(tmp_path / "pt")],
    )
    assert res.exit_code == 2
    assert res.output.strip().splitlines() == [
        "fedapt: error: pretrain.classes: fashion_mnist has classes 0..9 (got [11])"
    ]
    assert not (tmp_path / "pt").exists()  # nothing written
    res = runner.invoke(
        app, ["pretrain", *common, "--out", str(tmp_path / "pt"), "--timing", str(tmp_path)]
    )
    assert res.exit_code == 0 and "pretrain not used (model.base is none)" in res.output
    small = ["--set", "data.train_subset=600", "--set", "data.test_subset=200"]
    part = str(tmp_path / "part")
    assert runner.invoke(app, ["partition", *common, *small, "--out", part]).exit_code == 0
    assert runner.invoke(app, ["validate", *common, *small, "--partition", part]).exit_code == 0
    res = runner.invoke(
        app,
        ["train", "--algorithm", "fedavg", *common, *small, "--set", "model.base=pretrain"]
        + ["--set", "runtime.tracking=false", "--partition", part, "--base", str(tmp_path / "pt")]
        + ["--out", str(tmp_path / "cell")],
    )
    assert res.exit_code == 2
    assert res.output.strip().splitlines() == [
        f"fedapt: error: model.base: pretrain: no pretrain base at {tmp_path / 'pt/base.pt'}; "
        "run: fedapt pretrain (or dvc repro pretrain)"
    ]
    assert not (tmp_path / "cell").exists()
