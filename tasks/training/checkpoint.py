"""Round checkpoints: a cell killed in round 40 of 50 resumes at round 41 when the same
command runs again, and ends with the same bytes as a run that was never interrupted.

A checkpoint is one file per cell, written atomically (temp file, then rename) after a round:
the engine's resumable state (``Simulation.state_dict``: global model, the algorithm's server
state, the round records with their cumulative bytes, the clients holding the frozen base)
and the *fingerprint* of what determines the cell's numbers (every parameter that changes
them, the partition's hash, the pretrain base's hash). A checkpoint whose fingerprint differs
from the rerun's is refused in one line naming the differing keys; it is never half-used.

When it is written: ``runtime.checkpoint_every`` N rounds, 0 never, ``auto`` after any round
that ends 5 s or more after the last checkpoint (every round of a slow run, a few of a fast
one), and always after the last round. Which rounds are checkpointed never changes a result:
every random choice is derived from (seed, round, client), not from a running generator.
"""

from __future__ import annotations

import hashlib
import io
import json
import time
from pathlib import Path
from typing import Any

import torch

from fedcore import numerics
from fedcore.engine import Simulation
from fedcore.errors import ConfigError
from fedcore.events import Callback, RoundRecord
from tasks.config.params import NEUTRAL, significant
from tasks.grid import ResolvedCell
from tasks.io import atomic_write_bytes, missing

FORMAT = 1
AUTO_SECONDS = 5.0

# A cell's own: personalization runs after the rounds, from the final model (recomputed on
# resume), and the cell's algorithm and adapter options are added by ``fingerprint``.
_CELL_NEUTRAL = (*NEUTRAL, "personalize.", "grid.")


def fingerprint(cell: ResolvedCell, partition_hash: str) -> dict[str, Any]:
    """What determines ``cell``'s numbers on the partition of ``partition_hash``, as a flat
    JSON-able mapping (its pretrain base's hash too: read here, the base written by now)."""
    algorithm, adapter, codec = cell.algorithm, cell.adapter, cell.codec
    flat = cell.params.flat()
    if flat.get("runtime.numerics") == numerics.AUTO:  # the mode this process computes in
        flat["runtime.numerics"] = numerics.mode_in_force()
    fp = significant(flat, _CELL_NEUTRAL)
    for prefix in (f"grid.algorithm_options.{algorithm}", f"grid.adapter_options.{adapter}"):
        fp.update({k: v for k, v in flat.items() if k == prefix or k.startswith(prefix + ".")})
    fp["cell.algorithm"], fp["cell.adapter"] = algorithm, adapter
    if codec != "none":  # (a cell without one keeps the fingerprint it had)
        fp["cell.codec"] = codec
        prefix = f"grid.codec_options.{codec}"
        fp.update({k: v for k, v in flat.items() if k == prefix or k.startswith(prefix + ".")})
    # the lr the cell trains at: grid.client_lr's entry for it, else client.lr (the same key)
    fp["client.lr"] = cell.lr
    fp["partition.hash"] = partition_hash
    if cell.base is not None:
        fp["pretrain.base_sha256"] = hashlib.sha256(Path(cell.base).read_bytes()).hexdigest()
    return json.loads(json.dumps(fp, sort_keys=True, default=str))  # plain JSON values


def _differences(saved: dict[str, Any], now: dict[str, Any]) -> list[str]:
    keys = sorted(set(saved) | set(now))
    return [
        f"{k} ({saved.get(k, '<unset>')!s} -> {now.get(k, '<unset>')!s})"
        for k in keys
        if saved.get(k, "<unset>") != now.get(k, "<unset>")
    ]


def read(path: str | Path, fp: dict[str, Any]) -> dict[str, Any] | None:
    """The engine state in the checkpoint at ``path`` if it was written for ``fp``; None
    when there is no checkpoint; a one-line ConfigError when it is for another
    configuration or cannot be read."""
    path = Path(path)
    fix = f"delete {path} or run with --set runtime.resume=false to start the cell over"
    if path.is_symlink() and not path.exists():  # not "no checkpoint": a link to nothing
        raise ConfigError(f"checkpoint {path} {missing(path)}; {fix}")
    if not path.is_file():
        return None
    try:
        blob = torch.load(io.BytesIO(path.read_bytes()), map_location="cpu", weights_only=True)
    except Exception:  # a torn or foreign file: never half-used (torch's own message says
        # nothing of use here: several lines, a weights_only advice that does not apply)
        raise ConfigError(
            f"checkpoint {path} cannot be read (torn, or not a checkpoint fedapt wrote); {fix}"
        ) from None
    if (
        not isinstance(blob, dict)
        or blob.get("format") != FORMAT
        or not isinstance(blob.get("fingerprint"), dict)
        or "state" not in blob
    ):
        raise ConfigError(f"checkpoint {path} is not a fedapt checkpoint (format {FORMAT}); {fix}")
    diff = _differences(blob["fingerprint"], fp)
    if diff:
        shown = "; ".join(diff[:4]) + (f"; and {len(diff) - 4} more" if len(diff) > 4 else "")
        raise ConfigError(
            f"checkpoint {path} was written for another configuration: {shown}; {fix}"
        )
    return blob["state"]


def check(path: str | Path, fp: dict[str, Any]) -> None:
    """Preflight: refuse a checkpoint of another configuration before anything runs."""
    read(path, fp)


class Checkpointer(Callback):
    """Writes ``sim``'s state to ``path`` after rounds (see the module's rule)."""

    def __init__(
        self, sim: Simulation, path: str | Path, every: int | str, fp: dict[str, Any]
    ) -> None:
        self.sim, self.path, self.every, self.fp = sim, Path(path), every, fp
        self.written: list[int] = []  # rounds checkpointed by this process
        self._last = time.monotonic()
        self._rounds = 0
        # a write torn by a kill leaves its temp file (never read): removed now
        for stale in self.path.parent.glob(f".{self.path.name}.*.tmp"):
            stale.unlink(missing_ok=True)

    def on_fit_start(self, info: dict[str, Any]) -> None:
        self._last = time.monotonic()
        self._rounds = int(info["rounds"])

    def on_round_end(self, record: RoundRecord) -> None:
        if self.every == 0:
            return
        history = self.sim.history
        stopped = history is not None and history.stop_reason != "rounds"
        last = record.round == self._rounds or stopped
        if self.every == "auto":
            due = time.monotonic() - self._last >= AUTO_SECONDS
        else:
            due = record.round % int(self.every) == 0
        if due or last:
            self.save()

    def save(self) -> None:
        buf = io.BytesIO()
        torch.save({"format": FORMAT, "fingerprint": self.fp, "state": self.sim.state_dict()}, buf)
        atomic_write_bytes(self.path, buf.getvalue())
        self.written.append(len(self.sim.history.rounds) if self.sim.history else 0)
        self._last = time.monotonic()
