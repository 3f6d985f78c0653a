"""The archive's requests on a real storage node: a partition created to start at a transaction,
reads below the local start, reset start, set archived-through, and retention deleting segments.

Design: docs/design/archive.md, "Retention on the storage nodes", "Reads below the local start";
docs/design/storage.md "Admin port". Storage node processes over real sockets; under mutual TLS
with the harness's role certificates for the role checks.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from support.storage import NUM_PARTITIONS, run

from waltz.errors import RecordsArchivedError, StorageRpcError
from waltz.local.certificates import make_cluster_certificates
from waltz.local.nodes import LocalStorageNode
from waltz.protocol import storage_pb2
from waltz.protocol.records import Record, ReqId
from waltz.protocol.storage_client import StorageAdminClient, StorageSessionClient


def records(first: int, count: int, size: int = 100) -> list[Record]:
    return [
        Record.create(t, ReqId(5, 1, 0, t), 0, bytes([t % 251]) * size) for t in range(first, first + count)
    ]


def admin(node: LocalStorageNode, key: str) -> StorageAdminClient:
    return StorageAdminClient(node.admin_address, key, NUM_PARTITIONS)


def session(node: LocalStorageNode, key: str, session_id: int) -> StorageSessionClient:
    return StorageSessionClient(node.address, key, NUM_PARTITIONS, session_id)


async def status_of(node: LocalStorageNode, key: str, partition_id: int = 0) -> storage_pb2.PartitionStatus:
    async with admin(node, key) as client:
        (status,) = (await client.partition_status(partition_id)).partitions
        return status


def audit_lines(node: LocalStorageNode, what: str) -> list[str]:
    log_path = node.process.log_path
    assert log_path is not None
    return [line for line in log_path.read_text().splitlines() if f"AUDIT {what}" in line]


def test_a_partition_created_to_start_at_a_transaction(
    start_storage: Callable[..., LocalStorageNode], cluster_key: str
) -> None:
    node = start_storage()

    async def scenario() -> None:
        async with admin(node, cluster_key) as client:
            await client.assign_partition(0, True, first_transaction_id=1000)
            await client.assign_partition(0, True, first_transaction_id=1000)  # the same again: fine
            for refused in (2000, -5):
                with pytest.raises(StorageRpcError) as info:
                    await client.assign_partition(0, True, first_transaction_id=refused)
                assert info.value.code == "INVALID_REQUEST"
            # A partition removed with its files kept still has segments: it cannot start elsewhere.
            await client.assign_partition(1, True)
            await client.assign_partition(1, False)
            with pytest.raises(StorageRpcError, match=r"INVALID_REQUEST.*segment files"):
                await client.assign_partition(1, True, first_transaction_id=10)
        status = await status_of(node, cluster_key)
        assert (status.local_start, status.max_transaction_id) == (1000, 999)
        assert (status.archived_through, status.retention_policy) == (-1, "never")
        async with session(node, cluster_key, 0) as s:
            await s.append(0, records(1000, 3))
            assert await s.records(0, 1000, 10) == records(1000, 3)

    run(scenario())
    node.kill()
    node.start()
    status = run(status_of(node, cluster_key))
    assert (status.local_start, status.max_transaction_id) == (1000, 1002)


def test_reads_below_the_local_start_fail_with_records_archived_on_both_ports(
    start_storage: Callable[..., LocalStorageNode], cluster_key: str
) -> None:
    node = start_storage()

    async def scenario() -> None:
        async with admin(node, cluster_key) as client:
            await client.assign_partition(0, True, first_transaction_id=100)
        async with session(node, cluster_key, 1) as s:
            await s.append(0, records(100, 5))
            reads = (
                s.record(0, 99),
                s.record_header(0, 0),
                s.records(0, 50, 10),
                s.record_headers(0, 99, 10),
            )
            for read in reads:
                with pytest.raises(RecordsArchivedError) as info:
                    await read
                assert (info.value.partition_id, info.value.local_start) == (0, 100)
                assert info.value.code == "RECORDS_ARCHIVED"
            assert (await s.record(0, 104)) == records(104, 1)[0]
            # A truncation below the local start would leave a gap: refused, nothing changes.
            with pytest.raises(StorageRpcError) as refused:
                await s.truncate(0, 50)
            assert refused.value.code == "INVALID_REQUEST" and "gap" in refused.value.remote_message
            assert await s.max_transaction_id(0) == 104
        async with admin(node, cluster_key) as client:
            with pytest.raises(RecordsArchivedError) as info:
                await client.records(0, 42, 10)
            assert (info.value.transaction_id, info.value.local_start) == (42, 100)
            assert await client.records(0, 100, 2) == records(100, 2)

    run(scenario())


def test_reset_start_is_fenced_like_a_write_and_durable(
    start_storage: Callable[..., LocalStorageNode], cluster_key: str
) -> None:
    node = start_storage()

    async def scenario() -> None:
        async with admin(node, cluster_key) as client:
            await client.assign_partition(0, True)
        async with session(node, cluster_key, 3) as s:
            await s.append(0, records(0, 10))
        async with session(node, cluster_key, 2) as stale:
            with pytest.raises(StorageRpcError, match="SESSION_FENCED"):
                await stale.reset_start(0, 50)
        # A store session may not erase what the archive is not known to hold: refused before
        # its fence moves, whoever asks (the server role may not truncate committed records either).
        async with session(node, cluster_key, 4) as s:
            with pytest.raises(
                StorageRpcError, match="knows the archive holds the partition through -1"
            ) as info:
                await s.reset_start(0, 50)
            assert info.value.code == "INVALID_REQUEST"
        status = await status_of(node, cluster_key)
        assert (status.session_id, status.local_start, status.max_transaction_id) == (3, 0, 9)
        async with admin(node, cluster_key) as client:  # as the archiver tells every replica
            await client.set_archived_through(0, 49, archive="file:///archive", operator="archiver")
        async with session(node, cluster_key, 4) as s:
            for too_low in (10, 5):
                with pytest.raises(StorageRpcError) as info:
                    await s.reset_start(0, too_low)
                assert info.value.code == "INVALID_REQUEST"
            with pytest.raises(StorageRpcError, match="through 49 only"):
                await s.reset_start(0, 51)
            await s.reset_start(0, 50)  # takes the partition: the fence is 4 now
            assert await s.max_transaction_id(0) == 49
        status = await status_of(node, cluster_key)
        assert (status.session_id, status.local_start, status.max_transaction_id) == (4, 50, 49)

    run(scenario())
    node.kill()  # no clean stop: the reset is on disk before it was answered
    node.start()

    async def after() -> None:
        status = await status_of(node, cluster_key)
        assert (status.local_start, status.max_transaction_id) == (50, 49)
        async with session(node, cluster_key, 4) as s:
            await s.append(0, records(50, 2))
            with pytest.raises(RecordsArchivedError, match="local start 50"):
                await s.records(0, 9, 1)

    run(after())
    assert sorted(p.name for p in (node.directory / "0").glob("*.seg")) == ["0000000000000000050.seg"]


def test_set_archived_through_is_kept_and_audited(
    start_storage: Callable[..., LocalStorageNode], cluster_key: str
) -> None:
    node = start_storage()

    async def scenario() -> None:
        async with admin(node, cluster_key) as client:
            await client.assign_partition(0, True)
            await client.set_archived_through(0, 41, archive="file:///archive", operator="archiver@ops")
            await client.set_archived_through(0, 30, operator="ops@example")  # lowered: taken
            with pytest.raises(StorageRpcError) as info:
                await client.set_archived_through(0, -2)
            assert info.value.code == "INVALID_REQUEST"
            with pytest.raises(StorageRpcError, match="PARTITION_NOT_ASSIGNED"):
                await client.set_archived_through(2, 10)
        assert (await status_of(node, cluster_key)).archived_through == 30

    run(scenario())
    node.kill()
    node.start()
    assert run(status_of(node, cluster_key)).archived_through == 30
    first, second = audit_lines(node, "set-archived-through")
    assert " WARNING " in first and "waltz.services.storage.audit" in first
    assert "partition 0 archived through -1 -> 41" in first and "'file:///archive'" in first
    assert "'archiver@ops'" in first and "127.0.0.1" in first
    assert "partition 0 archived through 41 -> 30" in second and "'ops@example'" in second


def test_retention_deletes_archived_segments_on_a_running_node(
    start_storage: Callable[..., LocalStorageNode], cluster_key: str
) -> None:
    node = start_storage(
        env={
            "WALTZ_STORAGE_SEGMENT_SIZE_THRESHOLD": "2000",
            "WALTZ_STORAGE_RETENTION_POLICY": "archived",
            "WALTZ_STORAGE_RETENTION_KEEP_SECONDS": "0",
            "WALTZ_STORAGE_RETENTION_KEEP_SEGMENTS": "1",
            "WALTZ_STORAGE_RETENTION_CHECK_INTERVAL": "0.1",
        }
    )

    async def scenario() -> None:
        async with admin(node, cluster_key) as client:
            await client.assign_partition(0, True)
        async with session(node, cluster_key, 0) as s:
            for first in range(0, 200, 10):
                await s.append(0, records(first, 10))
        segments = sorted((node.directory / "0").glob("*.seg"))
        assert len(segments) > 5
        second_start = int(segments[1].stem)
        async with admin(node, cluster_key) as client:
            assert (await status_of(node, cluster_key)).retention_policy == "archived"
            await client.set_archived_through(0, 150)

            async def local_start() -> int:
                return (await status_of(node, cluster_key)).local_start

            deadline = asyncio.get_running_loop().time() + 20
            while await local_start() == 0:
                assert asyncio.get_running_loop().time() < deadline, "retention deleted nothing in 20 s"
                await asyncio.sleep(0.05)
            start = await local_start()
            assert second_start <= start <= 151
            metrics = await client.metrics()
            deleted = metrics['waltz_storage_retention_deleted_segments_total{partition="0"}']
            assert deleted == len([p for p in segments if int(p.stem) < start])
            assert metrics['waltz_storage_retention_deleted_bytes_total{partition="0"}'] > 0
            assert metrics['waltz_storage_local_start{partition="0"}'] == start
            assert metrics['waltz_storage_archived_through{partition="0"}'] == 150
            with pytest.raises(RecordsArchivedError):
                await client.records(0, start - 1, 1)
            assert await client.records(0, start, 1) == records(start, 1)
        remaining = sorted((node.directory / "0").glob("*"))
        assert all(int(p.name.split(".")[0]) >= start for p in remaining if p.suffix in (".seg", ".idx"))

    run(scenario())
    log_path = node.process.log_path
    assert log_path is not None
    assert re.search(
        r"retention deleted segment 0000000000000000000\.seg \(transactions 0 to \d+", log_path.read_text()
    )


def test_set_archived_through_needs_the_admin_role(
    tmp_path: Path, start_storage: Callable[..., LocalStorageNode], cluster_key: str
) -> None:
    files = make_cluster_certificates(tmp_path / "certificates")
    node = start_storage(env=files.storage_env())

    def client(role: str) -> StorageAdminClient:
        return StorageAdminClient(node.admin_address, cluster_key, NUM_PARTITIONS, tls=files.tls(role))

    async def scenario() -> None:
        async with client("admin") as as_admin:
            await as_admin.assign_partition(0, True)
        async with client("operator") as operator:
            assert (await operator.partition_status(0)).partitions[0].archived_through == -1  # reads: fine
            with pytest.raises(ConnectionError, match=r"PERMISSION_DENIED.*set_archived_through"):
                await operator.set_archived_through(0, 99, operator="not an admin")
        async with client("admin") as as_admin:
            assert (await as_admin.partition_status(0)).partitions[0].archived_through == -1
            await as_admin.set_archived_through(0, 99, operator="an admin")
            assert (await as_admin.partition_status(0)).partitions[0].archived_through == 99

    run(scenario())
    (line,) = audit_lines(node, "set-archived-through")
    assert "'an admin'" in line and "certificate" in line and "CN=" in line
