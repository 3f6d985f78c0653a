"""The PostgreSQL server the peers run against (127.0.0.1:5432, user postgres): connection
strings, a database for a run, the server's settings, and the CPU its backends spent.

The peers that run on PostgreSQL (``bench_eventsourcing``, ``bench_smallbank_pg``,
``bench_smallbank_es``) each get a database of their own, created for the run and dropped
afterwards, on the server ``scripts/setup`` and ``benchmarks/peers/setup.sh`` expect.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg

from waltz.perf.cost import process_cpu_seconds

HOST, PORT, USER = "127.0.0.1", 5432, "postgres"
ADMIN_DSN = f"host={HOST} port={PORT} user={USER} dbname=postgres"


def dsn(dbname: str) -> str:
    """The connection string of database ``dbname`` on the local server.

    Args:
        dbname: a database name.

    Returns:
        A libpq connection string.
    """
    return f"host={HOST} port={PORT} user={USER} dbname={dbname}"


@contextmanager
def scratch_database(prefix: str) -> Iterator[str]:
    """A database created for the run, dropped afterwards (its connections closed by force).

    Args:
        prefix: the start of its name; a random suffix follows.

    Yields:
        The database's name.

    Raises:
        psycopg.OperationalError: the server is not reachable.
    """
    dbname = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{dbname}"')
    try:
        yield dbname
    finally:
        with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')


def server_settings() -> tuple[str, str]:
    """The server's major version and its durability settings, for the result row.

    Returns:
        ``("PostgreSQL 15", "synchronous_commit=on, fsync=on, wal_sync_method=fdatasync")``, as the
        server says.
    """
    with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
        version = conn.info.server_version // 10000
        values = [
            f"{name}={conn.execute(f'SHOW {name}').fetchone()[0]}"  # type: ignore[index]
            for name in ("synchronous_commit", "fsync", "wal_sync_method")
        ]
    return f"PostgreSQL {version}", ", ".join(values)


def _process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a local process (Linux ``/proc``), or None."""
    try:
        return process_cpu_seconds(pid)
    except (OSError, IndexError, ValueError):
        return None


def backend_cpu(dbname: str) -> dict[int, float]:
    """CPU seconds of each server process (backend) connected to ``dbname``, by pid.

    Args:
        dbname: the run's database.

    Returns:
        The seconds by pid: readable when PostgreSQL runs on this machine, empty otherwise.
    """
    with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()", (dbname,)
        ).fetchall()
    cpu = {int(pid): _process_cpu_seconds(int(pid)) for (pid,) in rows}
    return {pid: seconds for pid, seconds in cpu.items() if seconds is not None}
