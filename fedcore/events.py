"""Events the round loop emits; side effects (MLflow, checkpoints, progress bars) subscribe.

The engine knows nothing about logging: anything that wants to observe a run implements
some of these methods and is passed in ``callbacks`` (nanoGPT / pfl-research style).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class ClientRecord:
    round: int
    client_id: int
    num_samples: int
    num_steps: int
    train_loss: float
    download_bytes: int
    upload_bytes: int
    seconds: float
    accepted: bool = True
    # "reported" (trained and uploaded), "partial" (a straggler's update cut at the deadline),
    # or no upload: "dropped" (failed to report), "straggler" (missed the deadline),
    # "crashed" (its worker process died twice). Only "reported"/"partial" upload bytes.
    status: str = "reported"


@dataclass(frozen=True)
class RoundRecord:
    round: int
    lr: float
    clients: tuple[int, ...]
    download_bytes: int  # this round, all sampled clients
    upload_bytes: int
    cum_download_bytes: int
    cum_upload_bytes: int
    train_loss: float
    accuracy: float | None  # central test top-1 (None on rounds without evaluation)
    test_loss: float | None
    rejected: int
    seconds: float
    extra: dict[str, Any] = field(default_factory=dict)
    # Sampled clients that sent no update (dropout, missed deadline, crashed worker), in
    # sampling order; their downloads are counted, no upload. Left out of to_dict when empty.
    dropped: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "dropped", tuple(int(c) for c in self.dropped))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["clients"] = list(self.clients)
        if self.dropped:
            d["dropped"] = list(self.dropped)
        else:
            del d["dropped"]  # the records of runs without dropout stay as they were
        return d


@dataclass
class History:
    rounds: list[RoundRecord] = field(default_factory=list)
    wall_seconds: float = 0.0
    last_rounds: int = 5
    stop_reason: str = "rounds"  # or the algorithm's budget that ended the run early
    base_bytes: int = 0  # one download of the frozen base (0: the whole model travels)
    base_download_bytes: int = 0  # base_bytes x clients that downloaded it (once each)

    @property
    def evaluated(self) -> list[RoundRecord]:
        return [r for r in self.rounds if r.accuracy is not None]

    @property
    def final_accuracy(self) -> float | None:
        ev = self.evaluated
        return ev[-1].accuracy if ev else None

    @property
    def mean_accuracy_last(self) -> float | None:
        ev = self.evaluated[-self.last_rounds :]
        return float(np.mean([r.accuracy for r in ev])) if ev else None

    @property
    def last_rounds_averaged(self) -> int:
        """The L that ``mean_accuracy_last`` averages: ``last_rounds`` capped by the
        evaluations there are (a 3-round run with last_rounds 5 averages 3). Every record,
        table, figure and MLflow metric names this one number."""
        return min(self.last_rounds, len(self.evaluated))

    @property
    def diverged_at_round(self) -> int | None:
        """The first round where training diverged: every update that reached the server was
        rejected as non-finite, the aggregate was, or the test loss is not finite (None: no
        such round). A round where no client reported is not divergence."""
        for r in self.rounds:
            all_rejected = r.rejected > 0 and not math.isfinite(r.train_loss)
            bad_test = r.test_loss is not None and not math.isfinite(r.test_loss)
            if all_rejected or bad_test or r.extra.get("nonfinite_global_rejected"):
                return r.round
        return None

    @property
    def upload_bytes(self) -> int:
        return self.rounds[-1].cum_upload_bytes if self.rounds else 0

    @property
    def download_bytes(self) -> int:
        return self.rounds[-1].cum_download_bytes if self.rounds else 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "final_accuracy": self.final_accuracy,
            "mean_accuracy_last_L": self.mean_accuracy_last,
            "last_rounds_L": self.last_rounds_averaged,
            "upload_bytes": self.upload_bytes,
            "download_bytes": self.download_bytes,
            "base_bytes": self.base_bytes,
            "base_download_bytes": self.base_download_bytes,
            "wall_seconds": self.wall_seconds,
            "stop_reason": self.stop_reason,
            "diverged_at_round": self.diverged_at_round,
            "rounds": [r.to_dict() for r in self.rounds],
        }


class Callback:
    """No-op base; override what you need."""

    def on_fit_start(self, info: dict[str, Any]) -> None: ...

    def on_round_start(self, round_: int, clients: tuple[int, ...], lr: float) -> None: ...

    def on_client_end(self, record: ClientRecord) -> None: ...

    def on_round_end(self, record: RoundRecord) -> None: ...

    def on_resume(self, history: Any) -> None:
        """A run continued from a checkpoint: ``history.rounds`` are the rounds it restored
        (emitted after ``on_fit_start``, before the first new round)."""

    def on_fit_end(self, history: Any) -> None: ...
