"""The entity cache (docs/design/sql.md "The entity cache"): attempts whose entities the cache
holds run without a database snapshot, and what they read is exactly the state at the mark they
send, also when another instance applies meanwhile; whatever the cache cannot follow resets it.
"""

from __future__ import annotations

import decimal
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Boolean, Engine, Numeric, String, TypeDecorator, delete, event, select, update
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from waltz.client.apply_worker import APPLY_THREAD_PREFIX
from waltz.client.context import TransactionBuilder
from waltz.client.transaction import Transaction
from waltz.errors import CrossPartitionError
from waltz.jdbc_style import (
    ChangeSet,
    ChangeSetApplyError,
    ChangeSetCallbacks,
    EntityRead,
    EntityRegistry,
    EntityTransaction,
    EntityTransactionContext,
    Operation,
    RowChange,
    UnknownEntityError,
    WaltzEntity,
    create_framework_engine,
)
from waltz.jdbc_style.entities import EntityInfo
from waltz.jdbc_style.entity_cache import MISSING, EntityCache, column_kinds
from waltz.jdbc_style.entity_context import CachedSnapshot
from waltz.jdbc_style.schema import ExactText
from waltz.protocol.records import ReqId

NUM_PARTITIONS = 4
COMMAND_HEADER = 7


class Base(DeclarativeBase):
    pass


class Tally(Base):
    __tablename__ = "cache_tallies"
    __waltz__ = WaltzEntity("cache.tally", partition_by=lambda key, n: int(key[0]) % n)
    tally_id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    value: Mapped[int] = mapped_column(default=0)
    label: Mapped[str] = mapped_column(String(20), default="")
    open: Mapped[bool] = mapped_column(Boolean, default=True)


class Named(Base):
    """Keyed by a string: kept where the database compares strings exactly."""

    __tablename__ = "cache_named"
    __waltz__ = WaltzEntity("cache.named", partition_by=lambda key, n: len(key[0]) % n)
    name: Mapped[str] = mapped_column(String(20), primary_key=True)
    value: Mapped[int] = mapped_column(default=0)


class Priced(Base):
    """A Numeric column: the database may round what it is given; never cached."""

    __tablename__ = "cache_priced"
    __waltz__ = WaltzEntity("cache.priced", partition_by=lambda key, n: key[0] % n)
    priced_id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    price: Mapped[decimal.Decimal] = mapped_column(Numeric(10, 2), default=decimal.Decimal(0))


@pytest.fixture
def engine(app_db_url: str) -> Iterator[Engine]:
    engine = create_framework_engine(app_db_url)
    Base.metadata.create_all(engine)
    try:
        yield engine
    finally:
        engine.dispose()


class CommandCallbacks(ChangeSetCallbacks):
    """Applies command-style transactions too: data ``b"<id>=<value>"`` sets a tally directly."""

    def apply_command(self, transaction: Transaction, session: Session) -> None:
        tally_id, value = transaction.get_raw_data().decode().split("=")
        session.execute(update(Tally).where(Tally.tally_id == int(tally_id)).values(value=int(value)))


def _callbacks(engine: Engine, **kwargs: Any) -> CommandCallbacks:
    return CommandCallbacks(engine, cluster_name="cache", registry=EntityRegistry.from_base(Base), **kwargs)


@pytest.fixture
def callbacks(engine: Engine) -> CommandCallbacks:
    return _callbacks(engine)


class Add(EntityTransactionContext):
    """Adds ``amount`` to a tally (inserting it at ``amount``); notes what each attempt saw."""

    def __init__(self, callbacks: ChangeSetCallbacks, tally_id: int, amount: int = 1, *, query: bool = False):
        super().__init__(callbacks, (Tally, tally_id))
        self.tally_id, self.amount, self.query = tally_id, amount, query
        self.seen: list[int | None] = []

    def run(self, tx: EntityTransaction) -> bool:
        tally = tx.get(Tally, self.tally_id)
        self.seen.append(None if tally is None else tally.value)
        if self.query:  # a read the cache cannot answer: a database snapshot opens for it
            tx.session.execute(select(Tally.value)).all()
        _add_to(tx, tally, self.tally_id, self.amount)
        return True


def _add_to(tx: EntityTransaction, tally: Tally | None, tally_id: int, amount: int) -> None:
    """Add ``amount`` to ``tally`` as read (None: insert tally ``tally_id`` at ``amount``)."""
    if tally is None:
        tx.insert(Tally, tally_id=tally_id, value=amount)
    else:
        tx.update(tally, value=tally.value + amount)


class Count(EntityTransactionContext):
    """Counts under a name (inserting it at 1); notes what each attempt saw."""

    def __init__(self, callbacks: ChangeSetCallbacks, name: str):
        super().__init__(callbacks, (Named, name))
        self.name = name
        self.seen: list[int | None] = []

    def run(self, tx: EntityTransaction) -> bool:
        row = tx.get(Named, self.name)
        self.seen.append(None if row is None else row.value)
        if row is None:
            tx.insert(Named, name=self.name, value=1)
        else:
            tx.update(row, value=row.value + 1)
        return True


class Remove(EntityTransactionContext):
    def __init__(self, callbacks: ChangeSetCallbacks, tally_id: int):
        super().__init__(callbacks, (Tally, tally_id))
        self.tally_id = tally_id

    def run(self, tx: EntityTransaction) -> bool:
        tally = tx.get(Tally, self.tally_id)
        if tally is None:
            return False
        tx.delete(tally)
        return True


class Reprice(EntityTransactionContext):
    def __init__(self, callbacks: ChangeSetCallbacks, priced_id: int):
        super().__init__(callbacks, (Priced, priced_id))
        self.priced_id = priced_id

    def run(self, tx: EntityTransaction) -> bool:
        row = tx.get(Priced, self.priced_id)
        if row is None:
            tx.insert(Priced, priced_id=self.priced_id, price=decimal.Decimal("1.50"))
        else:
            tx.update(row, price=row.price + 1)
        return True


class Statements:
    """Counts the statements an engine runs (the cache's point: none for a cached attempt)."""

    def __init__(self, engine: Engine) -> None:
        self.count = 0
        event.listen(engine, "before_cursor_execute", self._seen)

    def _seen(self, *args: Any) -> None:
        self.count += 1

    def during(self, fn: Any) -> int:
        before = self.count
        fn()
        return self.count - before


def _attempt(context: EntityTransactionContext) -> TransactionBuilder:
    context.partition_id(NUM_PARTITIONS)
    builder = TransactionBuilder(-1)
    assert context.execute(builder)
    return builder


def _commit(callbacks: ChangeSetCallbacks, context: EntityTransactionContext, transaction_id: int) -> int:
    """Run an attempt and apply it as ``transaction_id`` of its partition; returns its mark."""
    builder = _attempt(context)
    payload = builder.build()
    pid = context.chosen_partition
    callbacks.apply_transaction(
        Transaction(pid, transaction_id, ReqId(9, 1, pid, transaction_id), payload.header, None, payload.data)
    )
    return payload.client_high_water_mark


def _cached_at_one(callbacks: ChangeSetCallbacks, tally_id: int) -> int:
    """Tally ``tally_id`` at 2 by transactions 0 and 1 of its partition, both applied (the cache at
    1, holding the tally's row): that partition."""
    pid = tally_id % NUM_PARTITIONS
    callbacks.get_client_high_water_mark(pid)
    _commit(callbacks, Add(callbacks, tally_id), 0)
    _commit(callbacks, Add(callbacks, tally_id), 1)
    return pid


def _read(engine: Engine, tally_id: int) -> int | None:
    with engine.connect() as conn:
        return conn.execute(select(Tally.value).where(Tally.tally_id == tally_id)).scalar()


def test_an_attempt_on_cached_entities_runs_no_statement_and_sends_the_cache_position(
    engine: Engine, callbacks: CommandCallbacks
) -> None:
    statements = Statements(engine)
    pid = 5 % NUM_PARTITIONS
    callbacks.get_client_high_water_mark(pid)
    assert _commit(callbacks, Add(callbacks, 5), 0) == -1  # no position yet: the database is read
    assert callbacks.entity_cache is not None and callbacks.entity_cache.position(pid) == 0
    # The apply put the cache at 0 but it holds no row of tally 5 yet: this attempt reads the
    # database (at mark 0), and the rows it read are kept.
    assert _commit(callbacks, Add(callbacks, 5), 1) == 0
    # Transaction 1's change-set moved the cached row: the next attempt reads it at 1, no statement.
    add = Add(callbacks, 5, amount=10)
    ran = statements.during(lambda: _commit(callbacks, add, 2))
    assert add.seen == [2]
    assert _read(engine, 5) == 12
    # Its apply ran statements; the attempt itself none: the apply of one transaction on a kept
    # connection is BEGIN + the mark's UPDATE + the row's UPDATE + COMMIT at most.
    assert ran <= 4
    again = Add(callbacks, 5)
    assert statements.during(lambda: _attempt(again)) == 0
    assert again.seen == [12]
    assert _attempt(Add(callbacks, 5)).build().client_high_water_mark == 2


def test_rows_keyed_by_strings_are_kept_where_the_database_compares_strings_exactly(
    engine: Engine, callbacks: CommandCallbacks
) -> None:
    """PostgreSQL and SQLite tell ``'abc'``, ``'ABC'`` and ``'abc '`` apart, as the cache does:
    their string-keyed rows are kept. MariaDB's default collations equate them: never kept."""
    exact = engine.dialect.name in ("postgresql", "sqlite")
    cache = callbacks.entity_cache
    assert cache is not None and cache.exact_string_keys is exact
    statements = Statements(engine)
    pid = len("abc") % NUM_PARTITIONS
    callbacks.get_client_high_water_mark(pid)
    _commit(callbacks, Count(callbacks, "abc"), 0)
    _commit(callbacks, Count(callbacks, "abc"), 1)  # read from the database (at 0), then kept
    again = Count(callbacks, "abc")
    ran = statements.during(lambda: _attempt(again))
    assert again.seen == [2]
    assert (ran == 0) is exact  # from the cache where strings are compared exactly
    info = callbacks.registry.info(Named)
    if not exact:
        assert cache.view(pid, [(info, ("abc",))]) is None
        return
    assert cache.view(pid, [(info, ("abc",))]) == (1, {(info, ("abc",)): ("abc", 2)})
    # Keys of another kind than the column's, or longer than it, are never kept.
    assert cache.view(pid, [(info, (3,))]) is None
    assert cache.view(pid, [(info, ("x" * 21,))]) is None
    # Other spellings are other rows, in the database as in the cache.
    for other in ("ABC", "abc "):
        count = Count(callbacks, other)
        _attempt(count)
        assert count.seen == [None], other
    _commit(callbacks, Count(callbacks, "ABC"), 2)
    assert cache.view(pid, [(info, ("ABC",))]) == (2, {(info, ("ABC",)): ("ABC", 1)})
    assert cache.view(pid, [(info, ("abc",))]) == (2, {(info, ("abc",)): ("abc", 2)})
    counted = Count(callbacks, "abc")
    assert statements.during(lambda: _attempt(counted)) == 0 and counted.seen == [2]


def test_another_instance_applying_meanwhile_leaves_the_attempt_at_the_cache_position(
    engine: Engine, callbacks: CommandCallbacks
) -> None:
    other = _callbacks(engine)
    pid = _cached_at_one(callbacks, 6)  # cached at 1: tally 6 = 2
    # Another instance applies transaction 2 (tally 6 = 3) that this one has not applied yet.
    _commit(other, Add(other, 6), 2)
    assert _read(engine, 6) == 3
    # The attempt reads the state at 1 and says so: the server refuses it (transaction 2 wrote the
    # lock after 1), exactly as for a snapshot taken before transaction 2.
    stale = Add(callbacks, 6)
    assert _attempt(stale).build().client_high_water_mark == 1 and stale.seen == [2]
    # A read the cache cannot answer opens a snapshot (mark 2): the attempt keeps the lower mark.
    mixed = Add(callbacks, 6, query=True)
    assert _attempt(mixed).build().client_high_water_mark == 1 and mixed.seen == [2]
    # This instance's apply finds transaction 2 applied: the cache starts again at 2, from the database.
    callbacks.apply_transaction(_transaction_of(other, pid, 2))
    fresh = Add(callbacks, 6)
    assert _attempt(fresh).build().client_high_water_mark == 2 and fresh.seen == [3]


def _transaction_of(callbacks: ChangeSetCallbacks, pid: int, transaction_id: int) -> Transaction:
    """A stand-in for the feed's transaction (this test applies it without its data)."""
    return Transaction(pid, transaction_id, ReqId(9, 1, pid, transaction_id), 0, None, b"")


def test_a_command_style_transaction_resets_the_cache(engine: Engine, callbacks: CommandCallbacks) -> None:
    pid = _cached_at_one(callbacks, 7)  # cached: tally 7 = 2
    callbacks.apply_transaction(Transaction(pid, 2, ReqId(9, 1, pid, 2), COMMAND_HEADER, None, b"7=40"))
    after = Add(callbacks, 7)
    assert _attempt(after).build().client_high_water_mark == 2
    assert after.seen == [40]  # from the database, not the cached 2


class Keyed(Add):
    """:class:`Add` as a request carrying an idempotency key (``request-<tally>`` unless given);
    the key is not checked before appending, so a repeated request commits and its apply skips
    its changes."""

    checks_idempotency_key = False

    def __init__(self, callbacks: ChangeSetCallbacks, tally_id: int, amount: int = 1, *, key: str = ""):
        super().__init__(callbacks, tally_id, amount)
        self.key = key or f"request-{tally_id}"

    def run(self, tx: EntityTransaction) -> bool:
        tx.idempotency_key = self.key
        return super().run(tx)


def test_an_idempotency_keyed_change_set_is_kept_once_its_apply_recorded_the_key(
    engine: Engine, callbacks: CommandCallbacks
) -> None:
    """A keyed change-set's rows are kept once its apply says it recorded the key first; a
    repeated request, whose apply skipped its changes, leaves them to the database."""
    pid = _cached_at_one(callbacks, 9)  # tally 9 = 2, cached
    statements = Statements(engine)
    _commit(callbacks, Keyed(callbacks, 9), 2)  # tally 9 = 3: the key's first request
    first = Add(callbacks, 9)
    assert statements.during(lambda: _attempt(first)) == 0  # from the cache, at 2
    assert first.seen == [3]
    cache = callbacks.entity_cache
    assert cache is not None and cache.resets == 0
    assert _commit(callbacks, Keyed(callbacks, 9), 3) == 2  # the same key again: its change is skipped
    assert _read(engine, 9) == 3
    after = Add(callbacks, 9)
    assert statements.during(lambda: _attempt(after)) > 0  # the cache does not hold the row: read
    assert after.seen == [3]
    assert _attempt(Add(callbacks, 9)).build().client_high_water_mark == 3
    assert cache.resets == 0 and cache.position(pid) == 3


def test_an_absorbed_keyed_change_set_is_read_only_once_its_apply_recorded_the_key(
    engine: Engine, callbacks: CommandCallbacks
) -> None:
    """Absorbed before its apply, a keyed change-set leaves its rows pending: no attempt reads
    them from the cache until the apply says whether it recorded the key first."""
    pid = _cached_at_one(callbacks, 21)  # tally 21 = 2, cached at 1
    info = callbacks.registry.info(Tally)
    cache = callbacks.entity_cache
    assert cache is not None
    first = _payload_transaction(Keyed(callbacks, 21, amount=5), 2)
    callbacks.absorb_transactions([first])
    assert cache.position(pid) == 2 and cache.view(pid, [(info, (21,))]) is None  # pending
    callbacks.apply_transaction(first)
    assert _read(engine, 21) == 7
    assert cache.view(pid, [(info, (21,))]) == (2, {(info, (21,)): (21, 7, "", True)})
    # The same request again, absorbed then skipped by its apply; then an unkeyed change of
    # another tally in the same partition, which stays cached.
    again = _payload_transaction(Keyed(callbacks, 21, amount=5), 3)
    other = _payload_transaction(Add(callbacks, 25), 4)
    callbacks.absorb_transactions([again, other])
    assert cache.view(pid, [(info, (21,))]) is None
    callbacks.apply_transaction(again)
    callbacks.apply_transaction(other)
    assert _read(engine, 21) == 7
    assert cache.view(pid, [(info, (21,))]) is None  # skipped: left to the database
    assert cache.view(pid, [(info, (25,))]) == (4, {(info, (25,)): (25, 1, "", True)})
    read = Add(callbacks, 21)
    assert _attempt(read).build().client_high_water_mark == 4 and read.seen == [7]
    # A later unkeyed change of the row carries it whole: kept at once, whatever came before.
    callbacks.apply_transaction(_payload_transaction(Add(callbacks, 21), 5))
    assert cache.view(pid, [(info, (21,))]) == (5, {(info, (21,)): (21, 8, "", True)})
    assert cache.resets == 0


def test_an_attempt_on_pending_rows_waits_for_their_apply_and_reads_the_cache(
    engine: Engine, callbacks: CommandCallbacks
) -> None:
    """An attempt whose rows are pending on a keyed change-set's apply waits for that apply on
    this instance, then reads the settled rows from the cache: no statement of its own."""
    pid = _cached_at_one(callbacks, 29)  # tally 29 = 2, cached at 1
    cache = callbacks.entity_cache
    assert cache is not None
    first = _payload_transaction(Keyed(callbacks, 29, amount=5), 2)
    callbacks.absorb_transactions([first])
    attempt_thread = threading.get_ident()
    on_attempt_thread: list[str] = []

    def statement(conn: Any, cursor: Any, sql: str, *args: Any) -> None:
        if threading.get_ident() == attempt_thread:
            on_attempt_thread.append(sql[:60])

    hits, misses = cache.hits, cache.misses
    apply = threading.Timer(0.2, callbacks.apply_transaction, [first])
    event.listen(engine, "before_cursor_execute", statement)
    try:
        apply.start()
        waited = Add(callbacks, 29)
        assert _attempt(waited).build().client_high_water_mark == 2
    finally:
        apply.join(10)
        event.remove(engine, "before_cursor_execute", statement)
    assert waited.seen == [7] and _read(engine, 29) == 7
    assert on_attempt_thread == []
    assert (cache.hits - hits, cache.misses - misses) == (1, 0)
    assert pid == 29 % NUM_PARTITIONS


def test_settling_a_keyed_change_set_leaves_later_changes_of_its_rows_alone() -> None:
    """The entry a keyed change-set left is settled only while it is still that change-set's:
    a later change of the key (keyed or not) replaced it."""
    registry = EntityRegistry.from_base(Base)
    info = registry.info(Tally)
    cache = EntityCache(registry)
    cache.floor(0, 0)

    def change(tally: int, value: int, key: str | None) -> ChangeSet:
        values = {"tally_id": tally, "value": value, "label": "", "open": True}
        return ChangeSet([RowChange(Operation.INSERT, "cache.tally", {"tally_id": tally}, values)], key)

    cache.absorb(0, 1, [change(4, 1, "a"), change(4, 2, "b"), change(8, 3, "c"), change(8, 4, None)])
    assert cache.read(0, [(info, (4,))]) is None
    assert cache.read(0, [(info, (8,))]) == (4, {(info, (8,)): (8, 4, "", True)})
    cache.settle(0, {(1, 0): True, (3, 0): False})  # "a" (replaced by "b") and "c" (replaced) change nothing
    assert cache.read(0, [(info, (4,))]) is None
    assert cache.read(0, [(info, (8,))]) == (4, {(info, (8,)): (8, 4, "", True)})
    cache.settle(0, {(2, 0): True})
    assert cache.read(0, [(info, (4,))]) == (4, {(info, (4,)): (4, 2, "", True)})
    cache.absorb(0, 5, [change(4, 9, "d")])
    cache.settle(0, {(5, 0): False})
    assert cache.read(0, [(info, (4,))]) is None and cache.resets == 0


def test_a_delete_is_cached_as_no_row(engine: Engine, callbacks: CommandCallbacks) -> None:
    statements = Statements(engine)
    _cached_at_one(callbacks, 13)
    _commit(callbacks, Remove(callbacks, 13), 2)
    assert _read(engine, 13) is None
    after = Add(callbacks, 13)
    assert statements.during(lambda: _attempt(after)) == 0
    assert after.seen == [None]


def test_rows_of_a_model_the_database_may_change_are_never_cached(
    engine: Engine, callbacks: CommandCallbacks
) -> None:
    statements = Statements(engine)
    pid = 3 % NUM_PARTITIONS
    callbacks.get_client_high_water_mark(pid)
    _commit(callbacks, Reprice(callbacks, 3), 0)
    _commit(callbacks, Reprice(callbacks, 3), 1)
    assert statements.during(lambda: _attempt(Reprice(callbacks, 3))) > 0


def test_the_cache_is_off_when_an_apply_override_may_write_entity_rows(engine: Engine) -> None:
    class Stamping(ChangeSetCallbacks):
        def apply_change(self, change: RowChange, session: Session, transaction: Transaction) -> None:
            super().apply_change(change, session, transaction)

    registry = EntityRegistry.from_base(Base)
    assert Stamping(engine, cluster_name="cache", registry=registry).entity_cache is None
    assert (
        Stamping(engine, cluster_name="cache", registry=registry, entity_cache=True).entity_cache is not None
    )
    assert _callbacks(engine, entity_cache=False).entity_cache is None
    assert _callbacks(engine).entity_cache is not None


class Money(TypeDecorator[int]):
    impl = Numeric
    cache_ok = True


class LocalBase(DeclarativeBase):
    pass


class ByName(LocalBase):
    __tablename__ = "cache_by_name"
    __waltz__ = WaltzEntity("cache.by_name")
    name: Mapped[str] = mapped_column(String(20), primary_key=True)
    value: Mapped[int] = mapped_column(default=0)


class Collated(LocalBase):
    """A text key with a collation of its own, which may equate two spellings: never kept."""

    __tablename__ = "cache_collated"
    __waltz__ = WaltzEntity("cache.collated")
    name: Mapped[str] = mapped_column(String(20, collation="NOCASE"), primary_key=True)


class ExactlyNamed(LocalBase):
    """A text key compared byte for byte on every backend: kept wherever it runs."""

    __tablename__ = "cache_exactly_named"
    __waltz__ = WaltzEntity("cache.exactly_named")
    name: Mapped[str] = mapped_column(ExactText(20), primary_key=True)
    value: Mapped[int] = mapped_column(default=0)


class Decorated(LocalBase):
    __tablename__ = "cache_decorated"
    __waltz__ = WaltzEntity("cache.decorated")
    item_id: Mapped[int] = mapped_column(primary_key=True)
    amount: Mapped[int] = mapped_column(Money)


class Stamped(LocalBase):
    __tablename__ = "cache_stamped"
    __waltz__ = WaltzEntity("cache.stamped")
    item_id: Mapped[int] = mapped_column(primary_key=True)
    version: Mapped[int] = mapped_column(default=0, onupdate=lambda: 1)


class Undeclared(LocalBase):
    """A model without ``__waltz__``."""

    __tablename__ = "cache_undeclared"
    item_id: Mapped[int] = mapped_column(primary_key=True)


def test_which_models_are_kept() -> None:
    registry = EntityRegistry([Tally, Priced])
    assert column_kinds(registry.info(Tally)) == (
        (int, None, False),
        (int, None, False),
        (str, 20, False),
        (bool, None, False),
    )
    assert column_kinds(registry.info(Priced)) is None  # Numeric: the database may round
    others = EntityRegistry([ByName, Decorated, Stamped])
    assert column_kinds(others.info(ByName)) is None  # a text key: collations may equate two spellings
    # where the database compares strings exactly, a text key without a collation of its own is kept
    assert column_kinds(others.info(ByName), exact_string_keys=True) == ((str, 20, False), (int, None, False))
    assert column_kinds(EntityRegistry([Collated]).info(Collated), exact_string_keys=True) is None
    exact = EntityRegistry([ExactlyNamed]).info(ExactlyNamed)  # on MariaDB too
    assert (
        column_kinds(exact)
        == column_kinds(exact, exact_string_keys=True)
        == ((str, 20, False), (int, None, False))
    )
    assert column_kinds(others.info(Decorated)) is None  # an application's own type
    assert column_kinds(others.info(Stamped)) is None  # a value set on update, not in the change-set


def test_values_not_stored_as_given_are_not_kept() -> None:
    registry = EntityRegistry([Tally])
    info: EntityInfo = registry.info(Tally)
    cache = EntityCache(registry)
    cache.floor(1, 10)
    key = (info, (1,))
    cache.fill(1, 10, [(key, (1, "5", "", True))])  # a string for an integer column
    cache.fill(1, 10, [((info, (5,)), (5, 1, "x" * 21, True))])  # longer than String(20)
    cache.fill(1, 10, [((info, (9,)), (9, True, "", True))])  # a bool for an integer column
    assert cache.view(1, [key]) is None
    assert cache.view(1, [(info, (5,))]) is None and cache.view(1, [(info, (9,))]) is None
    cache.fill(1, 9, [(key, (1, 5, "", True))])  # read at another mark: not kept
    assert cache.view(1, [key]) is None
    cache.fill(1, 10, [(key, (1, 5, "", True))])
    assert cache.view(1, [key]) == (10, {key: (1, 5, "", True)})
    cache.floor(1, 10)  # already there: the rows stay
    assert cache.view(1, [key]) is not None
    cache.floor(1, 11)
    assert cache.view(1, [key]) is None


def _payload_transaction(context: EntityTransactionContext, transaction_id: int) -> Transaction:
    """An attempt of ``context`` as committed transaction ``transaction_id`` (not applied)."""
    payload = _attempt(context).build()
    pid = context.chosen_partition
    return Transaction(
        pid, transaction_id, ReqId(9, 1, pid, transaction_id), payload.header, None, payload.data
    )


def _absorbed_after_two(callbacks: CommandCallbacks, tally_id: int) -> Transaction:
    """Tally ``tally_id`` at 2 (:func:`_cached_at_one`), and transaction 2 of its partition adding
    5 to it absorbed, not applied: that one."""
    _cached_at_one(callbacks, tally_id)
    absorbed = _payload_transaction(Add(callbacks, tally_id, amount=5), 2)
    callbacks.absorb_transactions([absorbed])
    return absorbed


def test_an_absorbed_transaction_is_read_before_it_is_applied(
    engine: Engine, callbacks: CommandCallbacks
) -> None:
    """The client hands a batch to ``absorb_transactions`` before applying it: attempts read
    the absorbed rows at once, at the absorbed transaction's ID, while the database is behind."""
    assert callbacks.absorbs_transactions
    absorbed = _absorbed_after_two(callbacks, 17)  # tally 17 = 2 cached at 1, then + 5 absorbed
    assert _read(engine, 17) == 2  # not applied yet
    ahead = Add(callbacks, 17)
    assert _attempt(ahead).build().client_high_water_mark == 2 and ahead.seen == [7]
    callbacks.apply_transaction(absorbed)  # the apply that follows leaves the cache as it is
    assert _read(engine, 17) == 7
    after = Add(callbacks, 17)
    assert _attempt(after).build().client_high_water_mark == 2 and after.seen == [7]


class AddBoth(EntityTransactionContext):
    """Adds one to each of two tallies of one partition (inserting them at 1); notes what each
    attempt saw."""

    def __init__(self, callbacks: ChangeSetCallbacks, *tally_ids: int):
        super().__init__(callbacks, *((Tally, tally_id) for tally_id in tally_ids))
        self.tally_ids = tally_ids
        self.seen: list[int | None] = []

    def run(self, tx: EntityTransaction) -> bool:
        for tally_id in self.tally_ids:
            tally = tx.get(Tally, tally_id)
            self.seen.append(None if tally is None else tally.value)
            _add_to(tx, tally, tally_id, 1)
        return True


def _ahead_of_the_database(callbacks: CommandCallbacks) -> tuple[int, Transaction]:
    """Partition 2 with tally 10 = 1 in the database but not in the cache (the cache starts
    after its transaction), tally 2 = 1 applied and cached, and a transaction making tally 2 = 2
    absorbed (the cache at 2) but not applied (the database at 1): ``(partition, that one)``."""
    pid = 2 % NUM_PARTITIONS
    callbacks.get_client_high_water_mark(pid)
    _commit(callbacks, Add(callbacks, 10), 0)
    _commit(callbacks, Add(callbacks, 2), 1)
    absorbed = _payload_transaction(Add(callbacks, 2), 2)
    callbacks.absorb_transactions([absorbed])
    return pid, absorbed


def test_a_database_read_behind_the_cache_takes_the_rows_at_its_position_without_waiting(
    engine: Engine, callbacks: CommandCallbacks
) -> None:
    """An attempt that must read the database while the cache is ahead of it (absorbed, not yet
    applied) takes the cache's rows where it has them and the database's where it has none
    (nothing absorbed since changed those): the state at the cache's position, with no wait for
    this instance's applies (here the absorbed transaction is not applied at all meanwhile)."""
    pid, absorbed = _ahead_of_the_database(callbacks)
    info = callbacks.registry.info(Tally)
    cache = callbacks.entity_cache
    assert cache is not None and cache.view(pid, [(info, (10,))]) is None
    both = AddBoth(callbacks, 2, 10)
    assert _attempt(both).build().client_high_water_mark == 2  # the database's mark is 1
    assert both.seen == [2, 1]  # tally 2 as absorbed, tally 10 as read (still its row at 2)
    assert _read(engine, 2) == 1
    assert cache.view(pid, [(info, (10,))]) == (2, {(info, (10,)): (10, 1, "", True)})  # now kept
    callbacks.apply_transaction(absorbed)
    assert _read(engine, 2) == 2


class AddAfterReading(Add):
    """Adds to a cached tally after reading others, not declared, by key (``tx.get``, then
    ``tx.get_many``)."""

    def __init__(self, callbacks: ChangeSetCallbacks, tally_id: int, read: int, read_many: list[int]):
        super().__init__(callbacks, tally_id)
        self.read, self.read_many = read, read_many

    def run(self, tx: EntityTransaction) -> bool:
        for tally in (tx.get(Tally, self.read), *tx.get_many(Tally, self.read_many).values()):
            self.seen.append(None if tally is None else tally.value)
        return super().run(tx)


def test_entities_read_by_key_behind_the_cache_are_read_at_its_position_without_waiting(
    engine: Engine, callbacks: CommandCallbacks
) -> None:
    """An attempt answered by the cache that then reads other entities by key, while the cache is
    ahead of the database, reads them at the cache's position: no wait for the applies (the
    absorbed transaction is not applied meanwhile), and the mark it sends stays the position."""
    pid, absorbed = _ahead_of_the_database(callbacks)
    statements = Statements(engine)
    reading = AddAfterReading(callbacks, 2, read=10, read_many=[18, 22])
    built: list[TransactionBuilder] = []
    assert statements.during(lambda: built.append(_attempt(reading))) > 0  # tally 2 cached, not 10
    assert built[0].build().client_high_water_mark == 2  # the database's mark is 1
    assert reading.seen == [1, None, None, 2]
    info = callbacks.registry.info(Tally)
    cache = callbacks.entity_cache
    assert cache is not None and cache.view(pid, [(info, (10,)), (info, (18,))]) == (
        2,
        {(info, (10,)): (10, 1, "", True), (info, (18,)): None},
    )
    again = AddAfterReading(callbacks, 2, read=10, read_many=[18, 22])
    assert statements.during(lambda: _attempt(again)) == 0  # now all of them are kept
    assert again.seen == [1, None, None, 2]
    callbacks.apply_transaction(absorbed)
    assert _read(engine, 2) == 2


def test_a_read_by_an_unhashable_key_after_a_hit_is_left_to_the_database(callbacks: CommandCallbacks) -> None:
    cache = callbacks.entity_cache
    assert cache is not None
    cache.floor(1, 5)
    snapshot = CachedSnapshot(callbacks, cache, 1, 5, {})
    assert snapshot.rows_at_position([(callbacks.registry.info(Tally), (bytearray(b"1"),))]) is None


def test_a_database_read_waits_for_the_applies_when_the_cache_cannot_vouch_for_its_rows(
    engine: Engine, callbacks: CommandCallbacks
) -> None:
    """Where the cache cannot tell that the rows read are still the rows at its position (it was
    emptied after the database's mark, here by an absorbed command-style transaction), the attempt
    waits for this instance's apply, so it never reads an older state than the cache's."""
    pid = _cached_at_one(callbacks, 14)  # tally 14 = 2, held at 1
    command = Transaction(pid, 2, ReqId(9, 1, pid, 2), COMMAND_HEADER, None, b"14=40")
    callbacks.absorb_transactions([command])
    timer = threading.Timer(0.3, callbacks.apply_transaction, (command,))
    timer.start()
    try:
        after = Add(callbacks, 14)
        assert _attempt(after).build().client_high_water_mark == 2  # read after the apply
        assert after.seen == [40]
    finally:
        timer.join()


def test_the_cache_vouches_only_for_rows_no_absorbed_change_left_unknown() -> None:
    """:meth:`EntityCache.overlay` answers for rows read at a mark between where the rows were
    last emptied and the position; a change that did not leave a whole row makes that row
    unknown (a database read of it waits for the applies) until a read at the position."""
    registry = EntityRegistry([Tally])
    info: EntityInfo = registry.info(Tally)
    cache = EntityCache(registry)
    five, seven = (info, (5,)), (info, (7,))
    assert cache.overlay(1, 9, [(seven, (7, 3, "", True))]) is None  # not started
    cache.floor(1, 10)
    partial = RowChange(Operation.UPDATE, info.name, {"tally_id": 5}, {"value": 6})
    cache.absorb(1, 11, [ChangeSet([partial])])
    assert cache.position(1) == 11
    assert cache.overlay(1, 9, [(seven, (7, 3, "", True))]) is None  # below where the rows start
    assert cache.overlay(1, 11, [(seven, (7, 3, "", True))]) is None  # not behind the position
    assert cache.overlay(1, 10, [(five, (5, 1, "", True))]) is None  # changed since, row unknown
    assert cache.view(1, [five]) is None and cache.lookup(1, five, 11) is MISSING
    assert cache.overlay(1, 10, [(seven, (7, 3, "", True))]) == (11, {seven: (7, 3, "", True)})
    assert cache.view(1, [seven]) == (11, {seven: (7, 3, "", True)})  # kept
    cache.fill(1, 11, [(five, (5, 6, "", True))])  # read at the position: known again
    assert cache.view(1, [five]) == (11, {five: (5, 6, "", True)})
    assert cache.kept([five, seven]) and not cache.kept([]) and not cache.kept([(info, ("5",))])


def test_a_failed_apply_drops_the_absorbed_rows(engine: Engine, callbacks: CommandCallbacks) -> None:
    _cached_at_one(callbacks, 21)
    absorbed = _payload_transaction(Add(callbacks, 21), 2)
    callbacks.absorb_transactions([absorbed])
    with engine.begin() as conn:  # the row disappears behind the log's back: the update finds none
        conn.execute(delete(Tally).where(Tally.tally_id == 21))
    with pytest.raises(ChangeSetApplyError):
        callbacks.apply_transaction(absorbed)
    statements = Statements(engine)
    after = Add(callbacks, 21)
    assert statements.during(lambda: _attempt(after)) > 0  # the rows were dropped: read again
    assert after.seen == [None]


def test_a_floor_starts_the_cache_again_at_the_mark(callbacks: CommandCallbacks) -> None:
    pid = _cached_at_one(callbacks, 25)
    cache = callbacks.entity_cache
    assert cache is not None and cache.position(pid) == 1
    callbacks.absorb_floor(pid, 0)  # behind the position: nothing changes
    assert cache.position(pid) == 1 and cache.view(pid, [(callbacks.registry.info(Tally), (25,))]) is not None
    callbacks.absorb_floor(pid, 9)
    assert cache.position(pid) == 9 and cache.view(pid, [(callbacks.registry.info(Tally), (25,))]) is None


def test_a_key_given_as_another_type_is_never_cached(engine: Engine, callbacks: CommandCallbacks) -> None:
    """``"29"`` names tally 29's row in the database but another entry (and another lock) in the
    cache: such reads go to the database, and such a change empties the partition's rows."""
    pid = _cached_at_one(callbacks, 29)  # cached: tally 29 = 2
    info = callbacks.registry.info(Tally)
    cache = callbacks.entity_cache
    assert cache is not None and cache.view(pid, [(info, (29,))]) is not None
    statements = Statements(engine)
    texted = Add(callbacks, "29")  # type: ignore[arg-type]
    assert statements.during(lambda: _attempt(texted)) > 0 and texted.seen == [2]
    assert cache.view(pid, [(info, ("29",))]) is None  # not kept under the text key
    # A change-set naming the row by the text key (the database matches it to 29): the cache
    # cannot tell which entry it changed, so it keeps none.
    change = RowChange(
        Operation.UPDATE,
        info.name,
        {"tally_id": "29"},
        {"tally_id": "29", "value": 50, "label": "", "open": True},
    )
    cache.absorb(pid, 2, [ChangeSet([change])])
    assert cache.position(pid) == 2 and cache.view(pid, [(info, (29,))]) is None


# --- reads outside a transaction (docs/design/sql.md "Reading entities outside a transaction") ---


def _read_entities(
    callbacks: ChangeSetCallbacks, entities: list[tuple[type[Any], Any]], **kwargs: Any
) -> EntityRead:
    return callbacks.read_entities(entities, num_partitions=NUM_PARTITIONS, **kwargs)


def _values(read: EntityRead) -> list[int | None]:
    return [None if entity is None else entity.value for entity in read.entities]


def test_entities_read_outside_a_transaction_come_from_the_cache_with_no_statement(
    engine: Engine, callbacks: CommandCallbacks
) -> None:
    """The cache answers with its rows at its position, an absorbed transaction not yet applied
    included; ``after`` within that position changes nothing, and an entity it does not hold is
    read from the database (with the mark, in one snapshot) and kept."""
    pid = 33 % NUM_PARTITIONS
    absorbed = _absorbed_after_two(callbacks, 33)  # tally 33 = 2 cached at 1, then + 5 absorbed
    cache = callbacks.entity_cache
    assert cache is not None
    counted = (cache.hits, cache.misses)
    statements = Statements(engine)
    reads: list[EntityRead] = []
    assert statements.during(lambda: reads.append(_read_entities(callbacks, [(Tally, 33)], after=2))) == 0
    assert reads[0] == EntityRead(pid, 2, reads[0].entities, True) and _values(reads[0]) == [7]
    assert _read(engine, 33) == 2  # not applied yet
    both = _read_entities(callbacks, [(Tally, {"tally_id": 37}), (Tally, (33,))])
    assert not both.from_cache and both.high_water_mark == 2 and _values(both) == [None, 7]
    again = _read_entities(callbacks, [(Tally, 37), (Tally, 33)])
    assert again.from_cache and _values(again) == [None, 7]  # tally 37's missing row kept
    callbacks.apply_transaction(absorbed)
    assert _values(_read_entities(callbacks, [(Tally, 33)])) == [7]
    assert (cache.hits, cache.misses) == counted  # reads are not attempts: not counted


def test_entities_read_outside_a_transaction_behind_the_cache_are_at_its_position_without_waiting(
    engine: Engine, callbacks: CommandCallbacks
) -> None:
    """A read the cache cannot answer alone while it is ahead of the database takes the cache's
    rows where it has them and the database's where not: the state at its position, without
    waiting for the applies (the absorbed transaction is never applied here)."""
    pid, absorbed = _ahead_of_the_database(callbacks)
    read = _read_entities(callbacks, [(Tally, 2), (Tally, 10)], timeout=1.0)
    assert read.partition_id == pid and read.high_water_mark == 2  # the database's mark is 1
    assert not read.from_cache
    assert _values(read) == [2, 1]
    # Including transaction 2, absorbed here and never applied: the read at 2 already has it.
    assert _values(_read_entities(callbacks, [(Tally, 2), (Tally, 14)], after=2, timeout=1.0)) == [2, None]
    # More entities than the mark's statement joins: the others are read by key in the same
    # snapshot, and the cache vouches for all of them at its position.
    many = [2, 10, *range(18, 18 + 4 * 40, 4)]
    read = _read_entities(callbacks, [(Tally, tally_id) for tally_id in many], timeout=1.0)
    assert read.high_water_mark == 2 and _values(read) == [2, 1] + [None] * 40
    assert _read(engine, 2) == 1
    callbacks.apply_transaction(absorbed)


def test_entities_read_outside_a_transaction_wait_for_the_applies_when_the_cache_cannot_vouch(
    callbacks: CommandCallbacks,
) -> None:
    """Rows the cache cannot vouch for at its position (emptied by an absorbed command-style
    transaction) are read again once this instance applied up to it: never an older state."""
    pid = _cached_at_one(callbacks, 30)
    command = Transaction(pid, 2, ReqId(9, 1, pid, 2), COMMAND_HEADER, None, b"30=40")
    callbacks.absorb_transactions([command])
    timer = threading.Timer(0.3, callbacks.apply_transaction, (command,))
    timer.start()
    try:
        read = _read_entities(callbacks, [(Tally, 30)])
    finally:
        timer.join()
    assert read.high_water_mark == 2 and _values(read) == [40]


def test_entities_read_outside_a_transaction_with_one_the_cache_does_not_keep_wait_for_the_applies(
    engine: Engine, callbacks: CommandCallbacks
) -> None:
    """A read that includes an entity of a model the cache never keeps reads the database, after
    this instance's applies reached the cache's position: not an older state of an entity than
    the cache already gave (here tally 30 = 3, absorbed, then applied 0.3 s later)."""
    pid = 30 % NUM_PARTITIONS
    callbacks.get_client_high_water_mark(pid)
    _commit(callbacks, Reprice(callbacks, 42), 0)
    _commit(callbacks, Add(callbacks, 30), 1)
    absorbed = _payload_transaction(Add(callbacks, 30, amount=2), 2)
    callbacks.absorb_transactions([absorbed])
    assert _values(_read_entities(callbacks, [(Tally, 30)])) == [3]  # from the cache, at 2
    timer = threading.Timer(0.3, callbacks.apply_transaction, (absorbed,))
    timer.start()
    try:
        read = _read_entities(callbacks, [(Tally, 30), (Priced, 42)])
    finally:
        timer.join()
    assert read.high_water_mark == 2 and not read.from_cache
    assert read.entities[0].value == 3 and read.entities[1].price == decimal.Decimal("1.50")
    assert _read(engine, 30) == 3


def test_a_partition_no_longer_followed_is_read_from_the_database(
    engine: Engine, callbacks: CommandCallbacks
) -> None:
    """Once the client stops following a partition (unmount, close), the cache forgets it: its
    rows would fall behind the log. Reads go to the database until a mount starts it again."""
    pid = 33 % NUM_PARTITIONS
    absorbed = _absorbed_after_two(callbacks, 33)
    callbacks.apply_transaction(absorbed)
    assert _read_entities(callbacks, [(Tally, 33)]).from_cache
    callbacks.absorb_stopped(pid)
    cache = callbacks.entity_cache
    assert cache is not None and cache.position(pid) is None
    with engine.begin() as conn:  # e.g. another instance's apply, never absorbed here
        conn.execute(update(Tally).where(Tally.tally_id == 33).values(value=70))
    read = _read_entities(callbacks, [(Tally, 33)])
    assert not read.from_cache and _values(read) == [70]
    callbacks.absorb_floor(pid, 2)  # a mount found the partition applied up to 2
    assert cache.position(pid) == 2 and not _read_entities(callbacks, [(Tally, 33)]).from_cache
    assert _read_entities(callbacks, [(Tally, 33)]).from_cache  # kept by the read at the position


def test_an_entity_read_after_a_transaction_not_applied_in_time_raises(callbacks: CommandCallbacks) -> None:
    pid = 34 % NUM_PARTITIONS
    callbacks.get_client_high_water_mark(pid)
    _commit(callbacks, Add(callbacks, 34), 0)
    with pytest.raises(TimeoutError, match=r"transaction 5 of partition 2 was not applied within 0\.2s"):
        _read_entities(callbacks, [(Tally, 34)], after=5, timeout=0.2)
    assert _values(_read_entities(callbacks, [(Tally, 34)], after=0, timeout=0.2)) == [1]


def test_an_entity_read_after_a_transaction_on_its_partition_s_apply_thread_raises_at_once(
    callbacks: CommandCallbacks,
) -> None:
    # The apply thread would wait for its own apply: a clear error, not a stall of the timeout.
    pid = 34 % NUM_PARTITIONS
    callbacks.get_client_high_water_mark(pid)
    _commit(callbacks, Add(callbacks, 34), 0)
    outcomes: list[BaseException | int | None] = []

    def read() -> None:
        try:
            outcomes.append(_values(_read_entities(callbacks, [(Tally, 34)], after=5, timeout=30.0))[0])
        except BaseException as error:
            outcomes.append(error)

    for name in (f"{APPLY_THREAD_PREFIX}{pid}", f"{APPLY_THREAD_PREFIX}{pid + 1}"):
        thread = threading.Thread(target=read, name=name)
        thread.start()
        if name.endswith(str(pid + 1)):  # another partition's apply thread may wait: apply 5 for it
            for transaction_id in range(1, 6):
                _commit(callbacks, Add(callbacks, 34), transaction_id)
        thread.join(10)
        assert not thread.is_alive()
    assert isinstance(outcomes[0], RuntimeError)
    assert f"partition {pid}'s apply thread, which would wait for its own apply" in str(outcomes[0])
    assert outcomes[1] == 6


def test_entities_read_outside_a_transaction_without_the_cache_come_from_the_database(
    engine: Engine,
) -> None:
    """With the cache off, and for models it never keeps, a read is one database snapshot at the
    mark; bad requests say what is wrong."""
    plain = _callbacks(engine, entity_cache=False)
    pid = 38 % NUM_PARTITIONS
    plain.get_client_high_water_mark(pid)
    _commit(plain, Add(plain, 38), 0)
    _commit(plain, Reprice(plain, 42), 1)
    read = _read_entities(plain, [(Tally, 38), (Priced, 42), (Tally, 46)])
    assert read.high_water_mark == 1 and not read.from_cache
    tally, priced, missing = read.entities
    assert tally.value == 1 and priced.price == decimal.Decimal("1.50") and missing is None
    cached = _callbacks(engine)
    cached.get_client_high_water_mark(pid)
    assert not _read_entities(cached, [(Priced, 42)]).from_cache
    assert not _read_entities(cached, [(Priced, 42)]).from_cache  # never kept
    with pytest.raises(ValueError, match="at least one"):
        _read_entities(plain, [])
    with pytest.raises(ValueError, match="expected 1 value"):
        _read_entities(plain, [(Tally, (38, 1))])
    with pytest.raises(UnknownEntityError):
        _read_entities(plain, [(Undeclared, 1)])
    with pytest.raises(CrossPartitionError, match=r"on partitions \[2, 3\]"):
        _read_entities(plain, [(Tally, 38), (Tally, 39)])


def test_a_key_carried_by_an_absorbed_change_set_is_found_without_waiting_for_its_apply(
    engine: Engine, callbacks: CommandCallbacks
) -> None:
    """A request's key carried by a change-set this instance absorbed but has not applied yet is
    found already applied from the cache's state, with no wait for the apply; a key absorbed
    before the database's mark is the database's to tell (docs/design/sql.md "Idempotency keys")."""
    pid = _cached_at_one(callbacks, 33)  # tally 33 = 2, cached at 1; tally 37 in the same partition
    cache = callbacks.entity_cache
    assert cache is not None
    _commit(callbacks, Add(callbacks, 37), 2)  # tally 37 cached too
    first = _payload_transaction(Keyed(callbacks, 33, key="order-1"), 3)
    callbacks.absorb_transactions([first])  # absorbed, not applied
    assert cache.keys_carried(pid, ["order-1", "order-2"], after=2) == {"order-1": 3}
    assert cache.keys_carried(pid, ["order-1"], after=3) == {}  # at or before the mark: the database's
    again = Keyed(callbacks, 37, key="order-1")
    again.checks_idempotency_key = True
    statements = Statements(engine)
    builder = TransactionBuilder(-1)
    again.partition_id(NUM_PARTITIONS)
    assert statements.during(lambda: again.execute(builder)) > 0  # one snapshot: the mark and the key
    assert builder.dropped_outcome(pid).already_applied
    assert builder.dropped_outcome(pid).transaction_id == 3
    assert callbacks.high_water_marks()[pid] == 2, "the attempt waited for the apply"
    callbacks.apply_transaction(first)
    assert _read(engine, 33) == 3
    cache.drop_rows(pid)  # emptied (a failed apply, say): the cache no longer vouches for its keys
    assert cache.keys_carried(pid, ["order-1"], after=2) is None
