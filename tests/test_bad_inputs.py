"""Bad input gets one clear line and nothing lost: a non-zero exit, no traceback, the key or
path named, no new file under the outputs, and no silent fallback to data nobody asked for.
The CLI runs in this process (typer's CliRunner); each case stops in preflight."""

from __future__ import annotations

import errno
import importlib.util
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
    assert text.splitlines()[-1].startswith("fedapt: error: "), text  # the last thing printed
    assert not outputs.exists() or not any(p.is_file() for p in outputs.rglob("*")), text


# ---- inputs: params values and options -------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--workers", "-1"], "runtime.workers"),
        (["--set", "runtime.workers=-1"], "auto or a number of worker processes in [0, 1024]"),
        (["--set", "runtime.dask_workers=0"], "runtime.dask_workers"),
        (["--set", "runtime.cohort_size=0"], "runtime.cohort_size"),
        (["--set", "data.test_subset=20000"], "data.test_subset: 20000 rows asked"),
        (["--set", "data.train_subset=70000"], "train split of fashion_mnist has 60000"),
        # error text is plain text, never Rich markup: printed as is, no crash
        (["--set", "data.dataset=a[/x]"], "unknown dataset 'a[/x]'"),
        (["--set", "data.dataset=x[full]"], "unknown dataset 'x[full]'"),
        (["--set", "data.download=maybe"], "data.download"),
        (["--set", "experiment.name=../x"], "experiment.name"),
        # floats are finite, in the sections and in every registry entry's options
        (["--set", "client.lr=.inf"], "client.lr: must be a finite number"),
        (["--set", "client.lr=.nan"], "client.lr: must be a finite number"),
        (["--set", "federation.participation=-.inf"], "federation.participation: must be a"),
        (["--set", "grid.adapter_options.lora.alpha=.inf"], "lora.alpha: must be a finite"),
        # empty and repeated lists
        (["--set", "grid.algorithms=[]"], "grid.algorithms: name at least one algorithm; allowed"),
        (["--set", "grid.adapters=[]"], "grid.adapters: name at least one adapter method"),
        (["--set", "grid.algorithms=[fedavg,fedprox,fedavg]"], "names fedavg more than once"),
        (["--set", "grid.adapters=[lora,lora]"], "grid.adapters: names lora more than once"),
        (["--set", "experiment.seeds=[1,1]"], "experiment.seeds: must be a list of distinct"),
        # numbers past int64 (or past a documented bound), refused at parse time
        (["--set", f"experiment.seed={2**64}"], "experiment.seed: must be less than or equal"),
        (["--set", f"experiment.seeds=[0,{2**40}]"], "seeds >= 0 (at most 4294967295)"),
        (["--set", "federation.rounds=10000000000"], "federation.rounds: must be less than or"),
        (["--set", f"client.batch_size={2**63}"], "client.batch_size: must be an integer in"),
        (["--set", f"grid.adapter_options.lora.r={2**64}"], "lora.r: must be less than or"),
        (["--set", "runtime.workers=100000"], "runtime.workers: workers is auto or a number of"),
        (["--set", "runtime.dask_workers=100000"], "runtime.dask_workers: must be less than or"),
        # GPUs on Ray (issue 31): a request the local Ray cannot meet, before anything runs
        (["--set", "runtime.ray_gpus=-1"], "runtime.ray_gpus: ray_gpus is auto or a number"),
        (
            ["--set", "runtime.task_runner=ray", "--set", "runtime.ray_gpus=1"],
            "runtime.ray_gpus: 1 GPU per cell asked, but no node of the local Ray has any",
        ),
        # clients on Ray actors (issue 32): before anything runs
        (["--set", "runtime.ray_actors=0"], "runtime.ray_actors: ray_actors is auto or a number"),
        (["--set", "runtime.ray_actor_gpus=-1"], "runtime.ray_actor_gpus: ray_actor_gpus is auto"),
        (
            ["--set", "runtime.clients=ray", "--set", "runtime.ray_address=127.0.0.1:1"],
            "runtime.ray_address: nothing answers at 127.0.0.1:1 (",
        ),
        (
            ["--set", "runtime.clients=ray", "--set", "runtime.device=cpu"]
            + ["--set", "runtime.ray_actor_gpus=1"],
            "runtime.ray_actor_gpus: 1 GPU per client actor asked, but no node of the local Ray "
            "has any",
        ),
        # tuning (issue 29): a validation split to evaluate on, cells of the grid
        (["--set", "data.evaluate=validation"], "data.evaluate: validation needs a validation "),
        (["--set", "data.validation=0.5"], "data.validation: must be less than 0.5 (got 0.5)"),
        (
            ["--set", "grid.client_lr={fedavg-lora: 0.01}"],
            "grid.client_lr: 'fedavg-lora' is not a cell of the grid (<algorithm>-<adapter>); "
            "cells: fedavg-full",
        ),
        (["--set", "grid.client_lr={fedavg-full: -1}"], "grid.client_lr.fedavg-full: must be"),
        # update codecs (issue 33): one line naming the key and the allowed values
        (
            ["--set", "grid.codecs=[zip]"],
            "grid.codecs: unknown codec 'zip'; allowed: none, fp16, bf16, int8, int4, topk",
        ),
        (
            ["--set", "grid.codec_options={int8: {bits: 3}}"],
            "grid.codec_options: int8.bits: 3 is not supported; allowed: 2, 4, 8",
        ),
        (["--set", "grid.codec_options={topk: {k: 0}}"], "topk.k: 0 must be a whole number"),
        (["--set", "grid.codec_options={topk: {fraction: 2}}"], "topk.fraction: 2 must be in"),
        (
            ["--set", "grid.codec_options={topk: {directions: [upload, download]}}"],
            "topk.directions: topk cannot serve download",
        ),
        (
            ["--set", "grid.codecs=[topk]", "--set", "grid.codec_options={topk: {k: 100000}}"],
            "codec topk: k 100000 is above the size of a tensor it encodes",
        ),
        (["--set", "grid.codecs=[none,none]"], "grid.codecs: names none more than once"),
        # the sweep of issue 45: keys with empty parts were read as the key without them
        (["--set", "federation..rounds=5"], "--set federation..rounds: an empty key between"),
        (["--set", ".federation.rounds=5"], "--set .federation.rounds: an empty key between"),
        (["--set", "federation.rounds.=5"], "--set federation.rounds.: an empty key between"),
        # a section given a value: what it must be, not pydantic's class name
        (["--set", "federation=5"], "federation: must be a mapping of its keys (key: value)"),
        (["--set", "report=[1]"], "report: must be a mapping of its keys (key: value) (got"),
    ],
)
def test_bad_params_values(tmp_path, args, needle):
    res = invoke(tmp_path, "run", *args)
    assert_one_clear_line(res, needle, tmp_path / "reports")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--num-classes", "0"], "--num-classes: must be in [2, 1000000] (got 0)"),
        (["--num-classes", str(2**64)], f"--num-classes: must be in [2, 1000000] (got {2**64})"),
        (["--input-shape", f"3,{2**40},{2**40}"], "--input-shape: C in [1, 64] and H = W in"),
        (["--input-shape", "0,32,32"], "--input-shape: C in [1, 64]"),
    ],
)
def test_bad_model_shapes(args, needle):
    res = runner.invoke(app, ["models", "-m", "cifar_cnn", *args])
    assert_one_clear_line(res, needle, REPO / "no-outputs")


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
    if name == "partition-other-validation":  # its shards hold the validation rows now asked for
        return [*args, "--set", "data.validation=0.1"], None, "validation 0.0 (now 0.1)"
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
    if name == "manifest-index-past-int64":
        _edit_manifest(d, 3, 1, str(2**64))
        return args, None, f"manifest.csv: row 3, column sample_index: {2**64} is too large"
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
        "partition-other-validation",
        "partition-legacy-other-rows",
        "manifest-index-out-of-range",
        "manifest-index-past-int64",
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


@pytest.mark.parametrize("folders", [[], ["fedavg-full-none"], ["fedavg-lora"]])
def test_report_of_a_grid_cell_without_its_folder(tmp_path, folders):
    """The DVC report stage reads artifacts/runs/<cell>: a cell no train stage wrote (a
    folder of the old name, fedavg-full-none, included) is one line naming params.yaml's
    dvc.cells, and no report is written."""
    runs = tmp_path / "runs"
    for name in folders:
        (runs / name).mkdir(parents=True)
        shutil.copy(REPO / "artifacts/runs/fedavg-full/metrics.json", runs / name)
    res = runner.invoke(
        app,
        ["report", "--params", str(REPO / "params.yaml"), "--runs", str(runs)]
        + ["--out", str(tmp_path / "report"), "--timing", str(tmp_path / "timing")],
    )
    needle = "no metrics for grid cell fedavg-full: "
    assert_one_clear_line(res, needle, tmp_path / "report")
    assert "list it under dvc.cells in params.yaml" in res.output


@pytest.mark.parametrize("option", ["--out", "--timing"])
def test_stage_outputs_below_a_file_stop_before_training(tmp_path, partition_dir, option):
    """A DVC stage's output folder below a file: one line before training, not after it."""
    part = _copy(partition_dir, tmp_path / "part")
    assert invoke(tmp_path, "validate", "--partition", str(part)).exit_code == 0
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    args = ["--algorithm", "fedavg", "--partition", str(part), option, str(a_file / "cell")]
    res = invoke(tmp_path, "train", *args)
    assert_one_clear_line(res, f"{option}: {a_file} is a file", tmp_path / "reports")


# ---- environment ------------------------------------------------------------------------------


_S3_VARS = ("AWS_ENDPOINT_URL", "MLFLOW_S3_ENDPOINT_URL", "AWS_PROFILE", "AWS_DEFAULT_REGION")
_ALLOWED_STORES = "allowed: sqlite:///PATH/mlflow.db, http(s)://HOST:PORT"


def _environment_case(name: str, tmp_path: Path) -> tuple[dict[str, str], list[str], str]:
    """(environment, args, needle) of one bad-environment case."""
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    track, s3 = ["--set", "runtime.tracking=true"], ["--set", "storage.bucket=fedapt"]
    keys = {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"}
    if name == "sqlite-under-file":
        uri = f"sqlite:///{a_file}/x.db"
        return {"MLFLOW_TRACKING_URI": uri}, track, f"MLFLOW_TRACKING_URI: {a_file} is a file"
    if name == "sqlite-is-folder":
        uri = f"sqlite:///{tmp_path}"
        return {"MLFLOW_TRACKING_URI": uri}, track, f"{uri}: {tmp_path} is a folder"
    if name == "sqlite-not-a-database":
        uri = f"sqlite:///{a_file}"
        return {"MLFLOW_TRACKING_URI": uri}, track, f"{a_file} is not an SQLite database"
    if name == "bare-path":
        uri = str(tmp_path / "mlruns")
        return {"MLFLOW_TRACKING_URI": uri}, track, f"{uri}: MLflow 3 no longer runs a file store"
    if name == "file-store":
        uri = (tmp_path / "mlruns").as_uri()
        return {"MLFLOW_TRACKING_URI": uri}, track, _ALLOWED_STORES
    if name == "postgresql-without-driver":
        pytest.importorskip("sqlalchemy")
        if importlib.util.find_spec("psycopg2") is not None:
            pytest.skip("psycopg2 is installed")
        uri = "postgresql://fed:secret@127.0.0.1:1/mlflow"
        return {"MLFLOW_TRACKING_URI": uri}, track, "database driver psycopg2 is not installed"
    if name == "unknown-scheme":
        return {"MLFLOW_TRACKING_URI": "ftp://h/x"}, track, "unsupported scheme 'ftp'; allowed"
    if name == "password-in-uri":  # masked in the line (and never printed in clear)
        uri = "http://fed:secret@127.0.0.1:1"
        return {"MLFLOW_TRACKING_URI": uri}, track, "http://fed:***@127.0.0.1:1 is not reachable"
    if name == "endpoint-without-scheme":
        env = {"AWS_ENDPOINT_URL": "127.0.0.1:8333", **keys}
        return env, s3, "AWS_ENDPOINT_URL: 127.0.0.1:8333 is not an S3 endpoint URL"
    if name == "unknown-profile":
        env = {"AWS_PROFILE": "no-such-profile", "AWS_CONFIG_FILE": str(tmp_path / "cfg")}
        return env, s3, "AWS_PROFILE: unknown profile 'no-such-profile'; known: none"
    if name == "bad-region":
        env = {"AWS_ENDPOINT_URL": "http://127.0.0.1:1", "AWS_DEFAULT_REGION": "a b", **keys}
        return env, s3, "AWS_DEFAULT_REGION: 'a b' is not a region name"
    if name == "prefect-unreachable":
        url = "http://fed:secret@127.0.0.1:1/api"
        return {"PREFECT_API_URL": url}, [], "PREFECT_API_URL: http://fed:***@127.0.0.1:1/api is"
    if name == "prefect-not-a-url":
        return {"PREFECT_API_URL": "127.0.0.1:4200"}, [], "PREFECT_API_URL: 127.0.0.1:4200 is not"
    if name == "ray-auth-disabled":  # a run's own Ray always asks for the token
        env, ray = {"RAY_AUTH_MODE": "disabled"}, ["--set", "runtime.clients=ray"]
        return env, ray, "RAY_AUTH_MODE: 'disabled' is not token: the run's own local Ray"
    if name == "ray-auth-unknown":
        env, ray = {"RAY_AUTH_MODE": "none"}, ["--set", "runtime.task_runner=ray"]
        return env, ray, "unset RAY_AUTH_MODE or set it to token"
    if name == "numerics":
        return {"FEDAPT_NUMERICS": "fast"}, [], "FEDAPT_NUMERICS: 'fast' is not one of portable"
    if name.endswith("-empty"):  # the sweep of issue 45: set but empty was taken as unset
        var = {
            "state-dir-empty": "FEDAPT_STATE_DIR",
            "prefect-home-empty": "PREFECT_HOME",  # (Prefect wrote its database into ./)
            "mlflow-config-empty": "FEDAPT_MLFLOW_CONFIG",
        }[name]
        return {var: ""}, [], f"{var} is set but empty (''); allowed: a "
    if name == "tracking-blank":
        return {"MLFLOW_TRACKING_URI": "  "}, track, "MLFLOW_TRACKING_URI: '  ' is blank; allowed"
    if name.startswith("service-grace-"):  # checked before anything starts
        value = {"zero": "0", "text": "3s", "too-long": "3600"}[name.removeprefix("service-grace-")]
        return (
            {"FEDAPT_SERVICE_GRACE": value},
            [],
            (f"FEDAPT_SERVICE_GRACE={value!r} is not a number of seconds in (0, 600]"),
        )
    raise AssertionError(name)


@pytest.mark.parametrize(
    "name",
    [
        "sqlite-under-file",
        "sqlite-is-folder",
        "sqlite-not-a-database",
        "bare-path",
        "file-store",
        "postgresql-without-driver",
        "unknown-scheme",
        "password-in-uri",
        "endpoint-without-scheme",
        "unknown-profile",
        "bad-region",
        "prefect-unreachable",
        "prefect-not-a-url",
        "ray-auth-disabled",
        "ray-auth-unknown",
        "numerics",
        "service-grace-zero",
        "service-grace-text",
        "service-grace-too-long",
        "state-dir-empty",
        "prefect-home-empty",
        "mlflow-config-empty",
        "tracking-blank",
    ],
)
def test_bad_environment(tmp_path, monkeypatch, name):
    env, args, needle = _environment_case(name, tmp_path)
    for var in (*_S3_VARS, "RAY_ADDRESS"):
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    res = invoke(tmp_path, "run", *args)
    assert_one_clear_line(res, needle, tmp_path / "reports")
    assert "secret" not in res.output, res.output
    assert not (REPO / "prefect.db").exists()  # (an empty PREFECT_HOME: the current folder)


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

    from flows.cli.guards import guard

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


def test_tracking_server_refusing_the_credentials_is_one_line(tmp_path, monkeypatch):
    """A server that answers /health but refuses the API (authentication on, wrong or no
    password): one line before any work, the password masked. The server is a stand-in
    that answers as MLflow's basic-auth app does (401 on every API call)."""
    import http.server
    import threading

    seen: list[str] = []

    class Refusing(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("Authorization", ""))
            ok = self.path == "/health"
            self.send_response(200 if ok else 401)
            self.end_headers()
            self.wfile.write(b"OK" if ok else b"You are not authenticated.")

        do_POST = do_GET

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refusing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        uri = f"http://fed:secret@127.0.0.1:{server.server_port}"
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        res = invoke(tmp_path, "run", "--set", "runtime.tracking=true")
    finally:
        server.shutdown()
        server.server_close()
    needle = f"http://fed:***@127.0.0.1:{server.server_port} refused the request (UNAUTH"
    assert_one_clear_line(res, needle, tmp_path / "reports")
    assert "secret" not in res.output, res.output
    assert seen[0] == "Basic ZmVkOnNlY3JldA==", seen  # /health asked with the URI's user


# ---- faults: a full disk, credentials ---------------------------------------------------------


@pytest.mark.parametrize("writer", ["checkpoint", "manifest"])
def test_full_disk_is_one_line_and_leaves_no_partial_file(tmp_path, monkeypatch, capsys, writer):
    """ENOSPC while an output is written (a checkpoint after minutes of training, a manifest):
    one line naming the file, exit 2, neither the file nor its temp file left behind."""
    import os

    import typer

    from fedcore.manifest import _atomic_write_text
    from flows.cli.guards import guard
    from tasks.io import atomic_write_bytes

    real_fdopen = os.fdopen

    class Full:
        def __init__(self, fh):
            self.fh = fh

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.fh.close()

        def write(self, data):
            self.fh.write(data[:10])  # a part reached the disk, then it was full
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fdopen", lambda fd, *a, **k: Full(real_fdopen(fd, *a, **k)))
    target = tmp_path / "out" / ("fedavg-full.pt" if writer == "checkpoint" else "manifest.csv")
    target.parent.mkdir()

    def body() -> None:
        if writer == "checkpoint":  # tasks/checkpoint.py writes through atomic_write_bytes
            atomic_write_bytes(target, b"x" * 4096)
        else:
            _atomic_write_text(target, "client_id,sample_index,label\n" * 100)

    with pytest.raises(typer.Exit) as code:
        guard(body)
    err = capsys.readouterr().err
    assert code.value.exit_code == 2 and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1 and err.startswith("fedapt: error: "), err
    assert f"{target}: No space left on device; free some space" in err, err
    assert list(target.parent.iterdir()) == [], "a partial output or temp file was left"


@pytest.mark.parametrize("case", ["partition", "state-dir", "no-file-named"])
def test_full_disk_names_the_setting_whose_folder_filled(tmp_path, monkeypatch, capsys, case):
    """ENOSPC at a file under a setting's folder: the line names the setting, its value and
    the file, and says to free space; exit 2, no traceback, nothing left (issue 45: it named
    the file only). An OSError of a write that names no file: the settings' folders."""
    import os

    import typer

    from flows import settings
    from flows.cli.guards import guard

    real_fdopen = os.fdopen

    def full(fd, *args, **kwargs):
        real_fdopen(fd, *args, **kwargs).close()
        raise OSError(errno.ENOSPC, "No space left on device")

    reports = tmp_path / "reports"
    if case == "partition":  # `fedapt partition` writes manifest.csv atomically (os.fdopen)
        monkeypatch.setattr(os, "fdopen", full)
        res = invoke(tmp_path, "partition")
        manifest = reports / "fmnist-dir05-fedavg" / "partition" / "manifest.csv"
        needle = (
            f"experiment.reports_dir: {reports}: No space left on device at "
            f"{settings.shorten(str(manifest))}; "
            "free some space there (or raise the quota) and run again"
        )
        assert_one_clear_line(res, needle, reports)
        return
    state = tmp_path / "state"
    settings.forget()
    settings.setting_path("FEDAPT_STATE_DIR", str(state), state, "a folder")
    settings.setting_path("experiment.reports_dir", str(reports), reports / "exp", "a folder")

    def body() -> None:
        if case == "state-dir":
            raise OSError(errno.ENOSPC, "No space left on device", str(state / "logs/x.log"))
        raise OSError(errno.EDQUOT, "Disk quota exceeded")  # a write() names no file

    try:
        with pytest.raises(typer.Exit) as code:
            guard(body)
    finally:
        settings.forget()
    err = capsys.readouterr().err
    assert code.value.exit_code == 2 and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1 and err.startswith("fedapt: error: "), err
    if case == "state-dir":
        assert err.strip() == (
            f"fedapt: error: FEDAPT_STATE_DIR: {state}: No space left on device at "
            f"{state / 'logs/x.log'}; free some space there (or raise the quota) and run again"
        )
    else:
        assert err.strip() == (
            "fedapt: error: Disk quota exceeded; free some space (or raise the quota) on the "
            f"disk of FEDAPT_STATE_DIR ({state}), experiment.reports_dir ({reports / 'exp'}), "
            "then run again"
        )


def test_credentials_are_masked_wherever_printed_or_stored(monkeypatch, caplog):
    """user:password@ -> user:***@ in the error line, the lines after a run, Prefect's log
    records (console and API) and the MLflow links of the Prefect results artifact."""
    import logging

    from fedcore.errors import mask_credentials
    from flows.cli import logs
    from flows.cli.experiment import _where_results
    from tasks import artifacts, tracking
    from tasks.config import load_params
    from tasks.data import load_experiment_data

    assert (
        mask_credentials("at http://u:p@h:5000/x and s3://b/k")
        == "at http://u:***@h:5000/x and s3://b/k"
    )
    assert (
        mask_credentials("postgresql+psycopg2://u:p%40w@h/db") == "postgresql+psycopg2://u:***@h/db"
    )
    assert mask_credentials("sqlite:///a/b.db http://h:1") == "sqlite:///a/b.db http://h:1"

    uri = "https://fed:secret@mlflow.example:5000"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    p = load_params(REPO / "params.yaml", ["storage.bucket=null"])
    lines = _where_results(p, load_experiment_data(p), [])  # (no cell tracked: no table)
    assert "MLflow: https://fed:***@mlflow.example:5000" in lines, lines

    class Run:  # a unit test: the MLflow client is a stand-in
        class info:  # noqa: N801
            experiment_id = "7"

    class Client:
        def get_run(self, run_id):
            return Run()

    monkeypatch.setattr(tracking, "client", Client)
    links = artifacts.run_links([{"algorithm": "fedavg", "adapter": "full", "mlflow_run_id": "r"}])
    assert links == {
        "fedavg-full": "https://fed:***@mlflow.example:5000/#/experiments/7/runs/r"
        "?workflowType=machine_learning"
    }

    ray = load_params(REPO / "params.yaml", ["runtime.ray_address=ray://fed:secret@h:10001"])
    assert ray.flat()["runtime.ray_address"] == "ray://fed:***@h:10001"  # MLflow params, summary

    record = logging.LogRecord(
        "prefect.flow_runs", logging.ERROR, __file__, 1, "failed: %s", (uri,), None
    )
    assert logs.NoTracebackForFedaptErrors().filter(record)
    assert record.getMessage() == "failed: https://fed:***@mlflow.example:5000"


@pytest.mark.slow
def test_a_given_partition_is_never_written_and_the_error_line_is_last(tmp_path, partition_dir):
    """``fedapt run --partition DIR`` never writes into DIR; shards the flow's validation
    would refuse (too small for validation.min_shard_size) are refused before the flow, in
    one line naming DIR's stats.json and the client, with no report and no other file
    written (issue 45: before, the validation task refused them inside the flow, after
    writing validation.json). A real process."""
    import os
    import subprocess
    import sys

    part = _copy(partition_dir, tmp_path / "part")
    before = {p.name: p.stat().st_mtime_ns for p in part.iterdir()}
    part.chmod(0o555)
    reports = tmp_path / "reports"
    cmd = [
        sys.executable, "-m", "flows.cli", "run", *LOCAL, *SMALL,
        "--params", str(REPO / "params.yaml"),
        "--set", f"data.root={REPO / 'data/raw'}",
        "--set", f"experiment.reports_dir={reports}",
        "--set", "validation.min_shard_size=100000",
        "--partition", str(part),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    finally:
        part.chmod(0o755)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert lines[-1].startswith(f"fedapt: error: {part / 'stats.json'}: client 0 holds"), lines
    assert "validation.min_shard_size is 100000" in lines[-1], lines[-1]
    assert "Error logging to API" not in res.stderr + res.stdout, res.stderr
    assert not reports.exists() or not any(p.is_file() for p in reports.rglob("*"))
    assert {p.name: p.stat().st_mtime_ns for p in part.iterdir()} == before
