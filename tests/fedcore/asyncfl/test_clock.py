"""The virtual clock: device profiles, job durations by hand, availability, sync rounds."""

from __future__ import annotations

import json
import math

from fedcore.asyncfl.availability import OnOff, Trace
from fedcore.asyncfl.clock import DeviceClock, SyncClock
from fedcore.asyncfl.config import parse_devices
from tests.fedcore.asyncfl.support import THREE

# Three clients with dyadic settings, so every duration below is exact in binary floats.
WORK = [64, 32, 48]  # samples
DOWN = [2**20] * 3  # bytes each client downloads
UP = [2**19] * 3
# latency_down + down/bw_down + work*speed + latency_up + up/bw_up, by hand:
# c0: 0.125 + 1.0 + 1.0 + 0.125 + 1.0 = 3.25
# c1: 0.25  + 0.5 + 1.0 + 0.125 + 0.5 = 2.375
# c2: 0.0625 + 2.0 + 3.0 + 0.25 + 2.0 = 7.3125
DURATIONS = (3.25, 2.375, 7.3125)


def three_clock(**extra: object) -> DeviceClock:
    return DeviceClock(parse_devices({**THREE, **extra}, 3), 3, seed=0)


def test_job_durations_by_hand_and_bytes_shorten_jobs() -> None:
    clock = three_clock()
    got = tuple(clock.job_duration(c, WORK[c], DOWN[c], UP[c]) for c in range(3))
    assert got == DURATIONS
    # a codec that halves the upload saves half of up/bw_up: c2 saves 1.0 s
    assert clock.job_duration(2, 48, 2**20, 2**18) == 6.3125
    # an adapter's smaller download too: c0 with a 1/8 download saves 0.875 s
    assert clock.job_duration(0, 64, 2**17, 2**19) == 2.375


def test_sync_rounds_by_hand_slowest_deadline_offline_and_state() -> None:
    clock = three_clock()
    t = clock.sync_round(0.0, [0, 1, 2], WORK, DOWN, UP)
    assert (t.duration, t.durations, t.reported, t.stragglers) == (7.3125, DURATIONS, (0, 1, 2), ())
    # a deadline of 5 s: client 2 (7.3125 s) straggles, the round lasts the deadline
    t = clock.sync_round(0.0, [0, 1, 2], WORK, DOWN, UP, deadline_s=5.0)
    assert (t.duration, t.reported, t.stragglers) == (5.0, (0, 1), (2,))
    # a deadline nobody misses: the slowest client sets the pace
    t = clock.sync_round(0.0, [1, 0], WORK[1::-1], DOWN[:2], UP[:2], deadline_s=5.0)
    assert (t.duration, t.reported, t.durations) == (3.25, (1, 0), (2.375, 3.25))
    sync = SyncClock(clock, deadline_s=5.0)
    sync.play([0, 1, 2], WORK, DOWN, UP)
    t = sync.play([0, 1], WORK[:2], DOWN[:2], UP[:2])
    assert (t.start, t.end, sync.now, sync.rounds) == (5.0, 8.25, 8.25, 2)
    again = SyncClock(clock, deadline_s=5.0)
    again.load_state_dict(json.loads(json.dumps(sync.state_dict())))  # plain JSON
    assert again.play([1], [32], [2**20], [2**19]).end == 8.25 + 2.375
    # a client offline at the round's start never gets the job and holds nothing up
    daily = {"process": "trace", "per_client": [[[0, 10]], [[0, 10]], [[20, 30]]], "period_s": 40}
    clock = three_clock(availability=daily)
    t = clock.sync_round(0.0, [0, 1, 2], WORK, DOWN, UP)
    assert (t.duration, t.offline, t.durations[2]) == (3.25, (2,), math.inf)
    t = clock.sync_round(25.0, [0, 1, 2], WORK, DOWN, UP)
    assert (t.duration, t.reported, t.offline) == (7.3125, (2,), (0, 1))


def test_profiles_are_drawn_per_client_from_the_seed() -> None:
    devices = {
        "speed": {"dist": "lognormal", "median": 0.01, "spread": 10.0},
        "upload_bw": {"dist": "uniform", "low": 1e5, "high": 2e5},
        "download_bw": {"value": 1e6},
    }
    a = DeviceClock(parse_devices(devices, 400), 400, seed=3)
    b = DeviceClock(parse_devices(devices, 10), 10, seed=3)
    assert a.profiles[:10] == b.profiles  # client c's profile depends on (seed, c) alone
    assert DeviceClock(parse_devices(devices, 10), 10, seed=4).profiles != b.profiles
    speeds = sorted(p.speed for p in a.profiles)
    # median 0.01, 95th / 5th percentile = 10 (sampling error on 400 draws: loose bounds)
    assert 0.008 < speeds[200] < 0.0125
    assert 6 < speeds[380] / speeds[20] < 16
    assert all(1e5 <= p.upload_bw <= 2e5 and p.download_bw == 1e6 for p in a.profiles)
    assert all(p.download_latency_s == 0 and p.upload_bw < math.inf for p in a.profiles)
    # the defaults: instant devices (infinite bandwidth, no latency, no compute time)
    instant = DeviceClock(parse_devices(None, 2), 2, seed=0)
    assert instant.job_duration(1, 1000, 10**9, 10**9) == 0.0


def test_availability_processes() -> None:
    # a daily trace, half-open windows, repeated every period, shifted by an offset
    trace = Trace([(10.0, 20.0), (50.0, 60.0)], period=100.0, offset=0.0)
    assert [trace.online(t) for t in (0, 10, 19.9, 20, 55, 110, 155)] == [
        False, True, True, False, True, True, True,
    ]  # fmt: skip
    assert [trace.next_online(t) for t in (0, 15, 20, 70, 250)] == [10, 15, 50, 110, 250]
    shifted = Trace([(10.0, 20.0)], period=100.0, offset=5.0)  # online at t in [5, 15)
    assert (shifted.online(4.9), shifted.online(5.0), shifted.next_online(20.0)) == (
        False, True, 105.0,
    )  # fmt: skip
    assert Trace([], 100.0, 0.0).next_online(3.0) == math.inf
    # far into a run, base + start rounds before the window opens: the first float online
    odd = Trace([(3.7543834709693957, 2488.088072440465)], 86400.0, 72210.10497867674)
    for t in (4327670.679050534, 1e8 + 0.3, 7.7e8):
        first = odd.next_online(t)
        assert odd.online(first) and not odd.online(math.nextafter(first, 0)) and first >= t
    # on/off: the k-th switch is the same whatever was asked before, and states alternate
    a, b = OnOff(30.0, 10.0, seed=7), OnOff(30.0, 10.0, seed=7)
    late = a.online(1000.0)
    probes = [b.online(t) for t in range(0, 1001, 5)]
    assert probes[-1] == late and a._switches[:5] == b._switches[:5]
    for t in range(0, 1000, 5):
        n = b.next_online(float(t))
        assert n >= t and b.online(n) and (n == t) == b.online(float(t))
    share = sum(probes) / len(probes)
    assert 0.5 < share < 0.95  # about 30 / (30 + 10) of the time online
    always_on = OnOff(30.0, 0.0, seed=1)
    assert always_on.online(1e9) and always_on.next_online(5.0) == 5.0
    # per-client phase offsets are seeded: same seed same clock, every client's window 10 s
    days = {"process": "trace", "windows": [[0, 10]], "period_s": 100, "offset": "uniform"}
    c1 = DeviceClock(parse_devices({"availability": days}, 5), 5, seed=1)
    c2 = DeviceClock(parse_devices({"availability": days}, 5), 5, seed=1)
    grid = [t * 0.5 for t in range(400)]
    on1 = [[c1.online(c, t) for t in grid] for c in range(5)]
    assert on1 == [[c2.online(c, t) for t in grid] for c in range(5)]
    assert all(39 <= sum(row) <= 41 for row in on1)  # 10 s of every 100 s: 20 probes, twice
    assert len({tuple(row) for row in on1}) > 1  # different phases
