"""Loading: params.yaml and ``--set`` overrides (or a flat view) validated into ``Params``;
a refusal is one line naming the file, the YAML line, the dotted key and what is allowed.

A params file may leave sections out (an overrides file, a test's few keys): each absent
section runs on its code defaults, and one warning line on standard error names them all
(``defaulted``), so a file cut short never passes unnoticed."""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from fedcore.errors import ConfigError
from fedcore.options import describe, fields_at, location
from models.registry import list_models, model_options_type
from tasks.config.params import NEUTRAL, Params, significant
from tasks.config.registered import ModelSection
from tasks.config.yamlfile import apply_overrides, read_mapping, where

DEFAULT_PARAMS = Path("params.yaml")
# null sections a `--set` key under them starts (a mechanism that is off by default)
STARTABLE = ("privacy", "privacy.adaptive_clip")
_SHOWN = 80  # characters of a refused value the error line shows


def _union_tag(part: Any) -> bool:
    """A step pydantic adds to the location of a union member's error (``int``,
    ``literal['auto']``)."""
    return isinstance(part, str) and (part in ("int", "float", "str", "bool") or "[" in part)


def _message(err: ValidationError) -> str | None:
    """A union's refusal (``int | Literal['auto']``) as one rule naming every allowed kind,
    e.g. ``runtime.workers: must be a valid integer or 'auto' (got True)``; None otherwise."""
    first = err.errors()[0]
    if not first["loc"] or not _union_tag(first["loc"][-1]):
        return None
    base = first["loc"][:-1]
    kinds = [
        e["msg"].removeprefix("Input should be ")
        for e in err.errors()
        if e["loc"][:-1] == base and _union_tag(e["loc"][-1])
    ]
    key = ".".join(map(str, location({"loc": base})))
    return f"{key}: must be {' or '.join(kinds)} (got {first.get('input')!r})"


def _shortened(message: str, err: ValidationError) -> str:
    """The line with a long refused value cut to its start and its length (a name of 10,000
    characters is named, not printed)."""
    got = repr(err.errors()[0].get("input"))
    if len(got) <= _SHOWN or got not in message:
        return message
    return message.replace(got, f"{got[: _SHOWN - 20]}... ({len(got)} characters)")


# dvc.yaml's own section of params.yaml: ``dvc.cells``, one train stage per grid cell keyed
# by the cell's name (DVC's matrix would name a folder <algorithm>-<adapter>-none). No run
# reads it: its shape is checked here, then it is left out of ``Params``; a grid cell it
# misses or misnames is one line from ``fedapt report`` (no metrics for the cell).
DVC_SECTION = "dvc"


def _check_dvc_cells(section: Any, source: str, text: str) -> None:
    """``dvc.cells`` maps each cell's name to its algorithm, adapter and codec."""
    if section is None:
        return
    cells = section.get("cells") if isinstance(section, Mapping) else None
    if not isinstance(cells, Mapping) or set(section) != {"cells"}:
        raise ConfigError(
            f"{where(source, text, (DVC_SECTION,))}: dvc: a mapping with one key, cells "
            "(cell name -> algorithm, adapter, codec)"
        )
    for name, cell in cells.items():
        if not isinstance(cell, Mapping) or set(cell) != {"algorithm", "adapter", "codec"}:
            raise ConfigError(
                f"{where(source, text, (DVC_SECTION, 'cells', name))}: dvc.cells.{name}: "
                f"give exactly algorithm, adapter and codec (got {cell!r})"
            )


def _one_line(err: ValidationError, source: str, text: str, data: dict[str, Any]) -> str:
    """fedcore.options' one error line, prefixed with the file and the YAML line."""

    def sections(loc: tuple[Any, ...]) -> list[str]:
        if loc[:2] == ("model", "options"):  # typed by model.name, at run time
            name = (data.get("model") or {}).get("name", ModelSection().name)
            return fields_at(model_options_type(name), loc[2:]) if name in list_models() else []
        return fields_at(Params, loc)

    place = where(source, text, location(err.errors()[0]))
    message = _message(err) or describe(err, Params, sections=sections)
    # a section (or an options table) given a value: pydantic names its class, not what it is
    message = re.sub(
        r"must be a valid dictionary or instance of \w+",
        "must be a mapping of its keys (key: value)",
        message,
    )
    # a list given one value: pydantic says "a valid tuple", not how to write a list
    message = re.sub(
        r"must be a valid (?:tuple|list)",
        "must be a list, e.g. [a, b] ([a] for one)",
        message,
    )
    return f"{place}: {_shortened(message, err)}"


def from_flat(flat: Mapping[str, Any]) -> Params | None:
    """The Params of a flat view (``Params.flat``, e.g. a summary's ``params``); None when it
    does not validate (written by another fedapt version)."""
    nested: dict[str, Any] = {}
    for key, value in flat.items():
        *parents, last = key.split(".")
        node = nested
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                return None
        node[last] = value
    try:
        return Params.model_validate(nested)
    except (ValidationError, ValueError, TypeError):
        return None


def results_key(flat: Mapping[str, Any]) -> dict[str, Any]:
    """The flat params that determine the numbers (``significant``), as plain JSON values:
    ``flat`` read back as Params and flattened again (the defaults of keys an older fedapt did
    not write filled in: a rerun after an upgrade is the same params), or as given when it
    does not validate (params of another fedapt version: compared key by key). ``auto``
    numerics are named as resolved: params are resolved at the entry points."""
    params = from_flat(flat)
    typed = dict(flat) if params is None else params.flat()
    return json.loads(json.dumps(significant(typed, NEUTRAL), sort_keys=True, default=str))


def defaulted(raw: Mapping[str, Any]) -> list[str]:
    """The sections of Params a params file's mapping leaves out, in Params' order."""
    return [name for name in Params.model_fields if name not in raw]


def load_params(path: str | Path | None = None, overrides: list[str] | None = None) -> Params:
    """Read params.yaml (or only defaults when ``path`` is None and none exists). Sections
    the file leaves out run on their code defaults, named in one warning line on stderr."""
    source = str(path or DEFAULT_PARAMS)
    text, raw = "", {}
    exists = path is not None or os.path.lexists(source)  # (a broken link is named below)
    if exists:
        text, raw = read_mapping(source)
    raw = dict(raw)
    _check_dvc_cells(raw.pop(DVC_SECTION, None), source, text)
    for item in overrides or []:  # (the dvc section is popped above: no Params field)
        if item.split("=", 1)[0].strip().split(".")[0] == DVC_SECTION:
            raise ConfigError(
                f"--set {item.split('=', 1)[0].strip()}: the {DVC_SECTION} section lists "
                "dvc.yaml's train stages, which no run reads; edit it in the params file "
                "(dvc exp run --set-param changes it for a DVC experiment)"
            )
    data = apply_overrides(raw, overrides or [], Params.model_fields, STARTABLE)
    try:
        params = Params.model_validate(data)
    except ValidationError as err:
        label = source if not overrides else f"{source} (with --set)"
        raise ConfigError(_one_line(err, label, text, data)) from None
    if not exists:
        _warn(f"no params file ({source} not found here): every section on its code defaults")
    elif missing := defaulted(raw):
        _warn(
            f"{source} leaves out section(s) {', '.join(missing)}: they run on their code "
            'defaults (docs/operations.md, "Params files")'
        )
    return params


_warned: set[str] = set()  # once per process: `fedapt reproduce` loads the file per experiment


def _warn(message: str) -> None:
    key = f"{Path.cwd()}: {message}"
    if key not in _warned:
        _warned.add(key)
        print(f"fedapt: warning: {message}", file=sys.stderr, flush=True)
