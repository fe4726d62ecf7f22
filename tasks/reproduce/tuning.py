"""How a claim's experiment tunes its lr (``Experiment.tune``): the overrides of each tuning
run (seed 0, the validation share held out and evaluated, every cell at one lr of the grid) and
of the experiment once the best lr per cell is known. Like the seeds, every method is tuned by
the same procedure, on a validation split carved from the training data, never the test set."""

from __future__ import annotations

import json
from collections.abc import Sequence

from tasks.reproduce.spec import Tune


def server_optimisers(algorithms: Sequence[str]) -> list[str]:
    """The algorithms of ``algorithms`` with a server lr (FedOpt's)."""
    from fedcore.algorithms import ALGORITHMS

    return [a for a in algorithms if hasattr(ALGORITHMS[a], "server_lr")]


def tuning_sets(tune: Tune, lr: float, algorithms: Sequence[str]) -> list[str]:
    """A tuning run's overrides: seed 0 alone, the validation share held out and evaluated,
    every cell at ``lr`` (the client lr, or the server lr of the grid's server optimisers,
    which then make the tuning run's grid)."""
    sets = [
        "experiment.seeds=null",
        "experiment.seed=0",
        f"data.validation={tune.validation}",
        "data.evaluate=validation",
    ]
    if tune.key == "server_lr":
        algs = server_optimisers(algorithms)
        sets.append(f"grid.algorithms=[{','.join(algs)}]")
        return sets + [f"grid.algorithm_options.{a}.server_lr={lr}" for a in algs]
    return [*sets, f"client.lr={lr}", "grid.client_lr={}"]


def chosen_sets(tune: Tune, lrs: dict[str, float]) -> list[str]:
    """The experiment's overrides for the chosen lr of each cell (``lrs``)."""
    if not lrs:
        return []
    if tune.key == "server_lr":
        return [
            f"grid.algorithm_options.{cell.split('-', 1)[0]}.server_lr={lr}"
            for cell, lr in lrs.items()
        ]
    return [f"grid.client_lr={json.dumps(lrs)}"]
