"""Resume after a crash: a run stopped after any round and continued from its checkpoint ends
with the same bytes as a run that was never interrupted (engine state, checkpoint files,
killed processes); a checkpoint of another configuration is refused in one line."""

from __future__ import annotations

import io
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from fedcore import payload
from fedcore.algorithms import build_algorithm
from fedcore.client import LocalConfig
from fedcore.engine import FederationConfig, Simulation
from fedcore.errors import ConfigError
from fedcore.events import Callback
from fedcore.schedules import LRSchedule
from tests.helpers import Crash, CrashAfter, tiny_cnn, tiny_layered, toy_data
from tests.tasks.support import ROUNDS, cell_params

REPO = Path(__file__).resolve().parents[3]


class Seen(Callback):
    def __init__(self, seen: list) -> None:
        self.seen = seen

    def on_fit_start(self, info) -> None:
        self.seen.append(info["start_round"])

    def on_resume(self, history) -> None:
        self.seen.append([r.round for r in history.rounds])


def make_sim(algorithm: str, options: dict | None = None) -> Simulation:
    model_fn = tiny_layered if algorithm == "fednilo" else tiny_cnn
    rng = np.random.default_rng(0)
    shards = np.array_split(rng.permutation(400), 5)
    return Simulation(
        model_fn=model_fn,
        algorithm=build_algorithm(algorithm, options or {}),
        train=toy_data(),
        test=toy_data(100, seed=1),
        shards=shards,
        local=LocalConfig(batch_size=16, momentum=0.9 if algorithm != "fednova" else 0.0),
        lr_schedule=LRSchedule(lr=0.05),
        federation=FederationConfig(rounds=ROUNDS, clients_per_round=3, seed=7),
        workers=0,
    )


def outputs(sim: Simulation, history) -> tuple[bytes, list[dict]]:
    rounds = [{k: v for k, v in r.to_dict().items() if k != "seconds"} for r in history.rounds]
    return payload.encode(sim.global_state), rounds


CASES = [
    ("fedavg", None),
    ("fedadam", {"server_lr": 0.01}),  # server moments m, v and the step count
    ("fednilo", {"K": 1, "F": 1}),  # the holder map of frozen layers
    ("scaffold", {"server_lr": 0.5}),  # the server's c and every client's c_k
]


@pytest.mark.parametrize(("algorithm", "options"), CASES, ids=[c[0] for c in CASES])
def test_resume_after_every_round_is_byte_identical(algorithm, options):
    ref = make_sim(algorithm, options)
    want = outputs(ref, ref.run())
    for k in range(1, ROUNDS):
        sim = make_sim(algorithm, options)
        crash = CrashAfter(sim, k)
        sim.callbacks.append(crash)
        with pytest.raises(Crash):
            sim.run()
        again = make_sim(algorithm, options)
        state = torch.load(io.BytesIO(crash.saved), weights_only=True)
        assert state["round"] == k
        again.load_state_dict(state)
        seen: list = []
        again.callbacks.append(Seen(seen))
        assert outputs(again, again.run()) == want, f"{algorithm}: resumed after round {k}"
        assert seen == [k + 1, list(range(1, k + 1))]


def test_a_checkpoint_of_another_model_is_refused():
    sim = make_sim("fedavg")
    sim.run()
    state = sim.state_dict()
    other = make_sim("fednilo", {"K": 1, "F": 1})  # another architecture
    with pytest.raises(ConfigError, match="checkpoint model differs"):
        other.load_state_dict(state)


# ---- through the training cell: checkpoint files, fingerprints ----------------------------


def cell_files(cell_dir: Path) -> dict[str, bytes]:
    return {n: (cell_dir / n).read_bytes() for n in ("model.pt", "metrics.json", "rounds.csv")}


def test_cell_resumes_from_its_checkpoint_file(tmp_path):
    from tasks.data.experiment import load_experiment_data
    from tasks.data.partitioning import build_partition
    from tasks.training.cell import cell_of
    from tasks.training.train import train_cell_model

    p = cell_params(tmp_path)
    data = load_experiment_data(p)
    part = build_partition(p, data)
    train_cell_model(cell_of(p, data, "fedadam", "full"), data, part, tmp_path / "ref")
    want = cell_files(tmp_path / "ref")

    ckpt = tmp_path / "ckpt" / "fedadam-full.pt"

    class Die(Callback):
        def on_round_end(self, record):
            if record.round == 2:
                raise Crash

    with pytest.raises(Crash):
        train_cell_model(
            cell_of(p, data, "fedadam", "full"),
            data,
            part,
            tmp_path / "cell",
            [Die()],
            checkpoint_file=ckpt,
        )
    assert ckpt.is_file() and not (tmp_path / "cell" / "metrics.json").exists()
    record, _ = train_cell_model(
        cell_of(p, data, "fedadam", "full"), data, part, tmp_path / "cell", checkpoint_file=ckpt
    )
    assert cell_files(tmp_path / "cell") == want
    assert not ckpt.exists()  # removed once the outputs are written
    assert record["diverged_at_round"] is None

    # the final checkpoint kept (the flow's rule): a rerun trains nothing and writes the same
    train_cell_model(
        cell_of(p, data, "fedadam", "full"),
        data,
        part,
        tmp_path / "kept",
        checkpoint_file=ckpt,
        keep_checkpoint=True,
    )
    assert ckpt.is_file()

    class NoRound(Callback):
        def on_round_start(self, *args):
            raise AssertionError("a finished cell trained again")

    train_cell_model(
        cell_of(p, data, "fedadam", "full"),
        data,
        part,
        tmp_path / "again",
        [NoRound()],
        checkpoint_file=ckpt,
    )
    assert cell_files(tmp_path / "again") == want


def test_checkpoint_of_another_configuration_is_refused_naming_the_keys(tmp_path):
    from tasks.data.experiment import load_experiment_data
    from tasks.data.partitioning import build_partition
    from tasks.training.cell import cell_of
    from tasks.training.train import train_cell_model

    p = cell_params(tmp_path, "federation.rounds=1")
    data = load_experiment_data(p)
    part = build_partition(p, data)
    ckpt = tmp_path / "fedavg-full.pt"
    train_cell_model(
        cell_of(p, data, "fedavg", "full"),
        data,
        part,
        tmp_path / "a",
        checkpoint_file=ckpt,
        keep_checkpoint=True,
    )
    other = cell_params(tmp_path, "federation.rounds=1", "client.lr=0.5", "runtime.workers=1")
    with pytest.raises(ConfigError) as err:
        train_cell_model(
            cell_of(other, data, "fedavg", "full"), data, part, tmp_path / "b", checkpoint_file=ckpt
        )
    line = str(err.value)
    assert "\n" not in line and "client.lr (0.05 -> 0.5)" in line and str(ckpt) in line
    assert "runtime.workers" not in line  # cannot change the numbers: not a difference
    assert "runtime.resume=false" in line
    assert not (tmp_path / "b").exists()
    # runtime.resume: false starts over (and replaces the checkpoint)
    fresh = other.model_copy(update={"runtime": other.runtime.model_copy(update={"resume": False})})
    train_cell_model(
        cell_of(fresh, data, "fedavg", "full"), data, part, tmp_path / "b", checkpoint_file=ckpt
    )
    assert (tmp_path / "b" / "metrics.json").is_file()

    for torn in (b"torn", _torn_zip(tmp_path)):  # not a zip; a zip cut short
        ckpt.write_bytes(torn)
        with pytest.raises(ConfigError, match="cannot be read") as err:
            train_cell_model(
                cell_of(p, data, "fedavg", "full"), data, part, tmp_path / "c", checkpoint_file=ckpt
            )
        line = str(err.value)
        assert "\n" not in line and "weights_only" not in line and str(ckpt) in line, line


def _torn_zip(tmp_path: Path) -> bytes:
    """A zip archive cut in the middle (a checkpoint written by something else, or torn)."""
    import zipfile

    path = tmp_path / "whole.zip"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", b"x" * 4096)
    return path.read_bytes()[:-30]


def test_diverged_cell_is_recorded(tmp_path):
    from tasks.data.experiment import load_experiment_data
    from tasks.data.partitioning import build_partition
    from tasks.training.cell import cell_of
    from tasks.training.train import train_cell_model

    p = cell_params(tmp_path, "federation.rounds=2", "client.lr=1e30")
    data = load_experiment_data(p)
    part = build_partition(p, data)
    record, _ = train_cell_model(cell_of(p, data, "fedavg", "full"), data, part, tmp_path / "cell")
    assert record["diverged_at_round"] == 1
    metrics = json.loads((tmp_path / "cell" / "metrics.json").read_text())
    assert metrics["diverged_at_round"] == 1


# ---- kill -9 ------------------------------------------------------------------------------

_CHILD = """
import sys
from pathlib import Path
from tasks.config import load_params
from tasks.data.experiment import load_experiment_data
from tasks.data.partitioning import build_partition
from tasks.training.cell import cell_of
from tasks.training.train import train_cell_model
tmp, out, ckpt = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, {repo!r})
from tests.tasks.support import cell_params
p = cell_params(Path(tmp), "federation.rounds={rounds}")
data = load_experiment_data(p)
part = build_partition(p, data)
train_cell_model(cell_of(p, data, "fedadam", "full"), data, part, Path(out), checkpoint_file=ckpt)
"""


@pytest.mark.slow
def test_kill_9_at_random_rounds_resumes_byte_identical(tmp_path):
    """Ten runs killed with SIGKILL at a random moment (in a round, or while writing its
    checkpoint), each rerun with the same command: the final files equal an uninterrupted
    run's every time."""
    rounds = 6
    script = _CHILD.format(repo=str(REPO), rounds=rounds)
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def start(out: Path, ckpt: Path) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-c", script, str(tmp_path), str(out), str(ckpt)],
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

    ref = start(tmp_path / "ref", tmp_path / "ref.pt")
    assert ref.wait(timeout=300) == 0, ref.stderr.read().decode()[-2000:]
    want = cell_files(tmp_path / "ref")

    rng = random.Random(20261124)
    out, ckpt = tmp_path / "cell", tmp_path / "cell.pt"
    kills = 0
    while kills < 10:
        proc = start(out, ckpt)
        # kill at a random round: wait until the checkpoint is one or two rounds further,
        # then kill after a random fraction of a round (in training, or in a write)
        target = _checkpoint_round(ckpt) + rng.randrange(1, 3)
        deadline = time.monotonic() + 300
        while proc.poll() is None and time.monotonic() < deadline:
            done = _checkpoint_round(ckpt)
            if done >= target:
                time.sleep(rng.random() * 0.5)
                break
            time.sleep(0.02)
        if proc.poll() is not None:  # it finished first: start over, fresh
            assert proc.returncode == 0, proc.stderr.read().decode()[-2000:]
            ckpt.unlink(missing_ok=True)
            continue
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        kills += 1
    final = start(out, ckpt)
    assert final.wait(timeout=300) == 0, final.stderr.read().decode()[-2000:]
    assert cell_files(out) == want
    assert not ckpt.exists()
    # the temp file of a write torn by a kill is removed by the next run's writer
    assert not [f.name for f in tmp_path.iterdir() if f.name.startswith(".cell.pt.")]


def _checkpoint_round(path: Path) -> int:
    try:
        return int(torch.load(path, weights_only=True)["state"]["round"])
    except Exception:
        return 0


def test_preflight_refuses_a_foreign_checkpoint_before_anything_runs(tmp_path):
    from flows.plan import prepare
    from tasks.config import experiment_dir
    from tasks.data.experiment import load_experiment_data
    from tasks.data.partitioning import build_partition
    from tasks.training.cell import cell_of
    from tasks.training.train import train_cell_model

    p = cell_params(tmp_path, "federation.rounds=1")
    data = load_experiment_data(p)
    part = build_partition(p, data)
    ckpt = experiment_dir(p) / "checkpoints" / "fedavg-full.pt"
    train_cell_model(
        cell_of(p, data, "fedavg", "full"),
        data,
        part,
        tmp_path / "a",
        checkpoint_file=ckpt,
        keep_checkpoint=True,
    )
    assert prepare(p, results=False).resuming == ["fedavg-full"]
    other = cell_params(tmp_path, "federation.rounds=1", "experiment.seed=5")
    with pytest.raises(ConfigError, match=r"experiment.seed \(0 -> 5\)"):
        prepare(other, results=False)


@pytest.mark.parametrize(("allow", "code"), [(False, 3), (True, None)])
def test_a_diverged_cell_exits_3_unless_allowed(tmp_path, allow, code, capsys):
    import typer

    from flows.cli.runguards import exit_if_diverged

    p = cell_params(tmp_path, f"runtime.allow_divergence={str(allow).lower()}")
    records = [
        {"algorithm": "fedavg", "adapter": "full", "diverged_at_round": None},
        {"algorithm": "fedprox", "adapter": "full", "diverged_at_round": 4},
    ]
    if code is None:
        exit_if_diverged(p, records)
        return
    with pytest.raises(typer.Exit) as exc:
        exit_if_diverged(p, records)
    assert exc.value.exit_code == code
    assert "fedprox-full@4" in capsys.readouterr().err
