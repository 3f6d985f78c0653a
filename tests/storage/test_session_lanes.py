"""One store session stream carrying several partitions (seed 004): each partition's requests are
answered in order, partitions concurrently, so that a partition waiting for its flush never holds
up another partition's appends on the same stream.

The storage node runs in this process (a real ``StorageApp`` on a loopback port) so that the test
can hold one partition's I/O thread."""

from __future__ import annotations

import asyncio
import threading
import uuid
from pathlib import Path

from support.storage import NUM_PARTITIONS, run

from waltz.protocol.records import Record, ReqId
from waltz.protocol.storage_client import StorageSessionClient
from waltz.services.storage.app import StorageApp
from waltz.services.storage.config import StorageConfig


def records(partition_id: int, first: int, count: int) -> list[Record]:
    return [
        Record.create(txn, ReqId(3, 2, partition_id, txn), 0, f"p{partition_id} t{txn}".encode())
        for txn in range(first, first + count)
    ]


def test_a_partition_waiting_for_its_io_thread_does_not_hold_up_another(tmp_path: Path) -> None:
    key = str(uuid.uuid4())
    gate = threading.Event()

    async def scenario() -> None:
        app = StorageApp(
            StorageConfig(directory=tmp_path / "storage", port=0, admin_port=0, inline_appends=False)
        )
        await app.start()
        try:
            app.node.admin_open(key, NUM_PARTITIONS)
            app.node.set_assignment(0, True)
            app.node.set_assignment(1, True)
            # Partition 0's I/O thread is busy until the gate opens (bounded: 60 s at most).
            held = asyncio.ensure_future(app.node.run(0, lambda: gate.wait(60)))
            async with StorageSessionClient(f"127.0.0.1:{app.port}", key, NUM_PARTITIONS, 1) as stream:
                first = asyncio.ensure_future(stream.append(0, records(0, 0, 3)))
                second = asyncio.ensure_future(stream.append(0, records(0, 3, 2)))
                # Partition 1's appends, sent after partition 0's on the same stream, are answered.
                await asyncio.wait_for(stream.append(1, records(1, 0, 4)), 20)
                await asyncio.wait_for(stream.append(1, records(1, 4, 1)), 20)
                assert not first.done() and not second.done()
                gate.set()
                await asyncio.wait_for(asyncio.gather(first, second), 20)
                assert await stream.max_transaction_id(0) == 4
                assert await stream.max_transaction_id(1) == 4
                assert await stream.records(0, 0, 10) == records(0, 0, 5)
                assert await stream.records(1, 0, 10) == records(1, 0, 5)
            assert await held is True
        finally:
            gate.set()
            await app.stop()

    run(scenario())
