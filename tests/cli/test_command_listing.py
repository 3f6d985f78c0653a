"""How a group lists its commands: ``waltz --help`` one line per command at 80 columns, every
other group the first sentence of each command's help (the whole text stays in its own help)."""

from __future__ import annotations

import typer

from tests.cli.terminal import help_output
from waltz.cli.groups import first_sentence
from waltz.cli.main import app


def _listing(args: list[str]) -> list[str]:
    """The lines of the Commands section of ``waltz <args> --help``, without their indent: one per
    command, and a wrapped description's further lines."""
    lines = help_output(args, 80).splitlines()
    start = lines.index("Commands:")
    end = next((i for i in range(start + 1, len(lines)) if not lines[i].strip()), len(lines))
    return [line.strip() for line in lines[start + 1 : end]]


def test_waltz_help_lists_every_command_on_one_line() -> None:
    rows = _listing([])
    names = [row.split()[0] for row in rows]
    assert set(names) >= {
        "demo",
        "up",
        "rebuild",
        "chaos",
        "server",
        "storage",
        "perf",
        "disk",
        "cluster",
        "db",
        "client",
    }
    # Each line names a command of waltz: no description runs on to a second line.
    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    assert names == list(commands), "a command's line runs on:\n" + "\n".join(rows)


def test_a_group_lists_the_first_sentence_of_each_command() -> None:
    rows = {row.split()[0]: row for row in _listing(["cluster", "storage"])}
    assert rows["add"].split(None, 1)[1] == "Add a storage node to the cluster, with no partition."
    add = help_output(["cluster", "storage", "add"])
    assert "Add a storage node to the cluster, with no partition." in add


def test_the_first_sentence_ends_at_the_first_full_stop_of_the_first_paragraph() -> None:
    assert first_sentence("Print the version.\n\nMore text.") == "Print the version."
    assert (
        first_sentence("Copy partitions (e.g. 1.2)\nfrom A to B. Then more.")
        == "Copy partitions (e.g. 1.2) from A to B."
    )
    assert first_sentence("No full stop at all") == "No full stop at all"
