"""A rolling deploy of a model change on PostgreSQL: two instances share one database and keep
committing while one of them is upgraded (docs/design/sql.md "Schema versions and upcasting";
docs/sql.md "Changing a model").

The model gains a column (an alembic migration adds it with a server default; version 2 declares
the attribute and the upcaster that gives older changes the same value). While one instance runs the
new model and the other still the old one, the old instance meets records it cannot read: its
partition waits, its health says why, and nothing of those records is applied or skipped by it.
Upgraded, it catches up. Every log transaction is applied exactly once: an audit row per
transaction, written in the apply's own database transaction under a unique key, proves it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import support
from alembic.migration import MigrationContext
from alembic.operations import Operations
from sqlalchemy import BigInteger, Column, Engine, Integer, String, UniqueConstraint, func, insert, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from waltz import Transaction, WaltzClient, WaltzClientConfig
from waltz.errors import PartitionPausedError
from waltz.jdbc_style import (
    AddAttribute,
    ChangeSet,
    ChangeSetCallbacks,
    EntityRegistry,
    EntityTransaction,
    EntityTransactionContext,
    SchemaVersionAheadError,
    WaltzEntity,
    create_framework_engine,
)
from waltz.jdbc_style.migrations_api import upgrade
from waltz.local.cluster import LocalCluster
from waltz.local.processes import wait_until

TIMEOUT = 60
NAME = "rolling"
COUNTERS = 8


class V1(DeclarativeBase):
    pass


class CounterV1(V1):
    __tablename__ = "rolling_counters"
    __waltz__ = WaltzEntity("rolling_counter")
    counter_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    value: Mapped[int] = mapped_column(BigInteger)


class V2(DeclarativeBase):
    pass


class CounterV2(V2):
    __tablename__ = "rolling_counters"
    __waltz__ = WaltzEntity(
        "rolling_counter", schema_version=2, upcasters=[AddAttribute(1, "label", "unlabelled")]
    )
    counter_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    value: Mapped[int] = mapped_column(BigInteger)
    label: Mapped[str] = mapped_column(String(40), server_default="unlabelled")


class Audit(V1):
    """One row per applied transaction: a second apply of it breaks the unique key."""

    __tablename__ = "rolling_audit"
    __table_args__ = (UniqueConstraint("partition_id", "transaction_id"),)
    audit_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    partition_id: Mapped[int] = mapped_column(Integer)
    transaction_id: Mapped[int] = mapped_column(BigInteger)


class AuditedCallbacks(ChangeSetCallbacks):
    """Writes the audit row with each change-set; ``hold`` (a partition) makes its applies of that
    partition wait until released (an instance that is slow to apply)."""

    def __init__(self, engine: Engine, models: list[type[Any]]) -> None:
        super().__init__(engine, cluster_name=NAME, registry=EntityRegistry(models), entity_cache=True)
        self.hold: int | None = None
        self.released = threading.Event()

    def apply_change_set(self, change_set: ChangeSet, transaction: Transaction, session: Session) -> None:
        if transaction.partition_id == self.hold:
            self.released.wait(TIMEOUT)
        super().apply_change_set(change_set, transaction, session)
        session.execute(
            insert(Audit.__table__).values(  # type: ignore[arg-type]
                partition_id=transaction.partition_id, transaction_id=transaction.transaction_id
            )
        )


class Increment(EntityTransactionContext):
    def __init__(self, callbacks: ChangeSetCallbacks, model: type[Any], counter_id: int, label: str | None):
        super().__init__(callbacks, (model, counter_id))
        self.model, self.counter_id, self.label = model, counter_id, label

    def run(self, tx: EntityTransaction) -> bool:
        counter = tx.get(self.model, self.counter_id)
        extra = {} if self.label is None else {"label": self.label}
        if counter is None:
            tx.insert(self.model, counter_id=self.counter_id, value=1, **extra)
        else:
            tx.update(counter, value=counter.value + 1, **extra)
        return True


@dataclass
class Instance:
    """An application instance, and its committers: one thread per partition, so that a partition
    whose applies wait does not stop its commits to the other."""

    name: str
    engine: Engine
    callbacks: AuditedCallbacks
    client: WaltzClient
    model: type[Any]
    committed: list[int] = field(default_factory=list)
    paused: dict[int, PartitionPausedError] = field(default_factory=dict)
    """Partitions whose committer stopped: a retry met a newer release's transaction there."""
    stops: dict[int, threading.Event] = field(default_factory=dict)
    threads: list[threading.Thread] = field(default_factory=list)

    def commit_in_background(self) -> None:
        label = "v2" if self.model is CounterV2 else None
        info = self.callbacks.registry.info(self.model)
        partitions = self.client.num_partitions
        by_partition: dict[int, list[int]] = {}
        for counter_id in range(COUNTERS):
            by_partition.setdefault(info.partition_of((counter_id,), partitions), []).append(counter_id)

        def run(pid: int, counters: list[int], stop: threading.Event) -> None:
            for n in range(2_000):  # bounded; stopped by the test long before
                if stop.is_set():
                    return
                counter_id = counters[n % len(counters)]
                context = Increment(self.callbacks, self.model, counter_id, label)
                try:
                    outcome = self.client.submit(context).result(TIMEOUT)
                except PartitionPausedError as paused:
                    # An old instance's retry after a lock failure on the newer release's
                    # transaction: it ends here, as the application's request would (the test
                    # checks that no upgraded instance's does).
                    self.paused[pid] = paused
                    return
                assert outcome.committed, outcome
                self.committed.append(counter_id)

        for pid, counters in sorted(by_partition.items()):
            stop = self.stops[pid] = threading.Event()
            thread = threading.Thread(
                target=run, args=(pid, counters, stop), name=f"commits-{self.name}-{pid}", daemon=True
            )
            self.threads.append(thread)
            thread.start()

    def stop_committing(self, partition: int | None = None) -> None:
        """Stop the committers (of one partition), waiting for their last submission's outcome."""
        for pid, stop in self.stops.items():
            if partition is None or pid == partition:
                stop.set()
        for thread in self.threads:
            if partition is None or thread.name.endswith(f"-{partition}"):
                thread.join(TIMEOUT)
                assert not thread.is_alive(), f"{thread.name} kept committing"

    def close(self) -> None:
        self.callbacks.released.set()
        self.stop_committing()
        self.client.close()
        self.engine.dispose()


@pytest.fixture(scope="module")
def rolling_cluster(tmp_path_factory: pytest.TempPathFactory, zookeeper: object) -> Iterator[LocalCluster]:
    with support.session_cluster(tmp_path_factory, zookeeper, name="rolling", partitions=2) as cluster:
        cluster.wait_ready(60)
        yield cluster


def start(cluster: LocalCluster, url: str, name: str, model: type[Any]) -> Instance:
    engine = create_framework_engine(url)
    callbacks = AuditedCallbacks(engine, [model])
    client = WaltzClient(
        callbacks,
        WaltzClientConfig(**cluster.client_settings()),
    )
    client.wait_mounted(TIMEOUT)
    return Instance(name, engine, callbacks, client, model)


def add_label_column(engine: Engine) -> None:
    """The alembic migration of version 2: the column, with the upcaster's value as its default."""
    with engine.begin() as conn:
        op = Operations(MigrationContext.configure(conn))
        op.add_column("rolling_counters", Column("label", String(40), server_default="unlabelled"))


def test_a_rolling_deploy_pauses_the_old_instance_and_applies_every_transaction_once(
    rolling_cluster: LocalCluster, postgres_url: str
) -> None:
    engine = create_framework_engine(postgres_url)
    upgrade(engine)
    V1.metadata.create_all(engine)
    first = start(rolling_cluster, postgres_url, "first", CounterV1)
    second = start(rolling_cluster, postgres_url, "second", CounterV1)
    instances = [first, second]
    try:
        for instance in instances:
            instance.commit_in_background()
        wait_until(
            lambda: len(first.committed) >= 20 and len(second.committed) >= 20,
            timeout=TIMEOUT,
            what="commits on the version 1 model",
        )

        # The migration first (compatible with the old model), then the second instance upgraded.
        # It is slow to apply partition 0, so that the first instance meets its new records there;
        # on partition 0 only the upgraded instance commits from now on (its retries after a lock
        # failure would wait for its own held applies), and it starts from an applied database.
        add_label_column(engine)
        second.close()
        instances.remove(second)
        first.stop_committing(partition=0)
        log_end = first.client.get_high_water_mark(0)
        assert first.callbacks.wait_for(0, log_end, TIMEOUT), "partition 0 not applied before the upgrade"
        upgraded = start(rolling_cluster, postgres_url, "second-v2", CounterV2)
        upgraded.callbacks.hold = 0
        instances.append(upgraded)
        upgraded.commit_in_background()

        def first_waits() -> bool:
            reason = first.client.unhealthy_partitions().get(0)
            return isinstance(reason, SchemaVersionAheadError)

        wait_until(first_waits, timeout=TIMEOUT, what="the old instance to wait on partition 0")
        reason = first.client.unhealthy_partitions()[0]
        assert "rolling_counter row change of schema version 2" in str(reason)
        assert "model of rolling_counter is version 1" in str(reason)
        assert first.client.unhealthy_partitions().keys() <= {0, 1}

        # The new instance applies; then the old one is upgraded too and catches up.
        upgraded.callbacks.released.set()
        first.close()
        instances.remove(first)
        first_v2 = start(rolling_cluster, postgres_url, "first-v2", CounterV2)
        instances.append(first_v2)
        first_v2.commit_in_background()
        wait_until(
            lambda: len(first_v2.committed) >= 20,
            timeout=TIMEOUT,
            what="commits of the upgraded first instance",
        )
        for instance in instances:
            instance.stop_committing()

        for instance in instances:
            instance.client.flush(TIMEOUT)
        marks = {p: first_v2.client.get_high_water_mark(p) for p in range(first_v2.client.num_partitions)}
        for instance in instances:
            for pid, mark in marks.items():
                assert instance.callbacks.wait_for(pid, mark, TIMEOUT), (
                    f"{instance.name}: {pid} not at {mark}"
                )
            assert not instance.client.unhealthy_partitions(), instance.client.unhealthy_partitions()
            assert not instance.paused, instance.paused  # the upgraded instances' requests all ran
            assert instance.callbacks.uncaught_count == 0, list(instance.callbacks.uncaught)

        with engine.connect() as conn:
            audited = {(p, t) for p, t in conn.execute(select(Audit.partition_id, Audit.transaction_id))}
            total = conn.execute(select(func.sum(CounterV2.value))).scalar()
            labels = dict(conn.execute(select(CounterV2.label, func.count()).group_by(CounterV2.label)).all())
        # Exactly once: every transaction of the log has its audit row (the unique key refuses two).
        assert audited == {(p, t) for p, mark in marks.items() for t in range(mark + 1)}
        increments = (
            len(first.committed) + len(second.committed) + len(upgraded.committed) + len(first_v2.committed)
        )
        assert total == increments, "an increment was lost or applied twice"
        assert set(labels) <= {"unlabelled", "v2"}
        assert labels.get("v2", 0) > 0
    finally:
        for instance in instances:
            instance.close()
        engine.dispose()
