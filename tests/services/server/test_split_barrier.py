"""A sealing parent's owner appends the barrier and writes its ID as ``B(p)``
(docs/design/splits.md "The handover", step 3; "Record forms").

Real storage and server processes and a real ZooKeeper. The test writes ``partitions/epochs`` as a
split's steps do (prepare, mark a parent sealing) while a raw protocol client streams appends
routed by epoch 0 to the parent: its owner appends exactly one barrier, after every stale append it
took, and writes its ID into the znode. A server that opens a sealing parent looks for the barrier
in its recovered log and appends none when it finds one (also when ``B(p)`` is not written yet),
and appends one before its first append when there is none.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace

import pytest
from kazoo.client import KazooClient
from support.feed import FeedEntry
from support.storage import run

from tests.services.server.test_epoch_refusals import (
    PartitionClient,
    is_stale_refusal,
    owner,
    seal_partition_0,
    start_cluster,
)
from waltz.local.cluster import LocalCluster
from waltz.metadata.epochs import PartitionEpochs, PartitionEpochsZk
from waltz.metadata.paths import ClusterPaths
from waltz.protocol import client_pb2
from waltz.protocol.records import Record
from waltz.protocol.server_client import ServerAdminClient
from waltz.protocol.split_records import SPLIT_RECORD_HEADER, SplitBarrier, decode_split_record

#: Batches of epoch-0 appends sent at most while the parent is marked sealing (5 rows each), at
#: least 0.01 s apart once the mark is under way.
STREAM_ROUNDS = 1000
ROWS = 5
#: Reads of the znode at most, 0.1 s apart, while waiting for an owner to write ``B(p)``.
BARRIER_POLLS = 300

Outcome = FeedEntry | client_pb2.ServerError | client_pb2.LockFailure


def epochs_zk(cluster: LocalCluster) -> tuple[KazooClient, PartitionEpochsZk]:
    zk = KazooClient(hosts=cluster.zookeeper_connect_string)
    zk.start(30)
    return zk, PartitionEpochsZk(zk, ClusterPaths.of(cluster.root), timeout=30)


def with_epochs(cluster: LocalCluster, step: str, *args: object) -> PartitionEpochs:
    """One step of ``PartitionEpochsZk`` (``prepare``, ``mark_sealing``, ``read``...) on a session
    of its own; the znode's value after it."""
    zk, epochs = epochs_zk(cluster)
    try:
        return getattr(epochs, step)(*args).value  # type: ignore[no-any-return]
    finally:
        zk.stop()
        zk.close()


def clear_barrier(cluster: LocalCluster, parent: int) -> None:
    """Write epoch 1's ``B(parent)`` back to null, as if the owner that appended the barrier had
    stopped before writing it (no split step does that: the test writes the znode itself)."""
    zk, epochs = epochs_zk(cluster)
    try:
        current = epochs.read()
        epoch = current.value.epoch(1)
        parents = dict(epoch.parents)
        parents[parent] = replace(parents[parent], barrier=None)
        value = replace(current.value, epochs=(replace(epoch, parents=parents),))
        zk.set(epochs.paths.epochs, value.encode(), version=current.version)
    finally:
        zk.stop()
        zk.close()


def wait_for_barrier(cluster: LocalCluster, parent: int) -> int | None:
    """``B(parent)`` of epoch 1 once an owner wrote it (read at most :data:`BARRIER_POLLS` times,
    0.1 s apart), or None when none did."""
    for _ in range(BARRIER_POLLS):
        barrier = with_epochs(cluster, "read").epoch(1).parents[parent].barrier
        if barrier is not None:
            return barrier
        time.sleep(0.1)
    return None


async def high_water_marks(cluster: LocalCluster) -> dict[int, int]:
    async with ServerAdminClient(cluster.owner(0), timeout=10) as admin:
        status = await admin.status()
    return {p.partition_id: p.high_water_mark for p in status.partitions}


async def records_above(cluster: LocalCluster, partition_id: int, after: int) -> list[Record]:
    """The committed records of ``partition_id`` above ``after``, read from its owner."""
    found: list[Record] = []
    async with ServerAdminClient(cluster.owner(partition_id), timeout=10) as admin:
        status = await admin.status()
        (last,) = (p.high_water_mark for p in status.partitions if p.partition_id == partition_id)
        for _ in range(1000):
            first = (found[-1].transaction_id if found else after) + 1
            if first > last:
                return found
            page = await admin.read(partition_id, first, 1000)
            assert page and page[0].transaction_id == first, (first, page[:1])
            found.extend(page)
    raise AssertionError(f"partition {partition_id}: more than a million records above {after}")


def opened_high_water_mark(cluster: LocalCluster, partition_id: int, client_id: int) -> int:
    """The high-water mark of ``partition_id`` as its owner answers it once the partition is open
    (recovered, epochs read, sealed), after a raw client's mount."""
    endpoint, generation = owner(cluster, partition_id)

    async def probe() -> int:
        peer = PartitionClient(endpoint, client_id, generation, partition_id)
        try:
            return await peer.mount_at_high_water_mark()
        finally:
            await peer.close()

    return run(probe())


def split_records(records: list[Record]) -> list[Record]:
    return [r for r in records if r.header == SPLIT_RECORD_HEADER]


async def collect(peer: PartitionClient, seq_nums: list[int], outcomes: dict[int, Outcome]) -> None:
    """Read the peer's stream into ``outcomes`` (by sequence number: every outcome of the peer's
    appends that arrives) until each append of ``seq_nums`` has its outcome. Others' feed entries,
    the barrier's among them, are passed over."""
    for _ in range(100_000):
        if all(seq_num in outcomes for seq_num in seq_nums):
            return
        item = await asyncio.wait_for(peer.incoming.get(), 10)
        if isinstance(item, FeedEntry):
            if item.req_id.client_id == peer.client_id:
                outcomes[item.req_id.seq_num] = item
            continue
        kind = item.WhichOneof("body")
        if kind in ("error", "lock_failure"):
            message = getattr(item, kind)
            outcomes[message.req_id.seq_num] = message
    raise AssertionError(f"no outcome of some of appends {seq_nums} among 100,000 messages")


@dataclass
class Sealed:
    """What the live seal of parent 0 left: the cluster, ``H(p)`` of both parents, the barrier's
    ID, and the outcome of every append routed by epoch 0 sent while the parent was marked."""

    cluster: LocalCluster
    h0: int
    h1: int
    barrier: int | None
    stale: dict[int, Outcome]


@pytest.fixture(scope="module")
def sealed(tmp_path_factory: pytest.TempPathFactory, zookeeper: object) -> Iterator[Sealed]:
    """A cluster whose parent 0 was marked sealing for epoch 1 (2 -> 4 partitions) while a client
    streamed blind appends routed by epoch 0 to it, until one was refused."""
    with start_cluster(tmp_path_factory.mktemp("split-barrier"), zookeeper) as cluster:
        cluster.wait_ready(60)
        endpoint, generation = owner(cluster, 0)

        async def stream() -> tuple[int, int, dict[int, Outcome]]:
            peer = PartitionClient(endpoint, 800, generation, 0)
            try:
                await peer.mount_at_high_water_mark()
                # Something in the log before the split starts: H(0) is not -1.
                first = peer.appends_by(0, [b"before the split"])
                outcomes: dict[int, Outcome] = {}
                await collect(peer, first, outcomes)
                marks = await high_water_marks(cluster)
                await asyncio.to_thread(with_epochs, cluster, "prepare", 4, marks)
                outcomes.clear()
                mark: asyncio.Task[PartitionEpochs] | None = None
                previous: list[int] = []
                for round_ in range(STREAM_ROUNDS):
                    # One batch on the way while the one before is collected: appends are in
                    # flight when the gate closes.
                    sent = peer.appends_by(0, [b"epoch 0 #%d.%d" % (round_, i) for i in range(ROWS)])
                    await collect(peer, previous, outcomes)
                    previous = sent
                    if round_ == 2:
                        marking = asyncio.to_thread(with_epochs, cluster, "mark_sealing", 1, 0)
                        mark = asyncio.create_task(marking)
                    if mark is not None:
                        if mark.done() and any(not isinstance(o, FeedEntry) for o in outcomes.values()):
                            break
                        await asyncio.sleep(0.01)  # the watch's turn
                await collect(peer, previous, outcomes)
                assert mark is not None
                await mark
                return marks[0], marks[1], outcomes
            finally:
                await peer.close()

        h0, h1, stale = run(stream())
        yield Sealed(cluster, h0, h1, wait_for_barrier(cluster, 0), stale)


def test_marking_a_parent_sealing_makes_its_owner_append_one_barrier_after_every_stale_append(
    sealed: Sealed,
) -> None:
    cluster, barrier = sealed.cluster, sealed.barrier
    assert barrier is not None, "no owner wrote B(0) into partitions/epochs"
    (record,) = split_records(run(records_above(cluster, 0, sealed.h0)))
    assert record.transaction_id == barrier > sealed.h0
    assert decode_split_record(record.data) == SplitBarrier(epoch=1, count=4, previous_count=2, parent=0)
    # Appended by the owner under the reserved client ID 0, the epoch as its sequence number.
    assert (record.req_id.client_id, record.req_id.partition_id, record.req_id.seq_num) == (0, 0, 1)
    # The stream met the mark: some appends taken, the rest refused, none of them after the barrier.
    taken = [o.transaction_id for o in sealed.stale.values() if isinstance(o, FeedEntry)]
    refused = [o for o in sealed.stale.values() if not isinstance(o, FeedEntry)]
    assert taken and refused
    assert max(taken) < barrier
    assert all(is_stale_refusal(o) for o in refused), refused[:1]
    # The parent not sealing got no barrier: nothing was appended to it.
    epoch = with_epochs(cluster, "read").epoch(1)
    assert not epoch.parents[1].sealing and epoch.parents[1].barrier is None
    assert run(high_water_marks(cluster))[1] == sealed.h1


def test_an_owner_that_opens_a_sealed_parent_appends_no_second_barrier(sealed: Sealed) -> None:
    cluster, barrier = sealed.cluster, sealed.barrier
    assert barrier is not None, "no owner wrote B(0) into partitions/epochs"
    end = run(high_water_marks(cluster))[0]
    # B(p) not written yet when the owner stopped: the next one finds the barrier and writes it.
    cluster.stop_server(0)
    clear_barrier(cluster, 0)
    assert with_epochs(cluster, "read").epoch(1).parents[0].barrier is None
    cluster.restart_server(0)
    cluster.wait_ready(60)
    assert opened_high_water_mark(cluster, 0, 900) == end
    assert wait_for_barrier(cluster, 0) == barrier
    # B(p) written: the next owner appends nothing, and B(p) stays.
    cluster.restart_server(0)
    cluster.wait_ready(60)
    assert opened_high_water_mark(cluster, 0, 901) == end
    assert with_epochs(cluster, "read").epoch(1).parents[0].barrier == barrier
    (record,) = split_records(run(records_above(cluster, 0, sealed.h0)))
    assert record.transaction_id == barrier


def test_an_owner_that_opens_a_parent_marked_sealing_appends_the_barrier_before_any_append(
    sealed: Sealed,
) -> None:
    cluster = sealed.cluster
    end = run(high_water_marks(cluster))[1]
    cluster.stop_server(0)
    with_epochs(cluster, "mark_sealing", 1, 1)  # while no server owns it: only the open tells it
    cluster.restart_server(0)
    cluster.wait_ready(60)
    endpoint, generation = owner(cluster, 1)

    async def scenario() -> tuple[int, list[Outcome]]:
        peer = PartitionClient(endpoint, 1000, generation, 1)
        try:
            before = await peer.mount_at_high_water_mark()
            stale = peer.append_by(0, b"routed by epoch 0")
            routed = peer.append_by(1, b"routed by epoch 1")
            outcomes: dict[int, Outcome] = {}
            await collect(peer, [stale.seq_num, routed.seq_num], outcomes)
            return before, [outcomes[stale.seq_num], outcomes[routed.seq_num]]
        finally:
            await peer.close()

    before, (stale, routed) = run(scenario())
    # The barrier is the first append after the recovery: the mount's high-water mark is past it.
    assert before == end + 1
    assert wait_for_barrier(cluster, 1) == end + 1
    (record,) = split_records(run(records_above(cluster, 1, sealed.h1)))
    assert record.transaction_id == end + 1
    assert decode_split_record(record.data) == SplitBarrier(epoch=1, count=4, previous_count=2, parent=1)
    assert is_stale_refusal_of(stale, partition_count=4)
    assert isinstance(routed, FeedEntry) and routed.transaction_id == end + 2


def is_stale_refusal_of(outcome: Outcome, partition_count: int) -> bool:
    return (
        isinstance(outcome, client_pb2.ServerError)
        and outcome.code == client_pb2.STALE_PARTITION_EPOCH
        and (outcome.epoch, outcome.partition_count) == (1, partition_count)
    )


def test_a_parent_marked_sealing_gets_its_barrier_with_no_client_about(
    tmp_path_factory: pytest.TempPathFactory, zookeeper: object
) -> None:
    """A split waits for every parent's ``B(p)`` (docs/design/splits.md "The handover", step 3): an
    owner whose parent no client has mounted or appended to opens it when the parent is marked
    sealing, and appends the barrier."""
    with start_cluster(tmp_path_factory.mktemp("untouched"), zookeeper) as cluster:
        cluster.wait_ready(60)
        seal_partition_0(cluster)
        barrier = wait_for_barrier(cluster, 0)
        assert barrier is not None, "no owner wrote B(0): the parent waited for a client"
        records = run(records_above(cluster, 0, -1))
        assert [(r.transaction_id, r.req_id.client_id) for r in split_records(records)] == [(barrier, 0)]
        assert with_epochs(cluster, "read").epoch(1).parents[1].barrier is None
