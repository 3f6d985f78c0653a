"""Fencing by store session ID on a real storage node: only writers raise a fence, within a bound,
and an operator can set a poisoned fence back (docs/design/storage.md "Fencing by store session
ID", "Admin port")."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from support.storage import NUM_PARTITIONS, run

from waltz.errors import StorageRpcError
from waltz.local.nodes import LocalStorageNode
from waltz.protocol.records import Record, ReqId
from waltz.protocol.storage_client import StorageAdminClient, StorageSessionClient
from waltz.services.storage.storage_partition import DEFAULT_MAX_FENCE_JUMP

MAX_SESSION = 2**63 - 1


def records(first: int, count: int, partition_id: int = 0) -> list[Record]:
    return [
        Record.create(t, ReqId(1, 1, partition_id, t), 0, f"record {t}".encode())
        for t in range(first, first + count)
    ]


def session(node: LocalStorageNode, key: str, session_id: int) -> StorageSessionClient:
    return StorageSessionClient(node.address, key, NUM_PARTITIONS, session_id)


async def fence_of(node: LocalStorageNode, key: str, partition_id: int = 0) -> tuple[int, int]:
    """The partition's fence and the session ID of its last session info, read on the admin port."""
    async with StorageAdminClient(node.admin_address, key, NUM_PARTITIONS) as admin:
        (status,) = (await admin.partition_status(partition_id)).partitions
        return status.session_id, status.last_session_id


async def write(node: LocalStorageNode, key: str, session_id: int, count: int = 5) -> None:
    """Session ``session_id`` takes partition 0 and writes ``count`` records after its max."""
    async with session(node, key, session_id) as s:
        await s.open_session(0)
        first = await s.max_transaction_id(0) + 1
        await s.append(0, records(first, count))


def test_a_read_with_the_largest_session_id_leaves_the_fence(
    storage_node: LocalStorageNode, cluster_key: str
) -> None:
    """Reads and metadata queries from a session above the fence are refused and leave no trace;
    the next real session still opens."""

    async def scenario() -> None:
        await write(storage_node, cluster_key, 3)
        async with session(storage_node, cluster_key, MAX_SESSION) as hostile:
            reads = (
                hostile.last_session_info(0),
                hostile.max_transaction_id(0),
                hostile.record(0, 0),
                hostile.record_header(0, 0),
                hostile.records(0, 0, 10),
                hostile.record_headers(0, 0, 10),
            )
            for read in reads:
                with pytest.raises(StorageRpcError) as info:
                    await read
                assert info.value.code == "SESSION_NOT_OPEN", info.value
                assert "the fence is 3" in info.value.remote_message
        assert await fence_of(storage_node, cluster_key) == (3, -1)
        await write(storage_node, cluster_key, 4)
        assert await fence_of(storage_node, cluster_key) == (4, -1)

    run(scenario())
    storage_node.kill()
    storage_node.start()
    assert run(fence_of(storage_node, cluster_key)) == (4, -1)


def test_writes_raise_the_fence_within_the_bound_and_stale_sessions_stay_refused(
    start_storage: Callable[..., LocalStorageNode], cluster_key: str
) -> None:
    node = start_storage(env={"WALTZ_STORAGE_FENCE_MAX_JUMP": "10"})

    async def scenario() -> None:
        async with StorageAdminClient(node.admin_address, cluster_key, NUM_PARTITIONS) as admin:
            await admin.assign_partition(0, True)
        async with session(node, cluster_key, 9) as s:  # -1 + 10: the largest first jump
            await s.append(0, records(0, 3))
        assert await fence_of(node, cluster_key) == (9, -1)
        async with session(node, cluster_key, 19) as s:
            await s.set_low_water_mark(0, 2)  # a write raises it too
        assert await fence_of(node, cluster_key) == (19, 19)
        async with session(node, cluster_key, 30) as s:  # 11 above: refused, fence kept
            for request in (s.open_session(0), s.append(0, records(3, 1)), s.truncate(0, 0)):
                with pytest.raises(StorageRpcError) as info:
                    await request
                assert info.value.code == "SESSION_JUMP_TOO_LARGE"
                assert "storage.fence.maxJump (10)" in info.value.remote_message
        assert await fence_of(node, cluster_key) == (19, 19)
        async with session(node, cluster_key, 18) as stale:
            with pytest.raises(StorageRpcError, match="SESSION_FENCED"):
                await stale.append(0, records(3, 1))
            with pytest.raises(StorageRpcError, match="SESSION_FENCED"):
                await stale.max_transaction_id(0)
        async with session(node, cluster_key, 20) as s:
            await s.open_session(0)
            assert await s.records(0, 0, 10) == records(0, 3)

    run(scenario())


def test_a_huge_jump_is_refused_and_negative_sessions_are_invalid(
    storage_node: LocalStorageNode, cluster_key: str
) -> None:
    async def scenario() -> None:
        await write(storage_node, cluster_key, 2)
        for session_id in (MAX_SESSION, 2 + DEFAULT_MAX_FENCE_JUMP + 1):
            async with session(storage_node, cluster_key, session_id) as hostile:
                with pytest.raises(StorageRpcError) as info:
                    await hostile.open_session(0)
                assert info.value.code == "SESSION_JUMP_TOO_LARGE"
                with pytest.raises(StorageRpcError, match="SESSION_JUMP_TOO_LARGE"):
                    await hostile.append(0, records(5, 1))
        for session_id in (-1, -(2**63)):
            async with session(storage_node, cluster_key, session_id) as negative:
                with pytest.raises(StorageRpcError) as info:
                    await negative.open_session(0)
                assert info.value.code == "INVALID_REQUEST" and "negative" in info.value.remote_message
        assert await fence_of(storage_node, cluster_key) == (2, -1)
        # The largest jump allowed is allowed.
        async with session(storage_node, cluster_key, 2 + DEFAULT_MAX_FENCE_JUMP) as s:
            await s.open_session(0)
            assert await s.records(0, 0, 10) == records(0, 5)
        assert await fence_of(storage_node, cluster_key) == (2 + DEFAULT_MAX_FENCE_JUMP, -1)

    run(scenario())


def test_set_fence_lowers_a_poisoned_fence_and_is_audited(
    storage_node: LocalStorageNode, cluster_key: str
) -> None:
    """A forged session within the bound took the partition and even set a low-water mark; the
    admin set-fence puts both back, durably, and logs who, from where, from and to, and why."""
    poisoned = 3 + DEFAULT_MAX_FENCE_JUMP

    async def poison() -> None:
        await write(storage_node, cluster_key, 3)
        async with session(storage_node, cluster_key, poisoned) as forged:
            await forged.set_low_water_mark(0, 4)
        assert await fence_of(storage_node, cluster_key) == (poisoned, poisoned)
        async with session(storage_node, cluster_key, 4) as real:
            with pytest.raises(StorageRpcError, match="SESSION_FENCED"):
                await real.open_session(0)

    async def lower() -> None:
        async with StorageAdminClient(storage_node.admin_address, cluster_key, NUM_PARTITIONS) as admin:
            with pytest.raises(StorageRpcError, match="INVALID_REQUEST"):
                await admin.set_fence(0, -2)
            # Compare-and-set: a fence that moved since the operator read it is left alone.
            with pytest.raises(StorageRpcError, match=f"the fence is {poisoned}, not 4 as expected"):
                await admin.set_fence(0, 3, expected_fence=4)
            answer = await admin.set_fence(
                0, 3, operator="ops@example", reason="forged session ID", expected_fence=poisoned
            )
        assert (answer.previous_fence, answer.fence) == (poisoned, 3)
        assert (answer.previous_last_session_id, answer.last_session_id) == (poisoned, 3)

    run(poison())
    run(lower())
    storage_node.kill()
    storage_node.start()

    async def after() -> None:
        assert await fence_of(storage_node, cluster_key) == (3, 3)
        await write(storage_node, cluster_key, 4)
        async with session(storage_node, cluster_key, 4) as s:
            assert await s.last_session_info(0) == (3, 4)
            assert await s.records(0, 0, 20) == records(0, 10)

    run(after())
    log_path = storage_node.process.log_path
    assert log_path is not None
    audit = [line for line in log_path.read_text().splitlines() if "AUDIT set-fence" in line]
    assert len(audit) == 1, audit
    line = audit[0]
    assert " WARNING " in line and "waltz.services.storage.audit" in line
    assert f"partition 0 fence {poisoned} -> 3" in line
    assert f"session {poisoned} -> 3" in line
    assert "'ops@example'" in line and "127.0.0.1" in line and "'forged session ID'" in line


def test_the_admin_port_never_moves_a_fence_by_reading(
    storage_node: LocalStorageNode, cluster_key: str
) -> None:
    async def scenario() -> None:
        await write(storage_node, cluster_key, 1)
        async with StorageAdminClient(storage_node.admin_address, cluster_key, NUM_PARTITIONS) as admin:
            assert await admin.records(0, 0, 10) == records(0, 5)
            assert await admin.max_transaction_id(0) == 4
            with pytest.raises(StorageRpcError, match="PARTITION_NOT_ASSIGNED"):
                await admin.set_fence(2, 0)
            with pytest.raises(StorageRpcError, match="PARTITION_NOT_ASSIGNED"):
                await admin.set_fence(NUM_PARTITIONS + 1, 0)
        assert await fence_of(storage_node, cluster_key) == (1, -1)

    run(scenario())
    assert storage_node.process.is_running()
