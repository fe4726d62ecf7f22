"""Bad input gets one clear line and nothing lost: a non-zero exit, no traceback, the key or
path named, no new file under the outputs, and no silent fallback to data nobody asked for.
The CLI runs in this process (typer's CliRunner); each case stops in preflight."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import fedcore.datasets as ds
from fedcore.errors import ConfigError, DataUnavailableError
from fedcore.manifest import read_manifest
from flows.cli import app

REPO = Path(__file__).resolve().parents[1]
runner = CliRunner()
SMALL = ["--set", "data.train_subset=1200", "--set", "data.test_subset=500"]
LOCAL = ["--set", "storage.bucket=null", "--set", "runtime.tracking=false"]


def invoke(tmp_path: Path, command: str, *args: str, root: Path | None = None):
    """``fedapt <command>`` with outputs under tmp_path/reports; ``args`` come last (a later
    --set wins)."""
    reports = ["--set", f"experiment.reports_dir={tmp_path / 'reports'}"]
    data = ["--set", f"data.root={root or REPO / 'data/raw'}"]
    params = ["--params", str(REPO / "params.yaml")]
    return runner.invoke(app, [command, *LOCAL, *SMALL, *params, *data, *reports, *args])


def assert_one_clear_line(res, needle: str, outputs: Path) -> None:
    text = res.output.strip()
    assert res.exit_code != 0, text
    assert "Traceback" not in text, text
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert needle in text, text
    assert "fedapt: error: " in text, text
    assert not outputs.exists() or not any(p.is_file() for p in outputs.rglob("*")), text


# ---- inputs: params values and options -------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--workers", "-1"], "runtime.workers"),
        (["--set", "runtime.workers=-1"], "auto or a number of worker processes >= 0"),
        (["--set", "runtime.dask_workers=0"], "runtime.dask_workers"),
        (["--set", "runtime.cohort_size=0"], "runtime.cohort_size"),
        (["--set", "data.test_subset=20000"], "data.test_subset: 20000 rows asked"),
        (["--set", "data.train_subset=70000"], "train split of fashion_mnist has 60000"),
        # error text is plain text, never Rich markup: printed as is, no crash
        (["--set", "data.dataset=a[/x]"], "unknown dataset 'a[/x]'"),
        (["--set", "data.dataset=x[full]"], "unknown dataset 'x[full]'"),
        (["--set", "data.download=maybe"], "data.download"),
        (["--set", "experiment.name=../x"], "experiment.name"),
    ],
)
def test_bad_params_values(tmp_path, args, needle):
    res = invoke(tmp_path, "run", *args)
    assert_one_clear_line(res, needle, tmp_path / "reports")


# ---- files: data.root, outputs, --partition ---------------------------------------------------


@pytest.fixture(scope="module")
def partition_dir(tmp_path_factory) -> Path:
    """A real partition of 1200 train rows (fedapt partition), copied by the cases below."""
    out = tmp_path_factory.mktemp("partition") / "p"
    res = invoke(out.parent, "partition", "--out", str(out))
    assert res.exit_code == 0, res.output
    return out


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _edit_manifest(d: Path, row: int, col: int, value: str) -> None:
    path = d / "manifest.csv"
    lines = path.read_text().splitlines()
    cells = lines[row - 1].split(",")
    cells[col] = value
    lines[row - 1] = ",".join(cells)
    path.write_text("\n".join(lines) + "\n")


def _file_case(name: str, tmp_path: Path, part: Path) -> tuple[list[str], Path | None, str]:
    """(args, data.root or None, needle) of one bad-file case."""
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder\n")
    if name == "root-missing":
        return [], tmp_path / "dta/raw", f"no FashionMNIST files under {tmp_path / 'dta/raw'}"
    if name == "root-is-file":
        return [], a_file, f"data.root: {a_file} is a file"
    if name == "root-corrupt":
        raw = tmp_path / "root/FashionMNIST/raw"
        raw.mkdir(parents=True)
        (raw / "train-images-idx3-ubyte").write_bytes(b"\x00garbage")
        return [], tmp_path / "root", f"{raw} are incomplete or corrupt"
    if name == "reports-under-file":
        reports = ["--set", f"experiment.reports_dir={a_file}/reports"]
        return reports, None, f"experiment.reports_dir: {a_file} is a file"
    if name == "partition-is-file":
        return ["--partition", str(a_file)], None, f"no partition in {a_file}"
    if name == "partition-out-is-file":
        return ["--out", str(a_file / "p")], None, f"--out: {a_file} is a file"
    d = _copy(part, tmp_path / "part")
    args = ["--partition", str(d)]
    if name == "partition-other-subset":
        return [*args, "--set", "data.train_subset=1000"], None, "train_subset 1200 (now 1000)"
    if name == "partition-other-seed":
        return [*args, "--set", "experiment.seed=1"], None, "seed 0 (now 1)"
    if name == "partition-legacy-other-rows":  # written before stats.json kept the selection
        stats = json.loads((d / "stats.json").read_text())
        del stats["data_selection"]
        (d / "stats.json").write_text(json.dumps(stats))
        return (
            [*args, "--set", "data.train_subset=1000"],
            None,
            "outside the current data selection",
        )
    if name == "manifest-index-out-of-range":
        _edit_manifest(d, 2, 1, "60000")
        return args, None, "manifest.csv: row 2, column sample_index: 60000 is out of range"
    if name == "manifest-not-integer":
        _edit_manifest(d, 5, 0, "x1")
        return args, None, "manifest.csv: row 5, column client_id: 'x1' is not an integer"
    if name == "manifest-wrong-label":
        path = d / "manifest.csv"
        c, i, y = path.read_text().splitlines()[1].split(",")
        _edit_manifest(d, 2, 2, str((int(y) + 1) % 10))
        return args, None, "manifest.csv: row 2, column label"
    if name == "stats-not-json":
        (d / "stats.json").write_text("{not json")
        return args, None, f"{d / 'stats.json'}: unreadable"
    raise AssertionError(name)


@pytest.mark.parametrize(
    "name",
    [
        "root-missing",
        "root-is-file",
        "root-corrupt",
        "reports-under-file",
        "partition-is-file",
        "partition-out-is-file",
        "partition-other-subset",
        "partition-other-seed",
        "partition-legacy-other-rows",
        "manifest-index-out-of-range",
        "manifest-not-integer",
        "manifest-wrong-label",
        "stats-not-json",
    ],
)
def test_bad_files(tmp_path, partition_dir, name):
    args, root, needle = _file_case(name, tmp_path, partition_dir)
    command = "partition" if "--out" in args else "run"
    res = invoke(tmp_path, command, *args, root=root)
    assert_one_clear_line(res, needle, tmp_path / "reports")


# ---- environment ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["sqlite-under-file", "sqlite-is-folder"])
def test_bad_environment(tmp_path, monkeypatch, name):
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    if name == "sqlite-under-file":
        uri, needle = f"sqlite:///{a_file}/x.db", f"MLFLOW_TRACKING_URI: {a_file} is a file"
    else:
        uri = f"sqlite:///{tmp_path}"
        needle = f"MLFLOW_TRACKING_URI: {uri}: {tmp_path} is a folder"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    res = invoke(tmp_path, "run", "--set", "runtime.tracking=true")
    assert_one_clear_line(res, needle, tmp_path / "reports")


# ---- units: the manifest reader and the data.root rule ---------------------------------------


def test_read_manifest_names_file_row_and_column(tmp_path):
    path = tmp_path / "manifest.csv"
    path.write_text("client_id,sample_index,label\n0,3,1\n0,7,2\n")
    cid, idx, y = read_manifest(path, num_samples=8, labels=np.array([0, 0, 0, 1, 0, 0, 0, 2]))
    assert cid.tolist() == [0, 0] and idx.tolist() == [3, 7] and y.tolist() == [1, 2]
    with pytest.raises(ConfigError, match=r"row 3, column sample_index: 7 is out of range"):
        read_manifest(path, num_samples=7)
    path.write_text("client_id,sample_index,label\n0,3,1\n0,-7,2\n")
    with pytest.raises(ConfigError, match=r"row 3, column sample_index: '-7' is not an integer"):
        read_manifest(path)
    path.write_text("client_id,sample_index,label\n0,3\n")
    with pytest.raises(ConfigError, match=r"row 2 has 2 cells, expected 3"):
        read_manifest(path)


def test_embedded_copy_only_for_the_default_root(tmp_path, monkeypatch):
    """An empty default root reads the Debian copy and says so; any other root never does."""
    if not (ds.DEBIAN_FASHION_MNIST / "t10k-labels-idx1-ubyte.gz").is_file():
        pytest.skip("the Debian package dataset-fashion-mnist is not installed")
    monkeypatch.setattr(ds, "DEFAULT_ROOT", tmp_path / "data/raw")
    got = ds.load_dataset("fashion_mnist", tmp_path / "data/raw", "test", download=False)
    assert len(got) == 10000 and "t10k-" in got.source and "embedded" in got.source
    with pytest.raises(DataUnavailableError, match="data.root: no FashionMNIST files under"):
        ds.load_dataset("fashion_mnist", tmp_path / "other", "test", download=False)


def test_guard_prints_plain_text_and_names_the_path_of_an_os_error(capsys):
    """Error text is never Rich markup; an OSError at the edges is one line with its path."""
    import typer

    from flows.cli.common import guard

    def fail(exc: BaseException):
        def body():
            raise exc

        return body

    for exc, needle in (
        (ConfigError("value a[/x] and [full] here"), "value a[/x] and [full] here"),
        (NotADirectoryError(20, "Not a directory", "/tmp/a-file/out"), "/tmp/a-file/out: Not a"),
        (PermissionError(13, "Permission denied", "/root/x"), "/root/x: Permission denied"),
    ):
        with pytest.raises(typer.Exit) as code:
            guard(fail(exc))
        err = capsys.readouterr().err
        assert code.value.exit_code == 2 and needle in err and "Traceback" not in err, err
        assert err.startswith("fedapt: error: ") and len(err.strip().splitlines()) == 1, err
