"""Learning-rate schedules over communication rounds (rounds are numbered from 1)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LRSchedule:
    """``constant``; ``step`` (x gamma at each milestone round, seed 000 §IV: 0.1 -> 0.01 at
    round 30); ``exponential`` (seed 004 §6.1.4: eta_t = eta_0 * 0.998**t "depending on the
    round currently elapsing"): round r (1-based) trains at lr * decay**(r - 1), t being the
    rounds elapsed before it. The same section has SGD "start with an initial learning rate of
    0.01", eta_0: the first round trains at eta_0 itself, as a per-round
    ``torch.optim.lr_scheduler.ExponentialLR`` would (t = r would never train at eta_0)."""

    kind: str = "constant"
    lr: float = 0.01
    gamma: float = 0.1
    milestones: tuple[int, ...] = ()
    decay: float = 0.998

    def __post_init__(self) -> None:
        if self.kind not in ("constant", "step", "exponential"):
            raise ValueError(f"unknown schedule {self.kind!r}")

    def at(self, round_: int) -> float:
        if self.kind == "step":
            return self.lr * self.gamma ** sum(round_ >= m for m in self.milestones)
        if self.kind == "exponential":
            return self.lr * self.decay ** (round_ - 1)
        return self.lr
