"""Events the round loop emits; side effects (MLflow, checkpoints, progress bars) subscribe.

The engine knows nothing about logging: anything that wants to observe a run implements
some of these methods and is passed in ``callbacks`` (nanoGPT / pfl-research style).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


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

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["clients"] = list(self.clients)
        return d


class Callback:
    """No-op base; override what you need."""

    def on_fit_start(self, info: dict[str, Any]) -> None: ...

    def on_round_start(self, round_: int, clients: tuple[int, ...], lr: float) -> None: ...

    def on_client_end(self, record: ClientRecord) -> None: ...

    def on_round_end(self, record: RoundRecord) -> None: ...

    def on_fit_end(self, history: Any) -> None: ...
