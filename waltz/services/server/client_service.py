"""The client-facing gRPC service of a server (``WaltzServerService``, ``docs/protocol.md``).

One ``Stream`` call per client connection: the reader hands each message to its partition in
order (an append that must wait for store capacity stops the reader, and gRPC flow control then
slows the client: back pressure), while the writer sends queued messages in batches.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import grpc

from waltz.protocol import client_pb2, client_pb2_grpc
from waltz.services.server.partition import Partition

__all__ = ["WaltzServerServicer"]

log = logging.getLogger(__name__)

#: Server messages written in one stream message at most.
MAX_BATCH = 2000

_connection_ids = itertools.count(1)


class _Connection:
    """One client stream: an outbound queue and the network sequence numbers of its mounts."""

    def __init__(self) -> None:
        self.connection_id = next(_connection_ids)
        self.client_id = -1
        self.network_seq: dict[int, int] = {}
        self._outbound: deque[client_pb2.ServerMessage] = deque()
        self._ready = asyncio.Event()
        self.closed = False

    def send(self, message: client_pb2.ServerMessage) -> None:
        if not self.closed:
            self._outbound.append(message)
            self._ready.set()

    def backlog(self) -> int:
        return len(self._outbound)

    async def batches(self) -> AsyncIterator[client_pb2.ServerMessages]:
        while not self.closed:
            await self._ready.wait()
            self._ready.clear()
            while self._outbound:
                count = min(MAX_BATCH, len(self._outbound))
                yield client_pb2.ServerMessages(messages=[self._outbound.popleft() for _ in range(count)])


class WaltzServerServicer(client_pb2_grpc.WaltzServerServiceServicer):
    """Routes client messages to the server's partitions.

    Args:
        partitions: returns the partitions this server owns now, by ID.
    """

    def __init__(self, partitions: Callable[[], Mapping[int, Partition]]) -> None:
        self._partitions = partitions

    async def Stream(  # noqa: N802 - gRPC method name
        self,
        request_iterator: AsyncIterator[client_pb2.ClientMessages],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[client_pb2.ServerMessages]:
        """Serve one client connection."""
        connection = _Connection()
        tasks: set[asyncio.Task[None]] = set()
        reader = asyncio.get_running_loop().create_task(self._read(connection, request_iterator, tasks))
        try:
            async for batch in connection.batches():
                yield batch
        finally:
            connection.closed = True
            reader.cancel()
            for task in list(tasks):
                task.cancel()
            for partition in self._partitions().values():
                partition.disconnect(connection)

    async def _read(
        self,
        connection: _Connection,
        request_iterator: AsyncIterator[client_pb2.ClientMessages],
        tasks: set[asyncio.Task[None]],
    ) -> None:
        def spawn(coroutine: Any) -> None:
            task = asyncio.get_running_loop().create_task(coroutine)
            tasks.add(task)
            task.add_done_callback(tasks.discard)

        try:
            async for batch in request_iterator:
                for message in batch.messages:
                    await self._dispatch(connection, message, spawn)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.info("client connection %d ended: %s", connection.connection_id, exc)
        finally:
            connection.closed = True
            connection._ready.set()

    async def _dispatch(
        self, connection: _Connection, message: client_pb2.ClientMessage, spawn: Callable[[Any], None]
    ) -> None:
        kind = message.WhichOneof("body")
        if kind is None:
            connection.send(_error(None, "empty client message"))
            return
        body: Any = getattr(message, kind)
        req_id = body.req_id
        connection.client_id = req_id.client_id
        partition = self._partitions().get(req_id.partition_id)
        if partition is None or partition.closed:
            if kind == "mount":
                connection.send(
                    client_pb2.ServerMessage(
                        mount=client_pb2.MountResponse(req_id=req_id, partition_ready=False)
                    )
                )
            return  # appends, unmounts, ... for a partition not here are dropped (docs/protocol.md)
        seq = connection.network_seq.get(req_id.partition_id, -1)
        if kind == "append":
            await partition.append(connection, body, seq)
        elif kind == "mount":
            connection.network_seq[req_id.partition_id] = body.seq_num
            spawn(partition.mount(connection, body))
        elif kind == "unmount":
            partition.unmount(connection, body)
        elif kind == "flush":
            spawn(partition.flush(connection, body, seq))
        elif kind == "high_water_mark":
            spawn(partition.high_water_mark_request(connection, body))
        elif kind == "feed":
            connection.send(
                _error(req_id, "feed requests are not used: mount the partition to start its feed")
            )

    async def GetTransactionData(  # noqa: N802 - gRPC method name
        self, request: client_pb2.TransactionDataRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> client_pb2.TransactionDataResponse:
        """The data of a committed transaction (seed 002 "Transaction Data Request")."""
        partition = self._partitions().get(request.req_id.partition_id)
        if partition is None or partition.closed:
            return client_pb2.TransactionDataResponse(
                req_id=request.req_id,
                transaction_id=request.transaction_id,
                success=False,
                error_message=f"partition {request.req_id.partition_id} is not on this server",
            )
        try:
            found = await partition.transaction_data(request.transaction_id)
        except Exception as exc:
            found, error = None, f"{type(exc).__name__}: {exc}"
        else:
            error = f"transaction {request.transaction_id} is not committed"
        if found is None:
            return client_pb2.TransactionDataResponse(
                req_id=request.req_id,
                transaction_id=request.transaction_id,
                success=False,
                error_message=error,
            )
        data, checksum = found
        return client_pb2.TransactionDataResponse(
            req_id=request.req_id,
            transaction_id=request.transaction_id,
            success=True,
            data=data,
            checksum=checksum,
        )


def _error(req_id: Any, message: str) -> client_pb2.ServerMessage:
    error = client_pb2.ServerError(message=message)
    if req_id is not None:
        error.req_id.CopyFrom(req_id)
    return client_pb2.ServerMessage(error=error)
