"""``waltz <command> --help`` as a terminal of a given width shows it, and every command of ``waltz``.

Typer's ``CliRunner`` lays help out at 80 columns whatever ``COLUMNS`` says (its isolation forces
the width), where a terminal of 80 columns gets Click's width of 78: a line that fits in the test
would wrap for the user. :class:`TerminalRunner` lets ``COLUMNS`` decide, as a terminal does.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from typing import Any

import typer
from typer._click import formatting
from typer.testing import CliRunner

from waltz.cli.main import app

#: The groups ``waltz`` imports only when they are used (waltz.cli.groups).
LAZY_GROUPS = ("disk", "cluster", "client", "db", "snapshot", "archive")


class TerminalRunner(CliRunner):
    """A ``CliRunner`` whose help is as wide as ``COLUMNS`` lets Click make it."""

    @contextlib.contextmanager
    def isolation(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        with super().isolation(*args, **kwargs) as streams:
            formatting.FORCED_WIDTH = None  # restored by the isolation on the way out
            yield streams


def help_output(path: list[str], width: int = 80) -> str:
    """``waltz <path> --help`` in a terminal of ``width`` columns (a lazy group loads on the way)."""
    result = TerminalRunner().invoke(app, [*path, "--help"], env={"COLUMNS": str(width), "TERM": "dumb"})
    assert result.exit_code == 0, result.output
    return result.output


def commands() -> list[tuple[list[str], Any]]:
    """(path, command) of every command and group of ``waltz``, the lazy groups loaded."""

    def walk(command: Any, path: list[str]) -> Iterator[tuple[list[str], Any]]:
        yield path, command
        for name, sub in getattr(command, "commands", {}).items():
            yield from walk(sub, [*path, name])

    root: Any = typer.main.get_command(app)
    for name in LAZY_GROUPS:  # loaded as `waltz <name>` would load them
        root.commands[name] = typer.main.get_command(importlib.import_module(f"waltz.cli.{name}").app)
    return list(walk(root, []))
