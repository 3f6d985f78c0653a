"""Replicas across an archived gap: a copy resets its target to start after it, the store's reads
let the records-archived error reach their caller, and a local cluster's returning replica is
caught up across the gap while its server keeps committing.

Design: docs/design/archive.md, "Reads below the local start", "Retention on the storage nodes".
Real storage node processes; the end-to-end test runs a local cluster (ZooKeeper, a server, three
storage nodes, a client) and deletes segments through the archiver's admin request.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest
import support
from kazoo.client import KazooClient
from support.storage import run

from tests.client.client_helpers import Append, MemoryStore
from tests.services.server.conftest import StoreCluster, make_store_cluster
from tests.services.server.store.test_store import FAST, append_many, store
from waltz import WaltzClient, WaltzClientConfig
from waltz.errors import RecordsArchivedError
from waltz.local.cluster import LocalCluster
from waltz.local.options import ProcessOptions
from waltz.protocol import storage_pb2
from waltz.protocol.records import Record, ReqId
from waltz.protocol.storage_client import StorageAdminClient, StorageSessionClient
from waltz.services.server.store.replica import ReplicaConnection

#: Storage settings that roll a segment every few kilobytes and delete archived segments at once.
RETENTION_ENV = {
    "WALTZ_STORAGE_SEGMENT_SIZE_THRESHOLD": "4096",
    "WALTZ_STORAGE_RETENTION_POLICY": "archived",
    "WALTZ_STORAGE_RETENTION_KEEP_SECONDS": "0",
    "WALTZ_STORAGE_RETENTION_CHECK_INTERVAL": "0.2",
}
PARTITIONS = 1


def records(first: int, count: int) -> list[Record]:
    return [Record.create(t, ReqId(4, 1, 0, t), 0, b"r" * 64) for t in range(first, first + count)]


async def status(admin_address: str, key: str, partitions: int) -> storage_pb2.PartitionStatus:
    async with StorageAdminClient(admin_address, key, partitions) as admin:
        (found,) = (await admin.partition_status(0)).partitions
        return found


async def archive_through(admin_address: str, key: str, partitions: int, transaction_id: int) -> None:
    """What the archiver does once a range is archived and verified: tell the replica."""
    async with StorageAdminClient(admin_address, key, partitions) as admin:
        await admin.set_archived_through(0, transaction_id, archive="file:///test-archive", operator="test")


async def wait_for(what: str, timeout: float, check: Callable[[], Awaitable[bool]]) -> None:
    """Poll ``check`` (true when done) every 50 ms; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.05)


def test_a_copy_across_a_gap_starts_the_target_at_the_sources_local_start(
    store_cluster: StoreCluster,
) -> None:
    """The source holds 100..149 only (its log was reset to start at 100); the target holds 0..9.
    Copying 10..149 resets the target to start at 100, then copies: both hold 100..149."""
    source, target = store_cluster.storages[:2]
    key = store_cluster.cluster_key
    partitions = store_cluster.params.num_partitions

    async def scenario() -> None:
        for node in (source, target):  # as the archiver tells every replica: 0..99 are archived
            async with StorageAdminClient(node.admin_address, key, partitions) as client:
                await client.set_archived_through(0, 99, archive="file:///archive", operator="test")
        async with StorageSessionClient(source.address, key, partitions, 1) as s:
            await s.reset_start(0, 100)
            await s.append(0, records(100, 50))
        async with StorageSessionClient(target.address, key, partitions, 1) as s:
            await s.append(0, records(0, 10))
        copied_from = ReplicaConnection(source.address, 0, 2, key, partitions, FAST)
        copied_to = ReplicaConnection(target.address, 0, 2, key, partitions, FAST)
        await copied_from.open()
        await copied_to.open()
        try:
            assert await copied_to.copy_from(copied_from, 10, 149, 20) == 149
            with pytest.raises(RecordsArchivedError) as gap:
                await copied_to.records(9, 10)
            assert gap.value.local_start == 100
            assert await copied_to.records(100, 100) == records(100, 50)
        finally:
            await copied_from.close()
            await copied_to.close()

    run(scenario())
    assert run(status(target.admin_address, key, partitions)).local_start == 100


@pytest.fixture
def retention_cluster(
    request: pytest.FixtureRequest, tmp_path: Path, zk_client: KazooClient, zk_root: str
) -> Iterator[StoreCluster]:
    """Three storage nodes that roll small segments and delete archived ones at once."""
    yield from make_store_cluster(
        request, tmp_path, zk_client, zk_root, partitions=1, storage_env=RETENTION_ENV
    )


def test_the_stores_read_lets_records_archived_reach_the_caller(retention_cluster: StoreCluster) -> None:
    cluster = retention_cluster

    async def scenario() -> None:
        partition = store(cluster)
        partition.start()
        try:
            for first in range(0, 400, 20):  # a batch at a time: segments roll every few batches
                assert await append_many(partition, first, 20) == list(range(first, first + 20))
            for node in cluster.storages:
                await archive_through(node.admin_address, cluster.cluster_key, 1, 299)

            async def deleted() -> bool:
                found = [await status(n.admin_address, cluster.cluster_key, 1) for n in cluster.storages]
                return all(s.local_start > 0 for s in found)

            await wait_for("retention on every replica", 30, deleted)
            started = time.monotonic()
            with pytest.raises(RecordsArchivedError) as gap:
                await partition.read_records(0, 10)
            assert time.monotonic() - started < FAST.request_timeout  # answered, not retried
            start = gap.value.local_start
            assert 0 < start <= 300
            assert [r.transaction_id for r in await partition.read_records(start, 5)] == list(
                range(start, start + 5)
            )
            assert await append_many(partition, 400, 10) == list(range(400, 410))
        finally:
            await partition.close()

    run(scenario())


# ---- end to end: a local cluster ----


@pytest.fixture
def local_cluster(
    request: pytest.FixtureRequest, zookeeper: object, tmp_path: Path
) -> Iterator[LocalCluster]:
    with LocalCluster(
        security=support.PLAINTEXT,
        storages=3,
        servers=1,
        partitions=PARTITIONS,
        zookeeper=zookeeper.connect_string,  # type: ignore[attr-defined]
        work_dir=tmp_path / "cluster",
        delete_root=True,
        processes=ProcessOptions(storage_env=RETENTION_ENV),
    ) as cluster:
        yield cluster


def commit(client: WaltzClient, count: int, tag: str) -> list[int]:
    futures = [client.submit(Append(0, f"{tag} {i} ".encode() * 8)) for i in range(count)]
    ids = [future.result(60).transaction_id for future in futures]
    assert all(isinstance(i, int) for i in ids), ids
    return [i for i in ids if i is not None]


async def read_range(admin_address: str, key: str, first: int, last: int) -> list[Record]:
    async with StorageAdminClient(admin_address, key, PARTITIONS) as admin:
        out: list[Record] = []
        while first + len(out) <= last:
            page = await admin.records(0, first + len(out), min(500, last - first - len(out) + 1))
            assert page, f"{admin_address} has no record {first + len(out)}"
            out.extend(page)
        return out


def test_a_returning_replica_is_reset_across_the_archived_gap_and_caught_up(
    local_cluster: LocalCluster,
) -> None:
    """Three storage nodes, one stopped; commits roll many segments; the two live nodes delete the
    archived ones; the third, restarted, is reset to start at the local start of the replica it
    copies from and caught up, while the server goes on committing."""
    cluster = local_cluster
    key = cluster.cluster_key
    nodes = cluster.storages
    config = WaltzClientConfig(**cluster.zookeeper_settings())  # type: ignore[arg-type]
    with WaltzClient(MemoryStore({0: -1}), config) as client:
        early = commit(client, 10, "early")
        cluster.stop_storage(2)
        later = [i for round_ in range(20) for i in commit(client, 20, f"later {round_}")]
        high_water_mark = max(later)
        assert high_water_mark > max(early)
        archived = high_water_mark - 30  # the archiver is somewhat behind the log

        async def archive_and_wait() -> None:
            for node in nodes[:2]:
                await archive_through(node.admin_address, key, PARTITIONS, archived)

            async def deleted() -> bool:
                found = [await status(n.admin_address, key, PARTITIONS) for n in nodes[:2]]
                return all(s.local_start > max(early) + 1 for s in found)

            await wait_for("retention on the two live replicas", 30, deleted)

        run(archive_and_wait())
        cluster.restart_storage(2)
        # Down at the archiver's round, the returning node was not told what the archive holds:
        # it refuses to erase its log until it is, and the catch-up tries again.
        server_log = cluster.servers[0].process.log_path
        assert server_log is not None

        async def refused() -> bool:
            return "knows the archive holds the partition through -1 only" in server_log.read_text()

        run(wait_for("the returning replica to refuse a reset it cannot vouch for", 60, refused))
        assert run(status(nodes[2].admin_address, key, PARTITIONS)).local_start == 0
        run(archive_through(nodes[2].admin_address, key, PARTITIONS, archived))  # the archiver's next round

        async def caught_up() -> bool:
            try:
                found = await status(nodes[2].admin_address, key, PARTITIONS)
            except (ConnectionError, OSError):
                return False  # still starting
            return found.local_start > 0 and found.max_transaction_id >= high_water_mark

        run(wait_for("the returning replica caught up across the gap", 90, caught_up))
        after = commit(client, 30, "after")  # the server still commits, on all three
        assert min(after) > high_water_mark

    async def check_replicas() -> None:
        statuses = [await status(n.admin_address, key, PARTITIONS) for n in nodes]
        last = min(s.max_transaction_id for s in statuses)
        assert last >= max(after)
        by_id: dict[int, Record] = {}
        for node, found in zip(nodes, statuses, strict=True):
            assert found.local_start <= archived + 1, f"{node.address} deleted unarchived records"
            held = await read_range(node.admin_address, key, found.local_start, last)
            assert [r.transaction_id for r in held] == list(range(found.local_start, last + 1))
            for record in held:  # the same records wherever two replicas both hold one
                assert by_id.setdefault(record.transaction_id, record) == record, node.address
            with pytest.raises(RecordsArchivedError) as gap:
                async with StorageAdminClient(node.admin_address, key, PARTITIONS) as admin:
                    await admin.records(0, found.local_start - 1, 1)
            assert gap.value.local_start == found.local_start
        # The returning replica was reset: it holds nothing of its old log, not even the early records.
        assert statuses[2].local_start > max(early)

    run(check_replicas())
    log_path = nodes[2].process.log_path
    assert log_path is not None and "log reset to start at transaction" in log_path.read_text()
    assert f"the replica on {nodes[2].address}, at transaction" in server_log.read_text()
