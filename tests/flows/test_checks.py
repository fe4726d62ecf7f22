"""Checks before the flow (issue 45): whatever a run would reject later is refused by
``flows.plan.prepare`` before any server starts, in one line naming the file and its row, the
checkpoint and its tensor, or the setting: a ``--partition`` the flow's shard validation
would refuse (duplicate samples, clients out of range or empty, sizes that disagree, shards
below validation.min_shard_size, a drawn partition too), a checkpoint of the right
configuration holding another model's tensors, a ``storage.prefix`` that leaves its folder.
A refused run writes nothing: no file appears under the outputs, the repository's runs,
reports and artifacts folders, or the state dir. The CLI runs in this process."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from fedcore.manifest import read_manifest
from fedcore.partition import Partition
from tests.cli_contract import REPO, invoke

WATCHED = [REPO / "runs", REPO / "reports", REPO / "artifacts"]


def _files(roots: list[Path]) -> dict[Path, tuple[int, int]]:
    """Every file under ``roots``, with its size and mtime."""
    found = {}
    for root in roots:
        if root.exists():
            for p in root.rglob("*"):
                if p.is_file():
                    st = p.stat()
                    found[p] = (st.st_size, st.st_mtime_ns)
    return found


def _roots(tmp_path: Path) -> list[Path]:
    return [*WATCHED, tmp_path, Path(os.environ["FEDAPT_STATE_DIR"])]


def assert_refused(res, needles: list[str], before: dict[Path, tuple[int, int]], roots) -> None:
    """Non-zero exit, no traceback, every needle named, the error the last line, and every
    file as it was (none new, none changed or removed)."""
    text = res.output.strip()
    assert res.exit_code != 0, text
    assert "Traceback" not in text, text
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    last = text.splitlines()[-1]
    assert last.startswith("fedapt: error: "), text
    for needle in needles:
        assert needle in last, last
    assert _files(roots) == before, "a refused run wrote, changed or removed a file"


# ---- manifests --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def partitions(tmp_path_factory):
    """``partitions(scheme)``: a real partition of 1200 train rows over 10 clients (fedapt
    partition), made once per scheme."""
    made: dict[str, Path] = {}

    def get(scheme: str) -> Path:
        if scheme not in made:
            out = tmp_path_factory.mktemp(scheme) / "p"
            res = invoke(out.parent, "partition", "--out", str(out), *_scheme(scheme))
            assert res.exit_code == 0, res.output
            made[scheme] = out
        return made[scheme]

    return get


def _scheme(scheme: str) -> list[str]:
    return ["--set", f"partition.scheme={scheme}"]


def _rows(d: Path) -> tuple[str, list[list[int]]]:
    header, *lines = (d / "manifest.csv").read_text().splitlines()
    return header, [[int(x) for x in line.split(",")] for line in lines]


def _write(d: Path, rows: list[list[int]], *, rehash: bool = True, sizes: bool = False) -> None:
    """Write ``rows`` as the manifest; ``rehash``: stats.json's content hash made to match it
    (what an edit meant to pass the hash check does); ``sizes``: its client sizes too."""
    text = "client_id,sample_index,label\n" + "".join(f"{c},{i},{y}\n" for c, i, y in rows)
    (d / "manifest.csv").write_text(text)
    stats = json.loads((d / "stats.json").read_text())
    cid, idx, _ = read_manifest(d / "manifest.csv")
    n = int(stats["num_clients"])
    if rehash:
        noise = tuple(float(c["noise_var"]) for c in stats["clients"])
        parts = tuple(np.sort(idx[cid == c]) for c in range(n))
        stats["content_hash"] = Partition(
            stats["scheme"], stats["params"], parts, noise
        ).content_hash()
    if sizes:
        for c in stats["clients"]:
            c["size"] = int((cid == c["client_id"]).sum())
    (d / "stats.json").write_text(json.dumps(stats))


SCHEMES = {"labels-other-than-m": "labels_per_client", "noise-not-increasing": "gaussian_noise"}


def _manifest_case(name: str, d: Path) -> tuple[list[str], list[str], bool]:
    """(args, needles, the flow's validation refuses it too) of one bad partition in ``d``."""
    manifest, stats = str(d / "manifest.csv"), str(d / "stats.json")
    header, rows = _rows(d)
    if name == "labels-other-than-m":  # stats.json says client 4 holds 3 labels, m is 2
        s = json.loads((d / "stats.json").read_text())
        s["clients"][4]["num_labels"] = 3
        (d / "stats.json").write_text(json.dumps(s))
        needle = "client 4 holds 3 labels; partition.labels_per_client.m asks for exactly 2"
        return _scheme(SCHEMES[name]), [stats, needle], True
    if name == "noise-not-increasing":  # client 3's noise as client 2's, the hash recomputed
        s = json.loads((d / "stats.json").read_text())
        s["clients"][3]["noise_var"] = s["clients"][2]["noise_var"]
        (d / "stats.json").write_text(json.dumps(s))
        _write(d, rows)
        return _scheme(SCHEMES[name]), [stats, "client 3 has noise_var", "not above client 2"], True
    if name == "sample-on-two-clients":  # the case: the hash recomputed
        first = rows[0]
        r = next(k for k, row in enumerate(rows) if row[0] != first[0])
        rows[r] = [rows[r][0], first[1], first[2]]
        _write(d, rows)
        return [], [manifest, f"row {r + 2}, column sample_index: sample {first[1]} is on client "
                    f"{rows[r][0]} and on client {first[0]} (row 2)"], True  # fmt: skip
    if name == "client-out-of-range":
        rows[4][0] = 10  # 10 clients: 0..9
        _write(d, rows)
        return [], [manifest, "row 6, column client_id: 10 is outside 0..9"], True
    if name == "empty-client":  # client 3's rows given to client 4, sizes and hash updated
        rows = [[4 if c == 3 else c, i, y] for c, i, y in rows]
        _write(d, rows, sizes=True)
        return [], [stats, "client 3 holds 0 samples; validation.min_shard_size is 10"], True
    if name == "size-differs":  # stats.json says one thing, the manifest another
        s = json.loads((d / "stats.json").read_text())
        s["clients"][2]["size"] += 1
        (d / "stats.json").write_text(json.dumps(s))
        size = s["clients"][2]["size"]
        return [], [stats, f"client 2 has size {size}, but {manifest} holds {size - 1} rows"], True
    if name == "shards-too-small":
        args = ["--set", "validation.min_shard_size=100000"]
        return args, [stats, "client 0 holds", "validation.min_shard_size is 100000"], True
    if name == "stats-field-missing":
        s = json.loads((d / "stats.json").read_text())
        del s["clients"][1]["num_labels"]
        (d / "stats.json").write_text(json.dumps(s))
        return [], [stats, "missing or malformed field 'num_labels'"], False
    if name == "wrong-columns":
        (d / "manifest.csv").write_text(
            (d / "manifest.csv").read_text().replace(header, "a,b,c", 1)
        )
        return [], [manifest, "not a partition manifest"], False
    if name == "hash-differs":  # two samples trade clients, the hash left as it was
        r = next(k for k, row in enumerate(rows) if row[0] != rows[0][0])
        rows[0][0], rows[r][0] = rows[r][0], rows[0][0]
        _write(d, rows, rehash=False)
        return [], [manifest, "content hash differs"], False
    raise AssertionError(name)


@pytest.mark.parametrize(
    "name",
    [
        "sample-on-two-clients",
        "client-out-of-range",
        "empty-client",
        "size-differs",
        "shards-too-small",
        "stats-field-missing",
        "wrong-columns",
        "hash-differs",
        "drawn-shards-too-small",
        *SCHEMES,
    ],
)
def test_bad_partition_is_refused_before_the_flow(tmp_path, partitions, name):
    """Each case: refused by ``prepare`` naming the file and row (or client), nothing written
    (no validation.json either); the cases the flow's own validation (great-expectations)
    would refuse, it does refuse: the two agree."""
    if name == "drawn-shards-too-small":  # no --partition: the run's own draw
        args = ["--set", "validation.min_shard_size=100000"]
        needles = ["partition.dirichlet_classwise over 10 clients (experiment.seed 0): client 0",
                   "validation.min_shard_size is 100000"]  # fmt: skip
        flow = False
    else:
        d = tmp_path / "part"
        shutil.copytree(partitions(SCHEMES.get(name, "dirichlet_classwise")), d)
        extra, needles, flow = _manifest_case(name, d)
        args = ["--partition", str(d), *extra]
    roots = _roots(tmp_path)
    before = _files(roots)
    res = invoke(tmp_path, "run", *args)
    assert_refused(res, needles, before, roots)
    if flow:  # the flow's validation would have stopped the run too (after writing)
        from tasks.data.validate import ShardValidationError, validate_partition

        min_size = 100000 if "validation.min_shard_size=100000" in args else 10
        with pytest.raises(ShardValidationError):
            validate_partition(tmp_path / "part", 10, min_size, tmp_path / "flow" / "v.json")


# ---- checkpoints ------------------------------------------------------------------------------

# One round of a tiny grid: the checkpoint's fingerprint is these params'.
CKPT_SETS = [
    "data.train_subset=300",
    "data.test_subset=100",
    "partition.num_clients=4",
    "partition.dirichlet_classwise.min_size=5",
    "validation.min_shard_size=5",
    "federation.rounds=1",
    "federation.participation=0.5",
    "client.max_steps=3",
    "runtime.workers=0",
    "runtime.numerics=portable",
    "runtime.checkpoint_every=1",
    "grid.algorithms=[fedavg,fedadam,scaffold]",
]


def _ckpt_params(reports: Path):
    from tasks.config import load_params

    sets = [*CKPT_SETS, "storage.bucket=null", "runtime.tracking=false"]
    sets += [f"experiment.reports_dir={reports}", f"data.root={REPO / 'data/raw'}"]
    return load_params(REPO / "params.yaml", sets)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, bytes]:
    """The final checkpoints of one round of fedavg-full, fedadam-full (its moments) and
    scaffold-full (its controls), file bytes."""
    from tasks.data.experiment import load_experiment_data
    from tasks.data.partitioning import build_partition
    from tasks.training.cell import cell_of
    from tasks.training.train import train_cell_model

    tmp = tmp_path_factory.mktemp("ckpt")
    p = _ckpt_params(tmp / "reports")
    data = load_experiment_data(p)
    part = build_partition(p, data)
    out = {}
    for algorithm in ("fedavg", "fedadam", "scaffold"):
        ckpt = tmp / f"{algorithm}-full.pt"
        train_cell_model(
            cell_of(p, data, algorithm), data, part, tmp / algorithm, checkpoint_file=ckpt,
            keep_checkpoint=True,
        )  # fmt: skip
        out[algorithm] = ckpt.read_bytes()
    return out


def _first_weight(state: dict[str, torch.Tensor]) -> str:
    return next(k for k, v in state.items() if v.is_floating_point() and v.ndim >= 2)


def test_checkpoints_of_the_cells_model_resume(tmp_path, checkpoints):
    """The check refuses nothing a rerun resumes from: untouched checkpoints (the global
    model, FedAdam's moments, SCAFFOLD's controls) pass it."""
    from flows.plan import prepare
    from tasks.config import experiment_dir

    p = _ckpt_params(tmp_path / "reports")
    folder = experiment_dir(p) / "checkpoints"
    folder.mkdir(parents=True)
    for algorithm, blob in checkpoints.items():
        (folder / f"{algorithm}-full.pt").write_bytes(blob)
    assert prepare(p, storage=False, results=False).resuming == [
        "fedavg-full",
        "fedadam-full",
        "scaffold-full",
    ]


@pytest.mark.parametrize("case", ["shape", "dtype", "missing", "moment-shape"])
def test_checkpoint_of_another_model_is_refused_before_resuming(tmp_path, checkpoints, case):
    """A checkpoint whose fingerprint matches but whose tensors are not the cell's model's:
    refused by ``prepare`` naming the checkpoint and the tensor (before, the cell loaded it
    and training crashed with a RuntimeError), the file left as it was."""
    from tasks.config import experiment_dir

    algorithm = "fedadam" if case == "moment-shape" else "fedavg"
    blob = torch.load(
        __import__("io").BytesIO(checkpoints[algorithm]), map_location="cpu", weights_only=True
    )
    state = blob["state"]["global_state"]
    key = _first_weight(state)
    if case == "shape":
        state[key] = torch.zeros(state[key].shape[0] + 1, *state[key].shape[1:])
        needles = [f"tensor global_state.{key} is ({state[key].shape[0]},"]
    elif case == "dtype":
        state[key] = state[key].double()
        needles = [f"tensor global_state.{key} is {tuple(state[key].shape)} float64, the cell's "
                   f"model has {tuple(state[key].shape)} float32"]  # fmt: skip
    elif case == "missing":
        del state[key]
        needles = [f"{key} (missing)"]
    else:
        moments = blob["state"]["algorithm"]["m"]
        k = _first_weight(moments)
        moments[k] = moments[k].flatten()
        needles = [f"tensor algorithm.m.{k} has shape ({moments[k].numel()},)"]
    path = (
        experiment_dir(_ckpt_params(tmp_path / "reports")) / "checkpoints" / f"{algorithm}-full.pt"
    )
    path.parent.mkdir(parents=True)
    torch.save(blob, path)
    roots = _roots(tmp_path)
    before = _files(roots)
    args = [a for s in CKPT_SETS for a in ("--set", s)]
    res = invoke(tmp_path, "run", *args)
    assert_refused(res, [f"checkpoint {path}: ", *needles, "runtime.resume=false"], before, roots)


@pytest.mark.parametrize(
    "case", ["empty", "not-a-zip", "a-folder", "a-folder-no-resume", "no-fingerprint", "dangling"]
)
def test_unreadable_checkpoint_is_refused_before_the_flow(tmp_path, case):
    """A cell's checkpoint path holding an empty file, a foreign file or a folder: refused by
    ``prepare`` in one line naming it (the sweep of issue 45: an empty file said "cannot be
    read ()", a foreign one repeated torch.load's weights_only advice, and a folder was met
    only when the trained cell wrote its checkpoint, files already written)."""
    from tasks.config import experiment_dir

    sets = [*CKPT_SETS] + (["runtime.resume=false"] if case == "a-folder-no-resume" else [])
    path = experiment_dir(_ckpt_params(tmp_path / "reports")) / "checkpoints" / "fedavg-full.pt"
    path.parent.mkdir(parents=True)
    if case == "empty":
        path.write_bytes(b"")
        needles = [f"checkpoint {path} is empty (0 bytes", "runtime.resume=false"]
    elif case == "not-a-zip":
        path.write_bytes(b"\x00not a checkpoint" * 50)
        needles = [f"checkpoint {path} is not a checkpoint file (not the zip archive"]
    elif case == "no-fingerprint":  # the sweep of session 30: a KeyError traceback
        from tasks.training.checkpoint import FORMAT

        torch.save({"format": FORMAT, "state": {}}, path)
        needles = [f"checkpoint {path} is not a fedapt checkpoint", "runtime.resume=false"]
    elif case == "dangling":  # it ran from scratch, the checkpoint linked to unread
        path.symlink_to(path.parent / "gone.pt")
        needles = [f"checkpoint {path} is a broken symbolic link (to {path.parent / 'gone.pt'}"]
    else:
        path.mkdir()
        needles = [f"checkpoint {path} is a folder", "delete it"]
    roots = _roots(tmp_path)
    before = _files(roots)
    res = invoke(tmp_path, "run", *[a for s in sets for a in ("--set", s)])
    assert_refused(res, needles, before, roots)
    assert "weights_only" not in res.output


# ---- storage.prefix ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prefix", "needle"),
    [
        ("../elsewhere", "no .."),
        ("runs/../../elsewhere", "no .."),
        ("runs/..", "no .."),
        ("/runs", "no leading /"),
        ("//runs", "no leading /"),
        ("runs\tb", "no control characters"),
        ("team\\runs", "not \\"),
        ("a" * 2000, "at most 512 bytes"),  # the sweep of session 30: S3 failed after training
    ],
)
def test_storage_prefix_leaving_its_folder_is_refused(tmp_path, prefix, needle):
    """A storage.prefix that would leave the bucket's folder (S3 InvalidRequest, or another
    folder than asked for): one line naming storage.prefix, before any server or data."""
    roots = _roots(tmp_path)
    before = _files(roots)
    args = ["--set", "storage.bucket=fedapt", "--set", f"storage.prefix={json.dumps(prefix)}"]
    res = invoke(tmp_path, "run", *args)
    assert_refused(res, ["storage.prefix: ", needle, "(got "], before, roots)


def test_storage_prefix_is_normalised():
    from tasks.config import load_params
    from tasks.results.storage import experiment_prefix

    for given, want in [("runs", "runs"), ("runs//a/./", "runs/a"), ("./runs", "runs")]:
        p = load_params(REPO / "params.yaml", [f"storage.prefix={json.dumps(given)}"])
        assert p.storage.prefix == want, given
    assert load_params(REPO / "params.yaml", ["storage.prefix=null"]).storage.prefix is None
    assert experiment_prefix("runs/a", "exp") == "runs/a/exp"
    assert experiment_prefix(None, "exp") == "exp"  # the bucket's top: no leading /


def test_a_partition_of_other_clients_names_the_keys_that_differ(tmp_path, partitions):
    """A 10-client partition given to a run asking for 5 named a params.yaml the user had not
    passed, and no key (the sweep of session 30)."""
    d = tmp_path / "part"
    shutil.copytree(partitions("dirichlet_classwise"), d)
    roots = _roots(tmp_path)
    before = _files(roots)
    res = invoke(tmp_path, "run", "--partition", str(d), "--set", "partition.num_clients=5")
    needles = [f"--partition {d} is dirichlet_classwise over 10 clients, not partition.scheme "
               "dirichlet_classwise over partition.num_clients 5"]  # fmt: skip
    assert_refused(res, needles, before, roots)
