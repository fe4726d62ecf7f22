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
# Every claim's experiments run as a seed sweep (``experiment.seeds``): three seeds behind a
# verdict (seed 000 reports five; three is the least that shows a spread), two in the smoke
# test, which only exercises the pipeline.
SEEDS: dict[str, tuple[int, ...]] = {"ci": (0, 1), "cpu": (0, 1, 2), "gpu": (0, 1, 2)}
PROFILE_SETTINGS: dict[str, tuple[str, ...]] = {
    "ci": ("runtime.workers=0", "experiment.seeds=[0,1]"),
    "cpu": ("experiment.seeds=[0,1,2]",),
    "gpu": ("experiment.seeds=[0,1,2]",),
}


@dataclass(frozen=True)
class Tune:
    """How an experiment's client learning rate is chosen, the same way for every method (as
    the seeds pick theirs: the best of a small grid per method): one run per ``lrs`` value
    with seed 0 on the training rows less a held-out ``validation`` share, evaluated on that
    share (never on the test set), for all of the experiment's rounds; each grid cell then gets the lr with the best mean validation accuracy over the last L
    rounds (``grid.client_lr``), and the experiment trains on the same rows as the tuning.
    ``key="server_lr"`` tunes the server optimisers' lr instead (each algorithm of the grid
    that has one, ``grid.algorithm_options.<algorithm>.server_lr``; the others sit out)."""

    lrs: tuple[float, ...]
    validation: float = 0.1
    key: str = "client.lr"  # or "server_lr"


@dataclass(frozen=True)
class Experiment:
    """One `fedapt run` of a claim: the seed's protocol as overrides (the ``gpu`` profile),
    and per profile the overrides that scale it (applied after the protocol) and how its lr
    is tuned (``tune``; none: the protocol's lr, as the seed gives it)."""

    name: str  # unique over all claims: reports/reproduce/<profile>/<profile>-<name>/
    protocol: tuple[str, ...]
    scale: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    profiles: tuple[str, ...] = PROFILES  # the profiles that run it
    tune: Mapping[str, Tune] = field(default_factory=dict)
    # Settings read off other experiments' records (e.g. FedNILO's kick-off round from
    # FedAvg's measured rounds to its level): ``after`` names those experiments, ``derive``
    # maps a profile to a pure function of their results (every seed) -> ``key=value``
    # overrides applied after the profile's scale. The experiment waits until they are done.
    after: tuple[str, ...] = ()
    derive: Mapping[str, Callable[[Results], tuple[str, ...]]] = field(default_factory=dict)

    def overrides(self, profile: str) -> tuple[str, ...]:
        """The protocol, then the profile's scale and settings (a key set twice: its last)."""
        sets = (*self.protocol, *self.scale.get(profile, ()), *PROFILE_SETTINGS.get(profile, ()))
        return tuple(dedupe(sets))


@dataclass(frozen=True)
class Cell:
    """A finished grid cell of one seed: its summary record (accuracy, bytes, local training
    time) and its per-round records (metrics.json ``rounds``)."""

    record: Mapping[str, Any]
    rounds: Sequence[Mapping[str, Any]] = ()


@dataclass(frozen=True)
class ExperimentResult:
    """A finished experiment: its flat params, its cells per seed (``runs[seed]["fedavg-full"]``),
    the seconds the run took (None when unknown), per seed the share of the most frequent
    class among its training rows (None when unknown): the accuracy of a model that learned
    nothing but the prior, and per seed the test accuracy of the pretrained base before any
    federated round (``pretrain/base.json``; None without a pretrain base): what fine-tuning
    starts from."""

    params: Mapping[str, Any]
    runs: Mapping[int, Mapping[str, Cell]]
    seconds: float | None = None
    majorities: Mapping[int, float | None] = field(default_factory=dict)
    bases: Mapping[int, float | None] = field(default_factory=dict)
    rules: Mapping[str, str] = field(default_factory=dict)  # claim id -> rule hash at its start

    @property
    def seeds(self) -> tuple[int, ...]:
        return tuple(sorted(self.runs))

    @property
    def cells(self) -> Mapping[str, Cell]:
        """The cells of the first seed (a single-seed view has only that one)."""
        return self.runs[self.seeds[0]] if self.runs else {}

    @property
    def majority(self) -> float | None:
        return self.majorities.get(self.seeds[0]) if self.runs else None

    @property
    def base_accuracy(self) -> float | None:
        """The first seed's pretrained base's test accuracy (None when unknown)."""
        return self.bases.get(self.seeds[0]) if self.runs else None

    def seed(self, seed: int) -> ExperimentResult:
        """The single-seed view of ``seed``."""
        return ExperimentResult(
            self.params,
            {seed: self.runs[seed]},
            self.seconds,
            {seed: self.majorities.get(seed)},
            {seed: self.bases.get(seed)},
            self.rules,
        )


Results = Mapping[str, ExperimentResult]  # experiment name -> result (finished ones only)


def common_seeds(results: Results) -> tuple[int, ...]:
    """The seeds every experiment in ``results`` has finished."""
    sets = [set(r.seeds) for r in results.values()]
    return tuple(sorted(set.intersection(*sets))) if sets else ()


def one_seed(results: Results, seed: int) -> dict[str, ExperimentResult]:
    """Every experiment's single-seed view of ``seed`` (experiments without it left out)."""
    return {k: r.seed(seed) for k, r in results.items() if seed in r.runs}


SIDES = ("<=", "<", ">=", ">")  # where a check's value must lie, against its threshold


@dataclass(frozen=True)
class Check:
    """One comparison a claim's rule makes on one seed's results: the measured ``value`` and
    the side of ``threshold`` on which the claim holds (``"<="``, ``"<"``, ``">="``, ``">"``;
    None: not measurable). Over the seeds the verdict reads the 95% interval of the values'
    mean (``tasks.reproduce.verdict``), so a check is always a number against a threshold,
    never a yes/no: a difference between two methods is taken within each seed (paired). A
    ``guard`` is a precondition of the comparison (e.g. the method learned at all): when its
    interval is not on its side the claim cannot be decided, rather than failing."""

    name: str
    value: float | None
    side: str
    threshold: float
    guard: bool = False

    def __post_init__(self) -> None:
        if self.side not in SIDES:
            raise ValueError(f"Check {self.name!r}: side {self.side!r}; valid: {SIDES}")

    @property
    def rule(self) -> str:
        return f"{self.side} {self.threshold:g}"

    @property
    def ok(self) -> bool | None:
        """Whether this seed's value is on the holding side (None: not measured)."""
        return None if self.value is None else on_side(self.value, self.side, self.threshold)


def on_side(value: float, side: str, threshold: float) -> bool:
    return {
        "<=": value <= threshold,
        "<": value < threshold,
        ">=": value >= threshold,
        ">": value > threshold,
    }[side]


@dataclass(frozen=True)
class Reading:
    """A claim's rule read on one seed: its checks, a Markdown table of that seed's numbers,
    and a note (why nothing could be measured, or what the numbers say about the cause)."""

    checks: tuple[Check, ...] = ()
    table: str = ""
    note: str = ""


@dataclass(frozen=True)
class Verdict:
    """fedapt's numbers for a claim (a Markdown table), whether the claim's direction holds
    (None: cannot say, e.g. an experiment is missing or the seeds straddle a threshold) and one
    paragraph saying why."""

    holds: bool | None
    text: str
    table: str = ""
    more_seeds: bool = False  # a check straddles and the seed policy allows one seed more
    seeds: int = 0  # the seeds it stands on


@dataclass(frozen=True)
class Dropped:
    """A design tried and dropped before the committed runs (a forking path), shown in the
    report as a sensitivity row: what it was, what it measured, and why it was dropped."""

    design: str
    measured: str
    why: str


@dataclass(frozen=True)
class SeedPolicy:
    """How many seeds a verdict stands on, fixed before anything runs: ``start`` seeds
    (0 .. start-1) first; while some check's 95% interval straddles its threshold, one seed
    more, up to ``most``. A verdict is read only once at least ``start`` seeds finished."""

    start: int = 3
    most: int = 8
    confidence: float = 0.95


@dataclass(frozen=True)
class Claim:
    """A paper's claim, the experiments that test it and how to read them.

    ``measure`` and ``plot`` are pure: they read ``Results`` (only the experiments the claim
    names in ``experiments`` and ``reads``) and never touch files; ``measure`` gets one seed's
    view and gives its checks (numbers against thresholds), and ``tasks.reproduce.verdict``
    decides over the seeds by 95% intervals (holds when every check's interval is on its
    side, does not hold when one is wholly on the other, cannot say when one straddles or a
    guard's is not on its side). ``requires`` names registry
    entries (``adapter:<name>``, ``algorithm:<name>``, ``dataset:<name>``, ``model:<name>``)
    that must exist for the claim to run; a claim whose requirements are missing is listed in
    the report as not available in this build (the hook for methods added later).

    The rule is pre-registered: :meth:`rule_hash` covers its text, its ``thresholds`` (every
    number the checks compare with, by name), ``window`` (the last evaluations a verdict
    metric averages) and the seed policy; each record keeps the hash its run started under,
    and the report refuses a record whose hash is not the claim's."""

    id: str
    title: str  # the claim in one sentence
    source: str  # where the paper says it, e.g. "seed 000 Table I"
    paper: str  # the paper's numbers, quoted (Markdown)
    experiments: tuple[Experiment, ...]
    measure: Callable[[Results], Reading]  # one seed's results -> that seed's reading
    rule: str  # the decision rule in words, fixed before any run
    tolerance: str  # the rule's tolerance against the paper's own seed-to-seed spread
    plot: Callable[[Results], Any] | None = None  # a matplotlib Figure, or None
    reads: tuple[str, ...] = ()  # other claims' experiments it reads (by name)
    scaled: Mapping[str, str] = field(default_factory=dict)  # profile -> what was scaled, why
    requires: tuple[str, ...] = ()
    thresholds: Mapping[str, float] = field(default_factory=dict)  # every number the rule uses
    window: int = 5  # verdict metrics: the mean of the last ``window`` evaluations
    seeds: SeedPolicy = SeedPolicy()
    dropped: tuple[Dropped, ...] = ()  # designs dropped after probes: sensitivity rows

    def seeds_needed(self, profile: str) -> int:
        return len(SEEDS[profile]) if profile == "ci" else self.seeds.start

    def runs(self, profile: str) -> tuple[Experiment, ...]:
        return tuple(e for e in self.experiments if profile in e.profiles)

    def needs_all(self) -> tuple[str, ...]:
        """Names of every experiment the verdict may read (any profile)."""
        return (*(e.name for e in self.experiments), *self.reads)

    def rule_hash(self) -> str:
        """12 hex digits over what decides the verdict: the rule's text, its thresholds, the
        window and the seed policy (not the measure's code: its refactors keep the rule)."""
        import hashlib
        import json

        what = {
            "id": self.id,
            "rule": self.rule,
            "thresholds": {k: float(v) for k, v in sorted(self.thresholds.items())},
            "window": self.window,
            "seeds": [self.seeds.start, self.seeds.most, self.seeds.confidence],
        }
        blob = json.dumps(what, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]


def dedupe(overrides: Sequence[str]) -> list[str]:
    """``key=value`` overrides with each key once: its last occurrence, earlier ones dropped
    (their effect is overwritten anyway), so applying the result equals applying all."""
    keys = [s.partition("=")[0].strip() for s in overrides]
    return [s for i, s in enumerate(overrides) if keys[i] not in keys[i + 1 :]]


def missing(results: Results, names: Sequence[str]) -> Reading | None:
    """The reading of a claim whose experiments have not all finished, else None."""
    absent = [n for n in names if n not in results]
    if not absent:
        return None
    return Reading(note=f"not run yet: {', '.join(absent)} (rerun `fedapt reproduce` to finish)")
