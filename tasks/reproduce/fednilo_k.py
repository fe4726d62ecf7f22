"""FedNILO's K and F under a scaled profile, by seed 004's rule (§6.1.4): K is a share of
the rounds FedAvg needs to reach its target accuracy, read off the finished FedAvg
experiment's records; F keeps the seed's F/K ratio. One FedNILO experiment per (K, F) pair
of the seed's tables (``configs``), for ``claim_fednilo`` and ``claim_fednilo_iid``."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from functools import partial

from fedcore.commcost import ACC_WINDOW, first_reach, windowed
from tasks.reproduce.measures import param
from tasks.reproduce.spec import Cell, Experiment, Results

_OPT = "grid.algorithm_options.fednilo"


def half_up(x: float) -> int:
    return math.floor(x + 0.5)


def rounds_to_top(cell: Cell, window: int) -> int | None:
    """The round at which FedAvg first reaches its target accuracy: its top ACC level (its
    best ACC, the mean of the last ``window`` evaluated rounds, rounded down to half a point:
    the top level of Tables 6.4-6.7). None without an evaluated round."""
    acc = windowed(cell.rounds, window)
    best = max((p.accuracy for p in acc if p.accuracy is not None), default=None)
    if best is None:
        return None
    hit = first_reach(acc, math.floor(best * 200) / 200)  # best rounded down to half a point
    return None if hit is None else hit.round


def kick_off(results: Results, fedavg: str, share: float, f_per_k: float) -> tuple[str, ...]:
    """K and F of a FedNILO configuration by seed 004's rule (§6.1.4), read off the finished
    FedAvg experiment ``fedavg`` (every seed): K is ``share`` (1/3 or 1/2) of the rounds
    FedAvg needs to reach its target accuracy (:func:`rounds_to_top`; the median over the
    seeds, one K for the whole sweep), at least 1; F keeps the seed's pair's F/K ratio
    (``f_per_k``: 25/350, 75/500), at least 1. Pure: ``Experiment.derive``'s function."""
    if fedavg not in results:
        raise ValueError(f"FedNILO's K is read off {fedavg!r}, which has not finished")
    res = results[fedavg]
    window = int(param(res.params, "report.window", ACC_WINDOW))
    needed = [
        r
        for s in res.seeds
        if (c := res.runs[s].get("fedavg-full")) is not None
        and (r := rounds_to_top(c, window)) is not None
    ]
    if not needed:
        raise ValueError(f"{fedavg!r} has no evaluated round: FedNILO's K cannot be derived")
    k = max(1, half_up(share * statistics.median(needed)))
    f = max(1, half_up(f_per_k * k))
    return (f"{_OPT}.K={k}", f"{_OPT}.F={f}")


def configs(
    prefix: str,
    protocol: tuple[str, ...],
    pairs: Mapping[tuple[int, int], Mapping[str, float]],
    cpu: tuple[str, ...],
    ci: tuple[str, ...],
    fedavg: str,
) -> tuple[Experiment, ...]:
    """One FedNILO experiment ``<prefix>-k<K>f<F>`` per (K, F) pair of the seed's tables: gpu
    runs it at the seed's K and F; each scaled profile of ``pairs[(K, F)]`` derives its K
    and F from ``fedavg``'s records (:func:`kick_off`) and waits for it. The comm budget is
    the seed's 1000 CR, which no run reaches."""
    out = []
    for (k, f), shares in pairs.items():
        scale = {p: base for p, base in (("cpu", cpu), ("ci", ci)) if p in shares}
        derive = {
            p: partial(kick_off, fedavg=fedavg, share=share, f_per_k=f / k)
            for p, share in shares.items()
        }
        out.append(
            Experiment(
                f"{prefix}-k{k}f{f}",
                protocol=(
                    *protocol,
                    "grid.algorithms=[fednilo]",
                    f"{_OPT}.K={k}",
                    f"{_OPT}.F={f}",
                    f"{_OPT}.comm_budget_cr=1000",
                ),
                scale=scale,
                profiles=("gpu", *shares),
                after=(fedavg,) if derive else (),
                derive=derive,
            )
        )
    return tuple(out)
