"""User-facing errors: each carries one readable line, printed by the CLI without a traceback."""

from __future__ import annotations

from collections.abc import Iterable


class FedaptError(Exception):
    """Base class of errors that the CLI reports as a single line and a non-zero exit."""


class ConfigError(FedaptError, ValueError):
    """A parameter is missing, malformed or out of range."""


class UnknownNameError(ConfigError):
    """A registry lookup failed; the message lists the valid names."""

    def __init__(self, kind: str, name: object, valid: Iterable[str]) -> None:
        self.kind, self.name, self.valid = kind, name, sorted(valid)
        super().__init__(f"unknown {kind} {name!r}; valid: {', '.join(self.valid)}")


class DataUnavailableError(FedaptError, FileNotFoundError):
    """Dataset files are missing and could not be fetched; the message says how to get them."""


def mask_credentials(text: str) -> str:
    """``text`` with the password of every URI in it masked: ``scheme://user:secret@host``
    -> ``scheme://user:***@host`` (tracking URIs, S3 endpoints: printed, logged or stored)."""
    import re

    return re.sub(r"(\b[A-Za-z][A-Za-z0-9+.-]*://[^\s/:@]*):[^\s/@]*@", r"\1:***@", text)
