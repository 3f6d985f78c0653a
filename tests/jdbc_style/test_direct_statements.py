"""The framework's writes on the driver's cursor (``DirectStatements``): PostgreSQL with psycopg,
MariaDB with PyMySQL.

A statement runs there only when what SQLAlchemy would send the driver is exactly the parameter
set; anything else, and any engine with echo or an execute or cursor-execute listener of the
application's, goes through ``Connection.execute``. Errors are SQLAlchemy's, a lost connection
invalidated (docs/design/sql.md "Group apply").
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import Engine, bindparam, event
from sqlalchemy.exc import DBAPIError, IntegrityError

from waltz.jdbc_style import create_framework_engine
from waltz.jdbc_style.direct import DirectStatements, direct_statements
from waltz.jdbc_style.engine import is_transient

metadata = sa.MetaData()


class Shouting(sa.types.TypeDecorator[str]):
    """A type with a bind processor: SQLAlchemy changes the value before the driver sees it."""

    impl = sa.String(20)
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Any) -> Any:
        return None if value is None else str(value).upper()


rows = sa.Table(
    "direct_rows",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("amount", sa.Integer, nullable=False),
    sa.Column("label", Shouting, nullable=True),
    sa.Column("noted_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("kind", sa.String(10), nullable=True, default="plain"),
)
ADD = sa.update(rows).where(rows.c.id == bindparam("k")).values(amount=rows.c.amount + bindparam("d"))
NOTE = sa.update(rows).where(rows.c.id == bindparam("k")).values(noted_at=bindparam("at"))
INSERT = sa.insert(rows)


@pytest.fixture(params=("postgresql", "mariadb"))
def engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    """A framework engine on a fresh PostgreSQL or MariaDB database, rows 1 to 3 at amount 0."""
    url = request.getfixturevalue("postgres_url" if request.param == "postgresql" else "mariadb_url")
    engine = create_framework_engine(url)
    metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(INSERT, [{"id": k, "amount": 0, "kind": "plain"} for k in (1, 2, 3)])
    try:
        yield engine
    finally:
        metadata.drop_all(engine)
        engine.dispose()


def amounts(engine: Engine) -> dict[int, int]:
    with engine.connect() as conn:
        return {int(k): int(a) for k, a in conn.execute(sa.select(rows.c.id, rows.c.amount))}


def test_runs_qualifying_statements_on_the_cursor_with_their_row_counts(engine: Engine) -> None:
    direct = direct_statements(engine)
    assert direct is direct_statements(engine) and direct.enabled
    noted = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    with engine.connect() as conn, conn.begin():
        assert direct.execute(conn, ADD, ({"k": 1, "d": 5},)) == 1
        # executemany: the rows changed in all, a missing row not counted
        assert direct.execute(conn, ADD, [{"k": 2, "d": 1}, {"k": 3, "d": 2}, {"k": 99, "d": 7}]) == 2
        assert direct.execute(conn, NOTE, ({"k": 1, "at": noted},)) == 1
        conn.execute(NOTE, {"k": 2, "at": noted})  # the ordinary path, to compare
        assert direct.execute(conn, INSERT, [{"id": 4, "amount": 9, "kind": "x"}]) == 1
    assert amounts(engine) == {1: 5, 2: 1, 3: 2, 4: 9}
    with engine.connect() as conn:
        stored = dict(conn.execute(sa.select(rows.c.id, rows.c.noted_at).where(rows.c.id.in_((1, 2)))).all())
        assert stored[1] == stored[2] and stored[1].replace(tzinfo=None) == noted.replace(tzinfo=None)


def test_several_statements_run_together_or_not_at_all(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    direct = direct_statements(engine)
    with engine.connect() as conn, conn.begin():
        counts = direct.execute_all(
            conn,
            [
                (ADD, [{"k": 1, "d": 1}, {"k": 2, "d": 2}, {"k": 99, "d": 3}]),
                (INSERT, [{"id": 4, "amount": 4, "kind": "x"}]),
                (ADD, [{"k": 4, "d": 10}]),  # sees the insert before it
            ],
        )
        assert counts == [2, 1, 1]
        with_default_left_out = (INSERT, [{"id": 5, "amount": 5}])
        assert direct.execute_all(conn, [(ADD, [{"k": 1, "d": 100}]), with_default_left_out]) is None
    assert amounts(engine) == {1: 1, 2: 2, 3: 0, 4: 14}
    caplog.set_level(logging.WARNING)
    with engine.connect() as conn, pytest.raises(IntegrityError), conn.begin():
        direct.execute_all(
            conn,
            [
                (ADD, [{"k": 1, "d": 100}]),
                (INSERT, [{"id": 1, "amount": 1, "kind": "x"}]),
                # Statements after the failing one: psycopg may learn of the failure while it
                # still sends them, inside the pipeline's block.
                *((NOTE, [{"k": 2, "at": None}]) for _ in range(200)),
            ],
        )
    assert amounts(engine) == {1: 1, 2: 2, 3: 0, 4: 14}  # rolled back together
    # The error is raised, and only it: not psycopg's warning that its aborted pipeline then
    # failed to end too (a second report of the same failure).
    assert not [r for r in caplog.records if r.name.startswith("psycopg")], caplog.text


class _UndoError(Exception):
    pass


def test_the_lead_s_pipeline_begins_the_transaction_and_gives_it_back(engine: Engine) -> None:
    """On psycopg ``execute_led(begin=True)`` sends the transaction's ``BEGIN`` in the lead's
    pipeline (no round trip of its own): what runs after it is in the same transaction, which
    rolls back or commits as a whole; ``end_pipelined_begin`` gives the driver its own
    transaction control back, and invalidates a connection still in a transaction."""
    direct = direct_statements(engine)
    lead = (ADD, {"k": 1, "d": 1})
    if engine.dialect.name != "postgresql":  # no pipelines: declined, nothing ran
        with engine.connect() as conn, conn.begin():
            assert direct.execute_led(conn, lead, [(ADD, [{"k": 2, "d": 2}])], begin=True) is None
        assert amounts(engine) == {1: 0, 2: 0, 3: 0}
        return
    from psycopg import pq  # PostgreSQL's driver: only this case needs it

    with engine.connect() as conn:
        driver: Any = conn.connection.dbapi_connection
        with pytest.raises(_UndoError), conn.begin():
            assert direct.execute_led(conn, lead, [(ADD, [{"k": 2, "d": 2}])], begin=True) == [1]
            assert driver.autocommit and driver.pgconn.transaction_status == pq.TransactionStatus.INTRANS
            conn.execute(ADD, {"k": 3, "d": 3})  # the ordinary path, in the same transaction
            raise _UndoError
        assert amounts(engine) == {1: 0, 2: 0, 3: 0}  # all of it rolled back
        direct.end_pipelined_begin(conn)
        assert not driver.autocommit
        with conn.begin():
            assert direct.execute_led(conn, lead, [], begin=True) == []  # the lead alone, with BEGIN
            conn.execute(ADD, {"k": 3, "d": 3})
        direct.end_pipelined_begin(conn)
        assert not driver.autocommit and not conn.invalidated
        assert amounts(engine) == {1: 1, 2: 0, 3: 3}
        with conn.begin():  # the driver's own BEGIN again
            assert direct.execute(conn, ADD, ({"k": 2, "d": 2},)) == 1
        assert amounts(engine) == {1: 1, 2: 2, 3: 3}
        conn.begin()
        direct.execute_led(conn, lead, [], begin=True)
        direct.end_pipelined_begin(conn)  # too early: the transaction is open
        assert conn.invalidated
    assert amounts(engine) == {1: 1, 2: 2, 3: 3}


class Cents(sa.types.TypeDecorator[int]):
    """A type with a result processor: SQLAlchemy changes the value the driver returns."""

    impl = sa.Integer
    cache_ok = True

    def process_result_value(self, value: Any, dialect: Any) -> Any:
        return None if value is None else value * 100


READ = (
    sa.select(rows.c.id, rows.c.amount, sa.type_coerce(rows.c.amount, Cents), rows.c.kind, sa.func.now())
    .where(rows.c.id >= bindparam("low"))
    .order_by(rows.c.id)
    .limit(2)  # a value the statement binds itself
)


def test_a_read_begun_opens_a_snapshot_in_the_select_s_pipeline(engine: Engine) -> None:
    """On psycopg ``read_begun`` sends the transaction's ``BEGIN`` (with the connection's isolation
    level) and a ``SELECT`` in one pipeline: the rows are those ``Connection.execute`` gives (result
    processors applied), the snapshot is the transaction's (a commit made meanwhile elsewhere is
    not seen), and ``end_pipelined_begin`` after the rollback gives the driver back. Elsewhere,
    and for statements with bind processors, it declines and nothing runs."""
    direct = direct_statements(engine)
    with engine.begin() as conn:
        conn.execute(ADD, [{"k": 2, "d": 3}, {"k": 3, "d": 4}])
        expected = [tuple(row) for row in conn.execute(READ, {"low": 2}).all()]
    assert [row[:4] for row in expected] == [(2, 3, 300, "plain"), (3, 4, 400, "plain")]
    shouting = sa.select(rows.c.id).where(rows.c.label == bindparam("label"))
    if engine.dialect.name != "postgresql":  # no pipelines: declined, nothing ran
        with engine.connect() as conn, conn.begin():
            assert direct.read_begun(conn, READ, {"low": 2}) is None
        return
    from psycopg import pq  # PostgreSQL's driver: only this case needs it

    with engine.connect() as pooled:
        conn = pooled.execution_options(isolation_level="REPEATABLE READ")
        driver: Any = conn.connection.dbapi_connection
        with conn.begin():
            assert direct.read_begun(conn, shouting, {"label": "a"}) is None  # a bind processor
            assert not driver.autocommit and driver.pgconn.transaction_status == pq.TransactionStatus.IDLE
        conn.begin()
        read = direct.read_begun(conn, READ, {"low": 2})
        assert read is not None and [row[:4] for row in read] == [row[:4] for row in expected]
        assert all(isinstance(row[4], dt.datetime) for row in read)
        assert driver.autocommit and driver.pgconn.transaction_status == pq.TransactionStatus.INTRANS
        assert conn.execute(sa.text("SHOW transaction_isolation")).scalar() == "repeatable read"
        with engine.begin() as other:  # committed after the snapshot began
            other.execute(ADD, {"k": 2, "d": 5})
        assert conn.execute(sa.select(rows.c.amount).where(rows.c.id == 2)).scalar() == 3
        conn.rollback()
        direct.end_pipelined_begin(conn)
        assert not driver.autocommit and not conn.invalidated
        with conn.begin():  # the driver's own BEGIN again: a new snapshot
            assert conn.execute(sa.select(rows.c.amount).where(rows.c.id == 2)).scalar() == 8
    assert amounts(engine) == {1: 0, 2: 8, 3: 4}


def test_a_read_begun_the_database_refuses_raises_sqlalchemy_s_error(engine: Engine) -> None:
    """A ``SELECT`` the database refuses in ``read_begun``'s pipeline raises the ``DBAPIError``
    subclass ``Connection.execute`` would; after the rollback, ``end_pipelined_begin`` gives the
    driver back and the connection goes on."""
    direct = direct_statements(engine)
    with engine.connect() as conn:
        conn.begin()
        if engine.dialect.name != "postgresql":  # no pipelines: declined, nothing ran
            assert direct.read_begun(conn, READ, {"low": "not a number"}) is None
            conn.rollback()
            return
        from psycopg import DataError  # PostgreSQL's driver: only this case needs it

        driver: Any = conn.connection.dbapi_connection
        with pytest.raises(DBAPIError) as refused:
            direct.read_begun(conn, READ, {"low": "not a number"})  # compared with an integer column
        assert isinstance(refused.value.orig, DataError) and not is_transient(refused.value)
        conn.rollback()
        direct.end_pipelined_begin(conn)
        assert not driver.autocommit and not conn.invalidated
        conn.begin()
        read = direct.read_begun(conn, READ, {"low": 3})
        assert read is not None and [row[:2] for row in read] == [(3, 0)]
        conn.rollback()
        direct.end_pipelined_begin(conn)
        assert not driver.autocommit and not conn.invalidated


def test_what_sqlalchemy_would_change_goes_the_ordinary_way(engine: Engine) -> None:
    direct = direct_statements(engine)
    literal = sa.update(rows).where(rows.c.id == bindparam("k")).values(amount=7)  # a bound value of its own
    with engine.connect() as conn, conn.begin():
        # a bind processor (the type upper-cases the label)
        assert (
            direct.execute(
                conn, sa.update(rows).where(rows.c.id == bindparam("k")), ({"k": 1, "label": "a"},)
            )
            is None
        )
        # a Python-side default (kind) the parameter set leaves out
        assert direct.execute(conn, INSERT, ({"id": 5, "amount": 1},)) is None
        assert direct.execute(conn, literal, ({"k": 1},)) is None
        # parameter sets with other keys than the first's
        assert direct.execute(conn, ADD, [{"k": 1, "d": 1}, {"k": 2}]) is None
        assert (
            direct.execute(conn, sa.select(rows.c.id).where(rows.c.id == bindparam("k")), ({"k": 1},)) is None
        )
        assert direct.execute(conn, ADD, ()) is None
    with engine.connect() as conn:
        assert direct.execute(conn, ADD, ({"k": 1, "d": 1},)) is None  # not in a transaction
    assert amounts(engine) == {1: 0, 2: 0, 3: 0}


def test_an_applications_execute_listener_or_echo_sees_every_statement(engine: Engine) -> None:
    """The direct path declines (None: the caller runs the statement through SQLAlchemy, where
    the application's listeners and echo see it) while any of them is on."""
    direct = direct_statements(engine)

    def listener(*args: Any) -> None:
        pass

    for name in ("before_cursor_execute", "after_cursor_execute", "before_execute", "after_execute"):
        event.listen(engine, name, listener)
        try:
            with engine.connect() as conn, conn.begin():
                assert direct.execute(conn, ADD, ({"k": 1, "d": 1},)) is None, name
        finally:
            event.remove(engine, name, listener)
    with engine.connect() as conn, conn.begin():
        assert direct.execute(conn, ADD, ({"k": 1, "d": 1},)) == 1
    engine.echo = True
    try:
        with engine.connect() as conn, conn.begin():
            assert direct.execute(conn, ADD, ({"k": 1, "d": 1},)) is None
    finally:
        engine.echo = False


def test_database_errors_are_sqlalchemys_and_a_lost_connection_is_invalidated(engine: Engine) -> None:
    direct = direct_statements(engine)
    with engine.connect() as conn:
        with pytest.raises(IntegrityError) as caught, conn.begin():
            direct.execute(conn, INSERT, [{"id": 1, "amount": 1, "kind": "x"}])
        assert not is_transient(caught.value)
        with conn.begin():  # the connection goes on after the rollback
            assert direct.execute(conn, ADD, ({"k": 1, "d": 2},)) == 1
    with engine.connect() as conn:
        conn.begin()
        postgresql = engine.dialect.name == "postgresql"
        pid = conn.exec_driver_sql(
            "select pg_backend_pid()" if postgresql else "select connection_id()"
        ).scalar_one()
        with engine.connect() as other:
            other.exec_driver_sql(
                f"select pg_terminate_backend({int(pid)})" if postgresql else f"kill {int(pid)}"
            )
        with pytest.raises(DBAPIError) as lost:
            direct.execute(conn, ADD, ({"k": 1, "d": 100},))
        assert lost.value.connection_invalidated and is_transient(lost.value)
        assert conn.invalidated
    assert amounts(engine) == {1: 2, 2: 0, 3: 0}


def test_sqlite_takes_the_ordinary_path(tmp_path: Path) -> None:
    engine = create_framework_engine(f"sqlite:///{tmp_path / 'direct.db'}")
    try:
        metadata.create_all(engine)
        direct = DirectStatements(engine)
        assert not direct.enabled
        with engine.connect() as conn, conn.begin():
            assert direct.execute(conn, INSERT, [{"id": 1, "amount": 1, "kind": "x"}]) is None
    finally:
        engine.dispose()
