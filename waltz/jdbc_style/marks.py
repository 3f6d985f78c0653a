"""High-water-mark rows: created race-free, read, locked for an apply, and advanced.

Source: docs/design/sql.md "The high-water-mark table" (the database stores the highest
transaction ID it has applied). Rows live in ``waltz_high_water_marks`` keyed by
(cluster name, partition ID); see :mod:`waltz.jdbc_style.schema`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Column, Insert, Table, bindparam, select, update
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError
from sqlalchemy.sql.base import Executable

from waltz.jdbc_style.direct import direct_statements
from waltz.jdbc_style.schema import high_water_marks as _marks

__all__ = ["HighWaterMarks", "insert_if_absent", "logs_followed"]


def _insert_skipping_present(conn: Connection, table: Table) -> Insert | None:
    """The backend's insert into ``table`` that skips a row whose primary key is present, without
    failing on a race: ``ON CONFLICT DO NOTHING`` on PostgreSQL and SQLite, ``ON DUPLICATE KEY
    UPDATE`` of a key column to itself (a no-op) on MySQL and MariaDB; None on other backends."""
    name = conn.dialect.name
    if name == "postgresql":
        return postgresql.insert(table).on_conflict_do_nothing()
    if name == "sqlite":
        return sqlite.insert(table).on_conflict_do_nothing()
    if name in ("mysql", "mariadb"):
        first_key = table.primary_key.columns.values()[0].name
        stmt = mysql.insert(table)
        return stmt.on_duplicate_key_update({first_key: stmt.inserted[first_key]})
    return None


def insert_if_absent(conn: Connection, table: Table, values: Mapping[str, Any]) -> None:
    """Insert a row unless one with the same primary key exists, without failing on a race.

    Another instance may insert the same key at the same moment: PostgreSQL and SQLite use ``ON
    CONFLICT DO NOTHING``, MySQL/MariaDB ``ON DUPLICATE KEY UPDATE`` of a key column to itself
    (a no-op), other backends a savepoint that swallows the duplicate-key error.
    """
    insert = _insert_skipping_present(conn, table)
    if insert is not None:
        conn.execute(insert, dict(values))
        return
    savepoint = conn.begin_nested()
    try:
        conn.execute(table.insert(), dict(values))
    except IntegrityError:
        savepoint.rollback()
    else:
        savepoint.commit()


def insert_rows_if_absent(conn: Connection, table: Table, rows: Sequence[Mapping[str, Any]]) -> None:
    """:func:`insert_if_absent` for several rows in one execution (PostgreSQL, SQLite, MySQL and
    MariaDB; other backends: one savepoint per row). Nothing for no rows.

    The rows go as the parameters of one statement executed for many (SQLAlchemy's
    "insertmanyvalues", batched into multi-row ``VALUES`` by the driver's dialect), so the
    statement is compiled once per table, not once per number of rows.
    """
    if not rows:
        return
    insert = _insert_skipping_present(conn, table)
    if insert is not None:
        conn.execute(insert, [dict(row) for row in rows])
        return
    for row in rows:
        insert_if_absent(conn, table, row)


def inserted_rows_if_absent(
    conn: Connection, table: Table, rows: Sequence[Mapping[str, Any]], column: Column[Any]
) -> set[Any] | None:
    """:func:`insert_rows_if_absent`, and the values of ``column`` of the rows this execution
    inserted: on PostgreSQL and SQLite (3.35 or later), where ``ON CONFLICT DO NOTHING RETURNING``
    returns only those. None on other backends, which insert as :func:`insert_rows_if_absent`
    does but cannot tell (an older SQLite and MySQL have no ``RETURNING``; MariaDB's ``ON
    DUPLICATE KEY UPDATE`` would return the rows that were there too): the caller reads the
    table. An empty set for no rows."""
    if not rows:
        return set()
    if conn.dialect.name in ("postgresql", "sqlite") and conn.dialect.insert_executemany_returning:
        insert = _insert_skipping_present(conn, table)
        if insert is not None:
            result = conn.execute(insert.returning(column), [dict(row) for row in rows])
            return {row[0] for row in result}
    insert_rows_if_absent(conn, table, rows)
    return None


def logs_followed(conn: Connection) -> set[str]:
    """The names of the logs (clusters) whose mark rows the database holds."""
    return {str(name) for name in conn.scalars(select(_marks.c.cluster_name).distinct())}


class HighWaterMarks:
    """The mark rows of one Waltz cluster (log) in one database.

    Args:
        cluster_name: the log's name, the first half of every row's key.
    """

    def __init__(self, cluster_name: str) -> None:
        self.cluster_name = cluster_name
        self._where_cluster = _marks.c.cluster_name == cluster_name
        # Built once: a statement object reused with new parameters skips SQLAlchemy's cache-key
        # walk, which costs more than the round trip of these one-row statements.
        where = (_marks.c.cluster_name == bindparam("mark_cluster")) & (
            _marks.c.partition_id == bindparam("mark_partition")
        )
        self._read = select(_marks.c.high_water_mark).where(where)
        self._lock = self._read.with_for_update()
        self._advance = (
            update(_marks)
            .where(where & (_marks.c.high_water_mark == bindparam("expected_mark")))
            .values(high_water_mark=bindparam("new_mark"), updated_at=bindparam("now"))
        )

    def _key(self, partition_id: int) -> dict[str, Any]:
        return {"mark_cluster": self.cluster_name, "mark_partition": partition_id}

    def ensure(self, conn: Connection, partition_id: int) -> None:
        """Create the partition's row at -1 unless it exists (race-free, see :func:`insert_if_absent`)."""
        insert_if_absent(
            conn,
            _marks,
            {
                "cluster_name": self.cluster_name,
                "partition_id": partition_id,
                "high_water_mark": -1,
                "updated_at": _now(),
            },
        )

    def read(self, conn: Connection, partition_id: int) -> int | None:
        """The partition's mark as this transaction sees it, or None when it has no row."""
        return conn.execute(self._read, self._key(partition_id)).scalar()

    def read_all(self, conn: Connection) -> dict[int, int]:
        """Every partition's mark: ``{partition_id: high_water_mark}``."""
        rows = conn.execute(
            select(_marks.c.partition_id, _marks.c.high_water_mark).where(self._where_cluster)
        )
        return {int(pid): int(mark) for pid, mark in rows}

    def lock(self, conn: Connection, partition_id: int) -> int:
        """Lock the partition's row for the rest of the transaction and return its mark.

        ``SELECT ... FOR UPDATE`` on PostgreSQL and MySQL/MariaDB (SQLite holds its database
        write lock already: the framework begins apply transactions with ``BEGIN IMMEDIATE``).
        A missing row is created first.
        """
        key = self._key(partition_id)
        mark = conn.execute(self._lock, key).scalar()
        if mark is None:
            self.ensure(conn, partition_id)
            mark = conn.execute(self._lock, key).scalar()
            if mark is None:  # pragma: no cover - the insert above guarantees a row
                raise RuntimeError(f"high-water-mark row of partition {partition_id} vanished")
        return int(mark)

    def advance_statement(
        self, partition_id: int, expected: int, new: int
    ) -> tuple[Executable, dict[str, Any]]:
        """The statement of :meth:`try_advance` and its parameters, to run with other statements:
        it changes one row when the row held ``expected`` (and then holds ``new``, locked), none
        otherwise."""
        parameters = {**self._key(partition_id), "expected_mark": expected, "new_mark": new, "now": _now()}
        return self._advance, parameters

    def try_advance(self, conn: Connection, partition_id: int, expected: int, new: int) -> bool:
        """Move the row from ``expected`` to ``new`` if it holds ``expected``, locking it.

        One statement where :meth:`lock` and :meth:`advance` take two: the row is locked (the
        ``UPDATE`` takes its row lock, SQLite's write lock is held already) for the rest of the
        transaction whether or not it moved.

        Returns:
            True when the row held ``expected`` and now holds ``new``; False otherwise (another
            instance moved it, the row is missing, or there is a gap), with nothing changed.
        """
        statement, parameters = self.advance_statement(partition_id, expected, new)
        return direct_statements(conn.engine).run(conn, statement, (parameters,)) == 1

    def advance(self, conn: Connection, partition_id: int, expected: int, new: int) -> None:
        """Move the locked row from ``expected`` to ``new`` (checked: the row must hold ``expected``).

        Raises:
            RuntimeError: the row did not hold ``expected`` (it was not locked by this transaction).
        """
        if not self.try_advance(conn, partition_id, expected, new):
            raise RuntimeError(
                f"cluster {self.cluster_name!r} partition {partition_id}: the high-water mark moved "
                f"from {expected} while its row was locked (is another writer bypassing the lock?)"
            )


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)
