"""Connections the callbacks keep checked out of the engine's pool between uses.

Source: docs/design/sql.md "Entity transactions" (cheap reads: snapshots, mark reads and applies
on a few connections kept out of the pool, the isolation level set once and a reader's session
read only; measured in docs/decisions/0026-kept-connections.md). The guide's "Connections"
paragraph (docs/sql.md) says what they count against a server's connection limit.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy.engine import Connection

__all__ = ["READ_ONLY_SESSION", "IdleBudget", "KeptConnections"]

log = logging.getLogger(__name__)

#: Per dialect: the statements that make a session's transactions read only, and writable again.
READ_ONLY_SESSION = {
    "postgresql": (
        "SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY",
        "SET SESSION CHARACTERISTICS AS TRANSACTION READ WRITE",
    ),
    "mysql": ("SET SESSION TRANSACTION READ ONLY", "SET SESSION TRANSACTION READ WRITE"),
    "mariadb": ("SET SESSION TRANSACTION READ ONLY", "SET SESSION TRANSACTION READ WRITE"),
}
#: The key, in a pooled connection's ``info``, of a session made read only here.
_READ_ONLY_INFO = "waltz_read_only_session"


def _writable_again(dbapi_connection: Any, record: Any) -> None:
    """Pool ``checkin`` listener: a connection whose session :class:`KeptConnections` made read
    only is made writable before the pool gives it to anyone else; one that cannot be is
    invalidated (closed), never reused read only."""
    dialect = record.info.pop(_READ_ONLY_INFO, None)
    if dialect is None or dbapi_connection is None:
        return
    try:
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(READ_ONLY_SESSION[dialect][1])
        finally:
            cursor.close()
        dbapi_connection.commit()
    except Exception as exc:  # any failure: the connection is not reused
        log.info("a reader connection could not be made writable again (%s): closed, not reused", exc)
        record.invalidate(exc)


class IdleBudget:
    """How many kept connections may sit idle, all kinds together: half the engine pool's size
    (at least one), so that idle kept connections stay within what the pool would keep anyway
    and leave the rest of it to the application and to peaks.

    Args:
        engine: the application's engine, whose pool size sets the limit.

    Attributes:
        limit: the idle connections allowed, all kinds together.
        idle: the idle connections now kept (changed under :attr:`lock`).
        lock: guards :attr:`idle` and the kinds' lists of idle connections.
    """

    def __init__(self, engine: Engine) -> None:
        size = getattr(engine.pool, "size", None)
        self.limit = max(1, size() // 2) if callable(size) else 1
        self.idle = 0
        self.lock = threading.Lock()


class KeptConnections:
    """Connections of one kind kept checked out of an engine between uses, on database servers
    (SQLite takes a pooled connection each time: its checkouts are cheap and in-memory databases
    are per thread).

    A kept connection skips what a pool checkout costs on every use: the pre-ping round trip,
    the reset on return, and (for readers) setting the isolation level. A connection the server
    closed fails its first statement with a transient error, which the callers' retries cure on
    a new connection; a connection that failed is never kept. Kept connections count against
    the pool's limits; at most ``budget.limit`` are idle, all kinds together (more given back at
    once return to the pool).

    Args:
        engine: the application's engine.
        isolation_level: set once on each new connection (None: the engine's).
        budget: the idle limit shared with the other kinds.
        read_only: make each new connection's session read only (PostgreSQL, MySQL and
            MariaDB: :data:`READ_ONLY_SESSION`), so that a write in its transactions fails in the
            database; made writable again when it goes back to the pool. Nothing on SQLite.
    """

    def __init__(
        self, engine: Engine, isolation_level: str | None, budget: IdleBudget, *, read_only: bool = False
    ) -> None:
        self._engine = engine
        self._keep = engine.dialect.name != "sqlite"
        self._isolation_level = isolation_level if self._keep else None
        self._read_only = READ_ONLY_SESSION.get(engine.dialect.name) if self._keep and read_only else None
        if self._read_only is not None and not event.contains(engine, "checkin", _writable_again):
            event.listen(engine, "checkin", _writable_again)
        self._budget = budget
        self._idle: list[Connection] = []

    @property
    def per_use(self) -> bool:
        """True where a pooled connection is taken for each use (SQLite)."""
        return not self._keep

    def take(self) -> Connection:
        """An idle connection, or a new one (with the isolation level set, and read only when
        asked).

        Raises:
            sqlalchemy.exc.DBAPIError: a new connection failed (it is closed).
        """
        if self._keep:
            with self._budget.lock:
                if self._idle:
                    self._budget.idle -= 1
                    return self._idle.pop()
        conn = self._engine.connect()
        if self._isolation_level is not None:
            conn.execution_options(isolation_level=self._isolation_level)
        if self._read_only is not None:
            try:
                conn.info[_READ_ONLY_INFO] = self._engine.dialect.name  # before: undone however it ends
                conn.exec_driver_sql(self._read_only[0])
                conn.commit()
            except BaseException:
                conn.close()
                raise
        return conn

    def give_back(self, conn: Connection) -> None:
        """Keep a connection whose transaction ended (closed, i.e. returned to the pool, when it
        broke or enough are kept idle)."""
        if self._keep and not conn.invalidated and not conn.closed and not conn.in_transaction():
            with self._budget.lock:
                if self._budget.idle < self._budget.limit:
                    self._budget.idle += 1
                    self._idle.append(conn)
                    return
        conn.close()

    def close(self) -> None:
        """Close the idle connections (new ones are made when needed). Idempotent."""
        with self._budget.lock:
            idle, self._idle = self._idle, []
            self._budget.idle -= len(idle)
        for conn in idle:
            conn.close()
