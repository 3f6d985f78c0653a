"""Entity transactions without a cluster: partition mapping, locks, and the exact lock check.

The heart of it (docs/design/sql.md "Entity transactions"): an attempt reads the partition's high-water mark
first and the entities after it in one REPEATABLE READ snapshot, so a transaction another instance
applies between the two reads is invisible to both: what the attempt read is exactly the state at
the mark it sends, and the server's lock check (the mark against the lock's last write) is exact.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, String, select
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from waltz.client.context import TransactionBuilder
from waltz.client.transaction import Transaction
from waltz.errors import CrossPartitionError
from waltz.jdbc_style import (
    CHANGE_SET_HEADER,
    ChangeSet,
    ChangeSetCallbacks,
    EntityRegistry,
    EntityTransaction,
    EntityTransactionContext,
    MarkSnapshot,
    Operation,
    WaltzEntity,
    create_framework_engine,
)
from waltz.jdbc_style.migrations_api import upgrade
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
    def __init__(
        self, callbacks: ChangeSetCallbacks, counter_id: int, interleave: ChangeSetCallbacks | None = None
    ):
        super().__init__(callbacks, (Counter, counter_id))
        self.counter_id = counter_id
        self.interleave = interleave
        self.seen: list[int | None] = []

    def run(self, tx: EntityTransaction) -> bool:
        counter = tx.get(Counter, self.counter_id)
        self.seen.append(None if counter is None else counter.value)
        if counter is None:
            tx.insert(Counter, counter_id=self.counter_id, value=1)
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
            change = Increment(other, self.counter_id)
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


def test_a_transaction_applied_between_the_mark_read_and_the_entity_read_is_invisible_to_both(
    callbacks: ChangeSetCallbacks,
) -> None:
    other = ChangeSetCallbacks(callbacks.engine, cluster_name="entities", registry=callbacks.registry)
    pid, builder, _ = _build(Increment(callbacks, 6))
    callbacks.apply_transaction(_committed(pid, 0, builder))  # counter 6 = 1 at mark 0

    racing = Increment(callbacks, 6, interleave=other)
    pid, builder, ok = _build(racing)
    assert ok
    # Another instance applied transaction 1 (counter 6 = 2) during the attempt...
    assert other.high_water_marks()[pid] == 1 and _read(callbacks.engine, 6) == 2
    # ...yet the attempt saw the counter and the mark of one moment: value 1 at mark 0. Sent with
    # mark 0, the server refuses it (transaction 1 wrote the lock after 0): no lost update.
    assert racing.seen == [1]
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
