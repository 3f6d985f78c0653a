"""The replicated store through its own API: quorum writes, recovery, failover of replicas."""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from support import settle
from support.storage import run

from tests.services.server.conftest import StoreCluster
from waltz.errors import StorageRpcError
from waltz.local.nodes import LocalStorageNode
from waltz.metadata.values import PartitionMetadata, ReplicaState
from waltz.protocol.records import Record, ReqId, crc32
from waltz.protocol.storage_client import StorageAdminClient, StorageSessionClient
from waltz.services.server.store.append_queue import RECORD_OVERHEAD_BYTES, AppendQueue, PendingAppend
from waltz.services.server.store.config import StoreConfig
from waltz.services.server.store.recovery import RecoveryAbortedError, RecoveryManager, RecoveryResult
from waltz.services.server.store.replica import ReplicaConnection, ReplicaError, StorageStreams
from waltz.services.server.store.store_partition import (
    AppendFailedError,
    AppendUndecidedError,
    StoreClosedError,
    StorePartition,
)
from waltz.services.server.store.store_session import StoreSession

SHARED = pytest.mark.parametrize("shared", [False, True], ids=["own-streams", "shared-streams"])

FAST = StoreConfig(connect_timeout=2.0, request_timeout=5.0, retry_interval=0.2)


def store(
    cluster: StoreCluster,
    partition_id: int = 0,
    generation: int = 1,
    config: StoreConfig = FAST,
    streams: StorageStreams | None = None,
) -> StorePartition:
    return StorePartition(
        partition_id,
        generation,
        cluster.zk,
        cluster.cluster_key,
        cluster.params.num_partitions,
        config,
        streams=streams,
    )


def streams_of(cluster: StoreCluster, shared: bool) -> StorageStreams | None:
    """The server's shared streams (one per storage node), or None: a stream per replica session."""
    return StorageStreams(cluster.cluster_key, cluster.params.num_partitions, FAST) if shared else None


async def close_streams(streams: StorageStreams | None) -> None:
    if streams is not None:
        await streams.close()


def payload(i: int) -> bytes:
    return f"transaction {i} ".encode() * 5


async def append_many(partition: StorePartition, first: int, count: int) -> list[int]:
    futures = [
        partition.submit(ReqId(1, 1, partition.partition_id, i), i % 7, payload(i))
        for i in range(first, first + count)
    ]
    return list(await asyncio.gather(*futures))


async def replica_records(
    cluster: StoreCluster, partition_id: int, nodes: list[LocalStorageNode] | None = None
) -> dict[str, list[Record]]:
    result = {}
    for node in nodes or cluster.storages:
        async with StorageAdminClient(
            node.admin_address, cluster.cluster_key, cluster.params.num_partitions
        ) as admin:
            records: list[Record] = []
            while True:
                page = await admin.records(partition_id, len(records), 1000)
                if not page:
                    break
                records.extend(page)
            result[node.address] = records
    return result


async def open_replicas(cluster: StoreCluster) -> dict[str, ReplicaConnection]:
    """Replica connections of partition 0 under store session 1, one per storage node, opened."""
    n, key = cluster.params.num_partitions, cluster.cluster_key
    connections = {s.address: ReplicaConnection(s.address, 0, 1, key, n, FAST) for s in cluster.storages}
    for connection in connections.values():
        await connection.open()
    return connections


def queued_appends(count: int) -> tuple[AppendQueue, list[tuple[int, BaseException | None]]]:
    """An append queue of partition 0 (high-water mark -1) holding ``count`` appends, and the list
    their outcomes go to, ``(transaction ID, error)`` as each is settled."""
    queue = AppendQueue(0)
    queue.settle(-1)
    outcomes: list[tuple[int, BaseException | None]] = []
    for i in range(count):
        data = payload(i)
        queue.put(
            PendingAppend(ReqId(1, 1, 0, i), 0, data, crc32(data), lambda t, e: outcomes.append((t, e)))
        )
    return queue, outcomes


def test_appends_are_committed_in_order_and_replicated(store_cluster: StoreCluster) -> None:
    async def scenario() -> None:
        partition = store(store_cluster)
        partition.start()
        ids = await append_many(partition, 0, 500)
        assert ids == list(range(500))
        assert partition.high_water_mark == 499
        records = await partition.read_records(100, 10)
        assert [r.transaction_id for r in records] == list(range(100, 110))
        assert records[0].data == payload(100)
        await partition.close()
        replicas = await replica_records(store_cluster, 0)
        assert all(len(r) == 500 for r in replicas.values())
        assert len({tuple(r) for r in replicas.values()}) == 1
        metadata = store_cluster.zk.partition_metadata(0).value
        assert metadata.generation == 1
        assert {s.session_id for s in metadata.replicas.values()} == {metadata.session_id}

    run(scenario())


def test_a_session_records_what_it_commits_as_its_writers_low_water_mark(store_cluster: StoreCluster) -> None:
    """Within one store session the writers' low-water mark follows the committed high-water mark,
    so that their storage nodes refuse to truncate what the session committed, not only what was
    committed before it (docs/design/storage.md, "The committed floor")."""
    key, n = store_cluster.cluster_key, store_cluster.params.num_partitions

    async def marks() -> dict[str, tuple[int, int]]:
        found = {}
        for node in store_cluster.storages:
            async with StorageAdminClient(node.admin_address, key, n) as admin:
                (status,) = (await admin.partition_status(0)).partitions
                found[node.address] = (status.last_session_id, status.low_water_mark)
        return found

    async def scenario() -> None:
        partition = store(store_cluster, 0)
        partition.start()
        assert await append_many(partition, 0, 50) == list(range(50))
        session_id = store_cluster.zk.partition_metadata(0).value.session_id
        deadline = time.monotonic() + 30
        while (found := await marks()) != {node.address: (session_id, 49) for node in store_cluster.storages}:
            assert time.monotonic() < deadline, (
                f"every replica's low-water mark at 49 in session {session_id}: {found}"
            )
            await asyncio.sleep(0.1)
        await partition.close()
        for node in store_cluster.storages:
            async with StorageSessionClient(node.address, key, n, session_id + 1) as hostile:
                await hostile.open_session(0)
                with pytest.raises(StorageRpcError, match="the floor is 49"):
                    await hostile.truncate(0, -1)
                assert await hostile.max_transaction_id(0) == 49

    run(scenario())


def test_partitions_share_one_stream_per_storage_node(store_cluster: StoreCluster) -> None:
    """Two partitions of one server write through the same three streams, concurrently; closing
    the partitions keeps the streams for the next sessions, and closing the pool ends them."""

    async def scenario() -> None:
        streams = StorageStreams(store_cluster.cluster_key, store_cluster.params.num_partitions, FAST)
        zero, one = store(store_cluster, 0, streams=streams), store(store_cluster, 1, streams=streams)
        zero.start()
        one.start()
        ids = await asyncio.gather(append_many(zero, 0, 300), append_many(one, 1000, 300))
        assert ids == [list(range(300)), list(range(300))]
        assert streams.open_streams == len(store_cluster.storages)
        await zero.close()
        await one.close()
        assert streams.open_streams == len(store_cluster.storages)
        again = store(store_cluster, 0, generation=2, streams=streams)
        again.start()
        assert await append_many(again, 300, 5) == list(range(300, 305))
        await again.close()
        await streams.close()
        assert streams.open_streams == 0
        for pid, first_seq in ((0, 0), (1, 1000)):
            replicas = await replica_records(store_cluster, pid)
            reference = replicas[store_cluster.storages[0].address]
            assert [r.req_id.seq_num for r in reference[:300]] == list(range(first_seq, first_seq + 300))
            assert all(records == reference for records in replicas.values())

    run(scenario())


def test_shared_streams_refuse_a_wrong_cluster_key_and_replace_a_broken_stream(
    store_cluster: StoreCluster, caplog: pytest.LogCaptureFixture
) -> None:
    """A refused or failed stream never stays in the pool: the next replica connection opens a new
    one (after the node restarts), and the others' errors are the usual ReplicaErrors."""
    n = store_cluster.params.num_partitions
    key = store_cluster.cluster_key
    node = store_cluster.storages[0]

    caplog.set_level(logging.INFO, logger="waltz.services.server.store.replica")

    async def scenario() -> None:
        wrong = StorageStreams(str(uuid.uuid4()), n, FAST)
        refused = ReplicaConnection(node.address, 0, 1, key, n, FAST, wrong)
        with pytest.raises(ReplicaError) as info:
            await refused.open()
        assert info.value.code == "CLUSTER_KEY_MISMATCH"
        assert wrong.open_streams == 0
        await refused.close()
        await wrong.close()

        streams = StorageStreams(key, n, FAST)
        first = ReplicaConnection(node.address, 0, 1, key, n, FAST, streams)
        second = ReplicaConnection(node.address, 1, 1, key, n, FAST, streams)
        await first.open()
        await second.open()
        assert streams.open_streams == 1
        assert await first.max_transaction_id() == -1
        await asyncio.to_thread(node.kill)
        for connection in (first, second):
            with pytest.raises(ReplicaError) as info:
                await connection.max_transaction_id()
            assert info.value.code == "UNAVAILABLE"
            await connection.close()
        assert streams.open_streams == 0
        dropped = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
        assert dropped and node.address in dropped[-1] and "partition 0" in dropped[-1], dropped
        unreachable = ReplicaConnection(node.address, 0, 1, key, n, FAST, streams)
        with pytest.raises(ReplicaError) as info:
            await unreachable.open()
        assert info.value.code == "UNAVAILABLE"
        await unreachable.close()
        assert streams.open_streams == 0
        await asyncio.to_thread(node.start)
        again = ReplicaConnection(node.address, 0, 1, key, n, FAST, streams)
        await again.open()
        assert await again.max_transaction_id() == -1
        assert streams.open_streams == 1
        await again.close()
        await streams.close()
        with pytest.raises(ReplicaError) as info:  # the pool is closed: nothing opens any more
            await ReplicaConnection(node.address, 0, 1, key, n, FAST, streams).open()
        assert info.value.code == "UNAVAILABLE"

    run(scenario())


def test_replica_connections_are_told_when_their_stream_fails_not_when_they_close(
    store_cluster: StoreCluster,
) -> None:
    """A stream that fails (its storage node was killed) tells every open replica connection on it
    once, shared or its own; a connection closed before is not told, and one that listens after
    the failure is told at once (docs/design/server.md "Store sessions")."""
    n = store_cluster.params.num_partitions
    key = store_cluster.cluster_key
    node = store_cluster.storages[0]

    async def scenario() -> None:
        streams = StorageStreams(key, n, FAST)
        shared = [ReplicaConnection(node.address, p, 1, key, n, FAST, streams) for p in (0, 1)]
        own = ReplicaConnection(node.address, 0, 1, key, n, FAST)
        told: list[tuple[str, int, str]] = []
        for name, connection in (("shared-0", shared[0]), ("shared-1", shared[1]), ("own", own)):
            await connection.open()
            connection.on_failure(lambda e, name=name: told.append((name, e.partition_id, e.code)))
        assert streams.failure_listeners(node.address) == 2
        await shared[1].close()  # closed here: never told, and no longer listening
        assert streams.failure_listeners(node.address) == 1
        shared[1].on_failure(lambda e: told.append(("closed", e.partition_id, e.code)))
        assert streams.failure_listeners(node.address) == 1
        await own.max_transaction_id()
        assert told == [] and not shared[0].broken and not own.broken
        await asyncio.to_thread(node.kill)
        await settle(lambda: len(told) >= 2, "both listening connections told", 5.0)
        await asyncio.sleep(0.1)  # nobody is told twice
        assert sorted(told) == [("own", 0, "UNAVAILABLE"), ("shared-0", 0, "UNAVAILABLE")]
        assert shared[0].broken and own.broken and streams.failure_listeners(node.address) == 0
        late: list[ReplicaError] = []
        shared[0].on_failure(late.append)
        await asyncio.sleep(0)
        assert [e.code for e in late] == ["UNAVAILABLE"]
        for connection in (shared[0], own):
            await connection.close()
        await streams.close()
        assert len(told) == 2
        await asyncio.to_thread(node.start)

    run(scenario())


def test_a_stream_closed_here_tells_nobody(store_cluster: StoreCluster) -> None:
    """Closing a live stream is no failure: a listener added before the close, or after it, is
    never called (docs/design/server.md "Store sessions")."""
    node = store_cluster.storages[1]

    async def scenario() -> None:
        told: list[BaseException] = []
        client = StorageSessionClient(
            node.address, store_cluster.cluster_key, store_cluster.params.num_partitions
        )
        await client.open()
        client.on_failure(told.append)
        await client.close()
        remove = client.on_failure(told.append)
        remove()
        await asyncio.sleep(0.1)
        assert told == [] and client.failure_listeners == 0 and client.broken

    run(scenario())


def test_writers_whose_streams_failed_before_the_session_started_get_no_batch(
    store_cluster: StoreCluster,
) -> None:
    """Two of three writers' storage nodes die between the recovery and the session's start: the
    session drops them as it starts, before its first batch, and ends (below a quorum); the queued
    appends stay queued for the next session instead of going out on dead streams, where the next
    recovery would drop them (docs/design/server.md "Store sessions")."""
    n = store_cluster.params.num_partitions
    key = store_cluster.cluster_key

    async def scenario() -> None:
        writers = await open_replicas(store_cluster)
        dead = store_cluster.storages[1:]
        for node in dead:
            await asyncio.to_thread(node.kill)
        await settle(lambda: all(writers[node.address].broken for node in dead), "the dead streams seen", 5.0)
        queue, outcomes = queued_appends(3)
        session = StoreSession(
            queue,
            partition_id=0,
            session_id=1,
            recovery=RecoveryResult(-1, dict(writers), store_cluster.zk.partition_metadata(0)),
            assigned=list(writers),
            config=FAST,
            connect=lambda storage: ReplicaConnection(storage, 0, 1, key, n, FAST),
            zk=store_cluster.zk,
        )
        try:
            await asyncio.wait_for(session.run(), 10)
            assert session.ending and list(session.writers) == [store_cluster.storages[0].address]
            assert queue.batches_taken == 0 and queue.queued == 3 and outcomes == []
        finally:  # a failed check leaves no stream behind
            await session.close()

    run(scenario())


@pytest.mark.parametrize("max_batch_bytes", [4 << 20, 16 << 20])
def test_large_transactions_in_flight_stay_under_the_message_limit(
    store_cluster: StoreCluster, max_batch_bytes: int
) -> None:
    """Ten 5 MiB transactions at once (50 MiB, past the 32 MiB gRPC limit) commit in one session:
    the server's batches and the stream messages that merge them keep under their byte budgets."""
    big = 5 << 20

    async def scenario() -> None:
        config = StoreConfig(
            connect_timeout=2.0, request_timeout=30.0, retry_interval=0.2, max_batch_bytes=max_batch_bytes
        )
        partition = store(store_cluster, config=config)
        partition.start()
        datas = [bytes([i]) * big for i in range(10)]
        futures = [partition.submit(ReqId(1, 1, 0, i), 0, data) for i, data in enumerate(datas)]
        assert list(await asyncio.gather(*futures)) == list(range(10))
        assert partition.sessions_started == 1  # no replica failed on an oversized message
        per_batch = max(1, max_batch_bytes // (big + RECORD_OVERHEAD_BYTES))
        assert partition.batches_sent >= -(-10 // per_batch)  # 10 batches of 1, or 4 of at most 3
        records = await partition.read_records(0, 10)
        assert [r.data[:1] for r in records[:3]] == [bytes([i]) for i in range(len(records[:3]))]
        await partition.close()
        for node in store_cluster.storages:
            async with StorageAdminClient(
                node.admin_address, store_cluster.cluster_key, store_cluster.params.num_partitions
            ) as admin:
                assert await admin.max_transaction_id(0) == 9

    run(scenario())


async def append_until(
    partition: StorePartition, results: dict[int, int | Exception], stop: asyncio.Event
) -> None:
    """Append continuously (up to 8 in flight) until ``stop``; record each outcome."""
    next_id = 0
    in_flight: list[tuple[int, asyncio.Future[int]]] = []
    for _ in range(1_000_000):  # bounded; stop ends it long before
        if stop.is_set() and not in_flight:
            return
        while not stop.is_set() and len(in_flight) < 8:
            in_flight.append((next_id, partition.submit(ReqId(2, 1, 0, next_id), 0, payload(next_id))))
            next_id += 1
        i, future = in_flight.pop(0)
        try:
            results[i] = await asyncio.wait_for(future, 30)
        except Exception as exc:
            results[i] = exc


def check_log(records: list[Record], results: dict[int, int | Exception]) -> None:
    """Every acknowledged append is in the log exactly once, at its transaction ID; no gaps."""
    assert [r.transaction_id for r in records] == list(range(len(records)))
    by_seq = {r.req_id.seq_num: r for r in records}
    assert len(by_seq) == len(records), "a request is in the log twice"
    for seq, outcome in results.items():
        if isinstance(outcome, int):
            assert by_seq[seq].transaction_id == outcome
            assert by_seq[seq].data == payload(seq)


@SHARED
def test_kill_one_storage_during_appends_then_it_catches_up(
    store_cluster: StoreCluster, shared: bool
) -> None:
    async def scenario() -> None:
        streams = streams_of(store_cluster, shared)
        partition = store(store_cluster, streams=streams)
        partition.start()
        results: dict[int, int | Exception] = {}
        stop = asyncio.Event()
        writer = asyncio.create_task(append_until(partition, results, stop))
        await asyncio.sleep(0.5)
        victim = store_cluster.storages[1]
        victim.kill()
        committed_before = partition.high_water_mark
        await asyncio.sleep(1.5)
        assert partition.high_water_mark > committed_before + 50, "appends did not continue without the node"
        assert victim.address not in partition.replicas_in_session
        await asyncio.to_thread(victim.start)
        for _ in range(100):  # the session notices the node and the next recovery catches it up
            if victim.address in partition.replicas_in_session:
                break
            await asyncio.sleep(0.1)
        assert victim.address in partition.replicas_in_session
        await asyncio.sleep(0.3)
        stop.set()
        await writer
        await partition.close()
        await close_streams(streams)
        acknowledged = [v for v in results.values() if isinstance(v, int)]
        assert len(acknowledged) > 100
        replicas = await replica_records(store_cluster, 0)
        reference = replicas[store_cluster.storages[0].address]
        check_log(reference, results)
        for address, records in replicas.items():
            assert records == reference, f"replica {address} differs"

    run(scenario())


@SHARED
def test_two_storages_down_stops_writes_until_one_returns(store_cluster: StoreCluster, shared: bool) -> None:
    async def scenario() -> None:
        streams = streams_of(store_cluster, shared)
        partition = store(store_cluster, streams=streams)
        partition.start()
        assert await append_many(partition, 0, 20) == list(range(20))
        a, b = store_cluster.storages[1], store_cluster.storages[2]
        a.kill()
        b.kill()
        waiting = [partition.submit(ReqId(1, 1, 0, 100 + i), 0, payload(100 + i)) for i in range(5)]
        done, _ = await asyncio.wait(waiting, timeout=2.0)
        assert not any(f.done() and not f.exception() for f in done), "committed without a quorum"
        await asyncio.to_thread(a.start)
        outcomes = await asyncio.gather(*waiting, return_exceptions=True)
        more = await append_many(partition, 200, 10)
        await partition.close()
        await close_streams(streams)
        assert more == sorted(more) and more[0] > 19
        first = store_cluster.storages[0]
        records = (await replica_records(store_cluster, 0, [first]))[first.address]
        assert [r.transaction_id for r in records] == list(range(len(records)))
        for i, outcome in enumerate(outcomes):
            if isinstance(outcome, int):
                assert records[outcome].req_id.seq_num == 100 + i
        assert [r.req_id.seq_num for r in records[:20]] == list(range(20))

    run(scenario())


@SHARED
def test_storage_nodes_that_restart_while_the_session_is_idle_end_it_at_once(
    store_cluster: StoreCluster, shared: bool
) -> None:
    """Two storage nodes restart while the session is idle: their streams fail, and the session
    ends at once (a recovery then waits for a quorum), not at its next probe, which comes every
    20 s here, nor at the next append, which a recovery with a quorum of dead streams would drop.
    The appends made once the nodes are back all commit (docs/design/server.md "Store sessions")."""
    config = StoreConfig(connect_timeout=2.0, request_timeout=5.0, retry_interval=5.0)  # probe: 20 s

    async def scenario() -> None:
        streams = StorageStreams(store_cluster.cluster_key, store_cluster.params.num_partitions, config)
        partition = store(store_cluster, config=config, streams=streams if shared else None)
        partition.start()
        assert await append_many(partition, 0, 20) == list(range(20))
        sessions = partition.sessions_started
        a, b = store_cluster.storages[1], store_cluster.storages[2]
        a.kill()
        b.kill()
        # Well inside the 20 s of the probe.
        await settle(
            lambda: not partition.writable, "the session to end, not go on writing on dead streams", 3.0
        )
        await asyncio.gather(asyncio.to_thread(a.start), asyncio.to_thread(b.start))
        await partition.wait_writable(30)
        assert partition.sessions_started > sessions
        assert await append_many(partition, 20, 10) == list(range(20, 30))
        await partition.close()
        await streams.close()
        first = store_cluster.storages[0]
        records = (await replica_records(store_cluster, 0, [first]))[first.address]
        assert [r.req_id.seq_num for r in records] == list(range(30))

    run(scenario())


@SHARED
def test_a_newer_generation_fences_the_old_owner(store_cluster: StoreCluster, shared: bool) -> None:
    """Shared: both owners' sessions on the same streams; fencing is per request, not per stream."""

    async def scenario() -> None:
        streams = streams_of(store_cluster, shared)
        old = store(store_cluster, generation=1, streams=streams)
        old.start()
        assert await append_many(old, 0, 10) == list(range(10))
        new = store(store_cluster, generation=2, streams=streams)
        new.start()
        await new.wait_writable(20)
        # The old owner's next append fails, it cannot start a session with its old generation.
        with pytest.raises((AppendFailedError, StoreClosedError)):
            await asyncio.wait_for(old.append(ReqId(1, 1, 0, 99), 0, b"late"), 20)
        for _ in range(100):
            if old.closed:
                break
            await asyncio.sleep(0.1)
        assert old.closed and "generation" in old.close_reason
        assert await new.append(ReqId(1, 2, 0, 10), 0, payload(10)) == 10
        await new.close()
        await close_streams(streams)
        records = (await replica_records(store_cluster, 0))[store_cluster.storages[0].address]
        assert [r.req_id.seq_num for r in records] == list(range(11))

    run(scenario())


def test_a_fenced_store_tells_its_owner_first_and_leaves_its_records_in_flight_undecided(
    store_cluster: StoreCluster,
) -> None:
    """docs/design/server.md "What a client hears from a fenced owner": the record reached one
    replica only, so the next owner's recovery may commit it; the old store must not call it
    failed, and its owner hears of the close before the record is settled."""

    async def scenario() -> None:
        partition = store(store_cluster)
        closes: list[tuple[str, bool]] = []
        in_flight: asyncio.Future[int] | None = None

        def closing(reason: str) -> None:
            closes.append((reason, in_flight is not None and in_flight.done()))

        partition.on_close = closing
        partition.start()
        assert await append_many(partition, 0, 5) == list(range(5))
        # A newer owner takes the next store session ID; the old store writes on meanwhile.
        await asyncio.to_thread(store_cluster.zk.begin_store_session, 0, 2)
        first, frozen = store_cluster.storages[0], store_cluster.storages[1:]
        # Two replicas frozen, not yet dead: their streams stay up, so the record is sent (in
        # flight) and reaches the first replica only. Killed before that, the session could
        # notice the dead streams first, close on the fence and refuse the record unsent.
        for node in frozen:
            node.process.pause()
        try:
            in_flight = partition.submit(ReqId(1, 1, 0, 100), 0, payload(100))
            for _ in range(200):  # bounded: 20 s
                on_first = (await replica_records(store_cluster, 0, [first]))[first.address]
                if len(on_first) == 6:
                    break
                await asyncio.sleep(0.1)
            assert [r.req_id.seq_num for r in on_first] == [0, 1, 2, 3, 4, 100]
            assert not in_flight.done()
        finally:
            for node in frozen:
                node.kill()
        with pytest.raises(AppendUndecidedError, match="next store session"):
            await asyncio.wait_for(in_flight, 30)
        assert partition.closed and "generation 1 is fenced by generation 2" in partition.close_reason
        assert [done for _, done in closes] == [False], closes
        with pytest.raises(StoreClosedError) as refused:
            await partition.append(ReqId(1, 1, 0, 101), 0, b"after the close")
        assert not isinstance(refused.value, AppendUndecidedError)
        await partition.close()
        records = (await replica_records(store_cluster, 0, [first]))[first.address]
        assert [r.req_id.seq_num for r in records] == [0, 1, 2, 3, 4, 100]

    run(scenario())


def test_sessions_roll_over_at_the_checkpoint_interval(store_cluster: StoreCluster) -> None:
    async def scenario() -> None:
        config = StoreConfig(
            connect_timeout=2.0,
            request_timeout=5.0,
            retry_interval=0.2,
            checkpoint_interval=50,
            max_batch_records=10,
        )
        partition = store(store_cluster, partition_id=1, config=config)
        partition.start()
        assert await append_many(partition, 0, 300) == list(range(300))
        assert partition.sessions_started >= 5
        await partition.close()
        replicas = await replica_records(store_cluster, 1)
        assert len({tuple(r) for r in replicas.values()}) == 1

    run(scenario())


def test_a_storage_restored_from_an_old_backup_is_truncated_and_caught_up(
    store_cluster: StoreCluster, tmp_path: Path
) -> None:
    node = store_cluster.storages[2]

    async def first_part() -> None:
        partition = store(store_cluster)
        partition.start()
        assert await append_many(partition, 0, 100) == list(range(100))
        await partition.close()

    run(first_part())
    node.stop()
    backup = tmp_path / "backup"
    shutil.copytree(node.directory, backup)
    node.start()

    async def second_part() -> None:
        partition = store(store_cluster)
        partition.start()
        assert await append_many(partition, 100, 100) == list(range(100, 200))
        await partition.close()

    run(second_part())
    node.stop()
    shutil.rmtree(node.directory)
    shutil.copytree(backup, node.directory)
    node.start()

    async def third_part() -> None:
        partition = store(store_cluster)
        partition.start()
        assert await append_many(partition, 200, 10) == list(range(200, 210))
        # Truncated to its low-water mark, it is caught up in the background and joins.
        await settle(lambda: node.address in partition.replicas_in_session, "the restored replica joins", 30)
        await partition.close()
        replicas = await replica_records(store_cluster, 0)
        assert all(len(r) == 210 for r in replicas.values())
        assert len({tuple(r) for r in replicas.values()}) == 1

    run(third_part())


def test_a_replica_restored_from_an_old_backup_casts_no_vote_and_acknowledged_records_stay(
    store_cluster: StoreCluster, tmp_path: Path
) -> None:
    """docs/design/recovery.md "Cleaning each replica": a replica restored from a backup holds less
    than it acknowledged, so its maximum is no vote. A and B acknowledge 100..199 while C is down at
    99; B's disk is then replaced by a backup from before 100. Counting B's low-water mark as a
    vote would resolve 99 with C and truncate A; as a voter that cannot vote, B leaves the vote
    undecidable between A and C, which C's catch-up from A settles at 199."""
    a, b, c = store_cluster.storages

    async def write(first: int, count: int) -> None:
        partition = store(store_cluster)
        partition.start()
        assert await asyncio.wait_for(append_many(partition, first, count), 30) == list(
            range(first, first + count)
        )
        await partition.close()

    run(write(0, 100))
    b.stop()
    backup = tmp_path / "backup"
    shutil.copytree(b.directory, backup)
    b.start()
    c.stop()
    run(write(100, 100))  # acknowledged by A and B; C is down and gets the closing mark 99
    assert store_cluster.zk.partition_metadata(0).value.replicas[c.address].closing_high_water_mark == 99
    b.stop()
    shutil.rmtree(b.directory)
    shutil.copytree(backup, b.directory)
    b.start()
    c.start()

    async def the_next_owner() -> None:
        partition = store(store_cluster)
        partition.start()
        await partition.wait_writable(30)
        assert partition.high_water_mark == 199
        assert await asyncio.wait_for(append_many(partition, 200, 10), 30) == list(range(200, 210))
        await settle(lambda: b.address in partition.replicas_in_session, "the restored replica joins", 30)
        await partition.close()
        replicas = await replica_records(store_cluster, 0)
        assert {s: len(r) for s, r in replicas.items()} == {s.address: 210 for s in store_cluster.storages}
        assert len({tuple(r) for r in replicas.values()}) == 1
        assert [r.data for r in replicas[a.address]] == [payload(i) for i in range(210)]

    run(the_next_owner())


def numbered_records(first: int, count: int) -> list[Record]:
    return [
        Record(i, ReqId(1, 1, 0, i), 0, payload(i), crc32(payload(i))) for i in range(first, first + count)
    ]


def last_session_on_disk(cluster: StoreCluster, holding: dict[str, int], restored: set[str]) -> None:
    """Make partition 0's replicas in ``holding`` the writers of store session 2 in ZooKeeper
    (unresolved closing marks), as a session leaves them when its owner stops: session 1 wrote
    0..99 to each and set its low-water mark to 49; session 2 set the mark to 99 on each replica
    not in ``restored`` and wrote up to ``holding[storage]`` there. A replica in ``restored`` holds
    what session 1 left (its disk restored from a backup of then)."""
    n, key = cluster.params.num_partitions, cluster.cluster_key

    async def write() -> None:
        for session, ids in ((1, None), (2, holding)):
            for storage in holding:
                if session == 2 and storage in restored:
                    continue
                connection = ReplicaConnection(storage, 0, session, key, n, FAST)
                await connection.open()
                try:
                    if ids is None:
                        await connection.append(numbered_records(0, 100))
                        await connection.set_low_water_mark(49)
                    else:
                        await connection.set_low_water_mark(99)
                        await connection.append(numbered_records(100, ids[storage] - 99))
                finally:
                    await connection.close()

    run(write())
    current = cluster.zk.partition_metadata(0)
    replicas = {storage: ReplicaState(2, None) for storage in holding}
    cluster.zk.set_partition_metadata(0, PartitionMetadata(1, 2, replicas), current.version)


def recovery_manager(
    cluster: StoreCluster, assigned: list[str], closed: Callable[[], bool]
) -> RecoveryManager:
    """The recovery of partition 0's next store session, as a store partition runs it."""
    previous, session = cluster.zk.begin_store_session(0, 1)
    n, key, session_id = cluster.params.num_partitions, cluster.cluster_key, session.value.session_id
    return RecoveryManager(
        0,
        session,
        previous,
        assigned,
        lambda storage: ReplicaConnection(storage, 0, session_id, key, n, FAST),
        cluster.zk,
        FAST,
        closed=closed,
    )


async def close_recovered(result: RecoveryResult) -> None:
    for connection in result.clean.values():
        await connection.close()
    for lagging in result.lagging.values():
        await lagging.connection.close()


@pytest.mark.parametrize("replicas", [3, 2], ids=["three-replicas", "two-replicas"])
def test_the_recovery_counts_a_restored_replica_as_a_voter_that_is_down(
    store_cluster: StoreCluster, replicas: int
) -> None:
    """docs/design/recovery.md "Replicas restored from an old copy": A and B acknowledged 100..199
    in session 2 while the writer C stayed at 99; B was then restored from a backup of session 1.
    Its low-water mark is no vote, or 99 would win with C and A's acknowledged records would go.
    Counted as down, it leaves the vote undecidable; C copies A's records and 199 wins. With two
    replicas, A alone is in every quorum: B votes once it holds A's records, and 199 wins too."""
    a, b, c = (s.address for s in store_cluster.storages)
    holding = {a: 199, b: 199, c: 99} if replicas == 3 else {a: 199, b: 199}
    last_session_on_disk(store_cluster, holding, restored={b})

    async def recover() -> None:
        result = await asyncio.wait_for(
            recovery_manager(store_cluster, sorted(holding), lambda: False).run(), 30
        )
        await close_recovered(result)
        assert result.high_water_mark == 199
        assert sorted(result.clean) == sorted(holding)
        stored = await replica_records(store_cluster, 0, store_cluster.storages[:replicas])
        assert {s: [r.transaction_id for r in rs] for s, rs in stored.items()} == {
            s: list(range(200)) for s in holding
        }
        assert len({tuple(rs) for rs in stored.values()}) == 1

    run(recover())


def test_the_recovery_waits_while_restored_replicas_and_unreached_ones_are_a_quorum(
    store_cluster: StoreCluster, caplog: pytest.LogCaptureFixture
) -> None:
    """docs/design/recovery.md "Replicas restored from an old copy": with B and C both restored,
    only A holds its own records, and a quorum (B and C) may have acknowledged records A lacks.
    The recovery resolves no mark: it waits, naming the restored replicas, and truncates nothing
    A holds."""
    a, b, c = (s.address for s in store_cluster.storages)
    last_session_on_disk(store_cluster, {a: 149, b: 199, c: 199}, restored={b, c})
    caplog.set_level(logging.INFO, logger="waltz.services.server.store")
    stop = False

    def waiting() -> bool:
        return any("cast no vote" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)

    async def recover() -> None:
        nonlocal stop
        task = asyncio.create_task(recovery_manager(store_cluster, [a, b, c], lambda: stop).run())
        await settle(waiting, "the recovery warns that it waits for a voter", 30)
        stop = True
        with pytest.raises(RecoveryAbortedError):
            await asyncio.wait_for(task, 10)
        stored = await replica_records(store_cluster, 0)
        assert len(stored[a]) == 150

    run(recover())
    warning = next(r.getMessage() for r in caplog.records if "cast no vote" in r.getMessage())
    assert f"{', '.join(sorted((b, c)))} restored from an old copy" in warning, warning
    assert "undecidable" in warning, warning


def test_a_replica_whose_partition_info_is_corrupt_is_left_out_with_a_warning(
    store_cluster: StoreCluster, caplog: pytest.LogCaptureFixture
) -> None:
    """docs/design/storage.md "Control file": a replica whose two partition-info structs both fail their
    CRCs refuses the recovery's last-session-info with ``CORRUPT_DATA``. The session goes on with
    the other replicas, and the recovery says so at WARNING, as for a wrong cluster key: the file
    needs an operator, it is not a node that is down for a while."""
    from tests.services.storage.test_control_file import flip, struct_offset
    from waltz.services.storage.control_file import ControlFile

    node = store_cluster.storages[2]

    async def write(first: int) -> None:
        partition = store(store_cluster)
        partition.start()
        assert await append_many(partition, first, 20) == list(range(first, first + 20))
        await partition.close()

    run(write(0))
    node.stop()
    control = ControlFile.path_in(node.directory)
    flip(control, struct_offset(0, 0) + 1)
    flip(control, struct_offset(0, 1) + 1)
    node.start()
    caplog.set_level(logging.INFO, logger="waltz.services.server.store")
    run(write(20))
    warned = [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and node.address in r.getMessage() and "unavailable" in r.getMessage()
    ]
    assert warned and "CORRUPT_DATA" in warned[0], [r.getMessage() for r in caplog.records]


def test_add_a_replica_catch_up_then_remove_another(
    store_cluster: StoreCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from waltz.admin.storage_admin import StorageNodeAdmin

    caplog.set_level(logging.INFO, logger="waltz.services.server.store")

    admin = StorageNodeAdmin(store_cluster.zk, storage_timeout=10)
    newcomer = LocalStorageNode(
        tmp_path / "storage-new", name="storage-new", log_path=tmp_path / "storage-new.log", insecure=True
    )
    leaving = store_cluster.storages[0]

    async def wait_for(partition: StorePartition, condition: Callable[[list[str]], bool], what: str) -> None:
        for _ in range(200):
            if condition(partition.replicas_in_session):
                return
            await asyncio.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}: in session {partition.replicas_in_session}")

    async def scenario() -> None:
        partition = store(store_cluster)
        partition.start()
        results: dict[int, int | Exception] = {}
        stop = asyncio.Event()
        writer = asyncio.create_task(append_until(partition, results, stop))
        await asyncio.sleep(0.5)
        await asyncio.to_thread(admin.add, newcomer.address, newcomer.admin_port)
        await asyncio.to_thread(admin.assign, newcomer.address, [0])
        await wait_for(partition, lambda s: newcomer.address in s, "the new replica to join")
        await asyncio.to_thread(admin.unassign, leaving.address, [0])
        await wait_for(partition, lambda s: leaving.address not in s, "the removed replica to leave")
        await asyncio.sleep(0.3)
        stop.set()
        await writer
        await partition.close()
        remaining = [n for n in [*store_cluster.storages[1:], newcomer]]
        replicas = await replica_records(store_cluster, 0, remaining)
        reference = replicas[newcomer.address]
        check_log(reference, results)
        assert sum(isinstance(v, int) for v in results.values()) > 100
        for address, records in replicas.items():
            assert records == reference, f"replica {address} differs"

    try:
        newcomer.start()
        run(scenario())
    finally:
        newcomer.close()
    # An unassignment is an operator's routine: the writer on the node leaves without a warning,
    # whether the session's probe or an append refused by the node noticed it first.
    warned = [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and leaving.address in r.getMessage()
    ]
    assert not warned, warned


def test_recover_partition_seeds_a_new_replica_with_committed_records(
    store_cluster: StoreCluster, tmp_path: Path
) -> None:
    from waltz.admin.recover import recover_partition
    from waltz.admin.storage_admin import StorageNodeAdmin
    from waltz.errors import MetadataError
    from waltz.metadata.replicas import ReplicaChangeRefusedError

    admin = StorageNodeAdmin(store_cluster.zk, storage_timeout=10)
    newcomer = LocalStorageNode(
        tmp_path / "storage-new", name="storage-new", log_path=tmp_path / "storage-new.log", insecure=True
    )
    source = store_cluster.storages[0]

    async def write(first: int, count: int, joins: str | None = None) -> None:
        partition = store(store_cluster)
        partition.start()
        assert await append_many(partition, first, count) == list(range(first, first + count))
        if joins is not None:  # a lagging replica is caught up while the session writes
            await settle(lambda: joins in partition.replicas_in_session, f"{joins} joins", 30)
        await partition.close()

    async def scenario() -> None:
        await write(0, 300)
        await write(300, 5)  # the second session's low-water mark is 299: committed for sure
        with pytest.raises(MetadataError, match="not assigned"):
            await recover_partition(store_cluster.zk, source.address, newcomer.address, 0)
        with pytest.raises(ReplicaChangeRefusedError, match="caught-up replica") as refused:
            await recover_partition(store_cluster.zk, source.address, store_cluster.storages[1].address, 0)
        # recover-partition has no --force: its refusal says what to do instead (it offered --force).
        said = str(refused.value)
        assert "--force" not in said, said
        assert "needs no copy" in said and "waltz cluster list" in said, said
        await asyncio.to_thread(admin.add, newcomer.address, newcomer.admin_port)
        await asyncio.to_thread(admin.assign, newcomer.address, [0])
        result = await recover_partition(store_cluster.zk, source.address, newcomer.address, 0)
        assert (result.committed, result.kept, result.copied) == (299, -1, 300)
        copied = (await replica_records(store_cluster, 0, [newcomer]))[newcomer.address]
        reference = (await replica_records(store_cluster, 0, [source]))[source.address]
        assert copied == reference[:300]
        # The next session keeps the copy and catches up only the rest.
        await write(305, 5, joins=newcomer.address)
        replicas = await replica_records(store_cluster, 0, [*store_cluster.storages, newcomer])
        assert len({tuple(r) for r in replicas.values()}) == 1
        assert len(replicas[newcomer.address]) == 310

    try:
        newcomer.start()
        run(scenario())
    finally:
        newcomer.close()


def test_the_linger_waits_only_while_a_batch_awaits_its_quorum() -> None:
    """``StoreConfig.linger`` (``storage.linger``): a queue smaller than a batch waits for more
    records while a batch sent earlier is not committed, never when every batch sent is (even if
    a replica beyond the quorum has not answered: only the commit counts), and never once it holds
    a full batch (group commit without a timer on an idle partition)."""
    queue = AppendQueue(0)
    queue.settle(41)  # a recovery ended the log at 41
    for seq_num in range(3):
        queue.put(PendingAppend(ReqId(1, 1, 0, seq_num), 0, b"x", crc32(b"x"), None))
    now = queue.queued_since + 0.0005
    assert queue.linger_left(now, 0.002, 10, sent_through=41) == 0.0  # every batch committed: send now
    assert queue.linger_left(now, 0.002, 10, sent_through=51) == pytest.approx(0.0015)  # wait for more
    assert queue.linger_left(queue.queued_since + 0.003, 0.002, 10, sent_through=51) < 0  # waited enough
    queue.commit_through(51)
    assert queue.linger_left(now, 0.002, 10, sent_through=51) == 0.0  # that batch committed: send now
    assert queue.linger_left(now, 0.0, 10, sent_through=61) == 0.0  # no linger configured
    for seq_num in range(3, 10):
        queue.put(PendingAppend(ReqId(1, 1, 0, seq_num), 0, b"x", crc32(b"x"), None))
    assert queue.linger_left(now, 0.002, 10, sent_through=61) == 0.0  # a full batch goes at once


async def append_behind_a_flying_batch(partition: StorePartition, seq_num: int) -> None:
    """Append ``seq_num`` alone, then ``seq_num + 1`` while its batch awaits its quorum: the second
    waits for that commit (not for the linger), then goes in a batch of its own. The partition's
    log must end at ``seq_num - 1``."""
    sent = partition.batches_sent
    first = asyncio.ensure_future(partition.append(ReqId(1, 1, 0, seq_num), 0, payload(seq_num)))
    for _ in range(2000):  # bounded: until the first batch has left
        if partition.batches_sent > sent:
            break
        await asyncio.sleep(0.001)
    assert partition.batches_sent == sent + 1
    second = partition.append(ReqId(1, 1, 0, seq_num + 1), 0, payload(seq_num + 1))
    assert await asyncio.wait_for(asyncio.gather(first, second), 20) == [seq_num, seq_num + 1]
    assert partition.batches_sent == sent + 2


def test_a_long_linger_never_holds_a_lone_append_and_ends_when_the_flying_batch_resolves(
    store_cluster: StoreCluster,
) -> None:
    async def scenario() -> None:
        partition = store(store_cluster, config=StoreConfig(connect_timeout=2.0, linger=60.0))
        partition.start()
        try:
            # One at a time: nothing else is in flight, so each is sent at once.
            for i in range(5):
                assert await asyncio.wait_for(partition.append(ReqId(1, 1, 0, i), 0, payload(i)), 20) == i
            await append_behind_a_flying_batch(partition, 5)
        finally:
            await partition.close()

    run(scenario())


def test_a_paused_replica_beyond_the_quorum_does_not_hold_the_lingering_batch(
    store_cluster: StoreCluster,
) -> None:
    """With one of three replicas frozen (SIGSTOP), its answers never come; the batch queued
    behind a flying one still goes as soon as that one commits on the other two, long before the
    60 s linger or the replica's request timeout."""
    slow = store_cluster.storages[2]

    async def scenario() -> None:
        config = StoreConfig(connect_timeout=2.0, request_timeout=60.0, retry_interval=0.2, linger=60.0)
        partition = store(store_cluster, config=config)
        partition.start()
        try:
            assert await asyncio.wait_for(partition.append(ReqId(1, 1, 0, 0), 0, payload(0)), 20) == 0
            slow.process.pause()
            await append_behind_a_flying_batch(partition, 1)
        finally:
            slow.process.resume()
            await partition.close()

    try:
        run(scenario())
    finally:
        slow.process.resume()


def test_a_store_whose_zookeeper_session_is_down_at_recovery_recovers_once_it_is_back(
    store_cluster: StoreCluster, zookeeper: object
) -> None:
    """A recovery that meets a ZooKeeper connection that is down (kazoo raises, not a WaltzError)
    is retried like any failed recovery, instead of ending the partition's store for good."""
    from kazoo.client import KazooClient

    from waltz.metadata.zk import ClusterZk

    client = KazooClient(hosts=zookeeper.connect_string)  # type: ignore[attr-defined]
    client.start(timeout=10)
    client.stop()  # down: every call raises until it starts again

    async def scenario() -> None:
        partition = StorePartition(
            0,
            1,
            ClusterZk(client, store_cluster.zk.paths.root),
            store_cluster.cluster_key,
            store_cluster.params.num_partitions,
            FAST,
        )
        partition.start()
        try:
            await asyncio.sleep(3 * FAST.retry_interval)  # recoveries fail meanwhile
            assert not partition.recovered.is_set()
            await asyncio.to_thread(client.start, 10)
            assert await asyncio.wait_for(append_many(partition, 0, 3), 60) == [0, 1, 2]
        finally:
            await partition.close()

    try:
        run(scenario())
    finally:
        client.stop()
        client.close()


def test_a_replica_a_stopped_recovery_cleaned_past_its_recorded_closing_mark_rejoins(
    store_cluster: StoreCluster,
) -> None:
    """docs/design/recovery.md "Cleaning each replica": a recovery copies the committed records to
    a replica and raises its low-water mark before it records the replica's state in ZooKeeper; if
    it stops in between (a lost ZooKeeper session, a crash), ZooKeeper still holds the replica's
    older closing mark, below the replica's low-water mark. The next recovery truncates it to its
    low-water mark instead (a truncation to the closing mark would be refused, below the committed
    floor, on every round), and the replica rejoins."""
    late = store_cluster.storages[2]

    async def write_without_the_late_replica() -> None:
        partition = store(store_cluster)
        partition.start()
        assert await append_many(partition, 0, 50) == list(range(50))
        await partition.close()
        late.stop()
        partition = store(store_cluster)
        partition.start()
        assert await append_many(partition, 50, 70) == list(range(50, 120))
        await partition.close()

    run(write_without_the_late_replica())
    late.start()
    recorded = store_cluster.zk.partition_metadata(0).value
    closing = recorded.replicas[late.address].closing_high_water_mark
    assert closing == 49, recorded

    async def a_recovery_stopped_before_zookeeper() -> None:
        """What a recovery does to the late replica before its ZooKeeper update: truncate it to
        its closing mark, copy the committed records from a writer, raise its low-water mark."""
        n, key = store_cluster.params.num_partitions, store_cluster.cluster_key
        session = recorded.session_id + 1
        source = ReplicaConnection(store_cluster.storages[0].address, 0, session, key, n, FAST)
        target = ReplicaConnection(late.address, 0, session, key, n, FAST)
        for connection in (source, target):
            await connection.open()
        try:
            assert await target.truncate(closing) == 49
            assert await target.copy_from(source, 50, 119, 100) == 119
            await target.set_low_water_mark(119)
        finally:
            for connection in (source, target):
                await connection.close()

    run(a_recovery_stopped_before_zookeeper())
    assert store_cluster.zk.partition_metadata(0).value.replicas[late.address].closing_high_water_mark == 49

    async def the_next_owner() -> None:
        partition = store(store_cluster)
        partition.start()
        assert await append_many(partition, 120, 10) == list(range(120, 130))
        await settle(lambda: late.address in partition.replicas_in_session, "the late replica rejoins", 30)
        await partition.close()
        replicas = await replica_records(store_cluster, 0)
        assert all(len(r) == 130 for r in replicas.values()), {s: len(r) for s, r in replicas.items()}
        assert len({tuple(r) for r in replicas.values()}) == 1

    run(the_next_owner())
