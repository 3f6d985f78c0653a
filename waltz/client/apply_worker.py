"""The apply worker: one thread per partition calling ``apply_transaction`` in transaction-ID order.

Source: docs/design/client.md "Applying transactions" (the client invokes ``apply_transaction``
for the feed), "The client's parts" (a worker thread per partition, strictly in order, blocking
code allowed). The partition hands over feed entries in ID order, each ID once; an exception goes to
``uncaught_exception`` and the same transaction is applied again after a backoff, for as long as it
takes: a transaction is never skipped. While it retries the worker reports itself unhealthy.

A new child of a split holds its genesis until its parent's applied mark reaches ``B(p)``
(docs/design/splits.md "Clients across a split"; :class:`~waltz.client.genesis_hold.GenesisHold`):
a pause of the partition's apply, not a failure, so the worker stays healthy and reports nothing.
A :class:`~waltz.errors.GenesisHeldError` from the callbacks (the SQL framework's own check of the
parent's mark) is the same pause: tried again with a backoff, never reported as a failure.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from waltz import tracing
from waltz.client.callbacks import WaltzClientCallbacks
from waltz.client.genesis_hold import MAX_HOLD_POLL, GenesisHold
from waltz.client.metrics import PartitionMetrics
from waltz.client.submission import Submission
from waltz.client.transaction import Transaction
from waltz.client.waiting import Watermark
from waltz.errors import ApplyPausedError, ClientClosedError, GenesisHeldError, TransactionApplyError

__all__ = ["APPLY_THREAD_PREFIX", "ApplyWorker", "on_apply_thread"]

#: The name of an apply worker's thread is this prefix and the partition ID.
APPLY_THREAD_PREFIX = "waltz-apply-"

#: Seconds between two tries of a transaction that waits for this instance's upgrade
#: (:class:`~waltz.errors.ApplyPausedError`): it cannot succeed before a restart on newer code.
PAUSED_RETRY_INTERVAL = 30.0

log = logging.getLogger(__name__)


def on_apply_thread(partition_id: int | None = None) -> bool:
    """Whether the calling thread is an apply worker's (of ``partition_id``; None: of any
    partition), by its name: a wait for this instance's applies there would wait for itself."""
    name = threading.current_thread().name
    if partition_id is None:
        return name.startswith(APPLY_THREAD_PREFIX)
    return name == f"{APPLY_THREAD_PREFIX}{partition_id}"


class _Entry(NamedTuple):
    transaction: Transaction
    submission: Submission | None
    queued_at: float  # time.monotonic() when the feed handed it over


@dataclass(frozen=True, slots=True)
class _Floor:
    """Everything up to ``mark`` is applied already (by another instance sharing the database)."""

    mark: int


class ApplyWorker:
    """Applies one partition's committed transactions on a thread of its own.

    Args:
        partition_id: the partition.
        callbacks: the application's callbacks.
        applied: the partition's applied high-water mark; the worker advances it.
        max_batch: transactions per ``apply_transactions`` call when the callbacks override it.
        linger: seconds to wait for more transactions when fewer than ``max_batch`` are queued
            (only when batching; 0: apply what is there at once).
        initial_backoff: seconds before the first retry of a failed apply (doubles each time).
        max_backoff: the longest pause between retries, in seconds.
        metrics: the partition's counters (transactions applied, apply errors) and the apply's
            stages (``waltz_client_apply_wait_seconds``, ``waltz_client_apply_seconds``), or None.
        absorbed: the partition's absorbed high-water mark (``WaltzClientCallbacks.absorb_transactions``);
            the worker advances it before each apply when the callbacks absorb, else with
            ``applied``. None: not kept.
        hold: the genesis hold of a new child of a split (None: not a child, or its genesis is
            behind the floor already).
        on_pause: called (on the worker's thread) when the partition starts to wait for this
            instance's upgrade, with the error: the attempt path ends the retries that wait for a
            transaction this instance cannot apply (docs/design/client.md "Retries and lock
            failures").
    """

    def __init__(
        self,
        partition_id: int,
        callbacks: WaltzClientCallbacks,
        applied: Watermark,
        *,
        max_batch: int = 100,
        linger: float = 0.0,
        initial_backoff: float = 0.05,
        max_backoff: float = 5.0,
        metrics: PartitionMetrics | None = None,
        absorbed: Watermark | None = None,
        hold: GenesisHold | None = None,
        on_pause: Callable[[ApplyPausedError], None] | None = None,
    ) -> None:
        self.partition_id = partition_id
        self._on_pause = on_pause
        self._hold = hold
        self.callbacks_hold: GenesisHeldError | None = None
        """Set while the callbacks refuse the genesis for their own check of the parent's mark
        (:class:`~waltz.errors.GenesisHeldError`): a hold, not a failure."""
        self._callbacks = callbacks
        self._applied = applied
        self._absorbed = absorbed
        self._absorbs = absorbed is not None and callbacks.absorbs_transactions
        self._batching = type(callbacks).apply_transactions is not WaltzClientCallbacks.apply_transactions
        # Without apply_transactions the worker still takes what is ready (up to max_batch) at once,
        # then applies and marks each transaction in turn: one wake-up per run, not per transaction.
        self._max_batch = max_batch
        self._linger = linger if self._batching else 0.0
        self._prefetch = callbacks.prefetch_transaction_data or self._absorbs
        self._initial_backoff = initial_backoff
        self._max_backoff = max_backoff
        self._metrics = metrics
        self._items: deque[_Entry | _Floor] = deque()
        self._floors = 0  # the floors among the items
        self._in_progress = 0  # transactions of the batch being applied
        self._condition = threading.Condition()
        self._closed = threading.Event()
        self.healthy = True
        """False while an apply keeps failing (the partition retries it with backoff)."""
        self.last_error: BaseException | None = None
        self.failures = 0
        """Failed apply calls so far."""
        self.paused: ApplyPausedError | None = None
        """Set while the partition waits for this instance's upgrade (a record of a newer form or
        schema version than its code knows); None otherwise. ``last_error`` is the same error."""
        self._thread = threading.Thread(
            target=self._run, name=f"{APPLY_THREAD_PREFIX}{partition_id}", daemon=True
        )

    def start(self) -> None:
        """Start the thread."""
        self._thread.start()

    @property
    def thread_ident(self) -> int | None:
        """The worker thread's identifier (``threading.get_ident()`` on it; None before start)."""
        return self._thread.ident

    @property
    def running(self) -> bool:
        """True while the worker's thread runs: started, and not yet ended (a closed worker's
        thread ends once the apply in progress, if any, returns)."""
        return self._thread.is_alive()

    def is_current_thread(self) -> bool:
        """True when called from this worker's thread (inside ``apply_transaction``)."""
        return threading.current_thread() is self._thread

    @property
    def holding(self) -> bool:
        """True while the partition's genesis is held (docs/design/splits.md "Clients across a
        split"): by the client, for its parent's applied mark, or by the callbacks' own check."""
        hold = self._hold
        return (hold is not None and hold.holding) or self.callbacks_hold is not None

    @property
    def backlog(self) -> int:
        """Transactions held for the application: queued, plus the batch being applied (the
        floors queued are not transactions)."""
        return len(self._items) - self._floors + self._in_progress

    @property
    def applied_mark(self) -> int:
        """The applied mark, counting the floors at the head of the queue (:meth:`set_floor`):
        what the mark is once the worker takes them, before it applies anything more. A mount
        reads it right after setting its floor, before the worker thread has taken it, for its
        feed window (docs/design/client.md "Back pressure")."""
        with self._condition:
            mark = self._applied.value
            if not self._in_progress:
                for item in self._items:
                    if not isinstance(item, _Floor):
                        break
                    mark = max(mark, item.mark)
            return mark

    def enqueue(self, transaction: Transaction, submission: Submission | None = None) -> None:
        """Queue the next committed transaction (IDs must come in increasing order, each once)."""
        with self._condition:
            self._items.append(_Entry(transaction, submission, time.monotonic()))
            self._condition.notify()

    def enqueue_many(self, entries: list[tuple[Transaction, Submission | None]]) -> None:
        """Queue several committed transactions at once (one wake-up), like :meth:`enqueue`."""
        now = time.monotonic()
        with self._condition:
            self._items.extend(_Entry(transaction, submission, now) for transaction, submission in entries)
            self._condition.notify()

    def set_floor(self, mark: int) -> None:
        """After what is queued, count every transaction up to ``mark`` as applied."""
        with self._condition:
            self._items.append(_Floor(mark))
            self._floors += 1
            self._condition.notify()

    def close(self, timeout: float = 10.0) -> None:
        """Stop after the apply in progress (queued transactions are left), waiting up to
        ``timeout`` seconds for it; past them the thread is left to end when that apply returns
        (:attr:`running`). Idempotent."""
        self._closed.set()
        with self._condition:
            self._condition.notify_all()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning(
                    "partition %d: apply_transaction still running after %gs; leaving its thread",
                    self.partition_id,
                    timeout,
                )

    def _take(self) -> list[_Entry] | None:
        with self._condition:
            while True:
                if self._closed.is_set():
                    return None
                while self._items and isinstance(self._items[0], _Floor):
                    floor = self._items.popleft()
                    assert isinstance(floor, _Floor)
                    self._floors -= 1
                    if self._absorbs:
                        self._absorb_floor(floor.mark)
                    if self._absorbed is not None:
                        self._absorbed.advance(floor.mark)
                    self._applied.advance(floor.mark)
                if self._linger > 0 and 0 < len(self._items) < self._max_batch:
                    self._wait_to_fill()
                    if self._closed.is_set():
                        return None
                batch: list[_Entry] = []
                while self._items and len(batch) < self._max_batch:
                    item = self._items[0]
                    if isinstance(item, _Floor):
                        break
                    self._items.popleft()
                    if item.transaction.transaction_id <= self._applied.value:
                        continue  # applied already (below a floor)
                    batch.append(item)
                if batch:
                    self._in_progress = len(batch)
                    return batch
                if not self._items:
                    self._condition.wait()

    def _wait_to_fill(self) -> None:
        """Wait (holding the condition) up to ``linger`` seconds for a full batch."""
        deadline = time.monotonic() + self._linger
        while len(self._items) < self._max_batch and not self._closed.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self._condition.wait(remaining)

    def _run(self) -> None:
        try:
            self._run_batches()
        finally:
            if self._absorbs:  # the partition is no longer followed: nothing more is absorbed
                try:
                    self._callbacks.absorb_stopped(self.partition_id)
                except Exception:
                    log.exception("partition %d: absorb_stopped raised", self.partition_id)

    def _run_batches(self) -> None:
        while True:
            batch = self._take()
            if batch is None:
                return
            hold = self._hold
            if hold is not None and batch[0].transaction.transaction_id >= hold.genesis:
                # The genesis opens the child's log, so it is first in its batch: held, before
                # it is loaded, absorbed or applied, until the parent's mark reaches B(p).
                if batch[0].transaction.transaction_id == hold.genesis and not hold.wait(self._closed):
                    return
                self._hold = None
            if tracing.client_tracing_on:
                tracing.apply_taken(batch)
            started = time.monotonic()
            transactions = [entry.transaction for entry in batch]
            if self._absorbs:
                if not self._apply((), transactions):
                    return  # the data first (retried like an apply), then absorbed, then applied
                self._absorb(transactions)
            if self._batching:
                if not self._apply(transactions):
                    return
                self._applied.advance(batch[-1].transaction.transaction_id)
                if self._absorbed is not None and not self._absorbs:
                    self._absorbed.advance(batch[-1].transaction.transaction_id)
                for entry in batch:
                    if entry.submission is not None:
                        entry.submission.applied()
                if self._metrics is not None:
                    count = len(batch)
                    waited = count * started - sum(entry.queued_at for entry in batch)
                    self._add_stages(waited, count * (time.monotonic() - started), count)
            else:
                advance = self._applied.advance
                apply = self._callbacks.apply_transaction
                closed = self._closed.is_set
                if self._prefetch and not self._absorbs and not self._apply((), transactions):
                    return  # the run's data fetched first (retried like an apply)
                timed = self._metrics is not None
                began = started  # the start of this transaction's apply
                waited = applying = 0.0  # the stages of those applied so far, added once at the end
                done = 0
                for entry in batch:  # each applied, then marked, before the next one
                    if closed():
                        return  # close() stops after the apply in progress
                    transaction = entry.transaction
                    try:
                        apply(transaction)
                    except ClientClosedError:
                        return  # the client is closing: stop quietly
                    except Exception as exc:  # reported and retried with backoff, never skipped
                        if not self._apply((transaction,), failed=exc):
                            return
                    else:
                        self.healthy = True
                    advance(transaction.transaction_id)
                    if self._absorbed is not None and not self._absorbs:
                        self._absorbed.advance(transaction.transaction_id)
                    self._in_progress -= 1
                    if entry.submission is not None:
                        entry.submission.applied()
                    if timed:
                        now = time.monotonic()
                        waited += began - entry.queued_at
                        applying += now - began
                        done += 1
                        began = now
                if timed and done:
                    self._add_stages(waited, applying, done)
            self._in_progress = 0
            if self._metrics is not None:
                self._metrics.applied.inc(len(batch))

    def _add_stages(self, waited: float, applying: float, count: int) -> None:
        """Add ``count`` transactions of a run to the apply's stage summaries, once per run:
        ``waited`` seconds in all from each one's ``queued_at`` to the start of its apply (behind
        earlier applies), ``applying`` seconds in all from there to its apply's end (its data
        loaded, absorbed, applied and marked; retries included), so that the two add up to the
        time from the feed handing it over to its apply's end."""
        assert self._metrics is not None
        self._metrics.apply_wait_seconds.add(waited, count)
        self._metrics.apply_seconds.add(applying, count)

    def _absorb(self, transactions: list[Transaction]) -> None:
        """Hand a loaded batch to ``absorb_transactions``, then advance the absorbed mark (an
        exception is logged: the callbacks' own state then falls back on the database)."""
        try:
            self._callbacks.absorb_transactions(transactions)
        except Exception:
            log.exception("partition %d: absorb_transactions raised", self.partition_id)
        assert self._absorbed is not None
        self._absorbed.advance(transactions[-1].transaction_id)

    def _absorb_floor(self, mark: int) -> None:
        try:
            self._callbacks.absorb_floor(self.partition_id, mark)
        except Exception:
            log.exception("partition %d: absorb_floor raised", self.partition_id)

    def _apply(
        self,
        transactions: Sequence[Transaction],
        prefetch: list[Transaction] | None = None,
        failed: Exception | None = None,
    ) -> bool:
        """Apply ``transactions`` (one: ``apply_transaction``; more: ``apply_transactions``; none:
        only the fetch), retrying with backoff until it succeeds; False when the worker closed.

        With ``prefetch_transaction_data``, the data of ``prefetch`` (default: ``transactions``) is
        fetched first, inside the retry. ``failed``: a first try already raised this (it is
        reported and backed off from before the next try).
        """
        backoff = self._initial_backoff
        error = failed
        while not self._closed.is_set():
            if error is None:
                try:
                    if self._prefetch:
                        Transaction.load_data(list(transactions) if prefetch is None else prefetch)
                    if len(transactions) == 1:
                        self._callbacks.apply_transaction(transactions[0])
                    elif transactions:
                        self._callbacks.apply_transactions(transactions)
                except ClientClosedError:
                    return False  # the client is closing: stop quietly
                except Exception as exc:
                    error = exc
                else:
                    self.healthy = True
                    self.paused = None
                    if self.callbacks_hold is not None:
                        self._callbacks_hold_ended()
                    return True
            failing = transactions or prefetch
            first_id = failing[0].transaction_id if failing else -1
            reported: BaseException = error
            if isinstance(error, TransactionApplyError):  # a batch names its failing transaction
                first_id, reported = error.transaction_id, error.cause
            if isinstance(reported, GenesisHeldError):  # a pause, not a failure
                if not self._callbacks_held(first_id, reported, backoff):
                    return False
                backoff = min(MAX_HOLD_POLL, backoff * 2)
                error = None
                continue
            self.healthy = False
            self.last_error = error
            if isinstance(reported, ApplyPausedError):
                if not self._pause(first_id, reported):
                    return False
                error = None
                continue
            self.failures += 1
            if self._metrics is not None:
                self._metrics.apply_errors.inc()
            log.warning(
                "partition %d: applying transaction %d%s failed (%r); retrying in %.2fs",
                self.partition_id,
                first_id,
                f" (batch of {len(transactions)})" if len(transactions) > 1 else "",
                error,
                backoff,
            )
            try:
                self._callbacks.uncaught_exception(self.partition_id, first_id, reported)
            except Exception:
                log.exception("partition %d: uncaught_exception raised", self.partition_id)
            if self._closed.wait(backoff):
                return False
            backoff = min(self._max_backoff, backoff * 2)
            error = None
        return False

    def _callbacks_held(self, transaction_id: int, error: GenesisHeldError, pause: float) -> bool:
        """The callbacks held the genesis ``transaction_id`` for their own check of the parent's
        mark (docs/design/splits.md "The SQL framework across a split"): log the hold's start
        once, wait ``pause`` seconds (the caller doubles it up to :data:`MAX_HOLD_POLL`), and let
        the caller try again. The partition stays healthy and nothing is reported. False when the
        worker closed meanwhile."""
        if self.callbacks_hold is None:
            log.info(
                "partition %d: its callbacks hold the genesis at %d until partition %d is applied up to "
                "%d in their database (%d now); the partition's apply pauses",
                self.partition_id,
                transaction_id,
                error.parent,
                error.barrier,
                error.parent_mark,
            )
        self.callbacks_hold = error
        return not self._closed.wait(pause)

    def _callbacks_hold_ended(self) -> None:
        held = self.callbacks_hold
        self.callbacks_hold = None
        if held is not None:
            log.info(
                "partition %d: its callbacks applied the genesis after partition %d reached %d",
                self.partition_id,
                held.parent,
                held.barrier,
            )

    def _pause(self, transaction_id: int, error: ApplyPausedError) -> bool:
        """Wait before trying a transaction this instance's code cannot read yet: the first time
        it is logged and reported to ``uncaught_exception`` (once, not at every try), and the
        partition is unhealthy with the error as its reason until a try succeeds. Returns False
        when the worker closed meanwhile."""
        first = self.paused is None or str(self.paused) != str(error)
        self.paused = error
        self.last_error = error
        if first:
            self.failures += 1
            if self._metrics is not None:
                self._metrics.apply_errors.inc()
            log.warning(
                "partition %d waits at transaction %d for this instance's upgrade: %s; trying again "
                "every %.0fs (its other partitions go on)",
                self.partition_id,
                transaction_id,
                error,
                PAUSED_RETRY_INTERVAL,
            )
            try:
                self._callbacks.uncaught_exception(self.partition_id, transaction_id, error)
            except Exception:
                log.exception("partition %d: uncaught_exception raised", self.partition_id)
            if self._on_pause is not None:
                try:
                    self._on_pause(error)
                except Exception:
                    log.exception("partition %d: the pause's hook raised", self.partition_id)
        return not self._closed.wait(PAUSED_RETRY_INTERVAL)
