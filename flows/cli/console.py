"""The Typer app every command registers on, its two consoles (``out``, ``err``) and the one
error line (``print_error``)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

import typer
from rich.console import Console
from rich.text import Text
from typer._click import exceptions as click_errors  # typer ships its own copy of Click
from typer._click.core import Context
from typer.core import TyperGroup


class OneLineErrors(TyperGroup):
    """The command group whose usage errors (an unknown option or command, a missing value,
    a value of the wrong type, from any command or subgroup below it) are one line,
    ``fedapt: error: <command>: <what>`` and exit 2, like every other refusal: not Click's
    usage block and framed box."""

    def make_context(
        self, info_name: str | None, args: list[str], parent: Any = None, **extra: Any
    ) -> Context:
        path = f"{parent.command_path} {info_name}" if parent is not None else info_name
        with one_line_usage_errors(lambda: path or "fedapt"):
            if parent is None:
                refuse_empty_values(args)
            return super().make_context(info_name, args, parent, **extra)

    def resolve_command(self, ctx: Context, args: list[str]) -> Any:
        name, command, rest = super().resolve_command(ctx, args)
        ctx.meta[_PARSING] = f"{ctx.command_path} {name}"  # whose options are parsed next
        return name, command, rest

    def invoke(self, ctx: Context) -> Any:
        with one_line_usage_errors(lambda: ctx.meta.get(_PARSING, ctx.command_path)):
            return super().invoke(ctx)


_PARSING = "fedapt.parsing"


def refuse_empty_values(args: list[str]) -> None:
    """An empty value (``--out ''``, ``--partition=``, an empty argument) is a usage error,
    one line naming the command and the option: Click would read an empty path as the
    current folder and write there."""
    words = []
    for token in args:
        if not token or token.startswith("-"):
            break
        words.append(token)
    for i, token in enumerate(args):
        if token == "--":
            return
        if token.startswith("--") and token.endswith("=") and token.count("=") == 1:
            problem = f"{token[:-1]} is empty; give it a value"
        elif token == "":
            before = args[i - 1] if i else ""
            named = before.startswith("-") and "=" not in before
            problem = f"{before} is empty; give it a value" if named else "an empty argument"
        else:
            continue
        path = " ".join(["fedapt", *words])
        print_error(f"{' '.join(words) + ': ' if words else ''}{problem} (see `{path} --help`)")
        raise typer.Exit(2)


@contextlib.contextmanager
def one_line_usage_errors(command_path: Callable[[], str]) -> Iterator[None]:
    """A Click usage error (or other ClickException) as ``print_error``'s one line, naming
    the command (the error's own, else ``command_path()``), then exit with its code (2 for
    usage errors). The help that no arguments print (``no_args_is_help``) stays help."""
    try:
        yield
    except click_errors.NoArgsIsHelpError:
        raise
    except click_errors.ClickException as exc:
        ctx = getattr(exc, "ctx", None)
        path = ctx.command_path if ctx is not None else command_path()
        command = path.partition(" ")[2]
        hint = f" (see `{path} --help`)" if isinstance(exc, click_errors.UsageError) else ""
        print_error(f"{command + ': ' if command else ''}{exc.format_message()}{hint}")
        raise typer.Exit(exc.exit_code) from None


app = typer.Typer(
    cls=OneLineErrors,
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
