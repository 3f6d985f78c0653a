"""Batched change-sets (form 3): several change-sets in one log transaction, read by the live
apply, group apply and the entity cache as each member on its own, in order, each with its own
idempotency key (docs/design/sql.md "Batched change-sets"). The same log with the records of a
partition split among its change-sets changes the same rows (docs/design/splits.md "Record
forms")."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import Engine, String, select, text
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from waltz.client.apply_worker import ApplyWorker
from waltz.client.transaction import Transaction
from waltz.client.waiting import Watermark
from waltz.jdbc_style import (
    CHANGE_SET_HEADER,
    AddAttribute,
    ChangeSet,
    ChangeSetApplyError,
    ChangeSetBatch,
    ChangeSetCallbacks,
    ChangeSetFormatError,
    EntityRegistry,
    Operation,
    RowChange,
    WaltzEntity,
    create_framework_engine,
    decode_members,
    encode_members,
)
from waltz.jdbc_style.changeset import ChangeSetVersionError
from waltz.local.processes import wait_until
from waltz.protocol.records import ReqId
from waltz.protocol.split_records import (
    SPLIT_RECORD_HEADER,
    SplitBarrier,
    SplitGenesis,
    SplitRecordFormatError,
    SplitRecordVersionError,
)


class Base(DeclarativeBase):
    pass


class Stock(Base):
    """Of schema version 2: ``label`` came with it, and a row change of version 1 reads as one of
    version 2 with the label ``"-"``."""

    __tablename__ = "batch_stock"
    __waltz__ = WaltzEntity(
        "batch.stock",
        partition_by=lambda key, n: 0,
        schema_version=2,
        upcasters=[AddAttribute(1, "label", "-")],
    )
    sku: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    units: Mapped[int] = mapped_column(default=0)
    label: Mapped[str] = mapped_column(String(32), default="-")


def _put(sku: int, units: int, operation: Operation = Operation.UPDATE) -> RowChange:
    return RowChange(operation, "batch.stock", {"sku": sku}, {"sku": sku, "units": units})


def _txn(transaction_id: int, data: bytes, header: int = CHANGE_SET_HEADER) -> Transaction:
    return Transaction(0, transaction_id, ReqId(3, 1, 0, transaction_id), header, None, data)


# --- the record form ------------------------------------------------------------------------------


def test_a_batch_is_written_field_by_field_as_documented() -> None:
    batch = ChangeSetBatch(
        [
            ChangeSet([_put(1, 5, Operation.INSERT)], "req-a", {"op": "open"}),
            ChangeSet([RowChange(Operation.DELETE, "batch.stock", {"sku": 2}, schema_version=2)]),
        ]
    )
    assert batch.encode() == (
        b'{"members":[{"idempotency_key":"req-a","meta":{"op":"open"},'
        b'"ops":[{"entity":"batch.stock","key":{"sku":1},"op":"insert","values":{"sku":1,"units":5}}]},'
        b'{"ops":[{"entity":"batch.stock","key":{"sku":2},"op":"delete","sv":2}]}],"v":3}'
    )
    first, second = decode_members(batch.encode())
    assert (first.idempotency_key, dict(first.meta), list(first.changes)) == (
        "req-a",
        {"op": "open"},
        [_put(1, 5, Operation.INSERT)],
    )
    assert second.changes[0].schema_version == 2 and second.idempotency_key is None


def test_one_change_set_is_written_in_its_own_form_which_every_older_reader_reads() -> None:
    alone = ChangeSet([_put(1, 5)], "req-a")
    assert encode_members([alone]) == alone.encode()
    assert json.loads(alone.encode())["v"] == 1
    assert decode_members(alone.encode()) == (alone,)
    with pytest.raises(ChangeSetFormatError, match="at least two change-sets"):
        ChangeSetBatch([alone]).encode()
    with pytest.raises(ChangeSetFormatError, match="at least one change-set"):
        encode_members([])
    with pytest.raises(ChangeSetFormatError, match="decode_members reads it"):
        ChangeSet.decode(ChangeSetBatch([alone, alone]).encode())


members = st.lists(
    st.builds(
        lambda units, key, version: ChangeSet(
            [RowChange(Operation.UPDATE, "batch.stock", {"sku": 1}, {"sku": 1, "units": units}, version)],
            key,
        ),
        st.integers(-(1 << 40), 1 << 40),
        st.none() | st.text(min_size=1, max_size=8),
        st.integers(1, 3),
    ),
    min_size=1,
    max_size=6,
)


@given(members)
def test_every_batch_survives_encoding(written: list[ChangeSet]) -> None:
    assert list(decode_members(encode_members(written))) == written


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b'{"v":3,"members":[]}', "at least two members"),
        (b'{"v":3,"members":{"a":1}}', "members dict"),
        (b'{"v":3}', "members NoneType"),
        (b'{"v":3,"members":[{"ops":[]},{"ops":[]}],"ops":[]}', "no ops of its own"),
        (b'{"v":3,"members":[{"ops":[]},{"v":1,"ops":[]}]}', "member 1 of the batch"),
        (b'{"v":3,"members":[{"ops":[]},[]]}', "member 1 of the batch"),
        (b'{"v":3,"members":[{"ops":[]},{"ops":[],"members":[]}]}', "member 1 of the batch"),
        (b'{"v":3,"members":[{"ops":[{"op":"upsert"}]},{"ops":[]}]}', "member 0 of the batch: malformed"),
        (b'{"v":3,"members":[{"ops":[]},{"ops":[],"idempotency_key":7}]}', "member 1 .*idempotency_key"),
        (
            b'{"v":3,"members":[{"ops":[{"op":"delete","entity":"e","key":{},"sv":1}]},{"ops":[]}]}',
            "sv|schema",
        ),
        (b'{"v":1,"ops":[],"members":[]}', "has no members"),
        (b'{"v":true,"ops":[]}', "not supported"),
    ],
)
def test_malformed_batches_are_refused_clearly(data: bytes, message: str) -> None:
    with pytest.raises(ChangeSetFormatError, match=message) as raised:
        decode_members(data)
    assert not isinstance(raised.value, ChangeSetVersionError)


def test_a_form_newer_than_batches_waits_for_an_upgrade() -> None:
    with pytest.raises(ChangeSetVersionError, match="form 4 is newer"):
        decode_members(b'{"v":4,"members":[]}')


# --- the live apply and the entity cache ----------------------------------------------------------


@pytest.fixture
def engine(app_db_url: str) -> Iterator[Engine]:
    engine = create_framework_engine(app_db_url)
    Base.metadata.create_all(engine)
    try:
        yield engine
    finally:
        engine.dispose()


class Audited(ChangeSetCallbacks):
    """Notes each change-set its apply is handed, with the member it is, and each transaction
    handed to ``apply_command`` (applied as changing nothing)."""

    def __init__(self, engine: Engine, **kwargs: Any) -> None:
        kwargs.setdefault("entity_cache", True)
        super().__init__(engine, cluster_name="batches", registry=EntityRegistry([Stock]), **kwargs)
        self.seen: list[tuple[int, int, str | None]] = []
        self.commands: list[int] = []

    def apply_change_set(self, change_set: ChangeSet, transaction: Transaction, session: Session) -> None:
        self.seen.append(
            (transaction.transaction_id, self.member_index(transaction), change_set.idempotency_key)
        )
        super().apply_change_set(change_set, transaction, session)

    def apply_command(self, transaction: Transaction, session: Session) -> None:
        self.commands.append(transaction.transaction_id)


#: A log of every form, kept as written (docs/design/sql.md "Change-sets", "Batched change-sets"):
#: form 1 (row changes of schema version 1, which the upcaster takes to version 2), form 2 (a row
#: change of version 2), then batches (form 3) whose members repeat a request of an earlier
#: transaction (skipped), repeat one of an earlier member of the same batch (skipped), carry no
#: key, and (the last) carry a row change of version 2.
LOG_OF_EVERY_FORM = (
    b'{"ops":[{"entity":"batch.stock","key":{"sku":1},"op":"insert","values":{"sku":1,"units":10}},'
    b'{"entity":"batch.stock","key":{"sku":2},"op":"insert","values":{"sku":2,"units":20}}],"v":1}',
    b'{"idempotency_key":"r1","ops":[{"entity":"batch.stock","key":{"sku":1},"op":"update","sv":2,'
    b'"values":{"label":"v2","sku":1,"units":9}}],"v":2}',
    b'{"members":[{"idempotency_key":"r1","ops":[{"entity":"batch.stock","key":{"sku":1},"op":"update",'
    b'"values":{"sku":1,"units":100}}]},{"idempotency_key":"r2","ops":[{"entity":"batch.stock",'
    b'"key":{"sku":2},"op":"update","values":{"sku":2,"units":19}}]},{"idempotency_key":"r2",'
    b'"ops":[{"entity":"batch.stock","key":{"sku":2},"op":"update","values":{"sku":2,"units":200}}]},'
    b'{"ops":[{"entity":"batch.stock","key":{"sku":3},"op":"insert","values":{"sku":3,"units":30}}]}],"v":3}',
    b'{"members":[{"idempotency_key":"r3","ops":[{"entity":"batch.stock","key":{"sku":3},"op":"update",'
    b'"values":{"sku":3,"units":29}}]},{"ops":[{"entity":"batch.stock","key":{"sku":1},"op":"update",'
    b'"sv":2,"values":{"label":"batched v2","sku":1,"units":8}}]}],"v":3}',
)


def _log() -> list[Transaction]:
    """:data:`LOG_OF_EVERY_FORM` as transactions 0 to 3 of partition 0."""
    return [_txn(i, data) for i, data in enumerate(LOG_OF_EVERY_FORM)]


EXPECTED = {1: 8, 2: 19, 3: 29}
#: Each row's label after the log: the last change of sku 1 was of version 2, the others' of 1.
EXPECTED_LABELS = {1: "batched v2", 2: "-", 3: "-"}


def test_the_kept_log_holds_every_form() -> None:
    assert [json.loads(data)["v"] for data in LOG_OF_EVERY_FORM] == [1, 2, 3, 3]
    versions = [[c.schema_version for m in decode_members(d) for c in m.changes] for d in LOG_OF_EVERY_FORM]
    assert versions == [[1, 1], [2], [1, 1, 1, 1], [1, 2]]


def _stock(engine: Engine) -> dict[int, int]:
    with engine.connect() as conn:
        return {int(s): int(u) for s, u in conn.execute(select(Stock.sku, Stock.units))}


def _labels(engine: Engine) -> dict[int, str]:
    with engine.connect() as conn:
        return {int(s): str(label) for s, label in conn.execute(select(Stock.sku, Stock.label))}


@pytest.mark.parametrize("grouped", [False, True], ids=["one-by-one", "group"])
def test_a_log_of_every_form_applies_each_member_once_in_order(engine: Engine, grouped: bool) -> None:
    callbacks = Audited(engine)
    log = _log()
    cache = callbacks.entity_cache
    assert cache is not None
    cache.floor(0, -1)
    if grouped:
        callbacks.absorb_transactions(log)  # as the client does before it applies a batch
        callbacks.apply_transactions(log)
    else:
        for transaction in log:
            callbacks.absorb_transactions([transaction])
            callbacks.apply_transaction(transaction)
    assert callbacks.uncaught_count == 0
    assert _stock(engine) == EXPECTED
    assert _labels(engine) == EXPECTED_LABELS
    assert [s for s in callbacks.seen if s[0] >= 2] == [
        (2, 0, "r1"),
        (2, 1, "r2"),
        (2, 3, None),
        (3, 0, "r3"),
        (3, 1, None),
    ]
    for key, where in (("r1", 1), ("r2", 2), ("r3", 3)):
        found = callbacks.find_idempotency_key(key)
        assert found is not None and (found.partition_id, found.transaction_id) == (0, where)
    assert callbacks.high_water_marks() == {0: 3}
    # The cache: the rows of every applied member, the skipped members' rows left to the database.
    info = callbacks.registry.info(Stock)
    assert cache.position(0) == 3
    assert cache.read(0, [(info, (1,)), (info, (3,))]) == (
        3,
        {(info, (1,)): (1, 8, "batched v2"), (info, (3,)): (3, 29, "-")},
    )
    assert cache.read(0, [(info, (2,))]) is None  # last changed by the skipped copy of r2
    assert cache.resets == 0


def test_a_database_replaying_the_log_makes_the_same_choices(engine: Engine) -> None:
    first = Audited(engine, entity_cache=False)
    first.apply_transactions(_log())
    with engine.begin() as conn:
        for table in ("batch_stock", "waltz_idempotency_keys", "waltz_high_water_marks"):
            conn.execute(text(f"DELETE FROM {table}"))
    replay = Audited(engine, entity_cache=False)
    for transaction in _log():
        replay.apply_transaction(transaction)
    assert _stock(engine) == EXPECTED and replay.uncaught_count == 0
    assert _labels(engine) == EXPECTED_LABELS


def test_a_batch_that_does_not_fit_rolls_back_every_member(engine: Engine) -> None:
    callbacks = Audited(engine)
    callbacks.apply_transaction(_txn(0, ChangeSet([_put(1, 10, Operation.INSERT)]).encode()))
    broken = ChangeSetBatch([ChangeSet([_put(1, 11)], "r9"), ChangeSet([_put(7, 70)])])  # no row 7
    with pytest.raises(
        ChangeSetApplyError, match=r"partition 0 transaction 1 member 1: update .* found no row"
    ):
        callbacks.apply_transactions([_txn(1, broken.encode())])
    assert _stock(engine) == {1: 10}
    assert callbacks.find_idempotency_key("r9") is None
    assert callbacks.high_water_marks() == {0: 0}


# --- the records of a split among the forms -------------------------------------------------------

BARRIER = SplitBarrier(epoch=1, count=2, previous_count=1, parent=0)
GENESIS = SplitGenesis(epoch=1, count=2, previous_count=1, parent=0, barrier=2)


def _split_log(records: str) -> list[Transaction]:
    """:func:`_log` with a barrier after transaction 1 and, with ``"barrier and genesis"``, a genesis
    after the next, numbered on."""
    data = [t.get_raw_data() for t in _log()]
    entries = [(CHANGE_SET_HEADER, d) for d in data[:2]] + [(SPLIT_RECORD_HEADER, BARRIER.encode())]
    entries.append((CHANGE_SET_HEADER, data[2]))
    if records == "barrier and genesis":
        entries.append((SPLIT_RECORD_HEADER, GENESIS.encode()))
    entries.append((CHANGE_SET_HEADER, data[3]))
    return [_txn(i, d, header) for i, (header, d) in enumerate(entries)]


@pytest.mark.parametrize("records", ["barrier", "barrier and genesis"])
@pytest.mark.parametrize("grouped", [False, True], ids=["one-by-one", "group"])
def test_split_records_among_the_forms_change_no_row_and_are_applied_once(
    engine: Engine, grouped: bool, records: str
) -> None:
    """docs/design/splits.md "The SQL framework across a split": each record is one transaction of
    its partition, applied once, changing no row and never handed to ``apply_command``; the
    barrier leaves the entity cache as it was, the genesis empties it."""
    callbacks = Audited(engine)
    log = _split_log(records)
    last = log[-1].transaction_id
    cache = callbacks.entity_cache
    assert cache is not None
    cache.floor(0, -1)
    if grouped:
        callbacks.absorb_transactions(log)
        callbacks.apply_transactions(log)
    else:
        for transaction in log:
            callbacks.absorb_transactions([transaction])
            callbacks.apply_transaction(transaction)
    assert callbacks.uncaught_count == 0 and callbacks.commands == []
    assert _stock(engine) == EXPECTED
    assert callbacks.high_water_marks() == {0: last}
    assert [s for s in callbacks.seen if s[0] >= 3] == [
        (3, 0, "r1"),
        (3, 1, "r2"),
        (3, 3, None),
        (last, 0, "r3"),
        (last, 1, None),
    ]
    info = callbacks.registry.info(Stock)
    assert cache.position(0) == last
    rows = cache.read(0, [(info, (1,)), (info, (3,))])
    if records == "barrier":
        assert rows == (last, {(info, (1,)): (1, 8, "batched v2"), (info, (3,)): (3, 29, "-")})
        assert cache.resets == 0  # the barrier is followed, changing nothing
    elif not grouped:
        # The genesis emptied the rows the cache held; it follows the transactions after it.
        assert rows == (last, {(info, (1,)): (1, 8, "batched v2"), (info, (3,)): (3, 29, "-")})
        assert cache.resets == 1
    else:
        assert rows is None  # a group holding the genesis leaves the cache empty at its end

    # Another instance sharing the database finds every record applied: nothing twice.
    other = Audited(engine)
    other.apply_transactions(log)
    for transaction in log:
        other.apply_transaction(transaction)
    assert other.seen == other.commands == [] and other.uncaught_count == 0
    assert _stock(engine) == EXPECTED and callbacks.high_water_marks() == {0: last}


def test_a_split_record_of_a_newer_form_stops_its_partition_naming_the_form(engine: Engine) -> None:
    """As a change-set of a newer form does (docs/design/sql.md "Schema versions and upcasting"):
    the partition waits, unhealthy with the error as its reason, applying nothing of it."""
    callbacks = Audited(engine)
    worker = ApplyWorker(0, callbacks, Watermark(-1), initial_backoff=0.01, absorbed=Watermark(-1))
    newer = {**json.loads(GENESIS.encode()), "v": 2, "kind": "merge"}
    worker.start()
    try:
        worker.enqueue(_txn(0, ChangeSet([_put(1, 10, Operation.INSERT)]).encode()))
        worker.enqueue(_txn(1, json.dumps(newer).encode(), SPLIT_RECORD_HEADER))
        paused = wait_until(
            lambda: worker.paused, timeout=10, what="partition 0 to wait at the split record of form 2"
        )
        assert not worker.healthy
    finally:
        worker.close()
    assert isinstance(paused, SplitRecordVersionError) and paused.form == 2
    assert "of form 2 is newer than this waltz-py reads" in str(paused)
    assert [(p, t, e) for p, t, e in callbacks.uncaught] == [(0, 1, paused)]
    assert callbacks.high_water_marks() == {0: 0} and callbacks.commands == []


def test_a_damaged_split_record_is_refused_and_never_passed_over(engine: Engine) -> None:
    callbacks = Audited(engine)
    callbacks.apply_transaction(_txn(0, ChangeSet([_put(1, 10, Operation.INSERT)]).encode()))
    damaged = {**json.loads(BARRIER.encode()), "previous_count": 3}
    with pytest.raises(SplitRecordFormatError, match="count 2 is not a multiple") as raised:
        callbacks.apply_transaction(_txn(1, json.dumps(damaged).encode(), SPLIT_RECORD_HEADER))
    assert not isinstance(raised.value, SplitRecordVersionError)
    assert callbacks.high_water_marks() == {0: 0} and callbacks.commands == []
