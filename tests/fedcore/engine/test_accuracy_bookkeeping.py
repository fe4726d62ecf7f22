"""Accuracy bookkeeping against an independent evaluation (issue 12): the accuracy a run
records equals the accuracy of the model it saved, computed apart from the engine's
evaluation path (the module's own forward after ``load_state_dict``, no ``functional_call``,
no ``fedcore.client.evaluate``, no chunking).

The helpers (``independent_eval``, ``independent_accuracy``, ``personal_test_split``, in
tests/helpers.py) are also used by the pipeline, exits, text, personalization and pretrain
tests, wherever a test used to check an accuracy only for being in [0, 1].
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers import (
    independent_accuracy,
    independent_eval,
    make_sim,
    tiny_cnn,
    toy_data,
)


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
