"""Registering a cell's model: whether it registers (``tracking.register``) and what is
registered: the merged model taking inputs as stored, an input example and the tags that
name its evaluation set. The MLflow registry itself (versions, the ``champion`` and
``challenger`` aliases) is ``tasks.tracking.registry``'s."""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import torch
from rich.console import Console
from torch import nn

from models.serving import ImageServing
from tasks import tracking
from tasks.config import Params
from tasks.data.backbone import model_input
from tasks.data.experiment import ExperimentData
from tasks.grid import record_cell
from tasks.results.origin import Origin

_err = Console(stderr=True)


def eval_set_sha256(params: Params, data: ExperimentData) -> str:
    """Which rows the final accuracy was measured on: the dataset, the split's size, the
    selected row indices and their labels (equal hashes: comparable accuracies). Test rows,
    or (data.evaluate: validation) the validation rows of the train split."""
    evaluate = params.data.evaluate
    split, rows = (data.test, data.test_idx) if evaluate == "test" else data.eval_rows(evaluate)
    idx = np.ascontiguousarray(rows, dtype=np.int64)
    labels = np.asarray(split.labels)[idx].astype(np.int64)
    tag = "" if evaluate == "test" else f"{evaluate}:"
    h = hashlib.sha256(f"{params.data.dataset}:{tag}{len(split)}:".encode())
    h.update(idx.tobytes())
    h.update(labels.tobytes())
    return h.hexdigest()


def registers(
    params: Params,
    data: ExperimentData,
    record: dict[str, Any],
    run_origin: Origin | None = None,
    *,
    label: str | None = None,
) -> bool:
    """``tracking.register``: auto registers (and so may move ``challenger`` and ``champion``)
    a model evaluated on the whole test split that did not diverge and is not a smoke run
    (fewer rounds or training rows than its params file, or inside ``dvc exp run``:
    ``tasks.results.origin``); a run on data.test_subset or evaluated on the validation split
    (data.evaluate) is tracked, not registered. ``label``: a
    smoke run that would otherwise register says why it did not, in one line."""
    rule = params.tracking.register
    if rule == "never" or record.get("final_accuracy") is None:
        return False
    if rule == "always":
        return True
    whole = params.data.evaluate == "test" and len(data.test_idx) == len(data.test)
    if not (whole and record.get("diverged_at_round") is None):
        return False
    smoke = run_origin.smoke if run_origin is not None else ()
    if smoke and label is not None:
        _err.print(
            f"{label}: not registered: a smoke run ({'; '.join(smoke)}); "
            "--set tracking.register=always registers it",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
    return not smoke


def register_model(
    params: Params,
    data: ExperimentData,
    adapter: str,
    model: nn.Module,
    run_id: str,
    record: dict[str, Any],
) -> dict[str, str]:
    """Register the cell's final model: the merged plain model (adapters folded into the
    backbone) where the method allows it, else the adapted model, taking inputs as stored."""
    method = params.grid.adapter(adapter)
    model = method.merge(model) or model
    reg = tracking.registered_name(params.data.dataset, params.model.name, adapter)
    if data.tokenizer is not None:  # token ids (2, max_length)
        example = data.text_example()
    else:  # images as stored (pixel/255); the model resizes and normalises them
        model = ImageServing(model, model_input(params, data.train.info))
        example = torch.zeros(2, *data.train.info.input_shape)
    tags = {
        tracking.EVAL_SET_TAG: eval_set_sha256(params, data),
        "eval_set_rows": str(len(data.eval_rows(params.data.evaluate)[1])),
        "experiment": params.experiment.name,
        "cell": record_cell(record),
        "partition": record["partition"],
        **{k: v for k, v in tracking.provenance_tags().items() if k == "git_commit"},
    }
    version = tracking.log_and_register_model(
        run_id, model, example, reg, record["final_accuracy"], tags
    )
    return {"registered_model": reg, "model_version": version}
