"""``fedapt deploy pause|delete`` against the scheduler's race, without a server: a scheduler
iteration that read the deployment as active just before the pause inserts its runs after
the server's pause deleted the earlier ones (seen in CI on a loaded machine, 62 of them).
Those are the schedule's own runs: deleted as the server deletes them, never reported as
runs someone asked for. The real server path is tests/flows/services/test_tools.py."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from prefect.client.schemas.objects import StateType

from flows import deploy


@dataclass
class _Run:
    id: str
    name: str
    auto_scheduled: bool
    state_name: str = "Scheduled"
    run_count: int = 0
    state_type: StateType = StateType.SCHEDULED


class _RacingClient:
    """Answers the listing of not-started runs from a script: each call the next batch."""

    def __init__(self, batches: list[list[_Run]]) -> None:
        self.batches = batches
        self.deleted: list[str] = []
        self.cancelled: list[str] = []

    def read_flow_runs(self, **_: Any) -> list[_Run]:
        live = set(self.deleted) | set(self.cancelled)
        return [r for r in (self.batches.pop(0) if self.batches else []) if r.id not in live]

    def delete_flow_run(self, run_id: str) -> None:
        self.deleted.append(run_id)

    def set_flow_run_state(self, run_id: str, state: Any, force: bool) -> None:
        assert force and state.type.value == "CANCELLED"
        self.cancelled.append(run_id)


def test_runs_the_scheduler_races_in_are_deleted_not_reported(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(deploy, "SETTLE_SECONDS", 0.6)
    due = _Run("d", "by-hand", auto_scheduled=False)
    taken = _Run("t", "a-worker-took-it", auto_scheduled=True, state_name="Pending",
                 state_type=StateType.PENDING)  # fmt: skip
    waiting = _Run(
        "w", "awaiting-a-slot", auto_scheduled=True, state_name="AwaitingConcurrencySlot"
    )
    retried = _Run("r", "retrying", auto_scheduled=True, run_count=1)
    raced = [_Run(f"a{i}", f"auto-{i}", auto_scheduled=True) for i in range(62)]
    client = _RacingClient([[due, taken, waiting, retried], raced[:30], [], raced[30:]])
    names = deploy._cancel_not_started(client, uuid.uuid4(), "paused")
    assert names == ["by-hand", "a-worker-took-it", "awaiting-a-slot", "retrying"]
    assert client.deleted == [r.id for r in raced]  # all 62, the late batch too


def test_a_run_the_server_deleted_first_is_not_an_error(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from prefect.exceptions import ObjectNotFound

    monkeypatch.setattr(deploy, "SETTLE_SECONDS", 0.0)

    class _Gone(_RacingClient):
        def delete_flow_run(self, run_id: str) -> None:
            raise ObjectNotFound(http_exc=Exception("404"))

    client = _Gone([[_Run("a", "auto", auto_scheduled=True)]])
    assert deploy._cancel_not_started(client, uuid.uuid4(), "paused") == []
