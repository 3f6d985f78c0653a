"""The Waltz client against a real local cluster (ZooKeeper, 3 storage nodes, 2 servers)."""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.client.client_helpers import Append, Increment, MemoryStore, PrefetchingStore
from waltz import (
    BytesSerializer,
    Outcome,
    PartitionLocalLock,
    Transaction,
    TransactionBuilder,
    WaltzClient,
    WaltzClientConfig,
)
from waltz.client.mount_procedure import PartitionState
from waltz.errors import (
    ApplyPausedError,
    ClientAheadOfLogError,
    ClientClosedError,
    PartitionNotMountedError,
    PartitionPausedError,
    TransactionExpiredError,
)
from waltz.local.cluster import LocalCluster
from waltz.local.processes import wait_until


def wait_applied(store: MemoryStore, marks: dict[int, int], timeout: float = 30) -> None:
    def done() -> bool:
        return all(store.get_client_high_water_mark(pid) >= mark for pid, mark in marks.items())

    wait_until(done, timeout=timeout, what=f"the store to apply up to {marks} (at {store.marks})")


def test_submit_and_apply_round_trip_with_two_clients_sharing_a_store(
    client_config: WaltzClientConfig, log_start: dict[int, int]
) -> None:
    store = MemoryStore(log_start)
    with WaltzClient(store, client_config) as first, WaltzClient(store, client_config) as second:
        assert first.client_id != second.client_id
        assert first.num_partitions == 2
        contexts = [
            (client, Append(i % 2, f"{client.client_id}:{i}".encode(), header=i))
            for i in range(200)
            for client in (first, second)
        ]
        futures = [client.submit(context) for client, context in contexts]
        ids = [future.result(30).transaction_id for future in futures]
        assert all(isinstance(i, int) for i in ids)
        for client in (first, second):
            client.flush(10)
            assert not client.has_pending_transactions()
        marks = {pid: first.get_high_water_mark(pid) for pid in (0, 1)}
        assert marks == {pid: second.get_high_water_mark(pid) for pid in (0, 1)}
        wait_applied(store, marks)
        for client in (first, second):
            for pid, mark in marks.items():
                assert client.wait_applied(pid, mark, 30), (
                    f"client {client.client_id} did not apply {pid}:{mark}"
                )

    assert store.errors == []
    by_id = {(a.transaction_id, pid): a for pid, applied in store.applied.items() for a in applied}
    for pid, applied in store.applied.items():
        # Every transaction once, in ID order, nothing else.
        assert [a.transaction_id for a in applied] == list(range(log_start[pid] + 1, marks[pid] + 1))
    assert len(by_id) == len(contexts)
    for (client, context), transaction_id in zip(contexts, ids, strict=True):
        assert transaction_id is not None
        entry = by_id[(transaction_id, context.partition)]
        assert entry.data == context.data  # fetched over RPC when the other client wrote it
        assert entry.header == context.header
        assert entry.client_id == client.client_id
        assert context.outcomes.completions == [True]
        assert context.outcomes.executions == 1
    # Each client applied what it saw and the other had not applied yet: no transaction twice, and
    # a client never asked to apply what the store already had when it mounted.
    for pid, calls in store.calls.items():
        assert len(calls) == len(set(calls)) + store.skipped_by_partition[pid]


def test_same_write_lock_and_high_water_mark_from_two_clients_commits_exactly_one(
    client_config: WaltzClientConfig, log_start: dict[int, int]
) -> None:
    store = MemoryStore(log_start)
    lock = PartitionLocalLock("race", 1)
    with (
        WaltzClient(store, client_config) as first,
        WaltzClient(store, client_config) as second,
        concurrent.futures.ThreadPoolExecutor(2) as pool,
    ):
        barrier = threading.Barrier(2)

        def submit(client: WaltzClient, context: Append) -> concurrent.futures.Future[Outcome]:
            barrier.wait(10)
            return client.submit(context)

        for round_number in range(100):
            mark = store.get_client_high_water_mark(0)
            contexts = [Append(0, b"race %d" % round_number, write_lock=lock, high_water_mark=mark, once=True)
                        for _ in range(2)]  # fmt: skip
            submitted = [
                pool.submit(submit, c, ctx) for c, ctx in zip((first, second), contexts, strict=True)
            ]
            results = [s.result(10).result(30).transaction_id for s in submitted]
            committed = [r for r in results if r is not None]
            assert len(committed) == 1, f"round {round_number}: {results}"
            loser = contexts[results.index(None)]
            assert loser.outcomes.lock_failures == 1, f"round {round_number}: {loser.outcomes}"
            assert loser.outcomes.completions == [False]
            wait_applied(store, {0: committed[0]})
    assert store.errors == []
    assert len(store.applied[0]) == 100


def server_lock_failures(cluster: LocalCluster, partition_id: int) -> float:
    """Appends the servers' lock checks refused on a partition (``waltz_server_partition_lock_failures``)."""
    total = 0.0
    context = None if cluster.admin_tls is None else cluster.admin_tls.https_context()
    for name, url in cluster.metrics_urls().items():
        if name.startswith("server"):
            with urllib.request.urlopen(url, timeout=10, context=context) as response:
                text = response.read().decode("utf-8")
            for family in text_string_to_metric_families(text):
                if family.name == "waltz_server_partition_lock_failures":
                    label = str(partition_id)
                    total += sum(s.value for s in family.samples if s.labels["partition"] == label)
    return total


def burst_of_refused_pairs(store: MemoryStore, client: WaltzClient, pairs: int) -> None:
    """Appends sent in one burst: a pair on one lock and the same mark, then one without locks.

    The second of a pair finds the first pending and fails once it commits; the third commits with
    it. Whoever finds the conflict (the server, or the client holding the second back), the client
    must report a lock failure (the context's ``on_lock_failure``, the lock failure counter) and
    never take the refused append for a lost one when its transaction monitor sees the third
    (docs/design/client.md "Failed-append detection"), which is what the feed alone would say.
    """
    registry = client.metrics
    mark = store.get_client_high_water_mark(0)
    seconds: list[Append] = []
    futures = []
    for index in range(pairs):  # one thread, no waiting: the appends leave in few messages
        lock = PartitionLocalLock("burst", index)
        first = Append(0, b"first %d" % index, write_lock=lock, high_water_mark=mark, once=True)
        second = Append(0, b"second %d" % index, write_lock=lock, high_water_mark=mark, once=True)
        third = Append(0, b"third %d" % index)
        seconds.append(second)
        futures += [client.submit(first), client.submit(second), client.submit(third)]
    results = [f.result(30) for f in futures]
    assert all(r.committed for i, r in enumerate(results) if i % 3 != 1), results
    assert all(r.dropped for r in results[1::3]), "a second append of a pair committed"
    for index, second in enumerate(seconds):
        assert second.outcomes.lock_failures == 1, f"pair {index}: {second.outcomes}"
        assert second.outcomes.completions == [False]
    client.flush(10)
    assert registry.get_sample_value("waltz_client_lock_failures_total", {"partition": "0"}) == pairs
    assert registry.get_sample_value("waltz_client_failed_appends_total", {"partition": "0"}) == 0


def test_a_lock_refused_behind_an_append_in_flight_is_a_lock_failure_not_a_lost_append(
    cluster: LocalCluster, client_config: WaltzClientConfig, log_start: dict[int, int]
) -> None:
    """The server finds the conflicts (the client sends every append: holding back is off)."""
    store = MemoryStore(log_start)
    pairs = 20
    refused_before = server_lock_failures(cluster, 0)
    config = client_config.model_copy(update={"client_hold_conflicting_appends": False})
    with WaltzClient(store, config) as client:
        burst_of_refused_pairs(store, client, pairs)
        assert client.metrics.get_sample_value("waltz_client_held_appends_total", {"partition": "0"}) == 0
    assert server_lock_failures(cluster, 0) - refused_before == pairs
    assert store.errors == []


def test_an_append_behind_a_pending_append_of_its_own_client_on_its_lock_is_held_back(
    cluster: LocalCluster, client_config: WaltzClientConfig, log_start: dict[int, int]
) -> None:
    """With ``client.holdConflictingAppends`` (the default) the client keeps the second of a pair
    whose first is still pending to itself: a lock failure once the first commits, never sent."""
    store = MemoryStore(log_start)
    pairs = 20
    refused_before = server_lock_failures(cluster, 0)
    with WaltzClient(store, client_config) as client:
        burst_of_refused_pairs(store, client, pairs)
        held = client.metrics.get_sample_value("waltz_client_held_appends_total", {"partition": "0"})
    refused = server_lock_failures(cluster, 0) - refused_before
    # A second sent after its first committed (the burst's thread descheduled that long) would
    # reach the server and be refused there; every one is one or the other, and they are held.
    assert held is not None and held + refused == pairs and held >= 1, (held, refused)
    assert store.errors == []


def test_sequential_read_modify_writes_from_one_client_never_fail_their_lock(
    client_config: WaltzClientConfig, log_start: dict[int, int]
) -> None:
    store = MemoryStore(log_start)
    lock = PartitionLocalLock("counter", 7)
    with WaltzClient(store, client_config) as client:
        for _ in range(100):
            context = Increment(store, 1, lock)
            assert client.submit(context).result(30).committed
            assert context.outcomes.lock_failures == 0, "a read-modify-write did not see its previous write"
            assert context.outcomes.executions == 1
        client.flush(10)
        wait_applied(store, {1: client.get_high_water_mark(1)})
    assert store.values[1] == 100
    assert store.errors == []


class ExpectingIncrement(Increment):
    """An :class:`Increment` that tells the client its lock before it runs (``expected_locks``)."""

    def __init__(self, store: MemoryStore, partition: int, lock: PartitionLocalLock) -> None:
        super().__init__(store, partition, lock)
        self.first_thread: int | None = None

    def expected_locks(self) -> list[PartitionLocalLock]:
        return [self.lock]

    def execute(self, builder: TransactionBuilder) -> bool:
        if self.first_thread is None:
            self.first_thread = threading.get_ident()
        return super().execute(builder)


def test_contexts_queued_behind_an_own_append_on_their_expected_lock_execute_once(
    cluster: LocalCluster, client_config: WaltzClientConfig, log_start: dict[int, int]
) -> None:
    """docs/design/locks.md "Locks of appends in flight": a context whose expected lock a pending
    append of its client holds waits for it without executing, then executes once, in order."""
    store = MemoryStore(log_start)
    lock = PartitionLocalLock("counter", 11)
    with WaltzClient(store, client_config) as client:
        client.wait_mounted(30)
        owner = cluster.owner_index(0)
        holder = ExpectingIncrement(store, 0, lock)
        partition = client._core.partitions[0]
        cluster.pause_server(owner)  # the holder stays pending until the server resumes
        try:
            first = client.submit(holder)
            wait_until(
                lambda: partition.holds_any([lock.lock_hash]),
                timeout=10,
                what="the holder's append to be sent",
            )
            queued = [ExpectingIncrement(store, 0, lock) for _ in range(20)]
            futures = [client.submit(context) for context in queued]
            assert all(context.outcomes.executions == 0 for context in queued)  # none executed yet
        finally:
            cluster.resume_server(owner)
        for future in [first, *futures]:
            assert future.result(60).committed
        client.flush(10)
        wait_applied(store, {0: client.get_high_water_mark(0)})
    submitter = threading.get_ident()
    # Each queued context executed once, after the one before it was applied: no lock failure.
    assert [(c.outcomes.executions, c.outcomes.lock_failures) for c in queued] == [(1, 0)] * 20
    assert all(context.first_thread != submitter for context in queued)
    assert store.values[0] == 21
    assert store.errors == []


class SlowExpectingIncrement(ExpectingIncrement):
    """An :class:`ExpectingIncrement` whose attempts take a while: contexts submitted together
    overlap unless the client makes them take turns."""

    def execute(self, builder: TransactionBuilder) -> bool:
        time.sleep(0.005)
        return super().execute(builder)


def test_contexts_submitted_together_on_a_lock_their_client_writes_each_execute_once(
    client_config: WaltzClientConfig, log_start: dict[int, int]
) -> None:
    """docs/design/locks.md "Locks of appends in flight": contexts that expect a lock their client
    writes, submitted from several threads at once, take turns before their first attempts
    (claims), so none runs an attempt that its own client would hold back and run again."""
    store = MemoryStore(log_start)
    lock = PartitionLocalLock("counter", 13)
    threads, each = 4, 8
    with WaltzClient(store, client_config) as client:
        client.wait_mounted(30)
        assert client.submit(ExpectingIncrement(store, 0, lock)).result(30).committed  # written
        start = threading.Barrier(threads)
        batches = [[SlowExpectingIncrement(store, 0, lock) for _ in range(each)] for _ in range(threads)]

        def submit_all(batch: list[SlowExpectingIncrement]) -> list[concurrent.futures.Future[int]]:
            start.wait(10)
            return [client.submit(context) for context in batch]

        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            futures = [future for batch in pool.map(submit_all, batches) for future in batch]
        for future in futures:
            assert future.result(60).committed
        client.flush(10)
        wait_applied(store, {0: client.get_high_water_mark(0)})
        waits = client.metrics.get_sample_value("waltz_client_claim_waits_total", {"partition": "0"})
    outcomes = [(c.outcomes.executions, c.outcomes.lock_failures) for batch in batches for c in batch]
    assert waits is not None and waits >= 1  # contexts met another's claim (and none ran twice)
    assert outcomes == [(1, 0)] * (threads * each)
    assert store.values[0] == threads * each + 1
    assert store.errors == []


class BrokenHint(Append):
    def expected_locks(self) -> list[PartitionLocalLock]:
        raise ValueError("no hint today")


def test_a_context_whose_expected_locks_raise_ends_with_that_error_and_frees_its_slot(
    client_config: WaltzClientConfig, log_start: dict[int, int]
) -> None:
    with WaltzClient(MemoryStore(log_start), client_config) as client:
        context = BrokenHint(0, b"never sent")
        with pytest.raises(ValueError, match="no hint today"):
            client.submit(context).result(30)
        assert [type(e) for e in context.outcomes.exceptions] == [ValueError]
        assert context.outcomes.executions == 0
        assert not client.has_pending_transactions()


def test_stale_increments_from_two_clients_fail_their_lock_and_lose_no_update(
    client_config: WaltzClientConfig, log_start: dict[int, int]
) -> None:
    """Seed 001's counter: two clients increment one counter from (often stale) reads."""
    stores = [MemoryStore(log_start), MemoryStore(log_start)]
    lock = PartitionLocalLock("counter", 1)
    with WaltzClient(stores[0], client_config) as first, WaltzClient(stores[1], client_config) as second:
        contexts: list[Increment] = []

        def run(client: WaltzClient, store: MemoryStore) -> None:
            futures = []
            for _ in range(100):
                context = Increment(store, 0, lock)
                contexts.append(context)
                futures.append(client.submit(context))
            for future in futures:
                future.result(60)

        threads = [
            threading.Thread(target=run, args=pair) for pair in zip((first, second), stores, strict=True)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        mark = first.get_high_water_mark(0)
        for store in stores:
            wait_applied(store, {0: mark})
    assert all(context.outcomes.completions == [True] for context in contexts)
    assert sum(c.outcomes.lock_failures for c in contexts) > 0, "the race never happened"
    # No lost update: every successful increment counted.
    assert stores[0].values[0] == stores[1].values[0] == len(contexts) == 200
    assert [a.transaction_id for a in stores[0].applied[0]] == [
        a.transaction_id for a in stores[1].applied[0]
    ]


def test_execute_reports_through_the_context_alone_and_flush_waits_for_it(
    client_config: WaltzClientConfig, log_start: dict[int, int]
) -> None:
    """Seed 000's ``execute``: no future; the context's callbacks tell the outcome, lock
    failures and re-attempts included, and ``flush`` waits until every context ended."""
    store = MemoryStore(log_start)
    lock = PartitionLocalLock("counter", 3)
    contexts = [Increment(store, 1, lock) for _ in range(60)]
    with WaltzClient(store, client_config) as client:
        for context in contexts:
            assert client.execute(context) is None
        client.flush(60)
        assert not client.has_pending_transactions()
        wait_applied(store, {1: client.get_high_water_mark(1)})
    assert all(context.outcomes.completions == [True] for context in contexts)
    assert sum(c.outcomes.lock_failures for c in contexts) > 0, "no context was re-attempted"
    assert store.values[1] == 60  # every increment counted once
    assert store.errors == []


def test_partitions_chosen_by_the_application_when_auto_mount_is_off(
    client_config: WaltzClientConfig, log_start: dict[int, int]
) -> None:
    store = MemoryStore(log_start)
    config = client_config.model_copy(update={"client_auto_mount": False})
    with WaltzClient(store, config) as client:
        assert client.mounted_partitions() == []
        with pytest.raises(PartitionNotMountedError, match="set_partitions"):
            client.submit(Append(1, b"nope"))
        client.set_partitions([1])
        client.wait_mounted(30)
        transaction_id = client.submit(Append(1, b"yes")).result(30).transaction_id
        assert transaction_id == log_start[1] + 1
        wait_applied(store, {1: transaction_id})
        assert store.calls[0] == []  # partition 0's feed is not followed
        with pytest.raises(PartitionNotMountedError):
            client.submit(Append(0, b"nope"))


def test_owner_killed_mid_stream_every_transaction_committed_once_and_applied_in_order(
    cluster: LocalCluster, client_config: WaltzClientConfig, log_start: dict[int, int]
) -> None:
    stores = [MemoryStore(log_start), MemoryStore(log_start)]
    stale_lock = PartitionLocalLock("stale", 1)
    per_client = 300
    with WaltzClient(stores[0], client_config) as first, WaltzClient(stores[1], client_config) as second:
        clients = [first, second]
        locked = first.submit(Append(0, b"locked", write_lock=stale_lock)).result(30).transaction_id
        assert locked is not None
        submitted: list[tuple[Append, concurrent.futures.Future[Outcome]]] = []
        halfway = threading.Event()

        def run(client: WaltzClient) -> None:
            for i in range(per_client):
                context = Append(i % 2, f"{client.client_id}/{i}".encode())
                submitted.append((context, client.submit(context)))
                if i == per_client // 3:
                    halfway.set()
                time.sleep(0.005)  # a steady stream, so that the kill lands in the middle of it

        threads = [threading.Thread(target=run, args=(c,)) for c in clients]
        for thread in threads:
            thread.start()
        assert halfway.wait(30)
        cluster.kill_server(cluster.owner_index(0))
        for thread in threads:
            thread.join(120)
        ids = [future.result(90).transaction_id for _, future in submitted]

        # A stale client's conflicting append is still rejected by the new owner.
        stale = Append(0, b"stale", write_lock=stale_lock, high_water_mark=locked - 1, once=True)
        assert second.submit(stale).result(30).dropped
        assert stale.outcomes.lock_failures == 1

        marks = {pid: first.get_high_water_mark(pid) for pid in (0, 1)}
        for store in stores:
            wait_applied(store, marks, timeout=60)

    for store in stores:
        assert store.errors == []
    for pid in (0, 1):
        sequences = [[(a.transaction_id, a.data) for a in store.applied[pid]] for store in stores]
        assert sequences[0] == sequences[1], f"partition {pid}: the two clients applied different logs"
        assert [t for t, _ in sequences[0]] == list(range(log_start[pid] + 1, marks[pid] + 1))
    log = {(pid, a.transaction_id): a.data for pid in (0, 1) for a in stores[0].applied[pid]}
    payloads = [data for data in log.values() if b"/" in data]
    assert len(payloads) == len(set(payloads)) == len(submitted) == 2 * per_client  # each exactly once
    for (context, _), transaction_id in zip(submitted, ids, strict=True):
        assert transaction_id is not None
        assert log[(context.partition, transaction_id)] == context.data
        assert context.outcomes.completions == [True]
        assert context.outcomes.exceptions == []


class Contended(Append):
    """Always executes against a stale mark with a lock written after it: every attempt fails its
    lock check, until the context expires."""

    def __init__(self, lock: PartitionLocalLock, mark: int, timeout: float) -> None:
        super().__init__(0, b"never", write_lock=lock, high_water_mark=mark)
        self.timeout = timeout
        self.expirations = 0

    def on_expiration(self) -> None:
        self.expirations += 1


def test_a_context_that_keeps_failing_its_lock_expires_between_attempts(
    client_config: WaltzClientConfig, log_start: dict[int, int]
) -> None:
    store = MemoryStore(log_start)
    lock = PartitionLocalLock("expiry", 1)
    with WaltzClient(store, client_config) as client:
        written = client.submit(Append(0, b"first", write_lock=lock)).result(30).transaction_id
        assert written is not None
        context = Contended(lock, written - 1, timeout=0.5)
        with pytest.raises(TransactionExpiredError, match="expired after"):
            client.submit(context).result(30)
        assert context.expirations == 1
        assert context.outcomes.lock_failures >= 1
        assert context.outcomes.completions == [] and context.outcomes.exceptions == []
        client.flush(10)
        assert client.get_high_water_mark(0) == written  # no attempt of it was ever committed


def test_a_context_that_fails_its_lock_again_and_again_is_logged_as_a_warning(
    client_config: WaltzClientConfig, log_start: dict[int, int], caplog: pytest.LogCaptureFixture
) -> None:
    """A context whose attempts keep sending a mark below a transaction its client applied (one
    that sets ``sets_client_high_water_mark`` and never sets the mark) is retried until its
    timeout: the 10th failure in a row on the same transaction says so, naming the context."""
    store = MemoryStore(log_start)
    lock = PartitionLocalLock("repeated", 1)
    caplog.set_level(logging.WARNING, logger="waltz.client.attempt_runner")
    with WaltzClient(store, client_config) as client:
        written = client.submit(Append(0, b"first", write_lock=lock)).result(30).transaction_id
        assert written is not None
        context = Contended(lock, written - 1, timeout=60)
        context.sets_client_high_water_mark = True  # and the mark it gives stays below the write
        future = client.submit(context)

        def warned() -> list[str]:
            return [r.getMessage() for r in caplog.records if "lock failures in a row" in r.getMessage()]

        wait_until(lambda: bool(warned()), timeout=60, what="the warning of repeated lock failures")
        (message,) = warned()
        assert f"Contended on partition 0: 10 lock failures in a row on transaction {written}" in message
        assert "sets_client_high_water_mark" in message, message
        assert not future.done() and context.outcomes.executions >= 10


class Counting(Append):
    """Counts the contexts between their first execution and their completion."""

    active = 0
    most = 0
    lock = threading.Lock()

    def execute(self, builder: TransactionBuilder) -> bool:
        if self.outcomes.executions == 0:
            with Counting.lock:
                Counting.active += 1
                Counting.most = max(Counting.most, Counting.active)
        return super().execute(builder)

    def on_completion(self, result: bool) -> None:
        with Counting.lock:
            Counting.active -= 1
        super().on_completion(result)


def test_submit_blocks_at_the_maximum_of_concurrent_transactions(
    client_config: WaltzClientConfig, log_start: dict[int, int]
) -> None:
    store = MemoryStore(log_start)
    config = client_config.model_copy(update={"client_max_concurrent_transactions": 3})
    with WaltzClient(store, config) as client:
        futures = [client.submit(Counting(1, b"bp %d" % i)) for i in range(60)]
        assert all(f.result(30).committed for f in futures)
    assert 1 <= Counting.most <= 3


def test_prefetching_callbacks_get_each_batch_with_its_data_loaded(
    client_config: WaltzClientConfig, log_start: dict[int, int]
) -> None:
    writer_store = MemoryStore(log_start)
    reader_store = PrefetchingStore(log_start)
    with WaltzClient(writer_store, client_config) as writer:
        ids = [
            writer.submit(Append(i % 2, f"prefetch-{i}".encode())).result(30).transaction_id
            for i in range(60)
        ]
        assert all(isinstance(i, int) for i in ids)
        marks = {pid: writer.get_high_water_mark(pid) for pid in (0, 1)}
    # The reader mounts afterwards: none of the data is its own, all of it comes from the server.
    with WaltzClient(reader_store, client_config) as reader:
        for pid, mark in marks.items():
            assert reader.wait_applied(pid, mark, 30)
    assert reader_store.errors == []
    assert reader_store.loaded_before_apply and all(reader_store.loaded_before_apply)
    applied = [a.data for pid in (0, 1) for a in reader_store.applied[pid]]
    assert sorted(applied) == sorted(f"prefetch-{i}".encode() for i in range(60))


def test_when_applied_calls_back_once_the_transaction_is_applied_and_at_once_after(
    client_config: WaltzClientConfig, log_start: dict[int, int]
) -> None:
    store = MemoryStore(log_start)
    with WaltzClient(store, client_config) as client:
        transaction_id = client.submit(Append(0, b"applied?")).result(30).transaction_id
        assert transaction_id is not None
        seen: list[tuple[str, int, int]] = []
        done = threading.Event()

        def called(name: str) -> None:
            seen.append((name, threading.get_ident(), store.get_client_high_water_mark(0)))
            done.set()

        client.when_applied(0, transaction_id, lambda: called("first"))
        assert done.wait(30), "when_applied never called back"
        assert seen[0][2] >= transaction_id  # the store had it when the callback ran
        client.when_applied(0, transaction_id, lambda: called("again"))
        assert seen[-1][:2] == ("again", threading.get_ident())  # applied already: at once, here
        with pytest.raises(ValueError):
            client.when_applied(99, 0, lambda: None)


class BlockedRetry(Append):
    """Its re-attempt blocks the (only) retry thread until ``release`` is set."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.retrying = threading.Event()
        self.release = threading.Event()

    def execute(self, builder: TransactionBuilder) -> bool:
        if self.outcomes.executions >= 1:
            self.retrying.set()
            self.release.wait(30)
            self.outcomes.executions += 1
            return False
        return super().execute(builder)


def test_a_commit_completes_while_a_reattempt_holds_the_retry_thread(
    client_config: WaltzClientConfig, log_start: dict[int, int]
) -> None:
    """Completions run on a thread of their own: a re-attempt (which reads the application's
    database in a real service) never delays the futures of committed transactions."""
    store = MemoryStore(log_start)
    config = client_config.model_copy(update={"client_num_transaction_retry_threads": 1})
    lock = PartitionLocalLock("blocking", 7)
    with WaltzClient(store, config) as client:
        assert client.submit(Append(0, b"first", write_lock=lock)).result(30).committed
        stale = BlockedRetry(0, b"stale", write_lock=lock, high_water_mark=log_start[0])
        stale_future = client.submit(stale)
        try:
            assert stale.retrying.wait(30), "the stale context was never re-attempted"
            started = time.monotonic()
            committed = client.submit(Append(1, b"meanwhile")).result(20).transaction_id
            assert committed is not None, "a commit did not complete while the retry thread was busy"
            assert time.monotonic() - started < 20
        finally:
            stale.release.set()
        assert stale_future.result(30).dropped
        assert stale.outcomes.lock_failures == 1


class SubmitsOnCompletion(Append):
    """Submits another context from its own completion (on the completion thread)."""

    def __init__(self, client: WaltzClient, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.client = client
        self.error: BaseException | None = None
        self.done = threading.Event()

    def on_completion(self, result: bool) -> None:
        super().on_completion(result)
        try:
            self.client.submit(Append(self.partition, b"from a completion"))
        except BaseException as exc:
            self.error = exc
        self.done.set()


def test_submit_from_a_completion_at_the_limit_fails_instead_of_deadlocking(
    client_config: WaltzClientConfig, log_start: dict[int, int]
) -> None:
    from waltz.errors import WaltzClientError

    store = MemoryStore(log_start)
    config = client_config.model_copy(update={"client_max_concurrent_transactions": 1})
    with WaltzClient(store, config) as client:
        context = SubmitsOnCompletion(client, 0, b"first")
        client.submit(context)
        assert context.done.wait(30)
        # Its own slot is freed only after its completion returns: the partition is at its limit.
        assert isinstance(context.error, WaltzClientError), context.error
        assert "would deadlock" in str(context.error)
        assert client.submit(Append(0, b"later")).result(30).committed  # the client goes on


class FollowUp:
    """A follow-up submitted where the submitter then waits ``wait`` seconds for its outcome:
    what the wait raised, and the follow-up's future."""

    def __init__(self, wait: float) -> None:
        self.wait = wait
        self.error: BaseException | None = None
        self.future: concurrent.futures.Future[Outcome] | None = None
        self.done = threading.Event()

    def submit_and_wait(self, client: WaltzClient, context: Append) -> None:
        try:
            self.future = client.submit(context)
            self.future.result(self.wait)
        except BaseException as exc:
            self.error = exc
        self.done.set()


class WaitsOnCompletion(Append):
    """Submits another context from its own completion and waits there ``wait`` seconds for its
    outcome (0: a poll, which cannot block)."""

    def __init__(self, client: WaltzClient, *args: object, wait: float = 30, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.client = client
        self.follow_up = FollowUp(wait)

    def on_completion(self, result: bool) -> None:
        super().on_completion(result)
        self.follow_up.submit_and_wait(self.client, Append(self.partition, b"follow-up"))


def test_waiting_for_an_outcome_in_a_completion_callback_fails_at_once_instead_of_deadlocking(
    client_config: WaltzClientConfig, log_start: dict[int, int]
) -> None:
    """Commits complete on one thread, in order: a completion callback that waits for another
    submission's outcome would wait for itself (until its timeout, the follow-up committed all
    along). The wait fails at once, saying so; the follow-up commits; a wait from another thread
    works."""
    from waltz.errors import WaltzClientError

    store = MemoryStore(log_start)
    with WaltzClient(store, client_config) as client:
        context = WaitsOnCompletion(client, 0, b"first")
        client.submit(context).result(30)
        follow_up = context.follow_up
        assert follow_up.done.wait(30)
        # Before, the wait ran out its 30 s with TimeoutError, the follow-up committed meanwhile.
        assert isinstance(follow_up.error, WaltzClientError), follow_up.error
        assert "would deadlock" in str(follow_up.error) and "add_done_callback" in str(follow_up.error)
        assert follow_up.future is not None and follow_up.future.result(30).committed


def test_a_poll_of_an_outcome_in_a_completion_callback_is_answered_as_usual(
    client_config: WaltzClientConfig, log_start: dict[int, int]
) -> None:
    store = MemoryStore(log_start)
    with WaltzClient(store, client_config) as client:
        context = WaitsOnCompletion(client, 0, b"first", wait=0)
        client.submit(context).result(30)
        assert context.follow_up.done.wait(30)
        # The follow-up cannot have committed yet: its completion comes after this callback.
        assert isinstance(context.follow_up.error, TimeoutError), context.follow_up.error


class WaitsInApply(MemoryStore):
    """Applies as :class:`MemoryStore`; on the transaction whose data is ``b"trigger"``, submits a
    follow-up on the same lock from ``apply_transaction`` and waits for its outcome there, before
    the store's high-water mark takes the trigger: the follow-up's lock check needs this apply, so
    its outcome cannot come before the wait (were the mark moved first, the follow-up could commit,
    and its future resolve, before the wait began: a wait on a resolved future is not refused)."""

    def __init__(self, start: dict[int, int], lock: PartitionLocalLock) -> None:
        super().__init__(start)
        self.lock_of_trigger = lock
        self.client: WaltzClient | None = None
        self.follow_up = FollowUp(30)

    def apply_transaction(self, transaction: Transaction) -> None:
        if transaction.get_data(BytesSerializer()) == b"trigger" and not self.follow_up.done.is_set():
            assert self.client is not None
            follow_up = Append(transaction.partition_id, b"follow-up", write_lock=self.lock_of_trigger)
            self.follow_up.submit_and_wait(self.client, follow_up)
        super().apply_transaction(transaction)


def test_waiting_for_an_outcome_in_apply_transaction_fails_at_once_instead_of_holding_the_applies(
    client_config: WaltzClientConfig, log_start: dict[int, int]
) -> None:
    """A follow-up that takes the lock of the transaction being applied waits for that apply,
    which would wait for it (until its timeout): the wait fails at once, saying so and that applies
    are replayed; the follow-up then commits."""
    from waltz.errors import WaltzClientError

    lock = PartitionLocalLock("in-apply", 1)
    store = WaitsInApply(log_start, lock)
    with WaltzClient(store, client_config) as client:
        store.client = client
        assert client.submit(Append(0, b"trigger", write_lock=lock)).result(30).committed
        follow_up = store.follow_up
        assert follow_up.done.wait(30)
        # Before, the wait ran out its 30 s with TimeoutError, this partition's applies held.
        assert isinstance(follow_up.error, WaltzClientError), follow_up.error
        assert "holds back this partition's applies" in str(follow_up.error), follow_up.error
        assert "replayed" in str(follow_up.error), follow_up.error
        assert follow_up.future is not None and follow_up.future.result(30).committed


#: The header of a transaction the pausing store reads as a newer release's record.
NEWER_HEADER = 7


class _AwaitingUpgrade(MemoryStore):
    """A store whose code is older than a transaction of header :data:`NEWER_HEADER`: its apply
    waits for the instance's upgrade (``ApplyPausedError``), as the SQL framework's does for a
    change-set of a newer form. ``hold`` (when given) holds that apply until it is set."""

    def __init__(self, start: dict[int, int], hold: threading.Event | None = None) -> None:
        super().__init__(start)
        self.hold = hold
        self.entered = threading.Event()

    def apply_transaction(self, transaction: Transaction) -> None:
        if transaction.header == NEWER_HEADER:
            self.entered.set()
            if self.hold is not None and not self.hold.wait(60):
                raise TimeoutError("the test never let the apply go on")
            raise ApplyPausedError(f"transaction {transaction.transaction_id} is a newer release's record")
        super().apply_transaction(transaction)


@pytest.mark.parametrize(
    "paused_first", [True, False], ids=["paused-before-the-retry", "retry-before-the-pause"]
)
def test_a_retry_that_waits_for_a_transaction_the_instance_cannot_apply_ends(
    client_config: WaltzClientConfig, log_start: dict[int, int], paused_first: bool
) -> None:
    """A context whose lock check fails on a transaction its partition's apply waits at for this
    instance's upgrade (a rolling deploy: a newer instance wrote it) ends with PartitionPausedError,
    whether the pause began before its retry or while the retry waited, and the context queued
    behind its lock goes on (before, the retry waited for ever for an apply that could not happen,
    and so did every context behind it)."""
    lock = PartitionLocalLock("upgrade", 1)
    hold = None if paused_first else threading.Event()
    older = _AwaitingUpgrade(log_start, hold)
    with (
        WaltzClient(MemoryStore(log_start), client_config) as newer_instance,
        WaltzClient(older, client_config) as older_instance,
    ):
        written = newer_instance.submit(Append(0, b"newer", header=NEWER_HEADER, write_lock=lock)).result(30)
        newer_id = written.transaction_id
        assert isinstance(newer_id, int)
        if paused_first:
            wait_until(
                lambda: isinstance(older_instance.unhealthy_partitions().get(0), ApplyPausedError),
                timeout=30,
                what="the older instance's partition 0 to wait for its upgrade",
            )
        else:
            wait_until(older.entered.is_set, timeout=30, what="the older instance to apply the newer record")
        stale = Append(0, b"read before the newer record", write_lock=lock, high_water_mark=newer_id - 1)
        behind = Append(0, b"queued behind its lock", write_lock=lock, high_water_mark=newer_id - 1)
        failing = older_instance.submit(stale)
        following = older_instance.submit(behind)
        if hold is not None:
            wait_until(
                lambda: (
                    (
                        older_instance.metrics.get_sample_value(
                            "waltz_client_lock_failures_total", {"partition": "0"}
                        )
                        or 0
                    )
                    >= 1
                ),
                timeout=30,
                what="the stale context's lock failure",
            )
            hold.set()
        with pytest.raises(PartitionPausedError, match="cannot apply before its upgrade"):
            failing.result(30)
        assert [type(e) for e in stale.outcomes.exceptions] == [PartitionPausedError]
        assert stale.outcomes.completions == []
        # The context held behind its lock was sent then; its lock check failed on the same
        # transaction, and it ended the same way.
        with pytest.raises(PartitionPausedError):
            following.result(30)
        assert behind.outcomes.executions == 1
        older_instance.flush(30)
        assert not older_instance.has_pending_transactions()


#: The names of the threads a client starts for itself begin with these.
CLIENT_THREADS = ("waltz-retry", "waltz-complete", "waltz-apply-")


class NotesItsClose(MemoryStore):
    """A store that notes its client's ``client_closed``."""

    def __init__(self, start: dict[int, int]) -> None:
        super().__init__(start)
        self.client_closed_called = threading.Event()

    def client_closed(self) -> None:
        self.client_closed_called.set()


class ClosesItsClient(Append):
    """Closes its client from the callback of its outcome: ``on_completion`` (on the completion
    thread) once committed, or ``on_exception`` (on a retry thread) when its retry raises."""

    def __init__(self, client: WaltzClient, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.client = client
        self.closed = threading.Event()
        self.error: BaseException | None = None
        self.thread = ""

    def execute(self, builder: TransactionBuilder) -> bool:
        if self.outcomes.executions >= 1:
            raise RuntimeError("the retry of a context that closes its client")
        return super().execute(builder)

    def _close(self) -> None:
        self.thread = threading.current_thread().name
        try:
            self.client.close()
        except BaseException as exc:
            self.error = exc
        self.closed.set()

    def on_completion(self, result: bool) -> None:
        super().on_completion(result)
        self._close()

    def on_exception(self, exception: BaseException) -> None:
        super().on_exception(exception)
        self._close()


@pytest.mark.parametrize("callback", ["on_completion", "on_exception"])
def test_close_from_a_callback_on_a_client_thread_closes_the_client_and_ends_its_threads(
    client_config: WaltzClientConfig, log_start: dict[int, int], callback: str
) -> None:
    """``close()`` called on the completion thread or on a retry thread (a context's callback, a
    future's done-callback) cannot wait for its own thread to end: it closes the client all the
    same, without an error, calls ``client_closed``, and the client's threads end once the
    callback returned."""
    store = NotesItsClose(log_start)
    before = set(threading.enumerate())
    client = WaltzClient(store, client_config)
    try:
        if callback == "on_completion":
            context = ClosesItsClient(client, 0, b"closes on completion")
        else:  # a stale mark: its lock check fails, and its retry raises on a retry thread
            lock = PartitionLocalLock("closes", 1)
            assert client.submit(Append(0, b"first", write_lock=lock)).result(30).committed
            context = ClosesItsClient(client, 0, b"stale", write_lock=lock, high_water_mark=log_start[0])
        client.submit(context)
        assert context.closed.wait(30), f"{callback} never ran"
        assert context.error is None, f"close() in {callback} raised {context.error!r}"
        expected = "waltz-complete" if callback == "on_completion" else "waltz-retry"
        assert context.thread.startswith(expected), context.thread
        assert store.client_closed_called.wait(10), "client_closed was not called"

        def left() -> list[str]:
            return [t.name for t in set(threading.enumerate()) - before if t.name.startswith(CLIENT_THREADS)]

        wait_until(lambda: not left(), timeout=10, what="the client's threads to end")
        with pytest.raises(ClientClosedError):
            client.submit(Append(0, b"after the close"))
    finally:
        client.close()


class SlowApply(MemoryStore):
    """Applies as :class:`MemoryStore`, each transaction after ``pause`` seconds."""

    def __init__(self, start: dict[int, int], pause: float) -> None:
        super().__init__(start)
        self.pause = pause

    def apply_transaction(self, transaction: Transaction) -> None:
        time.sleep(self.pause)
        super().apply_transaction(transaction)


def test_a_read_your_writes_wait_that_raises_fails_its_context_and_frees_its_slot(
    client_config: WaltzClientConfig, log_start: dict[int, int]
) -> None:
    """A submit's wait to read its client's own last commit raised (a timeout of 1e300 s, which
    ``model_copy`` does not check, overflows the thread wait): the context fails with that error,
    its concurrency slot is given back, and ``flush`` and later submissions go on."""
    store = SlowApply(log_start, pause=1.0)
    config = client_config.model_copy(update={"client_read_your_writes_timeout": 1e300})
    with WaltzClient(store, config) as client:
        assert client.submit(Append(0, b"first")).result(30).committed
        context = Append(0, b"behind its own write")
        future = client.submit(context)  # the first commit is not applied yet: it waits
        with pytest.raises(OverflowError):
            future.result(30)
        assert len(context.outcomes.exceptions) == 1 and context.outcomes.executions == 0
        assert (
            client.metrics.get_sample_value(
                "waltz_client_partition_transactions_in_flight", {"partition": "0"}
            )
            == 0
        )
        client.flush(10)
        assert not client.has_pending_transactions()


def test_a_store_ahead_of_the_log_is_refused_and_a_submit_commits_nothing(
    client_config: WaltzClientConfig, log_start: dict[int, int], caplog: pytest.LogCaptureFixture
) -> None:
    """docs/design/client.md "Mount and the client high-water mark": a database whose mark is above
    the partition's high-water mark (restored from another cluster, a wrong cluster root) is
    refused, the application told, and contexts submitted before and after the refusal end with
    it, nothing committed, where the mount was accepted and one context committed again and again
    behind a feed that started past its commits."""
    caplog.set_level(logging.WARNING, logger="waltz.client")
    ahead = 10**9
    with WaltzClient(MemoryStore(log_start), client_config) as reader:
        before = {pid: reader.get_high_water_mark(pid, 10) for pid in log_start}
    store = MemoryStore(dict.fromkeys(log_start, ahead))
    client = WaltzClient(store, client_config)
    try:
        early = Append(0, b"submitted while mounting")
        futures = [(early, client.submit(early))]
        wait_until(
            lambda: any("above partition 0's high-water mark" in e for e in store.errors),
            timeout=15,
            what=f"the refusal of partition 0 reported to uncaught_exception (reported: {store.errors})",
        )
        [reported] = [e for e in store.errors if e.startswith("partition 0,")]
        assert "ClientAheadOfLogError" in reported
        assert (
            f"client high-water mark {ahead} is above partition 0's high-water mark {before[0]}" in reported
        )
        assert "ahead of this log (restored from another cluster? wrong cluster root?)" in reported
        with pytest.raises(ClientAheadOfLogError, match="above partition 0's high-water mark"):
            client.wait_mounted(5, [0])
        assert client.partition_states()[0] is not PartitionState.MOUNTED
        late = Append(0, b"submitted after the refusal")
        futures.append((late, client.submit(late)))
        started = time.monotonic()
        for context, future in futures:
            with pytest.raises(ClientAheadOfLogError) as refused:
                future.result(10)
            assert (refused.value.client_high_water_mark, refused.value.high_water_mark) == (ahead, before[0])
            assert context.outcomes.executions <= 1, context.outcomes
        assert time.monotonic() - started < 10
        client.flush(10)  # nothing left in flight
        logged = [
            r for r in caplog.records if r.levelno >= logging.ERROR and "above partition 0" in r.getMessage()
        ]
        assert len(logged) == 1, [r.getMessage() for r in caplog.records]
    finally:
        client.close()
    with WaltzClient(MemoryStore(log_start), client_config) as reader:
        after = {pid: reader.get_high_water_mark(pid, 10) for pid in log_start}
    assert after == before, "a transaction was committed for a client whose database is ahead of the log"
