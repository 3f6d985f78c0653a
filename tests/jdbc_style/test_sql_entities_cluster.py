"""Entity transactions against a real cluster: two instances (clients) share one database.

Each instance is a :class:`~waltz.WaltzClient` with its own
:class:`~waltz.jdbc_style.ChangeSetCallbacks` and engine on the same database, as two processes of
one service would be. Read-modify-write contexts (:class:`~waltz.jdbc_style.EntityTransactionContext`)
must lose no update under contention (the lock check refuses stale attempts, which are retried),
must stay within one partition, and a request carrying an idempotency key must change the database
once however often it is committed.

The session's log is shared with other tests, and each database starts fresh (marks at -1), so it
applies their transactions too: :class:`SharedLogCallbacks` ignores what is not this module's. A
service (its database and two instances) is shared by the module's tests of the same database kind
and entity cache setting (``shared_service``); each test works on counters of its own.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import decimal
import pathlib
import random
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import support
from sqlalchemy import BigInteger, Engine, Numeric, select, text, update
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from waltz import Outcome, Transaction, WaltzClient, WaltzClientConfig
from waltz.errors import ClientClosedError, CrossPartitionError, ReadOnlySessionError
from waltz.jdbc_style import (
    AppliedRequest,
    ChangeSet,
    ChangeSetCallbacks,
    EntityRegistry,
    EntityTransaction,
    EntityTransactionContext,
    RowChange,
    WaltzEntity,
    create_framework_engine,
)
from waltz.jdbc_style.entity_batches import EntityBatcher
from waltz.jdbc_style.migrations_api import upgrade
from waltz.local.cluster import LocalCluster
from waltz.local.processes import wait_until

#: Seconds a test waits for one outcome (a future, a mark).
TIMEOUT = 60


class Base(DeclarativeBase):
    pass


class ClusterCounter(Base):
    """A counter; its lock ID is its key, so its partition is a stable hash of the key."""

    __tablename__ = "cluster_counters"
    __waltz__ = WaltzEntity("cluster_counter")

    counter_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    value: Mapped[int] = mapped_column(BigInteger, nullable=False)


class Ghost(Base):
    """A model whose table a test drops: reading it fails in the database."""

    __tablename__ = "cluster_ghosts"
    __waltz__ = WaltzEntity("cluster_ghost")

    ghost_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)


class Priced(Base):
    """A Numeric column: the database rounds what it is given to two places."""

    __tablename__ = "cluster_priced"
    __waltz__ = WaltzEntity("cluster_priced")

    priced_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    price: Mapped[decimal.Decimal] = mapped_column(Numeric(10, 2), nullable=False)


class SharedLogCallbacks(ChangeSetCallbacks):
    """Change-set callbacks for a database following the session's shared log.

    Command-style transactions and changes of entities this module does not declare were written
    by other tests: they are passed over (the mark still moves past them).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: (partition, transaction) -> bytes of the log transaction's data, for each this applied
        self.data_bytes: dict[tuple[int, int], int] = {}

    def apply_command(self, transaction: Transaction, session: Session) -> None:
        return None

    def apply_change_set(self, change_set: ChangeSet, transaction: Transaction, session: Session) -> None:
        key = (transaction.partition_id, transaction.transaction_id)
        self.data_bytes[key] = len(transaction.get_raw_data())
        super().apply_change_set(change_set, transaction, session)

    def apply_change(self, change: RowChange, session: Session, transaction: Transaction) -> None:
        if change.entity in {info.name for info in self.registry}:
            super().apply_change(change, session, transaction)


class CreateCounter(EntityTransactionContext):
    """Inserts a counter at 0 (dropped if it exists)."""

    def __init__(self, callbacks: ChangeSetCallbacks, counter_id: int) -> None:
        super().__init__(callbacks, (ClusterCounter, counter_id))
        self.counter_id = counter_id

    def run(self, tx: EntityTransaction) -> bool:
        if tx.get(ClusterCounter, self.counter_id) is not None:
            return False
        tx.insert(ClusterCounter, counter_id=self.counter_id, value=0)
        return True


class Increment(EntityTransactionContext):
    """Reads a counter and writes ``value + by``; counts its lock failures.

    Args:
        request_key: the request's idempotency key, or None.
    """

    def __init__(
        self, callbacks: ChangeSetCallbacks, counter_id: int, by: int = 1, request_key: str | None = None
    ) -> None:
        super().__init__(callbacks, (ClusterCounter, counter_id))
        self.counter_id = counter_id
        self.by = by
        self.request_key = request_key
        self.lock_failures = 0

    def run(self, tx: EntityTransaction) -> bool:
        counter = tx.get(ClusterCounter, self.counter_id)
        if counter is None:
            raise LookupError(f"counter {self.counter_id} does not exist at mark {tx.high_water_mark}")
        tx.idempotency_key = self.request_key
        tx.update(counter, value=counter.value + self.by)
        return True

    def on_lock_failure(self) -> None:
        self.lock_failures += 1


class TwoCounters(EntityTransactionContext):
    """Declares two counters (a transfer between them); increments both."""

    def __init__(self, callbacks: ChangeSetCallbacks, first: int, second: int) -> None:
        super().__init__(callbacks, (ClusterCounter, first), (ClusterCounter, second))
        self.ids = (first, second)

    def run(self, tx: EntityTransaction) -> bool:
        for counter_id in self.ids:
            counter = tx.get(ClusterCounter, counter_id)
            if counter is not None:
                tx.update(counter, value=counter.value + 1)
        return True


class ReadsAnother(EntityTransactionContext):
    """Declares counter ``declared`` but reads counter ``other`` in ``run``."""

    def __init__(self, callbacks: ChangeSetCallbacks, declared: int, other: int) -> None:
        super().__init__(callbacks, (ClusterCounter, declared))
        self.other = other
        self.exceptions: list[BaseException] = []

    def run(self, tx: EntityTransaction) -> bool:
        tx.get(ClusterCounter, self.other)
        return True

    def on_exception(self, exception: BaseException) -> None:
        self.exceptions.append(exception)


class WritesThroughTheSession(EntityTransactionContext):
    """Reads a counter, then writes through ``tx.session`` as ``how`` says (or only queries it,
    ``"query"``), and returns True as if the write were the transaction's."""

    def __init__(self, callbacks: ChangeSetCallbacks, counter_id: int, how: str) -> None:
        super().__init__(callbacks, (ClusterCounter, counter_id))
        self.counter_id = counter_id
        self.how = how

    def run(self, tx: EntityTransaction) -> bool:
        counter = tx.get(ClusterCounter, self.counter_id)
        assert counter is not None
        session = tx.session
        where = ClusterCounter.counter_id == self.counter_id
        if self.how == "update statement":
            session.execute(update(ClusterCounter).where(where).values(value=ClusterCounter.value + 1))
        elif self.how == "textual statement":
            statement = text("UPDATE cluster_counters SET value = value + 1 WHERE counter_id = :c")
            session.execute(statement, {"c": self.counter_id})
        elif self.how == "added":
            session.add(ClusterCounter(counter_id=-self.counter_id, value=7))
        elif self.how == "loaded and changed":
            loaded = session.get(ClusterCounter, self.counter_id)
            assert loaded is not None
            loaded.value += 1
        elif self.how == "added, then a query":
            session.add(ClusterCounter(counter_id=-self.counter_id, value=7))
            session.execute(select(ClusterCounter.value).where(where)).scalar_one()
        elif self.how == "loaded, then tx.update":  # the change through tx: not a session write
            loaded = session.scalars(select(ClusterCounter).where(where)).one()
            tx.update(loaded, value=loaded.value + 1)
            # A query after it flushes nothing and reads the state at the mark, as every query does.
            read = session.execute(select(ClusterCounter.value).where(where)).scalar_one()
            assert read == loaded.value - 1
        else:  # a read through the session, and the change through tx
            value = session.execute(select(ClusterCounter.value).where(where)).scalar_one()
            tx.update(counter, value=value + 1)
        return True


@dataclass
class Instance:
    """One application instance: its engine, callbacks and client."""

    engine: Engine
    callbacks: SharedLogCallbacks
    client: WaltzClient


@dataclass
class Service:
    """Two instances of a service sharing one database."""

    first: Instance
    second: Instance
    num_partitions: int
    rng: random.Random
    #: (database kind, entity cache on) of a shared service; None for a test's own
    setting: tuple[str, bool] | None = None
    #: each instance's ``uncaught_count`` when the last test on the service ended
    checked_uncaught: tuple[int, int] = (0, 0)

    @property
    def instances(self) -> tuple[Instance, Instance]:
        return (self.first, self.second)

    def uncaught_counts(self) -> tuple[int, int]:
        """Each instance's count of exceptions its apply left uncaught, so far."""
        return (self.first.callbacks.uncaught_count, self.second.callbacks.uncaught_count)

    def uncaught(self) -> list[list[tuple[int, int, BaseException]]]:
        """Each instance's last uncaught exceptions: (partition, transaction ID, exception)."""
        return [list(instance.callbacks.uncaught) for instance in self.instances]

    def partition_of(self, counter_id: int) -> int:
        info = self.first.callbacks.registry.info(ClusterCounter)
        return info.partition_of((counter_id,), self.num_partitions)

    def new_counter_id(self, partition: int | None = None) -> int:
        """A counter ID no earlier test used (in ``partition`` if given)."""
        for _ in range(10_000):
            counter_id = self.rng.randrange(1, 1 << 62)
            if partition is None or self.partition_of(counter_id) == partition:
                return counter_id
        raise AssertionError(f"no counter ID maps to partition {partition} in 10,000 draws")

    def create_counter(self, partition: int | None = None) -> int:
        """Create a counter at 0 and wait until the database has it."""
        counter_id = self.new_counter_id(partition)
        instance = self.first
        transaction_id = (
            instance.client.submit(CreateCounter(instance.callbacks, counter_id))
            .result(TIMEOUT)
            .transaction_id
        )
        assert isinstance(transaction_id, int)
        pid = self.partition_of(counter_id)
        assert instance.callbacks.wait_for(pid, transaction_id, timeout=TIMEOUT), (
            f"the database did not apply partition {pid} transaction {transaction_id}"
        )
        return counter_id

    def counter_value(self, counter_id: int) -> int | None:
        with self.first.engine.connect() as conn:
            return conn.execute(
                select(ClusterCounter.value).where(ClusterCounter.counter_id == counter_id)
            ).scalar()

    def wait_caught_up(self) -> dict[int, int]:
        """Flush both clients, then wait until the database's marks equal the server's; returns them."""
        for instance in self.instances:
            instance.client.flush(TIMEOUT)
        server = {pid: self.first.client.get_high_water_mark(pid) for pid in range(self.num_partitions)}
        callbacks = self.first.callbacks

        def caught_up() -> bool:
            return callbacks.high_water_marks() == server

        wait_until(
            caught_up,
            timeout=TIMEOUT,
            what=f"the database's marks to reach the server's {server} (now {callbacks.high_water_marks()})",
        )
        return server


@pytest.fixture(scope="module", params=[True, False], ids=["entity-cache", "no-entity-cache"])
def entity_cache(request: pytest.FixtureRequest) -> bool:
    """Whether the instances keep the entity cache (their apply_change override only passes over
    other tests' entities, so the cache may be on)."""
    return bool(request.param)


@pytest.fixture(scope="module", params=["sqlite", "postgresql", "mariadb"])
def app_db(request: pytest.FixtureRequest) -> str:
    """The kind of the instances' database: ``sqlite``, ``postgresql`` or ``mariadb``."""
    return str(request.param)


@contextlib.contextmanager
def open_service(cluster: LocalCluster, url: str, entity_cache: bool, **settings: Any) -> Iterator[Service]:
    """Two instances (engine, ChangeSetCallbacks, client) on the database at ``url`` (the
    framework's tables upgraded, this module's created), mounted; closed afterwards. ``settings``:
    fields of the clients' ``WaltzClientConfig`` besides the cluster's."""
    setup = create_framework_engine(url)
    try:
        upgrade(setup)
        Base.metadata.create_all(setup)
    finally:
        setup.dispose()
    config = WaltzClientConfig(**{**cluster.client_settings(), "zookeeper_session_timeout": 10.0, **settings})
    cluster_name = f"entities-{support.unique_suffix()}"
    registry = EntityRegistry.from_base(Base)
    made: list[Instance] = []
    try:
        for _ in range(2):
            engine = create_framework_engine(url)
            try:
                callbacks = SharedLogCallbacks(
                    engine, cluster_name=cluster_name, registry=registry, entity_cache=entity_cache
                )
                client = WaltzClient(callbacks, config)
            except BaseException:
                engine.dispose()
                raise
            made.append(Instance(engine, callbacks, client))
        for instance in made:
            instance.client.wait_mounted(TIMEOUT)
        yield Service(made[0], made[1], made[0].client.num_partitions, random.Random())
    finally:
        for instance in made:
            instance.client.close()
            instance.engine.dispose()


#: The session fixture of each database server (checked reachable: skipped, or failed under CI).
SERVER_FIXTURES = {"postgresql": "postgres_server", "mariadb": "mariadb_server"}


@pytest.fixture(scope="module")
def shared_service(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    sql_cluster: LocalCluster,
    app_db: str,
    entity_cache: bool,
) -> Iterator[Service]:
    """The service of the module's tests of one database kind and entity cache setting, which
    pytest runs together: its setup (a database migrated, two clients mounted, the session's shared
    log applied from -1) costs seconds, and each test works on counters of its own. One is open at
    a time (every open one would apply every transaction); closed, and its database dropped, when
    the tests of the next setting start.

    A test that narrows ``app_db`` or ``entity_cache`` does so indirectly, at module scope
    (``parametrize(..., indirect=True, scope="module")``): a direct parameter would not reach this
    fixture, which would hand the test the service of another setting (``service`` checks)."""
    sql_cluster.heal(timeout=60)  # module fixtures come before the test's sql_cluster_ready
    with contextlib.ExitStack() as stack:
        if app_db == "sqlite":
            url = f"sqlite:///{tmp_path_factory.mktemp('entities') / 'app.db'}"
        else:
            server: support.DatabaseServer = request.getfixturevalue(SERVER_FIXTURES[app_db])
            url = stack.enter_context(server.fresh_database())
        shared = stack.enter_context(open_service(sql_cluster, url, entity_cache))
        shared.setting = (app_db, entity_cache)
        yield shared
        # An apply that failed after the last test on the service.
        assert shared.uncaught_counts() == shared.checked_uncaught, shared.uncaught()


@pytest.fixture
def service(
    sql_cluster_ready: LocalCluster, shared_service: Service, app_db: str, entity_cache: bool
) -> Iterator[Service]:
    """Two instances (engine, ChangeSetCallbacks, client) sharing one database (``shared_service``,
    of this test's setting), mounted again if the cluster was healed since the last test; no
    exception of an apply is left uncaught, during the test or since the last one on the service."""
    assert shared_service.setting == (app_db, entity_cache), (
        f"the test of {(app_db, entity_cache)} was handed the service of {shared_service.setting}"
    )
    for instance in shared_service.instances:
        instance.client.wait_mounted(TIMEOUT)
    before = shared_service.uncaught_counts()
    if before != shared_service.checked_uncaught:
        shared_service.checked_uncaught = before
        pytest.fail(f"an apply failed after the last test on this service: {shared_service.uncaught()}")
    yield shared_service
    after = shared_service.checked_uncaught = shared_service.uncaught_counts()
    assert after == before, shared_service.uncaught()


@pytest.fixture
def fresh_service(sql_cluster_ready: LocalCluster, app_db_url: str, entity_cache: bool) -> Iterator[Service]:
    """As ``service``, on a database of this test's own (for a test that changes its schema)."""
    with open_service(sql_cluster_ready, app_db_url, entity_cache) as made:
        yield made
        assert made.uncaught_counts() == (0, 0), made.uncaught()


def submit_increments(instance: Instance, counter_id: int, count: int) -> list[tuple[Increment, Any]]:
    """Submit ``count`` increments without waiting for their outcomes."""
    contexts = [Increment(instance.callbacks, counter_id) for _ in range(count)]
    return [(context, instance.client.submit(context)) for context in contexts]


def test_concurrent_increments_from_two_instances_lose_no_update(service: Service) -> None:
    counter_id = service.create_counter()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        jobs = [pool.submit(submit_increments, instance, counter_id, 50) for instance in service.instances]
        submitted = [pair for job in jobs for pair in job.result(TIMEOUT)]
    ids = [future.result(TIMEOUT).transaction_id for _, future in submitted]
    assert all(isinstance(i, int) for i in ids)
    assert len(set(ids)) == 100, "two increments were committed as one transaction ID"

    server = service.wait_caught_up()
    assert service.counter_value(counter_id) == 100, "an increment was lost"
    lock_failures = sum(context.lock_failures for context, _ in submitted)
    assert lock_failures > 0, "100 concurrent read-modify-writes of one counter never failed a lock check"
    for instance in service.instances:
        assert instance.callbacks.high_water_marks() == server
        assert instance.callbacks.uncaught_count == 0, list(instance.callbacks.uncaught)


def test_a_transaction_spanning_two_partitions_is_refused(service: Service) -> None:
    first = service.create_counter(partition=0)
    second = service.create_counter(partition=1)
    instance = service.first

    with pytest.raises(CrossPartitionError, match="spans 2 partitions"):
        instance.client.submit(TwoCounters(instance.callbacks, first, second))

    context = ReadsAnother(instance.callbacks, first, second)
    future = instance.client.submit(context)
    exception = future.exception(TIMEOUT)
    assert isinstance(exception, CrossPartitionError), exception
    assert context.exceptions == [exception]

    service.wait_caught_up()
    assert (service.counter_value(first), service.counter_value(second)) == (0, 0)


def test_a_write_through_tx_session_is_refused_and_nothing_is_appended(service: Service) -> None:
    """``tx.session`` reads the attempt's snapshot, which is rolled back: a write through it would
    be lost while the outcome said committed. Each kind of write fails the context with
    :class:`ReadOnlySessionError` and appends nothing; a query through it still works."""
    counter_id = service.create_counter()
    pid = service.partition_of(counter_id)
    instance = service.first
    before = instance.client.get_high_water_mark(pid)
    expected = {
        "update statement": "update statement executed on it",
        "textual statement": "textual statement UPDATE executed on it",
        "added": "objects never flushed: 1 added (ClusterCounter)",
        "loaded and changed": "objects never flushed: 1 changed (ClusterCounter)",
        "added, then a query": "objects to flush: 1 added (ClusterCounter)",
    }
    for how, words in expected.items():
        future = instance.client.submit(WritesThroughTheSession(instance.callbacks, counter_id, how))
        exception = future.exception(TIMEOUT)
        assert isinstance(exception, ReadOnlySessionError), (how, exception)
        assert words in str(exception) and "tx.insert, tx.update or tx.delete" in str(exception), how
    assert instance.client.get_high_water_mark(pid) == before, "a refused context was appended"
    for how in ("query", "loaded, then tx.update"):
        outcome = instance.client.submit(WritesThroughTheSession(instance.callbacks, counter_id, how))
        assert outcome.result(TIMEOUT).transaction_id is not None, how
    service.wait_caught_up()
    assert service.counter_value(counter_id) == 2


@pytest.mark.parametrize("entity_cache", [True], ids=["entity-cache"], indirect=True, scope="module")
def test_a_batch_member_that_writes_through_tx_session_fails_alone(service: Service) -> None:
    """The members of a batch's pass share its snapshot and its session: a member whose write
    through ``tx.session`` is refused leaves nothing there, and the members after it commit."""
    counter_id = service.create_counter()
    instance = service.first
    with EntityBatcher(instance.client) as batcher:
        gated = Gated(instance.callbacks, counter_id)
        first = batcher.submit(gated)  # alone: nothing in flight; the others queue behind it
        writer = batcher.submit(WritesThroughTheSession(instance.callbacks, counter_id, "added"))
        plain = [batcher.submit(Increment(instance.callbacks, counter_id)) for _ in range(2)]
        gated.gate.set()
        assert first.result(TIMEOUT).committed
        assert isinstance(writer.exception(TIMEOUT), ReadOnlySessionError)
        outcomes = [future.result(TIMEOUT) for future in plain]
    assert all(outcome.committed for outcome in outcomes), outcomes
    service.wait_caught_up()
    assert service.counter_value(counter_id) == 1 + 2


def test_a_request_committed_twice_changes_the_database_once(service: Service) -> None:
    counter_id = service.create_counter()
    pid = service.partition_of(counter_id)
    key = f"deposit-{uuid.uuid4()}"

    ids = []
    for instance in service.instances:  # a retry of the same request, from another instance
        context = Increment(instance.callbacks, counter_id, by=10, request_key=key)
        context.checks_idempotency_key = False  # as a copy still in flight: committed, then skipped
        ids.append(instance.client.submit(context).result(TIMEOUT).transaction_id)
    another = Increment(service.first.callbacks, counter_id, by=5, request_key=f"deposit-{uuid.uuid4()}")
    ids.append(service.first.client.submit(another).result(TIMEOUT).transaction_id)
    assert all(isinstance(i, int) for i in ids) and len(set(ids)) == 3, (
        f"expected three committed log transactions, got {ids}"
    )

    service.wait_caught_up()
    assert service.counter_value(counter_id) == 15, "the request was applied twice (or not at all)"
    assert service.first.callbacks.find_idempotency_key(key) == AppliedRequest(pid, ids[0])


@pytest.mark.parametrize("entity_cache", [True], ids=["entity-cache"], indirect=True, scope="module")
def test_a_key_the_keys_table_cannot_hold_is_refused_before_the_append(service: Service) -> None:
    """An idempotency key of more than 190 characters (or an empty one) fails its own submit with
    a ValueError and never reaches the log: alone with the key's read off or on (the entity cache
    on), and in a batch. In the log its apply would fail on every try and stop the partition."""
    counter_id = service.create_counter()
    pid = service.partition_of(counter_id)
    instance = service.first
    before = service.wait_caught_up()[pid]
    long_key = "k" * 191
    unchecked = Increment(instance.callbacks, counter_id, request_key=long_key)
    unchecked.checks_idempotency_key = False
    contexts = [
        unchecked,
        Increment(instance.callbacks, counter_id, request_key=long_key),
        Increment(instance.callbacks, counter_id, request_key=""),
    ]
    for context in contexts:
        exception = instance.client.submit(context).exception(TIMEOUT)
        assert isinstance(exception, ValueError) and "1..190 characters" in str(exception), exception
    with EntityBatcher(instance.client) as batcher:
        gated = Gated(instance.callbacks, counter_id)
        first = batcher.submit(gated)  # alone; the next ones queue behind it and go as a batch
        queued = [
            batcher.submit(Increment(instance.callbacks, counter_id, request_key=long_key)),
            batcher.submit(Increment(instance.callbacks, counter_id)),
        ]
        gated.gate.set()
        assert first.result(TIMEOUT).committed
        with pytest.raises(ValueError, match=r"1\.\.190 characters"):
            queued[0].result(TIMEOUT)
        assert queued[1].result(TIMEOUT).committed
    server = service.wait_caught_up()
    assert server[pid] == before + 2, f"a refused key reached the log: {before} -> {server[pid]}"
    assert service.counter_value(counter_id) == 2
    assert instance.callbacks.uncaught_count == 0, list(instance.callbacks.uncaught)


@pytest.mark.parametrize("entity_cache", [True], ids=["entity-cache"], indirect=True, scope="module")
def test_one_instance_s_hot_counter_reads_the_entity_cache_and_loses_no_update(service: Service) -> None:
    """One instance submitting on a counter: its attempts after the first read the entity cache
    (the rows its applies absorbed), contexts queued behind the counter's lock run once the
    transaction before them is absorbed, and no increment is lost."""
    counter_id = service.create_counter()
    instance = service.first
    cache = instance.callbacks.entity_cache
    assert cache is not None
    hits_before = cache.hits
    submitted = submit_increments(instance, counter_id, 100)
    ids = [future.result(TIMEOUT).transaction_id for _, future in submitted]
    assert len(set(ids)) == 100
    service.wait_caught_up()
    assert service.counter_value(counter_id) == 100, "an increment was lost"
    assert cache.hits > hits_before, (cache.hits, cache.misses, cache.resets)


class CappedIncrement(Increment):
    """:class:`Increment` that drops itself (with a reason) once the counter reached ``cap``."""

    def __init__(
        self, callbacks: ChangeSetCallbacks, counter_id: int, cap: int, request_key: str | None = None
    ):
        super().__init__(callbacks, counter_id, request_key=request_key)
        self.cap = cap
        self.completions: list[bool] = []

    def run(self, tx: EntityTransaction) -> bool:
        counter = tx.get(ClusterCounter, self.counter_id)
        if counter is not None and counter.value >= self.cap:
            return tx.drop(f"counter at its cap {self.cap}")
        return super().run(tx)

    def on_completion(self, result: bool) -> None:
        self.completions.append(result)


class KeyedCappedIncrement(CappedIncrement):
    """:class:`CappedIncrement` that sets its request's key before anything else, as a service's
    request handler does: its drop at the cap carries the key."""

    def run(self, tx: EntityTransaction) -> bool:
        tx.idempotency_key = self.request_key
        return super().run(tx)


def test_a_retry_dropped_on_what_its_first_copy_left_is_answered_as_applied(service: Service) -> None:
    """A keyed request whose retry ``run`` drops on the state its first copy left (the counter at
    its cap) ends already applied, with the first copy's transaction, alone or in a batch; a
    request with another key drops with its reason."""
    counter_id = service.create_counter()
    instance = service.first
    key = f"capped-{uuid.uuid4()}"
    first = instance.client.submit(
        KeyedCappedIncrement(instance.callbacks, counter_id, cap=1, request_key=key)
    )
    first_id = first.result(TIMEOUT).transaction_id
    assert first_id is not None
    assert instance.callbacks.wait_for(service.partition_of(counter_id), first_id, timeout=TIMEOUT)
    retried = instance.client.submit(
        KeyedCappedIncrement(instance.callbacks, counter_id, cap=1, request_key=key)
    )
    outcome = retried.result(TIMEOUT)
    assert outcome.already_applied and outcome.transaction_id == first_id, outcome
    other = KeyedCappedIncrement(instance.callbacks, counter_id, cap=1, request_key=f"other-{uuid.uuid4()}")
    dropped = instance.client.submit(other).result(TIMEOUT)
    assert dropped.dropped and dropped.reason == "counter at its cap 1", dropped
    with EntityBatcher(instance.client) as batcher:
        batched = batcher.submit(KeyedCappedIncrement(instance.callbacks, counter_id, cap=1, request_key=key))
        in_batch = batched.result(TIMEOUT)
    assert in_batch.already_applied and in_batch.transaction_id == first_id, in_batch
    service.wait_caught_up()
    assert service.counter_value(counter_id) == 1


def test_a_request_twice_in_one_batch_whose_second_copy_drops_is_answered_as_applied(
    service: Service,
) -> None:
    """A request twice in one batch: the second copy, which drops on what the first left (the
    counter at its cap), waits for the next batch, and ends already applied with the first copy's
    transaction, not dropped (docs/design/sql.md "Batched entity transactions")."""
    counter_id = service.create_counter()
    instance = service.first
    key = f"twice-{uuid.uuid4()}"
    with EntityBatcher(instance.client, max_in_flight_alone=0, linger=0) as batcher:
        gated = Gated(instance.callbacks, counter_id)  # counter 0 -> 1
        head = batcher.submit(gated)  # alone; the two below queue behind it as one batch
        copies = [
            KeyedCappedIncrement(instance.callbacks, counter_id, cap=2, request_key=key) for _ in range(2)
        ]
        futures = [batcher.submit(copy) for copy in copies]
        gated.gate.set()
        assert head.result(TIMEOUT).committed
        first, again = (future.result(TIMEOUT) for future in futures)
    assert first.committed, first
    assert again.already_applied and again.transaction_id == first.transaction_id, again
    service.wait_caught_up()
    assert service.counter_value(counter_id) == 2


def test_batched_increments_from_two_instances_share_log_transactions_and_lose_no_update(
    service: Service,
) -> None:
    """Each instance submits through an EntityBatcher: contexts ready while the counter's last
    log transaction is in flight go together as a batch (form 3), each run on what the ones before
    it left; every member has its own outcome and callbacks, none is lost, and the cap holds
    (docs/design/sql.md "Batched entity transactions")."""
    counter_id = service.create_counter()
    cap = 150
    batchers = [EntityBatcher(instance.client) for instance in service.instances]
    try:
        submitted: list[tuple[CappedIncrement, Any]] = []
        for _ in range(100):  # 200 submissions for a cap of 150: 50 are dropped
            for instance, batcher in zip(service.instances, batchers, strict=True):
                context = CappedIncrement(instance.callbacks, counter_id, cap, f"inc-{uuid.uuid4()}")
                submitted.append((context, batcher.submit(context)))
        outcomes = [future.result(TIMEOUT) for _, future in submitted]
    finally:
        for batcher in batchers:
            batcher.close()
    committed = [o for o in outcomes if o.committed]
    dropped = [o for o in outcomes if o.dropped]
    assert len(committed) == cap and len(dropped) == 200 - cap, (len(committed), len(dropped))
    assert {o.reason for o in dropped} == {f"counter at its cap {cap}"}
    ids = [o.transaction_id for o in committed]
    assert len(set(ids)) < cap, "no two increments shared a log transaction"
    assert sum(b.batched for b in batchers) >= len(ids) - len(set(ids)) > 0
    assert all(
        context.completions == [outcome.committed]
        for (context, _), outcome in zip(submitted, outcomes, strict=True)
    )

    service.wait_caught_up()
    assert service.counter_value(counter_id) == cap, "an increment was lost or applied twice"
    pid = service.partition_of(counter_id)
    for (context, _), outcome in zip(submitted, outcomes, strict=True):
        found = service.first.callbacks.find_idempotency_key(context.request_key or "")
        if outcome.committed:
            assert found == AppliedRequest(pid, outcome.transaction_id)
        else:
            assert found is None


class Gated(Increment):
    """Completes only once ``gate`` is set: contexts submitted meanwhile queue for one batch."""

    def __init__(self, callbacks: ChangeSetCallbacks, counter_id: int) -> None:
        super().__init__(callbacks, counter_id)
        self.gate = threading.Event()

    def on_completion(self, result: bool) -> None:
        assert self.gate.wait(TIMEOUT), "the test never opened the gate"


class Failing(Increment):
    """Raises in ``run``: its own future fails, the batch goes on."""

    def run(self, tx: EntityTransaction) -> bool:
        raise ValueError("this request is refused by its own rule")


class QueriesSession(Increment):
    """Reads its counter with a query on ``tx.session`` (not batchable after the first member)."""

    def run(self, tx: EntityTransaction) -> bool:
        value = tx.session.execute(
            select(ClusterCounter.value).where(ClusterCounter.counter_id == self.counter_id)
        ).scalar_one()
        counter = tx.get(ClusterCounter, self.counter_id)
        assert counter is not None and counter.value == value
        tx.lock_write(ClusterCounter, self.counter_id)
        tx.update(counter, value=value + self.by)
        return True


@pytest.mark.parametrize("entity_cache", [True], ids=["entity-cache"], indirect=True, scope="module")
def test_batch_members_that_fail_query_the_session_or_repeat_a_key_end_on_their_own(service: Service) -> None:
    """In a batch: a member that raises fails alone; one that queries ``tx.session`` runs on its
    own after the batch; a key twice in one batch commits once, the second copy answered as
    already applied; a key applied before is answered so; the others commit together
    (docs/design/sql.md "Batched entity transactions")."""
    counter_id = service.create_counter()
    instance = service.first
    repeated = f"twice-{uuid.uuid4()}"
    earlier_key = f"earlier-{uuid.uuid4()}"
    earlier = instance.client.submit(Increment(instance.callbacks, counter_id, request_key=earlier_key))
    earlier_id = earlier.result(TIMEOUT).transaction_id
    assert earlier_id is not None
    assert instance.callbacks.wait_for(service.partition_of(counter_id), earlier_id, timeout=TIMEOUT)
    with EntityBatcher(instance.client) as batcher:
        gated = Gated(instance.callbacks, counter_id)
        first = batcher.submit(gated)  # alone: nothing in flight; the others queue behind it
        contexts: list[Increment] = [
            Increment(instance.callbacks, counter_id, request_key=repeated),
            Failing(instance.callbacks, counter_id),
            Increment(instance.callbacks, counter_id),
            QueriesSession(instance.callbacks, counter_id, by=10),
            Increment(instance.callbacks, counter_id, request_key=repeated),
            Increment(instance.callbacks, counter_id),
            Increment(instance.callbacks, counter_id, request_key=earlier_key),  # applied before
        ]
        futures = [batcher.submit(context) for context in contexts]
        gated.gate.set()
        assert first.result(TIMEOUT).committed
        with pytest.raises(ValueError, match="refused by its own rule"):
            futures[1].result(TIMEOUT)
        outcomes = [None if i == 1 else futures[i].result(TIMEOUT) for i in range(len(futures))]
    assert batcher.batches >= 1
    keyed, _, plain, session, again, last, sent_again = outcomes
    assert sent_again is not None and sent_again.already_applied and sent_again.transaction_id == earlier_id
    assert keyed is not None and keyed.committed and plain is not None and plain.committed
    assert last is not None and last.committed and session is not None and session.committed
    assert keyed.transaction_id == plain.transaction_id == last.transaction_id, "not one batch"
    assert session.transaction_id != keyed.transaction_id, "the session's query ran in the batch"
    assert again is not None and again.already_applied and again.transaction_id == keyed.transaction_id
    service.wait_caught_up()
    assert service.counter_value(counter_id) == 1 + 1 + 3 + 10


def test_a_member_dropped_on_what_a_member_taken_out_of_the_batch_left_runs_again(service: Service) -> None:
    """A member that drops on what an earlier member of its batch left waits for the batch: when
    that earlier member is taken out (its key was applied before), the member runs again on the
    state without it and commits; its drop never reaches its caller (docs/design/sql.md "Batched
    entity transactions": members that leave)."""
    counter_id = service.create_counter()
    instance = service.first
    earlier_key = f"earlier-{uuid.uuid4()}"
    earlier = instance.client.submit(Increment(instance.callbacks, counter_id, request_key=earlier_key))
    earlier_id = earlier.result(TIMEOUT).transaction_id
    assert earlier_id is not None
    assert instance.callbacks.wait_for(service.partition_of(counter_id), earlier_id, timeout=TIMEOUT)
    with EntityBatcher(instance.client, max_in_flight_alone=0) as batcher:
        gated = Gated(instance.callbacks, counter_id)  # counter 1 -> 2
        first = batcher.submit(gated)  # alone: nothing in flight; the others queue behind it
        # On 2: the request sent again would make 3 (the cap) and the capped one would drop; but
        # the request was applied before, so the capped one takes the counter from 2 to 3.
        sent_again = Increment(instance.callbacks, counter_id, request_key=earlier_key)
        capped = CappedIncrement(instance.callbacks, counter_id, cap=3)
        futures = [batcher.submit(sent_again), batcher.submit(capped)]
        gated.gate.set()
        assert first.result(TIMEOUT).committed
        again, last = (future.result(TIMEOUT) for future in futures)
    assert again.already_applied and again.transaction_id == earlier_id
    assert last.committed, f"dropped on a change that never reached the log: {last.reason}"
    assert capped.completions == [True]
    service.wait_caught_up()
    assert service.counter_value(counter_id) == 3


def test_a_member_dropped_on_what_a_batch_refused_by_its_lock_check_left_runs_again(service: Service) -> None:
    """A member that drops on what an earlier member of its batch left waits for the batch: when
    the batch fails its lock check (another instance wrote the counter after its state), the
    member runs again with the others on the newer state and commits."""
    counter_id = service.create_counter()
    instance, other = service.first, service.second
    with EntityBatcher(instance.client, max_in_flight_alone=0) as batcher:
        gated = Gated(instance.callbacks, counter_id)  # counter 0 -> 1
        first = batcher.submit(gated)  # alone; the two below queue behind it as one batch
        held = HeldInRun(instance.callbacks, counter_id)  # 1 -> 2 on the batch's first state
        capped = CappedIncrement(instance.callbacks, counter_id, cap=2)  # drops there: at its cap
        futures = [batcher.submit(held), batcher.submit(capped)]
        gated.gate.set()
        assert first.result(TIMEOUT).committed
        assert held.running.wait(TIMEOUT), "the batch never ran"
        # Another instance takes the counter back to 0 while the batch's first attempt runs.
        assert other.client.submit(Increment(other.callbacks, counter_id, by=-1)).result(TIMEOUT).committed
        held.gate.set()
        outcomes = [future.result(TIMEOUT) for future in futures]
    assert held.lock_failures >= 1, "the batch's first attempt passed its lock check"
    assert capped.lock_failures == held.lock_failures, "the member that waited was not told"
    assert all(o.committed for o in outcomes), [o.reason for o in outcomes]
    assert outcomes[0].transaction_id == outcomes[1].transaction_id
    assert capped.completions == [True]
    service.wait_caught_up()
    assert service.counter_value(counter_id) == 2


class IncrementIfOpen(Increment):
    """Increments its counter when counter ``account_id`` (the same partition) is at least 1, else
    drops; its first ``run`` blocks, once it read both, until ``gate`` is set."""

    def __init__(self, callbacks: ChangeSetCallbacks, counter_id: int, account_id: int) -> None:
        super().__init__(callbacks, counter_id)
        self.account_id = account_id
        self.running = threading.Event()
        self.gate = threading.Event()
        self.completions: list[bool] = []

    def prefetch_entities(self) -> list[tuple[type[Any], Any]]:
        return [*super().prefetch_entities(), (ClusterCounter, self.account_id)]

    def run(self, tx: EntityTransaction) -> bool:
        counter = tx.get(ClusterCounter, self.counter_id)
        account = tx.get(ClusterCounter, self.account_id)
        self.running.set()
        assert self.gate.wait(TIMEOUT), "the test never opened the gate"
        assert counter is not None and account is not None
        if account.value < 1:
            return tx.drop(f"account {self.account_id} is not open")
        tx.update(counter, value=counter.value + 1)
        return True

    def on_completion(self, result: bool) -> None:
        self.completions.append(result)


def test_a_member_dropped_after_others_fails_the_batch_when_what_it_alone_read_was_written(
    service: Service,
) -> None:
    """A member that drops on what an earlier member of its batch left waits for the batch, and
    what it read is in the batch's lock check: when another instance writes an entity only that
    member read, after the batch's state, the batch fails its lock check and the member runs
    again on the newer state (docs/design/sql.md "Batched entity transactions", its members that
    leave), instead of being told "dropped" on a state the log never held."""
    counter_id = service.create_counter()
    account_id = service.create_counter(service.partition_of(counter_id))
    instance, other = service.first, service.second
    with EntityBatcher(instance.client, max_in_flight_alone=0, linger=0) as batcher:
        gated = Gated(instance.callbacks, counter_id)  # counter 0 -> 1
        head = batcher.submit(gated)  # alone; the two below queue behind it as one batch
        plain = Increment(instance.callbacks, counter_id)  # 1 -> 2, appended first
        checking = IncrementIfOpen(instance.callbacks, counter_id, account_id)  # drops: account at 0
        futures = [batcher.submit(plain), batcher.submit(checking)]
        gated.gate.set()
        assert head.result(TIMEOUT).committed
        assert checking.running.wait(TIMEOUT), "the batch never ran"
        # Another instance opens the account while the batch's first attempt runs.
        assert other.client.submit(Increment(other.callbacks, account_id)).result(TIMEOUT).committed
        checking.gate.set()
        outcomes = [future.result(TIMEOUT) for future in futures]
    assert outcomes[1].committed, f"dropped on a state the log never held: {outcomes[1].reason}"
    assert checking.lock_failures >= 1 and checking.completions == [True]
    assert outcomes[0].committed
    service.wait_caught_up()
    assert service.counter_value(counter_id) == 3 and service.counter_value(account_id) == 1


class UncheckedIncrement(Increment):
    """:class:`Increment` that does not read its key before appending: a repeat commits again."""

    checks_idempotency_key = False


class UncheckedCreate(CreateCounter):
    """:class:`CreateCounter` of a request with a key it does not check before appending."""

    checks_idempotency_key = False

    def __init__(self, callbacks: ChangeSetCallbacks, counter_id: int, request_key: str) -> None:
        super().__init__(callbacks, counter_id)
        self.request_key = request_key

    def run(self, tx: EntityTransaction) -> bool:
        tx.idempotency_key = self.request_key
        return super().run(tx)


class DeleteCounter(EntityTransactionContext):
    """Deletes a counter."""

    def __init__(self, callbacks: ChangeSetCallbacks, counter_id: int) -> None:
        super().__init__(callbacks, (ClusterCounter, counter_id))
        self.counter_id = counter_id

    def run(self, tx: EntityTransaction) -> bool:
        counter = tx.get(ClusterCounter, self.counter_id)
        assert counter is not None
        tx.delete(counter)
        return True


def test_a_request_repeated_without_its_key_checked_counts_once_in_a_batch(service: Service) -> None:
    """docs/design/sql.md "Idempotency keys": with ``checks_idempotency_key`` off, a repeated
    request commits again and its apply changes nothing. In a batch, the member after the repeat
    does not read the row the repeat left (its apply skips it): it runs on its own after the
    batch, on what the log holds, and the request counts once."""
    counter_id = service.create_counter()
    pid = service.partition_of(counter_id)
    instance = service.first
    key = f"unchecked-{uuid.uuid4()}"
    first = instance.client.submit(UncheckedIncrement(instance.callbacks, counter_id, request_key=key))
    first_id = first.result(TIMEOUT).transaction_id
    assert first_id is not None and instance.callbacks.wait_for(pid, first_id, timeout=TIMEOUT)
    with EntityBatcher(instance.client, max_in_flight_alone=0, linger=0) as batcher:
        gated = Gated(instance.callbacks, counter_id)  # 1 -> 2
        head = batcher.submit(gated)  # alone; the two below queue behind it as one batch
        repeat = batcher.submit(UncheckedIncrement(instance.callbacks, counter_id, request_key=key))
        other = batcher.submit(Increment(instance.callbacks, counter_id))
        gated.gate.set()
        assert head.result(TIMEOUT).committed
        repeated, after = repeat.result(TIMEOUT), other.result(TIMEOUT)
    assert repeated.committed and after.committed, (repeated, after)
    service.wait_caught_up()
    assert service.counter_value(counter_id) == 3, "the repeated request counted twice"


def test_a_member_after_an_unchecked_repeat_of_an_insert_does_not_stall_the_partition(
    service: Service,
) -> None:
    """A repeated create (key not checked) whose apply skips its insert: the member after it in
    the batch does not update the row the apply never writes (which would fail the batch's apply
    on every try and stop the partition); it runs on its own after the batch and finds no row."""
    counter_id = service.create_counter()
    pid = service.partition_of(counter_id)
    instance = service.first
    created_id = service.new_counter_id(pid)
    key = f"create-{uuid.uuid4()}"
    for context in (
        UncheckedCreate(instance.callbacks, created_id, key),
        DeleteCounter(instance.callbacks, created_id),
    ):
        transaction_id = instance.client.submit(context).result(TIMEOUT).transaction_id
        assert transaction_id is not None
        assert instance.callbacks.wait_for(pid, transaction_id, timeout=TIMEOUT)
    with EntityBatcher(instance.client, max_in_flight_alone=0, linger=0) as batcher:
        gated = Gated(instance.callbacks, counter_id)
        head = batcher.submit(gated)  # alone; the two below queue behind it as one batch
        repeat = batcher.submit(UncheckedCreate(instance.callbacks, created_id, key))
        other = batcher.submit(Increment(instance.callbacks, created_id))
        gated.gate.set()
        assert head.result(TIMEOUT).committed
        repeated = repeat.result(TIMEOUT)
        with pytest.raises(LookupError, match="does not exist"):
            other.result(TIMEOUT)
    assert repeated.committed and repeated.transaction_id is not None
    assert instance.callbacks.wait_for(pid, repeated.transaction_id, timeout=TIMEOUT), (
        f"partition {pid} stopped applying at the batch: {service.uncaught()}"
    )
    service.wait_caught_up()
    assert service.counter_value(created_id) is None


class Haunt(EntityTransactionContext):
    """Reads a :class:`Ghost` (same key, so same partition, as a counter)."""

    def __init__(self, callbacks: ChangeSetCallbacks, ghost_id: int) -> None:
        super().__init__(callbacks, (Ghost, ghost_id))
        self.ghost_id = ghost_id
        self.exceptions: list[BaseException] = []

    def run(self, tx: EntityTransaction) -> bool:
        tx.get(Ghost, self.ghost_id)
        return True

    def on_exception(self, exception: BaseException) -> None:
        self.exceptions.append(exception)


class RecordsExceptions(Increment):
    """An increment that notes what its ``on_exception`` was given."""

    def __init__(self, callbacks: ChangeSetCallbacks, counter_id: int) -> None:
        super().__init__(callbacks, counter_id)
        self.exceptions: list[BaseException] = []

    def on_exception(self, exception: BaseException) -> None:
        self.exceptions.append(exception)


class ClosesOnItsRetry(RecordsExceptions):
    """A batch's first member: its first run has another instance commit a write of the counter
    (the batch's lock check fails); its second, the batch's next attempt, closes the client from
    another thread and waits (bounded) until its own future ended, as the close fails the batch
    while this attempt runs."""

    def __init__(self, callbacks: ChangeSetCallbacks, counter_id: int, service: Service) -> None:
        super().__init__(callbacks, counter_id)
        self.service = service
        self.runs = 0
        self.future: concurrent.futures.Future[Outcome] | None = None
        self.ended_in_run = False
        #: Set once the second run has checked its future (after its future ended, which may be
        #: seen by the test first).
        self.checked = threading.Event()

    def run(self, tx: EntityTransaction) -> bool:
        self.runs += 1
        if self.runs == 1:
            other = self.service.second
            assert other.client.submit(Increment(other.callbacks, self.counter_id)).result(TIMEOUT).committed
        elif self.runs == 2:
            threading.Thread(target=self.service.first.client.close, name="test-close", daemon=True).start()
            assert self.future is not None
            self.ended_in_run = concurrent.futures.wait([self.future], timeout=10).not_done == set()
            self.checked.set()
        return super().run(tx)


@pytest.mark.parametrize("entity_cache", [True], ids=["entity-cache"], indirect=True, scope="module")
@pytest.mark.parametrize("app_db_url", ["postgresql"], indirect=True)
def test_a_client_closed_during_a_batch_s_next_attempt_ends_every_member(fresh_service: Service) -> None:
    """The client closes while a batch's next attempt runs (after a lock failure), before the
    attempt reached its later members: the close fails the batch, and every member ends with
    ``ClientClosedError``, those the attempt had not reached too, each with its ``on_exception``;
    none is left waiting."""
    service = fresh_service
    counter_id = service.create_counter()
    instance = service.first
    batcher = EntityBatcher(instance.client, max_in_flight_alone=0, linger=0)
    try:
        gated = Gated(instance.callbacks, counter_id)
        first = batcher.submit(gated)
        closing = ClosesOnItsRetry(instance.callbacks, counter_id, service)
        later = RecordsExceptions(instance.callbacks, counter_id)
        closing.future = batcher.submit(closing)
        futures = [closing.future, batcher.submit(later)]
        gated.gate.set()
        assert first.result(TIMEOUT).committed
        waiting = concurrent.futures.wait(futures, timeout=TIMEOUT).not_done
    finally:
        batcher.close()
    assert closing.runs == 2, "the batch's lock check did not fail"
    assert not waiting, "a member of the batch the client failed was never ended"
    errors = [f.exception() for f in futures]
    assert all(isinstance(e, ClientClosedError) for e in errors), errors
    assert closing.checked.wait(TIMEOUT), "the second run never checked its future"
    assert closing.ended_in_run
    assert [type(e) for e in later.exceptions] == [ClientClosedError]


class ClosesTheBatcher(Increment):
    """Closes ``batcher`` from its ``on_completion``, on the client's completion thread, where
    its concurrency slot is still held: the client frees it only after that callback returns."""

    def __init__(self, callbacks: ChangeSetCallbacks, counter_id: int, batcher: EntityBatcher) -> None:
        super().__init__(callbacks, counter_id)
        self.batcher = batcher
        self.closed = threading.Event()

    def on_completion(self, result: bool) -> None:
        self.batcher.close()
        self.closed.set()


def _slot_waiters(client: WaltzClient, partition: int) -> int:
    """Threads waiting for a concurrency slot of the partition (the client's FIFO hand-over)."""
    limit = client._core.attempts._in_flight._limits[partition]
    with limit._lock:
        return len(limit._waiters)


@pytest.mark.parametrize("entity_cache", [True], ids=["entity-cache"], indirect=True, scope="module")
@pytest.mark.parametrize("app_db_url", ["postgresql"], indirect=True)
def test_closing_the_batcher_from_a_completion_callback_while_its_sender_waits_for_a_slot_returns(
    sql_cluster_ready: LocalCluster, app_db_url: str, entity_cache: bool
) -> None:
    """One transaction in flight per partition. The batcher's first member holds the slot, its
    second queues behind it, and a context submitted straight to the client waits for the slot.
    When the first ends, the slot passes to that context (FIFO) and the second member's sender
    thread waits for it; that context's ``on_completion``, on the completion thread, which frees
    the slot only after it returns, closes the batcher. The close returns without waiting for the
    sender, and the member taken before it is still sent and commits, after that context."""
    with open_service(
        sql_cluster_ready, app_db_url, entity_cache, client_max_concurrent_transactions=1
    ) as service:
        counter_id = service.create_counter()
        partition = service.partition_of(counter_id)
        instance = service.first
        batcher = EntityBatcher(instance.client, max_in_flight_alone=0, linger=0)
        closer = ClosesTheBatcher(instance.callbacks, counter_id, batcher)
        gated = Gated(instance.callbacks, counter_id)
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="test-direct") as direct:
            try:
                first = batcher.submit(gated)  # sent at once: it holds the slot
                queued = batcher.submit(Increment(instance.callbacks, counter_id))  # behind it
                submitted = direct.submit(instance.client.submit, closer)  # waits for the slot
                wait_until(
                    lambda: _slot_waiters(instance.client, partition) == 1,
                    timeout=TIMEOUT,
                    what="the direct submit to wait for the partition's slot",
                )
                gated.gate.set()
                assert closer.closed.wait(TIMEOUT / 2), "the close on the completion thread never returned"
                closed = submitted.result(TIMEOUT).result(TIMEOUT)
                assert first.result(TIMEOUT).committed and closed.committed
                sent = queued.result(TIMEOUT)
                assert sent.committed, "the member taken before the close was not sent"
            finally:
                gated.gate.set()
                batcher.close()
        assert sent.transaction_id > closed.transaction_id, "the member's sender did not wait for the slot"
        with pytest.raises(ClientClosedError):
            batcher.submit(Increment(instance.callbacks, counter_id))
        service.wait_caught_up()
        assert service.counter_value(counter_id) == 3


class ClosesInRun(Increment):
    """Closes ``batcher`` from its ``run`` when that runs on one of the batcher's sender threads."""

    def __init__(self, callbacks: ChangeSetCallbacks, counter_id: int, batcher: EntityBatcher) -> None:
        super().__init__(callbacks, counter_id)
        self.batcher = batcher
        self.closed_on_sender = False

    def run(self, tx: EntityTransaction) -> bool:
        if threading.current_thread().name.startswith("waltz-batcher"):
            self.batcher.close()
            self.closed_on_sender = True
        return super().run(tx)


@pytest.mark.parametrize("entity_cache", [True], ids=["entity-cache"], indirect=True, scope="module")
@pytest.mark.parametrize("app_db", ["postgresql"], indirect=True, scope="module")
def test_closing_the_batcher_from_its_own_sender_thread_returns_and_the_batch_commits(
    service: Service,
) -> None:
    """A member sent by a sender thread (queued behind a transaction in flight) closes the batcher
    in its ``run``: the close does not wait for the sender threads, its own among them, and the
    member's batch, taken before the close, commits."""
    counter_id = service.create_counter()
    instance = service.first
    batcher = EntityBatcher(instance.client, max_in_flight_alone=0, linger=0)
    try:
        gated = Gated(instance.callbacks, counter_id)
        first = batcher.submit(gated)
        closing = ClosesInRun(instance.callbacks, counter_id, batcher)
        second = batcher.submit(closing)  # queued: sent by a sender thread when the first ends
        gated.gate.set()
        assert first.result(TIMEOUT).committed
        assert second.result(TIMEOUT).committed
    finally:
        gated.gate.set()
        batcher.close()
    assert closing.closed_on_sender, "the member did not run on a sender thread"
    service.wait_caught_up()
    assert service.counter_value(counter_id) == 2


class Noting(Increment):
    """An increment that notes its callbacks (``on_completion``, ``on_application``,
    ``on_exception``), dropping itself when ``drops``, raising in ``run`` when ``raises``."""

    def __init__(
        self, callbacks: ChangeSetCallbacks, counter_id: int, *, drops: bool = False, raises: bool = False
    ) -> None:
        super().__init__(callbacks, counter_id)
        self.drops, self.raises = drops, raises
        self.completions: list[bool] = []
        self.applications = 0
        self.exceptions: list[BaseException] = []

    def run(self, tx: EntityTransaction) -> bool:
        if self.raises:
            raise ValueError("this request is refused by its own rule")
        if self.drops:
            return tx.drop("this request changes nothing")
        return super().run(tx)

    def on_completion(self, result: bool) -> None:
        self.completions.append(result)

    def on_application(self) -> None:
        self.applications += 1

    def on_exception(self, exception: BaseException) -> None:
        self.exceptions.append(exception)


@pytest.mark.parametrize("entity_cache", [True], ids=["entity-cache"], indirect=True, scope="module")
def test_each_member_keeps_its_own_callbacks_and_one_that_drops_on_the_state_alone_ends_at_once(
    service: Service,
) -> None:
    """docs/design/sql.md "Batched entity transactions": a member that drops its transaction or
    raises on the state alone (no member appended before it) leaves the batch at once, with its own
    outcome and callback, while the members after it still run; the members that commit each get
    ``on_completion(True)`` and, once applied here, ``on_application``; none gets another's."""
    counter_id = service.create_counter()
    instance = service.first
    with EntityBatcher(instance.client, max_in_flight_alone=0, linger=0) as batcher:
        gated = Gated(instance.callbacks, counter_id)
        first = batcher.submit(gated)
        dropping = Noting(instance.callbacks, counter_id, drops=True)
        raising = Noting(instance.callbacks, counter_id, raises=True)
        held = HeldInRun(instance.callbacks, counter_id)
        committing = [Noting(instance.callbacks, counter_id) for _ in range(2)]
        contexts = [dropping, raising, held, *committing]
        futures = [batcher.submit(context) for context in contexts]
        gated.gate.set()
        assert first.result(TIMEOUT).committed
        try:
            assert held.running.wait(TIMEOUT), "the batch never reached the held member"
            # The members before it ended while it is still running, before the batch is sent.
            dropped = futures[0].result(0)
            assert not dropped.committed and dropping.completions == [False]
            assert isinstance(futures[1].exception(0), ValueError)
            assert [type(e) for e in raising.exceptions] == [ValueError] and raising.completions == []
            assert not any(future.done() for future in futures[2:])
        finally:
            held.gate.set()
        outcomes = [future.result(TIMEOUT) for future in futures[2:]]
    assert all(o.committed for o in outcomes) and len({o.transaction_id for o in outcomes}) == 1, outcomes
    last = outcomes[0].transaction_id
    assert last is not None
    assert instance.client.wait_applied(service.partition_of(counter_id), last, TIMEOUT)
    wait_until(
        lambda: all(c.applications == 1 for c in committing),
        timeout=TIMEOUT,
        what="each member's on_application",
    )
    assert [(c.completions, c.exceptions) for c in committing] == [([True], [])] * 2
    assert dropping.applications == raising.applications == 0 and dropping.exceptions == []
    service.wait_caught_up()
    assert service.counter_value(counter_id) == 4


@pytest.mark.parametrize("entity_cache", [False], ids=["no-entity-cache"], indirect=True, scope="module")
def test_a_batch_whose_state_cannot_be_read_ends_every_member_with_the_error(fresh_service: Service) -> None:
    """The batch's one state fails to open (a table gone): each member's future and
    ``on_exception`` get the error; none is left waiting."""
    service = fresh_service
    counter_id = service.create_counter()
    instance = service.first
    with instance.engine.begin() as conn:
        conn.execute(text(f"DROP TABLE {Ghost.__tablename__}"))
    with EntityBatcher(instance.client) as batcher:
        gated = Gated(instance.callbacks, counter_id)
        first = batcher.submit(gated)
        haunts = [Haunt(instance.callbacks, counter_id) for _ in range(3)]
        futures = [batcher.submit(haunt) for haunt in haunts]
        gated.gate.set()
        assert first.result(TIMEOUT).committed
        errors = [future.exception(TIMEOUT) for future in futures]
    assert all(error is not None for error in errors), errors
    assert [len(haunt.exceptions) for haunt in haunts] == [1, 1, 1]
    assert batcher.batches == 0


class BrokenHint(Increment):
    """:class:`Increment` whose ``prefetch_entities`` hint raises (alone: its own error)."""

    def prefetch_entities(self) -> list[tuple[type[Any], Any]]:
        raise KeyError("this member's own hint is broken")


def test_a_member_whose_prefetch_hint_raises_fails_alone_and_its_batch_goes_on(service: Service) -> None:
    """A member whose ``prefetch_entities`` raises ends with that error, as it would alone; the
    batch reads the others' entities and commits them (docs/design/sql.md "Batched entity
    transactions", its members that leave)."""
    counter_id = service.create_counter()
    instance = service.first
    with EntityBatcher(instance.client, max_in_flight_alone=0, linger=0) as batcher:
        gated = Gated(instance.callbacks, counter_id)
        head = batcher.submit(gated)  # alone; the ones below queue behind it as one batch
        contexts = [
            BrokenHint(instance.callbacks, counter_id),
            Increment(instance.callbacks, counter_id),
            BrokenHint(instance.callbacks, counter_id),
            Increment(instance.callbacks, counter_id),
            Increment(instance.callbacks, counter_id),
        ]
        futures = [batcher.submit(context) for context in contexts]
        gated.gate.set()
        assert head.result(TIMEOUT).committed
        errors = [futures[i].exception(TIMEOUT) for i in (0, 2)]
        outcomes = [futures[i].result(TIMEOUT) for i in (1, 3, 4)]
    assert all(isinstance(error, KeyError) for error in errors), errors
    assert all(o.committed for o in outcomes) and len({o.transaction_id for o in outcomes}) == 1, outcomes
    service.wait_caught_up()
    assert service.counter_value(counter_id) == 4


class OtherBase(DeclarativeBase):
    pass


class Widget(OtherBase):
    """A model of another service's database, whose table the module's database does not have."""

    __tablename__ = "cluster_widgets"
    __waltz__ = WaltzEntity("cluster_widget")

    widget_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    touches: Mapped[int] = mapped_column(BigInteger, nullable=False)


class TouchWidget(EntityTransactionContext):
    """Inserts a widget, or counts a touch of it."""

    def __init__(self, callbacks: ChangeSetCallbacks, widget_id: int) -> None:
        super().__init__(callbacks, (Widget, widget_id))
        self.widget_id = widget_id

    def run(self, tx: EntityTransaction) -> bool:
        widget = tx.get(Widget, self.widget_id)
        if widget is None:
            tx.insert(Widget, widget_id=self.widget_id, touches=1)
        else:
            tx.update(widget, touches=widget.touches + 1)
        return True


@pytest.fixture
def other_callbacks(tmp_path: pathlib.Path) -> Iterator[ChangeSetCallbacks]:
    """Change-set callbacks of another database (its own SQLite file, :class:`Widget` its model)."""
    engine = create_framework_engine(f"sqlite:///{tmp_path / 'other.db'}")
    try:
        upgrade(engine)
        OtherBase.metadata.create_all(engine)
        yield ChangeSetCallbacks(
            engine,
            cluster_name=f"other-{support.unique_suffix()}",
            registry=EntityRegistry.from_base(OtherBase),
        )
    finally:
        engine.dispose()


@pytest.mark.parametrize("entity_cache", [True], ids=["entity-cache"], indirect=True, scope="module")
def test_a_member_of_another_database_is_not_read_in_the_batch_s_and_runs_alone(
    service: Service, other_callbacks: ChangeSetCallbacks
) -> None:
    """A member of other callbacks (another database) runs alone after the batch: its entities are
    not read in the first member's database, where its table does not exist, so the batch's
    members commit and so does it (docs/design/sql.md "Batched entity transactions")."""
    counter_id = service.create_counter()
    instance = service.first
    widget_id = service.new_counter_id(service.partition_of(counter_id))
    with EntityBatcher(instance.client, max_in_flight_alone=0, linger=0) as batcher:
        gated = Gated(instance.callbacks, counter_id)
        head = batcher.submit(gated)  # alone; the ones below queue behind it as one batch
        futures = [
            batcher.submit(Increment(instance.callbacks, counter_id)),
            batcher.submit(TouchWidget(other_callbacks, widget_id)),
            batcher.submit(Increment(instance.callbacks, counter_id)),
        ]
        gated.gate.set()
        assert head.result(TIMEOUT).committed
        first, other, last = (future.result(TIMEOUT) for future in futures)
    assert first.committed and last.committed and first.transaction_id == last.transaction_id
    assert other.committed and other.transaction_id != first.transaction_id, other
    service.wait_caught_up()
    assert service.counter_value(counter_id) == 3


class Padded(Increment):
    """An increment whose change-set carries ``pad`` bytes of meta."""

    def __init__(self, callbacks: ChangeSetCallbacks, counter_id: int, pad: int) -> None:
        super().__init__(callbacks, counter_id)
        self.pad = pad

    def run(self, tx: EntityTransaction) -> bool:
        tx.meta["pad"] = "x" * self.pad
        return super().run(tx)


def _padded_batches(service: Service, counter_id: int, max_bytes: int, count: int) -> list[Outcome]:
    """``count`` padded increments queued behind a gated one, through a batcher of ``max_bytes``."""
    instance = service.first
    with EntityBatcher(instance.client, max_bytes=max_bytes, max_in_flight_alone=0, linger=0) as batcher:
        gated = Gated(instance.callbacks, counter_id)
        first = batcher.submit(gated)
        futures = [batcher.submit(Padded(instance.callbacks, counter_id, 1_000)) for _ in range(count)]
        gated.gate.set()
        assert first.result(TIMEOUT).committed
        outcomes = [future.result(TIMEOUT) for future in futures]
    assert all(o.committed for o in outcomes), outcomes
    return outcomes


def _data_bytes(service: Service, partition: int, transaction_ids: set[int]) -> dict[int, int]:
    service.wait_caught_up()
    sizes: dict[int, int] = {}
    for instance in service.instances:
        sizes.update((t, n) for (p, t), n in instance.callbacks.data_bytes.items() if p == partition)
    return {t: sizes[t] for t in transaction_ids}


@pytest.mark.parametrize("entity_cache", [True], ids=["entity-cache"], indirect=True, scope="module")
def test_a_batch_s_data_stays_within_max_bytes_and_what_does_not_fit_goes_next(service: Service) -> None:
    """docs/design/sql.md "Batched entity transactions": a batch is bounded by bytes; its data, the
    batch's own framing included, stays within ``max_bytes``, and the members that would pass it go
    in the batches after it, in order, none lost."""
    counter_id = service.create_counter()
    partition = service.partition_of(counter_id)
    # Members of about 1,050 bytes: two fit in 2,500, three do not.
    outcomes = _padded_batches(service, counter_id, 2_500, 5)
    ids = [o.transaction_id for o in outcomes]
    assert [ids.count(t) for t in dict.fromkeys(ids)] == [2, 2, 1], ids
    sizes = _data_bytes(service, partition, set(ids))
    assert all(n <= 2_500 for n in sizes.values()), sizes
    # A limit one byte below the data of those batches of two: two members' own bytes and lock
    # hashes still fit in it, the batch's framing does not, so each goes alone.
    two = max(n for t, n in sizes.items() if ids.count(t) == 2)
    again = _padded_batches(service, counter_id, two - 1, 2)
    assert again[0].transaction_id != again[1].transaction_id, "a batch went past max_bytes"
    alone = _data_bytes(service, partition, {o.transaction_id for o in again})
    assert all(n <= two - 1 for n in alone.values()), alone
    assert service.counter_value(counter_id) == 9


class HeldInRun(Increment):
    """Blocks in ``run`` until ``gate`` is set, so that it stays in flight as long as the test wants."""

    def __init__(self, callbacks: ChangeSetCallbacks, counter_id: int) -> None:
        super().__init__(callbacks, counter_id)
        self.running = threading.Event()
        self.gate = threading.Event()

    def run(self, tx: EntityTransaction) -> bool:
        self.running.set()
        assert self.gate.wait(TIMEOUT), "the test never opened the gate"
        return super().run(tx)


@pytest.mark.parametrize("entity_cache", [True], ids=["entity-cache"], indirect=True, scope="module")
@pytest.mark.parametrize("alone", [3, 0], ids=["alone-beyond-the-limit", "none-alone"])
def test_a_context_whose_locks_nothing_in_flight_holds_goes_at_once(service: Service, alone: int) -> None:
    """With the partition's one transaction in flight, a context on another entity of the same
    partition, submitted with nothing queued, goes at once, alone (``max_in_flight_alone``); one on
    the entity in flight waits for the next batch. With ``max_in_flight_alone=0`` both wait
    (docs/design/sql.md "Batched entity transactions")."""
    held_id = service.create_counter()
    other_id = service.create_counter(service.partition_of(held_id))
    instance = service.first
    # No linger: the two contexts come within a few milliseconds, which a linger would take for a
    # busy partition, where nothing goes beside the batch.
    with EntityBatcher(instance.client, max_in_flight_alone=alone, linger=0) as batcher:
        held = HeldInRun(instance.callbacks, held_id)
        # A first attempt runs on the submitting thread: this one blocks in run, so on its own.
        submitting = concurrent.futures.ThreadPoolExecutor(1)
        submitted = submitting.submit(batcher.submit, held)
        assert held.running.wait(TIMEOUT), "the first context never ran"
        other = batcher.submit(Increment(instance.callbacks, other_id))
        if alone:
            outcome = other.result(TIMEOUT)
            assert outcome.committed and not submitted.done(), (
                "the other entity's context waited for the first"
            )
        same = batcher.submit(Increment(instance.callbacks, held_id))
        done, _ = concurrent.futures.wait([same, *([] if alone else [other])], timeout=2.0)
        assert not done, "a context went while the partition's transaction holding its lock was in flight"
        held.gate.set()
        first = submitted.result(TIMEOUT)
        submitting.shutdown()
        outcomes = [f.result(TIMEOUT) for f in (first, other, same)]
    assert all(o.committed for o in outcomes), outcomes
    assert outcomes[2].transaction_id > outcomes[0].transaction_id
    if alone:
        assert outcomes[1].transaction_id < outcomes[0].transaction_id
    service.wait_caught_up()
    assert service.counter_value(held_id) == 2 and service.counter_value(other_id) == 1


def batch_samples(client: WaltzClient, partition: int) -> tuple[float, float, float]:
    """The client's registry's batches, batch members and lingered log transactions of a partition
    (docs/design/sql.md "Batched entity transactions"), 0 before any."""
    labels = {"partition": str(partition)}
    batches, members, lingered = (
        client.metrics.get_sample_value(f"waltz_client_entity_{name}_total", labels) or 0.0
        for name in ("batches", "batch_members", "batches_lingered")
    )
    return batches, members, lingered


#: The linger tests time the batcher, which is the same on every database: they run on one.
LINGER_DATABASE = pytest.mark.parametrize("app_db", ["postgresql"], indirect=True, scope="module")

#: Seconds of the linger in the tests that wait it out: far longer than a commit takes here, so
#: that what is submitted after a commit is certain to find it still running.
LINGER = 3.0


@pytest.mark.parametrize("entity_cache", [True], ids=["entity-cache"], indirect=True, scope="module")
@LINGER_DATABASE
def test_a_batch_waits_out_the_linger_and_takes_what_is_submitted_meanwhile(service: Service) -> None:
    """With a linger, a context submitted less than ``linger`` after its partition's last log
    transaction went does not go at once, alone: it waits out the rest, and a context submitted
    meanwhile joins it in one log transaction (docs/design/sql.md "Batched entity transactions")."""
    counter_id = service.create_counter()
    instance = service.first
    partition = service.partition_of(counter_id)
    counted = batch_samples(instance.client, partition)
    with EntityBatcher(instance.client, max_in_flight_alone=0, linger=LINGER) as batcher:
        assert batcher.linger == LINGER
        started = time.monotonic()
        sent = batcher.submit(Increment(instance.callbacks, counter_id))  # at once: nothing in flight
        # Submitted right behind it (the partition's contexts come fast), the two queue while it
        # is in flight, and then wait out the linger from its send.
        futures = [batcher.submit(Increment(instance.callbacks, counter_id)) for _ in range(2)]
        first = sent.result(TIMEOUT)
        outcomes = [future.result(TIMEOUT) for future in futures]
        ended = time.monotonic()
    assert first.committed and all(o.committed for o in outcomes), outcomes
    assert first.transaction_id != outcomes[0].transaction_id, "the two went with the first"
    assert outcomes[0].transaction_id == outcomes[1].transaction_id, "the two went apart"
    assert ended - started >= LINGER, "the batch went before the linger had passed"
    assert (batcher.lingered, batcher.batches, batcher.batched) == (1, 1, 2)
    after = batch_samples(instance.client, partition)
    assert tuple(a - b for a, b in zip(after, counted, strict=True)) == (1, 2, 1), (
        "the client's registry did not count the batch, its members and its linger"
    )
    service.wait_caught_up()
    assert service.counter_value(counter_id) == 3


@pytest.mark.parametrize("entity_cache", [True], ids=["entity-cache"], indirect=True, scope="module")
@LINGER_DATABASE
def test_while_contexts_come_fast_none_goes_beside_the_batch(service: Service) -> None:
    """With a linger, a context whose locks nothing in flight holds still waits for the next batch
    while its partition's contexts come three or more per linger: sent beside, it would take a
    member from the batch that lingers for it (docs/design/sql.md "Batched entity transactions")."""
    held_id = service.create_counter()
    other_id = service.create_counter(service.partition_of(held_id))
    instance = service.first
    with EntityBatcher(instance.client, max_in_flight_alone=3, linger=LINGER) as batcher:
        held = HeldInRun(instance.callbacks, held_id)
        submitting = concurrent.futures.ThreadPoolExecutor(1)
        submitted = submitting.submit(batcher.submit, held)
        assert held.running.wait(TIMEOUT), "the first context never ran"
        other = batcher.submit(Increment(instance.callbacks, other_id))  # milliseconds later
        done, _ = concurrent.futures.wait([other], timeout=1.0)
        assert not done, "a context went beside the batch while its partition was busy"
        held.gate.set()
        first = submitted.result(TIMEOUT).result(TIMEOUT)
        submitting.shutdown()
        outcome = other.result(TIMEOUT)
    assert first.committed and outcome.committed
    assert outcome.transaction_id > first.transaction_id
    service.wait_caught_up()
    assert service.counter_value(held_id) == 1 and service.counter_value(other_id) == 1


@pytest.mark.parametrize("entity_cache", [True], ids=["entity-cache"], indirect=True, scope="module")
@LINGER_DATABASE
def test_a_full_batch_does_not_wait_for_the_linger(service: Service) -> None:
    """A batch of ``max_members`` goes at once, whatever is left of the linger."""
    counter_id = service.create_counter()
    instance = service.first
    with EntityBatcher(instance.client, max_members=2, max_in_flight_alone=0, linger=10 * LINGER) as batcher:
        assert batcher.submit(Increment(instance.callbacks, counter_id)).result(TIMEOUT).committed
        futures = [batcher.submit(Increment(instance.callbacks, counter_id)) for _ in range(2)]
        # Well within the linger: a batch that waited for it would time out here.
        outcomes = [future.result(3 * LINGER) for future in futures]
        assert all(o.committed for o in outcomes) and outcomes[0].transaction_id == outcomes[1].transaction_id
        assert batcher.lingered == 0
    service.wait_caught_up()
    assert service.counter_value(counter_id) == 3


class Timed(Increment):
    """Notes when each attempt's ``run`` began (a first attempt runs as its transaction is sent),
    and on which thread."""

    def __init__(self, callbacks: ChangeSetCallbacks, counter_id: int) -> None:
        super().__init__(callbacks, counter_id)
        self.runs: list[float] = []
        self.threads: list[int] = []

    def run(self, tx: EntityTransaction) -> bool:
        self.runs.append(time.monotonic())
        self.threads.append(threading.get_ident())
        return super().run(tx)


@pytest.mark.parametrize("entity_cache", [True], ids=["entity-cache"], indirect=True, scope="module")
@LINGER_DATABASE
def test_the_batch_after_a_full_one_waits_a_linger_from_the_full_one(service: Service) -> None:
    """A batch that fills while the linger's call is scheduled goes at once and makes that call
    stale: the next batch waits a whole linger from the full one, not until the stale call comes
    (docs/design/sql.md "Batched entity transactions")."""
    counter_id = service.create_counter()
    instance = service.first
    with EntityBatcher(instance.client, max_members=2, max_in_flight_alone=0, linger=LINGER) as batcher:
        started = time.monotonic()
        sent = batcher.submit(Increment(instance.callbacks, counter_id))  # at once: nothing in flight
        # Right behind it (the partition's contexts come fast): queued, and when the first ends,
        # lingering, the linger's call scheduled for a linger after the first was sent.
        waiting = batcher.submit(Increment(instance.callbacks, counter_id))
        assert sent.result(TIMEOUT).committed
        time.sleep(1.0)
        full_at = time.monotonic()
        assert full_at - started < LINGER, (
            "the first commit took over two seconds: the linger passed before the batch could fill"
        )
        joining = batcher.submit(Increment(instance.callbacks, counter_id))  # full: both go at once
        outcomes = [future.result(TIMEOUT) for future in (waiting, joining)]
        assert all(o.committed for o in outcomes) and outcomes[0].transaction_id == outcomes[1].transaction_id
        assert batcher.lingered == 0
        after = Timed(instance.callbacks, counter_id)
        assert batcher.submit(after).result(TIMEOUT).committed
    assert after.runs[0] - full_at >= LINGER, (
        f"the batch after the full one went {after.runs[0] - full_at:.2f} s after it, with the stale call"
    )
    assert batcher.lingered == 1
    service.wait_caught_up()
    assert service.counter_value(counter_id) == 4


@pytest.mark.parametrize("entity_cache", [True], ids=["entity-cache"], indirect=True, scope="module")
@LINGER_DATABASE
def test_a_batch_with_a_context_that_has_a_timeout_behind_it_goes_at_once(service: Service) -> None:
    """A context with a timeout goes alone, and no context submitted after it can pass it: the
    lingering batch in front of it can no longer grow, so it goes at once, whatever is left of
    the linger (docs/design/sql.md "Batched entity transactions")."""
    counter_id = service.create_counter()
    instance = service.first
    with EntityBatcher(instance.client, max_in_flight_alone=0, linger=10 * LINGER) as batcher:
        assert batcher.submit(Increment(instance.callbacks, counter_id)).result(TIMEOUT).committed
        waiting = batcher.submit(Increment(instance.callbacks, counter_id))  # lingers
        timed = Increment(instance.callbacks, counter_id)
        timed.timeout = TIMEOUT
        behind = batcher.submit(timed)
        # Well within the linger: a batch that waited for it would time out here.
        outcomes = [future.result(3 * LINGER) for future in (waiting, behind)]
        assert all(o.committed for o in outcomes), outcomes
        assert outcomes[0].transaction_id < outcomes[1].transaction_id
        assert batcher.lingered == 0
    service.wait_caught_up()
    assert service.counter_value(counter_id) == 3


@pytest.mark.parametrize("entity_cache", [True], ids=["entity-cache"], indirect=True, scope="module")
@LINGER_DATABASE
def test_with_room_in_flight_a_context_left_behind_a_batch_goes_beside_it(service: Service) -> None:
    """With ``max_in_flight`` 2, the lingering batch in front of a context with a timeout goes at
    once, and that context, left queued, takes the second place in flight right after it, in queue
    order: it does not wait for the batch's end or the next submit (docs/design/sql.md "Batched
    entity transactions")."""
    counter_id = service.create_counter()
    other_id = service.create_counter(service.partition_of(counter_id))
    instance = service.first
    batcher = EntityBatcher(instance.client, max_in_flight=2, max_in_flight_alone=0, linger=10 * LINGER)
    with batcher:
        assert batcher.submit(Increment(instance.callbacks, counter_id)).result(TIMEOUT).committed
        waiting = batcher.submit(Increment(instance.callbacks, counter_id))  # lingers
        timed = Timed(instance.callbacks, other_id)
        timed.timeout = TIMEOUT
        # The batch in front can no longer grow: it goes at once, and the context behind it right
        # after it, from this submit's thread; waiting for that batch's end, it would go from a
        # sender thread once the commit came back.
        behind = batcher.submit(timed)
        assert timed.threads[:1] == [threading.get_ident()], (
            "the context left queued did not go right after the batch in front of it"
        )
        outcomes = [future.result(TIMEOUT) for future in (waiting, behind)]
    assert all(o.committed for o in outcomes), outcomes
    assert outcomes[0].transaction_id < outcomes[1].transaction_id
    assert batcher.lingered == 0
    service.wait_caught_up()
    assert service.counter_value(counter_id) == 2 and service.counter_value(other_id) == 1


@pytest.mark.parametrize("entity_cache", [True], ids=["entity-cache"], indirect=True, scope="module")
@LINGER_DATABASE
def test_nothing_waits_when_the_partition_s_last_transaction_went_longer_ago_than_the_linger(
    service: Service,
) -> None:
    """On a busy partition (a burst made its mean gap between submits tiny), a context submitted
    longer than the linger after the partition's last log transaction went still goes at once."""
    counter_id = service.create_counter()
    instance = service.first
    # A linger well above a commit's time on a loaded machine: the burst's first log transaction
    # must end within it for the next batch to wait. A burst long enough that the partition is
    # still busy after the sleep even when the burst's first (synchronous) attempt took 2 s.
    with EntityBatcher(instance.client, max_in_flight_alone=0, linger=2.0) as batcher:
        burst = [batcher.submit(Increment(instance.callbacks, counter_id)) for _ in range(24)]
        assert all(future.result(TIMEOUT).committed for future in burst)
        lingered = batcher.lingered
        assert lingered >= 1, "no batch of the burst waited (did its first commit outlast the linger?)"
        time.sleep(2.2)  # longer than the linger; the mean gap grows by about 2.2 s / 16 only
        assert batcher.submit(Increment(instance.callbacks, counter_id)).result(TIMEOUT).committed
        assert batcher.lingered == lingered
    service.wait_caught_up()
    assert service.counter_value(counter_id) == 25


@pytest.mark.parametrize("entity_cache", [True], ids=["entity-cache"], indirect=True, scope="module")
@LINGER_DATABASE
def test_nothing_waits_while_contexts_come_less_often_than_three_per_linger(service: Service) -> None:
    """A context that follows its partition's last log transaction within the linger still goes at
    once while the partition's contexts have come less often than three per linger (their running
    mean, ``LINGER_MIN_JOINING``): too few would join it. Once they come faster, batches wait."""
    counter_id = service.create_counter()
    instance = service.first
    # A linger well above a commit's time on a loaded machine: the burst's first log transaction
    # must end within it for the next batch to wait.
    with EntityBatcher(instance.client, max_in_flight_alone=0, linger=2.0) as batcher:
        assert batcher.submit(Increment(instance.callbacks, counter_id)).result(TIMEOUT).committed
        time.sleep(1.4)  # the mean: at least 1.4 s, above a third of the linger
        second = Timed(instance.callbacks, counter_id)
        assert batcher.submit(second).result(TIMEOUT).committed
        # Within the linger of the one before, each lowers the mean by a 16th of the difference.
        third = Timed(instance.callbacks, counter_id)
        assert batcher.submit(third).result(TIMEOUT).committed
        assert batcher.lingered == 0
        # Each went at once: its first attempt ran in the submit, on this thread.
        assert second.threads[:1] == third.threads[:1] == [threading.get_ident()]
        # A burst: the mean falls below a third of the linger after about 11 of these.
        burst = [batcher.submit(Increment(instance.callbacks, counter_id)) for _ in range(24)]
        assert all(future.result(TIMEOUT).committed for future in burst)
        assert batcher.lingered >= 1, "no batch of the burst waited (its first commit outlasted the linger?)"
    service.wait_caught_up()
    assert service.counter_value(counter_id) == 27


@pytest.mark.parametrize("entity_cache", [True], ids=["entity-cache"], indirect=True, scope="module")
@LINGER_DATABASE
def test_after_a_batch_that_outlasted_the_linger_its_members_submitters_are_waited_for(
    service: Service,
) -> None:
    """A log transaction of four that outlasts the linger ends with one context queued behind it:
    fewer than a third of its members' count, so that context waits a linger from the end, and
    what the four's submitters send next joins it in one log transaction, instead of waiting a
    round behind it (docs/design/sql.md "Batched entity transactions")."""
    counter_id = service.create_counter()
    instance = service.first
    linger = 1.0
    with EntityBatcher(instance.client, max_in_flight_alone=0, linger=linger) as batcher:
        # Contexts a few milliseconds apart: the partition's contexts come fast.
        burst = [batcher.submit(Increment(instance.callbacks, counter_id)) for _ in range(6)]
        assert all(future.result(TIMEOUT).committed for future in burst)
        held = HeldInRun(instance.callbacks, counter_id)
        # Queued behind the burst's last log transaction, the four go as one batch when the
        # linger passes, and its attempt runs on a sender thread, where ``held`` blocks.
        four = [
            batcher.submit(context)
            for context in (held, *(Increment(instance.callbacks, counter_id) for _ in range(3)))
        ]
        assert held.running.wait(TIMEOUT), "the batch of four never ran"
        queued = batcher.submit(Increment(instance.callbacks, counter_id))
        time.sleep(1.5 * linger)  # the batch outlasts the linger
        held.gate.set()
        outcomes = [future.result(TIMEOUT) for future in four]
        # The four's submitters again, within the linger from the batch's end.
        returning = [batcher.submit(Increment(instance.callbacks, counter_id)) for _ in range(2)]
        after = [future.result(TIMEOUT) for future in (queued, *returning)]
    assert all(o.committed for o in outcomes) and len({o.transaction_id for o in outcomes}) == 1
    assert all(o.committed for o in after)
    assert len({o.transaction_id for o in after}) == 1, (
        "the context queued behind the long batch went without the submitters coming back"
    )
    service.wait_caught_up()
    assert service.counter_value(counter_id) == 13


@pytest.mark.parametrize("entity_cache", [True], ids=["entity-cache"], indirect=True, scope="module")
@LINGER_DATABASE
def test_closing_the_batcher_ends_what_waits_for_the_linger(service: Service) -> None:
    """A context waiting for the linger when the batcher closes ends with ClientClosedError at once;
    the linger's call, when it comes, finds nothing to send."""
    counter_id = service.create_counter()
    instance = service.first
    partition = service.partition_of(counter_id)
    batcher = EntityBatcher(instance.client, max_in_flight_alone=0, linger=LINGER)
    try:
        sent = batcher.submit(Increment(instance.callbacks, counter_id))
        closed = RecordsExceptions(instance.callbacks, counter_id)
        waiting = batcher.submit(closed)  # behind it, lingering
        committed = sent.result(TIMEOUT)
        assert committed.committed and not waiting.done()
    finally:
        closed_at = time.monotonic()
        batcher.close()
    assert isinstance(waiting.exception(1.0), ClientClosedError)
    assert [type(e) for e in closed.exceptions] == [ClientClosedError], "its on_exception was not called"
    # The linger's call comes a linger after the first was sent, before ``closed_at``: wait past it.
    time.sleep(max(0.0, closed_at + LINGER + 0.5 - time.monotonic()))
    instance.client.flush(TIMEOUT)
    assert instance.client.get_high_water_mark(partition) == committed.transaction_id, (
        "something was appended after the batcher closed"
    )
    service.wait_caught_up()
    assert service.counter_value(counter_id) == 1


@pytest.mark.parametrize("entity_cache", [True], ids=["entity-cache"], indirect=True, scope="module")
@LINGER_DATABASE
def test_the_batcher_takes_its_linger_and_sends_alone_from_the_client_s_settings(service: Service) -> None:
    """Left out, ``linger`` and ``max_in_flight_alone`` are the client's ``client.batchLinger``
    and ``client.batchMaxInFlightAlone``; a negative or NaN linger is refused."""
    client = service.first.client
    with EntityBatcher(client) as batcher:
        assert batcher.linger == client.config.client_batch_linger == 0.015
        assert batcher.max_in_flight_alone == client.config.client_batch_max_in_flight_alone == 3
    for linger in (-0.001, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="linger must be at least 0"):
            EntityBatcher(client, linger=linger)


class SetPrice(EntityTransactionContext):
    """Inserts or updates a price, as given (the database rounds it to two places)."""

    def __init__(self, callbacks: ChangeSetCallbacks, priced_id: int, price: decimal.Decimal) -> None:
        super().__init__(callbacks, (Priced, priced_id))
        self.priced_id, self.price = priced_id, price
        self.seen: list[decimal.Decimal | None] = []

    def run(self, tx: EntityTransaction) -> bool:
        row = tx.get(Priced, self.priced_id)
        self.seen.append(None if row is None else row.price)
        if row is None:
            tx.insert(Priced, priced_id=self.priced_id, price=self.price)
        else:
            tx.update(row, price=self.price)
        return True


@pytest.mark.parametrize("entity_cache", [True], ids=["entity-cache"], indirect=True, scope="module")
def test_a_member_never_reads_a_value_of_an_earlier_member_the_database_would_store_otherwise(
    service: Service,
) -> None:
    """A Numeric value written by an earlier member is not handed to a later one (the database
    rounds it): the later member runs on its own after the batch and reads the stored value."""
    counter_id = service.create_counter()
    instance = service.first
    with EntityBatcher(instance.client) as batcher:
        gated = Gated(instance.callbacks, counter_id)
        first = batcher.submit(gated)
        setting = SetPrice(instance.callbacks, counter_id, decimal.Decimal("1.005"))
        reading = SetPrice(instance.callbacks, counter_id, decimal.Decimal("2.00"))
        futures = [batcher.submit(setting), batcher.submit(reading)]
        gated.gate.set()
        assert first.result(TIMEOUT).committed
        set_outcome, read_outcome = (future.result(TIMEOUT) for future in futures)
    assert set_outcome.committed and read_outcome.committed
    assert read_outcome.transaction_id != set_outcome.transaction_id, (
        "it read the unstored value in the batch"
    )
    # The stored row, read once the batch was applied: the price as the database rounded it.
    stored = reading.seen[-1]
    assert stored is not None and stored != decimal.Decimal("1.005"), stored
    assert stored == stored.quantize(decimal.Decimal("0.01")), stored
    assert abs(stored - decimal.Decimal("1.005")) <= decimal.Decimal("0.005"), stored


def test_a_batch_routes_by_its_members_at_a_newer_count_and_is_refused_when_they_part(
    service: Service,
) -> None:
    """docs/design/splits.md "Clients across a split": the client asks a context its partition at
    the newest count of its view of the epochs. A batch answers where every member goes at that
    count, and refuses (``CrossPartitionError``) when a split would part its members, instead of
    appending moved keys to the parent."""
    from waltz.jdbc_style.entity_batches import _Batch, _Member

    callbacks = service.first.callbacks
    count = service.num_partitions
    by_route: dict[tuple[int, int], list[Increment]] = {}
    for _ in range(2000):  # bounded draws: each key has one partition at each count
        context = Increment(callbacks, service.rng.randrange(1, 1 << 62))
        route = (context.partition_id(count), context.partition_id(2 * count))
        by_route.setdefault(route, []).append(context)
    partition = next(p for p, _ in by_route)
    stay = by_route[(partition, partition)][:2]
    move = by_route[(partition, partition + count)][:1]
    assert len(stay) == 2 and len(move) == 1, sorted(by_route)

    def batch(contexts: list[Increment]) -> _Batch:
        members = [_Member(c, concurrent.futures.Future()) for c in contexts]
        with EntityBatcher(service.first.client) as batcher:
            return _Batch(batcher, partition, members)

    together = batch(stay)
    assert together.partition_id(count) == partition
    assert together.partition_id(2 * count) == partition
    moved = batch(move + move)
    assert moved.partition_id(2 * count) == partition + count
    parting = batch(stay + move)
    assert parting.partition_id(count) == partition  # no split in view: the batcher's partition
    with pytest.raises(CrossPartitionError, match="parts at"):
        parting.partition_id(2 * count)
