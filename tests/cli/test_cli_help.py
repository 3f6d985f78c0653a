"""Every ``waltz`` command's ``--help`` in a terminal of 80 columns: its description, its arguments
and options whole, nothing wider than the terminal.

80 columns is what a help piped to ``less`` or a file gets, and the default of many terminals. The
docstrings are hard-wrapped at about 95 characters; a help that kept those line breaks came out
ragged there (a line of 75 characters, then one of 20). Typer's Rich panels cut option names and
long words short with "…" there (``--partition-rou…``, ``WALTZ_ZOOKEEPER_CONNECT_ST…``), and
Markdown ate characters (``zookeeper.*, cluster.*`` lost both stars as emphasis); the help is Click's
own format (``waltz.cli.groups.MARKUP``), which wraps a word too long for its column across lines
rather than cut it, and keeps a hyphenated word (``--in-flight``, ``pause-server``) on one line.
"""

from __future__ import annotations

import inspect
import itertools
import re
from typing import Any

import pytest

from tests.cli.terminal import commands, help_output

WIDTH = 80
_SECTION = re.compile(r"(Arguments|Options|Commands):$")

COMMANDS = commands()


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
    assert {"client validate", "snapshot create", "archive restore"} <= paths
    assert len(paths) >= 70


@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=[" ".join(p) or "waltz" for p, _ in COMMANDS])
def test_the_help_shows_the_whole_description_wrapped_to_the_terminal(path: list[str], command: Any) -> None:
    described = _description(help_output(path, WIDTH))

    # Whole: every character of the help text, in order.
    assert _characters(" ".join(described)) == _characters(inspect.cleandoc(command.help or ""))

    # Wrapped to the width (Click's, 2 columns inside the terminal's): no line ends where the next
    # line's first word would still have fitted.
    for line, following in itertools.pairwise(described):
        if line.strip() and following.strip():
            assert len(line.rstrip()) + 1 + len(following.split()[0]) > WIDTH - 2, (line, following)


@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=[" ".join(p) or "waltz" for p, _ in COMMANDS])
def test_every_argument_and_option_is_shown_whole_within_the_width(path: list[str], command: Any) -> None:
    output = help_output(path, WIDTH)
    assert "…" not in output
    assert max(len(line) for line in output.splitlines()) <= WIDTH - 2, output  # Click's margin
    # A name typed with hyphens (an option, a fault, a file) stays whole on its line: a line that
    # ends in a word's hyphen broke one.
    assert not re.search(r"\w-$", output, re.MULTILINE), re.findall(r"^.*\w-$", output, re.MULTILINE)
    words = set(re.split(r"[\s,/]+", output))
    everything = _characters(output)
    for param in command.params:
        if param.param_type_name == "option":
            for name in [*param.opts, *param.secondary_opts]:
                assert name in words, (path, name)
        if getattr(param, "help", None):
            assert _characters(param.help) in everything, (path, param.name)


def test_no_placeholder_is_a_python_type() -> None:
    """A repeatable option's placeholder says what to give (``<dir>``, ``<ids>``), not the
    parameter's Python annotation (``<list[Path]>``, Typer's default)."""
    shown = {
        " ".join(path): re.findall(r"<[a-z]+\[[^>\s]*\]>", help_output(path, WIDTH)) for path, _ in COMMANDS
    }
    assert {name: found for name, found in shown.items() if found} == {}


@pytest.mark.parametrize(
    ("path", "named"),
    [
        (["up"], ["made in WORK_DIR/tls"]),
        (
            ["console"],
            [
                "(console.ssl.certFile, WALTZ_CONSOLE_SSL_CERT_FILE)",
                "(console.ssl.keyFile, WALTZ_CONSOLE_SSL_KEY_FILE)",
                "console.ssl.caFile, WALTZ_CONSOLE_SSL_CA_FILE",
            ],
        ),
        (["server", "start"], ["/metrics and /health (server.metrics.port)"]),
    ],
)
def test_an_option_names_its_setting_and_files_where_they_are(path: list[str], named: list[str]) -> None:
    """docs/configuration.md lists each option's key; the help says it too, and where `waltz up`
    makes its certificates (docs/local-cluster.md)."""
    shown = _characters(help_output(path, WIDTH))
    for text in named:
        assert _characters(text) in shown, text
