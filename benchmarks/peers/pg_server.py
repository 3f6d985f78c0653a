"""The PostgreSQL servers the peers run against: where a server listens, connection strings, a
database for a run, the server's settings, and the CPU its backends spent.

The peers that run on PostgreSQL (``bench_eventsourcing``, ``bench_smallbank_pg``,
``bench_smallbank_es``) each get a database of their own, created for the run and dropped
afterwards, by default on the local server ``scripts/setup`` and ``benchmarks/peers/setup.sh``
expect (:data:`LOCAL`, 127.0.0.1:5432, user postgres); ``bench_smallbank_pg --quorum`` runs on a
primary with two synchronous standbys of its own (``pg_quorum``), described by a
:class:`PgServer` like the local one.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import psycopg

from waltz.perf.cost import process_cpu_seconds


@dataclass(frozen=True, slots=True)
class PgServer:
    """Where a PostgreSQL server listens and whom the peers connect as (no password: trust).

    Attributes:
        host: its address.
        port: its TCP port.
        user: a superuser (the peers create and drop databases).
    """

    host: str = "127.0.0.1"
    port: int = 5432
    user: str = "postgres"

    def dsn(self, dbname: str = "postgres") -> str:
        """The connection string of database ``dbname`` on this server.

        Args:
            dbname: a database name; ``postgres`` (the maintenance database) by default.

        Returns:
            A libpq connection string.
        """
        return f"host={self.host} port={self.port} user={self.user} dbname={dbname}"


@dataclass(frozen=True, slots=True)
class Database:
    """A database of a run on a server: what the SmallBank peers' worker processes connect to.

    Attributes:
        name: the database's name.
        server: the server it is on.
    """

    name: str
    server: PgServer

    @property
    def dsn(self) -> str:
        """The database's libpq connection string."""
        return self.server.dsn(self.name)


#: The local server of ``scripts/setup``: 127.0.0.1:5432, user postgres.
LOCAL = PgServer()
HOST, PORT, USER = LOCAL.host, LOCAL.port, LOCAL.user
ADMIN_DSN = LOCAL.dsn()
#: The settings every result row of a PostgreSQL peer reports (:func:`server_settings`).
DURABILITY_SETTINGS = ("synchronous_commit", "fsync", "wal_sync_method")


def dsn(dbname: str, server: PgServer = LOCAL) -> str:
    """The connection string of database ``dbname`` on ``server``.

    Args:
        dbname: a database name.
        server: the server; the local one by default.

    Returns:
        A libpq connection string.
    """
    return server.dsn(dbname)


@contextmanager
def scratch_database(prefix: str, server: PgServer = LOCAL) -> Iterator[str]:
    """A database created for the run, dropped afterwards (its connections closed by force).

    Args:
        prefix: the start of its name; a random suffix follows.
        server: the server; the local one by default.

    Yields:
        The database's name.

    Raises:
        psycopg.OperationalError: the server is not reachable.
    """
    dbname = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server.dsn(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{dbname}"')
    try:
        yield dbname
    finally:
        with psycopg.connect(server.dsn(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')


def show(server: PgServer, names: Sequence[str]) -> dict[str, str]:
    """Settings of a server, as ``SHOW`` gives them.

    Args:
        server: the server.
        names: the settings' names.

    Returns:
        Each setting's value by name, in the order of ``names``.

    Raises:
        psycopg.OperationalError: the server is not reachable.
    """
    with psycopg.connect(server.dsn(), autocommit=True) as conn:
        return {name: str(conn.execute(f"SHOW {name}").fetchone()[0]) for name in names}  # type: ignore[index]


def server_settings(server: PgServer = LOCAL, names: Sequence[str] = DURABILITY_SETTINGS) -> tuple[str, str]:
    """The server's major version and its durability settings, for the result row.

    Args:
        server: the server; the local one by default.
        names: the settings to report, in this order.

    Returns:
        ``("PostgreSQL 15", "synchronous_commit=on, fsync=on, wal_sync_method=fdatasync")``, as the
        server says.

    Raises:
        psycopg.OperationalError: the server is not reachable.
    """
    with psycopg.connect(server.dsn(), autocommit=True) as conn:
        version = conn.info.server_version // 10000
    values = ", ".join(f"{name}={value}" for name, value in show(server, names).items())
    return f"PostgreSQL {version}", values


def _process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a local process (Linux ``/proc``), or None."""
    try:
        return process_cpu_seconds(pid)
    except (OSError, IndexError, ValueError):
        return None


def backend_cpu(dbname: str, server: PgServer = LOCAL) -> dict[int, float]:
    """CPU seconds of each server process (backend) connected to ``dbname``, by pid.

    Args:
        dbname: the run's database.
        server: the server it is on; the local one by default.

    Returns:
        The seconds by pid: readable when PostgreSQL runs on this machine, empty otherwise.
    """
    with psycopg.connect(server.dsn(), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()", (dbname,)
        ).fetchall()
    cpu = {int(pid): _process_cpu_seconds(int(pid)) for (pid,) in rows}
    return {pid: seconds for pid, seconds in cpu.items() if seconds is not None}
