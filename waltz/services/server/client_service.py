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
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from typing import Any

import grpc

from waltz.protocol import client_pb2, client_pb2_grpc, common_pb2
from waltz.protocol.roles import CLIENT_ROLES, authorize
from waltz.services.server.appends import AppendRow, LockHashLimits, append_rows, reserved_header_refusal
from waltz.services.server.server_partition import FeedColumns, Partition

__all__ = ["WaltzServerServicer"]

log = logging.getLogger(__name__)

#: Server messages written in one stream message at most.
MAX_BATCH = 2000
#: Distinct client IDs one connection may mount under (a client uses one; docs/design/server.md,
#: "Bounds on what a peer costs"); a mount under one more is refused.
MAX_CLIENT_IDS_PER_CONNECTION = 16
#: Protocol messages queued for a connection (each feed entry counted) above which the server
#: reads no more of its requests until the client has taken half of them (back pressure).
MAX_CONNECTION_BACKLOG = 50_000
#: Mounts, flushes and high-water-mark requests of one connection waiting at once, above which
#: the server reads no more of its requests until one is answered.
MAX_CONNECTION_TASKS = 1_000
#: Work of one connection done in one turn of the event loop, after which the server lets other
#: connections' requests run before it goes on
#: (docs/design/server.md, "Bounds on what a peer costs"). Counted as :data:`MESSAGE_WORK` per
#: protocol message, one per append row and one per lock hash: a stream message of 10,000
#: flushes, of 10,000-row appends dropped or refused, or of appends of 4,096 lock hashes each,
#: does not hold up other partitions.
WORK_PER_TURN = 4096
#: The work counted for one protocol message (besides its rows and lock hashes): 256 messages of
#: no rows make a turn.
MESSAGE_WORK = 16

_connection_ids = itertools.count(1)


class _Connection:
    """One client stream: outgoing stream messages and the network sequence numbers of its mounts.

    Protocol messages are written straight into the next outgoing stream message (at most
    ``MAX_BATCH`` each): a run of feed entries is one ``FeedEntries`` message of columns.
    """

    def __init__(self) -> None:
        self.connection_id = next(_connection_ids)
        self.client_id = -1
        self.network_seq: dict[int, int] = {}
        # (partition ID, client ID) of every mount received on this connection: the only client
        # IDs whose other requests it takes (docs/design/server.md, "Bounds on what a peer costs").
        self.mounts: set[tuple[int, int]] = set()
        self.client_ids: set[int] = set()
        self._drained = asyncio.Event()
        self._full: deque[tuple[client_pb2.ServerMessages, int]] = deque()  # (batch, its entries)
        self._batch = client_pb2.ServerMessages()
        self._batch_count = 0  # messages in _batch
        self._batch_entries = 0  # protocol messages in _batch, each feed entry counted
        self._queued = 0
        # Work left in this turn of the event loop (WORK_PER_TURN; docs/design/server.md,
        # "Bounds on what a peer costs").
        self.budget = WORK_PER_TURN
        self._ready = asyncio.Event()
        self.closed = False
        self.error: str | None = None  # why reading the client's stream failed, if it did

    def _slot(self, entries: int = 1) -> client_pb2.ServerMessage:
        if self._batch_count >= MAX_BATCH:
            self._full.append((self._batch, self._batch_entries))
            self._batch = client_pb2.ServerMessages()
            self._batch_count = 0
            self._batch_entries = 0
        self._batch_count += 1
        self._batch_entries += entries
        self._queued += entries
        if not self._ready.is_set():
            self._ready.set()
        return self._batch.messages.add()

    def send(self, message: client_pb2.ServerMessage) -> None:
        if not self.closed:
            self._slot().CopyFrom(message)

    def send_feed(self, partition_id: int, first_transaction_id: int, columns: FeedColumns) -> None:
        if not self.closed:
            client_ids, generations, seq_nums, headers = columns
            entries = self._slot(len(client_ids)).feed_entries
            entries.partition_id = partition_id
            entries.first_transaction_id = first_transaction_id
            entries.client_ids.extend(client_ids)
            entries.generations.extend(generations)
            entries.seq_nums.extend(seq_nums)
            entries.headers.extend(headers)

    def backlog(self) -> int:
        return self._queued

    async def drained(self) -> None:
        """Wait until the backlog is at most half of :data:`MAX_CONNECTION_BACKLOG` (or the
        connection closed)."""
        while self._queued > MAX_CONNECTION_BACKLOG // 2 and not self.closed:
            self._drained.clear()
            await self._drained.wait()

    async def take_turn(self) -> None:
        """Let other connections run when this one's work in the turn is spent, and wait for its
        backlog to drain when it is over :data:`MAX_CONNECTION_BACKLOG` (docs/design/server.md,
        "Bounds on what a peer costs")."""
        if self._queued > MAX_CONNECTION_BACKLOG:
            await self.drained()  # its drain gave the others their turns
            self.budget = WORK_PER_TURN
        if self.budget <= 0:
            self.budget = WORK_PER_TURN
            await asyncio.sleep(0)

    def end(self) -> None:
        """End :meth:`batches` (the server stops): what is queued is not sent."""
        self.closed = True
        self._ready.set()
        self._drained.set()

    async def batches(self) -> AsyncIterator[client_pb2.ServerMessages]:
        while not self.closed:
            await self._ready.wait()
            self._ready.clear()
            while self._full or self._batch_count:
                if self._full:
                    batch, entries = self._full.popleft()
                else:
                    batch, entries = self._batch, self._batch_entries
                    self._batch = client_pb2.ServerMessages()
                    self._batch_count = 0
                    self._batch_entries = 0
                self._queued -= entries
                if self._queued <= MAX_CONNECTION_BACKLOG // 2 and not self._drained.is_set():
                    self._drained.set()
                yield batch


class WaltzServerServicer(client_pb2_grpc.WaltzServerServiceServicer):
    """Routes client messages to the server's partitions.

    Args:
        partitions: returns the partitions this server owns now, by ID.
        lock_hash_limits: the most lock hashes an append and a message may carry; more is
            refused before the lock table is touched (docs/design/server.md, "Bounds on what a
            peer costs").
    """

    def __init__(
        self,
        partitions: Callable[[], Mapping[int, Partition]],
        lock_hash_limits: LockHashLimits | None = None,
    ) -> None:
        self._partitions = partitions
        self._limits = lock_hash_limits or LockHashLimits()
        self._connections: set[_Connection] = set()
        self._stopping = False

    async def end_streams(self, timeout: float) -> None:
        """End every client stream as a stop does, before gRPC's own stop cancels them.

        Each stream returns (status OK; the client reconnects, as after any lost connection, and
        a stream opened from now on is refused with ``UNAVAILABLE``) rather than being cancelled
        inside the servicer, which gRPC logs at ERROR with a traceback: an alert at every rolling
        restart (docs/design/server.md, "Stopping within a bound").

        Args:
            timeout: seconds to wait for the streams to return.
        """
        self._stopping = True  # a client reconnecting at once is refused, not served
        deadline = asyncio.get_running_loop().time() + timeout
        while self._connections and asyncio.get_running_loop().time() < deadline:
            for connection in list(self._connections):
                connection.end()
            await asyncio.sleep(0.01)

    async def Stream(  # noqa: N802 - gRPC method name
        self,
        request_iterator: AsyncIterator[client_pb2.ClientMessages],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[client_pb2.ServerMessages]:
        """Serve one client connection."""
        await authorize(context, CLIENT_ROLES, "the client service", request_iterator)
        if self._stopping:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the server is stopping")
        connection = _Connection()
        self._connections.add(connection)
        tasks: set[asyncio.Task[None]] = set()
        reader = asyncio.get_running_loop().create_task(
            self._read(connection, request_iterator, tasks, context.peer())
        )
        try:
            async for batch in connection.batches():
                yield batch
            if connection.error is not None:
                # Bytes that do not parse, say: the client learns it from the status, not silence.
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, connection.error)
        finally:
            self._connections.discard(connection)
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
        peer: str,
    ) -> None:
        def spawn(coroutine: Any) -> None:
            task = asyncio.get_running_loop().create_task(coroutine)
            tasks.add(task)
            task.add_done_callback(tasks.discard)

        try:
            async for batch in request_iterator:
                partitions = self._partitions()  # the partitions owned now (for this message)
                for message in batch.messages:
                    if connection.budget <= 0:
                        await connection.take_turn()  # other connections' turn
                        partitions = self._partitions()
                    connection.budget -= MESSAGE_WORK
                    if connection.backlog() > MAX_CONNECTION_BACKLOG or len(tasks) >= MAX_CONNECTION_TASKS:
                        # A peer that does not read its answers, or asks faster than they come:
                        # stop reading it (gRPC flow control slows it) until it catches up.
                        await connection.drained()
                        while len(tasks) >= MAX_CONNECTION_TASKS:
                            await asyncio.wait(set(tasks), return_when=asyncio.FIRST_COMPLETED)
                        partitions = self._partitions()
                    waiting = self._dispatch(connection, message, spawn, partitions)
                    if waiting is not None:
                        await waiting  # an append waiting for recovery or room: later ones wait too
                        partitions = self._partitions()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.info("client connection %d from %s ended: %s", connection.connection_id, peer, exc)
            connection.error = f"unreadable client stream: {type(exc).__name__}: {exc}"
        finally:
            connection.closed = True
            connection._ready.set()

    def _dispatch(
        self,
        connection: _Connection,
        message: client_pb2.ClientMessage,
        spawn: Callable[[Any], None],
        partitions: Mapping[int, Partition],
    ) -> Coroutine[Any, Any, None] | None:
        """Route one message to its partition among ``partitions`` (those owned now); returns what
        to await before the next message (a waiting append)."""
        kind = message.WhichOneof("body")
        if kind is None:
            connection.send(_error(None, "empty client message"))
            return None
        body: Any = getattr(message, kind)
        if kind == "appends":
            return self._dispatch_appends(connection, body, partitions)
        req_id = body.req_id
        if kind == "mount":
            refusal = _mark_refusal(body) or _mount_refusal(connection, req_id)
            if refusal is not None:
                connection.send(_error(req_id, refusal))
                return None
        elif (
            kind not in ("high_water_mark", "feed")
            and (req_id.partition_id, req_id.client_id) not in connection.mounts
        ):
            connection.send(_error(req_id, _not_mounted(req_id.client_id, req_id.partition_id)))
            return None
        connection.client_id = req_id.client_id
        partition = partitions.get(req_id.partition_id)
        if kind == "mount" and partition is not None and not partition.closed:
            connection.mounts.add((req_id.partition_id, req_id.client_id))  # at most owned x client IDs
        if partition is None or partition.closed:
            if kind == "mount":
                connection.send(
                    client_pb2.ServerMessage(
                        mount=client_pb2.MountResponse(req_id=req_id, partition_ready=False)
                    )
                )
            return None  # appends, unmounts, ... for a partition not here are dropped (docs/protocol.md)
        seq = connection.network_seq.get(req_id.partition_id, -1)
        if kind == "append":
            refusal = reserved_header_refusal(body.header) or self._limits.refusal(body)
            if refusal is not None:
                connection.send(_error(req_id, refusal))
                return None
            row = AppendRow.from_proto(body)
            connection.budget -= _row_work(row)
            if not partition.append_now(connection, row, seq):
                return partition.append(connection, row, seq)
        elif kind == "mount":
            connection.network_seq[req_id.partition_id] = body.seq_num
            spawn(partition.mount(connection, body))
        elif kind == "unmount":
            partition.unmount(connection, body)
        elif kind == "flush":
            spawn(partition.flush(connection, body, seq))
        elif kind == "high_water_mark":
            spawn(partition.high_water_mark_request(connection, body))
        elif kind == "feed_window":
            partition.feed_window(connection, body, seq)
        elif kind == "feed":
            connection.send(
                _error(req_id, "feed requests are not used: mount the partition to start its feed")
            )
        return None

    def _dispatch_appends(
        self,
        connection: _Connection,
        message: client_pb2.AppendRequests,
        partitions: Mapping[int, Partition],
    ) -> Coroutine[Any, Any, None] | None:
        """Append the rows of an ``AppendRequests`` in order (``docs/protocol.md`` "Appends"), as
        many ``AppendRequest`` messages would be; returns what to await before the next message
        when a row has to wait (the rows after it wait too), or when the connection's work in this
        turn is spent or its backlog is full before the last row (docs/design/server.md, "Bounds
        on what a peer costs")."""
        if (message.partition_id, message.client_id) not in connection.mounts:
            connection.send(_error(None, _not_mounted(message.client_id, message.partition_id)))
            return None
        connection.client_id = message.client_id
        partition = partitions.get(message.partition_id)
        if partition is None or partition.closed:
            return None  # dropped, as appends for a partition not here are
        try:
            rows, refused = append_rows(message, self._limits)
        except ValueError as exc:
            connection.send(
                _error(None, f"malformed AppendRequests for partition {message.partition_id}: {exc}")
            )
            return None
        for row, reason in refused:
            connection.send(_error(row.req_id.to_proto(), reason))
        connection.budget -= len(refused)
        if not rows:
            return None
        seq = connection.network_seq.get(message.partition_id, -1)
        locked = bool(message.write_lock_hashes or message.read_lock_hashes or message.append_lock_hashes)
        index = _append_now(partition, connection, rows, 0, seq, locked)
        if index < len(rows):
            return _append_rest(partition, connection, rows, index, seq, locked)
        return None

    async def _data_range(
        self, req_id: common_pb2.ReqId, first: int, count: int
    ) -> list[tuple[bytes, int]] | str:
        """The data and checksums of ``count`` transactions from ``first`` (a prefix), or why not."""
        partition = self._partitions().get(req_id.partition_id)
        if partition is None or partition.closed:
            return f"partition {req_id.partition_id} is not on this server"
        try:
            found = await partition.transaction_data_range(first, count)
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        return found or f"transaction {first} is not committed"

    async def GetTransactionData(  # noqa: N802 - gRPC method name
        self, request: client_pb2.TransactionDataRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> client_pb2.TransactionDataResponse:
        """The data of a committed transaction (docs/design/server.md "Transaction data cache")."""
        await authorize(context, CLIENT_ROLES, "the client service")
        found = await self._data_range(request.req_id, request.transaction_id, 1)
        if isinstance(found, str):
            return client_pb2.TransactionDataResponse(
                req_id=request.req_id,
                transaction_id=request.transaction_id,
                success=False,
                error_message=found,
            )
        data, checksum = found[0]
        return client_pb2.TransactionDataResponse(
            req_id=request.req_id,
            transaction_id=request.transaction_id,
            success=True,
            data=data,
            checksum=checksum,
        )

    async def GetTransactionDataRange(  # noqa: N802 - gRPC method name
        self, request: client_pb2.TransactionDataRangeRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> client_pb2.TransactionDataRangeResponse:
        """The data of consecutive committed transactions (not in upstream Waltz; docs/protocol.md).

        The answer holds a prefix of the range asked (see
        :meth:`~waltz.services.server.server_partition.Partition.transaction_data_range`); it fails with
        an error message when the partition is not here, the first transaction is not committed or
        the count is not positive.
        """
        await authorize(context, CLIENT_ROLES, "the client service")
        first = request.first_transaction_id
        found = (
            await self._data_range(request.req_id, first, request.count)
            if request.count > 0
            else f"count must be positive, got {request.count}"
        )
        if isinstance(found, str):
            return client_pb2.TransactionDataRangeResponse(
                req_id=request.req_id, first_transaction_id=first, success=False, error_message=found
            )
        return client_pb2.TransactionDataRangeResponse(
            req_id=request.req_id,
            first_transaction_id=first,
            success=True,
            data=[data for data, _ in found],
            checksums=[checksum for _, checksum in found],
        )


def _row_work(row: AppendRow) -> int:
    """The work one append counts in a turn (:data:`WORK_PER_TURN`): one, plus its lock hashes."""
    return 1 + len(row.write_hashes) + len(row.read_hashes) + len(row.append_hashes)


def _append_now(
    partition: Partition,
    connection: _Connection,
    rows: list[AppendRow],
    index: int,
    network_seq: int,
    locked: bool,
) -> int:
    """Append ``rows`` from ``index`` on while none has to wait, the connection's turn lasts and
    its backlog is within :data:`MAX_CONNECTION_BACKLOG`; returns the index of the first row not
    appended (``len(rows)`` when every one was). ``locked``: some row carries lock hashes (each
    counted as work); a row costs a counter otherwise."""
    append_now = partition.append_now
    end = len(rows)
    budget = connection.budget
    while index < end and budget > 0 and connection.backlog() <= MAX_CONNECTION_BACKLOG:
        row = rows[index]
        if not append_now(connection, row, network_seq):
            break
        budget -= _row_work(row) if locked else 1
        index += 1
    connection.budget = budget
    return index


async def _append_rest(
    partition: Partition,
    connection: _Connection,
    rows: list[AppendRow],
    index: int,
    network_seq: int,
    locked: bool,
) -> None:
    """Append ``rows`` from ``index`` on (where :func:`_append_now` stopped), in order: each waits
    as it needs (recovery, room in the store), and other connections get their turn when this
    one's work is spent or its backlog is full (docs/design/server.md, "Bounds on what a peer
    costs"); the rest is dropped if the partition or the connection closes meanwhile."""
    while index < len(rows) and not partition.closed and not connection.closed:
        if connection.budget <= 0 or connection.backlog() > MAX_CONNECTION_BACKLOG:
            await connection.take_turn()
        else:  # the row has to wait for the partition's recovery or room in its store
            row = rows[index]
            await partition.append(connection, row, network_seq)
            connection.budget -= _row_work(row)
            index += 1
            if partition.closed:
                return
        index = _append_now(partition, connection, rows, index, network_seq, locked)


def _mark_refusal(request: client_pb2.MountRequest) -> str | None:
    """Why a mount's high-water mark is not one a client can hold (below -1, "nothing applied"),
    or None (``docs/protocol.md`` "Mount")."""
    mark = request.client_high_water_mark
    if mark >= -1:
        return None
    return (
        f"client_high_water_mark must be at least -1 (nothing applied yet), got {mark}: mount with the "
        "ID of the last transaction the client applied"
    )


def _mount_refusal(connection: _Connection, req_id: common_pb2.ReqId) -> str | None:
    """Record a mount's client ID on the connection; why not when it carries too many already."""
    client_id = req_id.client_id
    if client_id not in connection.client_ids:
        if len(connection.client_ids) >= MAX_CLIENT_IDS_PER_CONNECTION:
            return (
                f"connection {connection.connection_id} already carries {len(connection.client_ids)} client "
                f"IDs, the most a server takes on one connection: mount client {client_id} on a "
                "connection of its own"
            )
        connection.client_ids.add(client_id)
    return None


def _not_mounted(client_id: int, partition_id: int) -> str:
    return (
        f"client {client_id} has not mounted partition {partition_id} on this connection: mount it "
        'first (docs/protocol.md, "Mount")'
    )


def _error(req_id: Any, message: str) -> client_pb2.ServerMessage:
    error = client_pb2.ServerError(message=message)
    if req_id is not None:
        error.req_id.CopyFrom(req_id)
    return client_pb2.ServerMessage(error=error)
