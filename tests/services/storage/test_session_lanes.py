"""One store session stream carrying several partitions (docs/design/storage.md "Storage
requests"): each partition's requests are answered in order, partitions concurrently, so
that a partition waiting for its flush never holds up another partition's appends on the same
stream.

The storage node runs in this process (a real ``StorageApp`` on a loopback port) so that the test
can hold one partition's I/O thread."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from support.storage import NUM_PARTITIONS, run

from waltz.protocol.records import Record, ReqId
from waltz.protocol.storage_client import StorageSessionClient, columns_append
from waltz.services.storage import service
from waltz.services.storage.app import StorageApp
from waltz.services.storage.config import StorageConfig


def records(partition_id: int, first: int, count: int) -> list[Record]:
    return [
        Record.create(txn, ReqId(3, 2, partition_id, txn), 0, f"p{partition_id} t{txn}".encode())
        for txn in range(first, first + count)
    ]


@contextlib.asynccontextmanager
async def storage_app(
    tmp_path: Path, key: str, partitions: tuple[int, ...], gate: threading.Event
) -> AsyncIterator[StorageApp]:
    """A storage node in this process whose appends always go to the partitions' I/O threads
    (``inline_appends`` off, so that a test can hold a thread until ``gate`` opens), open with
    ``key`` and assigned ``partitions``; at the end the gate opens and the node stops."""
    app = StorageApp(
        StorageConfig(
            directory=tmp_path / "storage", port=0, admin_port=0, inline_appends=False, insecure=True
        )
    )
    await app.start()
    try:
        app.node.admin_open(key, NUM_PARTITIONS)
        for partition_id in partitions:
            app.node.set_assignment(partition_id, True)
        yield app
    finally:
        gate.set()
        await app.stop()


def test_a_partition_waiting_for_its_io_thread_does_not_hold_up_another(tmp_path: Path) -> None:
    key = str(uuid.uuid4())
    gate = threading.Event()

    async def scenario() -> None:
        async with storage_app(tmp_path, key, (0, 1), gate) as app:
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

    run(scenario())


@pytest.mark.parametrize("form", ["columns", "records"])
def test_queued_appends_share_a_flush_up_to_the_group_limit_in_either_form(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, form: str
) -> None:
    """Appends queued behind a flush are written together (group commit), as many records as
    ``MAX_GROUP_RECORDS`` allows: counted in columns as in record messages."""
    monkeypatch.setattr(service, "MAX_GROUP_RECORDS", 5)
    key = str(uuid.uuid4())
    gate = threading.Event()

    async def scenario() -> None:
        async with storage_app(tmp_path, key, (0,), gate) as app:
            held = asyncio.ensure_future(app.node.run(0, lambda: gate.wait(60)))
            async with StorageSessionClient(f"127.0.0.1:{app.port}", key, NUM_PARTITIONS, 1) as stream:
                futures = []
                for first in (0, 3, 6, 9):  # four appends of three records
                    if form == "columns":
                        futures.append(stream.submit_append(0, columns_append(records(0, first, 3))))
                    else:
                        futures.append(asyncio.ensure_future(stream.append(0, records(0, first, 3))))
                    if first == 0:
                        # The first is taken alone: it waits on the I/O thread behind the held work.
                        for _ in range(200):
                            if app.node._outstanding.get(0, 0) == 2:
                                break
                            await asyncio.sleep(0.05)
                        assert app.node._outstanding.get(0, 0) == 2
                    await asyncio.sleep(0.2)  # each received and queued behind the first
                await asyncio.sleep(0.5)
                gate.set()
                for response in await asyncio.wait_for(asyncio.gather(*futures), 20):
                    if response is not None:
                        assert response.HasField("success"), response
                assert await stream.records(0, 0, 20) == records(0, 0, 12)
            assert await held is True
            flushes = app.metrics.snapshot()['waltz_storage_append_flushes_total{partition="0"}']
            # The first alone (taken before the others came), then 3 + 3 (6 >= 5 stops there),
            # then the last: three flushes. Counting no record would have put all three together.
            assert flushes == 3

    run(scenario())


@pytest.mark.security
def test_requests_for_partitions_not_served_here_get_no_lane(tmp_path: Path) -> None:
    """A peer naming partitions that do not exist (or are not assigned) is answered at once with
    the failure, and no lane (a task and a queue) is made for any of them."""
    from waltz.errors import StorageRpcError

    key = str(uuid.uuid4())
    gate = threading.Event()

    async def scenario() -> None:
        async with (
            storage_app(tmp_path, key, (0,), gate) as app,
            StorageSessionClient(f"127.0.0.1:{app.port}", key, NUM_PARTITIONS, 1) as stream,
        ):
            await stream.open_session(0)  # partition 0's lane
            tasks_before = len(asyncio.all_tasks())
            for partition_id in (1, NUM_PARTITIONS, 2**31 - 1, 7_000, 8_000):
                with pytest.raises(StorageRpcError, match="PARTITION_NOT_ASSIGNED"):
                    await stream.max_transaction_id(partition_id)
            assert len(asyncio.all_tasks()) <= tasks_before  # no lane task was started
            assert await stream.max_transaction_id(0) == -1

    run(scenario())
