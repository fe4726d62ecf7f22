"""The Typer app every command registers on, its two consoles (``out``, ``err``) and the one
error line (``print_error``)."""

from __future__ import annotations

import sys

import typer
from rich.console import Console
from rich.text import Text

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="fedapt: communication-efficient federated learning with parameter-efficient adapters.",
)
out = Console(width=140) if not sys.stdout.isatty() else Console()
err = Console(stderr=True)


def print_error(message: str) -> None:
    """``fedapt: error: <message>`` on stderr, the prefix red; the message as plain text (a
    value such as ``[/x]`` or ``[full]`` is printed as is, never read as Rich markup), any
    password in a URI masked."""
    from fedcore.errors import mask_credentials

    line = Text("fedapt: error: ", style="red")
    message = mask_credentials(" ".join(message.splitlines())) if message else "(no message)"
    line.append(message)
    err.print(line, highlight=False, soft_wrap=True)
