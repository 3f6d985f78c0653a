"""The databases the framework's operator functions take: a URL, an engine or a connection.

:data:`Bind` is what :mod:`waltz.jdbc_style.migrations_api` and :mod:`waltz.jdbc_style.skips`
accept; :func:`connection_for` and :func:`transaction_for` turn it into a connection for the
length of one call, and :func:`describe` names it in messages without its password.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Connection, Engine, create_engine
from sqlalchemy.engine import URL
from sqlalchemy.pool import NullPool

__all__ = ["Bind", "connection_for", "describe", "engine_for", "transaction_for", "url_text", "utc"]

Bind = str | URL | Engine | Connection
"""A database: a SQLAlchemy URL (as text or :class:`~sqlalchemy.engine.URL`), an engine, or a connection."""


def utc(value: dt.datetime | None) -> dt.datetime | None:
    """Aware UTC; SQLite and MariaDB return naive datetimes, which we always write in UTC."""
    if value is None:
        return None
    if value.tzinfo is None:
        return value.replace(tzinfo=dt.UTC)
    return value.astimezone(dt.UTC)


def url_text(url: str | URL, *, hide_password: bool) -> str:
    """A URL as text, with its password or with ``***`` in its place.

    A string that does not parse as a URL (bad syntax, a port that is not a number) is shown as
    ``(unparsable URL)`` when the password is to be hidden, since it may hold one.
    """
    if isinstance(url, URL):
        return url.render_as_string(hide_password=hide_password)
    if not hide_password:
        return url
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        return "(unparsable URL)"


def describe(bind: Bind) -> str:
    """The database's URL with the password hidden, for messages."""
    if isinstance(bind, str | URL):
        return url_text(bind, hide_password=True)
    return bind.engine.url.render_as_string(hide_password=True)


@contextmanager
def engine_for(url: str | URL) -> Iterator[Engine]:
    """An engine without a pool for ``url``, disposed of afterwards."""
    engine = create_engine(url, poolclass=NullPool)
    try:
        yield engine
    finally:
        engine.dispose()


@contextmanager
def connection_for(bind: Bind) -> Iterator[Connection]:
    """A connection for reads: the given one, or a new one closed afterwards.

    A given connection that was outside a transaction is left outside one (the transaction the
    reads began is rolled back), so that a following :func:`upgrade` on it commits its own.
    """
    if isinstance(bind, Connection):
        began = not bind.in_transaction()
        try:
            yield bind
        finally:
            if began and bind.in_transaction():
                bind.rollback()
    elif isinstance(bind, Engine):
        with bind.connect() as connection:
            yield connection
    else:
        with engine_for(bind) as engine, engine.connect() as connection:
            yield connection


@contextmanager
def transaction_for(bind: Bind) -> Iterator[Connection]:
    """A connection in a transaction committed on success (a caller's transaction is left to it)."""
    if isinstance(bind, Connection):
        if bind.in_transaction():
            yield bind
        else:
            with bind.begin():
                yield bind
    elif isinstance(bind, Engine):
        with bind.begin() as connection:
            yield connection
    else:
        with engine_for(bind) as engine, engine.begin() as connection:
            yield connection
