"""Who started a run, and whose results a run may write over.

**A run never overwrites another run's results.** ``reports/<experiment>/`` holding the
finished results (``summary.json``) of other params, or ``s3://<bucket>/<prefix>/<experiment>/``
holding them, is refused in one line before anything runs, naming the keys that differ,
unless the user asks for a new version: ``<experiment>-v<k>``, the first version free or
holding the results of these same params (``fedapt run --new-version``, ``fedapt deploy
--new-version``). A rerun of the same params (the same keys that determine the numbers,
``tasks.config.params.significant``) writes the same bytes in the same place.

**Every run records its origin** (:class:`Origin`): how it was started (``fedapt run``, a
Prefect deployment, a DVC stage, ``fedapt reproduce``), its ``--set`` overrides, the
deployment and flow run, the DVC experiment; as MLflow tags (``fedapt.entry``, ...) and in the
summary. A *smoke* run, one with fewer rounds or training rows than its params file says, or
one inside ``dvc exp run``, is tracked but does not enter the model registry under
``tracking.register: auto`` (``tasks.training.registration.registers``).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fedcore.errors import ConfigError
from tasks.config import Params, experiment_dir
from tasks.config.load import results_key

ENTRIES = ("run", "deployment", "dvc", "reproduce")
MAX_VERSION = 999


@dataclass(frozen=True)
class Origin:
    """How a run was started (picklable: it travels with the training tasks)."""

    entry: str = "run"  # run | deployment | dvc | reproduce
    overrides: tuple[str, ...] = ()  # the --set overrides, as given
    deployment: str | None = None  # <flow>/<deployment> of a scheduled run
    flow_run_id: str | None = None
    dvc_experiment: str | None = None  # DVC_EXP_NAME inside `dvc exp run`
    smoke: tuple[str, ...] = ()  # why it is a smoke run ([]: it is not)

    def tags(self) -> dict[str, str]:
        """MLflow tags: ``fedapt.entry`` always, the others when set."""
        tags = {"fedapt.entry": self.entry}
        if self.overrides:
            tags["fedapt.overrides"] = json.dumps(list(self.overrides))[:5000]
        for key in ("deployment", "flow_run_id", "dvc_experiment"):
            if (value := getattr(self, key)) is not None:
                tags[f"fedapt.{key}"] = value
        if self.smoke:
            tags["fedapt.smoke"] = "; ".join(self.smoke)
        return tags

    def record(self) -> dict[str, Any]:
        """The summary's ``origin`` entry."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


def smoke_reasons(params: Params, file_params: Params | None) -> tuple[str, ...]:
    """Why ``params`` is a smoke run: fewer rounds or training rows than the params file it
    was overridden from (``file_params``), or a run inside ``dvc exp run``."""
    why = []
    if file_params is not None:
        have, want = params.federation.rounds, file_params.federation.rounds
        if have < want:
            why.append(f"federation.rounds {have} < {want} in the params file")
        have_rows, want_rows = params.data.train_subset, file_params.data.train_subset
        if have_rows is not None and (want_rows is None or have_rows < want_rows):
            why.append(
                f"data.train_subset {have_rows} < "
                f"{'the whole split' if want_rows is None else want_rows} in the params file"
            )
    if exp := os.environ.get("DVC_EXP_NAME"):
        why.append(f"dvc exp run ({exp})")
    return tuple(why)


def origin(
    entry: str,
    params: Params,
    params_file: str | Path | None,
    overrides: Sequence[str] = (),
    *,
    deployment: str | None = None,
    flow_run_id: str | None = None,
) -> Origin:
    """The origin of a run of ``params`` = ``params_file`` + ``overrides``."""
    from tasks.config import load_params

    if entry not in ENTRIES:
        raise ValueError(f"entry {entry!r}: one of {', '.join(ENTRIES)}")
    file_params = None
    if overrides:
        try:
            file_params = load_params(params_file)
        except ConfigError:  # a file valid only with its overrides: nothing to compare
            file_params = None
    return Origin(
        entry=entry,
        overrides=tuple(overrides),
        deployment=deployment,
        flow_run_id=flow_run_id,
        dvc_experiment=os.environ.get("DVC_EXP_NAME") or None,
        smoke=smoke_reasons(params, file_params),
    )


def prefect_run() -> tuple[str | None, str | None]:
    """(deployment as ``<flow>/<name>``, flow run id) of the Prefect flow run in progress."""
    from prefect.runtime import deployment, flow_run

    run_id = flow_run.id
    name = deployment.name
    flow = flow_run.flow_name
    return (f"{flow}/{name}" if name else None), (str(run_id) if run_id else None)


# ---- whose results ------------------------------------------------------------------------


def differences(theirs: dict[str, Any], ours: dict[str, Any], limit: int = 4) -> str:
    """``key theirs -> ours`` for the keys that differ (the first ``limit``)."""
    a, b = results_key(theirs), results_key(ours)
    keys = sorted(k for k in a.keys() | b.keys() if a.get(k, "<unset>") != b.get(k, "<unset>"))
    shown = [f"{k} {a.get(k, '<unset>')} -> {b.get(k, '<unset>')}" for k in keys[:limit]]
    more = f" and {len(keys) - limit} more" if len(keys) > limit else ""
    return ", ".join(shown) + more


def _finished_local(directory: Path) -> dict[str, Any] | None:
    path = directory / "summary.json"
    if not path.is_file():
        return None
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError):
        raise ConfigError(f"{path} is not a readable summary; move it away to rerun") from None
    return summary.get("params") if isinstance(summary, dict) else None


def _finished_s3(params: Params) -> dict[str, Any] | None:
    from tasks.results import storage

    if not params.storage.bucket:
        return None
    key = f"{storage.experiment_prefix(params.storage.prefix, params.experiment.name)}/summary.json"
    summary = storage.read_json(params.storage.bucket, key)
    return summary.get("params") if isinstance(summary, dict) else None


def _finished(params: Params, *, s3: bool) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, params) of the finished results under ``params``' experiment name: the local
    folder's, then (``s3``, when asked for) the bucket's."""
    local = experiment_dir(params)
    if (theirs := _finished_local(local)) is not None:
        yield str(local), theirs
    if s3 and (remote := _finished_s3(params)) is not None:
        from tasks.results.storage import experiment_prefix

        prefix = f"{experiment_prefix(params.storage.prefix, params.experiment.name)}/"
        yield f"s3://{params.storage.bucket}/{prefix}", remote


def holder(
    params: Params, flat: dict[str, Any], *, s3: bool = True
) -> tuple[str, dict[str, Any]] | None:
    """Where finished results of *other* params than ``params`` (flat: ``flat``, computed once
    by the caller) sit under its experiment name, and their params; None when the name is
    free or holds these params' results."""
    for where, theirs in _finished(params, s3=s3):
        if results_key(theirs) != results_key(flat):
            return where, theirs
    return None


def _named(params: Params, name: str) -> Params:
    return params.model_copy(
        update={"experiment": params.experiment.model_copy(update={"name": name})}
    )


def check_results(params: Params, *, s3: bool = True, hint: str = "--new-version") -> None:
    """Refuse, in one line, a run that would write over the finished results of other
    params (locally, and on S3 when ``s3`` and a bucket is set)."""
    flat = params.flat()
    found = holder(params, flat, s3=s3)
    if found is None:
        return
    where, theirs = found
    changed = differences(theirs, flat)
    raise ConfigError(
        f"{where} holds the finished results of other params ({changed}); a run never "
        f"overwrites them: set experiment.name to another name, or add {hint} (writes "
        f"experiment {version(params, s3=s3).experiment.name})"
    )


_VERSIONED = re.compile(r"^(?P<base>.+)-v(?P<k>[0-9]+)$")


def version(params: Params, *, s3: bool = True) -> Params:
    """``params`` under the first experiment name among ``<name>``, ``<name>-v2``, ... that is
    free or holds the results of these same params (``<name>-v3`` given: from there on)."""
    name = params.experiment.name
    m = _VERSIONED.match(name)
    base, k = (m["base"], int(m["k"])) if m else (name, 1)
    flat = params.flat()  # (the experiment's name is no key of the numbers)
    while k <= MAX_VERSION:
        candidate = _named(params, base if k == 1 else f"{base}-v{k}")
        if holder(candidate, flat, s3=s3) is None:
            return candidate
        k += 1
    raise ConfigError(f"experiment {base}: versions v2..v{MAX_VERSION} all hold other results")
