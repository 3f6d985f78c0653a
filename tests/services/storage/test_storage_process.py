"""A real storage node process over real sockets: the ten requests, fencing, keys, restarts."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from support.storage import NUM_PARTITIONS, run

from waltz.errors import CorruptDataError, ProtocolError, StorageRpcError
from waltz.local.nodes import LocalStorageNode
from waltz.protocol.cluster_key import cluster_key_fingerprint
from waltz.protocol.records import Record, ReqId
from waltz.protocol.storage_client import StorageAdminClient, StorageSessionClient


def records(first: int, count: int, size: int = 200, partition_id: int = 0) -> list[Record]:
    return [
        Record.create(
            txn, ReqId(3, 2, partition_id, txn), 0x5A5A, (txn.to_bytes(8, "big") * (size // 8 + 1))[:size]
        )
        for txn in range(first, first + count)
    ]


def session(node: LocalStorageNode, key: str, session_id: int) -> StorageSessionClient:
    return StorageSessionClient(node.address, key, NUM_PARTITIONS, session_id)


def test_all_requests_round_trip(storage_node: LocalStorageNode, cluster_key: str) -> None:
    batch = records(0, 300)

    async def scenario() -> None:
        async with session(storage_node, cluster_key, 1) as s:
            await s.open_session(0)
            await s.open_session(1)
            assert await s.last_session_info(0) == (-1, -1)
            assert await s.max_transaction_id(0) == -1
            # Pipelined appends: all in flight at once, answered in order.
            import asyncio

            await asyncio.gather(*(s.append(0, batch[i : i + 30]) for i in range(0, 300, 30)))
            assert await s.max_transaction_id(0) == 299
            assert await s.max_transaction_id(1) == -1
            assert await s.record(0, 17) == batch[17]
            assert await s.record(0, 300) is None
            header = await s.record_header(0, 18)
            assert header is not None and header == batch[18].record_header
            assert await s.record_headers(0, 290, 100) == [r.record_header for r in batch[290:]]
            assert await s.records(0, 100, 50) == batch[100:150]
            await s.set_low_water_mark(0, 199)
            assert await s.last_session_info(0) == (1, 199)
            await s.truncate(0, 249)
            assert await s.max_transaction_id(0) == 249
            assert await s.records(0, 240, 100) == batch[240:250]

    run(scenario())


def test_invalid_requests_get_clear_failures(storage_node: LocalStorageNode, cluster_key: str) -> None:
    async def scenario() -> None:
        async with session(storage_node, cluster_key, 1) as s:
            with pytest.raises(StorageRpcError) as info:
                await s.append(0, records(5, 1))
            assert info.value.code == "INVALID_REQUEST" and "expected 0" in info.value.remote_message
            bad = records(0, 1)[0]
            with pytest.raises(StorageRpcError, match="checksum"):
                await s.append(0, [Record(0, bad.req_id, 0, bad.data, bad.checksum + 1)])
            with pytest.raises(StorageRpcError) as info:
                await s.records(0, 0, 0)
            assert info.value.code == "INVALID_REQUEST"
            with pytest.raises(StorageRpcError) as info:
                await s.max_transaction_id(2)
            assert info.value.code == "PARTITION_NOT_ASSIGNED"
            with pytest.raises(StorageRpcError) as info:
                await s.max_transaction_id(NUM_PARTITIONS + 5)
            assert info.value.code == "PARTITION_NOT_ASSIGNED"
            # The stream is still usable after failures.
            await s.append(0, records(0, 2))
            assert await s.max_transaction_id(0) == 1

    run(scenario())


def test_fencing_by_session_id_survives_a_crash(storage_node: LocalStorageNode, cluster_key: str) -> None:
    async def before() -> None:
        async with session(storage_node, cluster_key, 6) as old, session(storage_node, cluster_key, 7) as new:
            await old.append(0, records(0, 10))
            # A higher session takes over by opening its session: from now on session 6 is fenced.
            await new.open_session(0)
            assert await new.max_transaction_id(0) == 9
            with pytest.raises(StorageRpcError) as info:
                await old.append(0, records(10, 1))
            assert info.value.code == "SESSION_FENCED"
            assert "fenced by session 7" in info.value.remote_message
            with pytest.raises(StorageRpcError, match="SESSION_FENCED"):
                await old.records(0, 0, 1)
            # The fence does not change the last session info (the last low-water mark).
            assert await new.last_session_info(0) == (-1, -1)
            # Other partitions are fenced independently.
            await old.append(1, records(0, 1, partition_id=1))

    run(before())
    storage_node.kill()
    storage_node.start()

    async def after() -> None:
        async with session(storage_node, cluster_key, 6) as old:
            with pytest.raises(StorageRpcError, match="SESSION_FENCED"):
                await old.append(0, records(10, 1))
        async with session(storage_node, cluster_key, 7) as new:
            await new.append(0, records(10, 1))
            assert await new.max_transaction_id(0) == 10

    run(after())


def test_wrong_cluster_key_or_partition_count_is_refused(
    storage_node: LocalStorageNode, cluster_key: str
) -> None:
    async def scenario() -> None:
        other = str(uuid.uuid4())
        with pytest.raises(StorageRpcError) as info:
            await session(storage_node, other, 1).open()
        assert info.value.code == "CLUSTER_KEY_MISMATCH"
        # The answer names the presented key by its fingerprint, never a key itself (the node's own
        # is the admin port's credential) nor where the node keeps its files.
        message = info.value.remote_message
        assert cluster_key_fingerprint(other) in message
        assert other not in message and cluster_key not in message
        assert str(storage_node.directory) not in info.value.remote_message
        with pytest.raises(StorageRpcError, match="CLUSTER_KEY_MISMATCH"):
            await StorageSessionClient(storage_node.address, cluster_key, NUM_PARTITIONS + 1, 1).open()
        with pytest.raises(StorageRpcError, match="CLUSTER_KEY_MISMATCH") as info:
            await StorageAdminClient(storage_node.admin_address, other, NUM_PARTITIONS).open()
        assert cluster_key not in info.value.remote_message
        assert str(storage_node.directory) not in info.value.remote_message
        with pytest.raises(StorageRpcError, match="not a UUID"):
            await session(storage_node, "not-a-key", 1).open()

    run(scenario())


def test_requests_before_open_and_on_an_uninitialised_node(
    start_storage: Callable[..., LocalStorageNode], cluster_key: str
) -> None:
    node = start_storage()

    async def scenario() -> None:
        with pytest.raises(StorageRpcError) as info:
            await session(node, cluster_key, 1).open()
        assert info.value.code == "NOT_INITIALIZED"
        assert "admin open" in info.value.remote_message
        # A raw stream whose first request is not an open gets NOT_OPEN.
        client = session(node, cluster_key, 1)
        client._stream.start()
        from waltz.protocol import storage_pb2

        response = await client.submit(
            storage_pb2.StorageRequest(
                session_id=1, partition_id=0, max_transaction_id=storage_pb2.MaxTransactionIdRequest()
            )
        )
        assert response.failure.exception.code == storage_pb2.FailureCode.NOT_OPEN
        await client.close()

    run(scenario())


def test_truncate_and_low_water_marks_survive_restarts(
    storage_node: LocalStorageNode, cluster_key: str
) -> None:
    batch = records(0, 100)

    async def write() -> None:
        async with session(storage_node, cluster_key, 3) as s:
            await s.append(0, batch)
            await s.set_low_water_mark(0, 80)
            await s.truncate(0, 89)

    run(write())
    assert storage_node.stop() == 0  # graceful stop on SIGTERM
    storage_node.start()

    async def check(session_id: int) -> None:
        async with session(storage_node, cluster_key, session_id) as s:
            assert await s.last_session_info(0) == (3, 80)
            assert await s.max_transaction_id(0) == 89
            assert await s.records(0, 0, 1000) == batch[:90]

    run(check(3))
    storage_node.kill()
    storage_node.start()

    async def open_session(session_id: int) -> None:
        async with session(storage_node, cluster_key, session_id) as s:
            await s.open_session(0)

    run(open_session(4))
    run(check(4))

    async def status() -> None:
        async with StorageAdminClient(storage_node.admin_address, cluster_key, NUM_PARTITIONS) as admin:
            state = await admin.partition_status(0)
            (partition,) = state.partitions
            assert (partition.session_id, partition.last_session_id) == (4, 3)
            assert (partition.low_water_mark, partition.local_low_water_mark) == (80, 80)
            assert partition.max_transaction_id == 89

    run(status())


def test_admin_port(start_storage: Callable[..., LocalStorageNode], cluster_key: str) -> None:
    refused_deletions: list[Path] = []  # a deletion refused by an immutable file, where chattr works
    node = start_storage(metrics=True)
    batch = records(0, 20)

    async def scenario() -> None:
        async with StorageAdminClient(node.admin_address, cluster_key, NUM_PARTITIONS) as admin:
            await admin.assign_partition(0, True)
            async with session(node, cluster_key, 2) as s:
                await s.append(0, batch)
            # Reads through the admin port never fence or change the session.
            assert await admin.records(0, 5, 3) == batch[5:8]
            assert await admin.max_transaction_id(0) == 19
            assert await admin.last_session_info(0) == (-1, -1)
            await admin.set_writable(0, False)
            async with session(node, cluster_key, 2) as s:
                with pytest.raises(StorageRpcError) as info:
                    await s.append(0, records(20, 1))
                assert info.value.code == "PARTITION_NOT_WRITABLE"
                await admin.set_writable(0, True)
                await admin.set_readable(0, False)
                with pytest.raises(StorageRpcError, match="PARTITION_NOT_READABLE"):
                    await s.records(0, 0, 1)
                await admin.set_readable(0, True)
                await s.append(0, records(20, 1))
            metrics = await admin.metrics()
            assert metrics['waltz_storage_appended_records_total{partition="0"}'] == 21
            assert (
                metrics['waltz_storage_requests_total{outcome="PARTITION_NOT_WRITABLE",type="append"}'] == 1
            )
            # Unassign keeps the files unless asked; reassigning finds the data again.
            await admin.assign_partition(0, False)
            with pytest.raises(StorageRpcError, match="PARTITION_NOT_ASSIGNED"):
                await admin.max_transaction_id(0)
            await admin.assign_partition(0, True)
            assert await admin.max_transaction_id(0) == 20
            # A deletion that fails says so (here: a file made immutable), and can be retried.
            immutable = next((node.directory / "0").iterdir())
            if (
                subprocess.run(["chattr", "+i", str(immutable)], check=False, capture_output=True).returncode
                == 0
            ):
                refused_deletions.append(immutable)
                try:
                    with pytest.raises(StorageRpcError, match="Operation not permitted"):
                        await admin.assign_partition(0, False, delete_storage_files=True)
                finally:
                    subprocess.run(["chattr", "-i", str(immutable)], check=True)
                assert (node.directory / "0").exists()
            await admin.assign_partition(0, False, delete_storage_files=True)
            assert not (node.directory / "0").exists()
            with pytest.raises(StorageRpcError, match="out of range"):
                await admin.assign_partition(NUM_PARTITIONS, True)

    run(scenario())
    # The deletion is on the audit trail with who asked, and so is the one that failed.
    assert node.process.log_path is not None
    lines = node.process.log_path.read_text().splitlines()
    audit = [line for line in lines if "AUDIT unassign with files deleted: " in line]
    assert len(audit) == 1, audit
    assert " WARNING " in audit[0] and "waltz.services.storage.audit" in audit[0]
    assert "partition 0" in audit[0] and "127.0.0.1" in audit[0]
    failed = [line for line in lines if "AUDIT unassign with files deleted FAILED" in line]
    assert len(failed) == len(refused_deletions), failed
    assert all("Operation not permitted" in line for line in failed), failed
    with urllib.request.urlopen(f"http://127.0.0.1:{node.metrics_port}/health", timeout=5) as response:
        health = json.load(response)
    assert health["healthy"] is True and health["initialized"] is True
    with urllib.request.urlopen(f"http://127.0.0.1:{node.metrics_port}/metrics", timeout=5) as response:
        text = response.read()
    assert b"waltz_storage_appended_records_total" in text
    assert b"process_cpu_seconds_total" in text  # what `waltz perf --local` reads per node


def test_oversized_message_is_refused_and_the_node_stays_up(
    start_storage: Callable[..., LocalStorageNode], cluster_key: str
) -> None:
    node = start_storage()

    async def scenario() -> None:
        async with StorageAdminClient(node.admin_address, cluster_key, NUM_PARTITIONS) as admin:
            await admin.assign_partition(0, True)
        big = [Record.create(0, ReqId(1, 1, 0, 0), 0, b"x" * (40 << 20))]
        client = StorageSessionClient(
            node.address, cluster_key, NUM_PARTITIONS, 1, max_message_bytes=64 << 20
        )
        await client.open()
        with pytest.raises(ConnectionError, match="RESOURCE_EXHAUSTED"):
            await client.append(0, big)
        await client.close()
        async with session(node, cluster_key, 1) as s:
            await s.append(0, records(0, 1))
            assert await s.max_transaction_id(0) == 0

    run(scenario())


def test_a_failure_response_names_no_path_of_the_node() -> None:
    from waltz.services.storage.service import failure_for

    try:
        raise ProtocolError("malformed")
    except ProtocolError as exc:
        response = failure_for(exc)
    frames = list(response.exception.stack_trace)
    assert frames and all(os.sep not in frame.file_name for frame in frames)
    assert frames[-1].file_name == os.path.basename(__file__)
    # Nor does its message: a corrupt file is named by its partition and file name only.
    corrupt = CorruptDataError(
        "record 7 CRC mismatch", path="/var/lib/waltz/storage-0/3/00000000000000000000.seg", partition_id=3
    )
    message = failure_for(corrupt).exception.message
    assert "/var/lib" not in message and "file 3/00000000000000000000.seg, partition 3" in message


def test_a_node_whose_control_file_is_lost_refuses_to_start_and_keeps_its_records(
    storage_node: LocalStorageNode, cluster_key: str
) -> None:
    """Fences and the committed floor live in the control file only: a node that started without
    it over its old segments, and let an admin open create a fresh one (fence -1, low-water mark
    -1), would take a fenced store session's truncate of committed records."""
    from waltz.local.processes import ServiceStartError
    from waltz.services.storage.control_file import ControlFile

    batch = records(0, 10)

    async def write() -> None:
        async with session(storage_node, cluster_key, 9) as s:
            await s.append(0, batch)
            await s.set_low_water_mark(0, 9)

    run(write())
    assert storage_node.stop() == 0
    ControlFile.path_in(storage_node.directory).unlink()
    segments = {path: path.read_bytes() for path in (storage_node.directory / "0").iterdir()}
    with pytest.raises(ServiceStartError):
        storage_node.start()
    assert storage_node.process.returncode == 1
    log = storage_node.process.log_path.read_text()  # type: ignore[union-attr]
    assert "holds partition data but no control file" in log
    assert "restore waltz-storage.ctl from a backup of this node" in log
    assert "Traceback" not in log
    assert not ControlFile.path_in(storage_node.directory).exists()
    assert {path: path.read_bytes() for path in (storage_node.directory / "0").iterdir()} == segments
