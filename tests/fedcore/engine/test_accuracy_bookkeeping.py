"""Accuracy bookkeeping against an independent evaluation (issue 12): the accuracy a run
records equals the accuracy of the model it saved, computed apart from the engine's
evaluation path (the module's own forward after ``load_state_dict``, no ``functional_call``,
no ``fedcore.client.evaluate``, no chunking).

The helpers here are also used by the pipeline, exits, text, personalization and pretrain
tests, wherever a test used to check an accuracy only for being in [0, 1].
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from fedcore.sampling import derive_seed
from tests.fedcore.engine.test_engine import make_sim
from tests.helpers import tiny_cnn, toy_data


@torch.no_grad()
def independent_eval(
    model: nn.Module, state, data, rows=None, batch: int = 256
) -> tuple[float, float]:
    """(accuracy, mean cross-entropy) of ``state`` on ``data[rows]`` (all rows: None)."""
    model.load_state_dict(state)
    model.eval()
    if rows is None:
        idx = torch.arange(len(data))
    else:
        idx = torch.as_tensor(np.asarray(rows, dtype=np.int64))
    correct, loss = 0, 0.0
    for pos in idx.split(batch):
        x, y = data.batch(pos)
        logits = model(x)
        correct += int((logits.argmax(-1) == y).sum())
        loss += float(nn.functional.cross_entropy(logits, y, reduction="sum"))
    return correct / len(idx), loss / len(idx)


def independent_accuracy(model: nn.Module, state, data, rows=None) -> float:
    return independent_eval(model, state, data, rows)[0]


def personal_test_split(data, shard, client: int, severity: int, seed: int, tune_fraction):
    """A client's corrupted data and held-out rows, as fedcore.personalize documents them:
    corruption from derive_seed(seed, stream, c, 0), split from derive_seed(seed, stream, c, 1)."""
    from fedcore.personalize import _STREAM, corrupt

    shard = np.asarray(shard, dtype=np.int64)
    own = corrupt(data, shard, severity, derive_seed(seed, _STREAM, client, 0))
    order = np.random.default_rng(derive_seed(seed, _STREAM, client, 1)).permutation(len(shard))
    n_tune = min(len(shard) - 1, max(1, round(tune_fraction * len(shard))))
    return own, np.sort(order[n_tune:])


@pytest.mark.parametrize("workers", [0, 2])
def test_history_accuracy_is_the_saved_models_accuracy(workers):
    """Evaluated in chunks of 30 (uneven: 100 = 30 + 30 + 20 + 20 split four ways) and, with
    workers, in other processes: the sums still give the model's accuracy and mean loss."""
    shards = np.array_split(np.arange(400), 4)
    test = toy_data(100, seed=1)
    sim = make_sim(shards, rounds=3, m=3, workers=workers, test=test)
    sim.eval_chunk = 30
    hist = sim.run()
    acc, loss = independent_eval(tiny_cnn(), sim.global_state, test)
    assert hist.final_accuracy == pytest.approx(acc, abs=1e-12)
    assert hist.rounds[-1].test_loss == pytest.approx(loss, rel=1e-5)
    assert hist.mean_accuracy_last == pytest.approx(np.mean([r.accuracy for r in hist.rounds]))
    assert 0.5 < acc  # toy task: it learned something, not a constant-class model


def test_every_round_accuracy_is_that_rounds_model():
    from fedcore.events import Callback

    states = []

    class Keep(Callback):
        def on_round_end(self, record):
            states.append({k: v.clone() for k, v in sim.global_state.items()})

    test = toy_data(100, seed=1)
    sim = make_sim(np.array_split(np.arange(400), 2), rounds=3, callbacks=[Keep()], test=test)
    hist = sim.run()
    for rec, state in zip(hist.rounds, states, strict=True):
        assert rec.accuracy == pytest.approx(independent_accuracy(tiny_cnn(), state, test))
