"""The framework's own writes run on the driver's cursor, compiled once (psycopg and PyMySQL).

Source: docs/design/sql.md "Group apply" (the writes of an apply on the driver's cursor).

The statements an apply runs for the framework (a staged write of a group, a change-set's row
change, the high-water mark's move) are built once and run many times with parameter sets of the
same keys. Through ``Connection.execute`` each run pays SQLAlchemy's per-execution work (cache key,
execution context, parameter processing, result set-up): about as much CPU again as the driver's
own ``execute`` (psycopg on PostgreSQL, PyMySQL on MariaDB and MySQL). :class:`DirectStatements`
compiles such a statement once per set of parameter keys and, when what SQLAlchemy would hand the
driver is exactly the parameter set (no bind processors, no Python-side defaults, no expanding or
renamed parameters, no ``RETURNING``), runs the compiled SQL on the DBAPI cursor of the same
connection, in the same database transaction; on psycopg several statements (a group's staged
writes) go in one pipeline, sent together with one wait for all their results, and a change-set
statement with many parameter sets may go over arrays of them (``rows_at_once.py``).
Errors go through SQLAlchemy's own handling of driver errors, so they are the same ``DBAPIError``
subclasses (and a lost connection is invalidated) as on the ordinary path.

On psycopg a transaction's ``BEGIN`` can go in the pipeline of its first statement instead of in a
round trip of its own: an apply's (:meth:`DirectStatements.execute_led`) and an entity snapshot's,
whose first statement is the ``SELECT`` of the mark (:meth:`DirectStatements.read_begun`, its rows
given with the result processors ``Connection.execute`` would apply; docs/design/sql.md
"Entity transactions"). The driver then runs in autocommit until
:meth:`DirectStatements.end_pipelined_begin` gives it back.

Anything else goes the ordinary way: other dialects and drivers, statements that do not qualify,
and engines with ``echo`` or with execute or cursor-execute listeners other than the framework's
own guard (which would not see the statement otherwise).

This fast path reads a few private members of SQLAlchemy, deliberately (docs/decisions/0043):
``Connection._handle_dbapi_exception``, ``Connection._echo``, ``SQLCompiler._bind_processors``,
``SQLCompiler._result_columns`` and ``TypeEngine._cached_result_processor``. Each use says which
test of ``tests/jdbc_style/test_direct_statements.py`` fails if it changes; those tests pass with
SQLAlchemy 2.0 (2.0.58) and 2.1 (2.1.9), on PostgreSQL (psycopg) and MariaDB (PyMySQL).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, TypeGuard

from sqlalchemy.engine import Connection, Engine
from sqlalchemy.sql.base import Executable
from sqlalchemy.sql.compiler import SQLCompiler

from waltz.jdbc_style.engine import is_prepared
from waltz.jdbc_style.rows_at_once import MIN_ROWS, rows_form

__all__ = ["DIRECT_DRIVERS", "DirectStatements", "LeadMissedError", "direct_statements"]

#: (dialect name, driver) pairs the direct path runs on: those measured (``benchmarks/sql_apply.py``).
DIRECT_DRIVERS = frozenset({("postgresql", "psycopg"), ("mysql", "pymysql"), ("mariadb", "pymysql")})

_NOT_DIRECT = ""  # the cache's mark of a (statement, keys) pair that goes the ordinary way
_ATTRIBUTE = "_waltz_direct_statements"
_CREATING = threading.Lock()
#: A ``SELECT`` for :meth:`DirectStatements.read_begun`: its SQL, the types of its result columns
#: and the values it binds itself.
_Select = tuple[str, list[Any], dict[str, Any]]
_MAX_SELECTS = 1024  # compiled SELECTs kept (statements are built once per shape, see prefetch.py)
_IDLE = 0  # libpq's PQTRANS_IDLE (psycopg.pq.TransactionStatus.IDLE): no transaction open


class LeadMissedError(Exception):
    """The lead statement of :meth:`DirectStatements.execute_led` changed another number of rows
    than one; the statements after it may have run: the transaction must be rolled back.

    Attributes:
        rowcount: the rows it changed (-1 when the driver did not say).
    """

    def __init__(self, rowcount: int) -> None:
        super().__init__(f"the lead statement changed {rowcount} rows, not one")
        self.rowcount = rowcount


def direct_statements(engine: Engine) -> DirectStatements:
    """The engine's :class:`DirectStatements` (made on first use, then kept on the engine)."""
    direct: DirectStatements | None = getattr(engine, _ATTRIBUTE, None)
    if direct is None:
        with _CREATING:
            direct = getattr(engine, _ATTRIBUTE, None)
            if direct is None:
                direct = DirectStatements(engine)
                setattr(engine, _ATTRIBUTE, direct)
    return direct


class DirectStatements:
    """Compiled SQL of the framework's statements, run on the DBAPI cursor where that is exact.

    One instance per engine (:func:`direct_statements`); safe to share between threads.

    Args:
        engine: the engine whose connections it runs statements on.
    """

    def __init__(self, engine: Engine) -> None:
        dialect = engine.dialect
        self.enabled = (dialect.name, dialect.driver) in DIRECT_DRIVERS
        self._pipelines = dialect.driver == "psycopg"  # the driver can send several statements at once
        self._engine = engine
        self._dialect = dialect
        self._sql: dict[tuple[Executable, frozenset[str]], str] = {}
        self._selects: dict[tuple[Executable, frozenset[str]], _Select | str] = {}
        self._counting = threading.Lock()
        self.statements_over_arrays = 0
        """How many statements were sent as one statement over arrays of a group's parameter sets
        (rows_at_once.py), since this instance was made (also those the database then refused)."""
        # Drivers in autocommit since execute_led or read_begun sent their transaction's BEGIN in
        # a pipeline.
        self._begun: weakref.WeakSet[Any] = weakref.WeakSet()

    def execute(
        self, connection: Connection, statement: Executable, parameters: Sequence[Mapping[str, Any]]
    ) -> int | None:
        """Run ``statement`` once per parameter set on ``connection``'s cursor, when it qualifies.

        Args:
            connection: a connection in a transaction, of the engine this instance was made for.
            statement: an ``INSERT``, ``UPDATE`` or ``DELETE`` built once (the same object each time).
            parameters: one or more parameter sets with the same keys.

        Returns:
            The rows the statement changed in all (the driver's ``rowcount``, -1 when it does not
            know), or None when it did not run: run it with ``connection.execute`` instead.

        Raises:
            sqlalchemy.exc.DBAPIError: the database refused it (as ``Connection.execute`` raises).
        """
        counts = self.execute_all(connection, ((statement, parameters),))
        return None if counts is None else counts[0]

    def run(
        self, connection: Connection, statement: Executable, parameters: Sequence[Mapping[str, Any]]
    ) -> int:
        """Run ``statement`` once per parameter set: on the cursor when it qualifies (see
        :meth:`execute`), else with ``connection.execute``.

        Returns:
            The rows it changed in all (-1 when the driver does not know).

        Raises:
            sqlalchemy.exc.DBAPIError: the database refused it.
        """
        rowcount = self.execute(connection, statement, parameters)
        if rowcount is None:
            rowcount = connection.execute(statement, list(parameters)).rowcount
        return rowcount

    def execute_all(
        self,
        connection: Connection,
        batches: Sequence[tuple[Executable, Sequence[Mapping[str, Any]]]],
        first_rows: list[int] | None = None,
        begin: bytes | None = None,
    ) -> list[int] | None:
        """Run each statement with its parameter sets, in order, when every one qualifies:
        on psycopg several statements in one pipeline, so that the driver sends them together and
        waits once for all their results.

        Args:
            connection: a connection in a transaction, of the engine this instance was made for.
            batches: (statement, its parameter sets with the same keys) pairs, as for :meth:`execute`.
            first_rows: when given, receives the first statement's row count once its result
                arrived, also when a later statement then failed.
            begin: (psycopg, see :meth:`execute_led`) the transaction's ``BEGIN``, sent first in
                the pipeline, ahead of the statements.

        A statement ``ChangeSetCallbacks`` described (rows_at_once.py) with enough parameter
        sets runs in rounds that each write a row at most once, a round of enough sets once over
        arrays of them (docs/design/sql.md "Rows of one shape in one statement"); its row count
        is then the rounds' together.

        Returns:
            The rows each statement changed in all, in order; or None when one of them does not
            qualify, and then none ran: run them with ``connection.execute`` instead.

        Raises:
            sqlalchemy.exc.DBAPIError: the database refused one of them (as ``Connection.execute``
                raises); the transaction must be rolled back.
        """
        if not (self.enabled and batches and connection.in_transaction() and self._plain(connection)):
            return None
        statements: list[str] = []
        runs: list[Sequence[Mapping[str, Any]]] = []  # the parameter sets each statement runs with
        pieces: list[int] = []  # per batch, the statements it runs as (more than one: in rounds)
        arrays_run = 0
        for statement, parameters in batches:
            sql = self._sql_for(statement, parameters)
            if sql is None:
                return None
            split = self._over_arrays(sql, statement, parameters) if self._pipelines else None
            if split is None:
                split = [(sql, parameters)]
            else:
                arrays_run += sum(1 for piece_sql, _ in split if piece_sql != sql)
            for piece_sql, piece_parameters in split:
                statements.append(piece_sql)
                runs.append(piece_parameters)
            pieces.append(len(split))
        if arrays_run:
            with self._counting:
                self.statements_over_arrays += arrays_run
        driver = connection.connection.dbapi_connection
        cursors: list[Any] = []
        opened: list[Any] = []  # the cursor of ``begin``
        try:
            cursors.extend(driver.cursor() for _ in statements)  # type: ignore[union-attr]
            if (len(statements) > 1 or begin is not None) and self._pipelines:
                with _pipeline(driver, self._dialect.loaded_dbapi.Error):
                    if begin is not None:
                        opener = driver.cursor()  # type: ignore[union-attr]
                        opened.append(opener)
                        opener.execute(begin)
                    for cursor, sql, parameters in zip(cursors, statements, runs, strict=True):
                        _run(cursor, sql, parameters)
            else:
                for cursor, sql, parameters in zip(cursors, statements, runs, strict=True):
                    _run(cursor, sql, parameters)
            counts = [int(cursor.rowcount) for cursor in cursors]
        except self._dialect.loaded_dbapi.Error as exc:
            if first_rows is not None and cursors and cursors[0].pgresult is not None:
                first_rows.append(int(cursors[0].rowcount))
            # SQLAlchemy private (2.0, 2.1): its own wrapping of a driver error, a lost connection
            # invalidated; test_database_errors_are_sqlalchemys_and_a_lost_connection_is_invalidated.
            connection._handle_dbapi_exception(
                exc, ";\n".join(statements), [p for parameters in runs for p in parameters], None, None
            )
        finally:
            for cursor in (*opened, *cursors):
                cursor.close()
        totals: list[int] = []
        at = 0
        for count in pieces:  # a batch run in rounds changed the rows its rounds changed
            rows = counts[at : at + count]
            totals.append(-1 if any(r < 0 for r in rows) else sum(rows))
            at += count
        return totals

    def _over_arrays(
        self, sql: str, statement: Executable, parameters: Sequence[Mapping[str, Any]]
    ) -> list[tuple[str, Sequence[Mapping[str, Any]]]] | None:
        """``statement``'s parameter sets as the statements to run in their place (SQL and
        parameter sets, in order): rounds that each write a row at most once, a round of
        ``MIN_ROWS`` sets or more as one statement over arrays (rows_at_once.py), a smaller one
        as ``sql`` with its sets; or None to run ``sql`` with them all, one by one."""
        if len(parameters) < MIN_ROWS:
            return None
        form = rows_form(statement)
        if form is None:
            return None
        rounds = form.rounds(parameters)
        if rounds is None:
            return None
        split: list[tuple[str, Sequence[Mapping[str, Any]]]] = []
        for round_parameters in rounds:
            arrays = form.arrays(round_parameters) if len(round_parameters) >= MIN_ROWS else None
            over_arrays = None if arrays is None else self._sql_for(form.statement, (arrays,))
            if arrays is None or over_arrays is None:
                split.append((sql, round_parameters))
            else:
                split.append((over_arrays, (arrays,)))
        if all(piece_sql == sql for piece_sql, _ in split):
            return None  # no round goes as arrays: the sets in their own order, as before
        return split

    def execute_led(
        self,
        connection: Connection,
        lead: tuple[Executable, Mapping[str, Any]],
        batches: Sequence[tuple[Executable, Sequence[Mapping[str, Any]]]],
        *,
        begin: bool = False,
    ) -> list[int] | None:
        """Run ``lead`` (one parameter set) and then ``batches`` in one pipeline (as
        :meth:`execute_all` does), where the lead must change exactly one row.

        With ``begin``, when the database transaction has not begun yet (the lead is its first
        statement), its ``BEGIN`` goes first in the same pipeline instead of in a round trip of
        its own (psycopg sends and awaits it alone before a transaction's first statement): the
        driver runs in autocommit until the transaction ends, so that it sends no ``BEGIN`` of
        its own, and ``COMMIT`` and ``ROLLBACK`` (which psycopg sends by the transaction's state)
        end it as usual. The caller must then call :meth:`end_pipelined_begin` once the
        transaction ended, before anything else runs on the connection.

        Returns:
            The rows each statement of ``batches`` changed, in order; or None when this engine
            has no pipelines or one of them does not qualify, and then none ran.

        Raises:
            LeadMissedError: the lead changed another number of rows than one; raised also when a
                statement after it failed, since the lead's count came first (the lead decides
                whether the others should have run at all), unless the connection was lost.
            sqlalchemy.exc.DBAPIError: the database refused one of them otherwise.
        """
        if not (self.enabled and self._pipelines):
            return None
        statement, parameters = lead
        lead_rows: list[int] = []
        begin_command = self._pipelined_begin(connection) if begin else None
        try:
            counts = self.execute_all(
                connection, [(statement, (parameters,)), *batches], lead_rows, begin=begin_command
            )
        except Exception:
            # A lost connection is the retry's to handle, whatever the lead did.
            if lead_rows and lead_rows[0] != 1 and not connection.invalidated:
                raise LeadMissedError(lead_rows[0]) from None
            raise
        if counts is None:
            if begin_command is not None:
                self.end_pipelined_begin(connection)  # nothing ran: the driver begins as usual
            return None
        if counts[0] != 1:
            raise LeadMissedError(counts[0])
        return counts[1:]

    def read_begun(
        self, connection: Connection, statement: Executable, parameters: Mapping[str, Any]
    ) -> list[tuple[Any, ...]] | None:
        """Run a ``SELECT`` as the first statement of ``connection``'s transaction with the
        transaction's ``BEGIN`` in the same pipeline (psycopg), so that the two cost one round trip:
        the driver runs in autocommit until the transaction ends, as after :meth:`execute_led`
        with ``begin``, and the caller must call :meth:`end_pipelined_begin` once the transaction
        ended (also when this raised).

        Args:
            connection: a connection whose transaction has begun in SQLAlchemy and not yet in the
                driver, of the engine this instance was made for.
            statement: a ``SELECT`` built once (the same object each time).
            parameters: its parameters.

        Returns:
            The rows, each a tuple of the values ``Connection.execute`` would give (the column
            types' result processors applied); or None when it did not run (another driver, a
            transaction the driver began already, a statement that does not qualify): run it
            with ``connection.execute`` instead.

        Raises:
            sqlalchemy.exc.DBAPIError: the database refused it (as ``Connection.execute`` raises).
        """
        if not (self.enabled and self._pipelines and connection.in_transaction() and self._plain(connection)):
            return None
        compiled = self._select_for(statement, parameters)
        if compiled is None:
            return None
        sql, types, constants = compiled
        if constants:
            parameters = {**parameters, **constants}
        begin = self._pipelined_begin(connection)
        if begin is None:
            return None
        driver: Any = connection.connection.dbapi_connection
        opener = driver.cursor()
        cursor = driver.cursor()
        try:
            with _pipeline(driver, self._dialect.loaded_dbapi.Error):  # one Sync: both results
                opener.execute(begin)
                cursor.execute(sql, parameters)
            rows = cursor.fetchall()
            description = cursor.description
        except self._dialect.loaded_dbapi.Error as exc:
            # SQLAlchemy private (2.0, 2.1), as in execute_all;
            # test_a_read_begun_the_database_refuses_raises_sqlalchemy_s_error.
            connection._handle_dbapi_exception(exc, sql, parameters, None, None)
        finally:
            opener.close()
            cursor.close()
        # SQLAlchemy private (2.0, 2.1): the result processor Connection.execute applies;
        # test_a_read_begun_opens_a_snapshot_in_the_select_s_pipeline (a type that changes values).
        processors = [
            type_._cached_result_processor(self._dialect, column.type_code)
            for type_, column in zip(types, description, strict=True)
        ]
        if not any(processors):
            return [tuple(row) for row in rows]
        return [
            tuple(
                value if process is None else process(value)
                for process, value in zip(processors, row, strict=True)
            )
            for row in rows
        ]

    def end_pipelined_begin(self, connection: Connection) -> None:
        """Give the driver its own transaction control back after a transaction whose ``BEGIN``
        :meth:`execute_led` or :meth:`read_begun` sent in a pipeline (nothing to do otherwise):
        call it once that transaction ended. A connection found still in a transaction is
        invalidated, never reused in autocommit."""
        if not self._begun or connection.invalidated or connection.closed:
            return
        driver: Any = connection.connection.dbapi_connection
        if driver is None or driver not in self._begun:
            return
        self._begun.discard(driver)
        if driver.closed or driver.pgconn.transaction_status != _IDLE:
            connection.invalidate()
            return
        driver.autocommit = False

    def _pipelined_begin(self, connection: Connection) -> bytes | None:
        """The ``BEGIN`` to send first in the pipeline of the transaction's first statement,
        with the driver switched to autocommit; or None where the driver begins it itself."""
        if not (self.enabled and self._pipelines and connection.in_transaction() and self._plain(connection)):
            return None
        driver: Any = connection.connection.dbapi_connection
        if (
            driver.autocommit
            or driver.pgconn.transaction_status != _IDLE
            or driver.read_only is not None
            or driver.deferrable is not None
        ):
            return None
        command = b"BEGIN"
        if driver.isolation_level is not None:
            command += b" ISOLATION LEVEL " + driver.isolation_level.name.replace("_", " ").encode()
        driver.autocommit = True
        self._begun.add(driver)
        return command

    def _select_for(self, statement: Executable, parameters: Mapping[str, Any]) -> _Select | None:
        """The compiled SQL of a ``SELECT`` to run with ``parameters`` on the cursor, the types of
        its result columns and the statement's own bound values, or None."""
        key = (statement, frozenset(parameters))
        found = self._selects.get(key)
        if found is None:  # two threads may both compile it: the same SQL, stored once or twice
            if len(self._selects) >= _MAX_SELECTS:  # statements built anew (e.g. a shape evicted)
                self._selects.clear()
            found = self._selects[key] = self._compile_select(statement, parameters)
        return None if found is _NOT_DIRECT else found  # type: ignore[return-value]

    def _compile_select(self, statement: Executable, sample: Mapping[str, Any]) -> _Select | str:
        """The SQL, result column types and own bound values of a ``SELECT`` run with
        ``sample``'s keys, or :data:`_NOT_DIRECT`."""
        compiled = statement.compile(dialect=self._dialect)  # type: ignore[attr-defined]
        if (
            not _binds_as_given(compiled)
            or compiled.isinsert
            or compiled.isupdate
            or compiled.isdelete
            # SQLAlchemy private (2.0, 2.1), here and below: the result columns and their types;
            # test_a_read_begun_opens_a_snapshot_in_the_select_s_pipeline.
            or not compiled._result_columns
        ):
            return _NOT_DIRECT
        try:
            sent = compiled.construct_params(dict(sample))
        except Exception:  # a missing bind parameter: the ordinary path raises it
            return _NOT_DIRECT
        if any(key not in sent or sent[key] is not value for key, value in sample.items()):
            return _NOT_DIRECT  # renamed or processed parameters
        # The statement's own bound values (a LIMIT, say), the same for every run: not those a
        # callable gives anew each time.
        constants = {key: value for key, value in sent.items() if key not in sample}
        for key in constants:
            bind = compiled.binds.get(key)
            if bind is None or bind.callable is not None:
                return _NOT_DIRECT
        return compiled.string, [column[3] for column in compiled._result_columns], constants

    def _sql_for(self, statement: Executable, parameters: Sequence[Mapping[str, Any]]) -> str | None:
        """The compiled SQL to run ``statement`` with ``parameters`` on the cursor, or None."""
        if not parameters:
            return None
        first = parameters[0]
        key = (statement, frozenset(first))
        sql = self._sql.get(key)
        if sql is None:  # two threads may both compile it: the same SQL, stored once or twice
            sql = self._sql[key] = self._compile(statement, first)
        if sql is _NOT_DIRECT:
            return None
        if len(parameters) > 1 and any(len(p) != len(first) or p.keys() != first.keys() for p in parameters):
            return None
        return sql

    def _plain(self, connection: Connection) -> bool:
        """No echo and no execute or cursor-execute listener but the framework's guard (which
        refuses transaction control, and the framework's statements are none): nothing would miss
        a statement run on the cursor."""
        # SQLAlchemy private (2.0, 2.1): echo as the connection has it;
        # test_an_applications_execute_listener_or_echo_sees_every_statement.
        if connection._echo:
            return False
        dispatch = connection.dispatch
        if dispatch.before_execute or dispatch.after_execute or dispatch.after_cursor_execute:
            return False
        guards = 1 if is_prepared(self._engine) else 0
        return len(dispatch.before_cursor_execute) <= guards

    def _compile(self, statement: Executable, sample: Mapping[str, Any]) -> str:
        """The SQL to run for parameter sets with ``sample``'s keys, or :data:`_NOT_DIRECT`."""
        compiled = statement.compile(dialect=self._dialect, column_keys=list(sample))  # type: ignore[attr-defined]
        if (
            not _binds_as_given(compiled)
            or compiled.returning
            or compiled.insert_prefetch
            or compiled.update_prefetch
            or not (compiled.isinsert or compiled.isupdate or compiled.isdelete)
        ):
            return _NOT_DIRECT
        try:
            sent = compiled.construct_params(dict(sample))
        except Exception:  # a missing bind parameter: the ordinary path raises it
            return _NOT_DIRECT
        if sent != dict(sample):  # renamed, added or defaulted parameters
            return _NOT_DIRECT
        return compiled.string


def _binds_as_given(compiled: Any) -> TypeGuard[SQLCompiler]:
    """A compiled SQL statement whose parameters the driver takes as given: named, none rendered
    or expanded at execution, no bind processors."""
    return isinstance(compiled, SQLCompiler) and not (
        compiled.positional
        or compiled.literal_execute_params
        or compiled.post_compile_params
        # SQLAlchemy private (2.0, 2.1): the parameters SQLAlchemy would change;
        # test_what_sqlalchemy_would_change_goes_the_ordinary_way.
        or compiled._bind_processors
    )


@contextmanager
def _pipeline(driver: Any, error: type[Exception]) -> Iterator[None]:
    """psycopg's ``driver.pipeline()``, a statement's error in it raised once the pipeline ended.

    psycopg learns of a failed statement when it reads the results, at the pipeline's end or, with
    more to send, while the block still runs. In the second case its exit fails too (the pipeline
    is aborted), and it logs that second failure as a warning ("error ignored terminating ...:
    pipeline aborted") while the first propagates. Caught in the block and raised after it, the
    first error is the only report of the failure.

    Raises:
        error: the first error of the block's statements, or of the pipeline's end.
    """
    failed: list[Exception] = []
    try:
        with driver.pipeline():
            try:
                yield
            except error as exc:
                failed.append(exc)
    except error:
        if not failed:
            raise  # the block ran; the pipeline's end found the failure
    if failed:
        raise failed[0]


def _run(cursor: Any, sql: str, parameters: Sequence[Mapping[str, Any]]) -> None:
    if len(parameters) == 1:
        cursor.execute(sql, parameters[0])
    else:
        cursor.executemany(sql, parameters)
