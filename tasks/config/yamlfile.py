"""The params file as text: reading it strictly, YAML lines of keys, ``--set`` overrides.

``tasks.config`` types what this reads; this module only knows YAML. Every problem is one
``ConfigError`` line naming the file (and the line where YAML knows it), the parser's own
limits included: a file larger than MAX_FILE_BYTES, nesting deeper than MAX_DEPTH (Python's
recursion limit would stop PyYAML), integers longer than MAX_INT_CHARS (Python refuses to
convert one of 4,300 digits) and aliases expanding past MAX_NODES values (a "billion laughs"
file) are refused before PyYAML builds anything.

Numbers are read as YAML 1.2 writes them: ``1e-3`` is a float (PyYAML's YAML 1.1 wants
``1.0e-3`` and reads ``1e-3`` as a string; the params are typed strictly, so it must be one).
"""

from __future__ import annotations

import copy
import errno
import os
import re
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from fedcore.errors import ConfigError


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (YAML allows the last to win)."""


MERGE_TAG = "tag:yaml.org,2002:merge"
INT_TAG = "tag:yaml.org,2002:int"
FLOAT_TAG = "tag:yaml.org,2002:float"


def _no_duplicates(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    """The mapping, once no key of its own is given twice and every key is a plain value (a
    merge key's ``<<: *anchor`` entries may be overridden, as YAML says)."""
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == MERGE_TAG:
            continue
        key = loader.construct_object(key_node, deep=deep)  # type: ignore[no-untyped-call]
        line = key_node.start_mark.line + 1
        try:
            again = key in seen
        except TypeError:  # a list or mapping as a key (`? [a, b]`, `{[a]: 1}`)
            raise yaml.constructor.ConstructorError(
                None, None, "a key must be a name, not a list or mapping", key_node.start_mark
            ) from None
        if again:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"duplicate key {key!r} (first on line {seen[key]})",
                key_node.start_mark,
            )
        seen[key] = line
    return loader.construct_mapping(node, deep=deep)


def _int(loader: _StrictLoader, node: yaml.ScalarNode) -> int:
    """A YAML 1.2 integer: decimal (``010`` is ten), ``0o17`` or ``0x1f``; PyYAML's YAML 1.1
    read ``010`` as octal 8 and ``1:30`` as 90."""
    text = loader.construct_scalar(node)  # type: ignore[no-untyped-call]
    digits = str(text).lstrip("+-")
    return int(text, 0) if digits[:2] in ("0o", "0x") else int(text, 10)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicates)
_StrictLoader.add_constructor(INT_TAG, _int)
# Numbers as YAML 1.2's core schema reads them, not YAML 1.1's (PyYAML): no sexagesimal
# 1:30, no octal 010, no 0b101 or 1_000 (strings, refused where a number is expected);
# floats without a point (1e-3, 5E+2) are floats
_StrictLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in (INT_TAG, FLOAT_TAG)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_StrictLoader.add_implicit_resolver(  # type: ignore[no-untyped-call]
    INT_TAG, re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"), list("-+0123456789")
)
_StrictLoader.add_implicit_resolver(  # type: ignore[no-untyped-call]
    FLOAT_TAG,
    re.compile(
        r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)

MAX_FILE_BYTES = 1 << 20  # a params file is a few KiB; this is not one
MAX_DEPTH = 32  # sections nest 4 deep; Python's recursion limit stops PyYAML near 1,000
MAX_INT_CHARS = 40  # every integer fits int64 (19 digits); Python refuses 4,300 digits
MAX_NODES = 100_000  # values after aliases are expanded (params.yaml: a few hundred)
_INT = re.compile(r"[-+]?(?:0x[0-9a-fA-F_]+|0b[01_]+|0o?[0-7_]+|[0-9][0-9_]*)")


def check_limits(text: str, source: str, *, lines: bool = True) -> None:
    """Refuse, with ``source:line``, YAML nested deeper than MAX_DEPTH, an integer longer
    than MAX_INT_CHARS or aliases that expand past MAX_NODES values, before PyYAML's
    recursive composer, ``int()`` or the validation of every expanded copy meets it (PyYAML's
    event parser is iterative: it reads any depth)."""
    sizes: list[list[Any]] = [[None, 0]]  # per open collection: its anchor, its values so far
    anchored: dict[str, int] = {}  # anchor -> values its node expands to
    aliased = False  # whether the file uses an alias at all (else the file itself is huge)
    try:
        for event in yaml.parse(text, Loader=_StrictLoader):
            at = f"{source}:{event.start_mark.line + 1}" if lines else source
            if isinstance(event, yaml.CollectionStartEvent):
                sizes.append([event.anchor, 1])
                if len(sizes) - 1 > MAX_DEPTH:
                    raise ConfigError(
                        f"{at}: nested {len(sizes) - 1} levels deep; a params file nests at "
                        f"most {MAX_DEPTH} (its sections use 4)"
                    )
                continue
            if isinstance(event, yaml.CollectionEndEvent):
                anchor, size = sizes.pop()
            elif isinstance(event, yaml.ScalarEvent):
                anchor, size = event.anchor, 1
                if (
                    (event.style is None or event.tag in (INT_TAG, "!!int"))
                    and len(event.value) > MAX_INT_CHARS
                    and _INT.fullmatch(event.value.strip())
                ):
                    raise ConfigError(
                        f"{at}: an integer of {len(event.value)} characters; every "
                        f"integer in the params fits int64 (at most 19 digits)"
                    )
            elif isinstance(event, yaml.AliasEvent):
                anchor, size = None, anchored.get(event.anchor or "", 1)
                aliased = True
            else:
                continue
            if anchor:
                anchored[anchor] = size
            sizes[-1][1] += size
            if sizes[-1][1] > MAX_NODES:
                what = "the aliases (*name) expand to" if aliased else "the file holds"
                raise ConfigError(
                    f"{at}: {what} more than {MAX_NODES} values; a params file holds a few hundred"
                )
    except yaml.YAMLError:
        return  # malformed: yaml.load says where, as it always has


def check_regular_file(p: Path, source: str) -> None:
    """``source`` names a regular file (through any links): else one line saying what it is.
    A named pipe or a device would block the read or never end; a link loop is no "missing
    file"."""
    try:
        mode = p.stat().st_mode
    except FileNotFoundError:
        dangling = p.is_symlink()
        raise ConfigError(
            f"params file {source} not found"
            + (f" (a symbolic link to {os.readlink(p)}, which does not exist)" if dangling else "")
        ) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ConfigError(
                f"params file {source} is a loop of symbolic links (it leads back to itself); "
                "give the YAML file itself"
            ) from None
        raise ConfigError(f"params file {source}: cannot read it ({exc.strerror})") from None
    if stat.S_ISDIR(mode):
        raise ConfigError(f"params file {source} is a directory, not a YAML file")
    if not stat.S_ISREG(mode):
        raise ConfigError(
            f"params file {source} is not a regular file (a named pipe, device or socket, "
            "which would be read without end); give a YAML file"
        )


# PyYAML's problems that say what is wrong but not what a params file allows instead
_HINTS = (
    ("could not determine a constructor for the tag", "a params file holds plain values, no !tags"),
    ("found character '\\t'", "indent with spaces: YAML allows no tabs there"),
    ("found another document", "a params file is one YAML document, without a second '---'"),
)


def yaml_error(exc: yaml.YAMLError, text: str, source: str) -> str:
    """One line for a file PyYAML cannot read: the file and line, PyYAML's context and
    problem, and what a params file allows where that is not plain from them."""
    if isinstance(exc, yaml.reader.ReaderError):  # a character YAML never allows (NUL, ...)
        line = text[: exc.position].count("\n") + 1
        char = exc.character if isinstance(exc.character, str) else chr(exc.character)
        return (
            f"{source}:{line}: malformed YAML: the character {char!r} (U+{ord(char):04X}) "
            "is not allowed in YAML; a params file is plain text"
        )
    mark = getattr(exc, "problem_mark", None)
    where = f"{source}:{mark.line + 1}" if mark else source
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    context = getattr(exc, "context", None)
    said = f"{context}, {problem}" if context and context not in problem else problem
    hint = next((h for needle, h in _HINTS if needle in problem), None)
    return f"{where}: malformed YAML: {said}" + (f" ({hint})" if hint else "")


def read_mapping(source: str) -> tuple[str, dict[str, Any]]:
    """The text of params file ``source`` and its top-level mapping of sections."""
    p = Path(source)
    check_regular_file(p, source)
    try:
        with p.open("rb") as fh:  # at most one byte past the limit (a device never ends)
            data = fh.read(MAX_FILE_BYTES + 1)
        if len(data) > MAX_FILE_BYTES:
            raise ConfigError(
                f"params file {source} is larger than {MAX_FILE_BYTES >> 20} MiB; a params "
                "file is a few KiB of YAML (is it the right file?)"
            )
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"params file {source} is not UTF-8 text (a binary file?)") from None
    except OSError as exc:
        raise ConfigError(f"params file {source}: cannot read it ({exc.strerror})") from None
    check_limits(text, source)
    try:
        raw = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 (a SafeLoader)
    except yaml.YAMLError as exc:
        raise ConfigError(yaml_error(exc, text, source)) from None
    except (RecursionError, ValueError) as exc:  # a limit check_limits did not foresee
        raise ConfigError(f"{source}: beyond what the YAML parser reads ({exc})") from None
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
    """``a.b=value`` -> (["a", "b"], the value read as YAML, as the params file reads it);
    ``a.b=`` is the empty string (refused where a value is expected: ``null`` says null)."""
    if "=" not in item:
        raise ConfigError(f"--set expects key=value (got {item!r})")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"--set expects key=value (got {item!r})")
    parts = key.split(".")
    if not all(parts):  # `a..b`, `.a`, `a.`: a typo, never read as a.b
        raise ConfigError(
            f"--set {key}: an empty key between dots; allowed: section.key=value, e.g. "
            "federation.rounds=5"
        )
    if not raw.strip():
        return parts, ""
    source = f"--set {'.'.join(parts)}"
    check_limits(raw, source, lines=False)
    try:
        value = yaml.load(raw, Loader=_StrictLoader)  # noqa: S506 (a SafeLoader)
    except yaml.YAMLError:
        value = raw
    except (RecursionError, ValueError) as exc:
        raise ConfigError(f"{source}: beyond what the YAML parser reads ({exc})") from None
    return parts, value


def apply_overrides(
    raw: dict[str, Any],
    overrides: list[str],
    sections: Iterable[str],
    startable: Iterable[str] = (),
) -> dict[str, Any]:
    """``raw`` with each ``key=value`` of ``overrides`` set (``sections``: the top-level keys;
    ``startable``: the dotted sections whose null means "off", which a key set under them
    starts from their defaults, e.g. ``privacy``)."""
    startable = set(startable)
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
        for i, p in enumerate(parts[:-1]):
            if node.get(p, {}) is None and ".".join(parts[: i + 1]) in startable:
                node[p] = {}  # `--set privacy.clip=1` turns privacy on
            node = node.setdefault(p, {})
            if node is None:  # `federation:` with nothing under it (YAML's null)
                raise ConfigError(
                    f"--set {'.'.join(parts)}: {p!r} is empty (null) in the params file; "
                    "allowed: a section of key: value lines under it, or no such line"
                )
            if not isinstance(node, dict):
                raise ConfigError(f"--set {'.'.join(parts)}: {p!r} is not a section")
        node[parts[-1]] = value
    return data
