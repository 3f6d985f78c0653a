"""The storage protocol's gRPC service of a storage node: store session streams.

Design: docs/design/storage.md "Storage requests", "Fencing by store session ID", "Group commit
and I/O threads"; docs/design/archive.md, "Reads below the local start" (``RECORDS_ARCHIVED``
and reset start). A store session stream carries the replica sessions of one or more partitions;
each partition's requests on it are answered in order, partitions concurrently. Consecutive
append requests already received for the same partition and session are written with one flush
(group commit). The admin port's service is :mod:`~waltz.services.storage.admin_service`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
import traceback
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass
from itertools import chain
from typing import Final

import grpc

from waltz.errors import (
    ClusterKeyMismatchError,
    CorruptDataError,
    DiskFullError,
    MessageTooLargeError,
    PartitionNotAssignedError,
    PartitionUnavailableError,
    ProtocolError,
    RecordsArchivedError,
    SessionFencedError,
    SessionJumpTooLargeError,
    SessionNotOpenError,
    StorageNotInitializedError,
)
from waltz.protocol import storage_pb2, storage_pb2_grpc
from waltz.protocol.roles import STORE_SESSION_ROLES, authorize
from waltz.services.storage import format as fmt
from waltz.services.storage.metrics import StorageMetrics
from waltz.services.storage.node import StorageNode
from waltz.services.storage.storage_partition import StoragePartition

__all__ = ["StorageServicer", "failure_for", "last_session_info", "outcome_label"]

log = logging.getLogger(__name__)

FailureCode = storage_pb2.FailureCode

#: Records combined into one group-commit write at most.
MAX_GROUP_RECORDS: Final = 20_000
#: Requests queued per partition lane of a stream, and answers per stream, before the stream stops
#: reading (back pressure: gRPC flow control then slows the server down).
STREAM_QUEUE_SIZE: Final = 1024

#: Partitions served concurrently on one stream at most (a lane each); requests naming further
#: partitions are answered one at a time by the stream's dispatcher.
MAX_LANES: Final = 4096
#: Small responses (acknowledgements) merged into one stream message at most.
MAX_MERGED_RESPONSES: Final = 1000
#: Records one read request returns at most, whatever it asks for.
MAX_RECORDS_PER_READ: Final = 10_000
#: Request kinds whose responses may be large (records): never merged with others.
_LARGE: Final = frozenset({"record", "record_list", "record_header_list"})
#: Request kinds by which a store session may take a partition (raise its fence): the explicit
#: open-session request and the writes (a reset start is one). Reads never move a fence
#: (docs/design/storage.md "Fencing by store session ID").
_OPENS_SESSION: Final = frozenset({"open_session", "truncate", "set_low_water_mark", "append", "reset_start"})

#: Failures a storage request may routinely meet (or that the partition logs itself): not logged.
_QUIET_FAILURES: Final = (
    SessionFencedError,
    SessionNotOpenError,
    SessionJumpTooLargeError,
    PartitionNotAssignedError,
    RecordsArchivedError,  # a reader below the local start: it reads the archive instead
)

_END: Final = object()


#: An absolute path in a message: all but its last two components go (``0/00000000.seg`` stays,
#: which names the partition and the file without the node's directory layout).
_ABSOLUTE_PATH = re.compile(r"(?<![\w./:])/(?:[^\s:'\"/]+/)*([^\s:'\"/]+/[^\s:'\"/]+)")


def _without_paths(message: str) -> str:
    """``message`` with every absolute path shortened to its last two components."""
    return _ABSOLUTE_PATH.sub(r"\1", message)


def last_session_info(partition: StoragePartition) -> storage_pb2.LastSessionInfoResponse:
    """The answer to a last-session-info request, of the storage and the admin service alike
    (docs/design/storage.md, "Storage requests")."""
    info = partition.last_session_info()
    return storage_pb2.LastSessionInfoResponse(
        session_info=storage_pb2.SessionInfo(session_id=info.session_id, low_water_mark=info.low_water_mark)
    )


def failure_for(exc: BaseException) -> storage_pb2.FailureResponse:
    """Build a failure response (docs/design/storage.md "Storage requests") for an exception."""
    code: storage_pb2.FailureCode.ValueType
    if isinstance(exc, RecordsArchivedError):
        code = FailureCode.RECORDS_ARCHIVED
    elif isinstance(exc, SessionFencedError):
        code = FailureCode.SESSION_FENCED
    elif isinstance(exc, SessionNotOpenError):
        code = FailureCode.SESSION_NOT_OPEN
    elif isinstance(exc, SessionJumpTooLargeError):
        code = FailureCode.SESSION_JUMP_TOO_LARGE
    elif isinstance(exc, ClusterKeyMismatchError):
        code = FailureCode.CLUSTER_KEY_MISMATCH
    elif isinstance(exc, StorageNotInitializedError):
        code = FailureCode.NOT_INITIALIZED
    elif isinstance(exc, PartitionNotAssignedError):
        code = FailureCode.PARTITION_NOT_ASSIGNED
    elif isinstance(exc, PartitionUnavailableError):
        code = FailureCode.PARTITION_NOT_WRITABLE if exc.for_writes else FailureCode.PARTITION_NOT_READABLE
    elif isinstance(exc, CorruptDataError):
        code = FailureCode.CORRUPT_DATA
    elif isinstance(exc, DiskFullError):
        code = FailureCode.DISK_FULL
    elif isinstance(exc, MessageTooLargeError):
        code = FailureCode.MESSAGE_TOO_LARGE
    elif isinstance(exc, ProtocolError):
        code = FailureCode.INVALID_REQUEST
    else:
        code = FailureCode.INTERNAL
    frames = traceback.extract_tb(exc.__traceback__)
    return storage_pb2.FailureResponse(
        exception=storage_pb2.StorageRpcException(
            message=_without_paths(f"{type(exc).__name__}: {exc}"),
            code=code,
            stack_trace=[
                storage_pb2.StackTraceElement(
                    class_name=type(exc).__name__,
                    method_name=frame.name,
                    file_name=os.path.basename(frame.filename),  # no paths of this host
                    line_number=frame.lineno or 0,
                )
                for frame in frames
            ],
        )
    )


def outcome_label(response_failure: storage_pb2.FailureResponse | None) -> str:
    """The ``outcome`` label of ``waltz_storage_requests``: ``ok``, or the failure code's name."""
    if response_failure is None:
        return "ok"
    return storage_pb2.FailureCode.Name(response_failure.exception.code)


class StorageServicer(storage_pb2_grpc.StorageServiceServicer):
    """The storage protocol: store session streams, each carrying one or more partitions.

    See docs/design/storage.md "Storage requests".

    Args:
        node: the storage node.
        metrics: the node's metrics.
        max_response_bytes: size budget of a record list response (at least one record is sent).
    """

    def __init__(self, node: StorageNode, metrics: StorageMetrics, max_response_bytes: int) -> None:
        self._node = node
        self._metrics = metrics
        self._max_response_bytes = max_response_bytes

    async def Session(  # noqa: N802 - gRPC method name
        self,
        request_iterator: AsyncIterator[storage_pb2.StorageRequests],
        context: grpc.aio.ServicerContext[storage_pb2.StorageRequests, storage_pb2.StorageResponses],
    ) -> AsyncIterator[storage_pb2.StorageResponses]:
        """Serve one store session stream: an open request, then partition requests.

        A server may carry the replica sessions of several partitions on one stream
        (docs/design/storage.md "Storage requests": the open request opens the connection; every
        other request names its partition and session). Each partition's requests are served in
        the order they came, on a lane of their own, so that one partition's flush never waits for
        another's; responses carry the request's sequence number and may come back in another
        order across partitions.
        """
        await authorize(context, STORE_SESSION_ROLES, "a store session", request_iterator)
        outgoing: asyncio.Queue[object] = asyncio.Queue(maxsize=STREAM_QUEUE_SIZE)
        dispatcher = asyncio.create_task(self._dispatch(request_iterator, outgoing, context.peer()))
        try:
            item = await outgoing.get()
            while item is not _END:
                if isinstance(item, _StreamFailed):
                    # Something the peer sent could not be read (bytes that do not parse): say so.
                    await context.abort(
                        grpc.StatusCode.INVALID_ARGUMENT, f"unreadable request stream: {item}"
                    )
                assert isinstance(item, _Answer)
                responses = item.responses
                following: object = None
                if item.small:
                    # Merge the small answers already waiting (appends' acknowledgements, mostly):
                    # one stream message for many partitions.
                    responses = list(responses)
                    while len(responses) < MAX_MERGED_RESPONSES and not outgoing.empty():
                        following = outgoing.get_nowait()
                        if not (isinstance(following, _Answer) and following.small):
                            break
                        responses.extend(following.responses)
                        following = None
                yield storage_pb2.StorageResponses(responses=responses)
                item = following if following is not None else await outgoing.get()
        finally:
            dispatcher.cancel()

    async def _dispatch(
        self,
        request_iterator: AsyncIterator[storage_pb2.StorageRequests],
        outgoing: asyncio.Queue[object],
        peer: str,
    ) -> None:
        """Read a stream's requests and route them: the open request is answered here, the others
        go to their partition's lane. Ends ``outgoing`` with ``_END``, or ``_StreamFailed`` when
        the peer's messages could not be read (after every lane has answered what it received)."""
        lanes: dict[int, _Lane] = {}
        stream = object()  # this stream, as the source of its appends (StorageNode.run)
        opened = False
        end: object = _END
        iterator = request_iterator.__aiter__()
        try:
            while True:
                try:
                    batch = await iterator.__anext__()
                except StopAsyncIteration:
                    break
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # the peer went away or sent something gRPC could not parse
                    log.info("request stream from %s ended: %s", peer, exc)
                    end = _StreamFailed(f"{type(exc).__name__}: {exc}")
                    break
                for item in batch.requests:
                    kind = item.WhichOneof("body")
                    if kind == "open":
                        response = await self._open(item, peer)
                        opened = opened or not response.HasField("failure")
                        await outgoing.put(_Answer([response], True))
                        continue
                    if not opened:
                        refusal = ProtocolError(
                            "the stream is not open: send an open request with the cluster key first"
                        )
                        failure = failure_for(refusal)
                        failure.exception.code = FailureCode.NOT_OPEN
                        await outgoing.put(_Answer([_response(item, failure=failure)], True))
                        continue
                    lane = lanes.get(item.partition_id)
                    if lane is None:
                        try:
                            self._node.partition(item.partition_id)
                        except Exception as exc:
                            # Not a partition served here: answered at once, no lane for it.
                            self._metrics.requests.labels(
                                kind or "unknown", outcome_label(failure_for(exc))
                            ).inc()
                            await outgoing.put(_Answer([_response(item, failure=failure_for(exc))], True))
                            continue
                        if len(lanes) >= MAX_LANES:
                            # A peer naming ever more partitions: answer the rest in turn, here.
                            await outgoing.put(_Answer([await self._handle(item, kind)], kind not in _LARGE))
                            continue
                        queue: asyncio.Queue[object] = asyncio.Queue(maxsize=STREAM_QUEUE_SIZE)
                        lane = _Lane(queue, asyncio.create_task(self._serve_lane(queue, outgoing, stream)))
                        lanes[item.partition_id] = lane
                    await lane.requests.put(item)
            for lane in lanes.values():
                await lane.requests.put(_END)
            await asyncio.gather(*(lane.task for lane in lanes.values()))
            await outgoing.put(end)
        except asyncio.CancelledError:
            for lane in lanes.values():
                lane.task.cancel()
            raise
        except Exception as exc:  # a bug of ours: end the stream with a clear reason, never hang it
            log.exception("store session stream from %s failed", peer)
            for lane in lanes.values():
                lane.task.cancel()
            await outgoing.put(_StreamFailed(f"{type(exc).__name__}: {exc}"))

    async def _serve_lane(
        self, requests: asyncio.Queue[object], outgoing: asyncio.Queue[object], stream: object
    ) -> None:
        """Serve one partition's requests of a stream in order; consecutive appends of one
        session already received are written with one flush (group commit)."""
        try:
            await self._serve_requests(requests, outgoing, stream)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug of ours: end the stream with a clear reason, never hang it
            log.exception("a store session stream's partition lane failed")
            await outgoing.put(_StreamFailed(f"{type(exc).__name__}: {exc}"))

    async def _serve_requests(
        self, requests: asyncio.Queue[object], outgoing: asyncio.Queue[object], stream: object
    ) -> None:
        held: object = None
        while True:
            item = held if held is not None else await requests.get()
            held = None
            if item is _END:
                return
            assert isinstance(item, storage_pb2.StorageRequest)
            kind = item.WhichOneof("body")
            if kind == "append":
                group = [item]
                count = _record_count(item)
                while count < MAX_GROUP_RECORDS and not requests.empty():
                    following = requests.get_nowait()
                    if (
                        isinstance(following, storage_pb2.StorageRequest)
                        and following.WhichOneof("body") == "append"
                        and following.session_id == item.session_id
                    ):
                        group.append(following)
                        count += _record_count(following)
                    else:
                        held = following
                        break
                await outgoing.put(_Answer(await self._append_group(group, stream), True))
            else:
                await outgoing.put(_Answer([await self._handle(item, kind)], kind not in _LARGE))

    async def _open(self, request: storage_pb2.StorageRequest, peer: str) -> storage_pb2.StorageResponse:
        try:
            self._node.check_open(request.open.cluster_key, request.open.num_partitions)
        except Exception as exc:
            log.warning("refused an open request from %s: %s", peer, exc)
            failure = failure_for(exc)
            self._metrics.requests.labels("open", outcome_label(failure)).inc()
            return _response(request, failure=failure)
        self._metrics.requests.labels("open", "ok").inc()
        return _response(request, success=storage_pb2.SuccessResponse())

    async def _append_group(
        self, group: list[storage_pb2.StorageRequest], stream: object
    ) -> list[storage_pb2.StorageResponse]:
        """Write consecutive appends of one partition and session with one flush (``stream``: the
        stream they came on, the node's rule for appends on the event loop)."""
        first = group[0]
        partition_id = first.partition_id
        try:
            partition = self._node.partition(partition_id)
        except Exception as exc:
            failure = failure_for(exc)
            self._metrics.requests.labels("append", outcome_label(failure)).inc(len(group))
            return [_response(request, failure=failure) for request in group]

        def work() -> None:
            partition.check_session(first.session_id, opens=True)
            self._append(partition, chain.from_iterable(_rows(request) for request in group))

        try:
            await self._node.run(
                partition_id, work, append_bytes=sum(r.ByteSize() for r in group), source=stream
            )
        except Exception:
            if len(group) == 1:
                return [await self._handle(first, "append")]
            # Answer each request on its own so that each gets its own precise outcome.
            return [await self._handle(request, "append") for request in group]
        self._metrics.appends_ok.inc(len(group))
        return [_response(request, success=storage_pb2.SuccessResponse()) for request in group]

    def _append(self, partition: StoragePartition, rows: Iterable[fmt.WireRow]) -> None:
        started = time.perf_counter()
        before = partition.max_transaction_id
        data_bytes = partition.append_rows(rows)
        self._metrics.append_seconds.observe(time.perf_counter() - started)
        metrics = self._metrics.partition_appends(partition.partition_id)
        metrics.flushes.inc()
        metrics.records.inc(partition.max_transaction_id - before)
        metrics.data_bytes.inc(data_bytes)
        metrics.max_transaction_id.set(partition.max_transaction_id)

    async def _handle(
        self, request: storage_pb2.StorageRequest, kind: str | None
    ) -> storage_pb2.StorageResponse:
        try:
            partition = self._node.partition(request.partition_id)
            response = await self._node.run(
                request.partition_id, lambda: self._serve(partition, request, kind)
            )
        except Exception as exc:
            # Fencing refusals are routine (or logged by the partition); other failures are not.
            if not isinstance(exc, _QUIET_FAILURES):
                log.warning("partition %d: %s request failed: %s", request.partition_id, kind, exc)
            response = _response(request, failure=failure_for(exc))
        self._metrics.requests.labels(
            kind or "unknown", outcome_label(response.failure if response.HasField("failure") else None)
        ).inc()
        return response

    def _serve(
        self, partition: StoragePartition, request: storage_pb2.StorageRequest, kind: str | None
    ) -> storage_pb2.StorageResponse:
        """Serve one partition request on the partition's I/O thread."""
        fence = partition.current_session_id
        if fence < request.session_id <= fence + partition.max_fence_jump:
            # A session taking the partition with a request below the committed floor is refused
            # before its fence moves (docs/design/storage.md, "The committed floor").
            if kind == "truncate":
                partition.check_truncation(request.truncate.transaction_id)
            elif kind == "set_low_water_mark":
                partition.check_low_water_mark(request.session_id, request.set_low_water_mark.low_water_mark)
            elif kind == "reset_start":
                partition.check_reset_start(request.reset_start.first_transaction_id)
        partition.check_session(request.session_id, opens=kind in _OPENS_SESSION)
        if kind == "open_session":
            return _response(request, success=storage_pb2.SuccessResponse())
        if kind == "last_session_info":
            return _response(request, last_session_info=last_session_info(partition))
        if kind == "max_transaction_id":
            return _response(
                request,
                max_transaction_id=storage_pb2.MaxTransactionIdResponse(
                    transaction_id=partition.max_transaction_id
                ),
            )
        if kind == "truncate":
            partition.truncate(request.truncate.transaction_id)
            self._metrics.max_transaction_id.labels(str(partition.partition_id)).set(
                partition.max_transaction_id
            )
            return _response(request, success=storage_pb2.SuccessResponse())
        if kind == "reset_start":
            partition.reset_start(request.reset_start.first_transaction_id)
            self._metrics.max_transaction_id.labels(str(partition.partition_id)).set(
                partition.max_transaction_id
            )
            self._metrics.set_retention_state(
                partition.partition_id, partition.local_start, partition.archived_through
            )
            return _response(request, success=storage_pb2.SuccessResponse())
        if kind == "set_low_water_mark":
            partition.set_low_water_mark(request.session_id, request.set_low_water_mark.low_water_mark)
            return _response(request, success=storage_pb2.SuccessResponse())
        if kind == "append":
            self._append(partition, _rows(request))
            return _response(request, success=storage_pb2.SuccessResponse())
        if kind == "record_header":
            record = partition.read_record(request.record_header.transaction_id)
            body = storage_pb2.RecordHeaderResponse()
            if record is not None:
                body.record_header.CopyFrom(record.record_header.to_proto())
            return _response(request, record_header=body)
        if kind == "record":
            record = partition.read_record(request.record.transaction_id)
            record_body = storage_pb2.RecordResponse()
            if record is not None:
                record_body.record.CopyFrom(record.to_proto())
            return _response(request, record=record_body)
        if kind == "record_header_list":
            max_records = _positive(request.record_header_list.max_records)
            records = partition.read_records(
                request.record_header_list.transaction_id, max_records, self._max_response_bytes * 16
            )
            return _response(
                request,
                record_header_list=storage_pb2.RecordHeaderListResponse(
                    record_headers=[r.record_header.to_proto() for r in records]
                ),
            )
        if kind == "record_list":
            return _response(request, record_list=self.record_list(partition, request.record_list))
        raise ProtocolError(f"unknown storage request {kind!r}")

    def record_list(
        self, partition: StoragePartition, request: storage_pb2.RecordListRequest
    ) -> storage_pb2.RecordListResponse:
        """Read a record list within the response size budget."""
        records = partition.read_records(
            request.transaction_id, _positive(request.max_records), self._max_response_bytes
        )
        return storage_pb2.RecordListResponse(records=[r.to_proto() for r in records])


def _positive(max_records: int) -> int:
    """A request's record count, at most :data:`MAX_RECORDS_PER_READ` (a read answers "up to"
    that many: the reader asks again from where the answer ended).

    Raises:
        ProtocolError: not positive.
    """
    if max_records <= 0:
        raise ProtocolError(f"max number of records must be positive, got {max_records}")
    return min(max_records, MAX_RECORDS_PER_READ)


def _rows(request: storage_pb2.StorageRequest) -> Iterator[fmt.WireRow]:
    """The records of an append request, in columns or as messages (``AppendRequest``)."""
    append = request.append
    if append.HasField("columns"):
        return fmt.column_rows(append.columns, request.partition_id)
    return fmt.wire_rows(append.records)


def _record_count(request: storage_pb2.StorageRequest) -> int:
    """The number of records an append request carries, in either form."""
    append = request.append
    if append.HasField("columns"):
        return len(append.columns.seq_nums)
    return len(append.records)


def _response(request: storage_pb2.StorageRequest, **body: object) -> storage_pb2.StorageResponse:
    return storage_pb2.StorageResponse(
        session_id=request.session_id,
        seq_num=request.seq_num,
        partition_id=request.partition_id,
        **body,  # type: ignore[arg-type]
    )


@dataclass(frozen=True, slots=True)
class _Lane:
    """One partition's requests on a stream, and the task that serves them in order."""

    requests: asyncio.Queue[object]
    task: asyncio.Task[None]


@dataclass(frozen=True, slots=True)
class _Answer:
    """Responses to put on a stream; ``small`` ones may share a stream message with others."""

    responses: list[storage_pb2.StorageResponse]
    small: bool


@dataclass(frozen=True, slots=True)
class _StreamFailed:
    """The end of a request stream that failed (the peer sent bytes that do not parse, ...)."""

    reason: str
