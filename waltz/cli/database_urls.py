"""Database URLs in the commands' messages: the first line of an error, the spelling SQLAlchemy
takes, and a check that a database answers before a long command starts (the password is hidden
by :func:`waltz.jdbc_style.binding.url_text`).

SQLAlchemy is imported when a function runs, not with the module, so that ``waltz --help`` stays
fast.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

__all__ = ["first_line", "require_live_database", "require_reachable", "url_hint"]


def first_line(error: BaseException) -> str:
    """The first line of an error's text (its type's name when it has none)."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def url_hint(url: str) -> str:
    """What to write instead of a URL SQLAlchemy does not take, or "" (e.g. ``postgres://``)."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme in ("postgres", "postgresql+psycopg2") or scheme.startswith("postgres+"):
        return " (SQLAlchemy names PostgreSQL with psycopg postgresql+psycopg://user@host/database)"
    if scheme in ("mysql", "mariadb"):
        return " (with PyMySQL: mysql+pymysql://user@host/database)"
    return ""


def require_reachable(url: str, option: str, *, check: Callable[[Connection], None] | None = None) -> None:
    """Connect to the database of ``option`` once, so that a command that starts Spark or a cluster
    first fails at once, and clearly, on a URL that cannot work.

    Args:
        check: run on that connection once it is open (:func:`require_live_database` checks the
            framework's tables with it); it raises what it finds wrong.

    Raises:
        ConfigurationError: the URL does not parse, names a driver that is not installed or an asyncio
            driver (the message gives the synchronous URL), or the database does not answer or does
            not exist (the message names the option, the URL without its password, the first line of
            the cause and what to do); or what ``check`` raised, or a database error of it.
    """
    from sqlalchemy import create_engine
    from sqlalchemy.exc import ArgumentError, DBAPIError, SQLAlchemyError

    from waltz.errors import AsyncEngineError, ConfigurationError
    from waltz.jdbc_style.binding import url_text
    from waltz.jdbc_style.engine import refuse_async_bind

    shown = url_text(url, hide_password=True)
    try:
        refuse_async_bind(url)
        engine = create_engine(url)
    except AsyncEngineError as exc:
        raise ConfigurationError(
            f"{option} {shown}: an asyncio driver; give the synchronous URL {exc.sync_url}"
        ) from exc
    except (ArgumentError, ImportError, ValueError) as exc:  # ValueError: a port that is not a number
        raise ConfigurationError(f"{option} {shown}: {first_line(exc)}{url_hint(url)}") from exc
    try:
        try:
            connection = engine.connect()
        except DBAPIError as exc:
            cause = first_line(exc.orig if exc.orig is not None else exc)
            missing = (
                " (create it first, e.g. createdb)"
                if "does not exist" in cause or "Unknown database" in cause
                else ""
            )
            raise ConfigurationError(f"{option} {shown}: cannot connect: {cause}{missing}") from exc
        with connection:
            if check is not None:
                check(connection)
    except SQLAlchemyError as exc:
        raise ConfigurationError(f"{option} {shown}: {first_line(exc)}") from exc
    finally:
        engine.dispose()


def require_live_database(url: str, option: str) -> None:
    """Check that the database of ``option`` is one an application's instances apply to, before a
    long command reads it (``waltz rebuild --verify-against``): a SQLite file that exists (it is
    not created), that answers (:func:`require_reachable`), with the framework's tables at this
    waltz-py's head (:func:`waltz.jdbc_style.migrations_api.check_current`), checked on the one
    connection :func:`require_reachable` opens.

    Raises:
        ConfigurationError: what :func:`require_reachable` raises; a SQLite file that does not
            exist; framework tables missing or at another revision (the message names the option,
            the URL without its password and what to do).
    """
    from pathlib import Path

    from waltz.errors import ConfigurationError
    from waltz.jdbc_style.binding import url_text
    from waltz.jdbc_style.engine import DatabaseUrlError, parse_database_url
    from waltz.jdbc_style.migrations_api import FrameworkTablesMissingError, check_current

    shown = url_text(url, hide_password=True)
    try:
        parsed = parse_database_url(url)
    except DatabaseUrlError:
        parsed = None  # require_reachable names what is wrong with the URL
    database = (parsed.database or "") if parsed is not None and parsed.get_backend_name() == "sqlite" else ""
    if database not in ("", ":memory:") and not database.startswith("file:") and not Path(database).is_file():
        raise ConfigurationError(
            f"{option} {shown}: no such SQLite file {database}: give the live database the "
            "application's instances apply to"
        )

    def framework_tables_at_head(connection: Connection) -> None:
        try:
            check_current(connection)
        except FrameworkTablesMissingError as exc:
            raise ConfigurationError(
                f"{option} {shown}: {first_line(exc)} (is this the database the application's "
                "instances apply to?)"
            ) from exc

    require_reachable(url, option, check=framework_tables_at_head)
