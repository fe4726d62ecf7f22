"""params.yaml parsing: defaults, overrides and one-line errors naming key and YAML line."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedcore.errors import ConfigError
from fedcore.options import dump
from tasks.config import load_params

REPO = Path(__file__).resolve().parents[3]


def test_repo_params_parse():
    p = load_params(REPO / "params.yaml")
    assert p.data.dataset == "fashion_mnist"
    assert p.partition.scheme == "dirichlet_classwise"
    assert dump(p.partition.options) == {"beta": 0.5, "min_size": 10}
    assert p.grid.algorithms == ("fedavg",)


def test_overrides_and_flat():
    p = load_params(
        REPO / "params.yaml", ["federation.rounds=3", "partition.dirichlet_classwise.beta=0.3"]
    )
    assert p.federation.rounds == 3 and p.partition.options.beta == 0.3
    flat = p.flat()
    assert flat["federation.rounds"] == 3 and flat["partition.dirichlet_classwise.beta"] == 0.3
    q = load_params(REPO / "params.yaml", ["partition.scheme=labels_per_client"])
    assert dump(q.partition.options) == {"m": 2}


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
        ("partition:\n  beta: 0.5\n", "params.yaml:2: unknown key 'partition.beta'; allowed: "),
        # every registry entry's options are typed by its own dataclass, with the YAML line
        ("partition:\n  iid: {}\n  gaussian_noise:\n    sigma: -1\n", "params.yaml:4: "),
        ("grid:\n  algorithm_options:\n    fedprox:\n      mu: '0.1'\n", "params.yaml:4: "),
        ("grid:\n  algorithm_options:\n    fedprx: {mu: 1}\n", "allowed: fedadagrad, "),
        ("grid:\n  algorithm_options:\n    fednilo: {K: true}\n", "fednilo.K: must be a"),
        ("grid:\n  adapters: [full, lorra]\n", "grid.adapters: unknown adapter method 'lorra'"),
        ("grid:\n  algorithms: [fedsgd]\n", "params.yaml:2: grid.algorithms: unknown algo"),
        ("model:\n  name: vit_small\n  options:\n    depth: 0\n", "params.yaml:4: model.op"),
        ("model:\n  options:\n    initt: x\n", "unknown key 'model.options.initt'; allowed: init"),
        ("model:\n  name: cnn\n", "params.yaml:2: model.name: unknown model 'cnn'; valid: "),
        # dataset names at load: a pretrain source was read only with model.base: pretrain
        ("data:\n  dataset: fmnist\n", "params.yaml:2: data.dataset: unknown dataset 'fmnist'"),
        ("pretrain:\n  dataset: imagenet\n", "params.yaml:2: pretrain.dataset: unknown dataset"),
        ("- a\n- b\n", "mapping"),
        # dvc.yaml's section (one train stage per cell): its shape, the YAML line named
        ("dvc:\n  cels: {}\n", "params.yaml:1: dvc: a mapping with one key, cells"),
        ("dvc: [a]\n", "params.yaml:1: dvc: a mapping with one key, cells"),
        (
            "dvc:\n  cells:\n    fedavg-full: {algorithm: fedavg, adapter: full}\n",
            "params.yaml:3: dvc.cells.fedavg-full: give exactly algorithm, adapter and codec",
        ),
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
        # every options table given a scalar: one line naming it, never a traceback
        ("model.options=5", "model.options: must be a mapping of cifar_cnn's options"),
        ("model.options=[1,2]", "model.options: must be a mapping"),
        ("grid.algorithm_options.fedprox=5", "grid.algorithm_options.fedprox: must be a dict"),
        ("grid.adapter_options.lora=5", "grid.adapter_options.lora: must be a dict"),
        ("grid.codec_options.int8=5", "grid.codec_options.int8: must be a valid dict"),
        ("partition.iid=5", "partition.iid"),
    ],
)
def test_bad_overrides(override, needle):
    with pytest.raises(ConfigError, match=needle):
        load_params(REPO / "params.yaml", [override])


def test_options_are_typed_objects():
    """Tasks get the registry entries' own options objects, defaults filled in; the summary
    and tracking params record the options given (with their defaults), not the empty ones."""
    p = load_params(
        REPO / "params.yaml",
        ["grid.algorithm_options={fedprox: {mu: 1}}", "grid.adapter_options={lora: {r: 4}}"],
    )
    algo = p.grid.algorithm("fedprox")
    assert algo.mu == 1.0 and isinstance(algo.mu, float)
    assert p.grid.algorithm("fedprox") is not algo  # a fresh one (server state) per cell
    assert p.grid.algorithm("fedavgm").momentum == 0.9  # not given: the defaults
    assert p.grid.adapter("lora").options.r == 4
    flat = p.flat()
    assert flat["grid.algorithm_options.fedprox.mu"] == 1.0
    assert not any(k.startswith("grid.algorithm_options.fedavgm") for k in flat)


def test_missing_params_file(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_params(tmp_path / "nope.yaml")


def test_report_baseline_is_a_grid_cell():
    from tasks.results.report import report_baseline

    grid = ["grid.algorithms=[fedprox,fedavg]", "grid.adapters=[full]"]
    assert report_baseline(load_params(REPO / "params.yaml", grid)) == "fedavg-full"
    first = load_params(REPO / "params.yaml", ["grid.algorithms=[fedprox]"])
    assert report_baseline(first) == "fedprox-full"  # no fedavg cell: the grid's first
    bad = load_params(REPO / "params.yaml", [*grid, "report.baseline=fedyogi-full"])
    with pytest.raises(ConfigError, match="report.baseline 'fedyogi-full' is not a grid cell; "):
        report_baseline(bad)


def test_params_are_typed_once():
    """params.yaml + --set become a Params in tasks/config/load.py alone; tasks and flows
    receive that object (Prefect validates a deployment's JSON into it), never a dict to
    re-validate."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    found = [
        f"{path.relative_to(root)}:{n}"
        for pkg in ("tasks", "flows", "benchmarks")
        for path in sorted((root / pkg).rglob("*.py"))
        if path != root / "tasks/config/load.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if "Params.model_validate" in line
    ]
    assert found == []


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (None, "is a directory, not a YAML file"),
        (b"\x89PNG\r\n\x1a\n\x00\xff\xfe", "is not UTF-8 text"),
        (b"", "is empty: it needs at least one section"),
        (b"# only a comment\n", "is empty"),
        (
            b"federation:\n  rounds: 3\n  rounds: 4\n",
            "params.yaml:3: malformed YAML: duplicate key",
        ),
        (b"federation:\n  rounds: 3\nfederation:\n  rounds: 4\n", "duplicate key 'federation'"),
    ],
)
def test_unreadable_params_files_are_one_line(tmp_path, content, needle):
    """A directory, a binary file, an empty file or a key given twice: one line, not the
    defaults and not a traceback (YAML itself lets the last duplicate win)."""
    f = tmp_path / "params.yaml"
    if content is None:
        f.mkdir()
    else:
        f.write_bytes(content)
    with pytest.raises(ConfigError) as exc:
        load_params(f)
    assert needle in str(exc.value) and "\n" not in str(exc.value)


def test_experiment_name_derived_when_absent(tmp_path):
    """No experiment.name (absent, null or auto): reports/<dataset>-<model>-<partition>-<grid>,
    so experiments that differ in data, model, partition or grid never share a directory;
    an explicit name is kept (params.yaml's fmnist-dir05-fedavg)."""
    from tasks.config import experiment_dir

    assert load_params(REPO / "params.yaml").experiment.name == "fmnist-dir05-fedavg"
    f = write(tmp_path, "experiment:\n  seed: 1\n")
    p = load_params(f)
    assert p.experiment.name == "fashion_mnist-cifar_cnn-dir05n10-fedavg-full"
    assert experiment_dir(p) == Path("reports/fashion_mnist-cifar_cnn-dir05n10-fedavg-full")
    assert p.flat()["experiment.name"] == p.experiment.name  # what tracking and summary see
    for override in ("experiment.name=null", "experiment.name=auto"):
        assert load_params(REPO / "params.yaml", [override]).experiment.name == p.experiment.name
    names = {
        load_params(f, overrides).experiment.name
        for overrides in (
            [],
            ["model.name=efficientnet_lite0"],
            ["data.dataset=mnist"],
            ["partition.dirichlet_classwise.beta=0.3"],
            ["partition.num_clients=4"],
            ["partition.scheme=iid"],
            ["partition.scheme=labels_per_client"],
            ["grid.algorithms=[fedavg,fedprox]"],
            ["grid.adapters=[full,lora]"],
        )
    }
    assert len(names) == 9
    grid = load_params(f, ["grid.algorithms=[fedavg,fedprox]", "grid.adapters=[head,lora]"])
    assert grid.experiment.name == "fashion_mnist-cifar_cnn-dir05n10-fedavg.fedprox-head.lora"
    assert load_params(f, ["experiment.name=mine"]).experiment.name == "mine"


def test_derived_experiment_name_is_short_and_filesystem_safe(tmp_path):
    import re

    from tasks.config import MAX_NAME

    algorithms = "[fedavg,fedprox,fednova,fedavgm,fedadagrad,fedadam,fedyogi,fedir,fedvc]"
    f = write(tmp_path, "experiment:\n  seed: 0\n")
    a = load_params(f, [f"grid.algorithms={algorithms}", "grid.adapters=[full,head,lora]"])
    b = load_params(f, [f"grid.algorithms={algorithms}", "grid.adapters=[full,head,bn_head]"])
    for name in (a.experiment.name, b.experiment.name):
        assert len(name) <= MAX_NAME and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name)
    assert a.experiment.name != b.experiment.name  # cut, but told apart by the digest
    q = load_params(f, ["partition.scheme=quantity_normal"])
    assert q.experiment.name == "fashion_mnist-cifar_cnn-qn03n10-fedavg-full"


def test_stop_after_is_within_the_rounds_and_absent_from_params_unless_set():
    with pytest.raises(ConfigError, match=r"federation: stop_after must be <= rounds \(\d+\)"):
        load_params(None, ["federation.stop_after=99"])
    assert "federation.stop_after" not in load_params(None, []).flat()  # records stay current
    assert load_params(None, ["federation.stop_after=2"]).flat()["federation.stop_after"] == 2
