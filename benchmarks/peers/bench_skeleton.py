"""The machine's limit for this design in CPython: a skeleton of waltz-py's data path.

How fast can *any* Python implementation of a quorum-replicated log with optimistic locking go on
this machine, with waltz-py's process topology and the benchmark's workload? The skeleton keeps
only what the design cannot do without, each piece as cheap as Python allows, and the same load
generator (``waltz/perf/loadgen.py``) drives it:

- one client (this process: the load generator's thread and an asyncio thread), one server process
  and three storage processes; every hop a ``grpc.aio`` bidirectional stream on loopback carrying
  raw struct-packed bytes (no protobuf);
- each transaction: the 200-byte payload, one write lock from the pool and the client's
  high-water mark as the concurrency check (docs/design/locks.md "Optimistic locking in Waltz");
  the server refuses a record whose lock was written after that mark, and the client sends it
  again with its newer mark (a retry);
- batching on every hop: the client sends everything submitted while its last message was
  unanswered as one message (``max_in_flight_messages``, 1 by default: one message in flight); the
  server makes each client message one store batch (transaction IDs, data CRC-32s) and writes it to
  the three storage nodes; a storage node writes and ``fdatasync``\\ s each batch before
  acknowledging it; the server commits batches in order on 2 of 3 acknowledgements (docs/design/server.md
  "Quorum writes and batching") and answers each client message with every record's outcome.

Left out, so that the figure bounds a real implementation from above: protobuf, ZooKeeper,
generations and store sessions, recovery, a feed to other clients, apply callbacks and completion
threads (the load generator's callback runs on the client's event loop), the transaction data
cache, metrics, per-record checks on the storage node, index files and segments.

Four of waltz-py's choices can be put back, one at a time, to price them (the ``skeleton-*`` cases
of ``run_all.py``):

- ``store_protobuf``: the server-to-storage hop in waltz-py's own messages (``StorageRequests`` with
  a ``Record`` and its ``ReqId`` per transaction, serialized once for the three nodes), and the
  storage node's own encoder (``format.encode_wire_records``: order and data CRC-32 checks, the
  on-disk record format);
- ``client_futures``: a ``concurrent.futures.Future`` per transaction, as ``WaltzClient.submit``
  returns, resolved on a completion thread that the event loop hands each answer's commits to;
- ``client_threads``: each answer's commits handed from the event loop to an apply thread (one
  apply call per transaction, as the client's apply worker makes) and then to a completion thread
  that calls the load generator back (as the client's retry threads do);
- ``client_protobuf``: the client-to-server hop in waltz-py's own messages: ``ClientMessages`` with
  an ``AppendRequest`` (ReqId, mark, lock hash, data, data CRC-32) per transaction one way, and
  ``ServerMessages`` with the commits as ``FeedEntries`` columns and a ``LockFailure`` per refused
  append the other; the client finds its transactions by their ReqId's sequence number.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import multiprocessing
import os
import queue
import struct
import tempfile
import threading
import time
import zlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc

from benchmarks.peers.common import GRPC_OPTIONS, MAX_RETRIES, TooManyRetriesError, result, serve_stream
from waltz.local.processes import free_port, wait_for_port
from waltz.perf.cost import process_cpu_seconds
from waltz.perf.loadgen import LoadSpec, Outcome, Request, run_load
from waltz.perf.stats import RunStats
from waltz.protocol import client_pb2, storage_pb2
from waltz.services.storage import format as fmt

_APPEND = "/skeleton.Server/Append"
#: The end of a stream, as ``read()`` returns it.
_EOF: object = grpc.aio.EOF  # type: ignore[attr-defined]  # missing from grpc-stubs
_STORE = "/skeleton.Storage/Store"
#: A client record: lock ID (-1: none), the client's high-water mark, payload length; the payload follows.
_RECORD = struct.Struct(">iqI")
#: A stored record: transaction ID, lock ID, the client's mark, payload length, payload CRC-32; the
#: payload follows.
_STORED = struct.Struct(">qiqII")
#: A store batch's head: its first transaction ID and record count. A storage node echoes it back.
_BATCH = struct.Struct(">qI")
SETTINGS = (
    "raw bytes on grpc.aio streams, {messages} client message(s) in flight, a store batch per client "
    "message, fdatasync per batch on each storage node, quorum 2 of 3, no linger"
)


class ReplicaError(RuntimeError):
    """A storage file of the skeleton is not what the run acknowledged."""


def _storage_main(port: int, path: str, store_protobuf: bool) -> None:
    """A storage node: append every batch of the stream to ``path``, fdatasync, echo its head.
    With ``store_protobuf`` a batch's records are waltz-py's ``Record`` messages, written in
    waltz-py's on-disk format after the head."""

    async def store(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            async for received in requests:
                head = received[: _BATCH.size]
                batch = received
                if store_protobuf:
                    message = storage_pb2.StorageRequests.FromString(received[_BATCH.size :])
                    first = _BATCH.unpack_from(head)[0]
                    encoded, _offsets = fmt.encode_wire_records(message.requests[0].append.records, first)
                    batch = head + encoded
                view = memoryview(batch)
                while view:
                    view = view[os.write(fd, view) :]
                os.fdatasync(fd)
                yield head
        finally:
            os.close(fd)

    serve_stream(port, "skeleton.Storage", "Store", store)


class _Batch:
    """A client message on its way through the store: its outcomes and acknowledgements."""

    __slots__ = ("acks", "outcomes")

    def __init__(self, outcomes: bytes, acks: int) -> None:
        self.outcomes = outcomes
        self.acks = acks


def _server_main(port: int, storage_ports: list[int], store_protobuf: bool, client_protobuf: bool) -> None:
    """The server: lock check and transaction IDs per record, quorum writes, in-order commits.
    With ``store_protobuf`` a store batch is a ``StorageRequests`` message (the lock in each
    record's header, the client's mark in its ReqId's sequence number, for :func:`verify_replicas`).
    With ``client_protobuf`` the client's messages and the answers are waltz-py's."""

    async def append(requests: AsyncIterator[bytes], context: Any) -> None:
        calls = []
        for storage_port in storage_ports:
            channel = grpc.aio.insecure_channel(f"127.0.0.1:{storage_port}", options=GRPC_OPTIONS)
            calls.append(
                channel.stream_stream(_STORE, request_serializer=None, response_deserializer=None)(None)
            )
        quorum = len(calls) // 2 + 1
        batches: collections.deque[_Batch] = collections.deque()
        sent: list[collections.deque[_Batch]] = [collections.deque() for _ in calls]
        replies: asyncio.Queue[bytes | None] = asyncio.Queue()
        locks: dict[int, int] = {}
        next_id = 0
        drained = asyncio.Event()  # every batch sent is on every storage node (set once ending)
        ending = False

        def commit_ready() -> None:
            while batches and batches[0].acks >= quorum:
                replies.put_nowait(batches.popleft().outcomes)
            if ending and not any(sent):
                drained.set()

        async def acknowledgements(index: int) -> None:
            call = calls[index]
            while await call.read() is not _EOF:
                sent[index].popleft().acks += 1
                commit_ready()

        async def answer() -> None:
            while (reply := await replies.get()) is not None:
                await context.write(reply)

        tasks = [asyncio.ensure_future(acknowledgements(i)) for i in range(len(calls))]
        writer = asyncio.ensure_future(answer())
        unpack = _RECORD.unpack_from
        pack_stored = _STORED.pack
        crc = zlib.crc32
        try:
            async for message in requests:
                outcomes: list[int] = []
                parts: list[bytes] = []
                if store_protobuf:
                    store_message = storage_pb2.StorageRequests()
                    records = store_message.requests.add(
                        session_id=1, seq_num=1, partition_id=0
                    ).append.records
                first = next_id
                if client_protobuf:
                    answer_message = client_pb2.ServerMessages()
                    feed = answer_message.messages.add().feed_entries
                    feed.first_transaction_id = first
                    appends = [m.append for m in client_pb2.ClientMessages.FromString(message).messages]
                    received: list[tuple[int, int, bytes, client_pb2.AppendRequest | None]] = [
                        (
                            a.write_lock_hashes[0] if a.write_lock_hashes else -1,
                            a.client_high_water_mark,
                            a.data,
                            a,
                        )
                        for a in appends
                    ]
                else:
                    received = []
                    position = 0
                    end = len(message)
                    while position < end:
                        lock, mark, size = unpack(message, position)
                        position += _RECORD.size
                        received.append((lock, mark, message[position : position + size], None))
                        position += size
                for lock, mark, payload, append_request in received:
                    size = len(payload)
                    if append_request is not None and crc(payload) != append_request.checksum:
                        raise ValueError(f"append {append_request.req_id.seq_num}: data CRC-32 mismatch")
                    if lock >= 0:
                        last = locks.get(lock, -1)
                        if last > mark:
                            if append_request is not None:
                                failure = answer_message.messages.add().lock_failure
                                failure.req_id.CopyFrom(append_request.req_id)
                                failure.transaction_id = last
                            outcomes.append(-last - 2)  # a lock failure on transaction `last`
                            continue
                        locks[lock] = next_id
                    if append_request is not None:
                        rid = append_request.req_id
                        feed.client_ids.append(rid.client_id)
                        feed.generations.append(rid.generation)
                        feed.seq_nums.append(rid.seq_num)
                        feed.headers.append(append_request.header)
                    if store_protobuf:
                        record = records.add()
                        record.transaction_id = next_id
                        record.req_id.client_id = 1
                        record.req_id.generation = 1
                        record.req_id.seq_num = mark
                        record.header = lock
                        record.data = payload
                        record.checksum = crc(payload)
                    else:
                        parts.append(pack_stored(next_id, lock, mark, size, crc(payload)))
                        parts.append(payload)
                    outcomes.append(next_id)
                    next_id += 1
                count = next_id - first
                reply = (
                    answer_message.SerializeToString()
                    if client_protobuf
                    else struct.pack(f">{len(outcomes)}q", *outcomes)
                )
                batch = _Batch(reply, 0 if count else quorum)
                batches.append(batch)
                if count:
                    if store_protobuf:
                        blob = _BATCH.pack(first, count) + store_message.SerializeToString()
                    else:
                        blob = b"".join([_BATCH.pack(first, count), *parts])
                    for index, call in enumerate(calls):
                        sent[index].append(batch)
                        await call.write(blob)
                else:
                    commit_ready()
            # The client is done: end once every storage node holds every batch (a clean stop,
            # so that the run can compare the replicas).
            ending = True
            commit_ready()
            await asyncio.wait_for(drained.wait(), 30)
            for call in calls:
                await call.done_writing()
            await asyncio.wait_for(asyncio.gather(*tasks), 30)
        finally:
            replies.put_nowait(None)
            await writer
            for call in calls:
                call.cancel()
            for task in tasks:
                task.cancel()

    serve_stream(port, "skeleton.Server", "Append", append)


class _Item:
    """A submitted transaction until its outcome: lock, payload, callback, retries so far."""

    __slots__ = ("done", "lock", "payload", "retries", "seq")

    def __init__(self, lock: int, payload: bytes, done: Callable[[Outcome], None]) -> None:
        self.lock = lock
        self.payload = payload
        self.done = done
        self.retries = 0
        self.seq = 0


_Handover = queue.SimpleQueue[list[tuple[Callable[[Outcome], None], Outcome]] | None]


def _resolve_all(completions: _Handover) -> None:
    """The completion thread (``client_futures``, ``client_threads``): resolve each handed-over
    list, until None."""
    while (finished := completions.get()) is not None:
        for resolve, outcome in finished:
            resolve(outcome)


def _apply(outcome: Outcome) -> None:
    """The application's apply callback of ``client_threads``: one call per transaction, nothing
    applied."""


def _apply_all(applies: _Handover, completions: _Handover) -> None:
    """The apply thread of ``client_threads``: apply each handed-over list, then hand it to the
    completion thread, until None."""
    while (committed := applies.get()) is not None:
        for _resolve, outcome in committed:
            _apply(outcome)
        completions.put(committed)


class SkeletonClient:
    """The client: a :data:`~waltz.perf.loadgen.Submitter` whose sends and outcomes run on an
    asyncio thread; each stream message carries everything queued since the last one.

    Args:
        port: the skeleton server's port on 127.0.0.1.
        timeout: seconds to start and to close, at most.
        max_in_flight_messages: stream messages sent and not yet answered, at most.
        client_futures: a ``concurrent.futures.Future`` per transaction, resolved on a completion
            thread (the load generator's callback is the future's done callback).
        client_protobuf: waltz-py's client messages and answers on the stream.
        client_threads: each answer's commits go from the event loop to an apply thread (one
            apply call per transaction), then to a completion thread that calls back.
    """

    def __init__(
        self,
        port: int,
        timeout: float,
        max_in_flight_messages: int,
        client_futures: bool,
        client_protobuf: bool = False,
        client_threads: bool = False,
    ) -> None:
        self._timeout = timeout
        self._futures = client_futures
        self._client_protobuf = client_protobuf
        self._by_seq: dict[int, _Item] = {}
        self._next_seq = 0
        self._max_in_flight_messages = max_in_flight_messages
        self._completions: _Handover = queue.SimpleQueue()
        self._applies: _Handover = queue.SimpleQueue()
        self._completer: threading.Thread | None = None
        self._applier: threading.Thread | None = None
        if client_futures or client_threads:
            self._completer = threading.Thread(
                target=_resolve_all, args=(self._completions,), name="skeleton-completions", daemon=True
            )
            self._completer.start()
        if client_threads:
            self._applier = threading.Thread(
                target=_apply_all, args=(self._applies, self._completions), name="skeleton-apply", daemon=True
            )
            self._applier.start()
        self._lock = threading.Lock()
        self._queued: list[_Item] = []
        self._scheduled = False
        self._retries: list[_Item] = []
        self._sent: collections.deque[list[_Item]] = collections.deque()
        self._mark = -1
        self._closing = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="skeleton-client", daemon=True)
        self._thread.start()
        self._wake = asyncio.run_coroutine_threadsafe(self._event(), self._loop).result(timeout)
        self._channel: grpc.aio.Channel | None = None
        self._done = asyncio.run_coroutine_threadsafe(self._run(port), self._loop)

    async def _event(self) -> asyncio.Event:
        return asyncio.Event()

    def submit(self, request: Request, done: Callable[[Outcome], None]) -> None:
        """Queue one transaction for the next stream message (a :data:`~waltz.perf.loadgen.Submitter`).

        Args:
            request: the load generator's request: its lock and payload.
            done: called once with the outcome, on the client's thread (or the completion thread).
        """
        resolve = done
        if self._futures:
            future: concurrent.futures.Future[Outcome] = concurrent.futures.Future()
            future.add_done_callback(lambda resolved: done(resolved.result()))
            resolve = future.set_result
        item = _Item(-1 if request.lock_id is None else request.lock_id, request.payload, resolve)
        with self._lock:
            self._queued.append(item)
            if self._scheduled:
                return
            self._scheduled = True
        self._loop.call_soon_threadsafe(self._wake.set)

    async def _run(self, port: int) -> None:
        self._channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=GRPC_OPTIONS)
        call = self._channel.stream_stream(_APPEND, request_serializer=None, response_deserializer=None)(None)
        reader = asyncio.ensure_future(self._read(call))
        pack = _RECORD.pack
        try:
            while not reader.done():
                await self._wake.wait()
                self._wake.clear()
                with self._lock:
                    items, self._queued, self._scheduled = self._queued, [], False
                if self._retries:
                    items, self._retries = self._retries + items, []
                if not items:
                    if self._closing and not self._sent:
                        await call.done_writing()
                        await reader  # the server answers EOF once every storage node has all
                        return
                    continue
                if len(self._sent) >= self._max_in_flight_messages:
                    # Like Kafka's max.in.flight.requests.per.connection: what is queued waits for
                    # a reply and then leaves as one message, so messages stay large (waves). The
                    # reply wakes the writer; submissions meanwhile need not.
                    with self._lock:
                        self._queued[:0] = items
                        self._scheduled = True
                    continue
                self._sent.append(items)
                await call.write(self._encode(items) if self._client_protobuf else self._pack(items, pack))
        finally:
            reader.cancel()
            call.cancel()

    def _pack(self, items: list[_Item], pack: Callable[..., bytes]) -> bytes:
        mark = self._mark
        parts: list[bytes] = []
        for item in items:
            parts.append(pack(item.lock, mark, len(item.payload)))
            parts.append(item.payload)
        return b"".join(parts)

    def _encode(self, items: list[_Item]) -> bytes:
        """``client_protobuf``: the items as waltz-py's ``ClientMessages``, one ``AppendRequest`` each."""
        mark = self._mark
        message = client_pb2.ClientMessages()
        for item in items:
            item.seq = seq = self._next_seq
            self._next_seq = (seq + 1) & 0x7FFFFFFF
            self._by_seq[seq] = item
            append = message.messages.add().append
            rid = append.req_id
            rid.client_id = 1
            rid.generation = 1
            rid.seq_num = seq
            append.client_high_water_mark = mark
            if item.lock >= 0:
                append.write_lock_hashes.append(item.lock)
            append.data = item.payload
            append.checksum = zlib.crc32(item.payload)
        return message.SerializeToString()

    async def _read(self, call: Any) -> None:
        try:
            while (reply := await call.read()) is not _EOF:
                self._outcomes(reply)
        finally:
            self._wake.set()  # the writer sees the reader done and ends

    def _decode(self, reply: bytes) -> list[tuple[_Item, int]]:
        """``client_protobuf``: each item of an answer (``ServerMessages``) and its outcome."""
        outcomes: list[tuple[_Item, int]] = []
        for message in client_pb2.ServerMessages.FromString(reply).messages:
            if message.WhichOneof("body") == "feed_entries":
                feed = message.feed_entries
                first = feed.first_transaction_id
                for i, seq in enumerate(feed.seq_nums):
                    outcomes.append((self._by_seq.pop(seq), first + i))
            else:
                failure = message.lock_failure
                outcomes.append((self._by_seq.pop(failure.req_id.seq_num), -failure.transaction_id - 2))
        return outcomes

    def _outcomes(self, reply: bytes) -> None:
        """Settle the items of the oldest message in flight: committed, or queued for a retry."""
        items = self._sent.popleft()
        retry: list[_Item] = []
        finished: list[tuple[Callable[[Outcome], None], Outcome]] = []
        settled = (
            self._decode(reply)
            if self._client_protobuf
            else zip(items, struct.unpack(f">{len(items)}q", reply), strict=True)
        )
        for item, outcome in settled:
            if outcome >= 0:
                self._mark = max(self._mark, outcome)
                if self._completer is not None:
                    finished.append((item.done, Outcome(item.retries)))
                else:
                    item.done(Outcome(item.retries))
            elif item.retries >= MAX_RETRIES:
                item.done(Outcome(item.retries, TooManyRetriesError(f"lock {item.lock}")))
            else:
                item.retries += 1
                retry.append(item)
        if finished:
            (self._completions if self._applier is None else self._applies).put(finished)
        if retry:
            self._retries.extend(retry)
        self._wake.set()  # a message slot is free

    def close(self) -> None:
        """End the stream once everything sent is answered (the server then has every batch on
        every storage node), then stop the client's thread.

        Raises:
            TimeoutError: the stream did not end within the client's timeout.
            grpc.aio.AioRpcError: the stream failed.
        """

        def begin() -> None:
            self._closing = True
            self._wake.set()

        async def stop() -> None:
            self._done.cancel()
            if self._channel is not None:
                await self._channel.close(None)

        try:
            self._loop.call_soon_threadsafe(begin)
            self._done.result(self._timeout)
        finally:
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(self._timeout)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(self._timeout)
            if self._applier is not None:
                self._applies.put(None)
                self._applier.join(self._timeout)
            if self._completer is not None:
                self._completions.put(None)
                self._completer.join(self._timeout)


def _raw_record(data: bytes, position: int) -> tuple[int, int, int, int]:
    """The raw record at ``position``: transaction ID, lock, mark and encoded size.

    Raises:
        ValueError: the record is cut short or its payload CRC-32 is wrong.
    """
    if position + _STORED.size > len(data):
        raise ValueError("a record cut short")
    transaction_id, lock, mark, size, checksum = _STORED.unpack_from(data, position)
    payload = data[position + _STORED.size : position + _STORED.size + size]
    if len(payload) != size:
        raise ValueError("a record cut short")
    if zlib.crc32(payload) != checksum:
        raise ValueError("a payload CRC-32 mismatch")
    return transaction_id, lock, mark, _STORED.size + size


def _waltz_record(data: bytes, position: int) -> tuple[int, int, int, int]:
    """The record in waltz-py's on-disk format at ``position`` (``store_protobuf``): transaction
    ID, lock (its header), mark (its ReqId's sequence number) and encoded size.

    Raises:
        ValueError: the record is cut short or a CRC-32 is wrong.
    """
    try:
        record, size = fmt.decode_record_at(data, position)
    except fmt.RecordProblem as exc:
        raise ValueError(exc.reason) from None
    return record.transaction_id, record.header, record.req_id.seq_num, size


def verify_replicas(paths: list[Path], store_protobuf: bool = False) -> int:
    """Check the storage files of a run: identical, transaction IDs 0, 1, 2... in batches of
    consecutive IDs, every CRC-32 right, and no record written over a lock that changed after its
    mark (the optimistic-locking rule).

    Args:
        paths: the storage nodes' files.
        store_protobuf: the records are in waltz-py's on-disk format (the run's ``store_protobuf``).

    Returns:
        The number of records (the same in every file).

    Raises:
        ReplicaError: what is wrong, with the file and byte offset.
    """
    data = paths[0].read_bytes()
    for path in paths[1:]:
        if path.read_bytes() != data:
            raise ReplicaError(f"{path} differs from {paths[0]}")
    decode = _waltz_record if store_protobuf else _raw_record
    last: dict[int, int] = {}
    expected = 0
    position = 0
    while position < len(data):
        if position + _BATCH.size > len(data):
            raise ReplicaError(f"{paths[0]}: a batch head cut short at byte {position}")
        first, count = _BATCH.unpack_from(data, position)
        if first != expected:
            raise ReplicaError(f"{paths[0]}: batch at byte {position} starts at {first}, not {expected}")
        position += _BATCH.size
        for _ in range(count):
            try:
                transaction_id, lock, mark, size = decode(data, position)
            except ValueError as exc:
                raise ReplicaError(f"{paths[0]}: {exc} at byte {position}") from None
            if transaction_id != expected:
                raise ReplicaError(f"{paths[0]}: record at byte {position} is not transaction {expected}")
            if lock >= 0:
                if last.get(lock, -1) > mark:
                    raise ReplicaError(
                        f"{paths[0]}: transaction {expected} wrote lock {lock} at mark {mark}, after "
                        f"transaction {last[lock]} wrote it"
                    )
                last[lock] = transaction_id
            expected += 1
            position += size
    return expected


def run(
    spec: LoadSpec,
    storages: int = 3,
    max_in_flight_messages: int = 1,
    store_protobuf: bool = False,
    client_futures: bool = False,
    client_protobuf: bool = False,
    client_threads: bool = False,
) -> dict[str, Any]:
    """Start the skeleton's server and ``storages`` storage processes, run the load, stop them, and
    check what the storage nodes hold (:func:`verify_replicas`); the result row (CPU per
    transaction of every process, as the waltz-py rows).

    Args:
        spec: the load.
        storages: storage processes (the quorum is a majority of them).
        max_in_flight_messages: client messages sent and not yet answered, at most.
        store_protobuf: the server-to-storage hop in waltz-py's messages and on-disk format.
        client_futures: a ``concurrent.futures.Future`` per transaction, resolved on a
            completion thread.
        client_protobuf: the client-to-server hop in waltz-py's messages.
        client_threads: commits go through an apply thread and a completion thread.

    Raises:
        ReplicaError: the storage files do not hold exactly the committed transactions.
    """
    context = multiprocessing.get_context("spawn")
    processes: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="waltz-skeleton-") as work:
        try:
            storage_ports = [free_port() for _ in range(storages)]
            for i, port in enumerate(storage_ports):
                path = str(Path(work) / f"storage-{i}.log")
                processes[f"storage-{i}"] = context.Process(
                    target=_storage_main,
                    args=(port, path, store_protobuf),
                    daemon=True,
                    name=f"skeleton-storage-{i}",
                )
            port = free_port()
            processes["server"] = context.Process(
                target=_server_main,
                args=(port, storage_ports, store_protobuf, client_protobuf),
                daemon=True,
                name="skeleton-server",
            )
            for process in processes.values():
                process.start()
            for i, storage_port in enumerate(storage_ports):
                wait_for_port("127.0.0.1", storage_port, timeout=30, what=f"skeleton storage {i}")
            wait_for_port("127.0.0.1", port, timeout=30, what="the skeleton server")
            client = SkeletonClient(
                port, 30, max_in_flight_messages, client_futures, client_protobuf, client_threads
            )
            try:
                before = {name: process_cpu_seconds(p.pid) for name, p in processes.items()}
                client_before = time.process_time()
                stats: RunStats = run_load(client.submit, spec)
                stats.client_cpu_seconds = time.process_time() - client_before
                stats.node_cpu_seconds = {
                    name: process_cpu_seconds(p.pid) - before[name] for name, p in processes.items()
                }
            finally:
                client.close()
        finally:
            for process in processes.values():
                process.kill()
                process.join(5)
        stored = verify_replicas([Path(work) / f"storage-{i}.log" for i in range(storages)], store_protobuf)
        if stored != stats.committed:
            raise ReplicaError(f"the storage nodes hold {stored} records; {stats.committed} were committed")
    added = [
        *(["waltz-py's storage messages and record format"] if store_protobuf else []),
        *(["a Future per transaction, completion thread"] if client_futures else []),
        *(["waltz-py's client messages and feed entries"] if client_protobuf else []),
        *(["an apply thread and a completion thread"] if client_threads else []),
    ]
    return result(
        "machine: Python log skeleton",
        f"1 client, 1 server, {storages} storage processes, quorum {storages // 2 + 1} of {storages}"
        + (f"; with {' and '.join(added)}" if added else ""),
        SETTINGS.format(messages=max_in_flight_messages),
        spec,
        stats,
    )
