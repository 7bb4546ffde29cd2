"""Shared console output and the one way a command reports a user mistake (exit code 2, no stack trace)."""

from __future__ import annotations

from typing import NoReturn

import typer
from rich.console import Console

console = Console()
# Errors and hints are never hard-wrapped: a terminal wraps them itself, and in a log or a captured stderr a message
# cut at 80 columns breaks every grep for its words (rich wraps at the console's width, 80 where stderr is no terminal).
err_console = Console(stderr=True, soft_wrap=True)

USAGE_ERROR = 2


class UsageError(Exception):
    """A mistake the user can fix (bad flag value, missing file, wrong URL); the CLI prints it and exits 2."""


def fail(message: str, hint: str | None = None) -> NoReturn:
    """Print what is wrong (and how to fix it) on stderr and exit with status 2."""
    err_console.print(f"[bold red]error:[/] {message}")
    if hint:
        err_console.print(f"[yellow]hint:[/] {hint}")
    raise typer.Exit(USAGE_ERROR)
