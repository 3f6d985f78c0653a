"""Reads at a partition's high-water mark: ``MarkSnapshot`` and the ``MarkReader`` that opens it.

Source: docs/design/sql.md "Entity transactions" (the snapshot: the mark first, then the
entities, all the state at that mark; cheap reads on kept connections, the snapshot's ``BEGIN``
in one pipeline with its first statement), "Reading entities outside a transaction",
"Exactly-once across instances" (``wait_for`` polls the mark).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy.engine import Connection
from sqlalchemy.orm import ORMExecuteState, Session
from sqlalchemy.sql.elements import TextClause

from waltz.errors import ReadOnlySessionError
from waltz.jdbc_style.direct import direct_statements
from waltz.jdbc_style.engine import statement_start
from waltz.jdbc_style.entities import EntityInfo
from waltz.jdbc_style.kept_connections import IdleBudget, KeptConnections
from waltz.jdbc_style.marks import HighWaterMarks
from waltz.jdbc_style.prefetch import MarkPrefetch, Prefetched

__all__ = ["SNAPSHOT_ISOLATION", "MarkReader", "MarkSnapshot", "read_only_session_error"]

#: Isolation level of entity reads (mark first, then the entities, in one snapshot).
SNAPSHOT_ISOLATION = "REPEATABLE READ"


class MarkSnapshot:
    """A read-only database transaction that read a partition's mark first (opened by
    :meth:`MarkReader.open`; ``AbstractClientCallbacksForSQL.snapshot`` gives one).

    Attributes:
        partition_id: the partition.
        high_water_mark: the partition's mark in this snapshot (-1: nothing applied).
        connection: the snapshot's connection (read through it, or through :attr:`session`).
        prefetched: rows read with the mark, ``{(entity info, key values): row or None}`` (see
            :mod:`waltz.jdbc_style.prefetch`); empty when none were asked for.
    """

    def __init__(
        self,
        partition_id: int,
        high_water_mark: int,
        connection: Connection,
        prefetched: Prefetched | None = None,
    ) -> None:
        self.partition_id = partition_id
        self.high_water_mark = high_water_mark
        self.connection = connection
        self.prefetched: Prefetched = {} if prefetched is None else prefetched
        self._session: Session | None = None

    @property
    def session(self) -> Session:
        """An ORM session on the snapshot's connection and transaction (made when first used),
        for reads only: a write through it raises :class:`~waltz.errors.ReadOnlySessionError`
        (an ``INSERT``, ``UPDATE`` or ``DELETE`` executed, textual SQL that writes, behind
        comments or a ``WITH`` too, or a flush of added, deleted or changed objects);
        :meth:`take_writes` names those never flushed (docs/design/sql.md "Entity
        transactions"). A snapshot that :class:`MarkReader` opened on PostgreSQL or MariaDB is
        read only in the database as well."""
        if self._session is None:
            self._session = Session(bind=self.connection, autoflush=True)
            event.listen(self._session, "do_orm_execute", _refuse_writes)
            event.listen(self._session, "before_flush", _refuse_flush)
        return self._session

    def take_writes(self) -> str | None:
        """What the session holds that a flush would write (objects added, deleted or changed),
        in a few words, or None: nothing, or no session made. The session is emptied of its
        objects when it held such writes: the next reader of the snapshot (a batch's next
        member) starts clean."""
        return None if self._session is None else _take_pending(self._session)

    def close(self) -> None:
        """Close the session, if one was made (the snapshot's owner ends the transaction)."""
        if self._session is not None:
            self._session.close()
            self._session = None


#: The words that begin a textual statement that writes (``session.execute(text(...))``), or that
#: MySQL and MariaDB commit at once (DDL, grants).
_WRITING_VERBS = frozenset(
    {
        "insert",
        "update",
        "delete",
        "merge",
        "replace",
        "upsert",
        "truncate",
        "create",
        "alter",
        "drop",
        "rename",
        "grant",
        "revoke",
    }
)
#: The words that begin a statement that only reads: after a ``WITH``, its main statement's.
_READING_VERBS = frozenset({"select", "values", "table"})
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*")
#: What follows a function's name (``replace(...)``), not a statement's verb.
_CALLED = re.compile(r"\s*\(")
#: A PostgreSQL dollar quote's opening (``$$``, ``$body$``).
_DOLLAR_QUOTE = re.compile(r"\$(?:[A-Za-z_][A-Za-z0-9_]*)?\$")


def _writing_verb(statement: str, dialect_name: str) -> str | None:
    """The writing word (upper case) that makes a textual statement a write, or None: its first
    word from where the database starts reading it (leading comments skipped as the database
    skips them, :func:`~waltz.jdbc_style.engine.statement_start`), or after a ``WITH`` the first
    word of its main statement or of a common table expression's body (PostgreSQL's ``WITH x AS
    (DELETE ... RETURNING ...) SELECT ...`` writes). Only the first statement of a text is read."""
    text = statement_start(statement, dialect_name)
    word = _WORD.match(text)
    if word is None:
        return None
    verb = word.group().lower()
    if verb in _WRITING_VERBS:
        return verb.upper()
    if verb != "with":
        return None
    return _writing_after_with(text, word.end(), dialect_name)


def _writing_after_with(text: str, at: int, dialect_name: str) -> str | None:
    """The writing word of a ``WITH`` statement read from ``at`` (after the ``WITH``), or None
    once its main statement is found to read: strings, quoted names and comments are passed over;
    a word counts at the parentheses' outer level (the main statement's verb) or first inside a
    parenthesis (a body), unless a ``(`` follows it (a function, such as ``replace(...)``)."""
    mysql = dialect_name in ("mysql", "mariadb")
    depth, opened, end = 0, False, len(text)
    while at < end:
        char = text[at]
        if char.isspace():
            at += 1
        elif text.startswith(("--", "/*"), at) or (mysql and char == "#"):
            at = end - len(statement_start(text[at:], dialect_name))
        elif char in "'\"`" or (char == "[" and dialect_name == "sqlite"):
            at = _after_quoted(text, at, "]" if char == "[" else char, mysql)
            opened = False
        elif char == "$" and dialect_name == "postgresql" and (dollar := _DOLLAR_QUOTE.match(text, at)):
            closing = text.find(dollar.group(), dollar.end())
            at = end if closing < 0 else closing + len(dollar.group())
            opened = False
        elif char == "(":
            depth, opened, at = depth + 1, True, at + 1
        elif char == ")":
            depth, opened, at = max(0, depth - 1), False, at + 1
        elif (word := _WORD.match(text, at)) is not None:
            verb, at = word.group().lower(), word.end()
            counts = (opened or depth == 0) and _CALLED.match(text, at) is None
            if counts and verb in _WRITING_VERBS:
                return verb.upper()
            if depth == 0 and not opened and verb in _READING_VERBS:
                return None  # the main statement reads: every body before it was read
            opened = False
        else:
            opened, at = False, at + 1
    return None


def _after_quoted(text: str, at: int, closing: str, backslash: bool) -> int:
    """The index after a quoted string or name that opens at ``at`` (a doubled ``closing``
    stands for itself; on MySQL and MariaDB a backslash escapes the next character)."""
    at += 1
    while at < len(text):
        char = text[at]
        if backslash and char == "\\" and closing in "'\"":
            at += 2
        elif char == closing:
            if text.startswith(closing * 2, at) and closing != "]":
                at += 2
            else:
                return at + 1
        else:
            at += 1
    return at


def read_only_session_error(what: str) -> ReadOnlySessionError:
    """The error of a write through ``tx.session``, ``what`` saying which write."""
    return ReadOnlySessionError(
        f"tx.session is read-only: {what}. It reads the attempt's snapshot, which is rolled back, "
        "so the write would reach neither the log nor the database: make the change with "
        "tx.insert, tx.update or tx.delete, which the log carries"
    )


def _refuse_writes(state: ORMExecuteState) -> None:
    statement = state.statement
    if state.is_insert or state.is_update or state.is_delete:
        raise read_only_session_error(f"{type(statement).__name__.lower()} statement executed on it")
    if isinstance(statement, TextClause):
        verb = _writing_verb(statement.text, state.session.get_bind().dialect.name)
        if verb is not None:
            raise read_only_session_error(f"textual statement {verb} executed on it")


def _pending(session: Session) -> str | None:
    kinds = [
        f"{len(objects)} {label} ({', '.join(sorted({type(o).__name__ for o in objects}))})"
        for label, objects in (
            ("added", list(session.new)),
            ("deleted", list(session.deleted)),
            ("changed", [o for o in session.dirty if session.is_modified(o)]),
        )
        if objects
    ]
    return "; ".join(kinds) if kinds else None


def _take_pending(session: Session) -> str | None:
    pending = _pending(session)
    if pending is not None:
        session.expunge_all()
    return pending


def _refuse_flush(session: Session, _context: Any, _instances: Any) -> None:
    pending = _take_pending(session)
    if pending is not None:
        raise read_only_session_error(f"objects to flush: {pending}")


class MarkReader:
    """Reads of partitions' marks on an instance's reader connections: a mark alone, or first in
    a snapshot (docs/design/sql.md "Entity transactions").

    On a database server the reader connections are kept out of the engine's pool
    (:class:`~waltz.jdbc_style.kept_connections.KeptConnections`) with
    :data:`SNAPSHOT_ISOLATION` set once; SQLite takes a pooled connection for each read. A read
    that fails closes its connection (a broken connection is never kept) and raises; the caller
    retries transient errors.

    Args:
        engine: the application's engine.
        marks: the mark rows of the log the callbacks follow.
        budget: the idle limit the reader connections share with the callbacks' other kinds.
    """

    def __init__(self, engine: Engine, marks: HighWaterMarks, budget: IdleBudget) -> None:
        self._readers = KeptConnections(engine, SNAPSHOT_ISOLATION, budget, read_only=True)
        self._marks = marks
        self._prefetch = MarkPrefetch(marks.cluster_name)

    def read_mark(self, partition_id: int) -> int:
        """The partition's mark in the database (-1: none applied, or no mark row yet)."""
        conn = self._readers.take()
        try:
            mark = self._marks.read(conn, partition_id)
        except BaseException:
            conn.close()
            raise
        self._end_read(conn)
        return -1 if mark is None else int(mark)

    def open(
        self, partition_id: int, entities: Sequence[tuple[EntityInfo, tuple[Any, ...]]] = ()
    ) -> MarkSnapshot:
        """A snapshot: a reader connection in a new transaction, the partition's mark read first
        in it, and the rows of ``entities`` read in the same statement (on PostgreSQL in one
        pipeline with the transaction's ``BEGIN``). End it with :meth:`end`.

        Args:
            partition_id: the partition.
            entities: (entity info, key values) pairs read with the mark into
                :attr:`MarkSnapshot.prefetched`.

        Raises:
            sqlalchemy.exc.DBAPIError: the database failed (the connection is closed).
        """
        conn = self._readers.take()
        prefetched: Prefetched = {}
        try:
            conn.begin()
            if entities:
                mark, prefetched = self._prefetch.read(conn, partition_id, entities, begin=True)
            else:
                mark = self._marks.read(conn, partition_id)
        except BaseException:
            self._discard_read(conn)
            raise
        return MarkSnapshot(partition_id, -1 if mark is None else int(mark), conn, prefetched)

    def end(self, snapshot: MarkSnapshot) -> None:
        """Close a snapshot from :meth:`open`: its session, then its transaction (rolled back: it
        only read), and keep its connection."""
        try:
            snapshot.close()
        finally:
            self._end_read(snapshot.connection)

    def close(self) -> None:
        """Close the idle reader connections (new ones are made when needed). Idempotent."""
        self._readers.close()

    def _end_read(self, conn: Connection) -> None:
        """Roll back a read and give its connection back (to the driver's own transaction
        control first when the read's ``BEGIN`` went in a pipeline, see :meth:`open`)."""
        try:
            if conn.in_transaction():
                conn.rollback()
        except BaseException:
            self._discard_read(conn)
            raise
        direct_statements(conn.engine).end_pipelined_begin(conn)
        self._readers.give_back(conn)

    @staticmethod
    def _discard_read(conn: Connection) -> None:
        """Close a reader connection whose read failed: a broken connection is never kept, and a
        driver switched for a pipelined ``BEGIN`` is given back first (or the connection
        invalidated), so that none returns to the pool in autocommit."""
        try:
            direct_statements(conn.engine).end_pipelined_begin(conn)
        finally:
            conn.close()
