"""``waltz disk``: inspect and verify storage files directly (placeholder replaced below)."""

import typer

app = typer.Typer(help="Inspect and verify a storage node's files directly.", no_args_is_help=True)
