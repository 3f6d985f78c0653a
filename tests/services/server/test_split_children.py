"""The new children of a split become partitions: placed on servers, opened at their parents'
barriers, started by their owners' genesis at ``B(p) + 1``, with a lock table that only a client
that applied the genesis passes (docs/design/splits.md "The handover", step 4, "Why no update is
lost"; docs/design/server.md "Cluster manager"; docs/design/storage.md "Partition count").

Real ZooKeeper, a storage node and two servers over loopback. Both partitions of a 2-partition
cluster get records; the test writes ``partitions/epochs`` as a split's steps do (prepare 2 -> 4,
mark both parents sealing), the owners append their barriers and write ``B(p)``, and
``open_child`` opens children 2 and 3. The cluster manager then places the children on the
servers while partitions 0 and 1 keep their owner and generation; each child's owner opens its
store partition (store sessions opened with the count at creation, on a storage node grown to 4),
whose recovered high-water mark is its parent's ``B(p)``, appends the genesis there and writes its
ID into the znode. Then an append to a child routed by epoch 0 is refused
(``STALE_PARTITION_EPOCH``), one with a WRITE lock checked against the parent's barrier (a client
that has not applied the genesis) fails its lock check, and one checked against the genesis
commits; the parents' records are as they were written. The
cluster manager's read of the partitions that exist keeps its last good value when the znode does
not decode.
"""

from __future__ import annotations

from pathlib import Path

import support
from kazoo.client import KazooClient
from support.feed import FeedEntry
from support.storage import run

from tests.services.server.test_epoch_refusals import PartitionClient
from tests.services.server.test_split_barrier import records_above, wait_for_barrier, with_epochs
from waltz.admin.split_open import open_child
from waltz.local.cluster import LocalCluster
from waltz.local.processes import wait_until
from waltz.metadata.assignment import PartitionAssignment, read_assignment
from waltz.metadata.epochs import PartitionEpochs
from waltz.metadata.paths import ClusterPaths
from waltz.metadata.zk import ClusterZk
from waltz.protocol import client_pb2
from waltz.protocol.server_client import ServerAdminClient
from waltz.protocol.split_records import SPLIT_RECORD_HEADER, SplitGenesis, decode_split_record
from waltz.services.server.cluster_manager import ClusterManager

ROWS = 4


def write(cluster: LocalCluster, partition_id: int, generation: int, client_id: int) -> dict[int, bytes]:
    """Append :data:`ROWS` records to ``partition_id`` routed by epoch 0; transaction ID -> data."""

    async def scenario() -> dict[int, bytes]:
        peer = PartitionClient(cluster.owner(partition_id), client_id, generation, partition_id)
        try:
            await peer.mount_at_high_water_mark()
            data = [b"partition %d record %d" % (partition_id, i) for i in range(ROWS)]
            written = {}
            for seq_num, row in zip(peer.appends_by(0, data), data, strict=True):
                entry = await peer.outcome(seq_num)
                assert isinstance(entry, FeedEntry), entry
                written[entry.transaction_id] = row
            return written
        finally:
            await peer.close()

    return run(scenario())


async def partition_states(endpoint: str) -> dict[int, tuple[int, int]]:
    """Partition ID -> (generation, high-water mark) of every partition the server holds."""
    async with ServerAdminClient(endpoint, timeout=10) as admin:
        status = await admin.status()
    return {p.partition_id: (p.generation, p.high_water_mark) for p in status.partitions}


async def append_to_child(
    endpoint: str, generation: int, child: int, mark: int, epoch: int
) -> FeedEntry | client_pb2.ServerError | client_pb2.LockFailure:
    """The outcome of an append routed by ``epoch`` to ``child`` with a WRITE lock, checked against
    the client high-water mark ``mark`` (the child mounted from its parent's barrier)."""
    peer = PartitionClient(endpoint, 900 + child * 10 + epoch, generation, child)
    try:
        peer.mount(mark)
        assert (await peer.next("mount")).mount.partition_ready
        peer.mark = mark
        sent = peer.append_by(epoch, b"a moved key at %d" % mark, write=[5])
        return await peer.outcome(sent.seq_num)
    finally:
        await peer.close()


def test_opened_children_are_placed_start_with_their_genesis_and_take_only_appends_that_saw_it(
    tmp_path: Path, zookeeper: object
) -> None:
    with LocalCluster(
        security=support.PLAINTEXT,
        storages=1,
        servers=2,
        partitions=2,
        zookeeper=zookeeper.connect_string,  # type: ignore[attr-defined]
        work_dir=tmp_path / "cluster",
        delete_root=True,
    ) as cluster:
        owners = cluster.wait_ready(60)
        written = {p: write(cluster, p, owners[p].generation, 100 + p) for p in (0, 1)}
        zk = KazooClient(hosts=cluster.zookeeper_connect_string)
        zk.start(30)
        try:
            cluster_zk = ClusterZk(zk, cluster.root, timeout=30)
            before, _ = read_assignment(zk, cluster_zk.paths)
            with_epochs(cluster, "prepare", 4, {p: max(written[p]) for p in (0, 1)})
            for parent in (0, 1):
                with_epochs(cluster, "mark_sealing", 1, parent)
            # The owners open a sealing parent themselves, append its barrier and write B(p).
            barriers = {parent: wait_for_barrier(cluster, parent) for parent in (0, 1)}
            assert all(b is not None and b > max(written[p]) for p, b in barriers.items()), barriers
            for child in (2, 3):
                assert open_child(cluster_zk, 1, child).opened

            def children_open() -> PartitionAssignment | None:
                """The assignment once both children's owners report them at their genesis,
                B(p) + 1, and the znode names both geneses."""
                assignment, _ = read_assignment(zk, cluster_zk.paths)
                for child in (2, 3):
                    placed = assignment.placements.get(child)
                    if placed is None or placed.endpoint is None:
                        return None
                    state = run(partition_states(placed.endpoint)).get(child)
                    if state != (placed.generation, barriers[child - 2] + 1):
                        return None
                epoch = PartitionEpochs.decode(zk.get(cluster_zk.paths.epochs)[0], "epochs").epoch(1)
                if any(epoch.children[child].genesis != barriers[child - 2] + 1 for child in (2, 3)):
                    return None
                return assignment

            after = wait_until(
                children_open,
                timeout=60,
                what="both children placed, started with their genesis at B(p) + 1, named in the znode",
                interval=0.2,
            )
        finally:
            zk.stop()
            zk.close()
        # The parents did not move: same owner, same generation (no downtime for them).
        for parent in (0, 1):
            assert after.placements[parent] == before.placements[parent]
        for child in (2, 3):
            placed = after.placements[child]
            assert placed.endpoint is not None
            barrier = barriers[child - 2]
            assert barrier is not None
            (genesis,) = run(records_above(cluster, child, barrier))
            assert genesis.transaction_id == barrier + 1 and genesis.header == SPLIT_RECORD_HEADER
            assert decode_split_record(genesis.data) == SplitGenesis(1, 4, 2, child - 2, barrier)
            stale = run(append_to_child(placed.endpoint, placed.generation, child, barrier + 1, epoch=0))
            assert isinstance(stale, client_pb2.ServerError), stale
            assert (stale.code, stale.epoch, stale.partition_count) == (
                client_pb2.STALE_PARTITION_EPOCH,
                1,
                4,
            )
            # Checked against the parent's barrier: its client has not applied the genesis.
            before_genesis = run(append_to_child(placed.endpoint, placed.generation, child, barrier, epoch=1))
            assert isinstance(before_genesis, client_pb2.LockFailure), before_genesis
            after_genesis = run(
                append_to_child(placed.endpoint, placed.generation, child, barrier + 1, epoch=1)
            )
            assert isinstance(after_genesis, FeedEntry), after_genesis
            assert after_genesis.transaction_id == barrier + 2
        # The parents' logs: the records written, then the barrier, nothing lost.
        for parent in (0, 1):
            records = run(records_above(cluster, parent, -1))
            assert {r.transaction_id: r.data for r in records if r.transaction_id in written[parent]} == (
                written[parent]
            )
            (barrier_record,) = [r for r in records if r.header == SPLIT_RECORD_HEADER]
            assert barrier_record.transaction_id == barriers[parent] == records[-1].transaction_id


def test_the_cluster_manager_places_the_opened_children_and_keeps_its_last_good_read(
    zk_client: KazooClient, zk_root: str
) -> None:
    paths = ClusterPaths.of(zk_root)
    manager = ClusterManager(zk_client, paths, 2, "test")
    value = PartitionEpochs(2).prepare(4, {0: 5, 1: -1}).mark_sealing(1, 0).set_barrier(1, 0, 9)
    zk_client.create(paths.epochs, value.encode(), makepath=True)
    assert manager.partition_ids() == (0, 1)  # prepared and sealed: no child opened yet
    zk_client.set(paths.epochs, value.mark_opened(1, 2).encode())
    assert manager.partition_ids() == (0, 1, 2)
    # A znode that does not decode must not stop failover: the last good read stands.
    zk_client.set(paths.epochs, b"not json")
    assert manager.partition_ids() == (0, 1, 2)
