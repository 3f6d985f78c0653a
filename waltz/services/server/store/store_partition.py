"""The store partition: a partition's log replicated to its storage nodes, one session at a time.

Source: seed 000 "Store Partition Object", "Quorum Writes", "Sessions"; seed 003. A store partition
runs store sessions one after another. Each session starts with a recovery
(:class:`~waltz.services.server.store.recovery.RecoveryManager`), then streams batches of records
to its clean replicas; a batch is committed once a quorum (a majority of the partition's assigned
replicas) has flushed it. A session ends when a replica fails (the next session recovers without
it), when a replica that was down answers again (the next session catches it up), after
``checkpoint_interval`` transactions, or when the partition closes. Records still in flight when a
session ends are settled by the next recovery: committed if the resolved high-water mark covers
them, failed otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from waltz.errors import GenerationFencedError, WaltzError
from waltz.metadata.zk import ClusterZk
from waltz.protocol import storage_pb2
from waltz.protocol.records import Record, ReqId, crc32
from waltz.services.server.store.config import StoreConfig
from waltz.services.server.store.recovery import RecoveryAbortedError, RecoveryManager, RecoveryResult
from waltz.services.server.store.replica import ReplicaConnection, ReplicaError, StorageStreams
from waltz.services.server.store.voting import quorum_of

__all__ = ["AppendFailedError", "StoreClosedError", "StorePartition"]

log = logging.getLogger(__name__)

#: Bytes a record takes in an append request besides its data (transaction ID, ReqId, header,
#: checksum and their tags), rounded up: what a batch's byte budget counts per record.
RECORD_OVERHEAD_BYTES = 64


class AppendFailedError(WaltzError):
    """The record was not committed: its store session ended and the recovery did not keep it."""


class StoreClosedError(WaltzError):
    """The store partition is closed (shut down, or fenced by a newer generation)."""


#: What :meth:`StorePartition.enqueue` calls once a transaction is resolved: with its transaction ID
#: and None when committed, or with an error when it will never be.
AppendDone = Callable[[int, "BaseException | None"], None]


@dataclass(slots=True)
class _Pending:
    req_id: ReqId
    header: int
    data: bytes
    checksum: int
    on_done: AppendDone | None
    transaction_id: int = -1  # set when the record is put in a batch

    @property
    def record(self) -> Record:
        return Record(self.transaction_id, self.req_id, self.header, self.data, self.checksum)

    def resolve(self, error: BaseException | None) -> None:
        """Commit (``error`` None) or fail the transaction, once."""
        on_done = self.on_done
        if on_done is not None:
            self.on_done = None
            try:
                on_done(self.transaction_id, error)
            except Exception:
                log.exception("append callback of transaction %d raised", self.transaction_id)


def _settle_future(future: asyncio.Future[int]) -> AppendDone:
    """The ``on_done`` of :meth:`StorePartition.submit`: settles its future."""

    def done(transaction_id: int, error: BaseException | None) -> None:
        if not future.done():
            if error is None:
                future.set_result(transaction_id)
            else:
                future.set_exception(error)

    return done


class StorePartition:
    """One partition's replicated log, as seen by the server that owns the partition.

    Args:
        partition_id: the partition.
        generation: the generation under which this server owns the partition.
        zk: the cluster's znodes (partition metadata, replica assignments).
        cluster_key: the cluster key (storage open requests).
        num_partitions: the cluster's number of partitions.
        config: store settings.
        on_commit: called on the event loop with each run of newly committed records, in
            transaction ID order (the feed builds on it).
        streams: the server's store session streams, one per storage node, shared with its other
            partitions; None: a stream per replica session.
    """

    def __init__(
        self,
        partition_id: int,
        generation: int,
        zk: ClusterZk,
        cluster_key: str,
        num_partitions: int,
        config: StoreConfig | None = None,
        on_commit: Callable[[list[Record]], None] | None = None,
        streams: StorageStreams | None = None,
    ) -> None:
        self.partition_id = partition_id
        self._streams = streams
        self.generation = generation
        self._zk = zk
        self._cluster_key = cluster_key
        self._num_partitions = num_partitions
        self.config = config or StoreConfig()
        self._on_commit = on_commit
        self._queue: deque[_Pending] = deque()
        self._queue_since = 0.0  # when the oldest queued record arrived (for the linger)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._in_flight: deque[_Pending] = deque()
        self.pending_bytes = 0
        """Data bytes of the records queued or in flight (the server's back pressure reads it)."""
        self._high_water_mark = -1
        self._wakeup = asyncio.Event()
        self._writable = asyncio.Event()
        self._session: _Session | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._close_reason: str = "closed"
        self.sessions_started = 0
        self.batches_sent = 0
        self.recovered = asyncio.Event()

    # ---- life cycle ----

    def start(self) -> None:
        """Start the session loop (recovery, then writing) in the background."""
        if self._task is None:
            self._loop = asyncio.get_running_loop()
            self._task = self._loop.create_task(self._run(), name=f"store-partition-{self.partition_id}")

    async def close(self, reason: str = "closed") -> None:
        """Stop writing, fail every record not yet committed, and close the replica sessions."""
        if self._closed:
            return
        self._closed = True
        self._close_reason = reason
        self._wakeup.set()
        if self._session is not None:
            self._session.end("partition closing")
        if self._task is not None:
            # Let the session's batches in flight be answered, then stop.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.wait({self._task}), self.config.request_timeout)
            self._task.cancel()
            await asyncio.wait({self._task})
        self._fail_all(StoreClosedError(f"partition {self.partition_id}: {reason}"))
        self._writable.clear()

    @property
    def closed(self) -> bool:
        """True once the partition is closed (see :attr:`close_reason`)."""
        return self._closed

    @property
    def close_reason(self) -> str:
        """Why the partition closed."""
        return self._close_reason

    @property
    def high_water_mark(self) -> int:
        """The highest committed transaction ID known (-1: none; valid after the first recovery)."""
        return self._high_water_mark

    @property
    def writable(self) -> bool:
        """True while a store session is writing."""
        return self._writable.is_set()

    async def wait_writable(self, timeout: float) -> None:
        """Wait until a store session writes.

        Raises:
            TimeoutError: no session became writable within ``timeout`` seconds.
        """
        await asyncio.wait_for(self._writable.wait(), timeout)

    @property
    def pending_records(self) -> int:
        """Records queued or in flight (not yet committed or failed)."""
        return len(self._queue) + len(self._in_flight)

    @property
    def replicas_in_session(self) -> list[str]:
        """The storage nodes the current session writes to."""
        return sorted(self._session.writers) if self._session is not None else []

    # ---- appends ----

    def submit(self, req_id: ReqId, header: int, data: bytes) -> asyncio.Future[int]:
        """Queue a transaction for the log.

        Returns:
            A future of its transaction ID, set when a quorum of replicas has flushed it. It fails
            with :class:`AppendFailedError` when its session ended without committing it, or
            :class:`StoreClosedError` when the partition closed.
        """
        loop = self._loop or asyncio.get_running_loop()
        future: asyncio.Future[int] = loop.create_future()
        self.enqueue(req_id, header, data, crc32(data), _settle_future(future))
        return future

    def enqueue(self, req_id: ReqId, header: int, data: bytes, checksum: int, on_done: AppendDone) -> None:
        """:meth:`submit` without a future, for the append path: ``on_done(transaction_id, None)``
        runs on the loop within the commit of the transaction (just before ``on_commit`` sees it), or
        ``on_done(-1 or its ID, error)`` when it fails (:class:`AppendFailedError`,
        :class:`StoreClosedError`). ``checksum`` is the CRC-32 of ``data``, checked by the caller.

        Raises:
            ValueError: ``req_id`` names another partition.
        """
        if req_id.partition_id != self.partition_id:  # the store batch's columns have no partition
            raise ValueError(f"{req_id} of another partition appended to partition {self.partition_id}")
        pending = _Pending(req_id, header, data, checksum, on_done)
        if self._closed:
            pending.resolve(StoreClosedError(f"partition {self.partition_id}: {self._close_reason}"))
            return
        if not self._queue:
            self._queue_since = time.monotonic()
        self._queue.append(pending)
        self.pending_bytes += len(pending.data)
        self._wakeup.set()

    async def append(self, req_id: ReqId, header: int, data: bytes) -> int:
        """Append one transaction and wait until it is committed; returns its transaction ID."""
        return await self.submit(req_id, header, data)

    # ---- reads ----

    async def read_records(self, transaction_id: int, max_records: int) -> list[Record]:
        """Read committed records from ``transaction_id`` on (at most ``max_records``).

        Raises:
            StoreClosedError: the partition is closed.
            TimeoutError: no store session became writable within the request timeout.
        """
        for _ in range(5):
            if self._closed:
                raise StoreClosedError(f"partition {self.partition_id}: {self._close_reason}")
            await self.wait_writable(self.config.request_timeout)
            last = self._high_water_mark
            if transaction_id > last:
                return []
            session = self._session
            if session is None:
                continue
            try:
                records = await session.read(transaction_id, min(max_records, last - transaction_id + 1))
            except ReplicaError as exc:
                log.info("partition %d: read from a replica failed, retrying: %s", self.partition_id, exc)
                continue
            return [r for r in records if r.transaction_id <= last]
        raise TimeoutError(f"partition {self.partition_id}: no replica answered the read of {transaction_id}")

    # ---- the session loop ----

    def _connect(self, session_id: int) -> Callable[[str], ReplicaConnection]:
        def connect(storage: str) -> ReplicaConnection:
            return ReplicaConnection(
                storage,
                self.partition_id,
                session_id,
                self._cluster_key,
                self._num_partitions,
                self.config,
                self._streams,
            )

        return connect

    async def _run(self) -> None:
        while not self._closed:
            try:
                result, assigned = await self._recover()
            except GenerationFencedError as exc:
                log.warning("%s", exc)
                self._closed = True
                self._close_reason = str(exc)
                self._fail_all(StoreClosedError(f"partition {self.partition_id}: {exc}"))
                return
            except RecoveryAbortedError as exc:
                if self._closed:
                    return
                log.warning("partition %d: %s; starting a new session", self.partition_id, exc)
                await asyncio.sleep(self.config.retry_interval)
                continue
            except WaltzError as exc:
                log.error("partition %d: recovery failed: %s; retrying", self.partition_id, exc)
                await asyncio.sleep(self.config.retry_interval)
                continue
            self._settle(result.high_water_mark)
            session = _Session(self, result, assigned)
            self._session = session
            self._writable.set()
            self.recovered.set()
            try:
                await session.run()
            finally:
                self._writable.clear()
                self._session = None
                await session.close()

    async def _recover(self) -> tuple[RecoveryResult, list[str]]:
        previous, session = await asyncio.to_thread(
            self._zk.begin_store_session, self.partition_id, self.generation
        )
        assigned = (await asyncio.to_thread(self._zk.assignments)).value.storages_of(self.partition_id)
        if not assigned:
            raise RecoveryAbortedError(f"partition {self.partition_id} has no replica assigned")
        self.sessions_started += 1
        manager = RecoveryManager(
            self.partition_id,
            session,
            previous,
            assigned,
            self._connect(session.value.session_id),
            self._zk,
            self.config,
            closed=lambda: self._closed,
        )
        return await manager.run(), assigned

    def _settle(self, high_water_mark: int) -> None:
        """Settle records left in flight by the previous session, by the recovery's result."""
        kept: list[_Pending] = []
        while self._in_flight:
            pending = self._in_flight.popleft()
            if pending.transaction_id <= high_water_mark:
                kept.append(pending)
            else:
                self._resolve(
                    pending,
                    AppendFailedError(
                        f"partition {self.partition_id}: transaction {pending.transaction_id} was not "
                        f"committed (the store session ended; the log ends at {high_water_mark})"
                    ),
                )
        self._high_water_mark = high_water_mark
        self._committed(kept)

    def _committed(self, kept: list[_Pending]) -> None:
        """Resolve the appends of newly committed records, then hand the records to ``on_commit``.

        In this order, so that what resolving an append sends a client (the lock failures that
        waited for it, ``docs/protocol.md`` "Append") goes out before the feed entries of the same
        commit: otherwise a client whose refused append is followed by one of its own in this
        commit would take the refusal for a lost append (its transaction monitor, seed 002) before
        the lock failure arrived.
        """
        if not kept:
            return
        for pending in kept:
            self._resolve(pending, None)
        if self._on_commit is not None:
            self._on_commit([pending.record for pending in kept])

    def _commit_through(self, transaction_id: int) -> None:
        kept: list[_Pending] = []
        in_flight = self._in_flight
        while in_flight and in_flight[0].transaction_id <= transaction_id:
            kept.append(in_flight.popleft())
        self._high_water_mark = max(self._high_water_mark, transaction_id)
        self._committed(kept)

    def _fail_all(self, exc: Exception) -> None:
        for queue in (self._in_flight, self._queue):
            while queue:
                self._resolve(queue.popleft(), exc)

    def _resolve(self, pending: _Pending, error: BaseException | None) -> None:
        """A queued or in-flight record leaves the store (committed, or failed with ``error``)."""
        self.pending_bytes -= len(pending.data)
        pending.resolve(error)


class _Session:
    """One store session's write pipeline (after its recovery)."""

    def __init__(self, partition: StorePartition, recovery: RecoveryResult, assigned: Sequence[str]) -> None:
        self.partition = partition
        self.config = partition.config
        self.session_id = recovery.metadata.value.session_id
        self.writers: dict[str, ReplicaConnection] = dict(recovery.clean)
        self._connections = list(self.writers.values())
        self.assigned = list(assigned)
        self.quorum = quorum_of(len(assigned))
        self.start_high_water_mark = recovery.high_water_mark
        self.next_transaction_id = recovery.high_water_mark + 1
        # The highest transaction each replica has flushed in this session (kept after it leaves).
        self.acked: dict[str, int] = {s: recovery.high_water_mark for s in self.writers}
        self.batches_in_flight = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._ending: str | None = None
        self._absent = [s for s in assigned if s not in self.writers]
        self._last_probe = time.monotonic()

    def end(self, reason: str) -> None:
        """Stop taking new records; the session ends once its batches in flight are answered."""
        if self._ending is None:
            self._ending = reason
            log.info(
                "partition %d: ending store session %d: %s",
                self.partition.partition_id,
                self.session_id,
                reason,
            )
        self.partition._wakeup.set()

    async def run(self) -> None:
        partition = self.partition
        probe_interval = max(2.0, 4 * self.config.retry_interval)
        while True:
            now = time.monotonic()
            wait: float | None = None
            if partition._closed and self._ending is None:
                self.end("partition closing")
            if self._ending is not None:
                if self.batches_in_flight == 0:
                    return
            elif self.next_transaction_id - self.start_high_water_mark > self.config.checkpoint_interval:
                self.end(f"checkpoint interval of {self.config.checkpoint_interval} transactions reached")
                continue
            elif (
                partition._queue
                and self.batches_in_flight < self.config.max_in_flight_batches
                and len(self.writers) >= self.quorum
            ):
                linger = self._linger_left(now)
                if linger <= 0:
                    self._send_batch()
                    continue
                wait = linger
            if self._ending is None:
                if now - self._last_probe >= probe_interval:
                    self._last_probe = now
                    self._spawn(self._probe())
                next_probe = self._last_probe + probe_interval - now
                wait = next_probe if wait is None else min(wait, next_probe)
            partition._wakeup.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(partition._wakeup.wait(), wait)

    def _linger_left(self, now: float) -> float:
        """Seconds to wait for more records before sending a batch (0: send now).

        A batch smaller than the maximum waits while an earlier batch of the session awaits its
        quorum, at most ``linger`` after its oldest record arrived: the records that arrive during
        a store round trip go as one batch when it commits (group commit, one flush per replica
        for all of them). Waiting for the quorum, not for every replica, keeps a slow replica from
        holding the next batch back; ``max_in_flight_batches`` bounds how far it may lag.
        """
        linger = self.config.linger
        partition = self.partition
        queue = partition._queue
        if (
            linger <= 0
            or self.next_transaction_id - 1 <= partition._high_water_mark  # every batch sent committed
            or len(queue) >= self.config.max_batch_records
        ):
            return 0.0
        return linger - (now - partition._queue_since)

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _send_batch(self) -> None:
        partition = self.partition
        queue = partition._queue
        count = min(len(queue), self.config.max_batch_records)
        budget = self.config.max_batch_bytes
        first = transaction_id = self.next_transaction_id
        in_flight = partition._in_flight
        client_ids: list[int] = []
        generations: list[int] = []
        seq_nums: list[int] = []
        headers: list[int] = []
        data: list[bytes] = []
        checksums: list[int] = []
        for index in range(count):
            # At least one record; then no more than the byte budget (large transactions would
            # otherwise add up past the gRPC message limit and fail the replicas' streams).
            budget -= len(queue[0].data) + RECORD_OVERHEAD_BYTES
            if budget < 0 and index:
                break
            pending = queue.popleft()
            pending.transaction_id = transaction_id
            req = pending.req_id
            client_ids.append(req.client_id)
            generations.append(req.generation)
            seq_nums.append(req.seq_num)
            headers.append(pending.header)
            data.append(pending.data)
            checksums.append(pending.checksum)
            in_flight.append(pending)
            transaction_id += 1
        # In columns (storage.proto RecordColumns): packed lists, not a message per record.
        message = storage_pb2.AppendRequest()
        columns = message.columns
        columns.first_transaction_id = first
        columns.client_ids.extend(client_ids)
        columns.generations.extend(generations)
        columns.seq_nums.extend(seq_nums)
        columns.headers.extend(headers)
        columns.data.extend(data)
        columns.checksums.extend(checksums)
        self.next_transaction_id = transaction_id
        partition.batches_sent += 1
        last = transaction_id - 1
        self.batches_in_flight += 1
        remaining = {"replicas": len(self.writers)}
        append = message.SerializeToString()  # once for every replica
        for storage, connection in list(self.writers.items()):
            # Sent now, in order; the acknowledgements are awaited concurrently.
            self._spawn(self._acknowledged(storage, connection.start_append(append), last, remaining))

    async def _acknowledged(
        self, storage: str, acknowledgement: Awaitable[None], last: int, remaining: dict[str, int]
    ) -> None:
        try:
            await acknowledgement
            self.acked[storage] = max(self.acked.get(storage, -1), last)
            self._advance()
        except ReplicaError as exc:
            if storage in self.writers:
                log.warning(
                    "partition %d: replica on %s leaves session %d: %s",
                    self.partition.partition_id,
                    storage,
                    self.session_id,
                    exc,
                )
                del self.writers[storage]
                self.end(f"replica on {storage} failed")
        finally:
            remaining["replicas"] -= 1
            if remaining["replicas"] == 0:
                self.batches_in_flight -= 1
                self.partition._wakeup.set()

    def _advance(self) -> None:
        flushed = sorted(self.acked.values(), reverse=True)
        if len(flushed) >= self.quorum:
            committed = flushed[self.quorum - 1]
            partition = self.partition
            if committed > partition._high_water_mark:
                partition._commit_through(committed)
                if partition._queue:
                    partition._wakeup.set()  # the records lingering for this commit go now

    async def _probe(self) -> None:
        """End the session when the replica assignment changed or a replica that was down answers.

        The next session's recovery then adds, catches up or drops the replicas.
        """
        partition = self.partition
        try:
            assignments = await asyncio.to_thread(partition._zk.assignments)
        except WaltzError as exc:
            log.warning("partition %d: cannot read the replica assignment: %s", partition.partition_id, exc)
            return
        assigned = assignments.value.storages_of(partition.partition_id)
        if sorted(assigned) != sorted(self.assigned):
            self.end(f"replica assignment changed to {', '.join(assigned) or 'nothing'}")
            return
        if self.batches_in_flight == 0:
            # Idle: check that the writers are still there, so that a dead storage node is
            # noticed (and the session replaced) before the next append needs it.
            for storage, connection in list(self.writers.items()):
                try:
                    await connection.max_transaction_id()
                except ReplicaError as exc:
                    if storage in self.writers:
                        del self.writers[storage]
                        self.end(f"replica on {storage} failed: {exc}")
                    return
        for storage in list(self._absent):
            connection = partition._connect(self.session_id)(storage)
            try:
                await connection.open()
                await connection.max_transaction_id()
            except ReplicaError:
                continue
            finally:
                await connection.close()
            self.end(f"replica on {storage} is reachable again")
            return

    async def read(self, transaction_id: int, max_records: int) -> list[Record]:
        """Read records from a replica that has flushed them."""
        candidates = [s for s in self.writers if self.acked.get(s, -1) >= transaction_id]
        if not candidates:
            raise ReplicaError(
                "-", self.partition.partition_id, "UNAVAILABLE", "no replica in the session holds the records"
            )
        return await self.writers[candidates[0]].records(transaction_id, max_records)

    async def close(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        for connection in self._connections:
            await connection.close()
