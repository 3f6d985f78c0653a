"""Every ``waltz`` command's ``--help`` at 80 columns: its description whole and wrapped to the width.

80 columns is what a help piped to ``less`` or a file gets, and the default of many terminals. The
docstrings are hard-wrapped at about 95 characters; a help that kept those line breaks came out
ragged there (a line of 75 characters, then one of 20). Help is rendered as Markdown
(``waltz.cli.groups.MARKUP``), which can eat characters: ``zookeeper.*, cluster.*`` lost both stars
as emphasis, ``<storage dir>/<partition>/`` vanished as HTML.
"""

from __future__ import annotations

import importlib
import inspect
import io
import itertools
import re
from collections.abc import Iterator
from typing import Any

import pytest
import typer
from rich.console import Console
from rich.markdown import Markdown
from typer.testing import CliRunner

from waltz.cli.main import app

WIDTH = 80
_BOX = re.compile(r"[╭╰│]")


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


def _description(output: str) -> list[str]:
    """The lines of a help between its usage line and its first box."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("Usage:")) + 1
    end = next((i for i, line in enumerate(lines) if _BOX.match(line.strip())), len(lines))
    return lines[start:end]


def test_every_command_is_found() -> None:
    paths = {" ".join(path) for path, _ in COMMANDS}
    assert {"chaos", "perf producer", "cluster storage assign", "db upgrade", "disk verify"} <= paths
    assert len(paths) >= 40


@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=[" ".join(p) or "waltz" for p, _ in COMMANDS])
def test_the_help_shows_the_whole_description_wrapped_to_the_terminal(path: list[str], command: Any) -> None:
    # As a user runs it: `waltz <path> --help` (a lazy group loads on the way, waltz.cli.groups).
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": str(WIDTH), "TERM": "dumb"})
    assert result.exit_code == 0, result.output
    described = _description(result.output)

    # Whole: every word of the help text, in order (Markdown's code spans lose their backticks).
    expected = " ".join(inspect.cleandoc(command.help or "").replace("`", "").split())
    assert " ".join(" ".join(described).split()) == expected

    # Wrapped to the width: no line ends where the next line's first word would still have fitted.
    for line, following in itertools.pairwise(described):
        if line.strip() and following.strip():
            assert len(line.rstrip()) + 1 + len(following.split()[0]) > WIDTH - 1, (line, following)


def _plain_markdown(text: str) -> str:
    """``text`` rendered as Markdown (as Typer renders every help here), without styles, one line."""
    out = io.StringIO()
    Console(file=out, width=10_000, color_system=None).print(Markdown(inspect.cleandoc(text)))
    return " ".join(out.getvalue().split())


@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=[" ".join(p) or "waltz" for p, _ in COMMANDS])
def test_markdown_keeps_every_character_of_every_option_help(path: list[str], command: Any) -> None:
    for param in command.params:
        text = getattr(param, "help", None)
        if text:
            assert _plain_markdown(text) == " ".join(text.replace("`", "").split()), (path, param.name)
