"""Engines for the SQL framework: SQLite transaction modes, the apply guard, transient errors.

Source: docs/design/sql.md "The apply contract" (the apply and the high-water mark change
together in one database transaction, which the framework owns).

:func:`prepare_engine` is applied to every engine the framework is given (idempotent):

- **SQLite** (the embedded default): pysqlite's own transaction handling is switched off and the
  framework emits ``BEGIN`` itself, ``BEGIN IMMEDIATE`` for applies (SQLite has no ``SELECT ... FOR
  UPDATE``; an immediate transaction takes the write lock before the mark is read, so two
  instances cannot both apply the same transaction) and a deferred ``BEGIN`` otherwise (a snapshot
  from the first read, which is what entity reads need). File databases get WAL and a busy
  timeout so several processes can share them.
- **MySQL and MariaDB**: every connection adds ``STRICT_TRANS_TABLES`` and
  ``NO_AUTO_VALUE_ON_ZERO`` to its session's ``sql_mode``, so the database holds the values the
  log carries (docs/design/sql.md "Change-sets"): a value that does not fit its column is an
  error, not cut to fit, and a 0 in an ``AUTO_INCREMENT`` column (SQLAlchemy's default for an
  integer primary key) is stored as 0, not replaced by the next generated value.
- **Every backend**: while ``apply`` runs, statements and calls that would end or reshape the
  framework's transaction (``COMMIT``, ``ROLLBACK`` other than to a savepoint, ``BEGIN``, ``SET
  TRANSACTION``, an ``isolation_level`` execution option) raise :class:`ApplyContractError`, also
  behind leading comments and semicolons.

:func:`is_transient` tells the errors worth retrying (deadlocks, serialization failures, lock wait
timeouts, lost connections, a busy SQLite database) from the others.
"""

from __future__ import annotations

import logging
import re
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, Connection, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, OperationalError

from waltz.errors import ApplyContractError, AsyncEngineError

__all__ = [
    "SQLITE_BEGIN",
    "DatabaseUrlError",
    "apply_guard",
    "create_framework_engine",
    "emits_sqlite_begin",
    "is_prepared",
    "is_transient",
    "parse_database_url",
    "prepare_engine",
    "statement_start",
]

log = logging.getLogger(__name__)

_guarded: weakref.WeakSet[Connection] = weakref.WeakSet()
#: Execution option naming the SQLite ``BEGIN`` mode of a connection (``IMMEDIATE`` or ``DEFERRED``).
SQLITE_BEGIN = "waltz_sqlite_begin"
#: Seconds a SQLite connection waits for another process's write lock before "database is locked".
SQLITE_BUSY_TIMEOUT = 30.0
#: The ``sql_mode`` flags every MySQL/MariaDB connection of the framework adds to the server's:
#: a value too long or out of range for its column is an error, and an explicit 0 in an
#: ``AUTO_INCREMENT`` column is stored as 0.
MYSQL_SQL_MODES = ("STRICT_TRANS_TABLES", "NO_AUTO_VALUE_ON_ZERO")
#: The session variable that adds them (``SET SESSION`` here; the JDBC writer's ``sessionVariables``).
MYSQL_SESSION_SQL_MODE = f"sql_mode=CONCAT(@@sql_mode,',{','.join(MYSQL_SQL_MODES)}')"

_PREPARED = "_waltz_prepared"

_FORBIDDEN = re.compile(
    r"^\s*(?:COMMIT|END|BEGIN|START\s+TRANSACTION|ROLLBACK(?!\s+TO\b)|ABORT|"
    r"SET\s+(?:SESSION\s+|GLOBAL\s+|LOCAL\s+)?TRANSACTION|SET\s+SESSION\s+CHARACTERISTICS|"
    r"SET\s+(?:SESSION\s+|@@)?(?:TX_|TRANSACTION_)ISOLATION|PRAGMA\s+READ_UNCOMMITTED)\b",
    re.IGNORECASE,
)

#: The opening of a MySQL/MariaDB comment whose text the server runs: ``/*!``, ``/*M!`` (MariaDB),
#: each with an optional server version (``/*!40101 SET ... */``).
_MYSQL_EXECUTED_COMMENT = re.compile(r"/\*M?!\d*")


def statement_start(statement: str, dialect_name: str) -> str:
    """A statement's text from where the database starts reading it: leading whitespace,
    semicolons and comments skipped (docs/design/sql.md "The apply contract": the apply guard
    matches this, so that a comment does not hide a ``COMMIT`` from it; so does the read-only
    session of a snapshot, docs/design/sql.md "Entity transactions").

    Args:
        statement: the SQL text as the driver receives it.
        dialect_name: SQLAlchemy's dialect name (``"postgresql"``, ``"mysql"``, ``"mariadb"``,
            ``"sqlite"``): PostgreSQL nests block comments; MySQL and MariaDB end a line comment
            at ``#`` too and run the text of ``/*!...*/`` comments, which is therefore kept.

    Returns:
        The rest of ``statement`` from its first character the database reads as SQL (the text
        inside an executed MySQL comment included); empty when there is none.
    """
    mysql = dialect_name in ("mysql", "mariadb")
    at, end = 0, len(statement)
    while at < end:
        char = statement[at]
        if char.isspace() or char == ";":
            at += 1
        elif statement.startswith("--", at) or (mysql and char == "#"):
            newline = statement.find("\n", at)
            at = end if newline < 0 else newline + 1
        elif statement.startswith("/*", at):
            executed = _MYSQL_EXECUTED_COMMENT.match(statement, at) if mysql else None
            if executed is not None:
                at = executed.end()  # its text runs: read on inside it
                continue
            depth, at = 1, at + 2
            while depth and at < end:
                if statement.startswith("*/", at):
                    depth, at = depth - 1, at + 2
                elif dialect_name == "postgresql" and statement.startswith("/*", at):
                    depth, at = depth + 1, at + 2
                else:
                    at += 1
        else:
            break
    return statement[at:]


# PostgreSQL SQLSTATEs: serialization failure, deadlock, lock timeout, admin shutdown / crash /
# cannot connect now, connection exceptions.
_PG_TRANSIENT = {
    "40001",
    "40P01",
    "55P03",
    "57P01",
    "57P02",
    "57P03",
    "08000",
    "08001",
    "08003",
    "08004",
    "08006",
}
# MySQL/MariaDB error numbers: deadlock, lock wait timeout, server gone away, lost connection,
# can't connect, connection killed, server shutdown, WSREP not ready, read-only during failover.
_MYSQL_TRANSIENT = {1213, 1205, 2006, 2013, 2003, 1927, 1053, 1047, 4031, 1290}


@contextmanager
def apply_guard(conn: Connection) -> Iterator[None]:
    """While inside, statements and calls on ``conn`` that would end or reshape its transaction
    raise :class:`ApplyContractError` (see the module docstring)."""
    _guarded.add(conn)
    try:
        yield
    finally:
        _guarded.discard(conn)


def _contract_error(what: str) -> ApplyContractError:
    return ApplyContractError(
        f"apply() must not {what}: the framework owns the database transaction that applies a log "
        "transaction and moves the high-water mark together. Read and write through the session "
        "(savepoints with session.begin_nested() are fine) and return; raise to abort."
    )


def _guard_statement(
    conn: Connection, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool
) -> None:
    if conn not in _guarded:
        return
    forbidden = _FORBIDDEN.match(statement_start(statement, conn.dialect.name))
    if forbidden is not None:
        raise _contract_error(f"execute {forbidden.group().split()[0].upper()} ({statement.strip()[:60]!r})")


def _guard_commit(conn: Connection) -> None:
    if conn in _guarded:
        raise _contract_error("commit")


def _guard_rollback(conn: Connection) -> None:
    if conn in _guarded:
        raise _contract_error("roll back")


def _guard_options(conn: Connection, opts: dict[str, Any]) -> None:
    if conn in _guarded and "isolation_level" in opts:
        raise _contract_error(f"change the isolation level (to {opts['isolation_level']!r})")


def _sqlite_connect(dbapi_connection: Any, connection_record: Any) -> None:
    dbapi_connection.isolation_level = None  # the framework emits BEGIN itself (see module doc)
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(f"PRAGMA busy_timeout = {int(SQLITE_BUSY_TIMEOUT * 1000)}")
        cursor.execute("PRAGMA database_list")
        files = [row[2] for row in cursor.fetchall() if row[1] == "main"]
        if files and files[0]:  # a file database (not :memory:): WAL lets readers run beside a writer
            cursor.execute("PRAGMA journal_mode = WAL")
            cursor.execute("PRAGMA synchronous = NORMAL")
        cursor.execute("PRAGMA foreign_keys = ON")
    finally:
        cursor.close()


def _mysql_connect(dbapi_connection: Any, connection_record: Any) -> None:
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(f"SET SESSION {MYSQL_SESSION_SQL_MODE}")
    finally:
        cursor.close()


def emits_sqlite_begin(engine: Engine) -> bool:
    """Whether ``engine`` is one :func:`prepare_engine` prepared for SQLite: the framework emits its
    ``BEGIN`` (``DEFERRED``, or the mode of the ``SQLITE_BEGIN`` execution option) itself."""
    return event.contains(engine, "begin", _sqlite_begin)


def _sqlite_begin(conn: Connection) -> None:
    mode = conn.get_execution_options().get(SQLITE_BEGIN, "DEFERRED")
    conn.exec_driver_sql(f"BEGIN {mode}")


#: Synchronous drivers to name instead of asyncio ones (SQLAlchemy's own drivers of the backends).
_SYNC_DRIVERS = {
    "psycopg_async": "psycopg",
    "asyncpg": "psycopg",
    "aiosqlite": "pysqlite",
    "aiomysql": "pymysql",
    "asyncmy": "pymysql",
}


def _sync_url(url: URL) -> str:
    """``url`` with a synchronous driver of its backend, for a message (password hidden)."""
    backend = url.get_backend_name()
    driver = _SYNC_DRIVERS.get(url.get_driver_name(), "")
    name = backend if driver in ("", "pysqlite") else f"{backend}+{driver}"
    return url.set(drivername=name).render_as_string(hide_password=True)


def refuse_async(engine: object) -> None:
    """Refuse an asyncio engine (docs/design/sql.md "The SQL framework on asyncio").

    Raises:
        AsyncEngineError: ``engine`` is a ``sqlalchemy.ext.asyncio.AsyncEngine``, or an engine of
            an asyncio driver (e.g. an ``AsyncEngine``'s ``sync_engine``): its message names the
            synchronous URL to use instead.
    """
    sync_engine = getattr(engine, "sync_engine", None)
    if isinstance(sync_engine, Engine):  # an AsyncEngine (not imported: that needs its extras)
        raise AsyncEngineError(f"an AsyncEngine ({sync_engine.url.drivername})", _sync_url(sync_engine.url))
    if isinstance(engine, Engine) and engine.dialect.is_async:
        raise AsyncEngineError(
            f"an engine of the asyncio driver {engine.url.drivername}", _sync_url(engine.url)
        )


class DatabaseUrlError(ArgumentError, ValueError):
    """A database URL that does not parse, or whose port is not a number. Its message never
    quotes the URL, which may hold a password (SQLAlchemy's own errors quote it, and take a
    password for the port when the host is left out); a subclass of both errors SQLAlchemy raises
    for it, so that their handlers still catch it.

    Attributes:
        problem: what is wrong, in words that quote nothing of the URL ("its port is not a
            number").
        bad_port: the URL parses but for its port (``make_url``'s ``ValueError``).
    """

    def __init__(self, problem: str, *, bad_port: bool) -> None:
        super().__init__(
            f"the database URL is not a URL SQLAlchemy takes: {problem} (not shown: it may hold a password)"
        )
        self.problem = problem
        self.bad_port = bad_port


def parse_database_url(url: str | URL) -> URL:
    """``sqlalchemy.engine.make_url`` without the URL's text in its errors.

    Raises:
        DatabaseUrlError: the URL does not parse, or its port is not a number.
    """
    if isinstance(url, URL):
        return url
    try:
        return make_url(url)
    except ValueError:  # int() of the port: its text, or the password when the host is left out
        problem, bad_port = "its port is not a number", True
    except ArgumentError:
        problem, bad_port = "it does not parse (dialect+driver://user:password@host:port/database)", False
    # Raised here, not in the handlers, so that the error carries no context quoting the URL.
    raise DatabaseUrlError(problem, bad_port=bad_port)


def refuse_async_bind(bind: object) -> None:
    """Refuse an asyncio database where the framework works synchronously (its migrations): an
    ``AsyncEngine``, an asyncio driver's engine or connection, or a URL naming an asyncio driver
    (docs/design/sql.md "The SQL framework on asyncio").

    Raises:
        AsyncEngineError: an asyncio database; the message names the synchronous URL to use.
        DatabaseUrlError: a URL that does not parse, or whose port is not a number.
        sqlalchemy.exc.ArgumentError: a URL that names an unknown driver.
    """
    if isinstance(bind, str | URL):
        parsed = parse_database_url(bind)
        if parsed.get_dialect().is_async:
            raise AsyncEngineError(
                f"the asyncio URL {parsed.render_as_string(hide_password=True)!r}", _sync_url(parsed)
            )
        return
    refuse_async(bind.engine if isinstance(bind, Connection) else bind)


def is_prepared(engine: Engine) -> bool:
    """Whether :func:`prepare_engine` installed the framework's hooks on ``engine``."""
    return bool(getattr(engine, _PREPARED, False))


def prepare_engine(engine: Engine) -> Engine:
    """Install the framework's engine hooks (see the module docstring); idempotent.

    Call it before the engine's first connection for SQLite, MySQL and MariaDB (pooled connections
    made before are discarded so the hooks apply to all). Other code may keep using the engine as
    before; on SQLite its transactions then begin with a plain (deferred) ``BEGIN``.

    Args:
        engine: a SQLAlchemy engine for SQLite, PostgreSQL or MySQL/MariaDB.

    Returns:
        The same engine.

    Raises:
        AsyncEngineError: an asyncio engine (``AsyncEngine``, or an asyncio driver's engine).
    """
    refuse_async(engine)
    if getattr(engine, _PREPARED, False):
        return engine
    event.listen(engine, "before_cursor_execute", _guard_statement)
    event.listen(engine, "commit", _guard_commit)
    event.listen(engine, "rollback", _guard_rollback)
    event.listen(engine, "set_connection_execution_options", _guard_options)
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", _sqlite_connect)
        event.listen(engine, "begin", _sqlite_begin)
        engine.dispose()
    elif engine.dialect.name in ("mysql", "mariadb"):
        event.listen(engine, "connect", _mysql_connect)
        engine.dispose()
    elif engine.dialect.name != "postgresql":
        log.warning(
            "the SQL framework is tested on SQLite, PostgreSQL and MySQL/MariaDB, not %s",
            engine.dialect.name,
        )
    setattr(engine, _PREPARED, True)
    return engine


def create_framework_engine(url: str | URL, **kwargs: Any) -> Engine:
    """``sqlalchemy.create_engine(url, **kwargs)`` prepared for the framework (for database
    servers with ``pool_pre_ping`` and a ``pool_size`` of 10 unless given).

    Args:
        url: a SQLAlchemy URL, as text or a :class:`sqlalchemy.engine.URL`, e.g.
            ``sqlite:///app.db``, ``postgresql+psycopg://user@host/db`` or
            ``mysql+pymysql://user@host/db``.
        kwargs: more ``create_engine`` arguments.

    Raises:
        AsyncEngineError: ``url`` names an asyncio driver (``+psycopg_async``, ``+asyncpg``,
            ``+aiosqlite``, ...): the message gives the synchronous URL to pass instead.
        DatabaseUrlError: the URL does not parse, or its port is not a number (an
            ``ArgumentError`` and a ``ValueError``; the message does not quote the URL).
        sqlalchemy.exc.ArgumentError: the URL names an unknown dialect or driver
            (``NoSuchModuleError``).
    """
    refuse_async_bind(url)
    if parse_database_url(url).get_backend_name() != "sqlite":
        kwargs.setdefault("pool_pre_ping", True)  # a server may have closed pooled connections
        # Room for the framework's threads of one instance: an apply worker per partition,
        # snapshots of first attempts and re-attempts, the connections the callbacks keep.
        kwargs.setdefault("pool_size", 10)
    return prepare_engine(create_engine(url, **kwargs))


def is_transient(exc: BaseException) -> bool:
    """True for database errors that a retry of the whole transaction can cure.

    Deadlocks, serialization failures, lock wait timeouts, lost or refused connections (the pool
    replaces them), server shutdowns and a busy SQLite database. Anything else (constraint
    violations, programming errors, the application's own exceptions) is not.
    """
    if not isinstance(exc, DBAPIError):
        return False
    if exc.connection_invalidated:
        return True
    orig = exc.orig
    sqlstate = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    if isinstance(sqlstate, str):
        return sqlstate in _PG_TRANSIENT or sqlstate.startswith("08")
    args = getattr(orig, "args", ())
    if args and isinstance(args[0], int) and args[0] in _MYSQL_TRANSIENT:
        return True
    if isinstance(exc, OperationalError):
        message = str(orig).lower()
        return (
            "database is locked" in message
            or "database is busy" in message
            or "database table is locked" in message
        )
    return False
