"""The append queue: what a store partition and its store sessions share.

Design: docs/design/server.md "Store partition", "Store sessions", "Quorum writes and batching".
A transaction appended to a store partition waits in its :class:`AppendQueue` as a
:class:`PendingAppend` until the partition's store session takes it into a batch; it is then in
flight until a quorum of replicas has flushed it (committed: the queue's high-water mark passes
it), the recovery of the next session drops it (:class:`AppendFailedError`), or the store partition
closes (:class:`AppendUndecidedError` in flight, :class:`StoreClosedError` still queued).

The store partition owns the queue: it puts appends in, settles them after each recovery and when
it closes. Each store session takes batches from it, commits them through it, and waits on its
wake-up (new records, a commit with records queued, the close).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from waltz import tracing
from waltz.errors import WaltzError
from waltz.protocol.records import Record, ReqId

__all__ = [
    "RECORD_OVERHEAD_BYTES",
    "AppendDone",
    "AppendFailedError",
    "AppendQueue",
    "AppendUndecidedError",
    "PendingAppend",
    "StoreClosedError",
]

log = logging.getLogger(__name__)

#: Bytes a record takes in an append request besides its data (transaction ID, ReqId, header,
#: checksum and their tags), rounded up: what a batch's byte budget counts per record.
RECORD_OVERHEAD_BYTES = 64


class AppendFailedError(WaltzError):
    """The record was not committed: its store session ended and the recovery did not keep it."""


class StoreClosedError(WaltzError):
    """The store partition is closed (shut down, or fenced by a newer generation)."""


class AppendUndecidedError(StoreClosedError):
    """The store partition closed while the record was in flight: its fate is undecided.

    The record was sent to the replicas but no quorum acknowledged it before the store closed, so
    some replicas may hold it. The recovery of the partition's next store session (on this server
    or on the partition's next owner) commits it or drops it; the partition's log (its feed) tells
    which. See docs/design/server.md "Generations and server fencing".
    """


#: What :meth:`StorePartition.enqueue` calls once a transaction is resolved: with its transaction ID
#: and None when committed, or with an error when it will never be.
AppendDone = Callable[[int, "BaseException | None"], None]


@dataclass(slots=True)
class PendingAppend:
    """A transaction queued in a store partition or in flight in one of its store sessions.

    Attributes:
        req_id: the client's request ID of the append.
        header: the transaction header (an application value, 32 bits).
        data: the transaction data.
        checksum: the CRC-32 of ``data``.
        on_done: called once when the transaction is committed or has failed (None after).
        transaction_id: the transaction ID, set when the record is put in a batch (-1 before).
        trace: None, unless the transaction is traced: its server append span, then its store
            batch's span once in a batch (``waltz.tracing.store_batch``).
    """

    req_id: ReqId
    header: int
    data: bytes
    checksum: int
    on_done: AppendDone | None
    transaction_id: int = -1  # set when the record is put in a batch
    trace: Any = None

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


class AppendQueue:
    """A store partition's appends, queued and in flight, and the high-water mark they commit to.

    Design: docs/design/server.md "Store partition" (the queue, settling after a recovery and at
    the close) and "Quorum writes and batching" (batches, commits, the linger's clock).

    Args:
        partition_id: the partition (in error messages and traces).
        on_commit: called on the event loop with each run of newly committed records, in
            transaction ID order, after their appends are resolved (the feed builds on it).

    Attributes:
        pending_bytes: data bytes of the records queued or in flight (the server's back pressure
            reads it through the store partition).
        batches_taken: batches taken by store sessions so far.
        traced_queued: traced records queued and not yet in a batch (docs/tracing.md).
    """

    def __init__(self, partition_id: int, on_commit: Callable[[list[Record]], None] | None = None) -> None:
        self.partition_id = partition_id
        self._on_commit = on_commit
        self._queued: deque[PendingAppend] = deque()
        self._queued_since = 0.0  # when the oldest queued record arrived (for the linger)
        self._in_flight: deque[PendingAppend] = deque()
        self._high_water_mark = -1
        self._wakeup = asyncio.Event()
        self._closed = False
        self._close_reason = "closed"
        self.pending_bytes = 0
        self.batches_taken = 0
        self.traced_queued = 0

    # ---- state ----

    @property
    def high_water_mark(self) -> int:
        """The highest committed transaction ID (-1: none; set by the first :meth:`settle`)."""
        return self._high_water_mark

    @property
    def queued(self) -> int:
        """Records queued, not yet taken into a batch."""
        return len(self._queued)

    @property
    def queued_since(self) -> float:
        """When (``time.monotonic()``) the oldest queued record arrived; meaningless while none is."""
        return self._queued_since

    @property
    def pending_records(self) -> int:
        """Records queued or in flight (not yet committed or failed)."""
        return len(self._queued) + len(self._in_flight)

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called: appends are refused, sessions end."""
        return self._closed

    @property
    def close_reason(self) -> str:
        """Why the queue closed (``"closed"`` while it is open)."""
        return self._close_reason

    # ---- the store partition's side ----

    def put(self, pending: PendingAppend) -> None:
        """Queue a transaction for the next batch and wake the session.

        A closed queue refuses it at once: ``pending`` is resolved with :class:`StoreClosedError`.
        """
        if pending.trace is not None:
            self.traced_queued += 1
        if self._closed:
            pending.resolve(StoreClosedError(f"partition {self.partition_id}: {self._close_reason}"))
            return
        if not self._queued:
            self._queued_since = time.monotonic()
        self._queued.append(pending)
        self.pending_bytes += len(pending.data)
        self._wakeup.set()

    def settle(self, high_water_mark: int) -> None:
        """Settle the records left in flight by the previous session, by its recovery's result.

        Those at or below ``high_water_mark`` are committed (their appends resolved, then
        ``on_commit``), the others fail with :class:`AppendFailedError`; the queue's high-water
        mark becomes ``high_water_mark`` (docs/design/server.md "Store partition").
        """
        kept: list[PendingAppend] = []
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

    def close(self, reason: str) -> bool:
        """Refuse appends from now on and wake the session (which ends); what the queue holds
        stays until :meth:`settle_closed`.

        Returns:
            False if the queue was closed already (its first reason stays).
        """
        if self._closed:
            return False
        self._closed = True
        self._close_reason = reason
        self._wakeup.set()
        return True

    def settle_closed(self) -> None:
        """Settle what is left in a closed queue.

        Records in flight were sent to the replicas and may be on some of them: the next recovery
        decides them (:class:`AppendUndecidedError`). Queued records were never sent: they fail
        (:class:`StoreClosedError`). See docs/design/server.md "Generations and server fencing".
        """
        reason = f"partition {self.partition_id}: {self._close_reason}"
        undecided = AppendUndecidedError(
            f"{reason}; the store closed before a quorum of replicas acknowledged the record: the "
            "recovery of the partition's next store session commits or drops it (read the log)"
        )
        while self._in_flight:
            self._resolve(self._in_flight.popleft(), undecided)
        closed = StoreClosedError(reason)
        while self._queued:
            self._resolve(self._queued.popleft(), closed)

    # ---- the store session's side ----

    def take(
        self, first_transaction_id: int, max_records: int, max_bytes: int, replicas: int
    ) -> list[PendingAppend]:
        """Take the next batch: the oldest queued records, now in flight.

        At least one record (the queue must not be empty), then no more than ``max_records``
        records and ``max_bytes`` bytes (data plus :data:`RECORD_OVERHEAD_BYTES` a record), so
        that large transactions do not add up past the gRPC message limit.

        Args:
            first_transaction_id: the transaction ID given to the first record; the others follow.
            max_records: records at most.
            max_bytes: bytes at most, unless the first record alone is larger.
            replicas: the replicas the batch is sent to (a traced batch's span says it).

        Returns:
            The records of the batch, in transaction ID order.
        """
        queued = self._queued
        budget = max_bytes
        transaction_id = first_transaction_id
        batch: list[PendingAppend] = []
        for index in range(min(len(queued), max_records)):
            budget -= len(queued[0].data) + RECORD_OVERHEAD_BYTES
            if budget < 0 and index:
                break
            pending = queued.popleft()
            pending.transaction_id = transaction_id
            batch.append(pending)
            transaction_id += 1
        self._in_flight.extend(batch)
        self.batches_taken += 1
        if self.traced_queued:  # traced records were queued (docs/tracing.md)
            self.traced_queued = tracing.store_batch(
                batch,
                self.partition_id,
                first_transaction_id,
                transaction_id - 1,
                replicas,
                self.traced_queued,
            )
        return batch

    def linger_left(self, now: float, linger: float, max_records: int, sent_through: int) -> float:
        """Seconds the queued records wait for more before they are taken as a batch (0: now).

        A batch smaller than the maximum waits while an earlier batch of the session awaits its
        quorum, at most ``linger`` after its oldest record arrived: the records that arrive during
        a store round trip go as one batch when it commits (group commit, one flush per replica
        for all of them; docs/design/server.md "Quorum writes and batching"). Waiting for the
        quorum, not for every replica, keeps a slow replica from holding the next batch back;
        ``max_in_flight_batches`` bounds how far it may lag.

        Args:
            now: ``time.monotonic()``.
            linger: ``StoreConfig.linger``, seconds (0: never wait).
            max_records: ``StoreConfig.max_batch_records`` (a full batch never waits).
            sent_through: the last transaction ID the session has sent.

        Returns:
            Seconds left to wait; 0 or less: take the batch now.
        """
        if (
            linger <= 0
            or sent_through <= self._high_water_mark  # every batch sent committed
            or len(self._queued) >= max_records
        ):
            return 0.0
        return linger - (now - self._queued_since)

    def commit_through(self, transaction_id: int) -> None:
        """Commit every record in flight up to ``transaction_id`` (a quorum has flushed it).

        Their appends are resolved, then ``on_commit`` sees them; the high-water mark moves to
        ``transaction_id``. Records still queued then wake the session: those that lingered for
        this commit go now (docs/design/server.md "Quorum writes and batching").
        """
        kept: list[PendingAppend] = []
        in_flight = self._in_flight
        while in_flight and in_flight[0].transaction_id <= transaction_id:
            kept.append(in_flight.popleft())
        self._high_water_mark = max(self._high_water_mark, transaction_id)
        self._committed(kept)
        if self._queued:
            self._wakeup.set()

    def wake(self) -> None:
        """Wake the session waiting in :meth:`wait` (something it acts on changed)."""
        self._wakeup.set()

    async def wait(self, timeout: float | None) -> None:
        """Wait until the queue is woken (:meth:`put`, :meth:`wake`, a commit with records queued,
        :meth:`close`), at most ``timeout`` seconds (None: no limit); a wake-up from before the
        call does not count."""
        self._wakeup.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wakeup.wait(), timeout)

    # ---- resolving ----

    def _committed(self, kept: list[PendingAppend]) -> None:
        """Resolve the appends of newly committed records, then hand the records to ``on_commit``.

        In this order, so that what resolving an append sends a client (the lock failures that
        waited for it, ``docs/protocol.md`` "Append") goes out before the feed entries of the same
        commit: otherwise a client whose refused append is followed by one of its own in this
        commit would take the refusal for a lost append (its transaction monitor,
        docs/design/client.md "Failed-append detection") before the lock failure arrived.
        """
        if not kept:
            return
        for pending in kept:
            self._resolve(pending, None)
        if self._on_commit is not None:
            self._on_commit([pending.record for pending in kept])

    def _resolve(self, pending: PendingAppend, error: BaseException | None) -> None:
        """A queued or in-flight record leaves the store (committed, or failed with ``error``)."""
        self.pending_bytes -= len(pending.data)
        if pending.trace is not None:
            tracing.store_record_done(pending.trace, error)
        pending.resolve(error)
