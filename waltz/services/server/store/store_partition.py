"""The store partition: a partition's log replicated to its storage nodes, one session at a time.

Design: docs/design/server.md "Store partition", "Store sessions", "Quorum writes and batching";
docs/design/recovery.md "When a recovery runs". A store partition runs store sessions one after
another. Appends wait in its :class:`~waltz.services.server.store.append_queue.AppendQueue`, which
it hands to each session it starts. Each session starts with a recovery
(:class:`~waltz.services.server.store.recovery.RecoveryManager`), then streams batches of records
from the queue to its clean replicas; a batch is committed once a quorum (a majority of the
partition's assigned replicas) has flushed it, while replicas below its high-water mark (down at
its start, or back since) are caught up in the background and join it (docs/design/recovery.md
"Catching up in the background"). A session ends when one of its writers fails (the next session
recovers without it), when the replica assignment changes, after ``checkpoint_interval``
transactions, or when the partition closes. Records still in flight when a session ends are settled
by the next recovery: committed if the resolved high-water mark covers them, failed otherwise.
Records still in flight when the store partition closes (it moved, the server stops, or a newer
generation fenced it) are undecided: the next owner's recovery commits or drops them, so the store
reports them with :class:`AppendUndecidedError`, never as failed (docs/design/server.md
"Generations and server fencing").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from kazoo.exceptions import KazooException

from waltz.errors import GenerationFencedError, RecordsArchivedError, WaltzError
from waltz.metadata.zk import ClusterZk
from waltz.protocol.records import Record, ReqId, crc32
from waltz.services.server.store.append_queue import (
    AppendDone,
    AppendFailedError,
    AppendQueue,
    AppendUndecidedError,
    PendingAppend,
    StoreClosedError,
)
from waltz.services.server.store.config import StoreConfig
from waltz.services.server.store.recovery import RecoveryAbortedError, RecoveryManager, RecoveryResult
from waltz.services.server.store.replica import ReplicaConnection, ReplicaError, StorageStreams
from waltz.services.server.store.store_session import StoreSession

__all__ = ["AppendFailedError", "AppendUndecidedError", "StoreClosedError", "StorePartition"]

log = logging.getLogger(__name__)


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

    Attributes:
        on_close: called once on the event loop with the reason when the store partition closes
            (by :meth:`close`, or fenced by a newer generation), before any record left in it is
            settled: the owner stops its feeds there, so that no client takes the settling of an
            undecided record for its outcome (docs/design/server.md "Generations and server
            fencing"). None: nobody is told.
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
        self._queue = AppendQueue(partition_id, on_commit)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._writable = asyncio.Event()
        self._session: StoreSession | None = None
        self._task: asyncio.Task[None] | None = None
        self.sessions_started = 0
        self.recovered = asyncio.Event()
        self.on_close: Callable[[str], None] | None = None

    # ---- life cycle ----

    def start(self) -> None:
        """Start the session loop (recovery, then writing) in the background."""
        if self._task is None:
            self._loop = asyncio.get_running_loop()
            self._task = self._loop.create_task(self._run(), name=f"store-partition-{self.partition_id}")

    async def close(self, reason: str = "closed") -> None:
        """Stop writing, settle every record not yet committed, and close the replica sessions.

        The batches in flight (and those sent again to a replica that just joined) may still be
        answered, for at most the request timeout; then the records still in flight are undecided
        (:class:`AppendUndecidedError`) and the queued ones, never sent to a replica, fail
        (:class:`StoreClosedError`).
        """
        if not self._queue.close(reason):
            return
        if self._session is not None:
            self._session.end("partition closing")
        if self._task is not None:
            # Let the session's batches in flight be answered, then stop.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.wait({self._task}), self.config.request_timeout)
            self._task.cancel()
            await asyncio.wait({self._task})
        self._writable.clear()
        self._close_out()

    @property
    def closed(self) -> bool:
        """True once the partition is closed (see :attr:`close_reason`)."""
        return self._queue.closed

    @property
    def close_reason(self) -> str:
        """Why the partition closed."""
        return self._queue.close_reason

    @property
    def high_water_mark(self) -> int:
        """The highest committed transaction ID known (-1: none; valid after the first recovery)."""
        return self._queue.high_water_mark

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
        return self._queue.pending_records

    @property
    def pending_bytes(self) -> int:
        """Data bytes of the records queued or in flight (the server's back pressure reads it)."""
        return self._queue.pending_bytes

    @property
    def batches_sent(self) -> int:
        """Append batches its store sessions have sent to the replicas."""
        return self._queue.batches_taken

    @property
    def replicas_in_session(self) -> list[str]:
        """The storage nodes the current session writes to."""
        return sorted(self._session.writers) if self._session is not None else []

    @property
    def replicas_catching_up(self) -> list[str]:
        """The storage nodes the current session is catching up (not yet writing to)."""
        return sorted(self._session.catch_ups) if self._session is not None else []

    @property
    def catch_up_lags(self) -> dict[str, int]:
        """Committed records each replica the current session catches up lacks, by storage node
        (docs/design/recovery.md "Catching up in the background"); a replica not reached and
        cleaned yet is left out, and a replica leaves once its catch-up ends."""
        session = self._session
        if session is None:
            return {}
        lags = ((storage, catch_up.lag) for storage, catch_up in sorted(session.catch_ups.items()))
        return {storage: lag for storage, lag in lags if lag is not None}

    # ---- appends ----

    def submit(self, req_id: ReqId, header: int, data: bytes) -> asyncio.Future[int]:
        """Queue a transaction for the log.

        Returns:
            A future of its transaction ID, set when a quorum of replicas has flushed it. It fails
            with :class:`AppendFailedError` when a recovery dropped it, with
            :class:`AppendUndecidedError` when the partition closed while it was in flight (the
            next recovery decides it), or with :class:`StoreClosedError` when the partition closed
            before it was sent.
        """
        loop = self._loop or asyncio.get_running_loop()
        future: asyncio.Future[int] = loop.create_future()
        self.enqueue(req_id, header, data, crc32(data), _settle_future(future))
        return future

    def enqueue(
        self, req_id: ReqId, header: int, data: bytes, checksum: int, on_done: AppendDone, trace: Any = None
    ) -> None:
        """:meth:`submit` without a future, for the append path: ``on_done(transaction_id, None)``
        runs on the loop within the commit of the transaction (just before ``on_commit`` sees it), or
        ``on_done(-1 or its ID, error)`` when it fails or is left undecided
        (:class:`AppendFailedError`, :class:`AppendUndecidedError`, :class:`StoreClosedError`).
        ``checksum`` is the CRC-32 of ``data``, checked by the caller.
        ``trace``: the server append span of a traced transaction (its store batch gets a span).

        Raises:
            ValueError: ``req_id`` names another partition.
        """
        if req_id.partition_id != self.partition_id:  # the store batch's columns have no partition
            raise ValueError(f"{req_id} of another partition appended to partition {self.partition_id}")
        pending = PendingAppend(req_id, header, data, checksum, on_done)
        if trace is not None:
            pending.trace = trace
        self._queue.put(pending)

    async def append(self, req_id: ReqId, header: int, data: bytes) -> int:
        """Append one transaction and wait until it is committed; returns its transaction ID."""
        return await self.submit(req_id, header, data)

    # ---- reads ----

    async def read_records(self, transaction_id: int, max_records: int) -> list[Record]:
        """Read committed records from ``transaction_id`` on (at most ``max_records``).

        A replica that no longer holds ``transaction_id`` (it is below its local start, archived)
        is no failure: its :class:`~waltz.errors.RecordsArchivedError` reaches the caller, with the
        local start, and is not retried (docs/design/archive.md, "Reads below the local start").

        Raises:
            RecordsArchivedError: the replica read holds nothing below its local start, above
                ``transaction_id``; the caller reads the range below from the archive.
            StoreClosedError: the partition is closed.
            TimeoutError: no store session became writable within the request timeout.
        """
        queue = self._queue
        for _ in range(5):
            if queue.closed:
                raise StoreClosedError(f"partition {self.partition_id}: {queue.close_reason}")
            await self.wait_writable(self.config.request_timeout)
            last = queue.high_water_mark
            if transaction_id > last:
                return []
            session = self._session
            if session is None:
                continue
            try:
                records = await session.read(transaction_id, min(max_records, last - transaction_id + 1))
            except RecordsArchivedError:
                raise  # the records are in the archive: the caller reads them there
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
        queue = self._queue
        while not queue.closed:
            try:
                result, assigned = await self._recover()
            except GenerationFencedError as exc:
                log.warning("%s", exc)
                queue.close(str(exc))
                self._close_out()
                return
            except RecoveryAbortedError as exc:
                if queue.closed:
                    return
                log.warning("partition %d: %s; starting a new session", self.partition_id, exc)
                await asyncio.sleep(self.config.retry_interval)
                continue
            except (WaltzError, KazooException) as exc:
                # ZooKeeper unreachable (a connection loss, an expired session) is retried like
                # any failed recovery: the partition must not stop for good behind it.
                log.error("partition %d: recovery failed: %r; retrying", self.partition_id, exc)
                await asyncio.sleep(self.config.retry_interval)
                continue
            queue.settle(result.high_water_mark)
            session_id = result.metadata.value.session_id
            session = StoreSession(
                queue,
                partition_id=self.partition_id,
                session_id=session_id,
                recovery=result,
                assigned=assigned,
                config=self.config,
                connect=self._connect(session_id),
                zk=self._zk,
            )
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
            closed=lambda: self._queue.closed,
        )
        return await manager.run(), assigned

    def _close_out(self) -> None:
        """Settle what is left in a closed store partition, after telling ``on_close``.

        Records in flight are undecided (:class:`AppendUndecidedError`), queued records fail
        (:class:`StoreClosedError`): :meth:`AppendQueue.settle_closed`.
        """
        on_close, self.on_close = self.on_close, None
        if on_close is not None:
            try:
                on_close(self._queue.close_reason)
            except Exception:
                log.exception("partition %d: the close callback raised", self.partition_id)
        self._queue.settle_closed()
