"""What the reproduce tests share: hand-made finished cells and experiments (a cell from its
accuracies, or from a curve of them), a claim's verdict on one seed or over seeds, the
transformer claim's results, and the adapters claim (its lr untuned) planned and finished in a
temporary folder."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from tasks.reproduce import claim_adapters, claim_transformer, runs
from tasks.reproduce.spec import Cell, Claim, ExperimentResult, Verdict
from tasks.reproduce.verdict import combine

REPO = Path(__file__).resolve().parents[3]
MB = 2**20


def cell(acc=0.5, accs=None, per_round=MB, seconds=1.0, exits=None):
    """A finished cell: ``accs`` per round (fractions), ``per_round`` bytes each way."""
    accs = [acc] if accs is None else accs
    rounds = [
        {
            "round": i + 1,
            "accuracy": a,
            "cum_upload_bytes": per_round * (i + 1),
            "cum_download_bytes": per_round * (i + 1),
        }
        for i, a in enumerate(accs)
    ]
    record = {
        "final_accuracy": accs[-1],
        "upload_bytes_per_round": per_round,
        "download_bytes_per_round": per_round,
        "upload_bytes": per_round * len(accs),
        "download_bytes": per_round * len(accs),
        "local_train_seconds_mean": seconds,
        "final_accuracy_exits": exits or [],
    }
    return Cell(record, rounds)


def exp(cells, majority=None, **params):
    return ExperimentResult(params, {0: cells}, 60.0, {0: majority})


def transformer(adapter_acc, head_acc, share=0.01):
    full = exp({"fedavg-full": cell(0.62, per_round=100 * MB)})
    cells = {
        f"fedavg-{m}": cell(adapter_acc, per_round=int(100 * MB * share))
        for m in claim_transformer.METHODS
    }
    cells["fedavg-head"] = cell(head_acc, per_round=MB // 100)
    return {"transformer-full": full, "transformer-adapters": exp(cells)}


# ---- the rules' records (seed 002 on): curves over rounds, over seeds -----------------------

PRIOR = 0.1  # the class prior: where a random initialisation starts
JITTER = (0.0, 1.0, -1.0, 0.5, -0.5)  # a zero-mean pattern of round-to-round jumps (points)


def curve_cell(accs: Sequence[float], per_round: int = MB) -> Cell:
    """A finished cell whose per-round test accuracies are ``accs`` (fractions)."""
    return cell(accs=list(accs), per_round=per_round)


def prior_exp(
    cells: Mapping[str, Cell], majority: float | None = PRIOR, **params
) -> ExperimentResult:
    """One seed's finished experiment (its params flat, as summary.json's), its majority
    class at the class prior unless said."""
    return ExperimentResult(params, {0: cells}, 60.0, {0: majority})


def curve(
    end: float, conv: int, rounds: int, start: float = 0.3, jitter: float = 0.0, phase: int = 0
) -> list[float]:
    """Accuracy rising linearly from ``start`` to ``end`` at round ``conv``, then flat, with
    round-to-round jumps of up to ``jitter`` points (a zero-mean pattern shifted by
    ``phase``: each seed its own)."""
    return [
        start + (end - start) * min(1.0, r / conv) + jitter / 100 * JITTER[(r + phase) % 5]
        for r in range(1, rounds + 1)
    ]


def over_seeds(claim: Claim, per_seed: Sequence[Mapping[str, ExperimentResult]]) -> Verdict:
    """The verdict over the seeds whose one-seed results are ``per_seed`` (seed 0, 1, ...)."""
    readings = [(s, claim.measure(r)) for s, r in enumerate(per_seed)]
    return combine(claim, readings, min_seeds=3)


def judge(claim: Claim, results: Mapping[str, ExperimentResult]) -> Verdict:
    """One seed alone (an interval of zero width: its value)."""
    return combine(claim, [(0, claim.measure(results))], min_seeds=1)


# ---- the adapters claim, planned and finished by hand ----------------------------------------

# the adapters claim without the ci profile's lr tuning: one experiment
UNTUNED = dataclasses.replace(
    claim_adapters.CLAIM, experiments=(dataclasses.replace(claim_adapters.DIR05, tune={}),)
)


def plan_adapters(tmp_path):
    (it,) = runs.plan(
        [UNTUNED],
        "ci",
        REPO / "params.yaml",
        [f"experiment.reports_dir={tmp_path / 'reports'}"],
        tmp_path / "out",
    )
    return it


def finish(it, seeds=(0, 1), **changed):
    """A finished seed sweep in the experiment's folder, as the experiment flow leaves it."""
    flat = {**it.params.flat(), **changed}
    sweep = {"experiment": "x", "params": flat, "seeds": list(seeds), "runs": []}
    for s in seeds:
        d = it.dir / f"seed-{s}"
        (d / "runs" / "fedavg-full").mkdir(parents=True, exist_ok=True)
        (d / "partition").mkdir(exist_ok=True)
        (d / "partition" / "stats.json").write_text(json.dumps({"label_totals": [13, 4, 3]}))
        if s == 0:  # seed 0 fine-tuned a pretrained base (its card); seed 1 started from none
            (d / "pretrain").mkdir(exist_ok=True)
            card = {"used": True, "final_test_accuracy": 0.42}
            (d / "pretrain" / "base.json").write_text(json.dumps(card))
        rounds = [{"round": 1, "accuracy": 0.5 + s / 10}]
        (d / "runs" / "fedavg-full" / "metrics.json").write_text(json.dumps({"rounds": rounds}))
        sweep["runs"].append({"algorithm": "fedavg", "adapter": "full", "seed": s})
    (it.dir / "summary.json").write_text(json.dumps(sweep))
