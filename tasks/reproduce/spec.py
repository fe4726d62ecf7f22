"""What a reproduction claim is, as data: the experiments it runs per profile (``--set``
overrides on the base params file) and the pure function that reads their finished records.

A profile scales every claim the same way: ``gpu`` is the seeds' own protocol (with the
offline substitutions each claim names), ``cpu`` a scaled run for a 2-core machine (about two
hours in all), ``ci`` a smoke test of every claim's pipeline in a few minutes (its numbers
test the code, not the papers).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

PROFILES = ("ci", "cpu", "gpu")  # the allowed values of `fedapt reproduce --profile`
# Settings every experiment of a profile gets (after the claim's, before the user's): the ci
# profile trains its clients in-process, since spawning worker processes costs more than its
# few steps (runtime.workers cannot change a result).
PROFILE_SETTINGS: dict[str, tuple[str, ...]] = {"ci": ("runtime.workers=0",)}


@dataclass(frozen=True)
class Experiment:
    """One `fedapt run` of a claim: the seed's protocol as overrides (the ``gpu`` profile),
    and per profile the overrides that scale it (applied after the protocol)."""

    name: str  # unique over all claims: reports/reproduce/<profile>/<profile>-<name>/
    protocol: tuple[str, ...]
    scale: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    profiles: tuple[str, ...] = PROFILES  # the profiles that run it

    def overrides(self, profile: str) -> tuple[str, ...]:
        """The protocol, then the profile's scale and settings (a key set twice: its last)."""
        sets = (*self.protocol, *self.scale.get(profile, ()), *PROFILE_SETTINGS.get(profile, ()))
        return tuple(dedupe(sets))


@dataclass(frozen=True)
class Cell:
    """A finished grid cell: its summary record (accuracy, bytes, local training time) and
    its per-round records (metrics.json ``rounds``)."""

    record: Mapping[str, Any]
    rounds: Sequence[Mapping[str, Any]] = ()


@dataclass(frozen=True)
class ExperimentResult:
    """A finished experiment: its flat params (summary.json), its cells by name
    (``fedavg-full``), the seconds the run took (None when unknown) and the share of the
    most frequent class among its training rows (partition/stats.json; None when unknown):
    the accuracy of a model that learned nothing but the prior."""

    params: Mapping[str, Any]
    cells: Mapping[str, Cell]
    seconds: float | None = None
    majority: float | None = None


Results = Mapping[str, ExperimentResult]  # experiment name -> result (finished ones only)


@dataclass(frozen=True)
class Verdict:
    """fedapt's numbers for a claim (a Markdown table), whether the claim's direction holds
    (None: cannot say, e.g. an experiment is missing) and one paragraph saying why."""

    holds: bool | None
    text: str
    table: str = ""


@dataclass(frozen=True)
class Claim:
    """A paper's claim, the experiments that test it and how to read them.

    ``judge`` and ``plot`` are pure: they read ``Results`` (only the experiments the claim
    names in ``experiments`` and ``reads``) and never touch files. ``requires`` names registry
    entries (``adapter:<name>``, ``algorithm:<name>``, ``dataset:<name>``, ``model:<name>``)
    that must exist for the claim to run; a claim whose requirements are missing is listed in
    the report as not available in this build (the hook for methods added later)."""

    id: str
    title: str  # the claim in one sentence
    source: str  # where the paper says it, e.g. "seed 000 Table I"
    paper: str  # the paper's numbers, quoted (Markdown)
    experiments: tuple[Experiment, ...]
    judge: Callable[[Results], Verdict]
    plot: Callable[[Results], Any] | None = None  # a matplotlib Figure, or None
    reads: tuple[str, ...] = ()  # other claims' experiments it reads (by name)
    scaled: Mapping[str, str] = field(default_factory=dict)  # profile -> what was scaled, why
    requires: tuple[str, ...] = ()

    def runs(self, profile: str) -> tuple[Experiment, ...]:
        return tuple(e for e in self.experiments if profile in e.profiles)

    def needs_all(self) -> tuple[str, ...]:
        """Names of every experiment the verdict may read (any profile)."""
        return (*(e.name for e in self.experiments), *self.reads)


def dedupe(overrides: Sequence[str]) -> list[str]:
    """``key=value`` overrides with each key once: its last occurrence, earlier ones dropped
    (their effect is overwritten anyway), so applying the result equals applying all."""
    keys = [s.partition("=")[0].strip() for s in overrides]
    return [s for i, s in enumerate(overrides) if keys[i] not in keys[i + 1 :]]


def missing(results: Results, names: Sequence[str]) -> Verdict | None:
    """The verdict for a claim whose experiments have not all finished, else None."""
    absent = [n for n in names if n not in results]
    if not absent:
        return None
    return Verdict(None, f"not run yet: {', '.join(absent)} (rerun `fedapt reproduce` to finish)")
