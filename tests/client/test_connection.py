"""The client's stream writer (``waltz.client.connection``) against a real gRPC server on loopback
that records every stream message it receives: how appends are grouped into stream messages."""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc
import pytest
from support import settle

from waltz.client.connection import MAX_BATCH_LOCK_HASHES, ServerConnection
from waltz.client.context import AppendPayload
from waltz.protocol import client_pb2, client_pb2_grpc
from waltz.protocol.records import ReqId
from waltz.services.server.appends import DEFAULT_MAX_LOCK_HASHES_PER_MESSAGE


class Recorder(client_pb2_grpc.WaltzServerServiceServicer):
    """Keeps the ReqId sequence numbers of each received stream message's appends, and each
    message's protocol messages; answers nothing."""

    def __init__(self) -> None:
        self.messages: list[list[int]] = []
        self.bodies: list[list[client_pb2.ClientMessage]] = []

    async def Stream(
        self, request_iterator: AsyncIterator[client_pb2.ClientMessages], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[client_pb2.ServerMessages]:
        async for batch in request_iterator:
            seq_nums: list[int] = []
            for message in batch.messages:
                if message.HasField("append"):
                    seq_nums.append(message.append.req_id.seq_num)
                elif message.HasField("appends"):
                    seq_nums += message.appends.seq_nums
            self.messages.append(seq_nums)
            self.bodies.append(list(batch.messages))
        return
        yield  # an async generator that ends when the client does


def payload(data: bytes) -> AppendPayload:
    return AppendPayload(5, (1,), (), (), 0, data, zlib.crc32(data))


def rid(seq: int, partition_id: int = 0, generation: int = 1) -> ReqId:
    return ReqId(7, generation, partition_id, seq)


def with_connection(scenario: Callable[[ServerConnection, Recorder], Awaitable[None]]) -> None:
    async def main() -> None:
        recorder = Recorder()
        server = grpc.aio.server()
        client_pb2_grpc.add_WaltzServerServiceServicer_to_server(recorder, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        connection = ServerConnection(
            f"127.0.0.1:{port}", 1, on_messages=lambda c, m: None, on_closed=lambda c, e: None
        )
        try:
            await connection.open(10)
            await scenario(connection, recorder)
        finally:
            await connection.close()
            await server.stop(None)

    asyncio.run(main())


async def received(recorder: Recorder, count: int) -> None:
    await settle(lambda: len(recorder.messages) >= count, f"{count} stream message(s)", timeout=5.0)


def test_an_append_with_a_linger_waits_for_the_next_one_without_and_shares_its_message() -> None:
    async def scenario(connection: ServerConnection, recorder: Recorder) -> None:
        connection.send_append(rid(1), payload(b"re-attempt"), linger=60.0)
        await asyncio.sleep(0.3)
        assert recorder.messages == []  # waiting for company (or its 60 s)
        connection.send_append(rid(2), payload(b"first attempt"))
        await received(recorder, 1)
        assert recorder.messages == [[1, 2]]
        connection.send_append(rid(3), payload(b"another first attempt"))  # the writer is idle again
        await received(recorder, 2)
        assert recorder.messages[1] == [3]

    with_connection(scenario)


def test_a_lone_append_with_a_linger_is_sent_when_its_linger_ends() -> None:
    async def scenario(connection: ServerConnection, recorder: Recorder) -> None:
        connection.send_append(rid(1), payload(b"re-attempt"), linger=0.05)
        connection.send_append(rid(2), payload(b"another re-attempt"), linger=0.05)
        await received(recorder, 1)
        assert recorder.messages == [[1, 2]]
        # A control message (a flush request, say) wakes the writer like a first attempt does.
        connection.send_append(rid(3), payload(b"re-attempt"), linger=60.0)
        connection.send(client_pb2.ClientMessage(flush=client_pb2.FlushRequest()))
        await received(recorder, 2)
        assert recorder.messages[1] == [3]

    with_connection(scenario)


def test_appends_go_in_columns_per_partition_in_the_order_queued() -> None:
    """docs/protocol.md "Appends": a partition's appends join its AppendRequests in the stream
    message until another message is queued after them (or its generation changes)."""

    async def scenario(connection: ServerConnection, recorder: Recorder) -> None:
        connection.send_append(rid(1), payload(b"r1"))  # all queued before the writer runs
        connection.send_append(rid(2, partition_id=1), AppendPayload(9, (), (4, 5), (6,), 3, b"r2", 7))
        connection.send_append(rid(3), AppendPayload(8, (1, 2), (), (), 0, b"r3", zlib.crc32(b"r3")))
        connection.send(client_pb2.ClientMessage(flush=client_pb2.FlushRequest()))
        connection.send_append(rid(4), payload(b"r4"))
        connection.send_append(rid(5, generation=2), payload(b"r5"))
        await received(recorder, 1)
        bodies = recorder.bodies[0]
        assert [m.WhichOneof("body") for m in bodies] == ["appends", "appends", "flush", "appends", "appends"]
        first, other, _, after_flush, new_generation = [m.appends for m in bodies]
        assert (first.partition_id, list(first.seq_nums), list(first.client_high_water_marks)) == (
            0,
            [1, 3],
            [5, 8],
        )
        assert list(first.data) == [b"r1", b"r3"]
        assert list(first.checksums) == [zlib.crc32(b"r1"), zlib.crc32(b"r3")]
        assert (list(first.write_lock_counts), list(first.write_lock_hashes)) == ([1, 2], [1, 1, 2])
        assert list(first.read_lock_counts) == [] and list(first.append_lock_counts) == []
        assert (other.partition_id, other.client_id, other.generation, list(other.seq_nums)) == (1, 7, 1, [2])
        assert (list(other.read_lock_counts), list(other.read_lock_hashes)) == ([2], [4, 5])
        assert (list(other.append_lock_counts), list(other.append_lock_hashes)) == ([1], [6])
        assert (list(other.headers), list(other.checksums)) == ([3], [7])
        assert list(after_flush.seq_nums) == [4]
        assert (new_generation.generation, list(new_generation.seq_nums)) == (2, [5])

    with_connection(scenario)


def test_each_appends_message_carries_the_epoch_its_rows_were_routed_by() -> None:
    """docs/protocol.md "Partition epochs": the rows of one AppendRequests share its epoch, so an
    append routed by another epoch starts a new one (docs/design/splits.md "Clients across a
    split")."""

    async def scenario(connection: ServerConnection, recorder: Recorder) -> None:
        connection.send_append(rid(1), payload(b"e1"), epoch=1)
        connection.send_append(rid(2), payload(b"e1 too"), epoch=1)
        connection.send_append(rid(3), payload(b"e0"))
        connection.send_append(rid(4), payload(b"e2"), epoch=2)
        await received(recorder, 1)
        bodies = [m.appends for m in recorder.bodies[0]]
        assert [(m.epoch, list(m.seq_nums)) for m in bodies] == [(1, [1, 2]), (0, [3]), (2, [4])]

    with_connection(scenario)


def test_a_stream_message_ends_before_its_lock_hashes_pass_the_servers_default_limit() -> None:
    """docs/design/server.md "Bounds on what a peer costs": a server refuses a message of appends
    with more than 16,384 lock hashes by default, so the client never sends one."""
    locks = tuple(range(5_000))

    async def scenario(connection: ServerConnection, recorder: Recorder) -> None:
        for seq in range(1, 8):  # 7 appends of 5,000 lock hashes, queued before the writer runs
            connection.send_append(rid(seq), AppendPayload(5, locks, (), (), 0, b"d", zlib.crc32(b"d")))
        await received(recorder, 3)
        assert recorder.messages == [[1, 2, 3], [4, 5, 6], [7]]
        assert MAX_BATCH_LOCK_HASHES <= DEFAULT_MAX_LOCK_HASHES_PER_MESSAGE

    with_connection(scenario)


def test_a_data_call_on_a_lost_or_closed_connection_raises_connection_error() -> None:
    """A transaction-data fetch that resumes after a cut closed its connection (and then its
    channel) must meet a ConnectionError, which the fetch retries, not gRPC's UsageError."""
    request = client_pb2.TransactionDataRangeRequest(
        req_id=rid(1).to_proto(), first_transaction_id=0, count=1
    )

    async def scenario(connection: ServerConnection, recorder: Recorder) -> None:
        connection.abort(ConnectionError("cut by the test"))  # the channel is still open
        with pytest.raises(ConnectionError, match="is closed"):
            await connection.get_transaction_data_range(request, 5.0)
        await connection.close()  # and now the channel too
        with pytest.raises(ConnectionError, match="is closed"):
            await connection.get_transaction_data_range(request, 5.0)

    with_connection(scenario)
