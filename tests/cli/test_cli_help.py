"""Every ``waltz`` command's ``--help`` at 80 columns: its description and every option whole, wrapped
to the width.

80 columns is what a help piped to ``less`` or a file gets, and the default of many terminals. The
docstrings are hard-wrapped at about 95 characters; a help that kept those line breaks came out
ragged there (a line of 75 characters, then one of 20). Typer's Rich panels cut option names and
long words short with "…" there (``--partition-rou…``, ``WALTZ_ZOOKEEPER_CONNECT_ST…``), and
Markdown ate characters (``zookeeper.*, cluster.*`` lost both stars as emphasis); the help is Click's
own format (``waltz.cli.groups.MARKUP``).
"""

from __future__ import annotations

import importlib
import inspect
import itertools
import re
from collections.abc import Iterator
from typing import Any

import click
import pytest
import typer
from typer.testing import CliRunner

from waltz.cli.main import app

WIDTH = 80
_SECTION = re.compile(r"(Arguments|Options|Commands):$")


def _commands() -> Iterator[tuple[list[str], Any]]:
    """(path, command) of every command and group of ``waltz``, the lazy groups loaded."""

    def walk(command: Any, path: list[str]) -> Iterator[tuple[list[str], Any]]:
        yield path, command
        for name, sub in getattr(command, "commands", {}).items():
            yield from walk(sub, [*path, name])

    root: Any = typer.main.get_command(app)
    for name in ("disk", "cluster", "db"):  # loaded as `waltz <name>` would load them
        loaded: Any = typer.main.get_command(importlib.import_module(f"waltz.cli.{name}").app)
        root.commands[name] = loaded
    yield from walk(root, [])


COMMANDS = list(_commands())


def _help(path: list[str]) -> str:
    """``waltz <path> --help`` as a user runs it at 80 columns (a lazy group loads on the way,
    waltz.cli.groups)."""
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": str(WIDTH), "TERM": "dumb"})
    assert result.exit_code == 0, result.output
    return result.output


def _description(output: str) -> list[str]:
    """The lines of a help between its usage line and its first section (Options, Commands...)."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("Usage:")) + 1
    end = next((i for i, line in enumerate(lines) if _SECTION.match(line)), len(lines))
    return lines[start:end]


def _characters(text: str) -> str:
    """``text`` without its white space: what wrapping, at any width, cannot change."""
    return "".join(text.split())


def test_every_command_is_found() -> None:
    paths = {" ".join(path) for path, _ in COMMANDS}
    assert {"chaos", "perf producer", "cluster storage assign", "db upgrade", "disk verify"} <= paths
    assert len(paths) >= 40


@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=[" ".join(p) or "waltz" for p, _ in COMMANDS])
def test_the_help_shows_the_whole_description_wrapped_to_the_terminal(path: list[str], command: Any) -> None:
    described = _description(_help(path))

    # Whole: every character of the help text, in order (wrapping may break a line at a hyphen).
    assert _characters(" ".join(described)) == _characters(inspect.cleandoc(command.help or ""))

    # Wrapped to the width: no line ends where the next line's first word would still have fitted.
    for line, following in itertools.pairwise(described):
        if line.strip() and following.strip():
            assert len(line.rstrip()) + 1 + len(following.split()[0]) > WIDTH - 1, (line, following)


@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=[" ".join(p) or "waltz" for p, _ in COMMANDS])
def test_every_option_is_shown_whole_within_the_width(path: list[str], command: Any) -> None:
    output = _help(path)
    assert "…" not in output
    assert max(len(line) for line in output.splitlines()) <= WIDTH, output
    words = set(re.split(r"[\s,/]+", output))
    everything = _characters(output)
    for param in command.params:
        if not isinstance(param, click.Option):
            continue
        for name in [*param.opts, *param.secondary_opts]:
            assert name in words, (path, name)
        if getattr(param, "help", None):
            assert _characters(param.help) in everything, (path, param.name)
