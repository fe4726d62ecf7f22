"""When each client is online, in simulated seconds: pure functions of (settings, run seed,
client id), evaluated lazily and never from the wall clock.

A process answers two questions: :meth:`online` at time t, and :meth:`next_online`, the
first time >= t at which the client is online (``math.inf``: never again). Online intervals
are half-open, [start, end): a client is offline at the instant its window closes.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from fedcore.asyncfl.config import AvailabilityConfig
from fedcore.sampling import derive_seed

AVAILABILITY_STREAM = 22  # fedcore.sampling's streams: a client's on/off dwell times, trace phase


class Availability(Protocol):
    def online(self, t: float) -> bool: ...

    def next_online(self, t: float) -> float: ...


class Always:
    def online(self, t: float) -> bool:
        return True

    def next_online(self, t: float) -> float:
        return t


class OnOff:
    """Alternating exponential dwell times (means ``mean_on``, ``mean_off``) from one seeded
    stream, drawn one at a time as the queries reach further: the k-th switch time is the
    same whatever was asked before."""

    def __init__(self, mean_on: float, mean_off: float, seed: int) -> None:
        self.mean_on, self.mean_off = mean_on, mean_off
        self._rng = np.random.default_rng(seed)
        # online at time 0 with the stationary probability
        self.start_online = mean_off == 0 or bool(
            self._rng.random() < mean_on / (mean_on + mean_off)
        )
        self._switches: list[float] = []  # increasing; the state flips at each

    def _extend(self, t: float) -> None:
        if self.mean_off == 0:  # never offline
            return
        while not self._switches or self._switches[-1] <= t:
            n = len(self._switches)
            last = self._switches[-1] if n else 0.0
            on_now = self.start_online == (n % 2 == 0)  # the state before switch n
            self._switches.append(
                last + float(self._rng.exponential(self.mean_on if on_now else self.mean_off))
            )

    def online(self, t: float) -> bool:
        self._extend(t)
        flips = bisect.bisect_right(self._switches, t)
        return self.start_online == (flips % 2 == 0)

    def next_online(self, t: float) -> float:
        if self.online(t):
            return t
        return self._switches[bisect.bisect_right(self._switches, t)]  # the next flip: on


class Trace:
    """Online in ``windows`` ([start, end) in [0, period)), repeated every ``period``,
    shifted by ``offset``: online at t when (t + offset) mod period is in a window."""

    def __init__(
        self, windows: Sequence[tuple[float, float]], period: float, offset: float
    ) -> None:
        self.windows = sorted((float(s), float(e)) for s, e in windows if e > s)
        self.period, self.offset = float(period), float(offset)

    def _phase(self, t: float) -> tuple[float, float]:
        """(the start of t's period, t's phase in it)."""
        shifted = t + self.offset
        k = math.floor(shifted / self.period)
        return k * self.period - self.offset, shifted - k * self.period

    def online(self, t: float) -> bool:
        _, phase = self._phase(t)
        return any(s <= phase < e for s, e in self.windows)

    def next_online(self, t: float) -> float:
        if not self.windows:
            return math.inf
        if self.online(t):
            return t
        base, phase = self._phase(t)
        later = [s for s, _ in self.windows if s > phase]
        start = base + later[0] if later else base + self.period + self.windows[0][0]
        # base + s rounds: the float may fall a few ulps before the window opens; the first
        # float at which online() holds (the server waits until then, never in a loop)
        for _ in range(4096):
            if self.online(start):
                return start
            start = math.nextafter(start, math.inf)
        raise RuntimeError(f"trace window at {start} does not open (period {self.period})")


def build_availability(cfg: AvailabilityConfig, num_clients: int, seed: int) -> list[Availability]:
    """One process per client (settings checked by ``config.check_availability``)."""
    out: list[Availability] = []
    for c in range(num_clients):
        if cfg.process == "onoff":
            on, off = float(cfg.mean_on_s or 0.0), float(cfg.mean_off_s or 0.0)
            out.append(OnOff(on, off, derive_seed(seed, AVAILABILITY_STREAM, c, 0)))
        elif cfg.process == "trace":
            windows = cfg.windows if cfg.windows is not None else (cfg.per_client or ())[c]
            offset = 0.0
            if cfg.offset == "uniform":
                rng = np.random.default_rng(derive_seed(seed, AVAILABILITY_STREAM, c, 1))
                offset = float(rng.random()) * cfg.period_s
            out.append(Trace(windows, cfg.period_s, offset))
        else:
            out.append(Always())
    return out
