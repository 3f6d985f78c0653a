"""The contexts a client has in flight, each holding a concurrency slot of its partition.

Source: docs/design/client.md "Back pressure" (transactions in flight). Each partition admits at
most ``client.maxConcurrentTransactions`` contexts that have not ended; a context is admitted with
a slot (:class:`~waltz.client.waiting.ConcurrencyLimit`, handed over in FIFO order) and gives it
back when it ends. A context routed again after a refusal of its epoch keeps the slot it was
admitted with (``Submission.slot_partition``); it is counted in flight on the partition it goes
to now (docs/design/splits.md "Clients across a split"). Thread-safe: contexts are admitted on
the submitting threads and end on the client's retry and completion threads.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable

from waltz.client.submission import Submission
from waltz.client.waiting import ConcurrencyLimit, wake_on_their_loops

__all__ = ["InFlight"]


class InFlight:
    """The submissions of a client that have not ended, and their partitions' slots.

    Args:
        partition_ids: the client's partitions.
        limit: contexts in flight per partition at most (``client.maxConcurrentTransactions``).

    Raises:
        ValueError: ``limit`` is not positive.
    """

    def __init__(self, partition_ids: Iterable[int], limit: int) -> None:
        self._limit = limit
        self._limits = {pid: ConcurrencyLimit(limit) for pid in partition_ids}
        self._submitted = dict.fromkeys(self._limits, 0)  # contexts admitted, read when scraped
        self._in_flight: set[Submission] = set()
        self._lock = threading.Lock()  # taken alone on the per-transaction paths
        # wait_idle_async's waiters, woken (each on its own loop) when submissions end or at close
        self._async_waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    def add_partition(self, partition_id: int) -> None:
        """Give a partition the client made later (a new child of a split, docs/design/splits.md
        "Clients across a split") its slots; nothing when it has them."""
        with self._lock:
            if partition_id not in self._limits:
                self._limits[partition_id] = ConcurrencyLimit(self._limit)
                self._submitted[partition_id] = 0

    def try_admit(self, submission: Submission) -> bool:
        """Admit a submission if its partition has a slot free now (and nobody waits for one);
        never blocks."""
        if not self._limits[submission.slot_partition].try_acquire():
            return False
        self._add(submission)
        return True

    def admit(self, submission: Submission, timeout: float | None) -> bool:
        """Admit a submission, waiting at most ``timeout`` seconds (None: forever) for a slot of
        its partition; False when none came in time."""
        if not self._limits[submission.slot_partition].acquire(timeout):
            return False
        self._add(submission)
        return True

    async def admit_async(self, submission: Submission, timeout: float | None) -> bool:
        """As :meth:`admit`, from a coroutine (cancellation admits nothing)."""
        if not await self._limits[submission.slot_partition].acquire_async(timeout):
            return False
        self._add(submission)
        return True

    def _add(self, submission: Submission) -> None:
        with self._lock:
            self._in_flight.add(submission)
            self._submitted[submission.slot_partition] += 1

    def finished(self, submissions: Iterable[Submission]) -> None:
        """Take ended submissions out of flight and give their slots back (those not in flight
        are left alone)."""
        limits = self._limits
        with self._lock:
            in_flight = self._in_flight
            for submission in submissions:
                if submission in in_flight:
                    in_flight.discard(submission)
                    limits[submission.slot_partition].release()
            if self._async_waiters:
                self._wake_async_waiters()

    def count(self, partition_id: int | None = None) -> int:
        """Submissions in flight (of one partition, or all)."""
        with self._lock:
            if partition_id is None:
                return len(self._in_flight)
            return sum(1 for s in self._in_flight if s.partition_id == partition_id)

    def counts(self) -> tuple[Counter[int], dict[int, int]]:
        """Partition ID -> submissions in flight, and -> submissions admitted so far (the
        ``waltz_client_transactions_submitted_total`` counter)."""
        with self._lock:
            return Counter(s.partition_id for s in self._in_flight), dict(self._submitted)

    async def wait_idle_async(
        self,
        timeout: float | None,
        step: float,
        check_open: Callable[[], None],
        nudge: Callable[[set[int]], None],
    ) -> bool:
        """Wait until no submission is in flight; False after ``timeout`` seconds (None: no limit).
        No thread waits: the submissions that end wake the waiter on its own loop, and cancelling
        the await leaves nothing behind.

        Args:
            timeout: seconds at most.
            step: seconds between two calls of ``nudge`` while nothing ends.
            check_open: raises when the client closed (checked at every wake-up, so a client
                that closes while the wait has submissions in flight ends it with the error).
            nudge: called with the partitions of the submissions still in flight.
        """
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                if not self._in_flight:
                    return True
                waiter: asyncio.Future[None] = loop.create_future()
                self._async_waiters.append((loop, waiter))
            try:
                check_open()
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                try:
                    await asyncio.wait_for(waiter, step if remaining is None else min(step, remaining))
                except TimeoutError:
                    with self._lock:
                        partitions = {s.partition_id for s in self._in_flight}
                    if partitions:
                        nudge(partitions)
                check_open()  # woken by a close: what was in flight ended failed, not committed
            finally:
                with self._lock:
                    if (loop, waiter) in self._async_waiters:
                        self._async_waiters.remove((loop, waiter))

    def _wake_async_waiters(self) -> None:
        """Wake every :meth:`wait_idle_async` (the lock held): each looks again."""
        wake_on_their_loops(self._async_waiters)
        self._async_waiters.clear()

    def close(self) -> list[Submission]:
        """The submissions still in flight (the client closes; their waiters wake up)."""
        with self._lock:
            in_flight = list(self._in_flight)
            self._wake_async_waiters()
        return in_flight
