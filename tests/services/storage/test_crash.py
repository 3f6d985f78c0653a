"""Crash safety: kill -9 a storage node while appends stream in, then check what survived."""

from __future__ import annotations

import asyncio
import random
import uuid
from pathlib import Path

import pytest
from support.storage import NUM_PARTITIONS, run

from waltz.errors import StorageRpcError
from waltz.local.nodes import LocalStorageNode
from waltz.protocol.records import Record, ReqId
from waltz.protocol.storage_client import StorageAdminClient, StorageSessionClient
from waltz.services.storage import format as fmt
from waltz.services.storage.control_file import ControlFile


def payload(txn: int) -> bytes:
    rng = random.Random(txn)
    return rng.randbytes(rng.randint(0, 600))


def record(txn: int) -> Record:
    return Record.create(txn, ReqId(9, 1, 0, txn), txn & 0xFFFF, payload(txn))


async def stream_until_killed(node: LocalStorageNode, key: str, session_id: int, kill_after: float) -> int:
    """Append batches with up to 8 in flight until the node dies; return the highest acked ID."""
    acked = -1
    next_txn = 0
    in_flight: list[tuple[int, asyncio.Future[object]]] = []
    client = StorageSessionClient(node.address, key, NUM_PARTITIONS, session_id)
    await client.open()
    loop = asyncio.get_running_loop()
    killer = loop.run_in_executor(None, lambda: (__import__("time").sleep(kill_after), node.kill()))
    try:
        for _ in range(100_000):  # bounded: the kill ends the stream long before
            while len(in_flight) < 8:
                size = random.randint(1, 40)
                batch = [record(t) for t in range(next_txn, next_txn + size)]
                in_flight.append((next_txn + size - 1, asyncio.ensure_future(client.append(0, batch))))
                next_txn += size
            last, future = in_flight.pop(0)
            try:
                await future
            except (ConnectionError, StorageRpcError):
                break
            acked = last
    finally:
        await killer
        for _, future in in_flight:
            future.cancel()
        await client.close()
    return acked


@pytest.mark.parametrize("kill_after", [0.3, 0.7, 1.2])
def test_kill_9_while_streaming_loses_no_acknowledged_record(
    storage_node: LocalStorageNode, cluster_key: str, kill_after: float
) -> None:
    async def fence_first() -> None:
        async with StorageSessionClient(storage_node.address, cluster_key, NUM_PARTITIONS, 4) as s:
            await s.open_session(0)

    run(fence_first())
    acked = run(stream_until_killed(storage_node, cluster_key, 5, kill_after))
    assert acked > 0, "nothing was acknowledged before the kill: the test proves nothing"
    storage_node.start()

    async def check() -> None:
        async with StorageAdminClient(storage_node.admin_address, cluster_key, NUM_PARTITIONS) as admin:
            status = (await admin.partition_status(0)).partitions[0]
            assert status.corrupt_transaction_id == -1
            max_txn = status.max_transaction_id
            assert max_txn >= acked
            got: list[Record] = []
            while len(got) <= max_txn:
                page = await admin.records(0, len(got), 5000)
                assert page, f"no records from {len(got)} although the max is {max_txn}"
                got.extend(page)
        # Every acknowledged record byte for byte; anything after it whole and valid too.
        assert got == [record(t) for t in range(max_txn + 1)]
        # The fence of session 5 survived the crash.
        async with StorageSessionClient(storage_node.address, cluster_key, NUM_PARTITIONS, 4) as old:
            with pytest.raises(StorageRpcError, match="SESSION_FENCED"):
                await old.max_transaction_id(0)

    run(check())
    # Nothing half-present on disk: the data file ends exactly after the last record.
    storage_node.stop()
    data_file = storage_node.directory / "0" / fmt.segment_file_name(0, fmt.SEGMENT_SUFFIX)
    raw = data_file.read_bytes()
    ends = [
        offset + fmt.RECORD_FIXED_SIZE + len(r.data) for offset, r in fmt.iter_records(raw, fmt.HEADER_SIZE)
    ]
    assert ends[-1] == len(raw)


def test_torn_control_struct_opens_with_the_other(
    storage_node: LocalStorageNode, cluster_key: str, tmp_path: Path
) -> None:
    async def write(session_id: int, lwm: int) -> None:
        async with StorageSessionClient(storage_node.address, cluster_key, NUM_PARTITIONS, session_id) as s:
            await s.open_session(0)
            if await s.max_transaction_id(0) < 0:
                await s.append(0, [record(t) for t in range(50)])
            await s.set_low_water_mark(0, lwm)

    run(write(2, 10))
    run(write(3, 20))
    storage_node.kill()
    # Tear the newest struct (session 3) as a crash in the middle of its write would.
    path = ControlFile.path_in(storage_node.directory)
    raw = bytearray(path.read_bytes())
    for slot in (0, 1):
        start = fmt.HEADER_SIZE + 4 + slot * fmt.PARTITION_INFO_STRUCT_SIZE
        info = fmt.decode_partition_info_struct(0, bytes(raw[start : start + 28]))
        if info is not None and info.session_id == 3:
            raw[start + 10 : start + 28] = b"\0" * 18
    path.write_bytes(bytes(raw))
    storage_node.start()

    async def check() -> None:
        async with StorageAdminClient(storage_node.admin_address, cluster_key, NUM_PARTITIONS) as admin:
            assert await admin.last_session_info(0) == (2, 10)
            # Partition 1's entry is intact and unaffected.
            assert await admin.last_session_info(1) == (-1, -1)

    run(check())


def test_flipped_byte_is_reported_by_a_read_and_by_disk_verify(
    storage_node: LocalStorageNode, cluster_key: str
) -> None:
    async def write() -> None:
        async with StorageSessionClient(storage_node.address, cluster_key, NUM_PARTITIONS, 1) as s:
            await s.append(0, [record(t) for t in range(40)])

    run(write())
    storage_node.stop()
    data_file = storage_node.directory / "0" / fmt.segment_file_name(0, fmt.SEGMENT_SUFFIX)
    raw = bytearray(data_file.read_bytes())
    offsets = {r.transaction_id: o for o, r in fmt.iter_records(bytes(raw), fmt.HEADER_SIZE)}
    raw[offsets[12] + fmt.RECORD_HEADER_SIZE - 2] ^= 0xFF  # in transaction 12's data CRC field
    data_file.write_bytes(bytes(raw))
    storage_node.start()

    async def read() -> None:
        async with StorageSessionClient(storage_node.address, cluster_key, NUM_PARTITIONS, 1) as s:
            # The valid prefix is readable; the partition's max stops before the corrupt record.
            assert await s.records(0, 0, 40) == [record(t) for t in range(12)]
            assert await s.max_transaction_id(0) == 11
            with pytest.raises(StorageRpcError) as info:
                await s.records(0, 12, 40)
            assert info.value.code == "CORRUPT_DATA"
            message = info.value.remote_message
            assert "partition 0" in message
            assert f"offset {offsets[12]}" in message
            assert "transaction 12" in message

    run(read())
    storage_node.stop()
    from typer.testing import CliRunner

    from waltz.cli.main import app

    result = CliRunner().invoke(app, ["disk", "verify", str(storage_node.directory)])
    assert result.exit_code == 1, result.output
    assert str(offsets[12]) in result.output and "12" in result.output
    assert uuid.UUID(cluster_key)  # the key is still the node's
