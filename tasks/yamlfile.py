"""The params file as text: reading it strictly, YAML lines of keys, ``--set`` overrides.

``tasks.config`` types what this reads; this module only knows YAML. Every problem is one
``ConfigError`` line naming the file (and the line where YAML knows it).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from fedcore.errors import ConfigError


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (YAML allows the last to win)."""


def _no_duplicates(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)  # type: ignore[no-untyped-call]
        line = key_node.start_mark.line + 1
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"duplicate key {key!r} (first on line {seen[key]})",
                key_node.start_mark,
            )
        seen[key] = line
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicates)


def read_mapping(source: str) -> tuple[str, dict[str, Any]]:
    """The text of params file ``source`` and its top-level mapping of sections."""
    p = Path(source)
    if p.is_dir():
        raise ConfigError(f"params file {source} is a directory, not a YAML file")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"params file {source} is not UTF-8 text (a binary file?)") from None
    except OSError as exc:
        raise ConfigError(f"params file {source}: cannot read it ({exc.strerror})") from None
    try:
        raw = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 (a SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark else source
        problem = getattr(exc, "problem", None) or "malformed YAML"
        raise ConfigError(f"{where}: malformed YAML: {problem}") from None
    if raw is None:
        raise ConfigError(f"params file {source} is empty: it needs at least one section")
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a mapping of sections at the top level")
    return text, raw


def yaml_line(text: str, path: tuple[Any, ...]) -> int | None:
    """1-based line of the YAML node at ``path`` (or of its deepest existing parent)."""
    try:
        node = yaml.compose(text)
    except yaml.YAMLError:
        return None
    line = None
    for key in path:
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if k.value == str(key):
                    line, node = k.start_mark.line + 1, v
                    break
            else:
                return line
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            node = node.value[key]
            line = node.start_mark.line + 1
        else:
            return line
    return line


def where(source: str, text: str, path: tuple[Any, ...]) -> str:
    """``source:line`` of the key at ``path`` (just ``source`` when the text does not say)."""
    line = yaml_line(text, path) if text else None
    return f"{source}:{line}" if line else source


def parse_override(item: str) -> tuple[list[str], Any]:
    """``a.b=value`` -> (["a", "b"], yaml-parsed value)."""
    if "=" not in item:
        raise ConfigError(f"--set expects key=value (got {item!r})")
    key, raw = item.split("=", 1)
    parts = [p for p in key.strip().split(".") if p]
    if not parts:
        raise ConfigError(f"--set expects key=value (got {item!r})")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return parts, value


def apply_overrides(
    raw: dict[str, Any], overrides: list[str], sections: Iterable[str]
) -> dict[str, Any]:
    """``raw`` with each ``key=value`` of ``overrides`` set (``sections``: the top-level keys)."""
    sections = list(sections)
    data = copy.deepcopy(raw)
    for item in overrides:
        parts, value = parse_override(item)
        if parts[0] not in sections:
            raise ConfigError(
                f"--set {'.'.join(parts)}: unknown key {parts[0]!r}; allowed: "
                + ", ".join(sections)
            )
        node = data
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {'.'.join(parts)}: {p!r} is not a section")
        node[parts[-1]] = value
    return data
