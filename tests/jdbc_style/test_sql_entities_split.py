"""Entity transactions through a split: each is told its route, reads the mark of the partition
its append goes to, and commits there (docs/design/splits.md "Clients across a split", "The SQL
framework across a split").

Real storage and server processes, a real ZooKeeper and a real SQLite database, a 2-partition
cluster per test (a split cannot be undone once a parent is sealing). A counter whose key is in
partition 0 at 2 partitions and in the new child 2 at 4 is created and incremented; the split is
prepared (the client's count is 4, but no parent is sealing, so the counter's route is still
partition 0 at epoch 0) and the counter incremented again; then the split runs to its end and the
counter, now routed to child 2, is incremented once more, after the instance applied the child's
genesis (its parent's mark in the same database at the barrier). Given the client, ``partition_of``
and ``read_entities`` route the counter's key as its transactions are routed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import support
from sqlalchemy import BigInteger, select
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from tests.admin.test_split_run import connect
from tests.services.server.test_epoch_refusals import start_cluster
from tests.services.server.test_split_barrier import with_epochs
from waltz import WaltzClient, WaltzClientConfig
from waltz.admin.split_run import SplitRun
from waltz.client.outcome import OutcomeKind
from waltz.errors import CrossPartitionError
from waltz.jdbc_style import (
    ChangeSetCallbacks,
    EntityBatcher,
    EntityRegistry,
    EntityTransaction,
    EntityTransactionContext,
    WaltzEntity,
    create_framework_engine,
    partition_of,
)
from waltz.jdbc_style.entity_batches import BatchPartedError
from waltz.jdbc_style.migrations_api import upgrade
from waltz.local.processes import wait_until

#: Seconds a test waits for one outcome (a future, a mark).
TIMEOUT = 60


class Base(DeclarativeBase):
    pass


class SplitCounter(Base):
    """A counter; its lock ID is its key, so its partition is a stable hash of the key."""

    __tablename__ = "split_counters"
    __waltz__ = WaltzEntity("split_counter")

    counter_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    value: Mapped[int] = mapped_column(BigInteger, nullable=False)


class Bump(EntityTransactionContext):
    """Creates the counter at 1, or adds 1 to it."""

    def __init__(self, callbacks: ChangeSetCallbacks, counter_id: int) -> None:
        super().__init__(callbacks, (SplitCounter, counter_id), timeout=20.0)
        self.counter_id = counter_id
        self.read_at: list[int] = []

    def run(self, tx: EntityTransaction) -> bool:
        self.read_at.append(tx.high_water_mark)
        counter = tx.get(SplitCounter, self.counter_id)
        if counter is None:
            tx.insert(SplitCounter, counter_id=self.counter_id, value=1)
        else:
            tx.update(counter, value=counter.value + 1)
        return True


@pytest.fixture(params=[False, True], ids=["no-entity-cache", "entity-cache"])
def entity_cache(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


@pytest.fixture
def database(tmp_path: Path) -> Iterator[str]:
    url = f"sqlite:///{tmp_path / 'app.db'}"
    engine = create_framework_engine(url)
    try:
        upgrade(engine)
        Base.metadata.create_all(engine)
    finally:
        engine.dispose()
    yield url


def test_entity_transactions_commit_on_their_route_before_during_and_after_a_split(
    tmp_path: Path, zookeeper: object, database: str, entity_cache: bool
) -> None:
    registry = EntityRegistry.from_base(Base)
    info = registry.info(SplitCounter)
    counter_id = next(
        c for c in range(1, 100_000) if info.partition_of((c,), 2) == 0 and info.partition_of((c,), 4) == 2
    )
    engine = create_framework_engine(database)
    with start_cluster(tmp_path / "cluster", zookeeper) as cluster:
        cluster.wait_ready(60)
        callbacks = ChangeSetCallbacks(
            engine,
            cluster_name=f"split-{support.unique_suffix()}",
            registry=registry,
            entity_cache=entity_cache,
        )
        config = WaltzClientConfig(**cluster.client_settings(), zookeeper_session_timeout=10.0)
        try:
            with WaltzClient(callbacks, config) as client:

                def bump() -> tuple[Bump, int, int]:
                    context = Bump(callbacks, counter_id)
                    outcome = client.submit(context).result(TIMEOUT)
                    assert outcome.kind is OutcomeKind.COMMITTED, outcome
                    assert outcome.transaction_id is not None
                    assert callbacks.wait_for(outcome.partition_id, outcome.transaction_id, TIMEOUT)
                    return context, outcome.partition_id, outcome.transaction_id

                assert bump()[1:2] == (0,)
                # Prepared, no parent sealing: the count is 4, the counter's route partition 0.
                marks = {pid: client.get_high_water_mark(pid) for pid in (0, 1)}
                with_epochs(cluster, "prepare", 4, marks)
                wait_until(lambda: client.num_partitions == 4, timeout=TIMEOUT, what="the count of 4")
                context, partition, transaction_id = bump()
                assert partition == 0 and context.read_at[0] >= marks[0], context.read_at
                # Given the client, partition_of and read_entities route as the context did; given
                # the newest count, partition_of answers the key's partition at that count.
                assert partition_of(SplitCounter, counter_id, client) == 0
                assert partition_of(SplitCounter, counter_id, client.num_partitions) == 2
                read = callbacks.read_entities(
                    [(SplitCounter, counter_id)], num_partitions=client, after=transaction_id
                )
                assert read.partition_id == 0 and read.entities[0].value == 2
                # The split to its end: the counter's route is child 2, once its genesis is applied.
                with connect(cluster) as admin:
                    report = SplitRun(admin.cluster, wait=60).run(4)
                assert report.complete
                barrier = {p.parent: p.barrier for p in report.parents}[0]
                assert barrier is not None and barrier > transaction_id
                context, partition, transaction_id = bump()
                assert partition == 2 and transaction_id > barrier + 1
                assert partition_of(SplitCounter, counter_id, client) == 2
                read = callbacks.read_entities(
                    [(SplitCounter, counter_id)], num_partitions=client, after=transaction_id
                )
                assert read.partition_id == 2 and read.entities[0].value == 3
                assert context.read_at[-1] >= barrier + 1, context.read_at
                assert callbacks.high_water_marks()[0] >= barrier
        finally:
            engine.dispose()
        assert callbacks.uncaught_count == 0, list(callbacks.uncaught)
    check = create_framework_engine(database)
    try:
        with check.connect() as conn:
            value = conn.execute(
                select(SplitCounter.value).where(SplitCounter.counter_id == counter_id)
            ).scalar()
    finally:
        check.dispose()
    assert value == 3


class GatedBump(Bump):
    """A bump whose completion waits for ``gate``: its partition's batcher slot stays taken, so
    contexts submitted meanwhile queue for one batch."""

    def __init__(self, callbacks: ChangeSetCallbacks, counter_id: int) -> None:
        super().__init__(callbacks, counter_id)
        self.gate = threading.Event()

    def on_completion(self, result: bool) -> None:
        assert self.gate.wait(TIMEOUT), "the test never opened the gate"


class BatchedBump(Bump):
    """A bump without a timeout (a context with one goes alone, never in a batch)."""

    def __init__(self, callbacks: ChangeSetCallbacks, counter_id: int) -> None:
        EntityTransactionContext.__init__(self, callbacks, (SplitCounter, counter_id))
        self.counter_id = counter_id
        self.read_at = []


class BatchedPair(EntityTransactionContext):
    """Bumps two counters in one transaction (both of its partition when it is queued); notes what
    its ``on_exception`` was given."""

    def __init__(self, callbacks: ChangeSetCallbacks, first: int, second: int) -> None:
        super().__init__(callbacks, (SplitCounter, first), (SplitCounter, second))
        self.ids = (first, second)
        self.exceptions: list[BaseException] = []

    def run(self, tx: EntityTransaction) -> bool:
        for counter_id in self.ids:
            counter = tx.get(SplitCounter, counter_id)
            if counter is not None:
                tx.update(counter, value=counter.value + 1)
        return True

    def on_exception(self, exception: BaseException) -> None:
        self.exceptions.append(exception)


def test_a_batch_queued_before_a_split_that_parts_its_members_is_regrouped_at_the_new_count(
    tmp_path: Path, zookeeper: object, database: str
) -> None:
    """docs/design/splits.md "Clients across a split": two bumps queued in partition 0's batch at 2
    partitions, one of a counter that stays there and one of a counter that moves to child 2 at 4,
    and a transaction of both counters; the split completes before the batch goes. The batch parts,
    and each bump commits in its partition at 4, once, where a batch sent to partition 0 would write
    the moved counter beside its new partition; the transaction of both, whose own entities part at
    4, ends alone with its ``CrossPartitionError``, not the others with it."""
    registry = EntityRegistry.from_base(Base)
    info = registry.info(SplitCounter)
    stays, moves, gated_id = (
        next(
            c
            for c in range(start, 100_000)
            if info.partition_of((c,), 2) == 0 and info.partition_of((c,), 4) == to
        )
        for start, to in ((1, 0), (1, 2), (50_000, 0))
    )
    engine = create_framework_engine(database)
    with start_cluster(tmp_path / "cluster", zookeeper) as cluster:
        cluster.wait_ready(60)
        callbacks = ChangeSetCallbacks(
            engine, cluster_name=f"regroup-{support.unique_suffix()}", registry=registry
        )
        config = WaltzClientConfig(**cluster.client_settings(), zookeeper_session_timeout=10.0)
        try:
            with (
                WaltzClient(callbacks, config) as client,
                EntityBatcher(client, max_in_flight=1, max_in_flight_alone=0) as batcher,
            ):
                gated = GatedBump(callbacks, gated_id)
                first = batcher.submit(gated)
                bumps = [BatchedBump(callbacks, stays), BatchedBump(callbacks, moves)]
                pair = BatchedPair(callbacks, stays, moves)
                futures = [batcher.submit(bump) for bump in bumps]
                parted = batcher.submit(pair)
                with connect(cluster) as admin:
                    assert SplitRun(admin.cluster, wait=60).run(4).complete
                wait_until(lambda: client.num_partitions == 4, timeout=TIMEOUT, what="the count of 4")
                assert not any(future.done() for future in (*futures, parted))  # behind the gate
                gated.gate.set()
                assert first.result(TIMEOUT).committed
                outcomes = [future.result(TIMEOUT) for future in futures]
                assert [o.kind for o in outcomes] == [OutcomeKind.COMMITTED] * 2, outcomes
                error = parted.exception(TIMEOUT)
                assert isinstance(error, CrossPartitionError) and not isinstance(error, BatchPartedError)
                assert pair.exceptions == [error]
                assert [o.partition_id for o in outcomes] == [0, 2], outcomes
                for outcome in outcomes:
                    assert outcome.transaction_id is not None
                    assert callbacks.wait_for(outcome.partition_id, outcome.transaction_id, TIMEOUT)
                assert all(len(bump.read_at) >= 1 for bump in bumps)
        finally:
            engine.dispose()
        assert callbacks.uncaught_count == 0, list(callbacks.uncaught)
    check = create_framework_engine(database)
    try:
        with check.connect() as conn:
            values = dict(conn.execute(select(SplitCounter.counter_id, SplitCounter.value)).all())
    finally:
        check.dispose()
    assert values == {gated_id: 1, stays: 1, moves: 1}


class _Router:
    """A client's routing as ``read_entities`` asks it: every key in partition 2, a new partition
    whose log starts at 42."""

    def partition_for(self, choose: Callable[[int], int]) -> int:
        return 2

    def first_transaction_id(self, partition_id: int) -> int:
        return 42 if partition_id == 2 else 0


def test_a_read_routed_to_a_new_partition_waits_for_its_genesis() -> None:
    """docs/design/splits.md "The SQL framework across a split", Entities: a read routed by the
    client to a new partition includes its genesis at least; a count routes without a wait."""
    from waltz.jdbc_style.entity_reads import _after_genesis

    router = _Router()
    assert _after_genesis(router, 2, None) == 42
    assert _after_genesis(router, 2, 41) == 42
    assert _after_genesis(router, 2, 50) == 50
    assert _after_genesis(router, 0, None) is None
    assert _after_genesis(4, 2, None) is None
