"""model.pt: a frozen-base cell stores its trained part and its base's reference and sha256;
the loader rebuilds the full state and refuses another base in one line."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedcore import payload
from fedcore.errors import ConfigError
from tasks.training import modelfile


def toy(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Linear(8, 3))
    model[0].requires_grad_(False)  # the frozen base
    return model


TRAINED = ["1.weight", "1.bias", "1.running_mean", "1.running_var", "1.num_batches_tracked"]
TRAINED += ["2.weight", "2.bias"]


def trained_state(seed: int = 0) -> dict[str, torch.Tensor]:
    state = toy(seed).state_dict()
    for k in TRAINED:  # "training" changed every trained entry
        state[k] = state[k] + 1
    return state


def test_frozen_base_stores_the_trained_part_and_rebuilds_the_whole(tmp_path):
    state = trained_state()
    blob = modelfile.encode(state, TRAINED, {"model": "toy", "seed": 0})
    assert blob == modelfile.encode(state, TRAINED, {"model": "toy", "seed": 0})  # deterministic
    path = tmp_path / "model.pt"
    path.write_bytes(blob)
    part, base = modelfile.read(path)
    assert list(part) == TRAINED and base is not None
    assert base["model"] == "toy" and base["entries"] == 2  # 0.weight, 0.bias
    assert base["sha256"] == modelfile.state_sha256({k: state[k] for k in ("0.weight", "0.bias")})
    full = modelfile.load_state(path, toy(0))
    assert list(full) == list(state) and all(torch.equal(full[k], state[k]) for k in state)
    model = modelfile.load_into(path, toy(0))
    assert torch.equal(model.state_dict()["2.bias"], state["2.bias"])


def test_another_base_is_refused_in_one_line(tmp_path):
    path = tmp_path / "model.pt"
    path.write_bytes(modelfile.encode(trained_state(), TRAINED, {"model": "toy", "seed": 0}))
    with pytest.raises(ConfigError, match="the base does not match") as exc:
        modelfile.load_state(path, toy(1))  # another seed: another frozen Linear
    assert "\n" not in str(exc.value) and "seed 0" in str(exc.value)
    with pytest.raises(ConfigError, match="trained entries not in Sequential"):
        modelfile.load_state(path, nn.Sequential(nn.Linear(8, 8)))


def test_full_fine_tuning_stores_the_whole_state_dict(tmp_path):
    state = trained_state()
    path = tmp_path / "model.pt"
    path.write_bytes(modelfile.encode(state))
    assert path.read_bytes() == payload.encode(state)  # unchanged format: payload.decode reads it
    part, base = modelfile.read(path)
    assert base is None and list(part) == list(state)
    assert all(
        torch.equal(a, b)
        for a, b in zip(modelfile.load_state(path, toy(5)).values(), state.values(), strict=True)
    )


def test_a_foreign_file_is_one_line(tmp_path):
    path = tmp_path / "model.pt"
    path.write_bytes(b"not a model")
    with pytest.raises(ConfigError, match="cannot be read as a fedapt model") as exc:
        modelfile.read(path)
    assert "\n" not in str(exc.value)
