"""params.yaml parsing: defaults, overrides and one-line errors naming key and YAML line."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedcore.errors import ConfigError
from tasks.config import load_params

REPO = Path(__file__).resolve().parents[1]


def test_repo_params_parse():
    p = load_params(REPO / "params.yaml")
    assert p.data.dataset == "fashion_mnist"
    assert p.partition.scheme == "dirichlet_classwise" and p.partition.options == {
        "beta": 0.5,
        "min_size": 10,
    }
    assert p.grid.algorithms == ("fedavg",)


def test_overrides_and_flat():
    p = load_params(
        REPO / "params.yaml", ["federation.rounds=3", "partition.dirichlet_classwise.beta=0.3"]
    )
    assert p.federation.rounds == 3 and p.partition.options["beta"] == 0.3
    flat = p.flat()
    assert flat["federation.rounds"] == 3 and flat["partition.dirichlet_classwise.beta"] == 0.3
    q = load_params(REPO / "params.yaml", ["partition.scheme=labels_per_client"])
    assert q.partition.options == {"m": 2}


def write(tmp_path, text):
    f = tmp_path / "params.yaml"
    f.write_text(text)
    return f


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("federation:\n  rounds: 0\n", "params.yaml:2: federation.rounds"),
        (
            "client:\n  lr: 0.1\n  momentum: 0.9\n  lr_decay: 3\n",
            "params.yaml:4: unknown key 'client.lr_decay'",
        ),
        ("federation:\n  participation: 1.5\n", "federation.participation"),
        ("client:\n  lr: -0.1\n", "client.lr"),
        ("federation:\n  rounds: [\n", "malformed YAML"),
        ("bogus: 1\n", "unknown key 'bogus'"),
        ("partition:\n  beta: 0.5\n", "partition.beta must be a mapping"),
        ("- a\n- b\n", "mapping"),
    ],
)
def test_bad_params_one_line(tmp_path, text, needle):
    with pytest.raises(ConfigError) as exc:
        load_params(write(tmp_path, text))
    msg = str(exc.value)
    assert needle in msg and "\n" not in msg


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("federation.roundz=3", "unknown key 'federation.roundz'; allowed: rounds"),
        ("nothing=1", "unknown key 'nothing'"),
        ("novalue", "key=value"),
        ("federation.sampling=sometimes", "federation.sampling"),
        ("report.accuracy_levels=[0.5,80]", "report.accuracy_levels"),
        ("runtime.engine=vectorised", "runtime.engine.*'auto', 'cohort' or 'sequential'"),
        ("runtime.cohort_size=0", "runtime.cohort_size"),
    ],
)
def test_bad_overrides(override, needle):
    with pytest.raises(ConfigError, match=needle):
        load_params(REPO / "params.yaml", [override])


def test_missing_params_file(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_params(tmp_path / "nope.yaml")


def test_report_baseline_is_a_grid_cell():
    from tasks.report import report_baseline

    grid = ["grid.algorithms=[fedprox,fedavg]", "grid.adapters=[full]"]
    assert report_baseline(load_params(REPO / "params.yaml", grid)) == "fedavg-full"
    first = load_params(REPO / "params.yaml", ["grid.algorithms=[fedprox]"])
    assert report_baseline(first) == "fedprox-full"  # no fedavg cell: the grid's first
    bad = load_params(REPO / "params.yaml", [*grid, "report.baseline=fedyogi-full"])
    with pytest.raises(ConfigError, match="report.baseline 'fedyogi-full' is not a grid cell; "):
        report_baseline(bad)


def test_params_are_typed_once():
    """params.yaml + --set become a Params in tasks/config.py alone; tasks and flows receive
    that object (Prefect validates a deployment's JSON into it), never a dict to re-validate."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    found = [
        f"{path.relative_to(root)}:{n}"
        for pkg in ("tasks", "flows", "benchmarks")
        for path in sorted((root / pkg).rglob("*.py"))
        if path != root / "tasks/config.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if "Params.model_validate" in line
    ]
    assert found == []
