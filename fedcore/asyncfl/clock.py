"""A deterministic virtual clock: each client's device profile, its availability, and the
simulated duration of its jobs and of synchronous rounds. It never reads the wall clock.

A job's duration (simulated seconds) is built from the bytes fedapt already counts, so a
codec or an adapter that shrinks a payload shortens the job::

    download_latency + down_bytes / download_bw + work x speed + upload_latency + up_bytes / upload_bw

(summed in that order). ``work`` is the samples or local steps the job trains on
(``devices.work_unit``), ``speed`` its seconds per unit. Profiles are drawn once per run from
(run seed, client id, quantity), so they depend on nothing else (not on the worker count,
nor on which client was asked first).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedcore.asyncfl.availability import Availability, build_availability
from fedcore.asyncfl.config import DeviceConfig, Distribution, check_deadline, check_devices
from fedcore.errors import ConfigError
from fedcore.sampling import derive_seed

DEVICE_STREAM = 21  # fedcore.sampling's streams: a client's device profile (slot: the quantity)
_Z95 = 1.6448536269514722  # the standard normal's 95th percentile
QUANTITIES = ("speed", "download_bw", "upload_bw", "download_latency_s", "upload_latency_s")


def draw(d: Distribution, seed: int, client: int, slot: int) -> float:
    """Client ``client``'s value of the quantity ``slot`` distributed as ``d``."""
    if d.dist == "constant":
        return float(d.value)  # type: ignore[arg-type]
    if d.dist == "table":
        return float(d.table[client])  # type: ignore[index]
    rng = np.random.default_rng(derive_seed(seed, DEVICE_STREAM, client, slot))
    if d.dist == "uniform":
        lo, hi = float(d.low), float(d.high)  # type: ignore[arg-type]
        return lo + (hi - lo) * float(rng.random())
    sigma = math.log(float(d.spread)) / (2 * _Z95)  # type: ignore[arg-type]
    return float(d.median) * math.exp(sigma * float(rng.standard_normal()))  # type: ignore[arg-type]


@dataclass(frozen=True)
class DeviceProfile:
    """One client's device: seconds per unit of work, bytes/s each way, seconds of latency."""

    speed: float
    download_bw: float
    upload_bw: float
    download_latency_s: float
    upload_latency_s: float

    def job_duration(self, work: float, down_bytes: int, up_bytes: int) -> float:
        """Simulated seconds from the job's dispatch to its upload's arrival."""
        return (
            self.download_latency_s
            + down_bytes / self.download_bw
            + work * self.speed
            + self.upload_latency_s
            + up_bytes / self.upload_bw
        )


@dataclass(frozen=True)
class SyncTiming:
    """One synchronous round on the clock. ``durations``: per sampled client (in the order
    given) its job's simulated seconds, ``math.inf`` for a client offline at the round's
    start (it never receives the job). ``reported``: those that finish (by the deadline);
    ``stragglers``: those that would finish after it (dropped); ``offline``: the rest."""

    start: float
    duration: float
    durations: tuple[float, ...]
    reported: tuple[int, ...]
    stragglers: tuple[int, ...]
    offline: tuple[int, ...]

    @property
    def end(self) -> float:
        return self.start + self.duration


class DeviceClock:
    """Every client's profile and availability for a run (``devices`` settings, run seed)."""

    def __init__(self, devices: DeviceConfig, num_clients: int, seed: int) -> None:
        check_devices(devices, num_clients)
        self.devices, self.num_clients, self.seed = devices, num_clients, seed
        self.profiles = [
            DeviceProfile(
                *(draw(getattr(devices, q), seed, c, i) for i, q in enumerate(QUANTITIES))
            )
            for c in range(num_clients)
        ]
        self.availability: list[Availability] = build_availability(
            devices.availability, num_clients, seed
        )

    def job_duration(self, client: int, work: float, down_bytes: int, up_bytes: int) -> float:
        if work < 0 or down_bytes < 0 or up_bytes < 0:
            raise ValueError(f"client {client}: work and byte counts must be >= 0")
        return self.profiles[client].job_duration(work, down_bytes, up_bytes)

    def online(self, client: int, t: float) -> bool:
        return self.availability[client].online(t)

    def next_online(self, client: int, t: float) -> float:
        """The first time >= t at which ``client`` is online (``math.inf``: never)."""
        return self.availability[client].next_online(t)

    def sync_round(
        self,
        start: float,
        clients: Sequence[int],
        work: Sequence[float],
        down_bytes: Sequence[int],
        up_bytes: Sequence[int],
        deadline_s: float | None = None,
    ) -> SyncTiming:
        """A synchronous round starting at ``start``: it lasts until its slowest reporting
        client's upload arrives, or, with ``deadline_s`` (``federation.deadline_s``), until
        the deadline when a client would finish after it (a straggler, dropped). A client
        offline at ``start`` never receives the job and does not hold the round up."""
        deadline = check_deadline(deadline_s)
        if not len(clients) == len(work) == len(down_bytes) == len(up_bytes):
            raise ValueError("sync_round: one work and byte count per client")
        durations: list[float] = []
        reported: list[int] = []
        stragglers: list[int] = []
        offline: list[int] = []
        for c, w, down, up in zip(clients, work, down_bytes, up_bytes, strict=True):
            if not self.online(c, start):
                durations.append(math.inf)
                offline.append(c)
                continue
            d = self.job_duration(c, w, down, up)
            durations.append(d)
            (stragglers if deadline is not None and d > deadline else reported).append(c)
        finished = [
            d for d in durations if math.isfinite(d) and (deadline is None or d <= deadline)
        ]
        duration = deadline if stragglers else max(finished, default=0.0)
        return SyncTiming(
            start, float(duration or 0.0), tuple(durations), tuple(reported), tuple(stragglers),
            tuple(offline),
        )  # fmt: skip


class SyncClock:
    """The simulated time of a synchronous run: round after round, each starting when the
    last ended (``RoundRecord.extra["sim_time"]``: its end). Checkpointed with the model."""

    def __init__(self, clock: DeviceClock, deadline_s: float | None = None) -> None:
        self.clock, self.deadline_s = clock, check_deadline(deadline_s)
        self.now = 0.0
        self.rounds = 0

    def play(
        self,
        clients: Sequence[int],
        work: Sequence[float],
        down_bytes: Sequence[int],
        up_bytes: Sequence[int],
    ) -> SyncTiming:
        """The next round: its timing; the clock moves to its end."""
        timing = self.clock.sync_round(
            self.now, clients, work, down_bytes, up_bytes, self.deadline_s
        )
        self.now = timing.end
        self.rounds += 1
        return timing

    def state_dict(self) -> dict[str, Any]:
        return {"now": self.now, "rounds": self.rounds}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        now, rounds = float(state["now"]), int(state["rounds"])
        if not (math.isfinite(now) and now >= 0 and rounds >= 0):
            raise ConfigError(f"clock checkpoint is not valid (now={now!r}, rounds={rounds!r})")
        self.now, self.rounds = now, rounds
