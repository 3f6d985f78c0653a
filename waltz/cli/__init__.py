"""The ``waltz`` command line (typer)."""
