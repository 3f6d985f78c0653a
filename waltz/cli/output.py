"""What the ``waltz`` commands print besides their results: errors with an exit code, warnings, JSON.

Only typer here, so that every command module may import it without slowing ``waltz --help``.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterable
from typing import Any

import typer

__all__ = ["OPTIONAL_PACKAGES", "echo_json", "fail", "missing_extra", "warn"]


def fail(message: str, code: int) -> typer.Exit:
    """Print ``error: <message>`` in red on stderr; return the exit to raise.

    Args:
        message: what happened and what to do.
        code: the exit code (1: refused or a check failed; 2: the command could not run).

    Returns:
        ``typer.Exit(code)``, for ``raise fail(...) from exc``.
    """
    typer.secho(f"error: {message}", err=True, fg=typer.colors.RED)
    return typer.Exit(code)


def echo_json(value: Any) -> None:
    """Print ``value`` as indented JSON with sorted keys."""
    typer.echo(json.dumps(value, indent=2, sort_keys=True))


def warn(lines: Iterable[str]) -> None:
    """Print each line as a bold yellow ``WARNING:`` on stderr."""
    for line in lines:
        typer.secho(f"WARNING: {line}", err=True, fg=typer.colors.YELLOW, bold=True)


#: The packages that only an extra of waltz-py installs, by import name, with that extra
#: (pyproject.toml ``[project.optional-dependencies]``).
OPTIONAL_PACKAGES = {
    "sqlalchemy": ("SQLAlchemy", "sql"),
    "alembic": ("alembic", "sql"),
    "psycopg": ("psycopg", "sql"),
    "pymysql": ("PyMySQL", "sql"),
    "pyspark": ("PySpark", "spark"),
    "pyarrow": ("pyarrow", "archive"),
    "starlette": ("Starlette", "console"),
    "jinja2": ("Jinja2", "console"),
    "uvicorn": ("uvicorn", "console"),
    "httpx": ("httpx", "console"),
    "fastapi": ("FastAPI", "asgi"),
}


def missing_extra(error: ImportError) -> str | None:
    """What to install for an import that failed because an extra of waltz-py is not installed,
    as a sentence; None when the missing module is none of theirs (a defect, not a set-up step).
    """
    name = getattr(error, "name", None) or ""
    # Only the package itself missing: a name it lacks (another version) or a submodule of an
    # installed package is a defect, whose traceback stays.
    if not isinstance(error, ModuleNotFoundError) or name not in OPTIONAL_PACKAGES:
        return None
    if importlib.util.find_spec(name) is not None:
        return None
    package, extra = OPTIONAL_PACKAGES[name]
    return (
        f"{package} is not installed here; it comes with waltz-py's {extra} extra: "
        f"pip install 'waltz-py[{extra}]' (in a clone, WALTZ_EXTRAS=dev,sql,spark scripts/setup "
        "installs every extra)"
    )
