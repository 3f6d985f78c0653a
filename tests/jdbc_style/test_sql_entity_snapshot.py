"""Entity transactions without a cluster: partition mapping, locks, and the exact lock check.

The heart of it (docs/design/sql.md "Entity transactions"): an attempt reads the partition's high-water mark
first and the entities after it in one REPEATABLE READ snapshot, so a transaction another instance
applies between the two reads is invisible to both: what the attempt read is exactly the state at
the mark it sends, and the server's lock check (the mark against the lock's last write) is exact.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, ForeignKey, String, event, inspect, select
from sqlalchemy.exc import MultipleResultsFound
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from waltz.client.context import TransactionBuilder
from waltz.client.transaction import Transaction
from waltz.errors import CrossPartitionError
from waltz.jdbc_style import (
    CHANGE_SET_HEADER,
    ChangeSet,
    ChangeSetApplyError,
    ChangeSetCallbacks,
    ChangeSetFormatError,
    EntityRegistry,
    EntityTransaction,
    EntityTransactionContext,
    MarkSnapshot,
    Operation,
    RowChange,
    WaltzEntity,
    create_framework_engine,
)
from waltz.jdbc_style.migrations_api import upgrade
from waltz.jdbc_style.prefetch import MAX_JOINED, MAX_SHAPES, MarkPrefetch
from waltz.jdbc_style.prefetch import _build as build_statement
from waltz.protocol.records import ReqId

NUM_PARTITIONS = 4


class Base(DeclarativeBase):
    pass


class Counter(Base):
    __tablename__ = "counters"
    __waltz__ = WaltzEntity("counter", partition_by=lambda key, n: key[0] % n)
    counter_id: Mapped[int] = mapped_column(primary_key=True)
    value: Mapped[int] = mapped_column(default=0)
    label: Mapped[str] = mapped_column(String(40), default="")


@pytest.fixture(params=["sqlite", "postgresql", "mariadb"])
def callbacks(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ChangeSetCallbacks]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'entities.db'}"
    else:
        url = str(request.getfixturevalue("postgres_url" if request.param == "postgresql" else "mariadb_url"))
    engine = create_framework_engine(url)
    upgrade(engine)
    Base.metadata.create_all(engine)
    try:
        yield ChangeSetCallbacks(engine, cluster_name="entities", registry=EntityRegistry.from_base(Base))
    finally:
        engine.dispose()


class Increment(EntityTransactionContext):
    """Increments (or inserts at 1) the declared counter and, given ``also``, a counter of the
    same partition that it does not declare (so it is read by key, not with the mark)."""

    def __init__(
        self,
        callbacks: ChangeSetCallbacks,
        counter_id: int,
        interleave: ChangeSetCallbacks | None = None,
        also: int | None = None,
    ):
        super().__init__(callbacks, (Counter, counter_id))
        self.counter_id = counter_id
        self.interleave = interleave
        self.also = also
        self.seen: list[int | None] = []

    def run(self, tx: EntityTransaction) -> bool:
        for counter_id in (self.counter_id, self.also):
            if counter_id is None:
                continue
            counter = tx.get(Counter, counter_id)
            self.seen.append(None if counter is None else counter.value)
            if counter is None:
                tx.insert(Counter, counter_id=counter_id, value=1)
            else:
                tx.update(counter, value=counter.value + 1)
        return True

    def _after_mark_read(self, snapshot: MarkSnapshot) -> None:
        if self.interleave is not None:
            # Another instance applies the next transaction of this partition, which writes the
            # counter, between this attempt's mark read and its entity read.
            other, self.interleave = self.interleave, None
            pid = snapshot.partition_id
            mark = other.get_client_high_water_mark(pid)
            change = Increment(other, self.counter_id, also=self.also)
            change.partition_id(NUM_PARTITIONS)
            builder = TransactionBuilder(mark)
            assert change.execute(builder)
            other.apply_transaction(_committed(pid, mark + 1, builder))


def _read(engine: Engine, counter_id: int) -> int | None:
    with engine.connect() as conn:
        return conn.execute(select(Counter.value).where(Counter.counter_id == counter_id)).scalar()


def _committed(partition_id: int, transaction_id: int, builder: TransactionBuilder) -> Transaction:
    payload = builder.build()
    return Transaction(
        partition_id,
        transaction_id,
        ReqId(9, 1, partition_id, transaction_id),
        payload.header,
        None,
        payload.data,
    )


def _build(context: EntityTransactionContext) -> tuple[int, TransactionBuilder, bool]:
    pid = context.partition_id(NUM_PARTITIONS)
    builder = TransactionBuilder(context.callbacks.get_client_high_water_mark(pid))
    return pid, builder, context.execute(builder)


def test_an_entity_transaction_builds_a_change_set_with_locks_and_the_snapshot_mark(
    callbacks: ChangeSetCallbacks,
) -> None:
    pid, builder, ok = _build(Increment(callbacks, 5))
    assert ok and pid == 5 % NUM_PARTITIONS
    payload = builder.build()
    assert payload.header == CHANGE_SET_HEADER
    assert payload.client_high_water_mark == -1
    lock = callbacks.registry.info(Counter).lock((5,))
    assert payload.write_locks == (lock.lock_hash,) and payload.read_locks == ()
    change_set = ChangeSet.decode(payload.data)
    [change] = change_set.changes
    assert change.operation is Operation.INSERT
    assert dict(change.values) == {"counter_id": 5, "value": 1, "label": ""}  # scalar default filled in
    callbacks.apply_transaction(_committed(pid, 0, builder))
    assert _read(callbacks.engine, 5) == 1

    # The next attempt reads the row and updates the whole row.
    pid, builder, ok = _build(Increment(callbacks, 5))
    payload = builder.build()
    assert payload.client_high_water_mark == 0
    [change] = ChangeSet.decode(payload.data).changes
    assert change.operation is Operation.UPDATE and dict(change.values) == {
        "counter_id": 5,
        "value": 2,
        "label": "",
    }
    callbacks.apply_transaction(_committed(pid, 1, builder))
    assert _read(callbacks.engine, 5) == 2


@pytest.mark.parametrize("prefetch", [True, False], ids=["read-with-the-mark", "read-after-the-mark"])
def test_a_transaction_applied_between_the_mark_read_and_the_entity_read_is_invisible_to_both(
    callbacks: ChangeSetCallbacks, prefetch: bool
) -> None:
    other = ChangeSetCallbacks(callbacks.engine, cluster_name="entities", registry=callbacks.registry)
    pid, builder, _ = _build(Increment(callbacks, 6, also=10))
    callbacks.apply_transaction(_committed(pid, 0, builder))  # counters 6 and 10 = 1 at mark 0

    # Counter 6 is declared (prefetch: read with the mark, else read after it); counter 10 is
    # not, so it is read by key after the interleaved apply in both variants.
    racing = Increment(callbacks, 6, interleave=other, also=10)
    racing.prefetch = prefetch
    pid, builder, ok = _build(racing)
    assert ok
    # Another instance applied transaction 1 (counters 6 and 10 = 2) during the attempt...
    assert other.high_water_marks()[pid] == 1
    assert (_read(callbacks.engine, 6), _read(callbacks.engine, 10)) == (2, 2)
    # ...yet the attempt saw the counters and the mark of one moment: 1 and 1 at mark 0. Sent
    # with mark 0, the server refuses it (transaction 1 wrote the locks after 0): no lost update.
    assert racing.seen == [1, 1]
    assert builder.build().client_high_water_mark == 0


def test_entities_of_two_partitions_are_refused(callbacks: ChangeSetCallbacks) -> None:
    class Transfer(EntityTransactionContext):
        def run(self, tx: EntityTransaction) -> bool:
            return True

    with pytest.raises(CrossPartitionError, match="spans 2 partitions"):
        Transfer(callbacks, (Counter, 1), (Counter, 2)).partition_id(NUM_PARTITIONS)
    assert Transfer(callbacks, (Counter, 1), (Counter, 1 + NUM_PARTITIONS)).partition_id(NUM_PARTITIONS) == 1

    class ReadsElsewhere(EntityTransactionContext):
        def run(self, tx: EntityTransaction) -> bool:
            tx.get(Counter, 2)
            return True

    context = ReadsElsewhere(callbacks, (Counter, 1))
    with pytest.raises(CrossPartitionError, match="belongs to partition 2"):
        _build(context)


class InsertInstance(EntityTransactionContext):
    """Inserts as a SQLAlchemy user would: ``tx.insert(Counter(...))``."""

    def __init__(self, callbacks: ChangeSetCallbacks, counter_id: int, **extra: int) -> None:
        super().__init__(callbacks, (Counter, counter_id))
        self.counter_id = counter_id
        self.extra = extra

    def run(self, tx: EntityTransaction) -> bool:
        tx.insert(Counter(counter_id=self.counter_id, value=7), **self.extra)
        return True


def test_an_instance_can_be_inserted_as_with_a_session(callbacks: ChangeSetCallbacks) -> None:
    pid, builder, ok = _build(InsertInstance(callbacks, 9))
    assert ok
    [change] = ChangeSet.decode(builder.build().data).changes
    assert change.operation is Operation.INSERT
    assert dict(change.values) == {"counter_id": 9, "value": 7, "label": ""}  # unset: the default
    callbacks.apply_transaction(_committed(pid, 0, builder))
    assert _read(callbacks.engine, 9) == 7


def test_an_instance_with_attribute_values_as_well_is_refused_with_how_to_call_it(
    callbacks: ChangeSetCallbacks,
) -> None:
    context = InsertInstance(callbacks, 9, value=8)
    context.partition_id(NUM_PARTITIONS)
    with pytest.raises(ValueError, match=r"tx.insert\(Counter\(...\)\) or tx.insert\(Counter, \*\*values\)"):
        context.execute(TransactionBuilder(-1))


def _close_other_connections(engine: Engine) -> int:
    """Close, server side, every other connection to the engine's database (as a restart would)."""
    with engine.connect() as conn:
        if engine.dialect.name == "postgresql":
            closed = conn.exec_driver_sql(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).scalar()
            return int(closed or 0)
        ids = [
            int(row[0])
            for row in conn.exec_driver_sql(
                "SELECT id FROM information_schema.processlist "
                "WHERE db = database() AND id <> connection_id()"
            )
        ]
        for connection_id in ids:
            conn.exec_driver_sql(f"KILL {connection_id}")
        return len(ids)


def _other_connections_gone(engine: Engine, timeout: float) -> bool:
    """Whether, within ``timeout`` seconds, no other connection to the engine's database is left
    (counted, not closed)."""
    if engine.dialect.name == "postgresql":
        query = (
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
    else:
        query = (
            "SELECT count(*) FROM information_schema.processlist "
            "WHERE db = database() AND id <> connection_id()"
        )
    deadline = time.monotonic() + timeout
    for _ in range(int(timeout / 0.05) + 1):
        with engine.connect() as conn:
            if not conn.exec_driver_sql(query).scalar():
                return True
        if time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    return False


def test_kept_connections_closed_by_the_server_are_replaced_without_an_error(
    callbacks: ChangeSetCallbacks,
) -> None:
    """Snapshots, mark reads and applies reuse connections kept out of the pool (no pre-ping):
    one the server closed fails its first statement, and the read or apply is retried on a new
    connection instead of failing the attempt."""
    if callbacks.engine.dialect.name == "sqlite":
        pytest.skip("SQLite takes a pooled connection for each use; nothing is kept")
    pid, builder, _ = _build(Increment(callbacks, 9))
    callbacks.apply_transaction(_committed(pid, 0, builder))
    pid, builder, _ = _build(Increment(callbacks, 9))  # a reader and an applier are kept now
    # Close the engine's pooled connections too, so that only what the callbacks keep remains.
    callbacks.engine.dispose()
    assert _close_other_connections(callbacks.engine) >= 2
    callbacks.apply_transaction(_committed(pid, 1, builder))  # on a replaced applier
    assert _read(callbacks.engine, 9) == 2
    assert _close_other_connections(callbacks.engine) >= 1
    racing = Increment(callbacks, 9)
    pid, builder, ok = _build(racing)  # the snapshot opens on a replaced reader
    assert ok and racing.seen == [2] and builder.build().client_high_water_mark == 1


def test_a_snapshot_s_begin_goes_with_its_first_read_and_its_connection_comes_back_whole(
    callbacks: ChangeSetCallbacks,
) -> None:
    """On PostgreSQL the snapshot's ``BEGIN`` goes in one pipeline with the mark's statement: the
    driver runs in autocommit while the snapshot is open, inside a REPEATABLE READ transaction that
    the snapshot's end rolls back; the connection is then back under the driver's own transaction
    control, and every connection the callbacks give back to the pool is out of autocommit."""
    if callbacks.engine.dialect.name != "postgresql":
        pytest.skip("only psycopg has pipelines")
    from psycopg import pq  # PostgreSQL's driver: only this case needs it

    given_back: list[bool] = []

    @event.listens_for(callbacks.engine, "checkin")
    def checkin(dbapi_connection: Any, record: object) -> None:
        given_back.append(bool(dbapi_connection.autocommit))

    pid, builder, _ = _build(Increment(callbacks, 11))
    callbacks.apply_transaction(_committed(pid, 0, builder))
    info = callbacks.registry.info(Counter)
    with callbacks.snapshot(pid, entities=[(info, (11,))]) as snapshot:
        driver: Any = snapshot.connection.connection.dbapi_connection
        assert driver.autocommit
        isolation = snapshot.connection.exec_driver_sql("SHOW transaction_isolation").scalar()
        assert isolation == "repeatable read"
        assert snapshot.high_water_mark == 0 and snapshot.prefetched[(info, (11,))][:2] == (11, 1)
    assert not driver.autocommit and driver.pgconn.transaction_status == pq.TransactionStatus.IDLE
    pid, builder, ok = _build(Increment(callbacks, 11))
    assert ok and builder.build().client_high_water_mark == 0
    callbacks.release_connections()
    assert given_back and not any(given_back)


def test_release_connections_closes_what_the_callbacks_keep(callbacks: ChangeSetCallbacks) -> None:
    if callbacks.engine.dialect.name == "sqlite":
        pytest.skip("SQLite takes a pooled connection for each use; nothing is kept")
    pid, builder, _ = _build(Increment(callbacks, 10))
    callbacks.apply_transaction(_committed(pid, 0, builder))
    callbacks.engine.dispose()  # the pool's idle connections: only the kept ones remain open
    assert _close_other_connections(callbacks.engine) == 2  # one reader, one applier
    _build(Increment(callbacks, 10))
    callbacks.apply_transaction(_committed(pid, 1, _build(Increment(callbacks, 10))[1]))
    callbacks.release_connections()
    callbacks.engine.dispose()
    # A backend terminated above may still be listed while it exits (a loaded machine): wait,
    # bounded, for none of this database's other connections to be left.
    assert _other_connections_gone(callbacks.engine, 10.0), "a connection the callbacks kept is still open"
    assert _read(callbacks.engine, 10) == 2  # and the callbacks still work
    _build(Increment(callbacks, 10))


class Renamed(Base):
    """Attribute names that differ from the column names."""

    __tablename__ = "renamed"
    __waltz__ = WaltzEntity("renamed", partition_by=lambda key, n: key[0] % n)
    renamed_id: Mapped[int] = mapped_column("id", primary_key=True)
    amount: Mapped[int] = mapped_column("amount_cents", default=0)


class Vehicle(Base):
    __tablename__ = "vehicles"
    __mapper_args__ = {"polymorphic_on": "kind", "polymorphic_identity": "vehicle"}  # noqa: RUF012
    __waltz__ = WaltzEntity("vehicle", partition_by=lambda key, n: key[0] % n)
    vehicle_id: Mapped[int] = mapped_column(primary_key=True)
    kind: Mapped[str] = mapped_column(String(20))


class Truck(Vehicle):
    """Joined-table inheritance: its rows span two tables (read through the ORM)."""

    __tablename__ = "trucks"
    __mapper_args__ = {"polymorphic_identity": "truck"}  # noqa: RUF012
    __waltz__ = WaltzEntity("truck", partition_by=lambda key, n: key[0] % n)
    vehicle_id: Mapped[int] = mapped_column(ForeignKey("vehicles.vehicle_id"), primary_key=True)
    payload_kg: Mapped[int] = mapped_column(default=0)


class ReadBoth(EntityTransactionContext):
    def __init__(self, callbacks: ChangeSetCallbacks) -> None:
        super().__init__(callbacks, (Renamed, 4), (Truck, 8))
        self.read: list[Any] = []

    def run(self, tx: EntityTransaction) -> bool:
        self.read = [tx.get(Renamed, 4), tx.get(Truck, 8), tx.get(Renamed, 12)]
        renamed = self.read[0]
        tx.update(renamed, amount=renamed.amount + 1)
        return True


def test_entities_are_read_as_unattached_instances_with_committed_values(
    callbacks: ChangeSetCallbacks,
) -> None:
    """Columns named unlike their attributes, and a model over two tables, read as the ORM would."""
    callbacks.registry.register(Renamed)
    callbacks.registry.register(Truck)
    with Session(callbacks.engine) as session:
        session.add_all([Renamed(renamed_id=4, amount=250), Truck(vehicle_id=8, payload_kg=900)])
        session.commit()
    context = ReadBoth(callbacks)
    _, builder, ok = _build(context)
    assert ok
    renamed, truck, missing = context.read
    assert (renamed.renamed_id, truck.vehicle_id, truck.kind, truck.payload_kg, missing) == (
        4,
        8,
        "truck",
        900,
        None,
    )
    for entity in (renamed, truck):
        state = inspect(entity)
        assert state.session is None and not state.pending
    assert inspect(truck).detached  # loaded by the ORM, then expunged
    [change] = ChangeSet.decode(builder.build().data).changes
    assert change.operation is Operation.UPDATE
    assert dict(change.values) == {"renamed_id": 4, "amount": 251}
    pid = context.chosen_partition
    callbacks.apply_transaction(_committed(pid, callbacks.get_client_high_water_mark(pid) + 1, builder))
    with callbacks.engine.connect() as conn:  # applied by attribute name to its column
        assert conn.execute(select(Renamed.amount).where(Renamed.renamed_id == 4)).scalar() == 251


class InsertRenamed(EntityTransactionContext):
    def __init__(self, callbacks: ChangeSetCallbacks, renamed_id: int, amount: int) -> None:
        super().__init__(callbacks, (Renamed, renamed_id))
        self.renamed_id, self.amount = renamed_id, amount

    def run(self, tx: EntityTransaction) -> bool:
        tx.insert(Renamed, renamed_id=self.renamed_id, amount=self.amount)
        return True


def test_inserts_are_applied_by_attribute_name_to_renamed_columns_alone_and_in_a_group(
    callbacks: ChangeSetCallbacks,
) -> None:
    """An insert's values are keyed by attribute name; each must land in its column (``id``,
    ``amount_cents``), not be dropped for the column's default, applied alone or in a group."""
    callbacks.registry.register(Renamed)
    pid, builder, ok = _build(InsertRenamed(callbacks, 16, 250))
    assert ok and pid == 0
    callbacks.apply_transaction(_committed(pid, 0, builder))  # one transaction
    group = []
    for transaction_id, (renamed_id, amount) in enumerate([(20, 260), (24, 270)], start=1):
        builder = TransactionBuilder(transaction_id - 1)
        context = InsertRenamed(callbacks, renamed_id, amount)
        assert context.partition_id(NUM_PARTITIONS) == 0 and context.execute(builder)
        group.append(_committed(0, transaction_id, builder))
    callbacks.apply_transactions(group)  # staged: one executemany
    with callbacks.engine.connect() as conn:
        rows = conn.execute(select(Renamed.renamed_id, Renamed.amount).order_by(Renamed.renamed_id)).all()
    assert [tuple(row) for row in rows] == [(16, 250), (20, 260), (24, 270)]
    assert callbacks.get_client_high_water_mark(0) == 2


class ReadMany(EntityTransactionContext):
    """Declares the first of ``keys`` and reads them all with ``tx.get_many``."""

    def __init__(
        self,
        callbacks: ChangeSetCallbacks,
        keys: list[Any],
        model: type[Any] = Counter,
        prefetch: bool = True,
    ) -> None:
        super().__init__(callbacks, (model, keys[0]))
        self.model, self.keys, self.prefetch = model, keys, prefetch
        self.read: dict[tuple[Any, ...], Any] = {}

    def run(self, tx: EntityTransaction) -> bool:
        self.read = tx.get_many(self.model, self.keys)
        return False


def test_get_many_reads_several_entities_and_locks_each(callbacks: ChangeSetCallbacks) -> None:
    for counter_id in (1, 5):
        pid, builder, _ = _build(Increment(callbacks, counter_id))
        callbacks.apply_transaction(_committed(pid, callbacks.get_client_high_water_mark(pid) + 1, builder))
    context = ReadMany(callbacks, [5, 9, 1])
    _build(context)
    assert list(context.read) == [(5,), (9,), (1,)]  # in the order asked
    assert {key: None if c is None else c.value for key, c in context.read.items()} == {
        (5,): 1,
        (9,): None,
        (1,): 1,
    }
    assert context.last_transaction is not None
    info = callbacks.registry.info(Counter)
    assert set(context.last_transaction.read_locks) == {info.lock((k,)) for k in (1, 5, 9)}
    with pytest.raises(CrossPartitionError):
        _build(ReadMany(callbacks, [5, 6]))


def test_get_many_takes_the_entities_read_with_the_mark_and_reads_only_the_others(
    callbacks: ChangeSetCallbacks,
) -> None:
    for counter_id in (1, 5):
        pid, builder, _ = _build(Increment(callbacks, counter_id))
        callbacks.apply_transaction(_committed(pid, callbacks.get_client_high_water_mark(pid) + 1, builder))
    context = ReadMany(callbacks, [5, 9, 1])  # counter 5 is declared: read with the mark
    context.partition_id(NUM_PARTITIONS)
    sent: list[Any] = []
    with _selects(callbacks.engine, sent) as seen:
        context.execute(TransactionBuilder(-1))
    assert list(context.read) == [(5,), (9,), (1,)]  # in the order asked
    assert {key: None if c is None else c.value for key, c in context.read.items()} == {
        (5,): 1,
        (9,): None,
        (1,): 1,
    }
    assert len(seen) == 2  # the mark's statement (with counter 5), then one for counters 9 and 1
    assert sorted(sent[1].values() if isinstance(sent[1], dict) else sent[1]) == [1, 9]
    assert context.last_transaction is not None
    info = callbacks.registry.info(Counter)
    assert set(context.last_transaction.read_locks) == {info.lock((k,)) for k in (1, 5, 9)}


class Slot(Base):
    """Keyed by two attributes."""

    __tablename__ = "slots"
    __waltz__ = WaltzEntity("slot", partition_by=lambda key, n: key[0] % n)
    owner_id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(20), primary_key=True)
    value: Mapped[int] = mapped_column(default=0)


def test_get_many_reads_entities_of_a_key_of_several_attributes_in_one_statement(
    callbacks: ChangeSetCallbacks,
) -> None:
    with callbacks.engine.begin() as conn:
        conn.execute(
            Slot.__table__.insert(),
            [
                {"owner_id": 1, "name": "a", "value": 10},
                {"owner_id": 1, "name": "b", "value": 20},
                {"owner_id": 5, "name": "a", "value": 30},
            ],
        )
    context = ReadMany(callbacks, [(1, "a"), (5, "z"), (1, "b"), (5, "a")], Slot, prefetch=False)
    with _selects(callbacks.engine) as seen:
        _build(context)
    assert list(context.read) == [(1, "a"), (5, "z"), (1, "b"), (5, "a")]  # in the order asked
    assert {key: None if s is None else s.value for key, s in context.read.items()} == {
        (1, "a"): 10,
        (5, "z"): None,
        (1, "b"): 20,
        (5, "a"): 30,
    }
    assert len([s for s in seen if "slots" in s]) == 1  # one statement for the four
    assert context.last_transaction is not None
    info = callbacks.registry.info(Slot)
    assert set(context.last_transaction.read_locks) == {info.lock(k) for k in context.read}


def test_the_mark_statements_kept_are_bounded_however_many_shapes_contexts_read(
    callbacks: ChangeSetCallbacks,
) -> None:
    """Contexts of ever new shapes (batches of varying size and mix) reuse the statements of the
    shapes read last and do not keep one per shape ever read."""
    pid, builder, _ = _build(Increment(callbacks, 4))  # partition 0 gets its mark row
    callbacks.apply_transaction(_committed(pid, callbacks.get_client_high_water_mark(pid) + 1, builder))
    counter, slot = callbacks.registry.info(Counter), callbacks.registry.info(Slot)
    reader = MarkPrefetch("entities")
    build_statement.cache_clear()
    with callbacks.engine.connect() as conn:
        for bits in range(MAX_SHAPES + 44):  # as many shapes: 9 entities, Counter or Slot at each place
            entities = [(slot, (i, "a")) if bits >> i & 1 else (counter, (i,)) for i in range(9)]
            mark, rows = reader.read(conn, 0, entities)
            assert mark == 0 and len(rows) == 9
            assert [row is None for row in rows.values()] == [i != 4 or bool(bits & 16) for i in range(9)]
    assert build_statement.cache_info().currsize == MAX_SHAPES
    assert build_statement.cache_info().misses == MAX_SHAPES + 44


def test_the_callbacks_keep_at_most_half_the_pool_idle(callbacks: ChangeSetCallbacks) -> None:
    if callbacks.engine.dialect.name == "sqlite":
        pytest.skip("SQLite takes a pooled connection for each use; nothing is kept")
    assert callbacks.engine.pool.size() == 10  # type: ignore[attr-defined]  # the framework's default
    with contextlib.ExitStack() as stack:
        snapshots = [stack.enter_context(callbacks.snapshot(0)) for _ in range(7)]
        assert len({id(s.connection) for s in snapshots}) == 7
    callbacks.engine.dispose()  # the pool's idle connections: only the kept ones remain open
    assert _close_other_connections(callbacks.engine) == 5


class Tagged(Base):
    """Keyed (for Waltz) by a column that is not unique: a misdeclared entity."""

    __tablename__ = "tagged"
    __waltz__ = WaltzEntity("tagged", key=("tag",), partition_by=lambda key, n: 0)
    row_id: Mapped[int] = mapped_column(primary_key=True)
    tag: Mapped[str] = mapped_column(String(20))
    amount: Mapped[int] = mapped_column(default=0)


def _forged(callbacks: ChangeSetCallbacks, changes: list[RowChange]) -> Transaction:
    """A committed change-set transaction on partition 0 right after the database's mark."""
    mark = callbacks.get_client_high_water_mark(0)
    return Transaction(
        0, mark + 1, ReqId(9, 1, 0, mark + 1), CHANGE_SET_HEADER, None, ChangeSet(changes).encode()
    )


@pytest.mark.security
@pytest.mark.parametrize(
    ("change", "message"),
    [
        (RowChange(Operation.DELETE, "counter", {}), r"key attributes \[\], but the entity's key is"),
        (
            RowChange(Operation.UPDATE, "counter", {"label": ""}, {"value": 0}),
            r"key attributes \['label'\]",
        ),
        (
            RowChange(Operation.UPDATE, "counter", {"counter_id": 4}, {"counter_id": 4, "balance": 1}),
            r"sets \['balance'\], which are not column attributes",
        ),
        (
            RowChange(Operation.UPDATE, "counter", {"counter_id": 4}, {"counter_id": 8, "value": 1}),
            r"changes its key attributes \['counter_id'\]",
        ),
        (
            # The database would pick the row's key (autoincrement): another row than the log's.
            RowChange(Operation.INSERT, "counter", {"counter_id": 9}, {"value": 1, "label": ""}),
            r"insert of counter \{'counter_id': 9\} does not carry its key attributes \['counter_id'\]",
        ),
    ],
)
def test_a_change_set_that_does_not_fit_its_model_is_refused_and_changes_nothing(
    callbacks: ChangeSetCallbacks, change: RowChange, message: str
) -> None:
    for counter_id in (4, 8):
        pid, builder, _ = _build(Increment(callbacks, counter_id))
        callbacks.apply_transaction(_committed(pid, callbacks.get_client_high_water_mark(pid) + 1, builder))
    mark = callbacks.get_client_high_water_mark(0)
    with pytest.raises(ChangeSetFormatError, match=message):
        callbacks.apply_transaction(_forged(callbacks, [change]))
    assert (_read(callbacks.engine, 4), _read(callbacks.engine, 8)) == (1, 1)  # no row deleted or changed
    with callbacks.engine.connect() as conn:  # and none added
        assert conn.execute(select(Counter.counter_id).order_by(Counter.counter_id)).scalars().all() == [4, 8]
    assert callbacks.get_client_high_water_mark(0) == mark


@pytest.mark.security
def test_an_update_that_finds_several_rows_by_the_declared_key_is_refused(
    callbacks: ChangeSetCallbacks,
) -> None:
    callbacks.registry.register(Tagged)
    with Session(callbacks.engine) as session:
        session.add_all([Tagged(row_id=1, tag="same", amount=1), Tagged(row_id=2, tag="same", amount=2)])
        session.commit()
    change = RowChange(Operation.UPDATE, "tagged", {"tag": "same"}, {"tag": "same", "amount": 0})
    with pytest.raises(ChangeSetApplyError, match="found 2 rows, not one"):
        callbacks.apply_transaction(_forged(callbacks, [change]))
    with callbacks.engine.connect() as conn:
        amounts = conn.execute(select(Tagged.amount).order_by(Tagged.row_id)).scalars().all()
    assert amounts == [1, 2]
    # Keyed by the primary key instead (it identifies one row too): applied.
    by_row = RowChange(Operation.UPDATE, "tagged", {"row_id": 2}, {"row_id": 2, "tag": "same", "amount": 5})
    callbacks.apply_transaction(_forged(callbacks, [by_row]))
    with callbacks.engine.connect() as conn:
        amounts = conn.execute(select(Tagged.amount).order_by(Tagged.row_id)).scalars().all()
    assert amounts == [1, 5]


class Animal(Base):
    """Single-table inheritance: one table, a type column, a class per type."""

    __tablename__ = "animals"
    __mapper_args__ = {"polymorphic_on": "kind", "polymorphic_identity": "animal"}  # noqa: RUF012
    __waltz__ = WaltzEntity("animal", partition_by=lambda key, n: 0)
    animal_id: Mapped[int] = mapped_column(primary_key=True)
    kind: Mapped[str] = mapped_column(String(20))


class Dog(Animal):
    __mapper_args__ = {"polymorphic_identity": "dog"}  # noqa: RUF012
    __waltz__ = WaltzEntity("dog", partition_by=lambda key, n: 0)


class Cat(Animal):
    __mapper_args__ = {"polymorphic_identity": "cat"}  # noqa: RUF012
    __waltz__ = WaltzEntity("cat", partition_by=lambda key, n: 0)


class ReadAnimals(EntityTransactionContext):
    def __init__(self, callbacks: ChangeSetCallbacks) -> None:
        super().__init__(callbacks, (Animal, 1))
        self.read: list[Any] = []

    def run(self, tx: EntityTransaction) -> bool:
        self.read = [tx.get(Animal, 1), tx.get(Dog, 1), tx.get(Dog, 2), tx.get(Renamed, 4)]
        return False


def test_entities_read_as_the_orm_reads_them_single_table_inheritance_included(
    callbacks: ChangeSetCallbacks,
) -> None:
    for model in (Animal, Dog, Cat, Renamed):
        callbacks.registry.register(model)
    with Session(callbacks.engine) as session:
        session.add_all([Dog(animal_id=1), Cat(animal_id=2), Renamed(renamed_id=4, amount=7)])
        session.commit()
    context = ReadAnimals(callbacks)
    _build(context)
    animal, dog, not_a_dog, renamed = context.read
    assert type(animal) is Dog and type(dog) is Dog and not_a_dog is None  # as the ORM does
    assert renamed.amount == 7
    for entity in (animal, renamed):
        assert inspect(entity).detached  # as after the ORM loaded and expunged it


def test_readers_and_appliers_share_one_idle_limit(callbacks: ChangeSetCallbacks) -> None:
    if callbacks.engine.dialect.name == "sqlite":
        pytest.skip("SQLite takes a pooled connection for each use; nothing is kept")
    with contextlib.ExitStack() as stack:
        for _ in range(7):
            stack.enter_context(callbacks.snapshot(0))
    # Five readers are idle now: the limit. An applier given back then goes back to the pool.
    pid, builder, _ = _build(Increment(callbacks, 21))  # takes and gives back a reader
    callbacks.apply_transaction(_committed(pid, callbacks.get_client_high_water_mark(pid) + 1, builder))
    callbacks.engine.dispose()
    assert _close_other_connections(callbacks.engine) == 5  # half the pool of 10, all kinds


def test_expected_locks_are_those_of_the_entities_an_attempt_reads_by_a_known_key(
    tmp_path: Path,
) -> None:
    """What the client looks for before a first attempt (docs/design/sql.md "Entity transactions"):
    the declared entities, those of ``expected_models`` with the declared keys, and whatever else
    ``prefetch_entities`` names, each once; a key of another shape is left out."""
    engine = create_framework_engine(f"sqlite:///{tmp_path / 'expected.db'}")
    upgrade(engine)
    try:
        callbacks = ChangeSetCallbacks(
            engine, cluster_name="entities", registry=EntityRegistry.from_base(Base)
        )
        registry = callbacks.registry

        class WritesTags(Increment):
            expected_models = (Counter, Tagged)

        class ReadsAnother(Increment):
            def prefetch_entities(self) -> list[tuple[type[Any], Any]]:
                return [*super().prefetch_entities(), (Tagged, "blue"), (Counter, (1, 2))]

        assert Increment(callbacks, 5).expected_locks() == [registry.info(Counter).lock((5,))]
        assert WritesTags(callbacks, 6).expected_locks() == [
            registry.info(Counter).lock((6,)),
            registry.info(Tagged).lock((6,)),
        ]
        assert ReadsAnother(callbacks, 7).expected_locks() == [
            registry.info(Counter).lock((7,)),
            registry.info(Tagged).lock(("blue",)),
        ]
    finally:
        engine.dispose()


class ReadSome(EntityTransactionContext):
    """Declares counters 1 and 5 (partition 1), reads ``reads`` of them and counter 9."""

    def __init__(self, callbacks: ChangeSetCallbacks, reads: list[int]) -> None:
        super().__init__(callbacks, (Counter, 1), (Counter, 5))
        self.reads = reads
        self.read: list[Counter | None] = []

    def run(self, tx: EntityTransaction) -> bool:
        self.read = [tx.get(Counter, key) for key in self.reads]
        return False


@contextlib.contextmanager
def _selects(engine: Engine, parameters_sent: list[Any] | None = None) -> Iterator[list[str]]:
    """The SELECT statements sent through ``engine`` while inside (and their parameters, in
    ``parameters_sent`` when given)."""
    seen: list[str] = []

    def note(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool) -> None:
        if statement.lstrip().upper().startswith("SELECT"):
            seen.append(statement)
            if parameters_sent is not None:
                parameters_sent.append(parameters)

    event.listen(engine, "before_cursor_execute", note)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", note)


def test_the_declared_entities_are_read_with_the_mark_in_one_statement_and_locked_when_read(
    callbacks: ChangeSetCallbacks,
) -> None:
    """docs/design/sql.md "Entity transactions" ("Cheap reads")."""
    pid, builder, _ = _build(Increment(callbacks, 5))
    callbacks.apply_transaction(_committed(pid, callbacks.get_client_high_water_mark(pid) + 1, builder))
    info = callbacks.registry.info(Counter)

    context = ReadSome(callbacks, [5, 1, 5])
    context.partition_id(NUM_PARTITIONS)
    with _selects(callbacks.engine) as selects:
        context.execute(TransactionBuilder(-1))
    assert len(selects) == 1  # the mark, counters 1 and 5: one statement
    five, missing, again = context.read
    assert five is not None and again is not None and missing is None
    assert (five.value, again.value) == (1, 1) and five is not again  # an instance per read
    assert inspect(five).detached
    assert context.last_transaction is not None
    assert context.last_transaction.high_water_mark == callbacks.get_client_high_water_mark(pid)
    assert set(context.last_transaction.read_locks) == {info.lock((5,)), info.lock((1,))}

    # Only what run reads is locked; an entity not declared is read by key on its own.
    context = ReadSome(callbacks, [9])
    context.partition_id(NUM_PARTITIONS)
    with _selects(callbacks.engine) as selects:
        context.execute(TransactionBuilder(-1))
    assert len(selects) == 2 and context.read == [None]
    assert context.last_transaction is not None
    assert context.last_transaction.read_locks == [info.lock((9,))]


class ReadBatch(EntityTransactionContext):
    """Declares and reads ``counter_ids`` (of one partition)."""

    def __init__(self, callbacks: ChangeSetCallbacks, counter_ids: list[int]) -> None:
        super().__init__(callbacks, *((Counter, counter_id) for counter_id in counter_ids))
        self.counter_ids = counter_ids
        self.read: list[Counter | None] = []

    def run(self, tx: EntityTransaction) -> bool:
        self.read = [tx.get(Counter, counter_id) for counter_id in self.counter_ids]
        return False


def test_more_declared_entities_than_a_join_may_hold_are_read_with_the_mark_and_by_key(
    callbacks: ChangeSetCallbacks,
) -> None:
    """70 declared entities: more tables than MariaDB (61) or SQLite (64) join in one statement.
    The first MAX_JOINED are read with the mark, the others by key."""
    counter_ids = [1 + NUM_PARTITIONS * i for i in range(70)]
    callbacks.get_client_high_water_mark(1)
    with Session(callbacks.engine) as session:
        session.add_all(Counter(counter_id=c, value=c) for c in counter_ids[::2])
        session.commit()
    context = ReadBatch(callbacks, counter_ids)
    context.partition_id(NUM_PARTITIONS)
    with _selects(callbacks.engine) as selects:
        context.execute(TransactionBuilder(-1))
    assert [None if c is None else c.value for c in context.read] == [
        c if i % 2 == 0 else None for i, c in enumerate(counter_ids)
    ]
    assert len(selects) == 1 + len(counter_ids) - MAX_JOINED


def test_a_snapshot_without_a_mark_row_reads_the_entities_by_key(callbacks: ChangeSetCallbacks) -> None:
    with Session(callbacks.engine) as session:
        session.add(Counter(counter_id=6, value=3))
        session.commit()
    info = callbacks.registry.info(Counter)
    with callbacks.snapshot(2, entities=[(info, (2,)), (info, (6,))]) as snapshot:
        assert (snapshot.high_water_mark, snapshot.prefetched) == (-1, {})
        tx = EntityTransaction(callbacks, snapshot, NUM_PARTITIONS)
        six, two = tx.get(Counter, 6), tx.get(Counter, 2)
    assert six is not None and six.value == 3 and two is None


class ReadTagged(EntityTransactionContext):
    def __init__(self, callbacks: ChangeSetCallbacks) -> None:
        super().__init__(callbacks, (Tagged, "same"), (Counter, 4))
        self.read: list[Any] = []

    def run(self, tx: EntityTransaction) -> bool:
        self.read.append(tx.get(Counter, 4))
        self.read.append(tx.get(Tagged, "same"))
        return False


def test_a_declared_key_that_matches_several_rows_still_fails_its_read(callbacks: ChangeSetCallbacks) -> None:
    callbacks.registry.register(Tagged)
    callbacks.get_client_high_water_mark(0)
    with Session(callbacks.engine) as session:
        session.add_all([Tagged(row_id=1, tag="same"), Tagged(row_id=2, tag="same"), Counter(counter_id=4)])
        session.commit()
    context = ReadTagged(callbacks)
    assert context.partition_id(NUM_PARTITIONS) == 0
    with pytest.raises(MultipleResultsFound):
        context.execute(TransactionBuilder(-1))
    [counter] = context.read  # read by key after the joined read found two rows
    assert counter is not None and counter.counter_id == 4


def test_declared_keys_that_match_several_rows_fetch_two_rows_not_their_product(
    callbacks: ChangeSetCallbacks,
) -> None:
    """Three declared keys matching three rows each: the joined read would return 27 rows;
    two are enough to tell that a key did not identify one row."""
    callbacks.registry.register(Tagged)
    callbacks.get_client_high_water_mark(0)
    with Session(callbacks.engine) as session:
        session.add_all(Tagged(tag=tag) for tag in "abc" for _ in range(3))
        session.commit()
    sent: list[tuple[str, Any]] = []

    def note(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool) -> None:
        if "waltz_prefetch_" in statement:
            sent.append((statement, parameters))

    class ReadsNothing(EntityTransactionContext):
        def run(self, tx: EntityTransaction) -> bool:
            return False

    context = ReadsNothing(callbacks, (Tagged, "a"), (Tagged, "b"), (Tagged, "c"))
    context.partition_id(NUM_PARTITIONS)
    event.listen(callbacks.engine, "before_cursor_execute", note)
    try:
        context.execute(TransactionBuilder(-1))
    finally:
        event.remove(callbacks.engine, "before_cursor_execute", note)
    [(statement, parameters)] = sent
    with callbacks.engine.connect() as conn:  # the joined read again, as it was sent
        assert len(conn.exec_driver_sql(statement, parameters).all()) == 2


class Pair(Base):
    """A two-attribute key: ``expected_models`` with a one-value declared key does not fit it."""

    __tablename__ = "pairs"
    __waltz__ = WaltzEntity("pair", partition_by=lambda key, n: key[0] % n)
    left: Mapped[int] = mapped_column(primary_key=True)
    right: Mapped[int] = mapped_column(primary_key=True)


def test_expected_models_whose_keys_do_not_fit_are_not_read_with_the_mark(
    callbacks: ChangeSetCallbacks,
) -> None:
    callbacks.registry.register(Pair)

    class ExpectsPairs(Increment):
        expected_models = (Counter, Pair)

    pid, builder, ok = _build(ExpectsPairs(callbacks, 13))  # (Pair, 13) is not a Pair key: left out
    assert ok
    callbacks.apply_transaction(_committed(pid, callbacks.get_client_high_water_mark(pid) + 1, builder))
    assert _read(callbacks.engine, 13) == 1


class Hinted(EntityTransactionContext):
    """Declares one entity; notes which entities each attempt read with the mark."""

    def __init__(self, callbacks: ChangeSetCallbacks, model: type[Any], key: Any) -> None:
        super().__init__(callbacks, (model, key))
        self.model, self.key = model, key
        self.prefetched: list[tuple[str, tuple[Any, ...]]] = []

    def run(self, tx: EntityTransaction) -> bool:
        tx.get(self.model, self.key)
        return True

    def _after_mark_read(self, snapshot: MarkSnapshot) -> None:
        self.prefetched = sorted((info.name, key) for info, key in snapshot.prefetched)


def test_expected_models_whose_key_types_do_not_fit_are_not_read_with_the_mark(
    callbacks: ChangeSetCallbacks,
) -> None:
    """``expected_models`` is a hint: a model keyed by integers, given a text key, must not make
    the mark's statement fail (PostgreSQL refuses to compare an integer column with text)."""
    callbacks.registry.register(Tagged)
    callbacks.registry.register(Renamed)

    class TextHint(Hinted):
        expected_models = (Tagged, Counter)

    context = TextHint(callbacks, Tagged, "abc")
    assert _build(context)[2]
    assert context.prefetched == [("tagged", ("abc",))]  # (Counter, "abc") left out

    class IntegerHint(Hinted):
        expected_models = (Counter, Renamed, Tagged)

    context = IntegerHint(callbacks, Counter, 12)
    assert _build(context)[2]
    assert context.prefetched == [("counter", (12,)), ("renamed", (12,))]  # (Tagged, 12) left out


def _counters(engine: Engine) -> int:
    with engine.connect() as conn:
        return len(conn.execute(select(Counter.counter_id)).all())


def test_a_write_behind_a_comment_or_a_with_is_refused_by_the_snapshot_s_session(
    callbacks: ChangeSetCallbacks,
) -> None:
    """``tx.session`` refuses textual SQL that writes wherever the database starts reading it:
    behind comments (``/* */``, ``--``, MariaDB's ``#``) and as the main statement or a
    common table expression's body after a ``WITH``; on MariaDB a ``TRUNCATE`` would commit
    at once, whatever the snapshot's rollback. Reads pass, ``replace()`` and quoted words
    included; no row changes."""
    from sqlalchemy import text

    from waltz.errors import ReadOnlySessionError

    pid, builder, _ = _build(Increment(callbacks, 21))
    callbacks.apply_transaction(_committed(pid, 0, builder))
    dialect = callbacks.engine.dialect.name
    writes = [
        "/* audit */ UPDATE counters SET value = 5",
        "  -- note\nUPDATE counters SET value = 5",
        "/* a */ -- b\n /* c */ DELETE FROM counters",
        "WITH x AS (SELECT 1 AS n) UPDATE counters SET value = 5",
        "WITH RECURSIVE x (n) AS (SELECT 1), y AS (SELECT n FROM x) DELETE FROM counters",
        "with x as (select 'update' as w) insert into counters (counter_id, value, label) values (99, 1, '')",
    ]
    if dialect == "postgresql":
        writes += [
            "WITH gone AS (DELETE FROM counters RETURNING counter_id) SELECT counter_id FROM gone",
            "WITH gone AS NOT MATERIALIZED ( /* x */ DELETE FROM counters RETURNING 1) SELECT 1",
            "/* outer /* nested */ still a comment */ TRUNCATE TABLE counters",
        ]
    if dialect in ("mysql", "mariadb"):
        writes += ["-- clean up\nTRUNCATE TABLE counters", "# note\nDROP TABLE counters"]
    reads = [
        "/* c */ SELECT value FROM counters",
        "-- a note\nSELECT replace(label, 'a', 'b') FROM counters",
        "WITH x AS (SELECT replace(label, 'update', 'delete') AS l FROM counters) SELECT l FROM x",
        "WITH x AS (SELECT 1 AS n) SELECT n FROM x",
    ]
    before = _counters(callbacks.engine)
    with callbacks.snapshot(pid) as snapshot:
        for statement in writes:
            with pytest.raises(
                ReadOnlySessionError, match=r"textual statement (UPDATE|DELETE|INSERT|TRUNCATE|DROP) executed"
            ):
                snapshot.session.execute(text(statement))
        for statement in reads:
            snapshot.session.execute(text(statement)).all()
    assert _counters(callbacks.engine) == before == 1
    assert _read(callbacks.engine, 21) == 1


def test_a_snapshot_s_transaction_is_read_only_on_a_database_server(callbacks: ChangeSetCallbacks) -> None:
    """On PostgreSQL and MariaDB the snapshot's transaction is read only: a write on its own
    connection, which the session does not inspect, fails in the database (on MariaDB a
    ``TRUNCATE`` would otherwise commit at once) and changes nothing. The reader connections go
    back to the pool writable."""
    if callbacks.engine.dialect.name == "sqlite":
        pytest.skip("SQLite takes a pooled connection for each snapshot, whose rollback undoes any write")
    from sqlalchemy import text
    from sqlalchemy.exc import DBAPIError

    pid, builder, _ = _build(Increment(callbacks, 22))
    callbacks.apply_transaction(_committed(pid, 0, builder))
    for statement in ("TRUNCATE TABLE counters", "UPDATE counters SET value = 5", "DROP TABLE counters"):
        with callbacks.snapshot(pid) as snapshot, pytest.raises(DBAPIError, match=r"(?i)read.only"):
            snapshot.connection.execute(text(statement))
    assert _counters(callbacks.engine) == 1 and _read(callbacks.engine, 22) == 1
    callbacks.release_connections()
    pool: Any = callbacks.engine.pool
    idle = pool.checkedin()
    assert idle >= 1
    held = [callbacks.engine.connect() for _ in range(idle)]  # every pooled connection, the readers' too
    try:
        for index, conn in enumerate(held):
            conn.execute(
                text(f"INSERT INTO counters (counter_id, value, label) VALUES ({100 + index}, 0, '')")
            )
            conn.commit()
    finally:
        for conn in held:
            conn.close()
    assert _counters(callbacks.engine) == 1 + idle
