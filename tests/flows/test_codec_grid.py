"""A grid of adapters x update codecs through `fedapt run` and `dvc repro` (slow): every cell
runs, the bytes each reports are those of real encodings of what it sends, and the report
has the codec column and the Pareto front, in the files and in the MLflow run."""

from __future__ import annotations

import json

import pytest
import yaml

from fedcore import payload
from fedcore.codecs import encode_state
from tasks.config import load_params
from tasks.grid import cell_name
from tasks.training import modelfile
from tests.flows.support import invoke
from tests.repo.support import DVC, sh

pytestmark = pytest.mark.slow

GRID = [
    "--set", "data.train_subset=600", "--set", "data.test_subset=300",
    "--set", "federation.rounds=2", "--set", "federation.last_rounds=1",
    "--set", "partition.num_clients=4", "--set", "runtime.workers=0",
    "--set", "grid.adapters=[full,lora]", "--set", "grid.codecs=[none,fp16,int8,topk]",
]  # fmt: skip
CELLS = [f"fedavg-{a}{c}" for a in ("full", "lora") for c in ("", "-fp16", "-int8", "-topk")]


def expected_bytes(state, codec):
    """len() of one client's upload and download of ``state`` through ``codec`` (the sizes
    depend on the structure alone; cifar_cnn has no BatchNorm statistics to send raw)."""
    up = down = len(payload.encode(state))
    if codec.upload is not None:
        up = len(payload.encode(encode_state(codec.upload, state, upload=True, gen=_gen())))
    if codec.download is not None:
        down = len(payload.encode(encode_state(codec.download, state, upload=False, gen=None)))
    return up, down


def _gen():
    import torch

    return torch.Generator().manual_seed(0)


def test_fedapt_run_grid_of_adapters_and_codecs(tmp_path, prefect_server, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    res = invoke(tmp_path, "run", *GRID, "--set", "runtime.tracking=true",
                 "--set", "tracking.register=never")  # fmt: skip
    assert res.exit_code == 0, res.output
    exp = tmp_path / "reports/fmnist-dir05-fedavg"
    summary = json.loads((exp / "summary.json").read_text())
    runs = {r["algorithm"] + "-" + r["adapter"] + ("-" + r["codec"] if "codec" in r else ""): r
            for r in summary["runs"]}  # fmt: skip
    assert list(runs) == CELLS
    params = load_params(None, [s for s in GRID if s != "--set"])
    for name, r in runs.items():
        codec = params.grid.codec(r.get("codec", "none"))
        metrics = json.loads((exp / "runs" / name / "metrics.json").read_text())
        # what travels: the whole model, or what a frozen-base cell trains (its model.pt)
        sent, _ = modelfile.read(exp / "runs" / name / "model.pt")
        up, down = expected_bytes(sent, codec)
        for rec in metrics["rounds"]:  # every round, every one of its 4 clients
            assert rec["upload_bytes"] == 4 * up, (name, rec["round"])
            assert rec["download_bytes"] == 4 * down, (name, rec["round"])
    full = runs["fedavg-full"]["upload_bytes"]
    assert runs["fedavg-full-fp16"]["upload_bytes"] < full / 1.9
    assert runs["fedavg-full-int8"]["upload_bytes"] < full / 3.5
    assert runs["fedavg-full-topk"]["upload_bytes"] < full / 20
    assert runs["fedavg-full-topk"]["download_bytes"] == runs["fedavg-full"]["download_bytes"]
    cost = json.loads((exp / "comm_cost.json").read_text())
    assert sorted(cost["target"]["runs"]) == sorted(CELLS)
    md = (exp / "comm_cost.md").read_text()
    assert "| run | adapter | codec |" in md or "no target" in md
    assert (exp / "pareto_front.png").stat().st_size > 10_000
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (e,) = [x for x in client.search_experiments() if x.name == "fmnist-dir05-fedavg"]
    parents = [r for r in client.search_runs([e.experiment_id])
               if r.data.tags.get("fedapt.kind") == "experiment"]  # fmt: skip
    assert "pareto_front.png" in [a.path for a in client.list_artifacts(parents[0].info.run_id)]
    tagged = {
        r.info.run_name: r.data.tags.get("codec") for r in client.search_runs([e.experiment_id])
    }
    assert tagged["fedavg-full-int8"] == "int8" and tagged["fedavg-lora-topk"] == "topk"


def test_dvc_repro_grid_of_adapters_and_codecs(repo_copy):
    params = yaml.safe_load((repo_copy / "params.yaml").read_text())
    params["partition"]["num_clients"] = 4
    params["grid"].update(adapters=["full", "lora"], codecs=["none", "int8", "topk"])
    # one train stage per cell, named as everywhere else (the codec none left out)
    cells = {
        cell_name("fedavg", a, c): {"algorithm": "fedavg", "adapter": a, "codec": c}
        for a in ("full", "lora")
        for c in ("none", "int8", "topk")
    }
    params["dvc"]["cells"] = cells
    (repo_copy / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    out = sh(DVC, "repro", cwd=repo_copy)
    assert "fedavg-full" in cells and "fedavg-full-none" not in cells
    for name in cells:
        assert f"Running stage 'train@{name}'" in out
        assert (repo_copy / f"artifacts/runs/{name}/metrics.json").is_file()
    summary = json.loads((repo_copy / "artifacts/report/summary.json").read_text())
    assert [r.get("codec", "none") for r in summary["runs"]] == ["none", "int8", "topk"] * 2
    assert (repo_copy / "artifacts/report/pareto_front.png").is_file()
    cost = json.loads((repo_copy / "artifacts/report/comm_cost.json").read_text())
    assert "fedavg-lora-int8" in cost["target"]["runs"]
    assert "Data and pipelines are up to date" in sh(DVC, "repro", cwd=repo_copy)
