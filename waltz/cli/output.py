"""What the ``waltz`` commands print besides their results: errors with an exit code, warnings, JSON.

Only typer here, so that every command module may import it without slowing ``waltz --help``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import typer

__all__ = ["echo_json", "fail", "warn"]


def fail(message: str, code: int) -> typer.Exit:
    """Print ``error: <message>`` in red on stderr; return the exit to raise.

    Args:
        message: what happened and what to do.
        code: the exit code (1: refused or a check failed; 2: the command could not run).

    Returns:
        ``typer.Exit(code)``, for ``raise fail(...) from exc``.
    """
    typer.secho(f"error: {message}", err=True, fg=typer.colors.RED)
    return typer.Exit(code)


def echo_json(value: Any) -> None:
    """Print ``value`` as indented JSON with sorted keys."""
    typer.echo(json.dumps(value, indent=2, sort_keys=True))


def warn(lines: Iterable[str]) -> None:
    """Print each line as a bold yellow ``WARNING:`` on stderr."""
    for line in lines:
        typer.secho(f"WARNING: {line}", err=True, fg=typer.colors.YELLOW, bold=True)
