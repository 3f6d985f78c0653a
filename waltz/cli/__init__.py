"""The ``waltz`` command line (typer)."""

from __future__ import annotations

from collections.abc import Sequence

import typer
import typer.core

__all__ = ["run_start_command"]


def run_start_command(app: typer.Typer, prog_name: str, argv: Sequence[str]) -> None:
    """Run the ``start`` command of one ``waltz`` sub-command's app with ``argv``.

    ``python -m waltz.services.server`` and ``...storage`` use it to start a node without importing
    every other command of ``waltz``. typer makes an app of a single command that command itself
    (no ``start`` word), and an app of several a group; both are handled.
    """
    command = typer.main.get_command(app)
    args = ["start", *argv] if isinstance(command, typer.core.TyperGroup) else list(argv)
    command.main(args=args, prog_name=prog_name)
