"""FedBuff's events: jobs, their results, and the queue of arrivals in simulated time.

The queue orders arrivals by (time, a seeded key of (run seed, client, job id), job id): a
total order that is a function of the events alone, never of the order they were pushed in.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from fedcore.payload import StateDict
from fedcore.sampling import derive_seed

TIE_STREAM = 24  # fedcore.sampling's streams: the order of arrivals at the same simulated time


@dataclass(frozen=True)
class Job:
    """One client's job: trained from model ``base_version``, dispatched at ``dispatched_at``
    (simulated seconds). ``job_id`` counts dispatches from 0: the engine derives the client's
    seeds from it, as it derives them from the round in a synchronous run."""

    job_id: int
    client_id: int
    base_version: int
    dispatched_at: float


class JobResult(NamedTuple):
    """What a trained job sends back: the client's trained tensors (what
    ``ClientUpdate.state`` holds: a subset of the model's keys, the same for every job), the
    samples it trained on (FedAvg's n_k), the bytes of its upload and download, its ``work``
    for the clock (samples or steps, ``devices.work_unit``; None: ``num_samples``)."""

    update: StateDict
    num_samples: int
    up_bytes: int
    down_bytes: int
    work: float | None = None
    train_loss: float = math.nan
    finite: bool = True  # False: the server rejects it (a NaN/Inf upload frees its slot only)


class JobPlan(NamedTuple):
    """What the clock needs of a job, known before it trains: its work and its bytes (the
    engine knows them from the task's planned steps and the payloads' structure,
    ``fedcore.payload.encoded_size``). The trained result must match it."""

    work: float
    down_bytes: int
    up_bytes: int


Trainer = Callable[[int, int, StateDict], JobResult]
Planner = Callable[[Job], JobPlan]
BatchTrainer = Callable[[Sequence[Job], StateDict], Sequence[JobResult]]


def one_by_one(train: Trainer) -> BatchTrainer:
    """A batch trainer that calls ``train(client_id, base_version, base_state)`` per job."""

    def batch(jobs: Sequence[Job], base: StateDict) -> list[JobResult]:
        return [train(j.client_id, j.base_version, base) for j in jobs]

    return batch


@dataclass(frozen=True)
class Entry:
    """A job with its result: in the event queue (``time``: its arrival) or in the buffer.
    A planned job waits in the queue untrained (``result`` None) until it is trained with
    the other untrained jobs (``plan``: what its arrival time was computed from)."""

    time: float
    job: Job
    result: JobResult | None
    plan: JobPlan | None = None

    @property
    def trained(self) -> JobResult:
        assert self.result is not None, f"job {self.job.job_id} has not trained"
        return self.result


class EventQueue:
    """Arrivals by (time, seeded tie key of (seed, client, job), job id): the order is a
    function of the events alone, never of the order they were pushed in."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._heap: list[tuple[float, int, int]] = []
        self._entries: dict[int, Entry] = {}

    def key(self, e: Entry) -> tuple[float, int, int]:
        return (
            e.time,
            derive_seed(self.seed, TIE_STREAM, e.job.client_id, e.job.job_id),
            e.job.job_id,
        )

    def push(self, e: Entry) -> None:
        if e.job.job_id in self._entries:
            raise ValueError(f"job {e.job.job_id} is already queued")
        self._entries[e.job.job_id] = e
        heapq.heappush(self._heap, self.key(e))

    def fill(self, e: Entry) -> None:
        """Replace queued job ``e.job``'s entry (its result, once trained)."""
        if self._entries.get(e.job.job_id, e).time != e.time:
            raise ValueError(f"job {e.job.job_id} is not queued at {e.time}")
        self._entries[e.job.job_id] = e

    def next_time(self) -> float:
        return self._heap[0][0] if self._heap else math.inf

    def pop_at(self, t: float) -> list[Entry]:
        """Every arrival at time ``t`` (the earliest), in tie order."""
        out = []
        while self._heap and self._heap[0][0] == t:
            out.append(self._entries.pop(heapq.heappop(self._heap)[2]))
        return out

    def entries(self) -> list[Entry]:
        """The queued arrivals in the order they will be processed."""
        return [self._entries[k[2]] for k in sorted(self._heap)]

    def __len__(self) -> int:
        return len(self._heap)
