"""Issue 45: the config layer and errors that name the setting. A params file that leaves
sections out says which, in one warning line; numbers are typed strictly (no bool for a
number, no float for an integer); an empty value is refused where a name is expected; the
YAML parser's limits are one line with the file and line; and an OS error at a path a setting
became names that setting, its value and what is allowed. The CLI runs in this process."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from flows.cli import app
from tasks.config import Params, load_params
from tests.cli_contract import REPO, assert_one_clear_line, invoke, runner

SECTIONS = list(Params.model_fields)


def _params_without(tmp_path: Path, *missing: str) -> Path:
    """The repo's params.yaml with the sections ``missing`` left out."""
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    f = tmp_path / "params.yaml"
    f.write_text(yaml.safe_dump({k: v for k, v in raw.items() if k not in missing}))
    return f


# ---- sections left out: one warning line names them all ---------------------------------------


@pytest.mark.parametrize(
    "missing",
    [*([s] for s in SECTIONS), ["pretrain", "personalize", "tracking"], SECTIONS[1:]],
    ids=[*SECTIONS, "three", "all-but-experiment"],
)
def test_sections_left_out_are_named_in_one_warning(tmp_path, capsys, missing):
    """Every section of Params, left out of a params file otherwise whole: the file still
    loads (an overrides file is allowed), on the section's code defaults, and one line on
    stderr names exactly the sections left out, in Params' order."""
    f = _params_without(tmp_path, *missing)
    p = load_params(f)
    load_params(f, ["federation.rounds=3"])  # once per process (fedapt reproduce loads it often)
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0] == (
        f"fedapt: warning: {f} leaves out section(s) {', '.join(missing)}: they run on "
        'their code defaults (docs/operations.md, "Params files")'
    )
    for name in missing:  # the code defaults, as said (experiment.name: derived from the rest)
        derived = {"name"} if name == "experiment" else set()
        got, default = getattr(p, name), getattr(Params(), name)
        if default is None:  # a mechanism off by default (privacy)
            assert got is None, name
            continue
        assert got.model_dump(exclude=derived) == default.model_dump(exclude=derived), name


def test_a_whole_params_file_warns_of_nothing_and_no_file_of_everything(
    tmp_path, capsys, monkeypatch
):
    load_params(REPO / "params.yaml", ["federation.rounds=3"])
    assert capsys.readouterr().err == ""  # the repo's params.yaml gives every section
    monkeypatch.chdir(tmp_path)  # no params.yaml here
    load_params(None)
    err = capsys.readouterr().err
    assert err == (
        "fedapt: warning: no params file (params.yaml not found here): every section on "
        "its code defaults\n"
    )


# ---- strict types --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "text", "needle"),
    [
        (["--set", "federation.rounds=true"], None, "federation.rounds: must be a valid integer (got True)"),
        (["--set", "federation.rounds=2.5"], None, "federation.rounds: must be a valid integer (got 2.5)"),
        (["--set", "federation.rounds=2.0"], None, "federation.rounds: must be a valid integer (got 2.0)"),
        (["--set", "federation.rounds='5'"], None, "federation.rounds: must be a valid integer (got '5')"),
        (["--set", "client.lr=true"], None, "client.lr: must be a valid number (got True)"),
        (["--set", "data.download=1"], None, "data.download: must be a valid boolean (got 1)"),
        (["--set", "experiment.seeds=[0,true]"], None, "experiment.seeds.1: must be a valid integer"),
        (["--set", "personalize.severities=[1,2.0]"], None, "personalize.severities.1: must be a"),
        (
            ["--set", "runtime.workers=true"],
            None,
            "runtime.workers: must be a valid integer or 'auto' (got True)",
        ),
        (
            ["--set", "runtime.ray_gpus=yes"],
            None,
            "runtime.ray_gpus: must be a valid number or 'auto' (got True)",
        ),
        # in the file: the same rule, with the YAML line
        ([], "federation:\n  rounds: true\n", ":2: federation.rounds: must be a valid"),
        ([], "client:\n  lr: 0.1\n  batch_size: 32.0\n", ":3: client.batch_size: must be a"),
    ],
)  # fmt: skip
def test_numbers_are_typed_strictly(tmp_path, args, text, needle):
    params = []
    if text is not None:
        (tmp_path / "p").mkdir()
        (tmp_path / "p" / "params.yaml").write_text(text)
        params = ["--params", str(tmp_path / "p" / "params.yaml")]
    res = invoke(tmp_path, "run", *args, *params)
    assert_one_clear_line(res, needle, tmp_path / "reports")


def test_yaml_numbers_still_parse_as_they_did():
    """What strictness must not refuse: numbers as YAML and --set write them."""
    p = load_params(
        REPO / "params.yaml",
        [
            "federation.rounds=5",
            "client.lr=1e-3",  # YAML 1.2 (PyYAML read it as a string, lax pydantic as 0.001)
            "client.momentum=0",  # an integer is a valid float
            "pretrain.lr=5E+1",
            "experiment.seeds=[0,1]",
            "runtime.workers=auto",
            "runtime.ray_gpus=1",
            "data.download=false",
        ],
    )
    assert (p.federation.rounds, p.client.lr, p.client.momentum) == (5, 0.001, 0.0)
    assert (p.pretrain.lr, p.experiment.seeds) == (50.0, (0, 1))
    assert (p.runtime.workers, p.runtime.ray_gpus, p.data.download) == ("auto", 1.0, False)
    assert type(p.client.momentum) is float and type(p.federation.rounds) is int


@pytest.mark.parametrize(
    ("text", "args", "needle"),
    [
        ("federation:\n", ["--set", "federation.rounds=2"], "'federation' is empty (null) in the"),
        ("federation: 5\n", [], ":1: federation: must be a mapping of its keys (key: value)"),
        ("client:\n  lr: 0.1\nreport: [1, 2]\n", [], ":3: report: must be a mapping of its"),
    ],
)
def test_sections_that_are_not_mappings(tmp_path, text, args, needle):
    """The sweep of issue 45: a section left empty (YAML's null) met by --set was "not a
    section", blaming the --set; a section given a value named pydantic's class."""
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "params.yaml").write_text(text)
    res = invoke(tmp_path, "run", *args, "--params", str(tmp_path / "p" / "params.yaml"))
    assert_one_clear_line(res, needle, tmp_path / "reports")


@pytest.mark.parametrize(
    ("env", "args", "needle"),
    [
        ({"FEDAPT_WORKER_LIMIT": "0"}, ["up", "worker"], "FEDAPT_WORKER_LIMIT='0' is not a"),
        ({"FEDAPT_WORKER_LIMIT": "two"}, ["up", "worker"], "FEDAPT_WORKER_LIMIT='two' is not"),
        ({"FEDAPT_MLFLOW_CONFIG": ""}, ["up", "mlflow"], "FEDAPT_MLFLOW_CONFIG is set but empty"),
        ({"FEDAPT_STATE_DIR": ""}, ["status"], "FEDAPT_STATE_DIR is set but empty"),
        ({"PREFECT_HOME": " "}, ["up", "prefect"], "PREFECT_HOME is set but empty (' ')"),
    ],
)
def test_bad_service_variables_start_nothing(tmp_path, monkeypatch, env, args, needle):
    """Checked before any service starts (the sweep of issue 45: FEDAPT_WORKER_LIMIT was read
    once S3, MLflow and Prefect were up; an empty FEDAPT_MLFLOW_CONFIG or FEDAPT_STATE_DIR
    meant the default without a word)."""
    from flows.services import read_state

    state = tmp_path / "state"
    monkeypatch.setenv("FEDAPT_STATE_DIR", str(state))
    for name in ("s3", "mlflow", "prefect", "worker", "ray"):
        monkeypatch.setenv(f"FEDAPT_{name.upper()}_PORT", "0")
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    res = runner.invoke(app, args)
    assert_one_clear_line(res, needle, tmp_path / "reports")
    assert not state.exists() or read_state(state) == {}  # no service recorded, none started


# ---- empty values where a name is expected -------------------------------------------------


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (
            ["--set", "experiment.name="],
            "experiment.name: must not be empty (leave it out for its default, 'auto') (got '')",
        ),
        (["--set", "experiment.name= "], "experiment.name: must not be empty"),
        (["--set", "experiment.reports_dir="], "experiment.reports_dir: must not be empty"),
        (["--set", "data.root="], "data.root: must not be empty"),
        (["--set", "data.dataset="], "data.dataset: must not be empty"),
        (["--set", "model.name="], "model.name: must not be empty"),
        (["--set", "storage.bucket="], "storage.bucket: must not be empty (null for none"),
        (["--set", "storage.prefix="], "storage.prefix: must not be empty"),
        (["--set", "runtime.dask_address=''"], "runtime.dask_address: must not be empty"),
        (["--set", "experiment.name=''"], "experiment.name: must not be empty"),
    ],
)
def test_empty_names_are_refused(tmp_path, args, needle):
    """``--set experiment.name=`` used to mean null (a derived name, silently)."""
    res = invoke(tmp_path, "run", *args)
    assert_one_clear_line(res, needle, tmp_path / "reports")


# ---- the parser's limits -------------------------------------------------------------------


def _limit_case(name: str, tmp_path: Path) -> tuple[list[str], str]:
    """(args, needle) of one parser-limit case; a params file under tmp_path/p."""
    d = tmp_path / "p"
    d.mkdir()
    f = d / "params.yaml"
    deep = "[" * 2000 + "]" * 2000
    if name == "deep-file":
        f.write_text(f"federation:\n  rounds: 3\nmodel:\n  options: {deep}\n")
        return ["--params", str(f)], f"{f}:4: nested 33 levels deep; a params file nests at most 32"
    if name == "deep-block-file":
        f.write_text(
            "model:\n  options:\n" + "".join(f"{'  ' * (i + 2)}k{i}:\n" for i in range(40))
        )
        return ["--params", str(f)], f"{f}:33: nested 33 levels deep"
    if name == "deep-set":
        return ["--set", f"model.options={deep}"], "--set model.options: nested 33 levels deep"
    if name == "digits-file":
        f.write_text(f"experiment:\n  name: x\n  seed: {'9' * 5000}\n")
        return ["--params", str(f)], f"{f}:3: an integer of 5000 characters; every integer in"
    if name == "digits-set":
        return ["--set", f"client.batch_size={'1' * 4301}"], "--set client.batch_size: an integer"
    if name == "digits-in-a-list":
        f.write_text(f"experiment:\n  seeds:\n    - 0\n    - {'7' * 41}\n")
        return ["--params", str(f)], f"{f}:4: an integer of 41 characters"
    if name == "file-too-large":
        f.write_text("federation:\n  rounds: 3\n" + "# padding\n" * 120_000)
        return ["--params", str(f)], f"params file {f} is larger than 1 MiB"
    if name == "alias-bomb":  # a "billion laughs": 10^9 values from 9 lines
        lines = ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
        lines += [
            f"{c}: &{c} [{', '.join([f'*{p}'] * 10)}]"
            for p, c in zip("abcdefgh", "bcdefghi", strict=True)
        ]
        f.write_text("model:\n  options:\n" + "".join(f"    {line}\n" for line in lines))
        return ["--params", str(f)], f"{f}:7: the aliases (*name) expand to more than 100000"
    if name == "a-device":
        return ["--params", "/dev/zero"], "params file /dev/zero is not a regular file"
    if name == "a-named-pipe":  # no writer: opening it would wait for one forever
        os.mkfifo(d / "fifo")
        return ["--params", str(d / "fifo")], f"params file {d / 'fifo'} is not a regular file"
    if name == "a-link-loop":
        (d / "a").symlink_to(d / "b")
        (d / "b").symlink_to(d / "a")
        return ["--params", str(d / "a")], f"params file {d / 'a'} is a loop of symbolic links"
    if name == "a-dangling-link":
        (d / "a").symlink_to(d / "gone.yaml")
        return ["--params", str(d / "a")], f"(a symbolic link to {d / 'gone.yaml'}, which does"
    if name == "digits-tagged":  # !!int "...": quoted, yet an integer
        f.write_text(f'experiment:\n  name: x\n  seed: !!int "{"9" * 5000}"\n')
        return ["--params", str(f)], f"{f}:3: an integer of 5000 characters"
    if name == "list-as-key-file":
        f.write_text("federation:\n  ? [a, b]\n  : 1\n")
        return ["--params", str(f)], f"{f}:2: malformed YAML: a key must be a name"
    if name == "list-as-key-set":
        return ["--set", "grid.algorithm_options={[a]: 1}"], "grid.algorithm_options"
    # the sweep of session 30: PyYAML's words alone, or a blame on aliases there were not
    if name == "wide-file":
        f.write_text("model:\n  options:\n    k: [" + ", ".join(["1"] * 100_001) + "]\n")
        return ["--params", str(f)], "the file holds more than 100000 values"
    if name == "nul-byte":
        f.write_text("experiment:\n  name: a\x00b\n")
        return ["--params", str(f)], f"{f}:2: malformed YAML: the character '\\x00' (U+0000)"
    if name == "tab-indent":
        f.write_text("experiment:\n\tname: a\n")
        return ["--params", str(f)], "(indent with spaces: YAML allows no tabs there)"
    if name == "two-documents":
        f.write_text("experiment:\n  name: a\n---\ndata: {}\n")
        return ["--params", str(f)], "expected a single document in the stream, but found another"
    if name == "a-tag":
        f.write_text("experiment:\n  name: !foo a\n")
        return ["--params", str(f)], "tag '!foo' (a params file holds plain values, no !tags)"
    raise AssertionError(name)


@pytest.mark.parametrize(
    "name",
    [
        "deep-file",
        "deep-block-file",
        "deep-set",
        "digits-file",
        "digits-set",
        "digits-in-a-list",
        "file-too-large",
        "a-device",
        "a-named-pipe",
        "a-link-loop",
        "a-dangling-link",
        "alias-bomb",
        "digits-tagged",
        "list-as-key-file",
        "list-as-key-set",
        "wide-file",
        "nul-byte",
        "tab-indent",
        "two-documents",
        "a-tag",
    ],
)
def test_parser_limits_are_one_line(tmp_path, name):
    """Deep nesting used to raise RecursionError, 4,300 digits ValueError (PyYAML's int())."""
    args, needle = _limit_case(name, tmp_path)
    res = invoke(tmp_path, "run", *args)
    assert_one_clear_line(res, needle, tmp_path / "reports")
    assert len(res.output) < 1000, res.output  # the value is named, never printed whole


@pytest.mark.parametrize(
    "text, value",
    [
        ("010", 10),  # YAML 1.2: decimal (PyYAML's YAML 1.1 read octal 8)
        ("0o10", 8),
        ("0x10", 16),
        ("+7", 7),
        ("1:30", "1:30"),  # YAML 1.1's sexagesimal 90: a string, refused as a number
        ("0b101", "0b101"),
        ("1_000", "1_000"),
        ("1e-3", 0.001),
        ("5E+2", 500.0),
    ],
)
def test_numbers_are_read_as_yaml_1_2_reads_them(text, value):
    """A number means what YAML 1.2 (the YAML people write today) says, never a YAML 1.1
    reading the user did not mean: ``rounds: 010`` is 10, ``1:30`` is not 90."""
    from tasks.config.yamlfile import parse_override

    got = parse_override(f"federation.rounds={text}")[1]
    assert got == value and type(got) is type(value), (text, got)


@pytest.mark.parametrize("text", ["1:30", "0b101", "1_000"])
def test_yaml_1_1_number_forms_are_refused_where_a_number_is_expected(tmp_path, text):
    res = invoke(tmp_path, "run", "--set", f"federation.rounds={text}")
    assert_one_clear_line(res, "federation.rounds", tmp_path / "reports")


def test_a_merge_key_merges_and_its_entries_may_be_overridden(tmp_path):
    from tasks.config.yamlfile import read_mapping

    f = tmp_path / "m.yaml"
    f.write_text("base: &b {rounds: 3, seed: 1}\nfederation:\n  <<: *b\n  rounds: 5\n")
    assert read_mapping(str(f))[1]["federation"] == {"rounds": 5, "seed": 1}


# ---- settings that become paths ------------------------------------------------------------


def _path_case(name: str, tmp_path: Path, monkeypatch) -> tuple[list[str], str]:
    """(command and args, needle) of one case; the environment set on ``monkeypatch``."""
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    run = ["run", "--set", "runtime.tracking=false", "--set", "storage.bucket=null"]
    if name == "state-dir-is-a-file":
        monkeypatch.setenv("FEDAPT_STATE_DIR", str(a_file))
        return ["status"], f"FEDAPT_STATE_DIR={a_file} is a file, not a folder; allowed: a"
    if name == "state-dir-is-a-file-up":
        monkeypatch.setenv("FEDAPT_STATE_DIR", str(a_file))
        return ["up", "s3"], f"FEDAPT_STATE_DIR={a_file} is a file, not a folder; allowed: a"
    if name == "state-dir-not-writable":
        monkeypatch.setenv("FEDAPT_STATE_DIR", "/proc/fedapt-state")
        return ["up", "s3"], "FEDAPT_STATE_DIR: /proc/fedapt-state: No such file or directory"
    if name == "reports-under-proc":
        return [*run, "--set", "experiment.reports_dir=/proc/x/reports"], (
            "experiment.reports_dir: /proc/x/reports: No such file or directory at /proc/x; "
            "allowed: a folder fedapt may create"
        )
    if name == "reports-too-long":
        long = f"{tmp_path}/{'b' * 300}/r"
        return [*run, "--set", f"experiment.reports_dir={long}"], (
            f"experiment.reports_dir: {long[:40]}...{long[-20:]} ({len(long)} characters): "
            "File name too long"
        )
    if name == "name-too-long":  # refused as a value: it would be a folder's name
        return [*run, "--set", f"experiment.name={'a' * 300}"], (
            "experiment.name: a folder name: letters, digits, '.', '_' and '-', starting with "
            "a letter or digit, at most 200 characters"
        )
    if name == "name-not-a-folder-name":
        return [*run, "--set", "experiment.name=a/b"], "experiment.name: a folder name:"
    if name == "prefect-home-is-a-file":
        monkeypatch.setenv("PREFECT_HOME", str(a_file))
        args = ["--set", "data.train_subset=1200", "--set", "data.test_subset=500"]
        args += ["--set", f"experiment.reports_dir={tmp_path / 'reports'}"]
        return [*run, *args], f"PREFECT_HOME={a_file} is a file, not a folder; allowed: a folder"
    if name == "mlflow-config-missing":
        monkeypatch.setenv("FEDAPT_MLFLOW_CONFIG", str(tmp_path / "nope.toml"))
        return ["up", "mlflow"], (
            f"FEDAPT_MLFLOW_CONFIG: {tmp_path / 'nope.toml'}: no such file; allowed: a TOML"
        )
    if name == "mlflow-config-a-folder":
        monkeypatch.setenv("FEDAPT_MLFLOW_CONFIG", str(tmp_path))
        return ["up", "mlflow"], f"FEDAPT_MLFLOW_CONFIG: {tmp_path}: Is a directory; allowed:"
    if name == "port-of-5000-digits":  # a port is a setting too: its value shortened
        monkeypatch.setenv("FEDAPT_S3_PORT", "9" * 5000)
        return ["up", "s3"], "FEDAPT_S3_PORT='999999999999999999999999999999999999999...99999"
    raise AssertionError(name)


@pytest.mark.parametrize(
    "name",
    [
        "prefect-home-is-a-file",
        "mlflow-config-missing",
        "mlflow-config-a-folder",
        "port-of-5000-digits",
        "state-dir-is-a-file",
        "state-dir-is-a-file-up",
        "state-dir-not-writable",
        "reports-under-proc",
        "reports-too-long",
        "name-too-long",
        "name-not-a-folder-name",
    ],
)
def test_settings_that_become_paths_are_named(tmp_path, monkeypatch, name):
    """The OS names the path (``File exists``, ``File name too long``, ``No such file or
    directory``); the line names the setting or variable, its value and what is allowed."""
    args, needle = _path_case(name, tmp_path, monkeypatch)
    before = sorted(tmp_path.rglob("*"))
    cwd_reports = sorted((REPO / "reports").glob("*")) if (REPO / "reports").exists() else []
    if args[0] == "run":
        args = [*args, "--params", str(REPO / "params.yaml")]
    res = runner.invoke(app, args)
    assert_one_clear_line(res, needle, tmp_path / "reports")
    assert sorted(tmp_path.rglob("*")) == before  # nothing written
    assert (sorted((REPO / "reports").glob("*")) if (REPO / "reports").exists() else []) == (
        cwd_reports
    )


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--workers", "-1"], "--workers: workers is auto or a number of worker processes"),
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
        (["--set", "grid.algorithms=fedavg"], "grid.algorithms: must be a list, e.g. [a, b]"),
        (["--set", "dvc.cells={}"], "--set dvc.cells: the dvc section lists dvc.yaml's train"),
        (
            ["--set", "grid.codec_options={int8: {kind: topk}}"],
            "int8.kind: int8 is the built-in codec of kind quantize; a codec of kind topk needs",
        ),
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
        # a Dask cluster nothing answers at, or no address at all: before anything runs
        (
            [
                "--set",
                "runtime.task_runner=dask",
                "--set",
                "runtime.dask_address=tcp://127.0.0.1:1",
            ],
            "runtime.dask_address: nothing answers at tcp://127.0.0.1:1",
        ),
        (
            ["--set", "runtime.task_runner=dask", "--set", "runtime.dask_address=http://x"],
            "runtime.dask_address: 'http://x' is not tcp://host:port",
        ),
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
            "grid.codec_options: int8.bits: must be 2, 4 or 8 (got 3)",
        ),
        (["--set", "grid.codec_options={topk: {k: 0}}"], "topk.k: must be greater than 0"),
        (["--set", "grid.codec_options={topk: {fraction: 2}}"], "topk.fraction: must be less"),
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
        (
            ["--device", "tpu"],
            "fedapt: error: --device: must be 'auto', 'cpu' or 'cuda' (got 'tpu')",
        ),
        (["--workers", "x"], "fedapt: error: --workers: must be a valid integer or 'auto'"),
        (["--partition", "/nonexistent/p"], "--partition /nonexistent/p does not exist"),
    ],
)
def test_a_bad_option_value_names_the_option_typed(tmp_path, args, needle):
    """``--device tpu`` was refused as ``params.yaml (with --set):162: runtime.device``: a
    line and a key the user never wrote."""
    res = invoke(tmp_path, "run", *args)
    assert_one_clear_line(res, needle, tmp_path / "reports")
    assert "params.yaml" not in res.output, res.output


@pytest.mark.parametrize("link", ["loop", "dangling"])
@pytest.mark.parametrize("command, option", [("run", "--partition"), ("report", "--runs")])
def test_a_link_given_as_a_folder_option_is_named_as_a_link(tmp_path, link, command, option):
    """A link loop given as --partition or --runs was 'does not exist', a path the user can
    see there: the line names the option and says what the path is."""
    where = tmp_path / "links"
    where.mkdir()
    path = where / "a"
    if link == "loop":
        path.symlink_to(where / "b")
        (where / "b").symlink_to(path)
        needle = f"{option} {path} is a loop of symbolic links"
    else:
        path.symlink_to(where / "gone")
        needle = f"{option} {path} is a broken symbolic link (to {where / 'gone'}, which"
    if command == "run":
        res = invoke(tmp_path, "run", option, str(path))
    else:
        params = ["--params", str(REPO / "params.yaml"), option, str(path)]
        out = ["--out", str(tmp_path / "reports"), "--timing", str(tmp_path / "reports/t")]
        res = runner.invoke(app, ["report", *params, *out])
    assert_one_clear_line(res, needle, tmp_path / "reports")


def test_a_link_loop_given_as_out_is_named_as_a_loop(tmp_path):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    res = invoke(tmp_path, "partition", "--out", str(tmp_path / "a"))
    needle = f"--out: {tmp_path / 'a'} is a loop of symbolic links (it leads back to itself)"
    assert_one_clear_line(res, needle, tmp_path / "reports")


@pytest.mark.parametrize("setting", ["data.root", "FEDAPT_STATE_DIR"])
def test_a_link_loop_as_a_setting_that_is_resolved_names_the_setting(
    tmp_path, monkeypatch, setting
):
    """Python 3.11's Path.resolve() raises a RuntimeError on a loop of symbolic links: it was
    a traceback for data.root and FEDAPT_STATE_DIR (the sweep of session 30); now the
    setting's line, as for any path error."""
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    loop = str(tmp_path / "a")
    if setting == "data.root":
        res = invoke(
            tmp_path, "prepare", "--set", f"data.root={loop}", "--out", str(tmp_path / "p")
        )
    else:
        monkeypatch.setenv("FEDAPT_STATE_DIR", loop)
        res = runner.invoke(app, ["status"])
    needle = f"{setting}: {loop}: Too many levels of symbolic links; allowed: "
    assert_one_clear_line(res, needle, tmp_path / "reports")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--algorithm", "nosuch"], "fedapt: error: --algorithm: unknown algorithm 'nosuch'"),
        (["--algorithm", "fedavg", "--adapter", "nope"], "--adapter: unknown adapter method"),
        (["--algorithm", "fedavg", "--codec", "zip"], "fedapt: error: --codec: unknown codec"),
    ],
)
def test_fedapt_train_names_its_own_cell_options(tmp_path, args, needle):
    """`fedapt train --algorithm nosuch` blamed grid.algorithms at a line of the params file
    the user never wrote (the sweep of session 30)."""
    part = ["--partition", str(tmp_path / "part"), "--out", str(tmp_path / "reports/c")]
    res = invoke(tmp_path, "train", *args, *part)
    assert_one_clear_line(res, needle, tmp_path / "reports")
    assert "params.yaml" not in res.output, res.output


def test_output_options_are_named_when_the_os_refuses_them(tmp_path):
    """The sweep of session 30: `prepare --out /proc/x/prep` named /proc/x alone, and
    `validate --out <a folder>` a temporary file beside it."""
    res = invoke(tmp_path, "prepare", "--out", "/proc/x/prep")
    needle = "--out: /proc/x/prep: No such file or directory at /proc/x; allowed: a folder"
    assert_one_clear_line(res, needle, tmp_path / "reports")
    (tmp_path / "outdir").mkdir()
    res = invoke(tmp_path, "validate", "--partition", str(tmp_path / "p"), "--out",
                 str(tmp_path / "outdir"))  # fmt: skip
    needle = f"--out {tmp_path / 'outdir'} is a folder; give the file to write, e.g. "
    assert_one_clear_line(res, needle, tmp_path / "reports")
    assert not list((tmp_path / "outdir").iterdir())


@pytest.mark.parametrize("kind", ["loop", "dangling"])
def test_mkdir_on_a_link_to_nowhere_says_what_the_link_is(tmp_path, kind):
    """mkdir on a link loop (PREFECT_HOME in the sweep of session 30) says "File exists":
    the guard's line says what the path is."""
    import errno

    from flows.cli.guards import name_dangling_link

    link = tmp_path / "a"
    link.symlink_to(tmp_path / ("a" if kind == "loop" else "gone"))
    exc = OSError(errno.EEXIST, "File exists", str(link))
    name_dangling_link(exc)
    want = "a loop of symbolic links" if kind == "loop" else "a broken symbolic link (to "
    assert exc.strerror.startswith(want), exc.strerror
    plain = OSError(errno.EEXIST, "File exists", str(tmp_path))  # a real folder: as it was
    name_dangling_link(plain)
    assert plain.strerror == "File exists"
