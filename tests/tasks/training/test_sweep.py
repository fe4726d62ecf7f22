"""Seed sweeps (``experiment.seeds``): each grid cell once per seed under ``seed-<s>/``, the
mean ± sample std over the seeds in summary.json and results.md, one line for bad seeds,
single-seed runs unchanged.

The flow's body (``experiment_flow.fn``) runs here with its Prefect tasks and subflows called
in this process (``Inline``): the real partition, validation, training and summary code, no
Prefect API (the real flow on a Prefect server is the slow test at the end).
"""

from __future__ import annotations

import contextlib
import json
import types
from pathlib import Path

import numpy as np
import pytest

from fedcore.errors import ConfigError

REPO = Path(__file__).resolve().parents[3]
CELL_FILES = ("model.pt", "metrics.json", "rounds.csv", "scores.json")
# timings and the process a cell ran in: never equal between two runs
TIMINGS = (
    "wall_seconds",
    "process_seconds",
    "local_train_seconds_mean",
    "local_train_seconds_per_round",
)


def tiny(reports: Path, *extra: str) -> list[str]:
    return [
        f"experiment.reports_dir={reports}",
        "experiment.name=sweep",
        f"data.root={REPO / 'data/raw'}",
        "data.train_subset=200",
        "data.test_subset=100",
        "model.name=lenet5",
        "partition.scheme=iid",
        "partition.num_clients=3",
        "validation.min_shard_size=5",
        "federation.rounds=2",
        "federation.last_rounds=2",
        "client.max_steps=2",
        "runtime.workers=0",
        "runtime.tracking=false",
        "storage.bucket=null",
        *extra,
    ]


class Inline:
    """A Prefect task or flow called in this process: ``submit`` runs it at once; arguments
    ``quote``d for Prefect (flows/experiment.py) are unwrapped, as Prefect does."""

    def __init__(self, obj) -> None:
        self.fn = getattr(obj, "fn", obj)

    def with_options(self, **_):
        return self

    def submit(self, *args, **kwargs):
        value = self(*args, **kwargs)
        return types.SimpleNamespace(result=lambda: value)

    def __call__(self, *args, **kwargs):
        from prefect.utilities.annotations import quote

        def plain(v):
            return v.unquote() if isinstance(v, quote) else v

        return self.fn(*map(plain, args), **{k: plain(v) for k, v in kwargs.items()})


@pytest.fixture
def run_flow(monkeypatch):
    import flows.experiment as fe

    env = types.SimpleNamespace(
        run_environment=lambda **_: contextlib.nullcontext({}),
        run_lock=lambda *a, **k: contextlib.nullcontext(),
    )
    monkeypatch.setattr(fe, "services", env)
    for name in (
        "partition_task",
        "validate_task",
        "summary_task",
        "sweep_summary_task",
        "train_task",
        "train_grid_flow",
        "train_sweep_flow",
    ):
        monkeypatch.setattr(fe, name, Inline(getattr(fe, name)))
    monkeypatch.setattr(fe, "results_artifact_task", lambda *a, **k: None)

    def run(reports: Path, *extra: str) -> list[dict]:
        return fe.experiment_flow.fn(
            params_file=str(REPO / "params.yaml"), overrides=tiny(reports, *extra)
        )

    return run


def without_timings(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMINGS} for r in records]


def test_a_two_seed_sweep_is_each_seed_run_alone_plus_mean_and_std(tmp_path, run_flow):
    """Each seed of a sweep writes under seed-<s>/ the same bytes as a single-seed run of that
    seed; summary.json's mean and sample std per cell are numpy's over the per-seed records."""
    # given in any order, run in seed order; seed null: the smallest of them
    records = run_flow(tmp_path / "sweep", "experiment.seed=null", "experiment.seeds=[3,1]")
    single = run_flow(tmp_path / "single", "experiment.seed=3")
    out, alone = tmp_path / "sweep/sweep", tmp_path / "single/sweep"
    assert [(r["seed"], r["algorithm"]) for r in records] == [(1, "fedavg"), (3, "fedavg")]
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["seed-1", "seed-3"]
    assert not (out / "runs").exists() and not (out / "partition").exists()
    assert not (out / "seed-1/checkpoints").exists()  # removed when the sweep is done

    seed3 = out / "seed-3"
    for name in ("partition/manifest.csv", "partition/stats.json"):
        assert (seed3 / name).read_bytes() == (alone / name).read_bytes(), name
    for name in CELL_FILES:
        want = (alone / "runs/fedavg-full" / name).read_bytes()
        assert (seed3 / "runs/fedavg-full" / name).read_bytes() == want, name
    for name in ("comm_cost.json", "results.md"):
        assert (seed3 / name).read_bytes() == (alone / name).read_bytes(), name
    own = json.loads((seed3 / "summary.json").read_text())
    ref = json.loads((alone / "summary.json").read_text())
    where = "experiment.reports_dir"
    assert own["params"].pop(where) != ref["params"].pop(where)  # the only difference
    assert own["params"] == ref["params"] and "experiment.seeds" not in own["params"]
    assert without_timings(own["runs"]) == without_timings(ref["runs"])
    assert without_timings(own["runs"]) == without_timings([records[1]])
    # the two seeds drew different partitions and trained different models
    assert (out / "seed-1/partition/manifest.csv").read_bytes() != (
        seed3 / "partition/manifest.csv"
    ).read_bytes()

    summary = json.loads((out / "summary.json").read_text())
    assert summary["seeds"] == [1, 3] and summary["params"]["experiment.seeds"] == [1, 3]
    assert "ddof=1" in summary["std"]
    assert without_timings(summary["runs"]) == without_timings(records)
    (cell,) = summary["cells"]
    assert cell["cell"] == "fedavg-full" and cell["seeds"] == [1, 3]
    runs = summary["runs"]
    acc = np.array([r["final_accuracy"] for r in runs])
    last = np.array([r["mean_accuracy_last_L"] for r in runs])
    total = np.array([(r["upload_bytes"] + r["download_bytes"]) / 2**20 for r in runs])
    assert acc[0] != acc[1]
    for key, values in (("final_accuracy", acc), ("mean_accuracy_last_L", last)):
        assert cell[key]["values"] == values.tolist()
        assert cell[key]["mean"] == pytest.approx(np.mean(values), abs=1e-15)
        assert cell[key]["std"] == pytest.approx(np.std(values, ddof=1), abs=1e-15)
        assert cell[key]["n"] == 2
    assert cell["total_mib"]["mean"] == pytest.approx(np.mean(total), rel=1e-12)
    assert cell["total_mib"]["std"] == pytest.approx(np.std(total, ddof=1), abs=1e-9)

    md = (out / "results.md").read_text()
    pct = f"{100 * np.mean(acc):.2f} ± {100 * np.std(acc, ddof=1):.2f} (2 seeds)"
    assert f"| fedavg-full | iid | 2 | {pct} |" in md, md

    assert len(single) == 1


def test_a_single_seed_run_keeps_its_layout(tmp_path, run_flow):
    """Without seeds (absent or null) nothing moves: no seed-<s>/ folders, the summary's
    keys and params as before, and seeds: null is the very same run."""
    run_flow(tmp_path / "a")
    run_flow(tmp_path / "b", "experiment.seeds=null")
    a, b = tmp_path / "a/sweep", tmp_path / "b/sweep"
    assert sorted(p.name for p in a.iterdir() if p.is_dir()) == ["partition", "runs"]
    summary = json.loads((a / "summary.json").read_text())
    assert set(summary) == {
        "experiment",
        "params",
        "origin",
        "runs",
    }  # origin: tasks.results.origin
    assert not any(k.startswith("experiment.seeds") for k in summary["params"])
    for name in CELL_FILES:
        path = f"runs/fedavg-full/{name}"
        assert (a / path).read_bytes() == (b / path).read_bytes()
    assert (a / "results.md").read_bytes() == (b / "results.md").read_bytes()


def test_resume_is_per_seed_and_cell(tmp_path, run_flow, monkeypatch):
    """A sweep that dies in its second seed resumes: the finished seed trains nothing again,
    and the outputs equal an uninterrupted sweep's."""
    import tasks.training.train as tt

    run_flow(tmp_path / "ref", "experiment.seeds=[0,1]", "runtime.checkpoint_every=1")
    real = tt.run_cell
    trained: list[int] = []

    def dies_in_seed_1(cell, *args, **kwargs):
        trained.append(cell.seed)
        assert cell.seed == cell.params.experiment.seed
        if cell.seed == 1 and trained.count(1) == 1:
            raise KeyboardInterrupt
        return real(cell, *args, **kwargs)

    monkeypatch.setattr(tt, "run_cell", dies_in_seed_1)
    extra = ("experiment.seeds=[0,1]", "runtime.checkpoint_every=1")
    with pytest.raises(KeyboardInterrupt):
        run_flow(tmp_path / "cut", *extra)
    out = tmp_path / "cut/sweep"
    assert (out / "seed-0/checkpoints/fedavg-full.pt").is_file()  # kept for the rerun
    from flows.plan import prepare
    from tasks.config import load_params

    params = REPO / "params.yaml"
    resumes = prepare(load_params(params, tiny(tmp_path / "cut", *extra)), results=False)
    assert resumes.resuming == ["seed-0/fedavg-full"]
    other = load_params(params, tiny(tmp_path / "cut", *extra, "client.lr=0.5"))
    with pytest.raises(ConfigError, match=r"seed-0/checkpoints/fedavg-full.pt was written for"):
        prepare(other, results=False)  # the preflight of `fedapt run`: before anything runs

    from fedcore.engine import Simulation

    rounds_run: list[int] = []  # the seed of every round trained by the rerun
    real_round = Simulation._round

    def counted(self, r, *args, **kwargs):
        rounds_run.append(self.cfg.seed)
        return real_round(self, r, *args, **kwargs)

    monkeypatch.setattr(Simulation, "_round", counted)
    run_flow(tmp_path / "cut", *extra)
    assert rounds_run == [1, 1]  # seed 0 resumed from its final checkpoint: no round
    assert not (out / "seed-0/checkpoints").exists()
    ref = tmp_path / "ref/sweep"
    for seed in (0, 1):
        for name in CELL_FILES:
            path = f"seed-{seed}/runs/fedavg-full/{name}"
            assert (out / path).read_bytes() == (ref / path).read_bytes(), path


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("[]", "experiment.seeds: must be a list of distinct seeds >= 0"),
        ("[1,1]", "(got [1, 1])"),
        ("[0,-2]", "(got [0, -2])"),
        ("3", "(got 3)"),
        ("[0,x]", "experiment.seeds.1: must be a valid integer"),
        ("[4,5]", "experiment.seed 0 is not one of the seeds [4, 5]"),
    ],
)
def test_bad_seeds_give_one_line(tmp_path, value, needle):
    from tasks.config import load_params

    with pytest.raises(ConfigError) as err:
        load_params(REPO / "params.yaml", [f"experiment.seeds={value}"])
    line = str(err.value)
    assert "\n" not in line and needle in line, line
    assert line.startswith(f"{REPO / 'params.yaml'} (with --set):")


def test_seeds_in_the_file_name_their_line_and_seed_follows_them(tmp_path):
    from tasks.config import load_params

    text = (REPO / "params.yaml").read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("  seed: 0\n", "  seed: 2\n  seeds: [0, 1]\n", 1))
    with pytest.raises(ConfigError, match=r"bad.yaml:\d+: experiment.seeds: experiment.seed 2"):
        load_params(bad)
    lines = bad.read_text().splitlines()
    with pytest.raises(ConfigError) as err:
        load_params(bad)
    line = int(str(err.value).split(":")[1])
    assert lines[line - 1].strip().startswith("seeds:")
    # seed absent (or null) in a sweep: the smallest seed; the list is kept sorted
    good = tmp_path / "good.yaml"
    good.write_text(text.replace("  seed: 0\n", "  seeds: [4, 2, 3]\n", 1))
    p = load_params(good)
    assert p.experiment.seeds == (2, 3, 4) and p.experiment.seed == 2
    assert p.flat()["experiment.seeds"] == [2, 3, 4]
    p = load_params(REPO / "params.yaml", ["experiment.seed=null", "experiment.seeds=[7,5]"])
    assert (p.experiment.seed, p.experiment.seeds) == (5, (5, 7))


def test_a_sweep_refuses_a_given_partition(tmp_path):
    from flows.plan import check_sweep
    from tasks.config import load_params

    p = load_params(REPO / "params.yaml", ["experiment.seeds=[0,1]"])
    with pytest.raises(ConfigError, match="draws a partition per seed; drop --partition"):
        check_sweep(p, tmp_path)
    check_sweep(p, None)
    check_sweep(load_params(REPO / "params.yaml"), tmp_path)  # single seed: fine


def test_sweep_statistics_and_parent_metrics():
    """One seed: std null and no std metric; a value missing in one seed leaves it out."""
    from tasks.config import load_params
    from tasks.training.sweep import cell_stats, parent_metrics, sweep_markdown

    p = load_params(REPO / "params.yaml", ["experiment.seeds=[0,1]", "grid.algorithms=[fedavg]"])

    def rec(seed, acc):
        return {
            "algorithm": "fedavg",
            "adapter": "full",
            "partition": "iid",
            "seed": seed,
            "rounds": 3,
            "last_rounds_L": 2,
            "final_accuracy": acc,
            "mean_accuracy_last_L": 0.5,
            "upload_bytes": 2**20,
            "download_bytes": 2**21,
            "diverged_at_round": None if acc else 2,
        }

    (cell,) = cell_stats(p, [rec(1, None), rec(0, 0.8)])  # finished in any order
    assert cell["seeds"] == [0, 1] and cell["final_accuracy"]["values"] == [0.8, None]
    assert cell["final_accuracy"] == {"mean": 0.8, "std": None, "n": 1, "values": [0.8, None]}
    assert cell["mean_accuracy_last_L"]["std"] == 0.0
    assert cell["total_mib"]["mean"] == 3.0
    metrics = parent_metrics([cell])
    assert metrics["fedavg-full/final_accuracy_mean"] == 0.8
    assert "fedavg-full/final_accuracy_std" not in metrics
    assert metrics["fedavg-full/n_seeds"] == 2.0
    assert metrics["fedavg-full/total_mib_std"] == 0.0
    md = sweep_markdown(p, [cell])
    assert "| 80.00 (1 seed) |" in md and "| 2 (seed 1) |" in md, md
    from rich.console import Console

    from flows.cli.tables import sweep_table

    console = Console(record=True, width=200)
    console.print(sweep_table([cell], [0, 1]))
    text = console.export_text()
    assert "mean ± std over seeds 0, 1" in text and "80.00 (1 seed)" in text, text
    assert "50.00 ± 0.00 (2 seeds, L=2)" in text and "2 (seed 1)" in text, text


@pytest.mark.slow
def test_fedapt_run_sweep_tracks_a_run_per_cell_and_seed(tmp_path, monkeypatch):
    """`fedapt run` of a 2-seed x 2-cell sweep on a Prefect test server, tracked in MLflow:
    a child run per (cell, seed) tagged with its seed, the parent run holds each cell's mean
    and std, and the printed table is the sweep's."""
    from mlflow import MlflowClient
    from prefect.testing.utilities import prefect_test_harness
    from typer.testing import CliRunner

    from flows.cli import app

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    args = ["run", "--params", str(REPO / "params.yaml")]
    for item in tiny(
        tmp_path / "reports", "experiment.seeds=[0,1]", "grid.algorithms=[fedavg,fedprox]"
    ):
        args += ["--set", item.replace("runtime.tracking=false", "runtime.tracking=true")]
    with prefect_test_harness(server_startup_timeout=180):
        res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "mean ± std over seeds 0, 1" in res.output and "(2 seeds" in res.output
    summary = json.loads((tmp_path / "reports/sweep/summary.json").read_text())
    assert [(r["seed"], r["algorithm"]) for r in summary["runs"]] == [
        (0, "fedavg"), (0, "fedprox"), (1, "fedavg"), (1, "fedprox"),
    ]  # fmt: skip
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("sweep")
    runs = client.search_runs([exp.experiment_id])
    (parent,) = [r for r in runs if r.data.tags.get("fedapt.kind") == "experiment"]
    cells = [r for r in runs if r.data.tags.get("fedapt.kind") == "cell"]
    names = sorted((r.info.run_name, r.data.tags["seed"]) for r in cells)
    assert names == [
        ("fedavg-full seed 0", "0"), ("fedavg-full seed 1", "1"),
        ("fedprox-full seed 0", "0"), ("fedprox-full seed 1", "1"),
    ]  # fmt: skip
    for r in cells:
        assert r.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert r.data.params["experiment.seed"] == r.data.tags["seed"]
        assert r.info.status == "FINISHED"
    by_cell = {c["cell"]: c for c in summary["cells"]}
    m = parent.data.metrics
    for cell in ("fedavg-full", "fedprox-full"):
        stat = by_cell[cell]["final_accuracy"]
        # accuracies in % in MLflow, as in every results table
        assert m[f"{cell}/final_accuracy_mean_pct"] == pytest.approx(100 * stat["mean"])
        assert m[f"{cell}/final_accuracy_std_pct"] == pytest.approx(100 * stat["std"])
        assert m[f"{cell}/n_seeds"] == 2
    assert parent.data.params["experiment.seeds"] == "[0, 1]"
    assert parent.info.status == "FINISHED"
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id, "seed-1")}
    assert "seed-1/summary.json" in artifacts and "seed-1/results.md" in artifacts
