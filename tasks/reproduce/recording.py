"""What an experiment's run writes beside its numbers: its pre-registration (the rules it
starts under, who computes it), its stamp when it finishes, its committed record, and the
extra seeds the seed policy adds joining that record; and the frozen base it can share with
another experiment of the same data, model and pretrain params."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from tasks.config import load_params, resolved
from tasks.io import atomic_write_bytes, atomic_write_json
from tasks.reproduce import records
from tasks.reproduce.runs import STAMP, Planned, config_key, read_stamp, rules_for, summary_of
from tasks.reproduce.spec import dedupe


def share_base(item: Planned, root: Path) -> Path | None:
    """Give ``item`` the frozen base another experiment under ``root`` trained for the same
    data, model and pretrain params (the pretrain stage's own cache check: same fingerprint,
    same bytes), so experiments that differ only after the base (the two #M partitions)
    train it once; in a seed sweep each seed's base (``seed-<s>/pretrain``, the seed's own
    subset and init) from the same seed's folder of another experiment. Returns the first
    folder copied from, or None."""
    from tasks.data.backbone import BASE_FILE
    from tasks.data.pretrain import CARD_FILE, cached_card
    from tasks.training.sweep import seed_params

    if item.params.model.base != "pretrain":
        return None
    seeds = item.params.experiment.seeds
    wanted = (
        [(seed_params(item.params, s), f"seed-{s}/pretrain") for s in seeds]
        if seeds
        else [(item.params, "pretrain")]
    )
    source = None
    for params, rel in wanted:
        target = item.dir / rel
        if cached_card(params, target) is not None:
            continue
        for other in sorted(root.glob(f"*/{rel}")):
            if other != target and cached_card(params, other) is not None:
                for name in (BASE_FILE, CARD_FILE):
                    atomic_write_bytes(target / name, (other / name).read_bytes())
                source = source or other
                break
    return source


def register(item: Planned) -> Path:
    """Pre-register ``item`` before its run starts: reproduce.json in its folder with the rule
    hash of every claim that reads it (:func:`rules_for`) and who computes it. A resumed run
    keeps the registration its first start wrote (the rules it started under)."""
    stamp = read_stamp(item.dir)
    if stamp.get("rules") is not None and stamp.get("config") == config_key(item.params.flat()):
        return item.dir / STAMP
    return atomic_write_json(
        item.dir / STAMP,
        {
            "claim": item.claim.id,
            "experiment": item.experiment.name,
            "config": config_key(item.params.flat()),
            "rules": rules_for(item),
            "registered_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "computed_by": records.computed_by(item.params.flat(), item.params.runtime.numerics),
            "code_rule": records.RULE,
        },
    )


def write_stamp(item: Planned, seconds: float, resumed: bool) -> Path:
    """reproduce.json in the experiment's folder, completed when its run finished: how long
    it took (this session's seconds; a resumed run's earlier sessions are not counted), its
    overrides and the code version that computed it (its registration kept)."""
    stamp = read_stamp(item.dir)
    return atomic_write_json(
        item.dir / STAMP,
        {
            **stamp,
            "claim": item.claim.id,
            "experiment": item.experiment.name,
            "overrides": list(item.overrides),
            "seconds": round(seconds, 1),
            "resumed": resumed,
            "code": records.record_code(item.params.flat()),
            "code_rule": records.RULE,
            "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        },
    )


def write_record(item: Planned) -> Path:
    """The experiment's committed record, from its finished folder and stamp."""
    summary = summary_of(item.dir)
    if summary is None:
        raise FileNotFoundError(f"{item.dir / 'summary.json'}: the experiment has not finished")
    stamp = read_stamp(item.dir)
    flat = item.params.flat()
    by = records.computed_by(flat, item.params.runtime.numerics)
    started = (stamp.get("computed_by") or {}).get("code")
    if started is not None and not records.same_code(started, flat):
        by["clean"] = False  # the code changed between the run's start and its end
    if not (stamp.get("computed_by") or {}).get("clean", True):
        by["clean"] = False
    return records.write_record(
        item.record,
        experiment=item.params.experiment.name,
        claim=item.claim.id,
        config=config_key(flat),
        params=json.loads(json.dumps(summary["params"], default=str)),
        numerics=item.params.runtime.numerics,
        overrides=list(item.overrides),
        seconds=float(stamp.get("seconds") or 0.0),
        resumed=bool(stamp.get("resumed")),
        seeds=records.collect(item.dir, summary),
        code=by["code"],
        computed_by=by,
        rules=stamp.get("rules") or {},
    )


def extra_seed(item: Planned, seed: int, params_file: str | Path | None) -> Planned:
    """One seed more of ``item`` (the seed policy): ``seed`` alone, in its own folder
    ``<experiment>-seed<seed>``, joining ``item``'s record."""
    import dataclasses

    name = item.params.experiment.name
    sets = (
        *item.overrides,
        f"experiment.seeds=[{seed}]",
        f"experiment.seed={seed}",
        f"experiment.name={name}-seed{seed}",
    )
    params = resolved(load_params(params_file, list(dedupe(sets))), "portable")
    return dataclasses.replace(
        item, params=params, overrides=tuple(dedupe(sets)), joins=name, tunes=None
    )


def merge_seed(item: Planned, extra: Planned, seed: int) -> Path:
    """``extra``'s finished seed joins ``item``'s record, which must be of the same
    configuration, code and rules (a record never mixes them)."""
    rec = records.read_record(item.record)
    summary = summary_of(extra.dir)
    if rec is None or summary is None:
        raise FileNotFoundError(f"{extra.dir}: seed {seed} has not finished")
    stamp = read_stamp(extra.dir)
    flat = extra.params.flat()
    by = records.computed_by(flat, extra.params.runtime.numerics)
    same = (
        rec.get("config") == config_key(flat)
        and rec.get("code") == by["code"]
        and (stamp.get("rules") or {}) == (rec.get("rules") or {})
    )
    if not same:
        raise ValueError(
            f"{item.record}: seed {seed} ran with another configuration, code or rules than "
            "the record's: rerun the record with --rerun-stale"
        )
    if not (stamp.get("computed_by") or {}).get("clean", True):
        by["clean"] = False
    new = dict(rec)
    new["seeds"] = {**rec["seeds"], **records.collect(extra.dir, summary)}
    new["seed_runs"] = [
        *rec.get("seed_runs", []),
        {"seed": seed, "seconds": stamp.get("seconds"), "computed_by": by},
    ]
    if by["clean"] is not True:  # a seed from a dirty tree makes the whole record one
        new["computed_by"] = {**rec.get("computed_by", {}), "clean": False}
    return atomic_write_json(item.record, new)
