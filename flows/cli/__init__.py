"""The ``fedapt`` command line: one module per command group on one Typer app
(``common``: what they share). Importing this package registers every command."""

from __future__ import annotations

# Registration order is the order of `fedapt --help`.
from flows.cli import experiment  # noqa: F401  isort: skip
from flows.cli import deployments  # noqa: F401  isort: skip
from flows.cli import services  # noqa: F401  isort: skip
from flows.cli import stages  # noqa: F401  isort: skip
from flows.cli import reproduce  # noqa: F401  isort: skip
from flows.cli.common import app, results_table

__all__ = ["app", "main", "results_table"]


def main() -> None:
    app(prog_name="fedapt")
