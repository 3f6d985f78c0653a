"""Databases made for a test and dropped after it: on a PostgreSQL or MariaDB server, or a SQLite file.

Source: docs/design/overview.md "Packages and their imports" (``waltz.local`` is the harness that
starts real components for tests); ``docs/local-cluster.md`` (the pytest plugin's database
fixtures, which use these). They need the ``sql`` extra (SQLAlchemy and the drivers).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["DATABASE_NAME_PREFIX", "server_database", "sqlite_database"]

#: The names of the databases (and SQLite files) made here begin with it.
DATABASE_NAME_PREFIX = "waltz_test_"


def _new_name() -> str:
    return f"{DATABASE_NAME_PREFIX}{uuid.uuid4().hex[:8]}"


@contextmanager
def server_database(server_url: str) -> Iterator[str]:
    """An empty database made on a PostgreSQL or MariaDB server for the block, dropped after it.

    Args:
        server_url: a SQLAlchemy URL of the server, as a user that may create and drop databases
            (``postgresql+psycopg://postgres@127.0.0.1:5432/postgres``).

    Yields:
        The URL of the new database, ``waltz_test_<8 hex digits>`` on the same server (password
        included). When the block ends, the database's other connections are closed and it is
        dropped.

    Raises:
        sqlalchemy.exc.DBAPIError: the server refused the connection, the ``CREATE DATABASE`` or
            the ``DROP DATABASE``.
    """
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import OperationalError
    from sqlalchemy.pool import NullPool

    server = make_url(server_url)
    name = _new_name()
    postgres = server.get_backend_name() == "postgresql"
    quoted = f'"{name}"' if postgres else f"`{name}`"
    admin = create_engine(server, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    try:
        with admin.connect() as conn:
            conn.execute(text(f"CREATE DATABASE {quoted}"))
        try:
            yield server.set(database=name).render_as_string(hide_password=False)
        finally:
            with admin.connect() as conn:
                if postgres:
                    others = (
                        "SELECT pid FROM pg_stat_activity WHERE datname = :name AND pid <> pg_backend_pid()"
                    )
                    kill = "SELECT pg_terminate_backend(:id)"
                else:
                    others = "SELECT id FROM information_schema.processlist WHERE db = :name"
                    kill = "KILL CONNECTION :id"
                for (connection_id,) in conn.execute(text(others), {"name": name}).all():
                    try:
                        conn.execute(text(kill), {"id": int(connection_id)})
                    except OperationalError as error:
                        if "Unknown thread id" not in str(error):  # MariaDB: else it ended meanwhile
                            raise
                conn.execute(text(f"DROP DATABASE IF EXISTS {quoted}"))
    finally:
        admin.dispose()


@contextmanager
def sqlite_database(directory: Path) -> Iterator[str]:
    """An empty SQLite database for the block, a file in ``directory``, deleted after it.

    Args:
        directory: an existing directory (a test's ``tmp_path``).

    Yields:
        ``sqlite:///<directory>/waltz_test_<8 hex digits>.db`` (the file is made by the first
        connection). When the block ends, the file and its journal files are deleted.
    """
    path = directory / f"{_new_name()}.db"
    try:
        yield f"sqlite:///{path}"
    finally:
        for suffix in ("", "-journal", "-wal", "-shm"):
            path.with_name(path.name + suffix).unlink(missing_ok=True)
