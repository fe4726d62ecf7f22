"""A cell's ``model.pt``: the final global model, sized for the disk.

Full fine-tuning (adapter ``full``) trains every entry: ``model.pt`` is the whole state dict
(``fedcore.payload.encode``, readable with ``payload.decode``). A frozen-base cell (every other
adapter) trains only what the engine transmits (``AdapterMethod.payload_keys``: the trainable
parameters and the running statistics of the BatchNorm layers they train); the rest never
changes (``fedcore.engine``: the server merges uploaded keys only). Its ``model.pt`` holds

* ``format``: :data:`FORMAT`;
* ``state``: the trained part (the transmitted entries, in state-dict order);
* ``base``: where the rest comes from (the model, ``model.base``, the adapter, the seed that
  initialised it, the pretrain file's name and sha256 if any) and ``sha256``, the hash of the
  frozen entries (:func:`state_sha256`).

A MiniLM cell's file is then a few MB instead of ~90 MB. :func:`load_state` rebuilds the full
state from a model built as the cell built it (:func:`initial_model`) and refuses, in one line,
a model whose frozen entries hash to another sha256 (another base, options or seed).
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fedcore import payload
from fedcore.errors import ConfigError
from tasks.config import Params
from tasks.data.experiment import ExperimentData

FORMAT = "fedapt.model.trained-part/1"
MODEL_FILE = "model.pt"


def state_sha256(state: Mapping[str, torch.Tensor]) -> str:
    """sha256 of the entries' names, dtypes, shapes and bytes, in the mapping's order
    (independent of torch.save's container)."""
    h = hashlib.sha256()
    for key, value in state.items():
        t = value.detach().to("cpu").contiguous()
        h.update(f"{key}\0{t.dtype}\0{tuple(t.shape)}\0".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def base_reference(params: Params, adapter: str, base_path: str | Path | None) -> dict[str, Any]:
    """Where a cell's frozen base comes from (no paths: the bytes do not depend on where the
    outputs or the pretrain file live)."""
    ref: dict[str, Any] = {
        "model": params.model.name,
        "model.base": params.model.base,
        "adapter": adapter,
        "seed": int(params.experiment.seed),
        "rebuild": "tasks.training.modelfile.initial_model(params, data, adapter, base_path)",
    }
    if base_path is not None:
        base = Path(base_path)
        ref["pretrain_file"] = base.name
        ref["pretrain_sha256"] = hashlib.sha256(base.read_bytes()).hexdigest()
    return ref


def encode(
    state: Mapping[str, torch.Tensor],
    trained: Sequence[str] | None = None,
    base: Mapping[str, Any] | None = None,
) -> bytes:
    """The bytes of ``model.pt``: the whole ``state`` when ``trained`` is None (full
    fine-tuning), else the trained entries and the base's reference and sha256."""
    if trained is None:
        return payload.encode(state)
    keep = set(trained)
    missing = sorted(keep - set(state))
    if missing:
        raise ValueError(f"trained keys not in the state: {', '.join(missing[:4])}")
    frozen = {k: v for k, v in state.items() if k not in keep}
    part = {k: v.detach().to("cpu").contiguous() for k, v in state.items() if k in keep}
    ref = {**(base or {}), "sha256": state_sha256(frozen), "entries": len(frozen)}
    buf = io.BytesIO()
    torch.save({"format": FORMAT, "base": ref, "state": part}, buf)
    return buf.getvalue()


def read(path: str | Path) -> tuple[payload.StateDict, dict[str, Any] | None]:
    """The tensors in ``model.pt`` and its base reference (None: the whole model). A file
    that is neither form: one line naming it."""
    path = Path(path)
    try:
        blob = torch.load(io.BytesIO(path.read_bytes()), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - a torn or foreign file: one line
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError(f"{path} cannot be read as a fedapt model ({first})") from None
    if isinstance(blob, dict) and blob.get("format") == FORMAT:
        return dict(blob["state"]), dict(blob["base"])
    if isinstance(blob, dict) and all(isinstance(v, torch.Tensor) for v in blob.values()):
        return blob, None
    raise ConfigError(f"{path} is not a fedapt model file (a state dict or {FORMAT})")


def load_state(path: str | Path, model: nn.Module) -> payload.StateDict:
    """The full state of the cell's final model: ``model`` (built as the cell built it,
    :func:`initial_model`) supplies the frozen base, checked against the recorded sha256;
    the file supplies the trained part. Mismatching base or keys: one line."""
    state, base = read(path)
    if base is None:
        return state
    own = model.state_dict()
    unknown = sorted(set(state) - set(own))
    if unknown:
        raise ConfigError(
            f"{path}: trained entries not in {type(model).__name__}: {', '.join(unknown[:4])} "
            f"(built for model {base.get('model')!r}, adapter {base.get('adapter')!r})"
        )
    frozen = {k: v for k, v in own.items() if k not in state}
    digest = state_sha256(frozen)
    if digest != base["sha256"]:
        raise ConfigError(
            f"{path}: the base does not match (sha256 {digest[:12]} != {base['sha256'][:12]}); "
            f"build the model as the cell did: model {base.get('model')!r}, model.base "
            f"{base.get('model.base')!r}, adapter {base.get('adapter')!r}, seed {base.get('seed')}"
            + (
                f", pretrain file sha256 {base['pretrain_sha256'][:12]}"
                if "pretrain_sha256" in base
                else ""
            )
        )
    return {k: state[k] if k in state else v for k, v in own.items()}


def load_into(path: str | Path, model: nn.Module) -> nn.Module:
    """``model`` with the full state of ``model.pt`` loaded (see :func:`load_state`)."""
    model.load_state_dict(load_state(path, model))
    return model


def initial_model(
    params: Params, data: ExperimentData, adapter: str, base_path: str | Path | None = None
) -> nn.Module:
    """The cell's initial (adapted) model, as ``tasks.training.cell.build_simulation`` builds it: the
    backbone after seeding torch with the experiment's seed (``fedcore.engine.initial_model``),
    the pretrain base copied in, the adapter injected."""
    from fedcore.engine import FederationConfig
    from fedcore.engine import initial_model as engine_initial
    from tasks.training.cell import model_factory, require_base

    base = require_base(params, base_path)
    fed = FederationConfig(rounds=1, clients_per_round=1, seed=params.experiment.seed)
    return engine_initial(model_factory(params, data, adapter, base), fed)


def load_cell_model(
    params: Params,
    data: ExperimentData,
    adapter: str,
    cell_dir: str | Path,
    base_path: str | Path | None = None,
) -> nn.Module:
    """A cell's final (adapted) model from its folder: :func:`initial_model` with
    ``cell_dir/model.pt`` loaded."""
    return load_into(Path(cell_dir) / MODEL_FILE, initial_model(params, data, adapter, base_path))
