"""Clients of the storage protocol and of the storage admin protocol.

Design: docs/design/storage.md "Storage requests", "Admin port".

:class:`StorageSessionClient` is the server side of a replica session: one ordered stream to one
storage node, requests pipelined and batched into stream messages, responses matched by sequence
number. :class:`StorageAdminClient` speaks the admin protocol; tools use it because it never takes
part in (or fences) a store session.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import re
from collections.abc import AsyncIterator, Callable, Sequence
from functools import partial
from typing import Any, Generic, Protocol, TypeVar

import grpc

from waltz.errors import ProtocolError, RecordsArchivedError, StorageRpcError
from waltz.protocol import storage_pb2
from waltz.protocol.channels import DEFAULT_MAX_MESSAGE_BYTES, TlsConfig, open_channel
from waltz.protocol.records import Record, RecordHeader, ReqId

__all__ = [
    "ColumnsRecord",
    "StorageAdminClient",
    "StorageSessionClient",
    "StorageStreamError",
    "append_request",
    "check_response",
    "columns_append",
    "frame_requests",
]

log = logging.getLogger(__name__)

#: Requests sent in one stream message at most.
MAX_BATCH = 500
#: Bytes of requests merged into one stream message at most (a larger request goes alone), so that
#: several queued append batches never add up past the channel's message size limit.
MAX_BATCH_BYTES = 4 << 20

#: The tag of ``StorageRequest.append`` (field 15, length-delimited) and of the repeated
#: ``requests`` field (1) of ``StorageRequests`` / ``AdminRequests``: protobuf's wire format.
_APPEND_TAG = b"\x7a"
_REQUESTS_TAG = b"\x0a"


class StorageStreamError(ConnectionError):
    """A stream to a storage node ended with a gRPC status (docs/design/storage.md "Storage requests").

    Attributes:
        status: the status the stream ended with (``PERMISSION_DENIED`` when the peer's role does
            not allow the request, ``UNAVAILABLE`` when the node went away, ...).
    """

    def __init__(self, message: str, status: grpc.StatusCode) -> None:
        super().__init__(message)
        self.status = status


def _varint(value: int) -> bytes:
    """Protobuf's base-128 varint of a non-negative integer."""
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def append_request(session_id: int, seq_num: int, partition_id: int, append: bytes) -> bytes:
    """A serialized ``StorageRequest`` whose body is the serialized ``AppendRequest`` ``append``."""
    head = storage_pb2.StorageRequest(
        session_id=session_id, seq_num=seq_num, partition_id=partition_id
    ).SerializeToString()
    # Protobuf fields may come in any order: the head's fields, then the append field.
    return b"".join((head, _APPEND_TAG, _varint(len(append)), append))


def frame_requests(requests: Sequence[bytes]) -> bytes:
    """A ``StorageRequests`` (or ``AdminRequests``) message from serialized requests, as bytes."""
    parts: list[bytes] = []
    for request in requests:
        parts += (_REQUESTS_TAG, _varint(len(request)), request)
    return b"".join(parts)


Req = TypeVar("Req", storage_pb2.StorageRequest, storage_pb2.AdminRequest)
Resp = TypeVar("Resp", storage_pb2.StorageResponse, storage_pb2.AdminResponse)


class _OrderedStream(Generic[Req, Resp]):
    """A bidirectional stream with pipelined requests matched to responses by sequence number."""

    def __init__(self, address: str, tls: TlsConfig | None, max_message_bytes: int, admin: bool) -> None:
        self.address = address
        self._channel = open_channel(address, tls, max_message_bytes=max_message_bytes)
        self._admin = admin
        self._outgoing: asyncio.Queue[bytes | None] = asyncio.Queue()  # serialized requests
        self._waiting: dict[int, asyncio.Future[Resp]] = {}
        self._seq = itertools.count()
        self._reader: asyncio.Task[None] | None = None
        self._call: Any = None
        self._error: BaseException | None = None
        self._closed = False
        self._failure_listeners: list[Callable[[BaseException], None]] = []

    def start(self) -> None:
        # The generated stub's method, with requests that are already bytes (see _requests).
        service = "StorageAdminService" if self._admin else "StorageService"
        method = storage_pb2.DESCRIPTOR.services_by_name[service].methods_by_name["Session"]
        responses: Any = storage_pb2.AdminResponses if self._admin else storage_pb2.StorageResponses
        session = self._channel.stream_stream(
            f"/{method.containing_service.full_name}/{method.name}",
            request_serializer=None,
            response_deserializer=responses.FromString,
        )
        self._call = session(self._requests())
        self._reader = asyncio.get_running_loop().create_task(self._read())

    async def open(self, request: Req, check: Callable[[Resp], object]) -> None:
        """Start the stream and send its open request (``seq_num`` set), ``check`` judging the
        answer (raising to refuse it). A refused, failed or cancelled open closes the stream before
        it raises: it leaves no call, channel or task behind (a stream is never restarted)."""
        self.start()
        try:
            check(await self.submit(request))
        except BaseException:
            await self.close()
            raise

    def next_seq(self) -> int:
        return next(self._seq)

    @property
    def broken(self) -> bool:
        """True once the stream failed or was closed."""
        return self._error is not None or self._closed

    @property
    def failure_listeners(self) -> int:
        """Listeners waiting for the stream's failure (for tests and metrics)."""
        return len(self._failure_listeners)

    async def _requests(self) -> AsyncIterator[bytes]:
        """The stream's messages: queued requests merged, at most MAX_BATCH and MAX_BATCH_BYTES
        (a larger request alone), framed as a serialized ``StorageRequests``/``AdminRequests``."""
        outgoing = self._outgoing
        held: bytes | None = None  # a request that did not fit in the previous message
        while True:
            first = held if held is not None else await outgoing.get()
            held = None
            if first is None:
                return
            batch = [first]
            size = len(first)
            end = False
            while len(batch) < MAX_BATCH and not outgoing.empty():
                item = outgoing.get_nowait()
                if item is None:
                    end = True
                    break
                if size + len(item) > MAX_BATCH_BYTES:
                    held = item
                    break
                batch.append(item)
                size += len(item)
            yield frame_requests(batch)
            if end:
                return

    async def _read(self) -> None:
        try:
            async for batch in self._call:
                for response in batch.responses:
                    future = self._waiting.pop(response.seq_num, None)
                    if future is not None and not future.done():
                        future.set_result(response)
            self._fail(ConnectionError(f"storage node {self.address} closed the stream"))
        except grpc.aio.AioRpcError as exc:
            self._fail(
                StorageStreamError(
                    f"stream to storage node {self.address} failed: {exc.code().name}: {exc.details()}",
                    exc.code(),
                )
            )
        except asyncio.CancelledError:
            self._fail(ConnectionError(f"stream to storage node {self.address} closed"))
            raise

    def _fail(self, exc: BaseException) -> None:
        self._error = exc
        waiting, self._waiting = self._waiting, {}
        for future in waiting.values():
            if not future.done():
                future.set_exception(exc)
        if self._closed:
            return  # closed here: nobody is told of its own close
        listeners, self._failure_listeners = self._failure_listeners, []
        for listener in listeners:
            try:
                listener(exc)
            except Exception:
                log.exception("a listener of the stream to %s failed", self.address)

    def on_failure(self, listener: Callable[[BaseException], None]) -> Callable[[], None]:
        """Call ``listener(error)`` once, on the event loop, when the stream fails (the peer
        closed it, or its RPC failed), not when it is closed here; at once (soon, on the loop)
        when it failed already.

        Returns:
            A function that removes the listener (idempotent; it also stops a call not made yet).
        """
        if self._closed:
            return lambda: None  # closed here: never a failure to tell
        if self._error is not None:
            return asyncio.get_running_loop().call_soon(listener, self._error).cancel
        self._failure_listeners.append(listener)

        def remove() -> None:
            with contextlib.suppress(ValueError):
                self._failure_listeners.remove(listener)

        return remove

    def submit(self, request: Req) -> asyncio.Future[Resp]:
        """Queue a request (its ``seq_num`` already set) and return the future of its response."""
        return self.submit_serialized(request.seq_num, request.SerializeToString())

    def submit_serialized(self, seq_num: int, request: bytes) -> asyncio.Future[Resp]:
        """:meth:`submit` for a request already serialized, whose sequence number is ``seq_num``."""
        if self._error is not None:
            raise self._error
        if self._closed:
            raise ConnectionError(f"stream to storage node {self.address} is closed")
        future: asyncio.Future[Resp] = asyncio.get_running_loop().create_future()
        self._waiting[seq_num] = future
        self._outgoing.put_nowait(request)
        return future

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._failure_listeners.clear()  # closed here: nobody is told
        self._outgoing.put_nowait(None)
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader
        if self._call is not None:
            self._call.cancel()
        await self._channel.close(None)


#: The body a storage node answers each storage request kind with, when it does not fail it
#: (docs/design/storage.md "Storage requests"; ``waltz/services/storage/service.py``).
_ANSWERS = {
    "open": "success",
    "open_session": "success",
    "last_session_info": "last_session_info",
    "max_transaction_id": "max_transaction_id",
    "truncate": "success",
    "set_low_water_mark": "success",
    "append": "success",
    "reset_start": "success",
    "record_header": "record_header",
    "record": "record",
    "record_header_list": "record_header_list",
    "record_list": "record_list",
}


class ColumnsRecord(Protocol):
    """What :func:`columns_append` reads of a record: a :class:`Record`, or any value with its
    fields (a server's store batch is built from its pending appends)."""

    @property
    def transaction_id(self) -> int: ...

    @property
    def req_id(self) -> ReqId: ...

    @property
    def header(self) -> int: ...

    @property
    def data(self) -> bytes: ...

    @property
    def checksum(self) -> int: ...


def columns_append(records: Sequence[ColumnsRecord]) -> bytes:
    """A serialized ``AppendRequest`` carrying consecutive ``records`` in columns (storage.proto
    ``RecordColumns``, the form of a server's store batch), for :meth:`StorageSessionClient.submit_append`.

    Raises:
        IndexError: ``records`` is empty (columns start at the first record's transaction ID).
    """
    message = storage_pb2.AppendRequest()
    columns = message.columns
    columns.first_transaction_id = records[0].transaction_id
    columns.client_ids.extend([r.req_id.client_id for r in records])
    columns.generations.extend([r.req_id.generation for r in records])
    columns.seq_nums.extend([r.req_id.seq_num for r in records])
    columns.headers.extend([r.header for r in records])
    columns.data.extend([r.data for r in records])
    columns.checksums.extend([r.checksum for r in records])
    return message.SerializeToString()


def _failure_code_name(code: int) -> str:
    """The name of a storage failure code; a code this version does not know is named, not raised.

    Protobuf enums are open: a newer (or broken) storage node can send any number.
    """
    try:
        return storage_pb2.FailureCode.Name(storage_pb2.FailureCode.ValueType(code))
    except ValueError:
        return f"UNKNOWN_FAILURE_CODE_{code}"


#: How a ``RECORDS_ARCHIVED`` failure's message names the replica's local start, and the
#: transaction asked for (docs/design/storage.md "Storage requests").
_LOCAL_START = re.compile(r"\blocal start (\d+)\b")
_TRANSACTION_BELOW = re.compile(r"\btransaction (\d+) is below\b")


def _records_archived(response: Any, message: str, peer: str) -> RecordsArchivedError:
    """The error of a ``RECORDS_ARCHIVED`` failure, with the local start its message names.

    Raises:
        ProtocolError: the message names no local start.
    """
    start = _LOCAL_START.search(message)
    if start is None:
        raise ProtocolError(
            f"storage node {peer} answered RECORDS_ARCHIVED without naming its local start: {message!r}"
        )
    transaction = _TRANSACTION_BELOW.search(message)
    return RecordsArchivedError(
        response.partition_id, -1 if transaction is None else int(transaction[1]), int(start[1])
    )


def check_response(response: Any, peer: str, request_kind: str | None = None) -> Any:
    """Return a storage or admin response, or raise what is wrong with it.

    Raises:
        RecordsArchivedError: a read below the replica's local start (``RECORDS_ARCHIVED``),
            carrying the local start (docs/design/archive.md, "Reads below the local start").
        StorageRpcError: the response is another failure (its code named even when unknown here).
        ProtocolError: its body does not answer ``request_kind`` (a storage request kind), or a
            ``RECORDS_ARCHIVED`` failure names no local start.
    """
    if response.HasField("failure"):
        exception = response.failure.exception
        if exception.code == storage_pb2.FailureCode.RECORDS_ARCHIVED:
            raise _records_archived(response, exception.message, peer)
        raise StorageRpcError(_failure_code_name(exception.code), exception.message)
    if request_kind is not None:
        expected = _ANSWERS.get(request_kind)
        kind = response.WhichOneof("body")
        if expected is not None and kind != expected:
            raise ProtocolError(
                f"storage node {peer} answered a {request_kind} request (seq {response.seq_num}) with "
                f"{kind or 'no body'}, not {expected}"
            )
    return response


class StorageSessionClient:
    """One replica session stream to a storage node, used by a store session.

    See docs/design/storage.md "Storage requests".

    Use as ``async with StorageSessionClient(address, cluster_key, num_partitions) as client``;
    :meth:`open` sends the open request. Every request method raises
    :class:`~waltz.errors.StorageRpcError` (with ``code``, e.g. ``"SESSION_FENCED"``) when the
    storage node answers with a failure (a read below the partition's local start:
    :class:`~waltz.errors.RecordsArchivedError`, which is one), and ``ConnectionError`` when the
    stream breaks.

    Args:
        address: ``host:port`` of the storage port.
        cluster_key: the cluster key (UUID text).
        num_partitions: the cluster's number of partitions.
        session_id: the store session ID sent with every partition request.
        tls: client TLS files, or None for plaintext.
    """

    def __init__(
        self,
        address: str,
        cluster_key: str,
        num_partitions: int,
        session_id: int = -1,
        *,
        tls: TlsConfig | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        self.cluster_key = cluster_key
        self.num_partitions = num_partitions
        self.session_id = session_id
        self._stream: _OrderedStream[storage_pb2.StorageRequest, storage_pb2.StorageResponse] = (
            _OrderedStream(address, tls, max_message_bytes, admin=False)
        )

    async def __aenter__(self) -> StorageSessionClient:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def open(self) -> None:
        """Start the stream and send the open request.

        A refused, failed or cancelled open closes the stream before it raises: it leaves no stream,
        channel or task behind (a stream is never restarted).

        Raises:
            StorageRpcError: e.g. ``CLUSTER_KEY_MISMATCH`` or ``NOT_INITIALIZED``.
        """
        opening = storage_pb2.OpenRequest(cluster_key=self.cluster_key, num_partitions=self.num_partitions)
        request = self._request(-1, -1, open=opening)
        await self._stream.open(request, partial(self._checked, request))

    async def close(self) -> None:
        """Close the stream and the channel. Idempotent."""
        await self._stream.close()

    @property
    def address(self) -> str:
        """``host:port`` of the storage node."""
        return self._stream.address

    @property
    def broken(self) -> bool:
        """True once the stream failed or was closed (every request then raises)."""
        return self._stream.broken

    def on_failure(self, listener: Callable[[BaseException], None]) -> Callable[[], None]:
        """Call ``listener(error)`` once when the stream fails (the storage node closed it, or the
        RPC failed: a node that stopped or restarted), not when it is closed here; soon, on the
        event loop, when it failed already. A store session learns so of a dead writer at once,
        not at its next request (docs/design/server.md "Store sessions").

        Returns:
            A function that removes the listener (idempotent; it also stops a call not made yet).
        """
        return self._stream.on_failure(listener)

    @property
    def failure_listeners(self) -> int:
        """Listeners waiting for the stream's failure (for tests and metrics)."""
        return self._stream.failure_listeners

    def _request(self, partition_id: int, session_id: int | None, **body: Any) -> storage_pb2.StorageRequest:
        return storage_pb2.StorageRequest(
            session_id=self.session_id if session_id is None else session_id,
            seq_num=self._stream.next_seq(),
            partition_id=partition_id,
            **body,
        )

    def submit(self, request: storage_pb2.StorageRequest) -> asyncio.Future[storage_pb2.StorageResponse]:
        """Pipeline a raw request; its ``seq_num`` is assigned here. Failures are not raised."""
        request.seq_num = self._stream.next_seq()
        return self._stream.submit(request)

    def submit_append(
        self, partition_id: int, append: bytes, *, session_id: int | None = None
    ) -> asyncio.Future[storage_pb2.StorageResponse]:
        """Pipeline an append whose ``AppendRequest`` is already serialized (one serialization
        serves every replica of a batch); returns the future of the response, failures not raised."""
        seq_num = self._stream.next_seq()
        session = self.session_id if session_id is None else session_id
        return self._stream.submit_serialized(seq_num, append_request(session, seq_num, partition_id, append))

    def _checked(
        self, request: storage_pb2.StorageRequest, response: storage_pb2.StorageResponse
    ) -> storage_pb2.StorageResponse:
        checked: storage_pb2.StorageResponse = check_response(
            response, self._stream.address, request.WhichOneof("body")
        )
        return checked

    async def _call(self, request: storage_pb2.StorageRequest) -> storage_pb2.StorageResponse:
        return self._checked(request, await self._stream.submit(request))

    async def open_session(self, partition_id: int, *, session_id: int | None = None) -> None:
        """Open the store session's replica session on a partition: raise its fence to the session.

        The request by which a store session takes a partition on this node before it reads its
        state (docs/design/storage.md "Fencing by store session ID"); reads never move a fence, and
        a read from a session above the fence is refused with ``SESSION_NOT_OPEN``.

        Raises:
            StorageRpcError: ``SESSION_FENCED`` (a newer session owns the partition),
                ``SESSION_JUMP_TOO_LARGE`` (the ID is too far above the fence), ...
        """
        request = self._request(partition_id, session_id, open_session=storage_pb2.OpenSessionRequest())
        await self._call(request)

    async def last_session_info(self, partition_id: int, *, session_id: int | None = None) -> tuple[int, int]:
        """Return ``(session ID, low-water mark)`` of the partition's last session."""
        response = await self._call(
            self._request(partition_id, session_id, last_session_info=storage_pb2.LastSessionInfoRequest())
        )
        info = response.last_session_info.session_info
        return info.session_id, info.low_water_mark

    async def max_transaction_id(self, partition_id: int, *, session_id: int | None = None) -> int:
        """Return the partition's max transaction ID on this node (-1: empty)."""
        response = await self._call(
            self._request(partition_id, session_id, max_transaction_id=storage_pb2.MaxTransactionIdRequest())
        )
        return response.max_transaction_id.transaction_id

    async def truncate(
        self, partition_id: int, transaction_id: int, *, session_id: int | None = None
    ) -> None:
        """Remove every record after ``transaction_id``."""
        await self._call(
            self._request(
                partition_id, session_id, truncate=storage_pb2.TruncateRequest(transaction_id=transaction_id)
            )
        )

    async def reset_start(
        self, partition_id: int, first_transaction_id: int, *, session_id: int | None = None
    ) -> None:
        """Discard every record of the partition and start its log at ``first_transaction_id``.

        A replica that cannot copy a gap (the replica it copies from holds nothing below its local
        start) starts after it; it takes the partition like a truncation (docs/design/archive.md,
        "Reads below the local start"). Durable when it returns.

        Raises:
            StorageRpcError: ``INVALID_REQUEST`` when ``first_transaction_id`` is not above the
                partition's max transaction ID + 1, and as any write.
        """
        await self._call(
            self._request(
                partition_id,
                session_id,
                reset_start=storage_pb2.ResetStartRequest(first_transaction_id=first_transaction_id),
            )
        )

    async def set_low_water_mark(
        self, partition_id: int, low_water_mark: int, *, session_id: int | None = None
    ) -> None:
        """Record the low-water mark of this session."""
        await self._call(
            self._request(
                partition_id,
                session_id,
                set_low_water_mark=storage_pb2.SetLowWaterMarkRequest(low_water_mark=low_water_mark),
            )
        )

    async def append(
        self, partition_id: int, records: Sequence[Record], *, session_id: int | None = None
    ) -> None:
        """Append records; returns once the storage node has flushed them."""
        await self._call(
            self._request(
                partition_id,
                session_id,
                append=storage_pb2.AppendRequest(records=[r.to_proto() for r in records]),
            )
        )

    async def record_header(
        self, partition_id: int, transaction_id: int, *, session_id: int | None = None
    ) -> RecordHeader | None:
        """Return a record header, or None when the transaction is not stored there."""
        response = await self._call(
            self._request(
                partition_id,
                session_id,
                record_header=storage_pb2.RecordHeaderRequest(transaction_id=transaction_id),
            )
        )
        body = response.record_header
        return RecordHeader.from_proto(body.record_header) if body.HasField("record_header") else None

    async def record(
        self, partition_id: int, transaction_id: int, *, session_id: int | None = None
    ) -> Record | None:
        """Return a record, or None when the transaction is not stored there."""
        response = await self._call(
            self._request(
                partition_id, session_id, record=storage_pb2.RecordRequest(transaction_id=transaction_id)
            )
        )
        return Record.from_proto(response.record.record) if response.record.HasField("record") else None

    async def record_headers(
        self, partition_id: int, transaction_id: int, max_records: int, *, session_id: int | None = None
    ) -> list[RecordHeader]:
        """Return up to ``max_records`` record headers from ``transaction_id`` on."""
        response = await self._call(
            self._request(
                partition_id,
                session_id,
                record_header_list=storage_pb2.RecordHeaderListRequest(
                    transaction_id=transaction_id, max_records=max_records
                ),
            )
        )
        return [RecordHeader.from_proto(h) for h in response.record_header_list.record_headers]

    async def records(
        self, partition_id: int, transaction_id: int, max_records: int, *, session_id: int | None = None
    ) -> list[Record]:
        """Return up to ``max_records`` records from ``transaction_id`` on (size-bounded)."""
        response = await self._call(
            self._request(
                partition_id,
                session_id,
                record_list=storage_pb2.RecordListRequest(
                    transaction_id=transaction_id, max_records=max_records
                ),
            )
        )
        return [Record.from_proto(r) for r in response.record_list.records]


class StorageAdminClient:
    """An admin stream to a storage node (docs/design/storage.md "Admin port").

    Use as ``async with StorageAdminClient(address, cluster_key, num_partitions) as admin``; the
    admin open initialises a new storage node for the cluster, unless ``initialise`` is False (a
    tool that only reads: the open of a node without a control file then fails with
    ``NOT_INITIALIZED`` and leaves it as it is). Failures raise
    :class:`~waltz.errors.StorageRpcError`.
    """

    def __init__(
        self,
        address: str,
        cluster_key: str,
        num_partitions: int,
        *,
        tls: TlsConfig | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        initialise: bool = True,
    ) -> None:
        self.cluster_key = cluster_key
        self.num_partitions = num_partitions
        self.initialise = initialise
        self._stream: _OrderedStream[storage_pb2.AdminRequest, storage_pb2.AdminResponse] = _OrderedStream(
            address, tls, max_message_bytes, admin=True
        )

    async def __aenter__(self) -> StorageAdminClient:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def open(self) -> None:
        """Start the stream and send the admin open request.

        A refused, failed or cancelled open closes the stream before it raises: it leaves no stream,
        channel or task behind (a stream is never restarted).

        Raises:
            StorageRpcError: e.g. ``CLUSTER_KEY_MISMATCH`` or ``NOT_INITIALIZED``.
        """
        opening = storage_pb2.AdminOpenRequest(
            cluster_key=self.cluster_key,
            num_partitions=self.num_partitions,
            existing_only=not self.initialise,
        )
        request = self._request(-1, open=opening)
        await self._stream.open(request, self._checked)

    async def close(self) -> None:
        """Close the stream. Idempotent."""
        await self._stream.close()

    def _request(self, partition_id: int, **body: Any) -> storage_pb2.AdminRequest:
        return storage_pb2.AdminRequest(seq_num=self._stream.next_seq(), partition_id=partition_id, **body)

    def _checked(self, response: storage_pb2.AdminResponse) -> storage_pb2.AdminResponse:
        checked: storage_pb2.AdminResponse = check_response(response, self._stream.address)
        return checked

    async def _call(self, partition_id: int, **body: Any) -> storage_pb2.AdminResponse:
        return self._checked(await self._stream.submit(self._request(partition_id, **body)))

    async def assign_partition(
        self,
        partition_id: int,
        assigned: bool,
        *,
        delete_storage_files: bool = False,
        first_transaction_id: int = 0,
    ) -> None:
        """Create (assigned) or remove the partition on the node.

        Args:
            partition_id: the partition.
            assigned: create it (True) or remove it.
            delete_storage_files: on removal, delete its files too.
            first_transaction_id: on creation, start its log at this transaction (a cluster
                restored from its archive: docs/design/archive.md, "Restoring a cluster from the
                archive"); refused with ``INVALID_REQUEST`` for a partition that exists.
        """
        await self._call(
            partition_id,
            partition_assignment=storage_pb2.PartitionAssignmentRequest(
                toggled=assigned,
                delete_storage_files=delete_storage_files,
                first_transaction_id=first_transaction_id,
            ),
        )

    async def set_readable(self, partition_id: int, readable: bool) -> None:
        """Switch reads of the partition on or off."""
        await self._call(
            partition_id, partition_read=storage_pb2.PartitionAvailabilityRequest(toggled=readable)
        )

    async def set_writable(self, partition_id: int, writable: bool) -> None:
        """Switch writes to the partition on or off."""
        await self._call(
            partition_id, partition_write=storage_pb2.PartitionAvailabilityRequest(toggled=writable)
        )

    async def records(self, partition_id: int, transaction_id: int, max_records: int) -> list[Record]:
        """Read records without taking part in a store session."""
        response = await self._call(
            partition_id,
            record_list=storage_pb2.RecordListRequest(transaction_id=transaction_id, max_records=max_records),
        )
        return [Record.from_proto(r) for r in response.record_list.records]

    async def last_session_info(self, partition_id: int) -> tuple[int, int]:
        """Return ``(session ID, low-water mark)`` of the partition's last session."""
        response = await self._call(partition_id, last_session_info=storage_pb2.LastSessionInfoRequest())
        info = response.last_session_info.session_info
        return info.session_id, info.low_water_mark

    async def max_transaction_id(self, partition_id: int) -> int:
        """Return the partition's max transaction ID on the node."""
        response = await self._call(partition_id, max_transaction_id=storage_pb2.MaxTransactionIdRequest())
        return response.max_transaction_id.transaction_id

    async def metrics(self) -> dict[str, float]:
        """Return the node's metric samples."""
        response = await self._call(-1, metrics=storage_pb2.MetricsRequest())
        return dict(response.metrics.values)

    async def set_fence(
        self,
        partition_id: int,
        session_id: int,
        *,
        operator: str = "",
        reason: str = "",
        expected_fence: int | None = None,
    ) -> storage_pb2.SetFenceResponse:
        """Set a partition's fence to ``session_id``, lower or higher (docs/design/storage.md
        "Admin port"); the node logs who asked, from where, the old and new fence, and why.

        Args:
            partition_id: the partition.
            session_id: the new fence, at least -1.
            operator: who asks (logged as stated).
            reason: why (logged).
            expected_fence: change it only if the fence is this now (else ``INVALID_REQUEST``).

        Returns:
            The fence and last session ID before and after.
        """
        response = await self._call(
            partition_id,
            set_fence=storage_pb2.SetFenceRequest(
                session_id=session_id, operator=operator, reason=reason, expected_fence=expected_fence
            ),
        )
        return response.set_fence

    async def truncate_below_committed(
        self, partition_id: int, transaction_id: int, *, operator: str = "", reason: str = ""
    ) -> storage_pb2.TruncateBelowCommittedResponse:
        """Remove every record after ``transaction_id``, below the committed transactions if need
        be, and lower the partition's low-water mark to it (docs/design/storage.md, "The committed
        floor"); the node logs who asked, from where, with which certificate, and why.

        Args:
            partition_id: the partition.
            transaction_id: the last transaction kept (-1: none).
            operator: who asks (logged as stated).
            reason: why (logged).

        Returns:
            The max transaction ID and the low-water mark before and after.

        Raises:
            StorageStreamError: ``PERMISSION_DENIED`` without an ``admin`` certificate over mutual
                TLS (the stream ends).
            StorageRpcError: ``INVALID_REQUEST`` below the local start - 1 (or from a node that
                does not know the request), ``PARTITION_NOT_ASSIGNED``, ...
        """
        response = await self._call(
            partition_id,
            truncate_below_committed=storage_pb2.TruncateBelowCommittedRequest(
                transaction_id=transaction_id, operator=operator, reason=reason
            ),
        )
        return response.truncate_below_committed

    async def set_archived_through(
        self, partition_id: int, transaction_id: int, *, archive: str = "", operator: str = ""
    ) -> None:
        """Tell the node what the archive holds of a partition, lower or higher than before.

        The node keeps it in the partition's retention file; its retention policy may then delete
        segments at or below it (docs/design/archive.md, "Retention on the storage nodes"). It logs
        an audit line; with mutual TLS it needs the ``admin`` role.

        Args:
            partition_id: the partition.
            transaction_id: every transaction up to it is archived and verified (-1: none).
            archive: the archive's location (for the node's log and status).
            operator: who asks (logged as stated).

        Raises:
            StorageRpcError: ``INVALID_REQUEST`` for a value below -1, ``PARTITION_NOT_ASSIGNED``, ...
        """
        await self._call(
            partition_id,
            set_archived_through=storage_pb2.SetArchivedThroughRequest(
                transaction_id=transaction_id, archive=archive, operator=operator
            ),
        )

    async def grow_partitions(self, num_partitions: int, *, operator: str = "") -> tuple[int, int]:
        """Grow the node's partition count to ``num_partitions`` (docs/design/storage.md,
        "Partition count"): every partition kept, the new ones unassigned. The node logs an audit
        line when it grew; with mutual TLS it needs the ``admin`` role.

        Args:
            num_partitions: the node's count (nothing changes) or a whole multiple of it.
            operator: who asks (logged as stated).

        Returns:
            The node's count before and now.

        Raises:
            StorageRpcError: ``INVALID_REQUEST`` for a lower count or one that is not a whole
                multiple of the node's (the node is left as it was).
            StorageStreamError: ``PERMISSION_DENIED`` without the ``admin`` role over mutual TLS.
        """
        request = storage_pb2.GrowPartitionsRequest(num_partitions=num_partitions, operator=operator)
        grown = (await self._call(-1, grow_partitions=request)).grow_partitions
        return grown.previous_num_partitions, grown.num_partitions

    async def partition_status(self, partition_id: int = -1) -> storage_pb2.PartitionStatusResponse:
        """Return the state of one partition, or of every assigned partition (-1)."""
        response = await self._call(partition_id, partition_status=storage_pb2.PartitionStatusRequest())
        return response.partition_status
