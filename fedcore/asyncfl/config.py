"""The settings of asynchronous federations and simulated devices, validated in one place.

Proposed ``params.yaml`` keys (parsed with :func:`fedcore.options.parse`, so an unknown key or
a value of the wrong type gets fedapt's one error line):

* ``federation.mode``: ``sync`` (today's rounds) or ``async`` (FedBuff, ``fedbuff.py``);
* ``federation.deadline_s``: a synchronous round's deadline in simulated seconds (None: the
  round lasts until its slowest client reports);
* ``federation.async``: :class:`AsyncConfig` (K, B, the staleness weight, the server lr);
* ``devices``: :class:`DeviceConfig` (compute speed, bandwidths, latencies, availability).

Checks across keys (B <= K, a distribution's parameters, a trace with an online window) are
:func:`check_devices`, :func:`check_async` and :func:`check_deadline`: each raises a one-line
``ConfigError`` (a ``ValueError``) that names the key and the allowed values.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import Field

from fedcore.errors import ConfigError
from fedcore.options import FORBID_EXTRA, Float, Int, parse

PositiveInt = Annotated[Int, Field(ge=1)]
# a bandwidth may be infinite (YAML ``.inf``): that transfer takes no time
Number = Annotated[float, Field(strict=True, allow_inf_nan=True)]

MODES = ("sync", "async")
DAY_S = 86_400.0


@dataclass(frozen=True)
class Distribution:
    """One per-client quantity, drawn once per run from (run seed, client id):

    * ``constant``: ``value`` for every client;
    * ``uniform``: uniform in [``low``, ``high``];
    * ``lognormal``: ``median`` x exp(sigma z), z standard normal, with sigma such that the
      95th percentile is ``spread`` times the 5th (sigma = ln(spread) / (2 x 1.645));
    * ``table``: ``table[c]`` for client c (one value per client).
    """

    __pydantic_config__ = FORBID_EXTRA
    dist: Literal["constant", "uniform", "lognormal", "table"] = "constant"
    value: Number | None = None
    low: Number | None = None
    high: Number | None = None
    median: Number | None = None
    spread: Number | None = None
    table: tuple[Number, ...] | None = None


@dataclass(frozen=True)
class AvailabilityConfig:
    """When a client is online, in simulated seconds since the run started:

    * ``always``: always online;
    * ``onoff``: alternating online and offline dwell times, exponential with means
      ``mean_on_s`` and ``mean_off_s`` (a two-state Markov process); the state at time 0 is
      drawn from its stationary law (online with mean_on / (mean_on + mean_off));
    * ``trace``: online in the ``windows`` ([start_s, end_s) within ``period_s``, repeated
      every period: a daily trace), the same for every client or one list per client
      (``per_client``); ``offset: uniform`` shifts each client's trace by a seeded phase in
      [0, period_s) (time zones).
    """

    __pydantic_config__ = FORBID_EXTRA
    process: Literal["always", "onoff", "trace"] = "always"
    mean_on_s: Number | None = None
    mean_off_s: Number | None = None
    windows: tuple[tuple[Number, Number], ...] | None = None
    per_client: tuple[tuple[tuple[Number, Number], ...], ...] | None = None
    period_s: Number = DAY_S
    offset: Literal["none", "uniform"] = "none"


def _zero() -> Distribution:
    return Distribution(value=0.0)


def _infinite() -> Distribution:
    return Distribution(value=math.inf)


@dataclass(frozen=True)
class DeviceConfig:
    """``devices``: each client's device profile (``clock.DeviceProfile``). ``speed`` is in
    seconds per ``work_unit`` (a sample or a local step), bandwidths in bytes per second,
    latencies in seconds. The defaults: instant devices, always online."""

    __pydantic_config__ = FORBID_EXTRA
    speed: Distribution = field(default_factory=_zero)
    work_unit: Literal["sample", "step"] = "sample"
    download_bw: Distribution = field(default_factory=_infinite)
    upload_bw: Distribution = field(default_factory=_infinite)
    download_latency_s: Distribution = field(default_factory=_zero)
    upload_latency_s: Distribution = field(default_factory=_zero)
    availability: AvailabilityConfig = field(default_factory=AvailabilityConfig)


STALENESS = ("constant", "inverse_sqrt", "polynomial")


@dataclass(frozen=True)
class AsyncConfig:
    """``federation.async``: FedBuff (Nguyen et al. 2022, Algorithm 1).

    ``concurrency`` K clients train at once; every ``buffer`` B arrived updates the server
    steps by ``server_lr`` x the buffer's weighted mean delta, each delta weighted by
    ``staleness`` s(tau) of its staleness tau: ``constant`` 1, ``inverse_sqrt``
    1 / sqrt(1 + tau) (the paper's choice), ``polynomial`` (1 + tau)^-``exponent`` (FedAsync,
    Xie et al. 2019). ``weighting``: the buffer's mean weights clients by their samples
    (``samples``, FedAvg's n_k) or equally (``uniform``, the paper's 1/B).
    """

    __pydantic_config__ = FORBID_EXTRA
    concurrency: PositiveInt = 8
    buffer: PositiveInt = 4
    staleness: Literal["constant", "inverse_sqrt", "polynomial"] = "inverse_sqrt"
    exponent: Annotated[Float, Field(ge=0.0)] = 0.5
    server_lr: Annotated[Float, Field(gt=0.0)] = 1.0
    weighting: Literal["samples", "uniform"] = "samples"


# ---- parsing and the checks across keys ----------------------------------------------------


def parse_devices(raw: Mapping[str, Any] | DeviceConfig | None, num_clients: int) -> DeviceConfig:
    """``devices`` validated (types by pydantic, then :func:`check_devices`)."""
    cfg = parse(DeviceConfig, raw, "devices")
    check_devices(cfg, num_clients)
    return cfg


def parse_async(raw: Mapping[str, Any] | AsyncConfig | None, num_clients: int) -> AsyncConfig:
    """``federation.async`` validated (types by pydantic, then :func:`check_async`)."""
    cfg = parse(AsyncConfig, raw, "federation.async")
    check_async(cfg, num_clients)
    return cfg


def check_mode(mode: object) -> str:
    if mode not in MODES:
        raise ConfigError(f"federation.mode must be one of {', '.join(MODES)} (got {mode!r})")
    return str(mode)


def check_deadline(deadline_s: float | None) -> float | None:
    """``federation.deadline_s``: None (no deadline) or a finite number of seconds > 0."""
    if deadline_s is None:
        return None
    if isinstance(deadline_s, bool) or not isinstance(deadline_s, int | float):
        raise ConfigError(
            f"federation.deadline_s must be a number > 0 or null (got {deadline_s!r})"
        )
    if not (math.isfinite(deadline_s) and deadline_s > 0):
        raise ConfigError(
            f"federation.deadline_s must be > 0 and finite, or null (got {deadline_s!r})"
        )
    return float(deadline_s)


def check_async(cfg: AsyncConfig, num_clients: int) -> None:
    k, b = cfg.concurrency, cfg.buffer
    if k < 1:  # pydantic checks it for parsed settings; a dataclass built in code too
        raise ConfigError(f"federation.async.concurrency must be >= 1 (got {k})")
    if k > num_clients:
        raise ConfigError(
            f"federation.async.concurrency must be <= the number of clients {num_clients} "
            f"(got {k}): a client trains one job at a time"
        )
    if not 1 <= b <= k:
        raise ConfigError(
            f"federation.async.buffer must be in [1, federation.async.concurrency={k}] (got {b})"
        )
    if not cfg.server_lr > 0 or not math.isfinite(cfg.server_lr):
        raise ConfigError(f"federation.async.server_lr must be > 0 (got {cfg.server_lr})")
    if not cfg.exponent >= 0 or not math.isfinite(cfg.exponent):
        raise ConfigError(f"federation.async.exponent must be >= 0 (got {cfg.exponent})")


# (key, smallest allowed value, whether that value itself is allowed, infinity allowed)
_BOUNDS = {
    "speed": (0.0, True, False),
    "download_bw": (0.0, False, True),
    "upload_bw": (0.0, False, True),
    "download_latency_s": (0.0, True, False),
    "upload_latency_s": (0.0, True, False),
}
_NEEDS = {
    "constant": ("value",),
    "uniform": ("low", "high"),
    "lognormal": ("median", "spread"),
    "table": ("table",),
}
_PARAMS = ("value", "low", "high", "median", "spread", "table")


def check_devices(cfg: DeviceConfig, num_clients: int) -> None:
    for name, (lowest, closed, inf_ok) in _BOUNDS.items():
        check_distribution(
            getattr(cfg, name), f"devices.{name}", num_clients, lowest, closed, inf_ok
        )
    check_availability(cfg.availability, num_clients)


def check_distribution(
    d: Distribution, key: str, num_clients: int, lowest: float, closed: bool, inf_ok: bool
) -> None:
    """Every value ``d`` can draw is >= ``lowest`` (> when not ``closed``), finite unless
    ``inf_ok``; the parameters its ``dist`` needs are given, the others are not."""
    need = _NEEDS[d.dist]
    for p in _PARAMS:
        given = getattr(d, p) is not None
        if p in need and not given:
            raise ConfigError(f"{key}.{p} is required with {key}.dist={d.dist}")
        if p not in need and given:
            raise ConfigError(
                f"{key}.{p} does not apply to {key}.dist={d.dist} (it takes {', '.join(need)})"
            )
    sign = ">=" if closed else ">"

    def bound(p: str, v: float) -> None:
        ok = (v >= lowest if closed else v > lowest) and not math.isnan(v)
        if not ok or (math.isinf(v) and not inf_ok):
            finite = "" if inf_ok else " and finite"
            raise ConfigError(f"{key}.{p} must be {sign} {lowest:g}{finite} (got {v!r})")

    if d.dist == "constant":
        bound("value", float(d.value))  # type: ignore[arg-type]
    elif d.dist == "uniform":
        lo, hi = float(d.low), float(d.high)  # type: ignore[arg-type]
        bound("low", lo)
        bound("high", hi)
        if not (math.isfinite(lo) and math.isfinite(hi) and lo <= hi):
            raise ConfigError(f"{key}.high must be finite and >= {key}.low={lo!r} (got {hi!r})")
    elif d.dist == "lognormal":
        median, spread = float(d.median), float(d.spread)  # type: ignore[arg-type]
        if not (math.isfinite(median) and median > 0):
            raise ConfigError(f"{key}.median must be > 0 and finite (got {median!r})")
        if not (math.isfinite(spread) and spread >= 1):
            raise ConfigError(f"{key}.spread must be >= 1 and finite (got {spread!r})")
    else:
        table = d.table or ()
        if len(table) != num_clients:
            raise ConfigError(
                f"{key}.table must hold one value per client ({num_clients}), got {len(table)}"
            )
        for v in table:
            bound("table", float(v))


def check_availability(a: AvailabilityConfig, num_clients: int) -> None:
    key = "devices.availability"
    if a.process == "onoff":
        on, off = a.mean_on_s, a.mean_off_s
        if on is None or off is None:
            raise ConfigError(
                f"{key}.mean_on_s and {key}.mean_off_s are required with process=onoff"
            )
        if not (math.isfinite(on) and on > 0):
            raise ConfigError(
                f"{key}.mean_on_s must be > 0 and finite: no client would ever be online (got {on!r})"
            )
        if not (math.isfinite(off) and off >= 0):
            raise ConfigError(f"{key}.mean_off_s must be >= 0 and finite (got {off!r})")
    elif a.process == "trace":
        if not (math.isfinite(a.period_s) and a.period_s > 0):
            raise ConfigError(f"{key}.period_s must be > 0 and finite (got {a.period_s!r})")
        if (a.windows is None) == (a.per_client is None):
            raise ConfigError(f"{key}: process=trace takes exactly one of windows, per_client")
        traces = [a.windows] if a.windows is not None else list(a.per_client or ())
        if a.per_client is not None and len(traces) != num_clients:
            raise ConfigError(
                f"{key}.per_client must hold one window list per client ({num_clients}), "
                f"got {len(traces)}"
            )
        sub = "windows" if a.windows is not None else "per_client"
        for windows in traces:
            for start, end in windows or ():
                if not 0 <= start <= end <= a.period_s:
                    raise ConfigError(
                        f"{key}.{sub}: a window [start_s, end_s] needs "
                        f"0 <= start_s <= end_s <= period_s={a.period_s:g} (got [{start}, {end}])"
                    )
        if not any(end > start for windows in traces for start, end in windows or ()):
            raise ConfigError(
                f"{key}.{sub}: no client is ever online (every window is empty); give at least "
                "one window [start_s, end_s] with end_s > start_s"
            )
    for p in ("mean_on_s", "mean_off_s") if a.process != "onoff" else ():
        if getattr(a, p) is not None:
            raise ConfigError(f"{key}.{p} applies only to process=onoff (got process={a.process})")
    for p in ("windows", "per_client") if a.process != "trace" else ():
        if getattr(a, p) is not None:
            raise ConfigError(f"{key}.{p} applies only to process=trace (got process={a.process})")


# ---- which algorithms can run asynchronously -----------------------------------------------

# Client-side changes only: a client trains from the model it downloaded, whatever its age.
ASYNC_ALGORITHMS = ("fedavg", "fedir", "fedprox")
_SERVER_OPTIMIZER = (
    "its server optimiser steps on one round's pseudo-gradient; FedBuff's server step is "
    "federation.async.server_lr x the buffer's weighted delta"
)
NOT_ASYNC = {
    "fednova": "it normalises a round's updates by their local steps against one shared model, "
    "and a FedBuff buffer mixes updates from different model versions",
    "fedavgm": _SERVER_OPTIMIZER,
    "fedadagrad": _SERVER_OPTIMIZER,
    "fedadam": _SERVER_OPTIMIZER,
    "fedyogi": _SERVER_OPTIMIZER,
    "fedvc": "it selects clients in proportion to their size and draws their samples per round, "
    "and FedBuff dispatches idle online clients uniformly, one job at a time",
    "fednilo": "it freezes layers on a schedule of rounds and tracks which clients hold them, "
    "and FedBuff has no rounds",
    "scaffold": "its control variates c and c_k are stepped by one round's uploads against one "
    "model x; an asynchronous SCAFFOLD with stale control variates is not defined here",
}


def check_async_algorithm(name: str) -> None:
    """A one-line ConfigError for an algorithm FedBuff cannot run (``federation.mode=async``),
    saying why."""
    if name in ASYNC_ALGORITHMS:
        return
    allowed = ", ".join(ASYNC_ALGORITHMS)
    why = NOT_ASYNC.get(name)
    if why is None:
        raise ConfigError(
            f"federation.mode=async: algorithm {name!r} is not known to run asynchronously; "
            f"allowed: {allowed}"
        )
    raise ConfigError(
        f"federation.mode=async: algorithm {name!r} cannot run asynchronously: {why}; "
        f"allowed: {allowed}"
    )
