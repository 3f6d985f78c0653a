"""Catching a lagging replica up while the store session writes (real storage node processes)."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
from support import settle
from support.storage import run

from tests.services.server.conftest import StoreCluster
from tests.services.server.store.test_store import (
    FAST,
    append_many,
    append_until,
    open_replicas,
    payload,
    queued_appends,
    replica_records,
    store,
)
from waltz.protocol import storage_pb2
from waltz.protocol.records import Record, ReqId, crc32
from waltz.protocol.storage_client import columns_append
from waltz.services.server.metrics import ServerMetrics
from waltz.services.server.server_partition import Partition
from waltz.services.server.store.config import StoreConfig
from waltz.services.server.store.recovery import LaggingReplica, RecoveryResult
from waltz.services.server.store.replica import ReplicaConnection
from waltz.services.server.store.store_partition import StorePartition
from waltz.services.server.store.store_session import StoreSession, _SentBatch, _tail_of

# A slow copy (about 6,000 records of ~85 bytes per second, in pages of 500) keeps a replica a few
# thousand records behind catching up for a second or more while the writer keeps appending.
SLOW_COPY = StoreConfig(
    connect_timeout=2.0, request_timeout=5.0, retry_interval=0.2, catch_up_page=500, catch_up_rate=500_000
)


def replaced(partition: StorePartition, storage: str) -> bool:
    """True once a session that writes without ``storage`` runs (the one it failed in has ended)."""
    return (
        partition.writable
        and partition.sessions_started >= 2
        and storage not in partition.replicas_in_session
    )


async def committed_while_catching_up(
    partition: StorePartition, storage: str, timeout: float
) -> tuple[int, int]:
    """Wait until ``storage`` joins the session; return the high-water marks seen when its catch-up
    was first and last seen running (polled every 5 ms, at most ``timeout`` seconds)."""
    first = last = None
    deadline = asyncio.get_running_loop().time() + timeout
    while storage not in partition.replicas_in_session:
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"{storage} did not join: catching up {partition.replicas_catching_up}")
        if storage in partition.replicas_catching_up:
            last = partition.high_water_mark
            first = last if first is None else first
        await asyncio.sleep(0.005)
    assert first is not None and last is not None, f"{storage} joined without a catch-up being seen"
    return first, last


def test_a_returning_replica_catches_up_while_writes_continue_and_joins_the_quorum(
    store_cluster: StoreCluster,
) -> None:
    """A replica killed under load and restarted is caught up in the background: the session is not
    replaced, commits continue during the copy, the replica joins the writers, and once it has, the
    partition keeps committing with another replica down (it counts in the quorum). Its log ends
    equal to the others'."""
    victim, other, survivor = store_cluster.storages[2], store_cluster.storages[0], store_cluster.storages[1]

    async def scenario() -> None:
        partition = store(store_cluster, config=SLOW_COPY)
        partition.start()
        results: dict[int, int | Exception] = {}
        assert await append_many(partition, 100_000, 200) == list(range(200))
        victim.kill()
        await append_many(partition, 200_000, 6000)
        await settle(lambda: replaced(partition, victim.address), "a session without the killed replica", 30)
        sessions = partition.sessions_started
        stop = asyncio.Event()
        writer = asyncio.create_task(append_until(partition, results, stop))
        try:
            await asyncio.to_thread(victim.start)
            first, last = await committed_while_catching_up(partition, victim.address, 60)
            assert last > first, "nothing was committed while the replica caught up"
            assert partition.sessions_started == sessions, "the returning replica replaced the session"
            other.kill()  # only the survivor and the caught-up replica remain: still a quorum
            mark = partition.high_water_mark
            await settle(
                lambda: partition.high_water_mark > mark + 100, "commits without the other replica", 30
            )
        finally:
            stop.set()
            await writer
            await partition.close()
        replicas = await replica_records(store_cluster, 0, [survivor, victim])
        reference = replicas[survivor.address]
        assert [r.transaction_id for r in reference] == list(range(len(reference)))
        assert replicas[victim.address] == reference
        acknowledged = {seq: tid for seq, tid in results.items() if isinstance(tid, int)}
        by_id = {r.transaction_id: r for r in reference}
        for seq, tid in acknowledged.items():
            assert by_id[tid].req_id.seq_num == seq and by_id[tid].req_id.client_id == 2

    run(scenario())


def test_a_replica_failing_during_its_catch_up_does_not_end_the_session(store_cluster: StoreCluster) -> None:
    """The returning replica dies again while it is being copied: the session keeps writing on the
    remaining quorum; when it returns once more it is caught up and joins, all logs equal."""
    victim = store_cluster.storages[2]

    async def scenario() -> None:
        partition = store(store_cluster, partition_id=1, config=SLOW_COPY)
        partition.start()
        try:
            assert await append_many(partition, 0, 100) == list(range(100))
            victim.kill()
            await append_many(partition, 100, 10_000)
            await settle(
                lambda: replaced(partition, victim.address), "a session without the killed replica", 30
            )
            sessions = partition.sessions_started
            await asyncio.to_thread(victim.start)
            await settle(lambda: victim.address in partition.replicas_catching_up, "the catch-up starts", 30)
            victim.kill()
            await settle(lambda: not partition.replicas_catching_up, "the catch-up stops", 30)
            more = await asyncio.wait_for(append_many(partition, 10_100, 100), 30)
            assert more == list(range(10_100, 10_200))
            assert partition.sessions_started == sessions, "the failed catch-up replaced the session"
            await asyncio.to_thread(victim.start)
            await settle(lambda: victim.address in partition.replicas_in_session, "the replica joins", 60)
            assert await append_many(partition, 10_200, 10) == list(range(10_200, 10_210))
            assert partition.sessions_started == sessions
        finally:
            await partition.close()
        replicas = await replica_records(store_cluster, 1)
        reference = replicas[store_cluster.storages[0].address]
        assert [r.req_id.seq_num for r in reference] == list(range(10_210))
        for address, records in replicas.items():
            assert records == reference, f"replica {address} differs"

    run(scenario())


def test_a_kept_batch_is_cut_to_start_at_the_joining_replicas_next_record() -> None:
    """A replica that joins in the middle of a kept batch gets the rest of it, from the record after
    its last one: the same columns, the first transaction ID moved."""
    records = [Record(100 + i, ReqId(7, 3, 0, i), i, b"x" * i, crc32(b"x" * i)) for i in range(5)]
    batch = _SentBatch(100, 104, columns_append(records))
    assert _tail_of(batch, 100) == batch.append
    tail = storage_pb2.AppendRequest.FromString(_tail_of(batch, 102)).columns
    assert tail.first_transaction_id == 102
    assert list(tail.seq_nums) == [2, 3, 4] and list(tail.client_ids) == [7, 7, 7]
    assert list(tail.headers) == [2, 3, 4] and list(tail.data) == [b"xx", b"xxx", b"xxxx"]
    assert list(tail.checksums) == [r.checksum for r in records[2:]]
    assert list(tail.generations) == [3, 3, 3]


def test_a_session_that_ends_as_a_replica_joins_waits_for_what_it_sent_that_replica(
    store_cluster: StoreCluster,
) -> None:
    """A lagging replica joins with the kept batches sent again to it, and the session ends before
    that replica answers them (its storage node is paused): the session's end waits for those
    answers as for its own batches, so the replica holds what it was sent when the session is over
    (docs/design/server.md "Store sessions")."""
    n = store_cluster.params.num_partitions
    key = store_cluster.cluster_key
    lagging_node = store_cluster.storages[2]

    async def scenario() -> None:
        connections = await open_replicas(store_cluster)
        lagging = connections.pop(lagging_node.address)
        queue, outcomes = queued_appends(5)
        session = StoreSession(
            queue,
            partition_id=0,
            session_id=1,
            recovery=RecoveryResult(
                -1,
                dict(connections),
                store_cluster.zk.partition_metadata(0),
                {lagging_node.address: LaggingReplica(lagging, -1)},
            ),
            assigned=[s.address for s in store_cluster.storages],
            config=StoreConfig(connect_timeout=2.0, request_timeout=10.0, retry_interval=0.2, linger=0.0),
            connect=lambda storage: ReplicaConnection(storage, 0, 1, key, n, FAST),
            zk=store_cluster.zk,
        )
        running: asyncio.Task[None] | None = None
        try:
            await asyncio.to_thread(lagging_node.pause)
            try:
                running = asyncio.create_task(session.run())
                # The first batch goes out to the two writers before the catch-up's first step,
                # which finds the replica at -1 and joins it with that batch sent again.
                await settle(lambda: len(outcomes) == 5, "the two writers commit the appends", 10)
                assert sorted(outcomes) == [(i, None) for i in range(5)]
                assert lagging_node.address in session.writers and session.acked[lagging_node.address] == -1
                assert session.resends_in_flight == 1  # the first batch, sent again to the joined replica
                session.end("test: ending while the joined replica has not answered")
                await asyncio.sleep(0.3)
                assert not running.done(), "the session ended before the joined replica answered"
            finally:
                await asyncio.to_thread(lagging_node.resume)
            await asyncio.wait_for(running, 10)
            assert session.acked[lagging_node.address] == 4
        finally:  # a failed check leaves no task or stream behind
            if running is not None:
                running.cancel()
                await asyncio.gather(running, return_exceptions=True)
            await session.close()
        # What the replicas hold once it is over (the waiting is what the lines above check).
        replicas = await replica_records(store_cluster, 0)
        assert all([r.transaction_id for r in records] == list(range(5)) for records in replicas.values())

    run(scenario())


def test_a_catch_up_slower_than_the_writes_shows_its_lag_and_warns(
    store_cluster: StoreCluster, caplog: pytest.LogCaptureFixture
) -> None:
    """docs/design/recovery.md "Catching up in the background": a copy slower than the writes
    never lets the replica join. The server's metrics show the replica's lag (the high-water mark
    minus its last record) while it catches up, a WARNING names it and storage.catchUpRate once
    the lag grew over a window, and the lag is gone once the catch-up ends (here, it joins after
    the writes stop)."""
    # About 90 records of ~85 bytes a second, in pages of 10; the writes go at up to 1,000 a second.
    config = StoreConfig(
        connect_timeout=2.0,
        request_timeout=5.0,
        retry_interval=0.2,
        catch_up_page=10,
        catch_up_rate=8_000,
        catch_up_lag_window=1.0,
    )
    n, key = store_cluster.params.num_partitions, store_cluster.cluster_key
    partition = Partition(
        0, 1, lambda committed: StorePartition(0, 1, store_cluster.zk, key, n, config, on_commit=committed)
    )
    registry = ServerMetrics(lambda: {0: partition}).registry
    victim = store_cluster.storages[2].address
    caplog.set_level(logging.INFO, logger="waltz.services.server.store")

    def lag() -> float | None:
        return registry.get_sample_value(
            "waltz_server_partition_catch_up_lag_records", {"partition": "0", "replica": victim}
        )

    def warned() -> list[str]:
        return [
            r.getMessage()
            for r in caplog.records
            if r.levelno == logging.WARNING and "slower than the writes" in r.getMessage()
        ]

    store_ = partition.store

    async def write(first: int, stop: asyncio.Event) -> int:
        """Append 50 at a time, every 50 ms at most, until ``stop`` (at most 60 s); return the next."""
        deadline = time.monotonic() + 60
        while not stop.is_set() and time.monotonic() < deadline:
            appended = await asyncio.wait_for(append_many(store_, first, 50), 30)
            assert appended == list(range(first, first + 50))
            first += 50
            await asyncio.sleep(0.05)
        return first

    async def scenario() -> None:
        store_.start()
        try:
            assert await append_many(store_, 0, 100) == list(range(100))
            store_cluster.storage(victim).kill()
            await settle(lambda: replaced(store_, victim), "a session without the killed replica", 30)
            assert await append_many(store_, 100, 200) == list(range(100, 300))  # its lag to begin with
            assert lag() is None
            await asyncio.to_thread(store_cluster.storage(victim).start)
            await settle(lambda: lag() is not None, "the returning replica's catch-up", 30)
            stop = asyncio.Event()
            writer = asyncio.create_task(write(300, stop))
            try:
                await settle(
                    lambda: bool(warned()), "a warning that the catch-up is slower than the writes", 20
                )
                behind, lags, mark = lag(), store_.catch_up_lags, store_.high_water_mark  # one moment
                assert behind == lags[victim] and 0 < behind <= mark + 1, (behind, lags, mark)
                assert victim in store_.replicas_catching_up
            finally:
                stop.set()
                written = await writer
            await settle(
                lambda: victim in store_.replicas_in_session, "the replica joins once writes stop", 60
            )
            assert lag() is None, "the lag of a replica whose catch-up ended is still shown"
            assert await append_many(store_, written, 10) == list(range(written, written + 10))
        finally:
            await store_.close()
        replicas = await replica_records(store_cluster, 0)
        assert len({tuple(r) for r in replicas.values()}) == 1
        assert [r.data for r in replicas[victim]] == [payload(i) for i in range(written + 10)]

    run(scenario())
    message = warned()[0]
    assert victim in message and "storage.catchUpRate (8000 bytes/s now)" in message, message
    assert "reduce the write rate" in message, message
