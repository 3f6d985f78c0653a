"""The client's stream writer (``waltz.client.connection``) against a real gRPC server on loopback
that records every stream message it receives: how appends are grouped into stream messages."""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc
from support import settle

from waltz.client.connection import ServerConnection
from waltz.client.context import AppendPayload
from waltz.protocol import client_pb2, client_pb2_grpc
from waltz.protocol.records import ReqId


class Recorder(client_pb2_grpc.WaltzServerServiceServicer):
    """Keeps the ReqId sequence numbers of each received stream message's appends; answers nothing."""

    def __init__(self) -> None:
        self.messages: list[list[int]] = []

    async def Stream(
        self, request_iterator: AsyncIterator[client_pb2.ClientMessages], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[client_pb2.ServerMessages]:
        async for batch in request_iterator:
            self.messages.append([m.append.req_id.seq_num for m in batch.messages if m.HasField("append")])
        return
        yield  # an async generator that ends when the client does


def payload(data: bytes) -> AppendPayload:
    return AppendPayload(5, (1,), (), (), 0, data, zlib.crc32(data))


def rid(seq: int) -> ReqId:
    return ReqId(7, 1, 0, seq)


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
