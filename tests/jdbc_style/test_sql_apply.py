"""The SQL callbacks' apply path on SQLite, PostgreSQL and MariaDB (real databases, no cluster).

Transactions are made by hand (as the client would hand them over), so each rule of
``AbstractClientCallbacksForSQL`` is checked directly: mark = id - 1 applies, mark >= id skips,
a gap is an error, failures roll back without moving the mark, the apply cannot end the
transaction, transient errors (a real deadlock, a killed connection) are retried, group apply
finishes a batch another instance applied in part, read-your-writes, idempotency keys, and the
operator's audited skip.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import Engine, text
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from waltz.client.transaction import Transaction
from waltz.errors import (
    ApplyContractError,
    ApplyPausedError,
    GenesisHeldError,
    HighWaterMarkGapError,
    TransactionApplyError,
)
from waltz.jdbc_style import (
    AbstractClientCallbacksForSQL,
    AddAttribute,
    ChangeSet,
    ChangeSetApplyError,
    ChangeSetCallbacks,
    EntityNotDeclaredError,
    EntityRegistry,
    WaltzEntity,
    create_framework_engine,
)
from waltz.jdbc_style.changeset import CHANGE_SET_HEADER, Operation, RowChange
from waltz.jdbc_style.changeset_callbacks import ModelTablesBehindError
from waltz.jdbc_style.engine import is_prepared, prepare_engine
from waltz.jdbc_style.idempotency import (
    AppliedRequest,
    find_idempotency_keys,
    record_idempotency_key,
    record_idempotency_keys,
)
from waltz.jdbc_style.migrations_api import upgrade
from waltz.jdbc_style.skips import request_skip
from waltz.jdbc_style.upcasting import SchemaVersionAheadError
from waltz.protocol.records import ReqId
from waltz.protocol.split_records import SPLIT_RECORD_HEADER, SplitBarrier, SplitGenesis

BACKENDS = ["sqlite", "postgresql", "mariadb"]

items = sa.Table(
    "items",
    sa.MetaData(),
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("value", sa.Integer, nullable=False),
)


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'app.db'}"
    fixture = "postgres_url" if request.param == "postgresql" else "mariadb_url"
    return str(request.getfixturevalue(fixture))


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    engine = create_framework_engine(db_url)
    upgrade(engine)
    items.metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(items.insert(), [{"id": i, "value": 0} for i in range(1, 4)])
    try:
        yield engine
    finally:
        engine.dispose()


Apply = Callable[[Transaction, Session, int], None]


class Recorder(AbstractClientCallbacksForSQL):
    """Callbacks whose ``apply`` adds 1 to item 1 (unless ``touch_item`` is off) and runs a hook.

    ``attempts[(pid, tid)]`` counts apply calls (including rolled-back ones); ``applied`` lists
    the (pid, tid) of calls that returned.
    """

    def __init__(
        self, engine: Engine, hook: Apply | None = None, *, touch_item: bool = True, **kwargs: Any
    ) -> None:
        super().__init__(engine, cluster_name="test-cluster", **kwargs)
        self.hook = hook
        self.touch_item = touch_item
        self.attempts: dict[tuple[int, int], int] = {}
        self.applied: list[tuple[int, int]] = []
        self.uncaught: list[tuple[int, int, BaseException]] = []
        self._lock = threading.Lock()

    def apply(self, transaction: Transaction, session: Session) -> None:
        key = (transaction.partition_id, transaction.transaction_id)
        with self._lock:
            self.attempts[key] = attempt = self.attempts.get(key, 0) + 1
        if self.touch_item:
            session.execute(items.update().where(items.c.id == 1).values(value=items.c.value + 1))
        if self.hook is not None:
            self.hook(transaction, session, attempt)
        with self._lock:
            self.applied.append(key)

    def uncaught_exception(self, partition_id: int, transaction_id: int, exception: BaseException) -> None:
        self.uncaught.append((partition_id, transaction_id, exception))


def txn(partition_id: int, transaction_id: int, data: bytes = b"x", header: int = 0) -> Transaction:
    return Transaction(
        partition_id, transaction_id, ReqId(1, 1, partition_id, transaction_id), header, None, data
    )


def item(engine: Engine, item_id: int = 1) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.select(items.c.value).where(items.c.id == item_id)).scalar_one())


def mark_rows(engine: Engine) -> list[tuple[str, int, int]]:
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT cluster_name, partition_id, high_water_mark FROM waltz_high_water_marks")
        )
        return sorted((str(c), int(p), int(m)) for c, p, m in rows)


def test_missing_mark_rows_are_created_once_under_concurrency(engine: Engine, db_url: str) -> None:
    # Eight instances (own engines) ask for the same partitions' marks at the same moment.
    engines = [create_framework_engine(db_url) for _ in range(8)]
    instances = [Recorder(e) for e in engines]
    start = threading.Barrier(len(instances), timeout=30)
    results: list[list[int]] = []
    errors: list[BaseException] = []

    def ask(callbacks: Recorder) -> None:
        try:
            start.wait()
            results.append([callbacks.get_client_high_water_mark(p) for p in (0, 1, 2)])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=ask, args=(c,)) for c in instances]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for e in engines:
        e.dispose()
    assert errors == []
    assert results == [[-1, -1, -1]] * len(instances)
    assert mark_rows(engine) == [("test-cluster", p, -1) for p in (0, 1, 2)]


def test_apply_moves_the_mark_skips_what_is_applied_and_refuses_gaps(engine: Engine) -> None:
    callbacks = Recorder(engine)
    assert callbacks.get_client_high_water_mark(0) == -1
    callbacks.apply_transaction(txn(0, 0))
    callbacks.apply_transaction(txn(0, 1))
    assert callbacks.high_water_marks() == {0: 1}
    assert item(engine) == 2

    # Another instance sharing the database sees 0 and 1 again: both skipped, apply not called.
    other = Recorder(engine)
    other.apply_transaction(txn(0, 0))
    other.apply_transaction(txn(0, 1))
    assert other.attempts == {}
    assert item(engine) == 2

    # Transaction 3 without 2: a gap, never a skip.
    with pytest.raises(HighWaterMarkGapError, match=r"transactions 2\.\.2 are missing") as gap:
        callbacks.apply_transaction(txn(0, 3))
    assert "restart the application's instances" in str(gap.value) and "waltz rebuild" in str(gap.value)
    assert callbacks.high_water_marks() == {0: 1}
    assert item(engine) == 2
    # Partitions are independent; another cluster name is another log.
    callbacks.apply_transaction(txn(1, 0))
    assert callbacks.high_water_marks() == {0: 1, 1: 0}
    second_log = Recorder.__new__(Recorder)
    AbstractClientCallbacksForSQL.__init__(second_log, engine, cluster_name="other-log")
    assert second_log.get_client_high_water_mark(0) == -1


def test_a_failing_apply_rolls_back_and_keeps_the_mark(engine: Engine) -> None:
    def fail(transaction: Transaction, session: Session, attempt: int) -> None:
        session.execute(items.update().where(items.c.id == 2).values(value=99))
        raise ValueError("the application refused it")

    callbacks = Recorder(engine, fail)
    assert callbacks.get_client_high_water_mark(0) == -1  # as the client does on mount
    with pytest.raises(ValueError, match="refused"):
        callbacks.apply_transaction(txn(0, 0))
    assert callbacks.attempts == {(0, 0): 1}  # not retried by the framework: not transient
    assert callbacks.high_water_marks() == {0: -1}
    assert item(engine, 1) == 0
    assert item(engine, 2) == 0


@pytest.mark.parametrize(
    "misbehaviour",
    [
        "session.commit",
        "session.rollback",
        "session.begin",
        "sql COMMIT",
        "sql ROLLBACK",
        "isolation",
        "conn.commit",
    ],
)
def test_apply_cannot_end_or_reshape_the_framework_transaction(engine: Engine, misbehaviour: str) -> None:
    def misbehave(transaction: Transaction, session: Session, attempt: int) -> None:
        if misbehaviour == "session.commit":
            session.commit()
        elif misbehaviour == "session.rollback":
            session.rollback()
        elif misbehaviour == "session.begin":
            session.begin()
        elif misbehaviour == "sql COMMIT":
            session.execute(text("COMMIT"))
        elif misbehaviour == "sql ROLLBACK":
            session.execute(text("ROLLBACK"))
        elif misbehaviour == "isolation":
            session.connection(execution_options={"isolation_level": "SERIALIZABLE"})
        else:
            session.connection().commit()

    callbacks = Recorder(engine, misbehave)
    assert callbacks.get_client_high_water_mark(0) == -1
    with pytest.raises(ApplyContractError, match="apply\\(\\) must not"):
        callbacks.apply_transaction(txn(0, 0))
    assert callbacks.high_water_marks() == {0: -1}
    assert item(engine) == 0  # the write before the misbehaviour was rolled back
    # Savepoints are allowed, and the next apply works on the same pooled connections.
    ok = Recorder(engine, lambda t, s, a: s.begin_nested().rollback())
    ok.apply_transaction(txn(0, 0))
    assert ok.high_water_marks() == {0: 0}
    assert item(engine) == 1


def test_create_framework_engine_takes_a_url_object_as_it_takes_its_text(db_url: str) -> None:
    url = sa.make_url(db_url)
    engine = create_framework_engine(url)
    try:
        assert is_prepared(engine)
        assert engine.url == url
        if url.get_backend_name() != "sqlite":  # a server's defaults, as for the URL's text
            assert engine.pool.size() == 10  # type: ignore[attr-defined]
        with engine.connect() as conn:
            assert conn.execute(text("SELECT 1")).scalar() == 1
    finally:
        engine.dispose()


@pytest.mark.parametrize(
    "url",
    [
        "postgresql+psycopg://app:s3cret@127.0.0.1:notaport/app",  # the port is not a number
        "postgresql+psycopg://app:s3cret/app",  # no host: the password is read as the port
        "app:s3cret at db/app",  # does not parse: no dialect
    ],
)
def test_a_url_that_does_not_parse_is_refused_without_its_password(url: str) -> None:
    """``create_framework_engine`` (and the migrations, which parse the same way) refuse a URL
    that does not parse with ``DatabaseUrlError``, an ``ArgumentError`` and a ``ValueError``
    whose message, and chained causes, never quote the URL."""
    from sqlalchemy.exc import ArgumentError

    from waltz.jdbc_style import migrations_api
    from waltz.jdbc_style.engine import DatabaseUrlError

    for call in (create_framework_engine, migrations_api.current):
        with pytest.raises(DatabaseUrlError) as refused:
            call(url)
        assert isinstance(refused.value, ArgumentError) and isinstance(refused.value, ValueError)
        said = [str(refused.value), repr(refused.value.__cause__), repr(refused.value.__context__)]
        assert not any("s3cret" in text for text in said), said
        assert "not shown: it may hold a password" in str(refused.value)


#: Statements that end or open a transaction behind what the database skips: comments,
#: semicolons, and where the database runs a comment's text (MySQL's and MariaDB's ``/*!``) that.
HIDDEN_STATEMENTS = {
    "sqlite": ["/* audit */ COMMIT", "-- audit\nCOMMIT", " ;\n; ROLLBACK", "/* a */ -- b\n /* c */ BEGIN"],
    "postgresql": ["/* audit */ COMMIT", "-- audit\nCOMMIT", "; ROLLBACK", "/* outer /* nested */ */ COMMIT"],
    "mysql": [
        "/* audit */ COMMIT",
        "-- audit\nCOMMIT",
        "# audit\nCOMMIT",
        "/*!COMMIT*/",
        "/*!40101 BEGIN */",
    ],
}


def test_apply_cannot_hide_a_commit_behind_a_comment(engine: Engine) -> None:
    statements = HIDDEN_STATEMENTS[engine.dialect.name]
    for statement in statements:
        callbacks = Recorder(engine, lambda t, s, a, statement=statement: s.execute(text(statement)))
        assert callbacks.get_client_high_water_mark(0) == -1
        with pytest.raises(ApplyContractError, match="apply\\(\\) must not execute"):
            callbacks.apply_transaction(txn(0, 0))
        assert callbacks.high_water_marks() == {0: -1}, statement
        assert item(engine) == 0, statement  # the write before the statement was rolled back


@pytest.mark.parametrize("backend", ["postgresql", "mariadb"])
def test_a_real_deadlock_is_retried(request: pytest.FixtureRequest, backend: str) -> None:
    url = str(request.getfixturevalue("postgres_url" if backend == "postgresql" else "mariadb_url"))
    engine = create_framework_engine(url)
    upgrade(engine)
    items.metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(items.insert(), [{"id": i, "value": 0} for i in range(1, 4)])
    both_hold_one = threading.Barrier(2, timeout=20)

    def cross(transaction: Transaction, session: Session, attempt: int) -> None:
        # Partition 0 locks item 2 then 3; partition 1 locks 3 then 2: on the first attempt both
        # hold one lock when they ask for the other, and the database kills one of them.
        first, second = (2, 3) if transaction.partition_id == 0 else (3, 2)
        session.execute(items.update().where(items.c.id == first).values(value=items.c.value + 1))
        if attempt == 1:
            both_hold_one.wait()
        session.execute(items.update().where(items.c.id == second).values(value=items.c.value + 1))

    callbacks = Recorder(engine, cross, touch_item=False)
    errors: list[BaseException] = []

    def run(pid: int) -> None:
        try:
            callbacks.apply_transaction(txn(pid, 0))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(pid,)) for pid in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    try:
        assert errors == []
        # The survivor applied at its first attempt; the victim was retried until it applied (on a
        # loaded machine a retry that starts while the survivor still runs can fail again).
        survivor, victim = sorted(callbacks.attempts.values())
        assert survivor == 1 and victim >= 2
        assert callbacks.high_water_marks() == {0: 0, 1: 0}
        assert (item(engine, 1), item(engine, 2), item(engine, 3)) == (0, 2, 2)
    finally:
        engine.dispose()


@pytest.mark.parametrize("backend", ["postgresql", "mariadb"])
def test_a_lost_connection_is_retried(request: pytest.FixtureRequest, backend: str) -> None:
    url = str(request.getfixturevalue("postgres_url" if backend == "postgresql" else "mariadb_url"))
    engine = create_framework_engine(url)
    upgrade(engine)
    items.metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(items.insert(), [{"id": 1, "value": 0}])

    def kill_own_connection(transaction: Transaction, session: Session, attempt: int) -> None:
        if attempt == 1:
            if backend == "postgresql":
                session.execute(text("SELECT pg_terminate_backend(pg_backend_pid())"))
            else:
                session.execute(text("KILL CONNECTION CONNECTION_ID()"))

    callbacks = Recorder(engine, kill_own_connection)
    try:
        callbacks.apply_transaction(txn(0, 0))
        assert callbacks.attempts == {(0, 0): 2}
        assert callbacks.high_water_marks() == {0: 0}
        assert item(engine) == 1  # the killed attempt's write is gone, the retry's is there
    finally:
        engine.dispose()


def _busy(statement: str = "UPDATE items") -> sa.exc.OperationalError:
    """A transient database error (SQLite's busy database), as the driver would raise it."""
    return sa.exc.OperationalError(statement, {}, sqlite3.OperationalError("database is locked"))


def test_applies_leave_no_garbage_cycles_and_still_retry(engine: Engine) -> None:
    """Every apply runs under the framework's retries; they must not leave reference cycles
    behind (a garbage collector pass over them pauses the whole process), and reusing their state
    must keep retrying transient errors and follow a changed ``retry_timeout``."""

    def busy_once(transaction: Transaction, session: Session, attempt: int) -> None:
        if transaction.transaction_id == 50 and attempt == 1:
            raise _busy()

    # No statement built per apply (building one leaves a few cycles of SQLAlchemy's own).
    callbacks = Recorder(engine, busy_once, touch_item=False)
    callbacks.apply_transaction(txn(0, 0))  # first-use objects (pool, compiled statements)
    gc.collect()
    gc.disable()
    try:
        for tid in range(1, 101):
            callbacks.apply_transaction(txn(0, tid))
        # Keep what the collector finds unreachable, and count the retries' own objects in it:
        # other threads of the test process may leave garbage of their own meanwhile.
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        retry_objects = [o for o in gc.garbage if type(o).__module__.split(".")[0] == "tenacity"]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert callbacks.attempts[(0, 50)] == 2  # retried once
    assert callbacks.high_water_marks() == {0: 100}
    # Those of the one retried error at most; a retry object built per call left its own in a cycle.
    assert len(retry_objects) < 5, f"{len(retry_objects)} retry objects in reference cycles after 100 applies"

    def always_busy(transaction: Transaction, session: Session, attempt: int) -> None:
        raise _busy()

    callbacks.hook = always_busy
    callbacks.retry_timeout = 0.3
    started = time.monotonic()
    with pytest.raises(sa.exc.OperationalError, match="database is locked"):
        callbacks.apply_transaction(txn(0, 101))
    assert time.monotonic() - started < 10  # the new timeout, not the default 60 s
    assert callbacks.attempts[(0, 101)] >= 2
    assert callbacks.high_water_marks() == {0: 100}


def test_group_apply_finishes_a_batch_another_instance_applied_in_part(engine: Engine) -> None:
    first = Recorder(engine)
    first.apply_transaction(txn(0, 0))
    first.apply_transaction(txn(0, 1))
    second = Recorder(engine)
    second.apply_transactions([txn(0, i) for i in range(5)])
    assert second.applied == [(0, 2), (0, 3), (0, 4)]
    assert second.high_water_marks() == {0: 4}
    assert item(engine) == 5


def test_a_failing_group_keeps_what_precedes_the_failure_and_names_it(engine: Engine) -> None:
    def fail_on_3(transaction: Transaction, session: Session, attempt: int) -> None:
        if transaction.transaction_id == 3:
            raise LookupError("no such account")

    callbacks = Recorder(engine, fail_on_3)
    with pytest.raises(TransactionApplyError) as caught:
        callbacks.apply_transactions([txn(0, i) for i in range(6)])
    assert caught.value.transaction_id == 3
    assert isinstance(caught.value.cause, LookupError)
    assert callbacks.high_water_marks() == {0: 2}
    assert item(engine) == 3


def test_wait_for_sees_applies_of_this_and_of_other_instances(engine: Engine) -> None:
    reader = Recorder(engine)
    writer = Recorder(engine)
    assert reader.wait_for(0, 0, timeout=0.2) is False
    done = threading.Event()
    result: list[bool] = []

    def wait() -> None:
        result.append(reader.wait_for(0, 1, timeout=30))
        done.set()

    waiter = threading.Thread(target=wait)
    waiter.start()
    writer.apply_transaction(txn(0, 0))
    assert not done.wait(0.3)  # 0 is not 1
    writer.apply_transaction(txn(0, 1))  # another instance: the reader polls the database
    waiter.join(30)
    assert result == [True]
    reader.apply_transaction(txn(0, 2))
    assert reader.wait_for(0, 2, timeout=0) is True


def test_wait_for_refuses_the_none_of_an_outcome_that_did_not_commit(engine: Engine) -> None:
    """``wait_for(partition, outcome.transaction_id)`` on a dropped outcome (None) says to check
    the outcome, on both the blocking and the asyncio form."""
    callbacks = Recorder(engine)
    with pytest.raises(TypeError, match="a dropped outcome has no transaction to wait for"):
        callbacks.wait_for(0, None, timeout=0)  # type: ignore[arg-type]

    async def main() -> None:
        with pytest.raises(TypeError, match="a dropped outcome has no transaction to wait for"):
            await callbacks.wait_for_async(0, None, timeout=0)  # type: ignore[arg-type]

    asyncio.run(main())


class Base(DeclarativeBase):
    pass


class Account(Base):
    __tablename__ = "accounts"
    __waltz__ = WaltzEntity("account")
    account_id: Mapped[int] = mapped_column(primary_key=True)
    balance: Mapped[int] = mapped_column(default=0)


def change_set_txn(tid: int, balance: int, key: str | None, insert: bool = False) -> Transaction:
    operation = Operation.INSERT if insert else Operation.UPDATE
    change = RowChange(operation, "account", {"account_id": 1}, {"account_id": 1, "balance": balance})
    return txn(0, tid, ChangeSet([change], idempotency_key=key).encode(), header=CHANGE_SET_HEADER)


def test_an_idempotency_key_applies_a_request_once(engine: Engine) -> None:
    Base.metadata.create_all(engine)
    callbacks = ChangeSetCallbacks(engine, cluster_name="test-cluster", registry=EntityRegistry([Account]))
    callbacks.apply_transaction(change_set_txn(0, 10, None, insert=True))
    callbacks.apply_transaction(change_set_txn(1, 20, "req-1"))
    callbacks.apply_transaction(change_set_txn(2, 30, "req-1"))  # the same request, submitted again
    callbacks.apply_transaction(change_set_txn(3, 40, "req-2"))
    with engine.connect() as conn:
        assert conn.execute(sa.select(Account.balance)).scalar_one() == 40
    found = callbacks.find_idempotency_key("req-1")
    assert found is not None and (found.partition_id, found.transaction_id) == (0, 1)
    assert callbacks.find_idempotency_key("req-3") is None
    assert callbacks.high_water_marks() == {0: 3}
    # A database replaying the same log makes the same choice.
    with engine.begin() as conn:
        conn.execute(sa.delete(Account))
        conn.execute(text("DELETE FROM waltz_idempotency_keys"))
        conn.execute(text("DELETE FROM waltz_high_water_marks"))
    replay = ChangeSetCallbacks(engine, cluster_name="test-cluster", registry=EntityRegistry([Account]))
    replay.apply_transactions(
        [change_set_txn(0, 10, None, insert=True)]
        + [change_set_txn(i, b, k) for i, b, k in ((1, 20, "req-1"), (2, 30, "req-1"), (3, 40, "req-2"))]
    )
    with engine.connect() as conn:
        assert conn.execute(sa.select(Account.balance)).scalar_one() == 40
    assert replay.uncaught_count == 0


def test_a_transaction_that_is_not_a_change_set_names_the_usual_cause(engine: Engine) -> None:
    """Another program's transaction in the application's partitions (a plain client's deposit,
    ``waltz client validate``'s number) is refused, the mark kept, and the error says where such
    transactions come from and the ways out."""
    Base.metadata.create_all(engine)
    callbacks = ChangeSetCallbacks(engine, cluster_name="test-cluster", registry=EntityRegistry([Account]))
    with pytest.raises(NotImplementedError) as refused:
        callbacks.apply_transaction(txn(0, 0, b"1", header=0))
    message = str(refused.value)
    assert "partition 0 transaction 0 has header 0, not a change-set" in message, message
    assert "waltz client validate" in message and "a cluster of its own" in message, message
    assert "waltz db skip" in message and "apply_command()" in message, message
    assert callbacks.high_water_marks() == {0: -1}


def test_a_transaction_of_waltz_client_validate_is_applied_as_changing_nothing(engine: Engine) -> None:
    """``waltz client validate`` writes an empty change-set carrying its number in ``meta``: an
    application of the framework that mounts a validated partition applies it as changing no row
    and moves its mark (its older form, header 0 and ASCII digits, is refused as any transaction
    that is not a change-set)."""
    from waltz.admin.client_tools import validation_data

    Base.metadata.create_all(engine)
    callbacks = ChangeSetCallbacks(engine, cluster_name="test-cluster", registry=EntityRegistry([Account]))
    callbacks.apply_transaction(txn(0, 0, validation_data(0), header=CHANGE_SET_HEADER))
    callbacks.apply_transaction(change_set_txn(1, 10, None, insert=True))
    assert callbacks.high_water_marks() == {0: 1}
    assert callbacks.uncaught_count == 0
    with engine.connect() as conn:
        assert conn.execute(sa.select(Account.balance)).scalar_one() == 10


def test_another_name_on_a_database_that_follows_a_log_is_warned_of(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    """A second instance started with another cluster_name on a database that follows a log:
    its callbacks warn, naming the logs the database follows, that the new name's log is applied
    from its start onto the rows already there. The same name, or a database with no rows yet,
    says nothing."""
    Base.metadata.create_all(engine)
    registry = EntityRegistry([Account])
    caplog.set_level(logging.WARNING, logger="waltz.jdbc_style.changeset_callbacks")
    first = ChangeSetCallbacks(engine, cluster_name="test-cluster", registry=registry)
    first.apply_transaction(change_set_txn(0, 10, None, insert=True))

    def warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records if "from its start" in r.getMessage()]

    ChangeSetCallbacks(engine, cluster_name="test-cluster", registry=registry)
    assert warnings() == []
    ChangeSetCallbacks(engine, cluster_name="test-cluster-b", registry=registry)
    (warning,) = warnings()
    assert "holds the marks of the logs ['test-cluster'], none of 'test-cluster-b'" in warning, warning
    assert f"rows in {Account.__tablename__}" in warning, warning
    caplog.clear()
    with engine.begin() as conn:
        conn.execute(sa.delete(Account))
    ChangeSetCallbacks(engine, cluster_name="test-cluster-c", registry=registry)
    assert warnings() == [], "a database whose models' tables hold no rows was warned of"


def test_a_batch_s_keys_are_recorded_once_each_whatever_their_number(engine: Engine) -> None:
    """record_idempotency_keys: one execution inserts the keys not recorded yet, however many (the
    statement is the same for any number of rows), and says which this transaction is first to
    carry, whether it inserted them now or recorded them before; a key recorded earlier keeps its
    first transaction."""
    cluster = "test-cluster"
    first = [f"req-{i}" for i in range(40)]
    with engine.begin() as conn:
        assert record_idempotency_keys(
            conn, cluster_name=cluster, keys=first, partition_id=1, transaction_id=7
        ) == dict.fromkeys(first, True)
    with engine.begin() as conn:  # one key again, one new, the new one twice in the batch
        again = record_idempotency_keys(
            conn, cluster_name=cluster, keys=["req-3", "req-40", "req-40"], partition_id=2, transaction_id=9
        )
    assert again == {"req-3": False, "req-40": True}
    with engine.begin() as conn:  # the first transaction again: what it recorded stays its own
        assert record_idempotency_keys(
            conn, cluster_name=cluster, keys=["req-0", "req-40"], partition_id=1, transaction_id=7
        ) == {"req-0": True, "req-40": False}
    with engine.begin() as conn:  # a single key: a third number of rows
        assert record_idempotency_keys(
            conn, cluster_name=cluster, keys=["req-41"], partition_id=1, transaction_id=8
        ) == {"req-41": True}
    with engine.connect() as conn:
        found = find_idempotency_keys(conn, cluster_name=cluster, keys=[*first, "req-40", "req-41", "req-42"])
        other = find_idempotency_keys(conn, cluster_name="other-cluster", keys=first)
    assert found == {
        **{key: AppliedRequest(1, 7) for key in first},
        "req-40": AppliedRequest(2, 9),
        "req-41": AppliedRequest(1, 8),
    }
    assert other == {}
    # One key, as a hand-written apply records it: the first carrier, the same one again, another.
    carriers = [("req-50", 3, 1), ("req-50", 3, 1), ("req-50", 0, 2), ("req-0", 3, 1)]
    with engine.begin() as conn:
        one = [
            record_idempotency_key(conn, cluster_name=cluster, key=key, partition_id=pid, transaction_id=tid)
            for key, pid, tid in carriers
        ]
    assert one == [True, True, False, False]


def test_an_update_of_a_missing_row_is_an_error_not_a_skip(engine: Engine) -> None:
    Base.metadata.create_all(engine)
    callbacks = ChangeSetCallbacks(engine, cluster_name="test-cluster", registry=EntityRegistry([Account]))
    assert callbacks.get_client_high_water_mark(0) == -1
    with pytest.raises(ChangeSetApplyError, match="found no row"):
        callbacks.apply_transaction(change_set_txn(0, 10, None))
    assert callbacks.high_water_marks() == {0: -1}


def test_a_key_of_zero_is_stored_as_zero_in_an_auto_increment_key(engine: Engine) -> None:
    """The database holds the log's values: ``Account.account_id`` is AUTO_INCREMENT on MySQL and
    MariaDB, where an explicit 0 becomes the next generated value unless the session's sql_mode
    has NO_AUTO_VALUE_ON_ZERO (set by prepare_engine)."""
    Base.metadata.create_all(engine)
    callbacks = ChangeSetCallbacks(engine, cluster_name="test-cluster", registry=EntityRegistry([Account]))
    opened = [
        RowChange(Operation.INSERT, "account", {"account_id": key}, {"account_id": key, "balance": 10 + key})
        for key in (1, 0)  # 1 first: without the mode, 0 would quietly become 2
    ]
    callbacks.apply_transactions(
        [
            txn(0, tid, ChangeSet([change]).encode(), header=CHANGE_SET_HEADER)
            for tid, change in enumerate(opened)
        ]
    )
    callbacks.apply_transaction(change_set_txn(2, 5, None))  # an update of account 1
    with engine.connect() as conn:
        rows = conn.execute(sa.select(Account.account_id, Account.balance).order_by(Account.account_id)).all()
    assert [tuple(row) for row in rows] == [(0, 10), (1, 5)]
    assert callbacks.uncaught_count == 0 and callbacks.high_water_marks() == {0: 2}


class Tag(Base):
    __tablename__ = "tags"
    __waltz__ = WaltzEntity("tag")
    tag_id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    name: Mapped[str] = mapped_column(sa.String(5))


def test_a_value_too_long_for_its_column_fails_the_apply_on_a_lax_mariadb_server(mariadb_url: str) -> None:
    """A server without strict mode stores a value cut to fit its column, with a warning; the
    framework's sessions add STRICT_TRANS_TABLES, so the apply fails and nothing is stored."""
    engine = sa.create_engine(mariadb_url)

    @sa.event.listens_for(engine, "connect")
    def lax_server(dbapi_connection: Any, connection_record: Any) -> None:  # its sql_mode, as configured
        cursor = dbapi_connection.cursor()
        cursor.execute("SET SESSION sql_mode = ''")
        cursor.close()

    prepare_engine(engine)  # its hooks run after the server's mode is in place
    try:
        upgrade(engine)
        Base.metadata.create_all(engine)
        callbacks = ChangeSetCallbacks(engine, cluster_name="test-cluster", registry=EntityRegistry([Tag]))
        change = RowChange(Operation.INSERT, "tag", {"tag_id": 1}, {"tag_id": 1, "name": "overlong"})
        with pytest.raises(sa.exc.DataError, match="Data too long"):
            callbacks.apply_transaction(txn(0, 0, ChangeSet([change]).encode(), header=CHANGE_SET_HEADER))
        with engine.connect() as conn:
            assert conn.execute(sa.select(sa.func.count()).select_from(Tag)).scalar_one() == 0
            modes = conn.execute(text("SELECT @@SESSION.sql_mode")).scalar_one().split(",")
        assert {"STRICT_TRANS_TABLES", "NO_AUTO_VALUE_ON_ZERO"} <= set(modes)
        assert callbacks.high_water_marks() == {0: -1}
    finally:
        engine.dispose()


def test_an_operator_skip_passes_over_a_stuck_transaction_and_is_audited(engine: Engine, db_url: str) -> None:
    def poison(transaction: Transaction, session: Session, attempt: int) -> None:
        if transaction.transaction_id == 1:
            raise ValueError("cannot apply transaction 1")

    callbacks = Recorder(engine, poison)
    callbacks.apply_transaction(txn(0, 0))
    for _ in range(2):
        with pytest.raises(ValueError):
            callbacks.apply_transaction(txn(0, 1))
    assert callbacks.high_water_marks() == {0: 0}
    request_skip(
        engine,
        cluster_name="test-cluster",
        partition_id=0,
        transaction_id=1,
        reason="bad data, ticket 42",
        operator="ops",
    )
    callbacks.apply_transaction(txn(0, 1))
    callbacks.apply_transaction(txn(0, 2))
    assert callbacks.high_water_marks() == {0: 2}
    assert callbacks.skipped == [(0, 1)]
    assert item(engine) == 2  # 0 and 2 applied, 1 skipped
    with engine.connect() as conn:
        row = conn.execute(
            text(
                "SELECT reason, operator, skipped_at FROM waltz_skipped_transactions WHERE transaction_id = 1"
            )
        ).one()
    assert row[0] == "bad data, ticket 42" and row[1] == "ops" and row[2] is not None


GENESIS = SplitGenesis(epoch=1, count=2, previous_count=1, parent=0, barrier=40).encode()
#: A genesis this release does not read (a field no form 1 genesis has): still a genesis.
DAMAGED_GENESIS = json.dumps({**json.loads(GENESIS), "barrier": "forty"}).encode()
BARRIER = SplitBarrier(epoch=1, count=2, previous_count=1, parent=0).encode()


class SplitTakingRecorder(Recorder):
    """A Recorder whose ``apply`` is given split records, as the change-set callbacks' is."""

    applies_split_records = True


def test_a_hand_written_apply_is_never_given_a_split_record_and_the_mark_moves_past_it(
    engine: Engine, db_url: str
) -> None:
    """docs/design/splits.md "The SQL framework across a split": a barrier and a genesis change no
    row; an application's ``apply`` that reads its own data format never sees them."""
    callbacks = Recorder(engine)
    callbacks.apply_transaction(txn(0, 0))
    callbacks.apply_transaction(txn(0, 1, BARRIER, SPLIT_RECORD_HEADER))
    callbacks.apply_transactions([txn(0, 2), txn(0, 3, GENESIS, SPLIT_RECORD_HEADER), txn(0, 4)])
    assert callbacks.high_water_marks() == {0: 4}
    assert sorted(callbacks.attempts) == [(0, 0), (0, 2), (0, 4)]
    assert callbacks.applied == [(0, 0), (0, 2), (0, 4)]
    assert item(engine) == 3  # one per application transaction
    taking = SplitTakingRecorder(engine)
    taking.apply_transaction(txn(0, 5, BARRIER, SPLIT_RECORD_HEADER))
    assert taking.applied == [(0, 5)] and taking.high_water_marks() == {0: 5}


@pytest.mark.parametrize("data", [GENESIS, DAMAGED_GENESIS], ids=["genesis", "damaged genesis"])
def test_an_operator_skip_of_a_split_genesis_is_refused_and_the_genesis_applied_as_usual(
    engine: Engine, db_url: str, data: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    """docs/design/splits.md "The SQL framework across a split": `waltz db skip` refuses a genesis.
    The request names only a transaction ID; the instance that would act on it holds the record."""
    failing = [True]

    def stuck(transaction: Transaction, session: Session, attempt: int) -> None:
        if transaction.transaction_id == 1 and failing[0]:
            raise ValueError("cannot apply transaction 1")

    callbacks = SplitTakingRecorder(engine, stuck)
    callbacks.apply_transaction(txn(0, 0))
    with pytest.raises(ValueError):
        callbacks.apply_transaction(txn(0, 1, data, SPLIT_RECORD_HEADER))
    request_skip(
        engine, cluster_name="test-cluster", partition_id=0, transaction_id=1, reason="r", operator="ops"
    )
    with (
        caplog.at_level(logging.WARNING, logger="waltz.jdbc_style.callbacks"),
        pytest.raises(ValueError, match="cannot apply transaction 1"),  # applied, not skipped
    ):
        callbacks.apply_transaction(txn(0, 1, data, SPLIT_RECORD_HEADER))
    assert callbacks.high_water_marks() == {0: 0} and callbacks.skipped == []
    (refusal,) = [r.getMessage() for r in caplog.records if "is refused" in r.getMessage()]
    assert "the operator's skip of transaction 1 (waltz db skip) is refused: it is a split genesis" in refusal
    failing[0] = False
    callbacks.apply_transaction(txn(0, 1, data, SPLIT_RECORD_HEADER))
    assert callbacks.high_water_marks() == {0: 1} and callbacks.applied[-1] == (0, 1)
    with engine.connect() as conn:
        pending = conn.execute(
            text("SELECT skipped_at FROM waltz_skipped_transactions WHERE transaction_id = 1")
        ).scalar_one()
    assert pending is None  # the request stays pending: nothing was skipped


def test_an_operator_skip_of_a_split_barrier_passes_over_it(engine: Engine, db_url: str) -> None:
    """The design refuses a skip of a genesis only (docs/design/splits.md "The SQL framework across a
    split"); a barrier is skipped like any transaction."""

    def stuck(transaction: Transaction, session: Session, attempt: int) -> None:
        if transaction.transaction_id == 1:
            raise ValueError("cannot apply transaction 1")

    callbacks = SplitTakingRecorder(engine, stuck)
    callbacks.apply_transaction(txn(0, 0))
    with pytest.raises(ValueError):
        callbacks.apply_transaction(txn(0, 1, BARRIER, SPLIT_RECORD_HEADER))
    request_skip(
        engine, cluster_name="test-cluster", partition_id=0, transaction_id=1, reason="r", operator="ops"
    )
    callbacks.apply_transaction(txn(0, 1, BARRIER, SPLIT_RECORD_HEADER))
    assert callbacks.high_water_marks() == {0: 1} and callbacks.skipped == [(0, 1)]


def skip_requests(engine: Engine) -> dict[int, bool]:
    """Each skip request's transaction ID: whether it is still pending."""
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT transaction_id, skipped_at FROM waltz_skipped_transactions"))
        return {int(tid): skipped_at is None for tid, skipped_at in rows}


def test_an_operator_skip_passes_over_only_the_transaction_whose_own_apply_failed(
    engine: Engine, db_url: str
) -> None:
    """docs/design/sql.md "Skipping a transaction": a transaction that applies after the request
    (the code was fixed meanwhile) is applied and the request stays pending, also when the fixed
    release is handed it in one group with a later transaction that fails, and when the request
    was recorded before any apply of it failed."""

    def old_bug(transaction: Transaction, session: Session, attempt: int) -> None:
        if transaction.transaction_id in (1, 2):
            raise ValueError(f"the old release cannot apply transaction {transaction.transaction_id}")

    def fixed_bug(transaction: Transaction, session: Session, attempt: int) -> None:
        if transaction.transaction_id == 2:  # the fix handles 1; 2 still fails
            raise ValueError("the fixed release cannot apply transaction 2")

    old = Recorder(engine, old_bug)
    old.apply_transaction(txn(0, 0))
    with pytest.raises(ValueError, match="old release cannot apply transaction 1"):
        old.apply_transaction(txn(0, 1))
    request_skip(
        engine, cluster_name="test-cluster", partition_id=0, transaction_id=1, reason="r", operator="ops"
    )
    for fixed in (Recorder(engine, fixed_bug), Recorder(engine, fixed_bug)):
        # The second instance has seen 1 fail nowhere: its group fails at once on 2 (1 applied).
        with pytest.raises(TransactionApplyError) as caught:
            fixed.apply_transactions([txn(0, 1), txn(0, 2)])
        assert caught.value.transaction_id == 2
        assert fixed.high_water_marks() == {0: 1} and fixed.skipped == []
    assert item(engine) == 2  # 0 and 1 applied, 1 once
    assert skip_requests(engine) == {1: True}  # still pending: nothing was skipped
    # 2's own apply failed in this instance: a request for it is honoured at its next attempt.
    request_skip(
        engine, cluster_name="test-cluster", partition_id=0, transaction_id=2, reason="r", operator="ops"
    )
    fixed.apply_transactions([txn(0, 2), txn(0, 3)])
    assert fixed.high_water_marks() == {0: 3} and fixed.skipped == [(0, 2)]
    assert item(engine) == 3 and skip_requests(engine) == {1: True, 2: False}


class OldRelease(DeclarativeBase):
    pass


class OldWidget(OldRelease):
    """The widget model of an instance still on the old release: schema version 1."""

    __tablename__ = "widgets"
    __waltz__ = WaltzEntity("widget")
    widget_id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    n: Mapped[int]


class NewRelease(DeclarativeBase):
    pass


class NewWidget(NewRelease):
    """The next release's widget: version 2, with a label; it also declares the gadget."""

    __tablename__ = "widgets"
    __waltz__ = WaltzEntity("widget", schema_version=2, upcasters=[AddAttribute(1, "label", "-")])
    widget_id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    n: Mapped[int]
    label: Mapped[str] = mapped_column(sa.String(20), server_default="-")


class NewGadget(NewRelease):
    __tablename__ = "gadgets"
    __waltz__ = WaltzEntity("gadget")
    gadget_id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)


#: What a new release writes that the old one cannot apply: its error, and the change.
NEWER_CHANGES = {
    "newer schema version": (
        SchemaVersionAheadError,
        RowChange(Operation.UPDATE, "widget", {"widget_id": 1}, {"widget_id": 1, "n": 2, "label": "x"}, 2),
    ),
    "undeclared entity": (
        EntityNotDeclaredError,
        RowChange(Operation.INSERT, "gadget", {"gadget_id": 7}, {"gadget_id": 7}),
    ),
}


@pytest.mark.parametrize("newer", sorted(NEWER_CHANGES))
def test_an_operator_skip_of_a_transaction_that_waits_for_an_upgrade_is_refused(
    engine: Engine, db_url: str, newer: str, caplog: pytest.LogCaptureFixture
) -> None:
    """docs/design/sql.md "Schema versions and upcasting" (newer than the code) and "Skipping a
    transaction": a transaction an instance cannot apply before it runs newer code (an
    ApplyPausedError) is never skipped, whatever an operator requests: an old instance of a
    rolling deploy would otherwise drop the new release's change for good. It refuses the
    request, logs why (once) and keeps it pending; the new release applies the transaction."""
    error, change = NEWER_CHANGES[newer]
    NewRelease.metadata.create_all(engine)  # the migration, made before the deploy
    old = ChangeSetCallbacks(engine, cluster_name="test-cluster", registry=EntityRegistry([OldWidget]))
    insert = RowChange(Operation.INSERT, "widget", {"widget_id": 1}, {"widget_id": 1, "n": 1})
    old.apply_transaction(txn(0, 0, ChangeSet([insert]).encode(), CHANGE_SET_HEADER))
    first = txn(0, 1, ChangeSet([change]).encode(), CHANGE_SET_HEADER)
    another = RowChange(Operation.INSERT, "widget", {"widget_id": 2}, {"widget_id": 2, "n": 3})
    second = txn(0, 2, ChangeSet([another]).encode(), CHANGE_SET_HEADER)
    with pytest.raises(error):
        old.apply_transaction(first)
    request_skip(
        engine, cluster_name="test-cluster", partition_id=0, transaction_id=1, reason="r", operator="ops"
    )
    with caplog.at_level(logging.WARNING, logger="waltz.jdbc_style.callbacks"):
        with pytest.raises(error):  # the client's retry: it still waits
            old.apply_transaction(first)
        with pytest.raises(TransactionApplyError) as caught:  # and in a group
            old.apply_transactions([first, second])
    assert caught.value.transaction_id == 1 and isinstance(caught.value.cause, error)
    assert old.high_water_marks() == {0: 0} and old.skipped == []
    assert skip_requests(engine) == {1: True}
    refusals = [r.getMessage() for r in caplog.records if "is refused" in r.getMessage()]
    assert len(refusals) == 1, refusals  # once: the client's retries every 30 s say no more
    assert (
        "the operator's skip of transaction 1 (waltz db skip) is refused: its apply waits for this "
        f"instance's upgrade ({error.__name__}: " in refusals[0]
    ), refusals[0]
    assert "the request stays pending" in refusals[0]
    new = ChangeSetCallbacks(
        engine, cluster_name="test-cluster", registry=EntityRegistry([NewWidget, NewGadget])
    )
    new.apply_transactions([first, second])
    assert new.high_water_marks() == {0: 2} and new.skipped == []
    assert skip_requests(engine) == {1: True}
    with engine.connect() as conn:
        widgets = conn.execute(sa.select(NewWidget.widget_id, NewWidget.n, NewWidget.label)).all()
        gadgets = conn.execute(sa.select(NewGadget.gadget_id)).scalars().all()
    if newer == "newer schema version":
        assert sorted(map(tuple, widgets)) == [(1, 2, "x"), (2, 3, "-")] and gadgets == []
    else:
        assert sorted(map(tuple, widgets)) == [(1, 1, "-"), (2, 3, "-")] and gadgets == [7]


#: The genesis of partition 1, a new child of partition 0 whose barrier is at 40: at 41.
CHILD_GENESIS = SplitGenesis(epoch=1, count=2, previous_count=1, parent=0, barrier=40).encode()


def test_a_new_child_s_genesis_waits_for_its_parent_s_mark_to_reach_the_barrier(
    engine: Engine, db_url: str
) -> None:
    """docs/design/splits.md "The SQL framework across a split": the genesis at B(p) + 1 is applied
    in the database transaction that reads the parent's mark, only once it is at least B(p); until
    then nothing changes (the child's mark stays, the apply is held). Then the child's mark goes
    from its floor (no row yet) to B(p) + 1, and its next transactions follow as usual."""
    callbacks = SplitTakingRecorder(engine)
    for tid in range(39):
        callbacks.apply_transaction(txn(0, tid))
    with pytest.raises(GenesisHeldError) as held:
        callbacks.apply_transaction(txn(1, 41, CHILD_GENESIS, SPLIT_RECORD_HEADER))
    assert (held.value.parent, held.value.barrier, held.value.parent_mark) == (0, 40, 38)
    assert callbacks.high_water_marks().get(1, -1) == -1 and (1, 41) not in callbacks.applied
    callbacks.apply_transactions([txn(0, 39), txn(0, 40, BARRIER, SPLIT_RECORD_HEADER)])
    callbacks.apply_transactions([txn(1, 41, CHILD_GENESIS, SPLIT_RECORD_HEADER), txn(1, 42), txn(1, 43)])
    assert callbacks.high_water_marks() == {0: 40, 1: 43}
    assert [a for a in callbacks.applied if a[0] == 1] == [(1, 41), (1, 42), (1, 43)]
    # Applied once: another instance's copy of the genesis (or this one's, again) passes.
    other = SplitTakingRecorder(engine)
    other.apply_transaction(txn(1, 41, CHILD_GENESIS, SPLIT_RECORD_HEADER))
    assert other.applied == [] and other.high_water_marks()[1] == 43


def test_a_genesis_whose_child_s_mark_is_neither_absent_nor_at_the_floor_is_a_gap(
    engine: Engine, db_url: str
) -> None:
    """A child's mark below the genesis is either its floor, B(p), or absent (-1): any other value
    means transactions are missing, as for any partition."""
    callbacks = SplitTakingRecorder(engine)
    for tid in range(41):
        callbacks.apply_transaction(txn(0, tid))
    with engine.begin() as conn:
        callbacks.marks.ensure(conn, 1)
        callbacks.marks.advance(conn, 1, -1, 30)
    with pytest.raises(HighWaterMarkGapError):
        callbacks.apply_transaction(txn(1, 41, CHILD_GENESIS, SPLIT_RECORD_HEADER))


def test_a_failure_retried_again_and_again_is_logged_with_its_traceback_once(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    """The client retries a failing apply with a backoff and logs each retry in a line; the
    callbacks log the failure's traceback once per (partition, transaction, error), not at every
    retry, and still keep and count each one."""
    if True:
        Base.metadata.create_all(engine)  # else the callbacks warn that its table is not there yet
        callbacks = ChangeSetCallbacks(
            engine, cluster_name="test-cluster", registry=EntityRegistry([Account])
        )
        caplog.set_level(logging.ERROR, logger="waltz.jdbc_style.changeset_callbacks")
        for _ in range(3):
            callbacks.uncaught_exception(0, 5, ValueError("no such entity"))
        callbacks.uncaught_exception(1, 5, ValueError("no such entity"))  # another partition
        callbacks.uncaught_exception(0, 5, ValueError("another error"))
        callbacks.uncaught_exception(0, 6, ValueError("another error"))  # the next transaction
        # The callbacks' records only: another logger's, such as SQLAlchemy's pool letting go of a
        # connection of an earlier test's database during this one, is not theirs.
        logged = [
            (r.getMessage(), r.exc_info is not None)
            for r in caplog.records
            if r.name == "waltz.jdbc_style.changeset_callbacks"
        ]
        assert len(logged) == 4 and all(with_traceback for _, with_traceback in logged), logged
        assert callbacks.uncaught_count == 6 and len(callbacks.uncaught) == 6


def test_an_undeclared_entity_pauses_the_partition_and_a_retired_one_is_passed_over(
    engine: Engine,
) -> None:
    """An application dropped a model (docs/design/sql.md "Retiring an entity"): a new instance meets its
    row changes in the log. Undeclared, the apply waits (ApplyPausedError: never skipped, nothing
    applied); retired, its changes are passed over and the rest of the change-set applies."""
    Base.metadata.create_all(engine)
    dropped = RowChange(Operation.INSERT, "note", {"note_id": 1}, {"note_id": 1, "text": "gone"})
    opened = RowChange(Operation.INSERT, "account", {"account_id": 1}, {"account_id": 1, "balance": 10})
    transaction = txn(0, 0, ChangeSet([dropped, opened]).encode(), header=CHANGE_SET_HEADER)
    undeclared = ChangeSetCallbacks(engine, cluster_name="test-cluster", registry=EntityRegistry([Account]))
    with pytest.raises(EntityNotDeclaredError, match=r"'note'.*retired=\['note'\]") as raised:
        undeclared.apply_transaction(transaction)
    assert isinstance(raised.value, ApplyPausedError)
    assert undeclared.get_client_high_water_mark(0) == -1
    undeclared.release_connections()
    retiring = ChangeSetCallbacks(
        engine, cluster_name="test-cluster", registry=EntityRegistry([Account], retired=["note"])
    )
    retiring.apply_transaction(transaction)
    assert retiring.get_client_high_water_mark(0) == 0
    retiring.release_connections()
    with engine.connect() as conn:
        assert conn.execute(sa.select(Account.balance)).scalar_one() == 10


def test_a_model_whose_table_lacks_its_columns_is_named_at_construction(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    """A release started before its application's migration: its model maps a column the table
    lacks. The callbacks say so when they are made, naming the table, the column and what to run,
    instead of a raw "no such column" at the first attempt; a table not created yet is left to
    the application, with a warning naming it."""

    class Later(DeclarativeBase):
        pass

    class Tagged(Later):
        __tablename__ = "accounts"  # Account's table, as the next release maps it
        __waltz__ = WaltzEntity("account")
        account_id: Mapped[int] = mapped_column(primary_key=True)
        balance: Mapped[int] = mapped_column(default=0)
        tier: Mapped[str] = mapped_column(default="basic")

    caplog.set_level(logging.WARNING, logger="waltz.jdbc_style.changeset_callbacks")
    ChangeSetCallbacks(engine, cluster_name="test-cluster", registry=EntityRegistry([Tagged]))  # no table yet
    (warning,) = [r.getMessage() for r in caplog.records if "are not in" in r.getMessage()]
    assert "tables accounts (Tagged) are not in" in warning and "alembic upgrade head" in warning, warning
    caplog.clear()
    Base.metadata.create_all(engine)  # the table as the release before made it
    with pytest.raises(
        ModelTablesBehindError, match=r"table accounts lacks \['tier'\], which Tagged maps"
    ) as raised:
        ChangeSetCallbacks(engine, cluster_name="test-cluster", registry=EntityRegistry([Tagged]))
    assert "alembic upgrade head" in str(raised.value)
    ChangeSetCallbacks(
        engine, cluster_name="test-cluster", registry=EntityRegistry([Tagged]), check_schema=False
    )
    ChangeSetCallbacks(engine, cluster_name="test-cluster", registry=EntityRegistry([Account]))
