"""The client mounts the new children of a split and holds each child's genesis until its parent
is applied up to its barrier (docs/design/splits.md "Clients across a split", "Why no update is
lost").

Real storage and server processes and a real ZooKeeper, a 2-partition cluster per test (a split
cannot be undone once a parent is sealing). The application is an in-memory store
(:class:`SplitStore`) that records the order of its apply calls and takes a child's genesis as the
SQL framework's marks do: a child's mark goes from none (-1) or its floor ``B(p)`` to
``B(p) + 1``. Contexts route a key by ``hash mod count`` (a divisible function) under a WRITE lock
of the key, so that an attempt in a new child passes the lock check only once its client applied
the child's genesis.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from concurrent.futures import Future
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from tests.admin.test_split_run import connect
from tests.client.client_helpers import MemoryStore
from tests.client.test_epoch_routing import (
    Keyed,
    applied_once,
    client_config,
    committed_in,
    seal_partition_0,
)
from tests.services.server.test_epoch_refusals import start_cluster
from waltz import BytesSerializer, PartitionLocalLock, Transaction, WaltzClient, WaltzClientConfig
from waltz.admin.split_open import open_child
from waltz.admin.split_run import SplitRun
from waltz.client.outcome import Outcome, OutcomeKind
from waltz.local.cluster import LocalCluster
from waltz.local.processes import wait_until
from waltz.metadata.zk import ClusterZk
from waltz.protocol.split_records import SPLIT_RECORD_HEADER, SplitGenesis, decode_split_record

#: Seconds at most to wait for the client to show a state.
WAIT = 60.0
#: Keys the writer of the live split cycles through (hash mod 4: each of the 4 partitions twice).
KEYS = 8


class SplitStore(MemoryStore):
    """A :class:`MemoryStore` that follows a split: it records every apply call in order, and
    applies a child's genesis from a mark of none or of its floor, noting the parent's mark then."""

    def __init__(self, start: Mapping[int, int]) -> None:
        super().__init__(start)
        self.order: list[tuple[int, int]] = []
        """(partition, transaction ID) of every apply call, in the order made."""
        self.parent_mark_at_genesis: dict[int, int] = {}

    def apply_transaction(self, transaction: Transaction) -> None:
        pid, tid = transaction.partition_id, transaction.transaction_id
        with self.lock:
            self.order.append((pid, tid))
        if transaction.header == SPLIT_RECORD_HEADER:
            record = decode_split_record(transaction.get_data(BytesSerializer()))
            if isinstance(record, SplitGenesis):
                with self.lock:
                    if self.marks[pid] in (-1, record.barrier):
                        self.parent_mark_at_genesis[pid] = self.marks[record.parent]
                        self.marks[pid] = record.barrier  # its floor: the genesis follows it
        super().apply_transaction(transaction)

    def position(self, partition_id: int, transaction_id: int) -> int:
        with self.lock:
            return self.order.index((partition_id, transaction_id))


def start_store(cluster: LocalCluster) -> SplitStore:
    marks = {pid: found.high_water_mark for pid, found in cluster.wait_ready(60).items()}
    return SplitStore({**marks, 2: -1, 3: -1})


def keyed(index: int) -> Keyed:
    key = index % KEYS
    return Keyed(key, f"key {key}, context {index}".encode(), lock=PartitionLocalLock("key", key))


def test_a_client_commits_through_a_live_split_and_applies_each_genesis_after_its_parents_barrier(
    tmp_path: Path, zookeeper: object
) -> None:
    with start_cluster(tmp_path / "cluster", zookeeper) as cluster:
        store = start_store(cluster)
        with WaltzClient(store, client_config(cluster)) as client:
            assert client.num_partitions == 2
            submitted: list[tuple[Keyed, Future[Outcome]]] = []
            stop = threading.Event()
            failures: list[BaseException] = []

            def writer() -> None:
                """Submit contexts a group of :data:`KEYS` at a time, each group waited for."""
                try:
                    for group in range(1000):
                        if stop.is_set():
                            return
                        futures = []
                        for index in range(group * KEYS, (group + 1) * KEYS):
                            context = keyed(index)
                            futures.append(client.submit(context))
                            submitted.append((context, futures[-1]))
                        for future in futures:
                            future.result(120)
                except BaseException as exc:
                    failures.append(exc)

            thread = threading.Thread(target=writer)
            thread.start()
            try:
                wait_until(
                    lambda: len(submitted) >= 2 * KEYS,
                    timeout=WAIT,
                    what="two groups submitted before the split",
                )
                with connect(cluster) as admin:
                    report = SplitRun(admin.cluster, wait=60).run(4)
                assert report.complete
                barriers = {p.parent: p.barrier for p in report.parents}
                wait_until(
                    lambda: client.mounted_partitions() == [0, 1, 2, 3],
                    timeout=WAIT,
                    what="both children mounted",
                )
                after_split = len(submitted)
                wait_until(
                    lambda: len(submitted) >= after_split + 3 * KEYS,
                    timeout=WAIT,
                    what="three groups submitted after the split",
                )
            finally:
                stop.set()
                thread.join(300)
            assert not thread.is_alive() and not failures, failures
            assert client.num_partitions == 4 and client.partition_ids == (0, 1, 2, 3)

            outcomes = [(context, committed(future)) for context, future in submitted]
            for context, outcome in outcomes:
                assert context.completions == [True] and not context.exceptions
                assert outcome.transaction_id is not None
                assert client.wait_applied(outcome.partition_id, outcome.transaction_id, 60)
            # Routed by the new count once the split completed: keys 2, 3, 6, 7 moved to the children.
            late = outcomes[after_split + KEYS :]
            assert late and all(o.partition_id == c.key_hash % 4 for c, o in late), [
                (c.key_hash, o.partition_id) for c, o in late
            ]
            assert {o.partition_id for _, o in late} == {0, 1, 2, 3}

        # Each child's genesis applied after its parent's barrier, with the parent's mark there.
        for parent, barrier in barriers.items():
            assert barrier is not None
            child = parent + 2
            assert store.position(parent, barrier) < store.position(child, barrier + 1)
            assert store.parent_mark_at_genesis[child] >= barrier
        # Every committed transaction applied exactly once, and nothing else of the writer.
        assert store.errors == [] and store.skipped == 0
        with store.lock:
            assert len(store.order) == len(set(store.order))
            applied = {
                (pid, a.transaction_id): a.data
                for pid, rows in store.applied.items()
                for a in rows
                if a.data.startswith(b"key ")
            }
        assert len(applied) == len(outcomes)
        for context, outcome in outcomes:
            assert applied[(outcome.partition_id, outcome.transaction_id)] == context.data


def committed(future: Future[Outcome]) -> Outcome:
    outcome = future.result(60)
    assert outcome.kind is OutcomeKind.COMMITTED, outcome
    return outcome


def test_a_client_mounting_only_a_child_holds_its_genesis_until_its_callbacks_show_the_parent_applied(
    tmp_path: Path, zookeeper: object
) -> None:
    with start_cluster(tmp_path / "cluster", zookeeper) as cluster:
        store = start_store(cluster)
        with connect(cluster) as admin:
            report = SplitRun(admin.cluster, wait=60).run(4)
        assert report.complete
        barrier = {p.parent: p.barrier for p in report.parents}[0]
        assert barrier is not None
        config = WaltzClientConfig(
            **cluster.client_settings(), zookeeper_session_timeout=10.0, client_auto_mount=False
        )
        with WaltzClient(store, config) as client:
            # The client makes the opened children its partitions; set_partitions takes one.
            wait_until(
                lambda: 2 in client.partition_states(), timeout=WAIT, what="partition 2 among the client's"
            )
            client.set_partitions([2])
            client.wait_mounted(60)
            # Its feed starts with the genesis (mounted from the floor, B(0)); the genesis waits
            # for partition 0, which another instance applies in this database: none has yet.
            wait_until(lambda: client.held_partitions() == {2: 0}, timeout=WAIT, what="the genesis held")
            assert client.wait_applied(2, barrier, 0)  # the floor
            assert client.unhealthy_partitions() == {}
            with store.lock:
                assert store.marks[2] == -1 and (2, barrier + 1) not in store.order
                assert store.marks[0] < barrier
                store.marks[0] = barrier  # another instance applied partition 0 up to its barrier
            assert client.wait_applied(2, barrier + 1, 60)
            assert store.parent_mark_at_genesis[2] == barrier
            assert client.held_partitions() == {} and client.unhealthy_partitions() == {}
            # The child takes a context under a lock: its client applied the genesis.
            context = Keyed(6, b"key 6 in partition 2", lock=PartitionLocalLock("key", 6))
            transaction_id = committed_in(client.submit(context), 2)
            applied_once(client, store, 2, transaction_id, context.data)
        assert store.errors == []


def test_a_context_routed_to_a_child_before_it_is_opened_waits_and_commits_in_it(
    tmp_path: Path, zookeeper: object
) -> None:
    with start_cluster(tmp_path / "cluster", zookeeper) as cluster:
        store = start_store(cluster)
        sealed = seal_partition_0(cluster)  # 2 -> 4, parent 0 sealed with B(0); child 2 not opened
        barrier = sealed.epoch(1).parents[0].barrier
        assert barrier is not None
        with WaltzClient(store, client_config(cluster)) as client:
            assert client.num_partitions == 4 and 2 not in client.partition_states()
            # The partitions there are: a tool reads every mark over these, while the count
            # already names new partitions that are not open (their marks cannot be asked).
            assert client.partition_ids == (0, 1)
            assert client.first_transaction_id(0) == 0 and client.first_transaction_id(2) == barrier + 1
            marks = {pid: client.get_high_water_mark(pid) for pid in client.partition_ids}
            assert marks[0] >= barrier
            with pytest.raises(ValueError):
                client.get_high_water_mark(2)
            context = Keyed(2, b"key 2, for partition 2", lock=PartitionLocalLock("key", 2))
            future = client.submit(context)
            assert not future.done()
            zk = KazooClient(hosts=cluster.zookeeper_connect_string)
            zk.start(30)
            try:
                assert open_child(ClusterZk(zk, cluster.root, timeout=30), 1, 2).opened
            finally:
                zk.stop()
                zk.close()
            transaction_id = committed_in(future, 2)
            assert transaction_id > barrier + 1
            applied_once(client, store, 2, transaction_id, context.data)
            assert context.completions == [True] and context.counts[0] == 4
        assert store.position(0, barrier) < store.position(2, barrier + 1)
        assert store.errors == []
