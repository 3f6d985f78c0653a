"""The store session: one session of a store partition's writes, after its recovery.

Source: docs/design/server.md, "Store sessions". A store partition
(:class:`~waltz.services.server.store.store_partition.StorePartition`) runs its store sessions one
after another; each has its own session ID (from the partition's metadata in ZooKeeper), takes
batches of records from the partition's
:class:`~waltz.services.server.store.append_queue.AppendQueue`, writes them to its clean replicas
and commits a batch through the queue once a quorum of them has flushed it. Replicas below the
session's high-water mark are caught up meanwhile and join its writers
(:mod:`~waltz.services.server.store.catch_up`). A session is built from explicit values (the
queue, its IDs, its replicas, the settings, a connect function and the ZooKeeper handle) and
knows nothing of the store partition object.
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

from kazoo.exceptions import KazooException

from waltz.errors import WaltzError
from waltz.metadata.replicas import quorum_of
from waltz.metadata.zk import ClusterZk
from waltz.protocol import storage_pb2
from waltz.protocol.records import Record
from waltz.protocol.storage_client import columns_append
from waltz.services.server.store.append_queue import AppendQueue
from waltz.services.server.store.catch_up import ReplicaCatchUp
from waltz.services.server.store.config import StoreConfig
from waltz.services.server.store.recovery import LaggingReplica, RecoveryResult
from waltz.services.server.store.replica import ReplicaConnection, ReplicaError

__all__ = ["StoreSession"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _SentBatch:
    """A batch the session keeps for a replica that joins it (transactions ``first..last``)."""

    first: int
    last: int
    append: bytes  # the serialized AppendRequest


def _tail_of(batch: _SentBatch, first: int) -> bytes:
    """The part of ``batch`` from transaction ``first`` on, as a serialized AppendRequest."""
    if first == batch.first:
        return batch.append
    skip = first - batch.first
    whole = storage_pb2.AppendRequest.FromString(batch.append).columns
    message = storage_pb2.AppendRequest()
    columns = message.columns
    columns.first_transaction_id = first
    columns.client_ids.extend(whole.client_ids[skip:])
    columns.generations.extend(whole.generations[skip:])
    columns.seq_nums.extend(whole.seq_nums[skip:])
    columns.headers.extend(whole.headers[skip:])
    columns.data.extend(whole.data[skip:])
    columns.checksums.extend(whole.checksums[skip:])
    return message.SerializeToString()


class StoreSession:
    """One store session's write pipeline, after its recovery (docs/design/server.md, "Store sessions").

    Args:
        queue: the store partition's append queue: the session takes its batches from it, commits
            them through it and waits on its wake-up; the partition settles it between sessions.
        partition_id: the partition.
        session_id: the session's ID (the partition metadata's, as its recovery wrote it).
        recovery: the recovery that opened the session: its high-water mark, the replicas that
            are in step (the writers) and those below it (caught up in the background).
        assigned: every replica assigned to the partition; a quorum is a majority of them.
        config: store settings (batch limits, linger, checkpoint interval, catch-up pace).
        connect: opens a replica connection under ``session_id`` (replicas that return during
            the session).
        zk: the cluster's znodes (the probe reads the replica assignment; catch-ups enroll
            returning replicas in the partition metadata).
    """

    def __init__(
        self,
        queue: AppendQueue,
        *,
        partition_id: int,
        session_id: int,
        recovery: RecoveryResult,
        assigned: Sequence[str],
        config: StoreConfig,
        connect: Callable[[str], ReplicaConnection],
        zk: ClusterZk,
    ) -> None:
        self._queue = queue
        self.partition_id = partition_id
        self.session_id = session_id
        self.config = config
        self._connect = connect
        self._zk = zk
        self.writers: dict[str, ReplicaConnection] = dict(recovery.clean)
        self._connections = list(self.writers.values())
        self.assigned = list(assigned)
        self.quorum = quorum_of(len(assigned))
        self.start_high_water_mark = recovery.high_water_mark
        self.next_transaction_id = recovery.high_water_mark + 1
        # The low-water mark last set on the writers: what their storage nodes know is committed.
        self.recorded_low_water_mark = recovery.high_water_mark
        # The highest transaction each replica has flushed in this session (kept after it leaves).
        self.acked: dict[str, int] = {s: recovery.high_water_mark for s in self.writers}
        self.batches_in_flight = 0
        # Kept batches sent again to replicas that joined (join), not yet answered: the session's
        # end waits for them as for its own batches, so a replica that joined holds what it was sent.
        self.resends_in_flight = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._ending: str | None = None
        self._absent = [s for s in assigned if s not in self.writers]
        self._last_probe = time.monotonic()
        # Background catch-ups of lagging replicas, and the batches kept for them to join with.
        self._lagging: dict[str, LaggingReplica] = dict(recovery.lagging)
        self.catch_ups: dict[str, ReplicaCatchUp] = {}
        self._recent: deque[_SentBatch] = deque()
        self._recent_records = 0
        self._acknowledgements = asyncio.Event()

    def end(self, reason: str) -> None:
        """Stop taking new records; the session ends once its batches in flight, and the kept
        batches sent again to replicas that joined, are answered."""
        if self._ending is None:
            self._ending = reason
            log.info("partition %d: ending store session %d: %s", self.partition_id, self.session_id, reason)
        self._queue.wake()

    @property
    def ending(self) -> bool:
        """True once the session takes no new records."""
        return self._ending is not None

    @property
    def high_water_mark(self) -> int:
        """The partition's committed high-water mark (what its catch-ups measure their lag from)."""
        return self._queue.high_water_mark

    async def run(self) -> None:
        """Write until the session ends (see :meth:`end`) and its batches in flight, and the kept
        batches sent again to replicas that joined, are answered."""
        queue = self._queue
        probe_interval = max(2.0, 4 * self.config.retry_interval)
        for storage, connection in list(self.writers.items()):
            self._watch(storage, connection)
        for storage, lagging in self._lagging.items():
            self._catch_up(storage, lagging)
        self._lagging.clear()
        while True:
            now = time.monotonic()
            wait: float | None = None
            if queue.closed and self._ending is None:
                self.end("partition closing")
            if self._ending is not None:
                if self.batches_in_flight == 0 and self.resends_in_flight == 0:
                    return
            elif self.next_transaction_id - self.start_high_water_mark > self.config.checkpoint_interval:
                self.end(f"checkpoint interval of {self.config.checkpoint_interval} transactions reached")
                continue
            elif (
                queue.queued
                and self.batches_in_flight < self.config.max_in_flight_batches
                and len(self.writers) >= self.quorum
            ):
                linger = queue.linger_left(
                    now, self.config.linger, self.config.max_batch_records, self.next_transaction_id - 1
                )
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
            await queue.wait(wait)

    def _watch(self, storage: str, connection: ReplicaConnection) -> None:
        """Drop the writer as soon as its stream fails (its storage node stopped or restarted),
        idle or not: the session ends then, not at the next append, which a recovery with a
        quorum of dead streams would drop (docs/design/server.md "Store sessions"). A stream that
        failed already (between the recovery's last request and the session's start) drops the
        writer here, before any batch goes to it."""

        def failed(exc: ReplicaError) -> None:
            if self.writers.get(storage) is connection:
                self._drop_writer(storage, exc)

        if connection.broken:
            failed(ReplicaError(storage, self.partition_id, "UNAVAILABLE", "its stream failed"))
            return
        connection.on_failure(failed)

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _send_batch(self) -> None:
        config = self.config
        first = self.next_transaction_id
        batch = self._queue.take(first, config.max_batch_records, config.max_batch_bytes, len(self.writers))
        last = first + len(batch) - 1
        # In columns (storage.proto RecordColumns): packed lists, not a message per record;
        # serialized once for every replica.
        append = columns_append(batch)
        self.next_transaction_id = last + 1
        self.batches_in_flight += 1
        remaining = {"replicas": len(self.writers)}
        if self.catch_ups:
            self._keep(_SentBatch(first, last, append))
        for storage, connection in list(self.writers.items()):
            # Sent now, in order; the acknowledgements are awaited concurrently.
            self._spawn(self._acknowledged(storage, connection.start_append(append), last, remaining))

    async def _acknowledged(
        self, storage: str, acknowledgement: Awaitable[None], last: int, remaining: dict[str, int] | None
    ) -> None:
        try:
            await acknowledgement
            self.acked[storage] = max(self.acked.get(storage, -1), last)
            self._advance()
        except ReplicaError as exc:
            self._drop_writer(storage, exc)
        finally:
            if remaining is None:  # a kept batch sent again to a joining replica
                self.resends_in_flight -= 1
                self._queue.wake()
            else:
                remaining["replicas"] -= 1
                if remaining["replicas"] == 0:
                    self.batches_in_flight -= 1
                    self._queue.wake()

    def _advance(self) -> None:
        self._acknowledgements.set()
        flushed = sorted(self.acked.values(), reverse=True)
        if len(flushed) >= self.quorum:
            committed = flushed[self.quorum - 1]
            if committed > self._queue.high_water_mark:
                self._queue.commit_through(committed)  # wakes the records lingering for it

    async def _probe(self) -> None:
        """End the session when the replica assignment changed; record what it committed on its
        writers (:meth:`_record_committed`); try the replicas that are out.

        The next session's recovery adds or drops replicas. A replica that is out of the session
        and answers again is caught up in the background (:meth:`_catch_up`) while the session
        writes (docs/design/recovery.md "Catching up in the background").
        """
        try:
            assignments = await asyncio.to_thread(self._zk.assignments)
        except (WaltzError, KazooException) as exc:
            log.warning("partition %d: cannot read the replica assignment: %r", self.partition_id, exc)
            return
        assigned = assignments.value.storages_of(self.partition_id)
        if sorted(assigned) != sorted(self.assigned):
            self.end(f"replica assignment changed to {', '.join(assigned) or 'nothing'}")
            return
        if not await self._record_committed():
            return
        if self.batches_in_flight == 0:
            # Idle: check that the writers still answer, so that a node that hangs or is cut off
            # with its stream open (a failed stream is heard at once, _watch) is noticed, and the
            # session replaced, before the next append needs it.
            for storage, connection in list(self.writers.items()):
                try:
                    await connection.max_transaction_id()
                except ReplicaError as exc:
                    self._drop_writer(storage, exc)
                    return
        for storage in self._absent:
            if storage not in self.writers and storage not in self.catch_ups and self._ending is None:
                self._catch_up(storage, None)  # it ends at once while the node is still down

    async def _record_committed(self) -> bool:
        """Set the writers' low-water mark to what the session has committed, when it moved since
        the last time: their storage nodes then refuse to truncate below it (docs/design/storage.md,
        "The committed floor"; docs/design/server.md, "Store sessions").

        Returns:
            False when a writer failed the request (the session ends, as for a failed append).
        """
        committed = self._queue.high_water_mark
        if committed <= self.recorded_low_water_mark or self._ending is not None:
            return True
        self.recorded_low_water_mark = committed
        for storage, connection in list(self.writers.items()):
            try:
                await connection.set_low_water_mark(committed)
            except ReplicaError as exc:
                self._drop_writer(storage, exc)
                return False
        return True

    def _drop_writer(self, storage: str, exc: ReplicaError) -> None:
        """A writer failed a request: it leaves the session, which ends saying so (once: a writer
        already dropped by another failed request is left alone).

        A node that answers ``PARTITION_NOT_ASSIGNED`` had the replica unassigned by an operator
        (``waltz cluster storage unassign`` changes ZooKeeper, then the node, before this session's
        next probe reads the change): the writer leaves the same way, logged at INFO, since nothing
        failed (docs/design/server.md, "Store sessions").
        """
        if storage in self.writers:
            unassigned = exc.code == "PARTITION_NOT_ASSIGNED"
            log.log(
                logging.INFO if unassigned else logging.WARNING,
                "partition %d: replica on %s leaves session %d: %s",
                self.partition_id,
                storage,
                self.session_id,
                "the replica was unassigned from the node" if unassigned else exc,
            )
            del self.writers[storage]
            self.end(f"replica on {storage} " + ("was unassigned" if unassigned else f"failed: {exc}"))

    # ---- catching replicas up (docs/design/recovery.md "Catching up in the background") ----

    def _catch_up(self, storage: str, lagging: LaggingReplica | None) -> None:
        catch_up = ReplicaCatchUp(self, self._zk, self.partition_id, storage, lagging, self._connect)
        self.catch_ups[storage] = catch_up

        async def run() -> None:
            try:
                await catch_up.run()
            finally:
                del self.catch_ups[storage]
                if not self.catch_ups:
                    self._recent.clear()
                    self._recent_records = 0

        self._spawn(run())

    def _keep(self, batch: _SentBatch) -> None:
        """Keep a batch sent while replicas catch up, for them to join with (:meth:`join`).

        The newest batches are kept, at least ``2 * catch_up_page`` records and every batch not
        yet committed, so that a replica one copied page behind the writers can join.
        """
        recent = self._recent
        recent.append(batch)
        self._recent_records += batch.last - batch.first + 1
        keep = 2 * self.config.catch_up_page
        high_water_mark = self._queue.high_water_mark
        while len(recent) > 1 and recent[0].last <= high_water_mark:
            size = recent[0].last - recent[0].first + 1
            if self._recent_records - size < keep:
                break
            recent.popleft()
            self._recent_records -= size

    def catch_up_source(self) -> tuple[ReplicaConnection, int] | None:
        """The writer that has flushed the most records, and its last flushed transaction ID."""
        if not self.writers:
            return None
        storage = max(self.writers, key=lambda s: self.acked.get(s, -1))
        return self.writers[storage], self.acked.get(storage, -1)

    async def wait_for_acknowledgements(self, timeout: float) -> None:
        """Wait until a writer acknowledges a batch, at most ``timeout`` seconds."""
        self._acknowledgements.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._acknowledgements.wait(), timeout)

    def join(self, storage: str, connection: ReplicaConnection, last: int) -> bool:
        """Make a caught-up replica a writer, if the batches kept reach back to its log's end.

        The kept batches after ``last`` are sent to it at once, in order, then every new batch:
        its appends follow its log contiguously, and its acknowledgements count towards the
        quorum from then on. No await between the check and the sends keeps that order.

        Args:
            storage: the replica's storage node.
            connection: its replica connection (owned by the session once joined).
            last: the highest transaction ID the replica holds (flushed).

        Returns:
            True when it joined; False when it must copy more first, or the session is ending.

        Raises:
            ReplicaError: the replica holds more than the session sent (``MISMATCH``), or its
                stream failed (``UNAVAILABLE``): its catch-up ends, and the probe tries it again.
        """
        if self._ending is not None:
            return False
        if connection.broken:
            raise ReplicaError(
                storage, self.partition_id, "UNAVAILABLE", "its stream failed before it joined"
            )
        sent = self.next_transaction_id - 1
        if last > sent:
            raise ReplicaError(
                storage, self.partition_id, "MISMATCH", f"replica at {last}, beyond {sent} sent"
            )
        resend: list[tuple[bytes, int]] = []
        if last < sent:
            if not self._recent or self._recent[0].first > last + 1:
                return False
            resend = [(_tail_of(b, max(b.first, last + 1)), b.last) for b in self._recent if b.last > last]
        self.writers[storage] = connection
        self._connections.append(connection)
        self.acked[storage] = last
        self._watch(storage, connection)
        for append, batch_last in resend:
            self.resends_in_flight += 1
            self._spawn(self._acknowledged(storage, connection.start_append(append), batch_last, None))
        self._queue.wake()
        return True

    async def read(self, transaction_id: int, max_records: int) -> list[Record]:
        """Read records from a replica that has flushed them: the first that answers, in the
        session's order (one that fails, a node just restarted or cut off, passes the read on to
        the next).

        Raises:
            RecordsArchivedError: the replica read holds nothing below its local start.
            ReplicaError: no replica in the session holds the records, or every one that does
                failed (the last one's error).
        """
        candidates = [s for s in self.writers if self.acked.get(s, -1) >= transaction_id]
        if not candidates:
            raise ReplicaError(
                "-", self.partition_id, "UNAVAILABLE", "no replica in the session holds the records"
            )
        failure: ReplicaError | None = None
        for storage in candidates:
            connection = self.writers.get(storage)
            if connection is None:  # left the session while another was read
                continue
            try:
                return await connection.records(transaction_id, max_records)
            except ReplicaError as exc:
                log.info("partition %d: read from %s failed: %s", self.partition_id, storage, exc)
                failure = exc
        raise failure or ReplicaError(
            "-", self.partition_id, "UNAVAILABLE", "the replicas that held the records left the session"
        )

    async def close(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        # Catch-ups whose task was cancelled before it started still hold a lagging replica's
        # connection (a catch-up that ran removed itself and closed its own).
        for catch_up in list(self.catch_ups.values()):
            await catch_up.discard()
        self.catch_ups.clear()
        for lagging in self._lagging.values():
            await lagging.connection.close()
        self._lagging.clear()
        for connection in self._connections:
            await connection.close()
