"""The ``waltz`` command line (typer): every command, over every package of waltz-py."""
