"""Fair hyperparameter tuning (issue 29): data.validation holds a seeded fraction of the
training rows out of every client shard, data.evaluate measures the run on it, and
grid.client_lr gives a grid cell a client lr of its own. Defaults change nothing."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from fedcore.errors import ConfigError
from tasks.config import load_params
from tasks.data.experiment import (
    dataset_card,
    load_experiment_data,
    subset_indices,
    validation_split,
)
from tasks.data.partitioning import (
    build_partition,
    check_partition_data,
    data_selection,
    write_partition,
)
from tasks.training import checkpoint
from tasks.training.cell import build_simulation, cell_of
from tests.helpers import spec_cell

REPO = Path(__file__).resolve().parents[3]
SMALL = [
    f"data.root={REPO / 'data/raw'}",
    "data.train_subset=1200",
    "data.test_subset=300",
    "partition.num_clients=4",
    "federation.rounds=1",
    "client.max_steps=2",
    "runtime.workers=0",
    "runtime.device=cpu",
    "runtime.tracking=false",
]
VAL = ["data.validation=0.1"]


def params(*extra: str):
    return load_params(REPO / "params.yaml", [*SMALL, *extra])


# ---- the carve --------------------------------------------------------------------------------


def test_carve_is_disjoint_complete_and_seeded():
    rows = subset_indices(60000, 1200, 0, "train")
    clients, held = validation_split(rows, 0.1, seed=0)
    assert len(held) == 120 and len(clients) == 1080
    assert not set(clients) & set(held)  # disjoint
    assert np.array_equal(np.union1d(clients, held), rows)  # nothing lost
    assert np.all(np.diff(clients) > 0) and np.all(np.diff(held) > 0)  # sorted
    again = validation_split(rows, 0.1, seed=0)
    assert np.array_equal(again[0], clients) and np.array_equal(again[1], held)
    other = validation_split(rows, 0.1, seed=1)[1]
    assert not np.array_equal(other, held)  # another seed, another carve
    # fraction 0 draws nothing: the rows come back as they are
    same, none = validation_split(rows, 0.0, seed=0)
    assert same is rows or np.array_equal(same, rows)
    assert len(none) == 0


def test_carve_is_the_same_for_evaluate_test_and_validation():
    tune = load_experiment_data(params(*VAL, "data.evaluate=validation"))
    final = load_experiment_data(params(*VAL))
    assert np.array_equal(tune.train_idx, final.train_idx)
    assert np.array_equal(tune.val_idx, final.val_idx)
    # the partition the clients train on is the same draw
    assert (
        build_partition(params(*VAL, "data.evaluate=validation"), tune).content_hash()
        == build_partition(params(*VAL), final).content_hash()
    )
    # the selected rows are those of data.train_subset, whatever the fraction
    plain = load_experiment_data(params())
    assert np.array_equal(final.selected_idx, plain.train_idx)
    assert len(plain.val_idx) == 0


def test_clients_never_hold_validation_rows(tmp_path):
    p = params(*VAL)
    data = load_experiment_data(p)
    part = build_partition(p, data)
    held = np.concatenate(part.client_indices)
    assert not np.isin(held, data.val_idx).any()
    assert np.isin(held, data.train_idx).all()
    write_partition(p, data, part, tmp_path)
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["data_selection"]["validation"] == 0.1
    assert stats["data_selection"]["validation_rows"] == 120
    assert sum(c["size"] for c in stats["clients"]) <= 1080
    check_partition_data(p, data, tmp_path, part)  # its own partition: accepted
    # the partition of the same rows without a validation split is refused, naming the key
    plain = params()
    with pytest.raises(ConfigError, match=r"validation 0.1 \(now 0.0\)"):
        check_partition_data(plain, load_experiment_data(plain), tmp_path, part)


def test_pretrain_never_uses_validation_rows():
    from tasks.data.pretrain import source_split

    val, plain = params(*VAL), params()
    with_val = source_split(val, load_experiment_data(val))[1]
    without = source_split(plain, load_experiment_data(plain))[1]
    assert np.array_equal(with_val, without)  # the rows outside train_subset, either way
    assert not np.isin(with_val, load_experiment_data(params(*VAL)).val_idx).any()


def test_defaults_add_nothing():
    p = params()
    flat = p.flat()
    assert not any(k in flat for k in ("data.validation", "data.evaluate"))
    assert not any(k.startswith("grid.client_lr") for k in flat)
    data = load_experiment_data(p)
    assert "validation" not in data_selection(p, data)
    assert "validation" not in dataset_card(p, data)
    q = params(*VAL)
    card = dataset_card(q, load_experiment_data(q))
    assert card["train"]["rows_used"] == 1080 and card["validation"]["rows_used"] == 120


# ---- evaluation on the validation split ------------------------------------------------------


def test_evaluation_measures_the_validation_rows(tmp_path):
    from tasks.training.registration import eval_set_sha256, registers
    from tasks.training.train import train_cell
    from tests.helpers import independent_eval

    p = params(*VAL, "data.evaluate=validation")
    data = load_experiment_data(p)
    part = build_partition(p, data)
    cell = build_simulation(cell_of(p, data), data, part)
    assert len(cell.sim.test.labels) == 120
    assert torch.equal(cell.sim.test.labels, data.train.labels[torch.as_tensor(data.val_idx)])
    record = train_cell(cell_of(p, data), data, part, tmp_path)
    assert record["evaluated_on"] == "validation" and record["evaluated_rows"] == 120
    # the final accuracy is the final model's on the validation rows of the train split
    from tasks.data.backbone import model_input

    state = torch.load(tmp_path / "model.pt", weights_only=True)
    train = data.image_data("train", model_input(p, data.train.info))
    acc, _ = independent_eval(cell.model_fn(), state, train, rows=data.val_idx)
    assert record["final_accuracy"] == pytest.approx(acc, abs=1e-12)
    # never registered as if it were a test accuracy; its eval set is not the test set's
    assert not registers(p, data, record)
    test_p = params(*VAL)
    assert eval_set_sha256(p, data) != eval_set_sha256(test_p, load_experiment_data(test_p))
    # evaluate: test keeps the test rows
    test_data = load_experiment_data(test_p)
    plain = build_simulation(cell_of(test_p, test_data), test_data, part)
    assert len(plain.sim.test.labels) == 300


def test_text_datasets_carve_rows_too():
    tweets = ["data.dataset=tweet_sentiment", "model.name=minilm", "data.train_subset=200"]
    p = params(*tweets, "data.test_subset=null", *VAL, "data.evaluate=validation")
    data = load_experiment_data(p)
    assert len(data.val_idx) == 20 and not set(data.val_idx) & set(data.train_idx)
    val = data.image_data("validation")
    assert len(val.labels) == 20
    assert torch.equal(val.labels, data.train.labels[torch.as_tensor(data.val_idx)])


def test_shakespeare_windows_carve_unless_they_overlap():
    from tests.tasks.support import SETS

    p = load_params(None, [*SETS, *VAL])
    data = load_experiment_data(p)
    part = build_partition(p, data)  # natural: one client per role, of the clients' windows
    assert (
        len(data.val_idx) and not np.isin(np.concatenate(part.client_indices), data.val_idx).any()
    )
    overlap = "{vocab_size: 512, layers: 1, hidden: 16, heads: 2, context: 8, stride: 4}"
    with pytest.raises(ConfigError, match=r"^data.validation: shakespeare's windows overlap"):
        load_experiment_data(load_params(None, [*SETS, f"model.options={overlap}", *VAL]))


# ---- grid.client_lr ---------------------------------------------------------------------------

GRID = ["grid.algorithms=[fedavg,fedprox]", "grid.adapters=[full]"]


def test_client_lr_reaches_the_cell_and_only_it():
    p = params(*GRID, "grid.client_lr={fedprox-full: 0.01}")
    data = load_experiment_data(p)
    part = build_partition(p, data)
    prox, avg = cell_of(p, data, "fedprox"), cell_of(p, data, "fedavg")
    assert build_simulation(prox, data, part).sim.schedule.lr == 0.01
    assert build_simulation(avg, data, part).sim.schedule.lr == 0.05  # client.lr
    assert prox.lr == 0.01 and avg.lr == 0.05
    # the schedule applies to it as to client.lr
    step = params(*GRID, "grid.client_lr={fedprox-full: 0.01}", "lr_schedule.kind=step")
    sim = build_simulation(cell_of(step, data, "fedprox"), data, part).sim
    assert sim.schedule.kind == "step" and sim.schedule.lr == 0.01


def test_client_lr_trains_as_client_lr_would(tmp_path):
    """A cell given lr x by grid.client_lr ends with the bytes of the cell run at client.lr x,
    and differs from the one at client.lr: the lr reaches the optimizer."""
    from tasks.training.train import train_cell

    def run(name: str, *extra: str) -> tuple[dict, bytes]:
        p = params(*GRID, *extra)
        data = load_experiment_data(p)
        cell = cell_of(p, data, "fedprox")
        record = train_cell(cell, data, build_partition(p, data), tmp_path / name)
        return record, (tmp_path / name / "model.pt").read_bytes()

    named, named_model = run("named", "grid.client_lr={fedprox-full: 0.001}")
    direct, direct_model = run("direct", "client.lr=0.001")
    default, default_model = run("default")
    assert named_model == direct_model and named_model != default_model
    assert named["client_lr"] == 0.001  # the cell's record carries the lr it used
    assert "client_lr" not in direct and "client_lr" not in default  # {}: records as before
    saved = json.loads((tmp_path / "named" / "metrics.json").read_text())
    assert saved["client_lr"] == 0.001


def test_client_lr_in_the_checkpoint_fingerprint():
    base = params(*GRID)
    tuned = params(*GRID, "grid.client_lr={fedprox-full: 0.01}")
    fp = checkpoint.fingerprint(spec_cell(base, "fedprox", "full"), "h")
    assert fp["client.lr"] == 0.05
    assert checkpoint.fingerprint(spec_cell(tuned, "fedprox", "full"), "h")["client.lr"] == 0.01
    # a cell not named keeps its fingerprint (and so its checkpoint)
    assert checkpoint.fingerprint(
        spec_cell(tuned, "fedavg", "full"), "h"
    ) == checkpoint.fingerprint(spec_cell(base, "fedavg", "full"), "h")


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        (
            "grid.client_lr={fedavg-lora: 0.01}",
            "grid.client_lr: 'fedavg-lora' is not a cell of the grid (<algorithm>-<adapter>); "
            "cells: fedavg-full, fedprox-full",
        ),
        ("grid.client_lr={fedprox-full: 0}", "grid.client_lr.fedprox-full: must be greater than 0"),
        ("grid.client_lr=0.1", "grid.client_lr: "),
        ("data.validation=0.5", "data.validation: must be less than 0.5"),
        ("data.validation=-0.1", "data.validation: must be greater than or equal to 0"),
        ("data.evaluate=val", "data.evaluate: must be 'test' or 'validation'"),
        (
            "data.evaluate=validation",
            "data.evaluate: validation needs a validation split, but data.validation is 0",
        ),
    ],
)
def test_bad_tuning_params_are_one_line(override, needle):
    with pytest.raises(ConfigError) as err:
        params(*GRID, override)
    text = str(err.value)
    assert needle in text and "\n" not in text, text
