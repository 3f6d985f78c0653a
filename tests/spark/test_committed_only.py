"""The reader returns committed records only: a replica left with a dirty record is never read.

Recipe: the record X at ID T reaches one replica (A) only, the server dies, a different
record Y is committed at T while A is down, then A comes back with X (no server runs, so nobody
repairs A). Two storage nodes are *paused* while X is appended rather than made unwritable: a
node that refuses the append at once lets the next recovery truncate A before the test can stop
the servers, while a paused node keeps the server waiting for its 15 s request timeout. The paused
nodes are then killed (not resumed): resumed, they would read the append still in their socket
buffers and write X as well.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
import support

from waltz.committed.plan import plan_offline
from waltz.committed.reads import read_committed
from waltz.errors import ConfigurationError
from waltz.local.cluster import LocalCluster
from waltz.protocol.records import Record, ReqId
from waltz.protocol.server_client import ServerAdminClient
from waltz.protocol.storage_client import StorageAdminClient
from waltz.spark.rebuild import LogSource

pytestmark = pytest.mark.timeout(600)

X = b"dirty: never committed"
Y = b"committed at the same ID"


async def _append(endpoint: str, data: bytes, seq: int, timeout: float) -> list[int | str]:
    async with ServerAdminClient(endpoint, timeout=timeout) as admin:
        return await admin.append(0, [(ReqId(77, 1, 0, seq), 9, data)])


async def _records(cluster: LocalCluster, index: int, first: int, count: int) -> list[Record]:
    node = cluster.storages[index]
    async with StorageAdminClient(node.admin_address, cluster.cluster_key, cluster.num_partitions) as admin:
        return await admin.records(0, first, count)


def _kill_servers(cluster: LocalCluster) -> None:
    for index in range(len(cluster.servers)):
        cluster.kill_server(index)


@pytest.fixture(scope="module")
def dirty_cluster(
    tmp_path_factory: pytest.TempPathFactory, zookeeper: object
) -> Iterator[tuple[LocalCluster, int]]:
    """A one-partition cluster whose storage node 0 holds a dirty record at the returned ID."""
    with support.session_cluster(  # raw admin appends and reads make the dirty record
        tmp_path_factory, zookeeper, name="dirty", partitions=1, security=support.PLAINTEXT
    ) as cluster:
        cluster.wait_ready(60)
        for seq in range(3):
            assert asyncio.run(_append(cluster.owner(0), b"base %d" % seq, seq, 30)) == [seq]
        dirty_id = 3
        cluster.pause_storage(1)
        cluster.pause_storage(2)
        owner = cluster.owner(0)

        async def append_then_give_up() -> None:
            task = asyncio.create_task(_append(owner, X, 10, 30))
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                held = await _records(cluster, 0, dirty_id, 1)
                if held and held[0].data == X:
                    break
                await asyncio.sleep(0.02)
            task.cancel()

        asyncio.run(append_then_give_up())
        _kill_servers(cluster)
        cluster.kill_storage(0)
        # The append still waits in the paused nodes' socket buffers: resumed, they could write it
        # too. Killed while paused they never read it; they restart with records 0..2 only.
        for index in (1, 2):
            cluster.kill_storage(index)
            cluster.restart_storage(index)
        for index in range(len(cluster.servers)):
            cluster.restart_server(index)
        cluster.wait_ready(90)
        assert asyncio.run(_append(cluster.owner(0), Y, 11, 30)) == [dirty_id]
        _kill_servers(cluster)
        cluster.restart_storage(0)
        held = asyncio.run(_records(cluster, 0, dirty_id, 1))
        assert held and held[0].data == X, "the recipe did not leave the dirty record on storage node 0"
        try:
            yield cluster, dirty_id
        finally:
            cluster.heal(timeout=90)


def test_live_reader_skips_the_replica_that_missed_the_recovery(
    spark: Any, dirty_cluster: tuple[LocalCluster, int]
) -> None:
    cluster, dirty_id = dirty_cluster
    source = LogSource.live(cluster.admin_settings())
    (plan,) = source.plan()
    assert plan.high_water_mark == dirty_id
    readers = {r.storage for r in plan.source.replicas}  # type: ignore[union-attr]
    assert cluster.storages[0].address not in readers and len(readers) == 2
    records = list(read_committed(0, 0, dirty_id, plan.source))
    assert [r.data for r in records[dirty_id:]] == [Y]
    rows = (
        spark.read.format("waltz")
        .options(**LogSource.live(cluster.admin_settings()).options())
        .option("range_size", "2")
        .load()
        .where("transaction_id >= 2")
        .orderBy("transaction_id")
        .collect()
    )
    assert [(r.transaction_id, bytes(r.data)) for r in rows] == [(2, b"base 2"), (dirty_id, Y)]


def test_offline_reader_needs_a_majority_above_the_low_water_mark(
    spark: Any, dirty_cluster: tuple[LocalCluster, int]
) -> None:
    cluster, dirty_id = dirty_cluster
    directories = [str(s.directory) for s in cluster.storages]
    (plan,) = plan_offline(directories, replicas=3)
    assert plan.high_water_mark == dirty_id
    assert [r.data for r in read_committed(0, dirty_id, dirty_id, plan.source)] == [Y]
    # The dirty replica's directory alone proves only its low-water mark, below the dirty record.
    (alone,) = plan_offline(directories[:1], replicas=3)
    assert alone.high_water_mark < dirty_id
    # The quorum is a majority of the cluster's replicas, which the directories cannot tell.
    with pytest.raises(ConfigurationError, match="how many replicas"):
        plan_offline(directories)
    with pytest.raises(ConfigurationError, match="3 directories hold it, but replicas is 2"):
        plan_offline(directories, replicas=2)
    rows = (
        spark.read.format("waltz")
        .option("storage_dirs", ",".join(directories))
        .option("replicas", "3")
        .load()
        .collect()
    )
    assert {r.transaction_id: bytes(r.data) for r in rows}[dirty_id] == Y
    assert len(rows) == dirty_id + 1
