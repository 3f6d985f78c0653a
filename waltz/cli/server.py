"""``waltz server``: run a Waltz server (the command lives in :mod:`waltz.services.server.command`)."""

from __future__ import annotations

import typer

from waltz.cli.groups import MARKUP
from waltz.services.server.command import start

app = typer.Typer(help="Run a Waltz server.", no_args_is_help=True, rich_markup_mode=MARKUP)
app.command("start")(start)
