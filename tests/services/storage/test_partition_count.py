"""A storage node's partition count grows, and its opens take the count the cluster was created with
(docs/design/storage.md, "Partition count", "Control file").

Storage node processes over real sockets and their real control files: a node made for 4
partitions grows to 8 by an admin request. Every partition it held keeps its records, its last
session info and its fence; the new partitions can be created (one to start later, as a split's
child starts after its parent's barrier) and written by a store session opened with the old
count; a shrink, a count that is not a whole multiple and an open whose count does not divide the
node's are refused; the growth survives a crash, and a crash in the middle of one leaves the old
count. Under mutual TLS growing needs the ``admin`` role.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
from support.storage import NUM_PARTITIONS, run

from tests.services.storage.test_storage_process import records
from waltz.errors import StorageRpcError
from waltz.local.certificates import make_cluster_certificates
from waltz.local.nodes import LocalStorageNode
from waltz.protocol import storage_pb2
from waltz.protocol.storage_client import StorageAdminClient, StorageSessionClient
from waltz.services.storage.control_file import ControlFile

GROWN = 2 * NUM_PARTITIONS
#: A new partition of the grown node, created to start at :data:`CHILD_START`.
CHILD = NUM_PARTITIONS + 2
CHILD_START = 100


def admin(node: LocalStorageNode, key: str, count: int = NUM_PARTITIONS) -> StorageAdminClient:
    return StorageAdminClient(node.admin_address, key, count)


def session(
    node: LocalStorageNode, key: str, session_id: int, count: int = NUM_PARTITIONS
) -> StorageSessionClient:
    return StorageSessionClient(node.address, key, count, session_id)


async def statuses(node: LocalStorageNode, key: str) -> tuple[int, dict[int, storage_pb2.PartitionStatus]]:
    """The node's partition count and the status of each assigned partition."""
    async with admin(node, key) as client:
        status = await client.partition_status(-1)
    return status.num_partitions, {p.partition_id: p for p in status.partitions}


def write_before_growth(node: LocalStorageNode, key: str) -> None:
    """Partition 0: 50 records by session 5, low-water mark 30; partition 1: fenced by session 3."""

    async def scenario() -> None:
        async with session(node, key, 5) as s:
            await s.append(0, records(0, 50))
            await s.set_low_water_mark(0, 30)
        async with session(node, key, 3) as s:
            await s.open_session(1)

    run(scenario())


def check_kept(node: LocalStorageNode, key: str) -> None:
    """What :func:`write_before_growth` wrote is there, fences included."""
    count, by_id = run(statuses(node, key))
    assert count == GROWN
    assert (by_id[0].max_transaction_id, by_id[0].low_water_mark, by_id[0].last_session_id) == (49, 30, 5)
    assert (by_id[0].session_id, by_id[1].session_id) == (5, 3)

    async def scenario() -> None:
        async with session(node, key, 5) as s:
            assert await s.records(0, 0, 100) == records(0, 50)
        async with session(node, key, 2) as older:
            with pytest.raises(StorageRpcError) as fenced:
                await older.open_session(1)
            assert fenced.value.code == "SESSION_FENCED"

    run(scenario())


def test_growth_keeps_every_partition_and_a_session_opened_with_the_old_count_writes_a_new_one(
    storage_node: LocalStorageNode, cluster_key: str
) -> None:
    write_before_growth(storage_node, cluster_key)

    async def grow() -> None:
        async with admin(storage_node, cluster_key) as client:
            assert await client.grow_partitions(GROWN, operator="splitter") == (NUM_PARTITIONS, GROWN)
            # The same count again: nothing changes (a resumed split asks again).
            assert await client.grow_partitions(GROWN) == (GROWN, GROWN)
            # A new partition, created to start later, as a split's child after its parent's barrier.
            await client.assign_partition(CHILD, True, first_transaction_id=CHILD_START)
            await client.assign_partition(CHILD, True, first_transaction_id=CHILD_START)  # repeated

    run(grow())
    check_kept(storage_node, cluster_key)

    async def write_the_new_partition() -> None:
        # A store session opened with the count at creation reaches every partition of the node.
        async with session(storage_node, cluster_key, 1) as s:
            await s.open_session(CHILD)
            assert await s.max_transaction_id(CHILD) == CHILD_START - 1
            await s.truncate(CHILD, CHILD_START - 1)  # a recovery's truncation to B(p): no gap
            await s.append(CHILD, records(CHILD_START, 5, partition_id=CHILD))
            assert await s.records(CHILD, CHILD_START, 10) == records(CHILD_START, 5, partition_id=CHILD)
        # Opens with a count that divides the node's are taken; others are refused.
        for count in (1, 2, NUM_PARTITIONS, GROWN):
            async with session(storage_node, cluster_key, 1, count) as s:
                assert await s.max_transaction_id(CHILD) == CHILD_START + 4
            async with admin(storage_node, cluster_key, count) as client:
                assert await client.max_transaction_id(0) == 49
        for count in (3, 5, 2 * GROWN):
            with pytest.raises(StorageRpcError, match="CLUSTER_KEY_MISMATCH") as refused:
                await session(storage_node, cluster_key, 1, count).open()
            assert f"number of partitions {count} does not match" in refused.value.remote_message
            with pytest.raises(StorageRpcError, match="CLUSTER_KEY_MISMATCH"):
                await admin(storage_node, cluster_key, count).open()

    run(write_the_new_partition())
    log_path = storage_node.process.log_path
    assert log_path is not None
    (audit,) = [line for line in log_path.read_text().splitlines() if "AUDIT grow-partitions" in line]
    assert f"partition count {NUM_PARTITIONS} -> {GROWN}" in audit and "'splitter'" in audit


def test_a_shrink_and_a_growth_to_a_count_that_is_not_a_multiple_are_refused(
    storage_node: LocalStorageNode, cluster_key: str
) -> None:
    async def scenario() -> None:
        async with admin(storage_node, cluster_key) as client:
            with pytest.raises(StorageRpcError, match="INVALID_REQUEST") as refused:
                await client.grow_partitions(NUM_PARTITIONS // 2)
            assert "cannot shrink" in refused.value.remote_message
            for count in (NUM_PARTITIONS + 2, 3 * NUM_PARTITIONS + 1):
                with pytest.raises(StorageRpcError, match="INVALID_REQUEST") as refused:
                    await client.grow_partitions(count)
                assert (
                    f"whole multiple of that, at most 65536, not to {count}" in refused.value.remote_message
                )
            with pytest.raises(StorageRpcError, match="out of range"):
                await client.assign_partition(NUM_PARTITIONS, True)

    run(scenario())
    count, by_id = run(statuses(storage_node, cluster_key))
    assert count == NUM_PARTITIONS and sorted(by_id) == [0, 1]


def test_a_grown_node_restarts_with_its_count_its_partitions_and_their_fences(
    storage_node: LocalStorageNode, cluster_key: str
) -> None:
    write_before_growth(storage_node, cluster_key)

    async def grow_and_write() -> None:
        async with admin(storage_node, cluster_key) as client:
            await client.grow_partitions(GROWN)
            await client.assign_partition(CHILD, True, first_transaction_id=CHILD_START)
        async with session(storage_node, cluster_key, 7) as s:
            await s.append(CHILD, records(CHILD_START, 3, partition_id=CHILD))
            await s.set_low_water_mark(CHILD, CHILD_START + 2)

    run(grow_and_write())
    storage_node.kill()  # a crash: nothing is flushed on the way out
    storage_node.start()
    check_kept(storage_node, cluster_key)
    _, by_id = run(statuses(storage_node, cluster_key))
    child = by_id[CHILD]
    assert (child.local_start, child.max_transaction_id) == (CHILD_START, CHILD_START + 2)
    assert (child.session_id, child.low_water_mark) == (7, CHILD_START + 2)

    async def fenced() -> None:
        async with session(storage_node, cluster_key, 6) as older:
            with pytest.raises(StorageRpcError, match="SESSION_FENCED"):
                await older.append(CHILD, records(CHILD_START + 3, 1, partition_id=CHILD))

    run(fenced())


def test_a_growth_cut_short_before_its_rename_leaves_the_old_count_and_can_be_asked_again(
    storage_node: LocalStorageNode, cluster_key: str
) -> None:
    write_before_growth(storage_node, cluster_key)
    assert storage_node.stop() == 0
    # What a crash between the temp file's write and its rename leaves (ControlFile.grow): the
    # old control file in force and a torn temp file beside it.
    control = ControlFile.path_in(storage_node.directory)
    torn = control.with_suffix(".ctl.tmp")
    torn.write_bytes(control.read_bytes()[:200])
    storage_node.start()
    count, by_id = run(statuses(storage_node, cluster_key))
    assert count == NUM_PARTITIONS and by_id[0].max_transaction_id == 49

    async def grow() -> None:
        async with admin(storage_node, cluster_key) as client:
            assert await client.grow_partitions(GROWN) == (NUM_PARTITIONS, GROWN)

    run(grow())
    assert not torn.exists()
    check_kept(storage_node, cluster_key)


def test_growing_needs_the_admin_role(
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
            with pytest.raises(ConnectionError, match=r"PERMISSION_DENIED.*grow_partitions"):
                await operator.grow_partitions(GROWN, operator="not an admin")
        async with client("admin") as as_admin:
            assert (await as_admin.partition_status(0)).num_partitions == NUM_PARTITIONS
            assert await as_admin.grow_partitions(GROWN, operator="an admin") == (NUM_PARTITIONS, GROWN)

    run(scenario())
    log_path = node.process.log_path
    assert log_path is not None
    (line,) = [line for line in log_path.read_text().splitlines() if "AUDIT grow-partitions" in line]
    assert "'an admin'" in line and re.search(r"certificate .*CN=", line)
