"""A network client: one gRPC channel and one ordered ``Stream`` call to one server endpoint.

Source: docs/design/client.md "The client's parts" (one network client per server endpoint),
"Reconnect" (a network client is closed on any unexpected error and a new one, with the next
sequence number, takes over); ``docs/protocol.md`` "Connections and identities". Outgoing protocol
messages are batched: everything queued while the previous stream message was being written goes
into the next one (docs/design/client.md "Appends, the feed and flush": one stream carries a few
thousand messages per second here, so batching is what makes throughput), a partition's appends in
columns (one ``AppendRequests``, ``docs/protocol.md`` "Appends"); an append queued with a linger (a
re-attempt's) lets an idle writer wait that long for company (``docs/protocol.md`` "Append").
Transaction data is fetched with the unary RPC on the same channel. Everything here runs on the
client's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from waltz.client.config import CERTIFICATE_PEERS
from waltz.client.context import AppendPayload
from waltz.protocol import client_pb2, client_pb2_grpc
from waltz.protocol.certificates import expired_certificates
from waltz.protocol.channels import TlsConfig, open_channel
from waltz.protocol.records import ReqId

__all__ = ["CERTIFICATE_PEERS", "NO_CERTIFICATE_HINT", "PLAINTEXT_HINT", "ServerConnection", "tls_hint"]

#: Said when a plaintext connection is not accepted: a server that requires TLS never accepts one
#: (docs/configuration.md, the client's settings).
PLAINTEXT_HINT = (
    "this client connects without TLS, which a server that requires it (a secure cluster, as "
    "`waltz up` starts by default) never accepts: set client.ssl.caFile, certFile and keyFile "
    "(WALTZ_CLIENT_TLS_CA_FILE, WALTZ_CLIENT_TLS_CERT_FILE, WALTZ_CLIENT_TLS_KEY_FILE)"
)
#: Said when a TLS connection without a client certificate is not accepted: a secure cluster's
#: servers take mutual TLS only (docs/design/overview.md, "Roles").
NO_CERTIFICATE_HINT = (
    "this client presents no certificate, and a secure cluster's servers accept mutual TLS only: "
    "set client.ssl.certFile and keyFile (WALTZ_CLIENT_TLS_CERT_FILE, WALTZ_CLIENT_TLS_KEY_FILE) "
    "to a certificate of the client role"
)


def tls_hint(tls: TlsConfig | None) -> str:
    """What a connection that is not accepted should say of its TLS files, read when it is said: no
    TLS at all, no certificate of its own, or a certificate that has expired since the client
    started ("" when none of these)."""
    if tls is None:
        return PLAINTEXT_HINT
    if tls.cert_file is None:
        return NO_CERTIFICATE_HINT
    expired = expired_certificates({"client.ssl.certFile": tls.cert_file})
    return f"{'; '.join(expired)}: a server refuses an expired certificate" if expired else ""


log = logging.getLogger(__name__)

#: Protocol messages per stream message at most.
MAX_BATCH_MESSAGES = 2000
#: Bytes of transaction data per stream message before another one starts.
MAX_BATCH_BYTES = 1 << 20
#: Lock hashes per stream message before another one starts: at most a server's default
#: ``server.maxLockHashesPerMessage`` (docs/design/server.md, "Bounds on what a peer costs").
MAX_BATCH_LOCK_HASHES = 16_384

_EOF: object = grpc.aio.EOF  # type: ignore[attr-defined]  # missing from grpc-stubs

MessagesHandler = Callable[["ServerConnection", Sequence[client_pb2.ServerMessage]], None]
ClosedHandler = Callable[["ServerConnection", BaseException | None], None]


class ServerConnection:
    """One stream to one server, identified by its network client sequence number.

    Args:
        endpoint: ``host:port`` of the server.
        seq_num: this network client's sequence number (sent in every mount on this stream).
        on_messages: called on the loop with each received batch of server messages, in order.
        on_closed: called once on the loop when the stream ends or fails (with the error).
        tls: TLS files, or None for plaintext.
        max_message_bytes: the gRPC message size limit.
    """

    def __init__(
        self,
        endpoint: str,
        seq_num: int,
        *,
        on_messages: MessagesHandler,
        on_closed: ClosedHandler,
        tls: TlsConfig | None = None,
        max_message_bytes: int = 32 << 20,
    ) -> None:
        self.endpoint = endpoint
        self.seq_num = seq_num
        self._tls = tls
        self._on_messages = on_messages
        self._on_closed = on_closed
        self._channel = open_channel(
            endpoint,
            tls,
            max_message_bytes=max_message_bytes,
            extra_options=(
                ("grpc.initial_reconnect_backoff_ms", 100),
                ("grpc.min_reconnect_backoff_ms", 100),
                ("grpc.max_reconnect_backoff_ms", 1000),
            ),
        )
        self._stub: Any = client_pb2_grpc.WaltzServerServiceStub(self._channel)
        self._call: Any = None
        self._ready: deque[client_pb2.ClientMessages] = deque()
        self._batch = client_pb2.ClientMessages()
        self._batch_count = 0
        self._batch_bytes = 0
        self._batch_locks = 0
        # The next stream message's appends, by partition, in columns (docs/protocol.md
        # "Appends"): filled in when the message is sealed. A partition's open columns take its
        # appends until another message of that connection is queued after them.
        self._columns: list[_AppendColumns] = []
        self._open_columns: dict[int, _AppendColumns] = {}
        self._wake = asyncio.Event()
        self._late_wake: asyncio.TimerHandle | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False
        self.error: BaseException | None = None
        self.messages_sent = 0
        self.stream_messages_sent = 0

    def __repr__(self) -> str:
        return f"ServerConnection({self.endpoint}, seq {self.seq_num}{', closed' if self._closed else ''})"

    @property
    def closed(self) -> bool:
        """True once the stream ended, failed or was closed."""
        return self._closed

    async def open(self, timeout: float) -> None:
        """Connect and start the stream.

        Raises:
            ConnectionError: the server did not accept a connection within ``timeout`` seconds.
        """
        try:
            await asyncio.wait_for(self._channel.channel_ready(), timeout)
        except TimeoutError:
            await self._channel.close(None)
            self._closed = True
            hint = tls_hint(self._tls)
            raise ConnectionError(
                f"server {self.endpoint} did not accept a connection within {timeout:g}s"
                + (f"; {hint}" if hint else "")
            ) from None
        self._call = self._stub.Stream()
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._read(), name=f"waltz-read-{self.endpoint}"),
            loop.create_task(self._write(), name=f"waltz-write-{self.endpoint}"),
        ]

    # --- sending ----------------------------------------------------------------------------------

    def _seal(self) -> client_pb2.ClientMessages:
        """Take the stream message under construction (its append columns filled in) and start
        the next one."""
        batch = self._batch
        for columns in self._columns:
            columns.fill()
        self._columns = []
        self._open_columns = {}
        self._batch = client_pb2.ClientMessages()
        self._batch_count = 0
        self._batch_bytes = 0
        self._batch_locks = 0
        return batch

    def _count(self, data_bytes: int, linger: float = 0.0, locks: int = 0) -> None:
        """Count one more protocol message in the stream message under construction (sealing
        it first when full) and wake the writer as ``linger`` says."""
        full = (
            self._batch_count >= MAX_BATCH_MESSAGES
            or self._batch_bytes + data_bytes > MAX_BATCH_BYTES
            or self._batch_locks + locks > MAX_BATCH_LOCK_HASHES
        )
        if full and self._batch_count:
            self._ready.append(self._seal())
        self._batch_count += 1
        self._batch_bytes += data_bytes
        self._batch_locks += locks
        if not self._wake.is_set():
            if linger <= 0 or full:
                self._wake.set()
            elif self._late_wake is None:
                self._late_wake = asyncio.get_running_loop().call_later(linger, self._wake.set)

    def _cancel_late_wake(self) -> None:
        if self._late_wake is not None:
            self._late_wake.cancel()
            self._late_wake = None

    def send(self, message: client_pb2.ClientMessage) -> None:
        """Queue a protocol message (mount, unmount, flush, high-water mark) in order.

        Raises:
            ConnectionError: the connection is closed.
        """
        if self._closed:
            raise ConnectionError(f"the connection to {self.endpoint} is closed")
        self._count(0)
        self._open_columns.clear()  # later appends go after this message, as they were queued
        self._batch.messages.add().CopyFrom(message)

    def send_append(
        self,
        req_id: ReqId,
        payload: AppendPayload,
        linger: float = 0.0,
        traceparent: str = "",
        epoch: int = 0,
    ) -> None:
        """Queue an append request, written straight into the next stream message.

        Args:
            req_id: the append's ReqId.
            payload: what the attempt produced.
            linger: seconds the append may wait for something else to be sent with it, when the
                writer is idle (0: the writer wakes at once); anything queued without a linger,
                or a full stream message, wakes it sooner.
            traceparent: the W3C trace context of a traced transaction ("" when not traced;
                ``docs/protocol.md`` "Trace context").
            epoch: the partition epoch the append was routed by (``docs/protocol.md``
                "Partition epochs"): one per ``AppendRequests``, so an append of another epoch
                starts new columns.

        Raises:
            ConnectionError: the connection is closed.
        """
        if self._closed:
            raise ConnectionError(f"the connection to {self.endpoint} is closed")
        locks = len(payload.write_locks) + len(payload.read_locks) + len(payload.append_locks)
        self._count(len(payload.data), linger, locks)
        columns = self._open_columns.get(req_id.partition_id)
        if columns is None or not columns.takes(req_id, epoch):
            columns = _AppendColumns(self._batch.messages.add().appends, req_id, epoch)
            self._columns.append(columns)
            self._open_columns[req_id.partition_id] = columns
        columns.add(req_id.seq_num, payload)
        if traceparent:
            columns.trace(traceparent)

    async def _write(self) -> None:
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                self._cancel_late_wake()  # what waited for company leaves now
                while self._ready or self._batch_count:
                    batch = self._ready.popleft() if self._ready else self._seal()
                    self.messages_sent += len(batch.messages)
                    self.stream_messages_sent += 1
                    await self._call.write(batch)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._fail(exc)

    # --- receiving --------------------------------------------------------------------------------

    async def _read(self) -> None:
        try:
            while True:
                batch = await self._call.read()
                if batch is _EOF:
                    self._fail(ConnectionError(f"server {self.endpoint} ended the stream"))
                    return
                try:
                    self._on_messages(self, batch.messages)
                except Exception:
                    log.exception("handling messages from %s failed", self.endpoint)
        except asyncio.CancelledError:
            raise
        except grpc.aio.AioRpcError as exc:
            self._fail(
                ConnectionError(
                    f"stream to server {self.endpoint} failed: {exc.code().name}: {exc.details()}"
                )
            )
        except Exception as exc:
            self._fail(exc)

    def abort(self, error: BaseException) -> None:
        """Break the connection now, as a network failure would (``on_closed`` follows)."""
        self._fail(error)

    def _fail(self, error: BaseException | None) -> None:
        if self._closed:
            return
        self._closed = True
        self.error = error
        self._cancel_late_wake()
        if error is not None:
            log.info("connection %r lost: %s", self, error)
        for task in self._tasks:
            if task is not asyncio.current_task():
                task.cancel()
        if self._call is not None:
            self._call.cancel()
        try:
            self._on_closed(self, error)
        except Exception:
            log.exception("handling the loss of %r failed", self)

    # --- RPC --------------------------------------------------------------------------------------

    async def get_transaction_data_range(
        self, request: client_pb2.TransactionDataRangeRequest, timeout: float
    ) -> client_pb2.TransactionDataRangeResponse:
        """Call ``GetTransactionDataRange`` on this server.

        Raises:
            grpc.aio.AioRpcError: the call failed (server down, deadline exceeded, ...).
            ConnectionError: the connection was closed or lost before the call (a caller that
                waited for it may resume after a cut; its channel may be closed by then).
        """
        if self._closed:
            raise ConnectionError(f"connection to server {self.endpoint} is closed")
        response: client_pb2.TransactionDataRangeResponse = await self._stub.GetTransactionDataRange(
            request, timeout=timeout
        )
        return response

    async def close(self) -> None:
        """Close the stream and the channel. Idempotent; ``on_closed`` is not called for it."""
        self._cancel_late_wake()
        if not self._closed:
            self._closed = True
            if self._call is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self._call.done_writing(), 1.0)
                self._call.cancel()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []
        await self._channel.close(None)


class _AppendColumns:
    """The appends of one partition in one stream message, gathered in lists and written into
    their ``AppendRequests`` at once when the message is sealed (``docs/protocol.md`` "Appends").

    Args:
        message: the ``AppendRequests`` in the stream message (at the place of the first append).
        req_id: the first append's ReqId (the client ID, generation and partition of them all).
        epoch: the partition epoch they were all routed by.
    """

    __slots__ = (
        "append_counts",
        "append_hashes",
        "checksums",
        "data",
        "epoch",
        "headers",
        "marks",
        "message",
        "read_counts",
        "read_hashes",
        "req_id",
        "seq_nums",
        "traceparents",
        "write_counts",
        "write_hashes",
    )

    def __init__(self, message: client_pb2.AppendRequests, req_id: ReqId, epoch: int = 0) -> None:
        self.message = message
        self.req_id = req_id
        self.epoch = epoch
        self.seq_nums: list[int] = []
        self.marks: list[int] = []
        self.headers: list[int] = []
        self.data: list[bytes] = []
        self.checksums: list[int] = []
        self.write_counts: list[int] = []
        self.write_hashes: list[int] = []
        self.read_counts: list[int] = []
        self.read_hashes: list[int] = []
        self.append_counts: list[int] = []
        self.append_hashes: list[int] = []
        self.traceparents: list[tuple[int, str]] | None = None  # (row, traceparent) of traced rows

    def takes(self, req_id: ReqId, epoch: int = 0) -> bool:
        """Whether an append with ``req_id`` routed by ``epoch`` belongs here (same client ID,
        generation and epoch)."""
        first = self.req_id
        return (
            req_id.generation == first.generation
            and req_id.client_id == first.client_id
            and epoch == self.epoch
        )

    def add(self, seq_num: int, payload: AppendPayload) -> None:
        """Add an append as the next row."""
        self.seq_nums.append(seq_num)
        self.marks.append(payload.client_high_water_mark)
        self.headers.append(payload.header)
        self.data.append(payload.data)
        self.checksums.append(payload.checksum)
        write, read, append = payload.write_locks, payload.read_locks, payload.append_locks
        self.write_counts.append(len(write))
        if write:
            self.write_hashes += write
        self.read_counts.append(len(read))
        if read:
            self.read_hashes += read
        self.append_counts.append(len(append))
        if append:
            self.append_hashes += append

    def trace(self, traceparent: str) -> None:
        """Give the last row added its trace context (only traced rows are noted)."""
        row = len(self.seq_nums) - 1
        if self.traceparents is None:
            self.traceparents = [(row, traceparent)]
        else:
            self.traceparents.append((row, traceparent))

    def fill(self) -> None:
        """Write the rows into the message (lock counts only for kinds some row has)."""
        message = self.message
        req_id = self.req_id
        message.client_id = req_id.client_id
        message.generation = req_id.generation
        message.partition_id = req_id.partition_id
        if self.epoch:
            message.epoch = self.epoch
        message.seq_nums.extend(self.seq_nums)
        message.client_high_water_marks.extend(self.marks)
        message.headers.extend(self.headers)
        message.data.extend(self.data)
        message.checksums.extend(self.checksums)
        if self.write_hashes:
            message.write_lock_counts.extend(self.write_counts)
            message.write_lock_hashes.extend(self.write_hashes)
        if self.read_hashes:
            message.read_lock_counts.extend(self.read_counts)
            message.read_lock_hashes.extend(self.read_hashes)
        if self.append_hashes:
            message.append_lock_counts.extend(self.append_counts)
            message.append_lock_hashes.extend(self.append_hashes)
        if self.traceparents is not None:  # one per row, "" for rows not traced
            traceparents = [""] * len(self.seq_nums)
            for row, traceparent in self.traceparents:
                traceparents[row] = traceparent
            message.traceparents.extend(traceparents)
