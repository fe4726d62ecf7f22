"""What the tests of early exits share (tests/fedcore/test_exits.py, test_exits_pa.py): the
per-exit accuracies a round reports, checked against the final model's at each exit."""

from __future__ import annotations

import pytest

from tests.helpers import independent_accuracy

DEPTH = 2  # blocks of the tiny BERT and ViT


def assert_exit_accuracies(model, sim, last, test_data, depth: int = DEPTH) -> list[float]:
    """The round's per-exit accuracies are the final model's at each exit (the module's
    forward ending at exit k), evaluated apart from the engine; the last is the round's.
    Returns them."""
    accs = [last.extra[f"test_accuracy_exit_{k}"] for k in range(depth)]
    assert accs[-1] == last.accuracy
    for k, acc in enumerate(accs):
        model.exit_plan.exit = k
        assert acc == pytest.approx(independent_accuracy(model, sim.global_state, test_data)), k
    model.exit_plan.exit = None
    return accs
