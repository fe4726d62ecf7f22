"""Bad settings of the clock and of FedBuff: one line each, naming the key (a ConfigError,
a ValueError). The CLI's own checks (exit code, no traceback) come with the wiring."""

from __future__ import annotations

import math

import pytest

from fedcore.asyncfl.buffer import staleness_weight
from fedcore.asyncfl.clock import DeviceClock
from fedcore.asyncfl.config import (
    ASYNC_ALGORITHMS,
    NOT_ASYNC,
    AsyncConfig,
    check_async_algorithm,
    check_deadline,
    check_mode,
    parse_async,
    parse_devices,
)
from fedcore.asyncfl.fedbuff import FedBuffServer
from fedcore.errors import ConfigError


def one_line(err: pytest.ExceptionInfo[ConfigError], key: str) -> None:
    msg = str(err.value)
    assert isinstance(err.value, ValueError)
    assert "\n" not in msg and key in msg, msg


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ({"concurrency": 0}, "federation.async.concurrency"),
        ({"concurrency": -3, "buffer": 1}, "federation.async.concurrency"),
        ({"concurrency": 11, "buffer": 1}, "federation.async.concurrency"),  # K > clients
        ({"concurrency": 4, "buffer": 5}, "federation.async.buffer"),  # B > K
        ({"concurrency": 4, "buffer": 0}, "federation.async.buffer"),
        ({"concurrency": 4, "buffer": 2, "server_lr": 0.0}, "federation.async.server_lr"),
        ({"concurrency": 4, "buffer": 2, "staleness": "hinge"}, "federation.async.staleness"),
        ({"concurrency": 4, "buffer": 2, "exponent": -1}, "federation.async.exponent"),
        ({"concurrency": "4"}, "federation.async.concurrency"),
        ({"concurency": 4}, "federation.async.concurency"),
    ],
)
def test_bad_async_settings(raw: dict, key: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_async(raw, num_clients=10)
    one_line(err, key)


NEVER = "no client is ever online"


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        # negative speeds
        ({"speed": {"value": -0.5}}, "devices.speed.value"),
        ({"speed": {"dist": "uniform", "low": -1.0, "high": 2.0}}, "devices.speed.low"),
        ({"speed": {"dist": "table", "table": [0.1, -0.1, 0.1]}}, "devices.speed.table"),
        ({"speed": {"dist": "lognormal", "median": -1.0, "spread": 10}}, "devices.speed.median"),
        ({"speed": {"dist": "lognormal", "median": 1.0, "spread": 0.5}}, "devices.speed.spread"),
        # negative or zero bandwidths, negative latencies
        ({"upload_bw": {"value": -1e6}}, "devices.upload_bw.value"),
        ({"download_bw": {"value": 0}}, "devices.download_bw.value"),
        ({"download_bw": {"dist": "table", "table": [1e6, 0, 1e6]}}, "devices.download_bw.table"),
        ({"upload_latency_s": {"value": -0.1}}, "devices.upload_latency_s.value"),
        # malformed distributions
        ({"speed": {"dist": "uniform", "low": 2.0, "high": 1.0}}, "devices.speed.high"),
        ({"speed": {"dist": "lognormal", "median": 1.0}}, "devices.speed.spread"),
        ({"speed": {"dist": "constant", "value": 1, "low": 0}}, "devices.speed.low"),
        ({"speed": {"dist": "table", "table": [0.1, 0.1]}}, "devices.speed.table"),
        ({"speed": {"dist": "gamma"}}, "devices.speed.dist"),
        ({"spead": {"value": 1}}, "devices.spead"),
        # availability traces that never have a client online, and other bad processes
        ({"availability": {"process": "trace", "windows": []}}, NEVER),
        ({"availability": {"process": "trace", "windows": [[5, 5], [9, 9]]}}, NEVER),
        ({"availability": {"process": "trace", "per_client": [[], [], [[3, 3]]]}}, NEVER),
        ({"availability": {"process": "trace", "windows": [[5, 90000]]}}, "devices.availability.windows"),
        ({"availability": {"process": "trace", "per_client": [[[0, 5]]]}}, "devices.availability.per_client"),
        ({"availability": {"process": "trace"}}, "devices.availability"),
        ({"availability": {"process": "onoff", "mean_on_s": 0, "mean_off_s": 5}}, "devices.availability.mean_on_s"),
        ({"availability": {"process": "onoff", "mean_on_s": 5, "mean_off_s": -1}}, "devices.availability.mean_off_s"),
        ({"availability": {"process": "always", "windows": [[0, 5]]}}, "devices.availability.windows"),
    ],
)  # fmt: skip
def test_bad_device_settings(raw: dict, key: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_devices(raw, num_clients=3)
    one_line(err, key)


@pytest.mark.parametrize("value", [0, 0.0, -5.0, math.nan, math.inf, "10", True])
def test_bad_deadline(value: object) -> None:
    with pytest.raises(ConfigError) as err:
        check_deadline(value)  # type: ignore[arg-type]
    one_line(err, "federation.deadline_s")
    clock = DeviceClock(parse_devices(None, 2), 2, seed=0)
    with pytest.raises(ConfigError) as err:
        clock.sync_round(0.0, [0], [1], [1], [1], deadline_s=value)  # type: ignore[arg-type]
    one_line(err, "federation.deadline_s")


def test_bad_mode_staleness_and_server_settings() -> None:
    with pytest.raises(ConfigError) as err:
        check_mode("asynchronous")
    one_line(err, "federation.mode")
    with pytest.raises(ConfigError) as err:
        staleness_weight("linear", 1)
    one_line(err, "federation.async.staleness")
    clock = DeviceClock(parse_devices(None, 3), 3, seed=0)
    for cfg, key in [
        (AsyncConfig(concurrency=0, buffer=0), "federation.async.concurrency"),  # built in code
        (AsyncConfig(concurrency=2, buffer=3), "federation.async.buffer"),
        (AsyncConfig(concurrency=4, buffer=1), "federation.async.concurrency"),
    ]:
        with pytest.raises(ConfigError) as err:
            FedBuffServer(cfg, clock, {}, seed=0)
        one_line(err, key)


def test_algorithms_that_cannot_run_asynchronously() -> None:
    from fedcore.algorithms import ALGORITHMS

    # every registered algorithm is either allowed or refused with a reason
    assert set(ALGORITHMS) == set(ASYNC_ALGORITHMS) | set(NOT_ASYNC)
    for name in ASYNC_ALGORITHMS:
        check_async_algorithm(name)
    for name in [*NOT_ASYNC, "fedsomething"]:
        with pytest.raises(ConfigError) as err:
            check_async_algorithm(name)
        one_line(err, "federation.mode=async")
        assert repr(name) in str(err.value) and "allowed: fedavg, fedir, fedprox" in str(err.value)
