"""The attempt path: a submitted transaction context, from ``submit`` to its one outcome.

Source: docs/design/client.md "From submit to the outcome", "Retries and lock failures";
docs/design/locks.md "Locks of appends in flight" (claims, the queue behind a holder). An
:class:`AttemptRunner` admits a context (a concurrency slot of its partition, read your writes),
runs its first attempt on the submitting thread (claims, or a place in the queue behind an own
pending append, then ``execute``), hands the append to the client's event loop, where its
:class:`~waltz.client.client_partition.ClientPartition` sends it, and hears from the partition how
it ended: committed (completed on the completion thread), failed (run again on a retry thread,
once what it waits for is applied), refused for its partition epoch (routed again once the epochs
move and run again from its first attempt, docs/design/splits.md "Clients across a split"), or
rejected. A context is routed by the client's view of the partition epochs
(:class:`~waltz.client.routing.EpochRouting`): its partition and the epoch its appends carry.
The partition and the :class:`~waltz.client.submission.Submission` are its parts: the partition
sends, holds back and resolves appends, the submission runs one attempt and ends once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Coroutine, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from waltz.client.apply_worker import on_apply_thread
from waltz.client.arguments import check_client_mark, check_integer
from waltz.client.busy_threads import BusyThreads
from waltz.client.callbacks import WaltzClientCallbacks
from waltz.client.client_partition import ClientPartition
from waltz.client.config import WaltzClientConfig
from waltz.client.context import AppendPayload, TransactionContext
from waltz.client.in_flight import InFlight
from waltz.client.metrics import ClientMetrics
from waltz.client.routing import EPOCH_WAIT_SECONDS, EpochRouting, Route, RoutingView
from waltz.client.submission import Submission
from waltz.client.waiting import Watermark
from waltz.errors import (
    ApplyPausedError,
    ClientClosedError,
    PartitionNotMountedError,
    PartitionNotOpenError,
    PartitionPausedError,
    WaltzClientError,
)
from waltz.protocol.event_loop import run_on_shared_loop

if TYPE_CHECKING:
    from waltz.tracing import ClientTracing

__all__ = ["AttemptRunner"]

log = logging.getLogger(__name__)

#: Seconds at least between two warnings of a client that its retry threads are held.
BUSY_WARNING_INTERVAL = 30.0


class AttemptRunner:
    """Runs the attempts of a client's submitted contexts, each up to its single outcome.

    Args:
        client_id: the client's ID (for messages).
        config: the client configuration.
        callbacks: the application's callbacks (``get_client_high_water_mark`` before an attempt).
        metrics: the client's metrics (the stages of a transaction's latency).
        loop: the client's event loop, where appends are sent.
        partitions: the client's partitions by ID.
        in_flight: the client's submissions in flight, with their partitions' concurrency slots.
        spawn: runs a coroutine as a task on the loop that the client cancels when it closes.
        nudge: sends flush requests to partitions with appends pending (thread-safe).
        tracing: the client's traces, or None when tracing is off.
        routing: the client's view of the partition epochs (default: a view of its partitions'
            count with no epoch, never moved).
    """

    def __init__(
        self,
        client_id: int,
        config: WaltzClientConfig,
        callbacks: WaltzClientCallbacks,
        metrics: ClientMetrics,
        loop: asyncio.AbstractEventLoop,
        partitions: Mapping[int, ClientPartition],
        in_flight: InFlight,
        spawn: Callable[[Coroutine[Any, Any, Any]], None],
        nudge: Callable[[Iterable[int]], None],
        tracing: ClientTracing | None = None,
        routing: EpochRouting | None = None,
    ) -> None:
        self._client_id = client_id
        self._routing = routing if routing is not None else EpochRouting(len(partitions))
        self._config = config
        self._callbacks = callbacks
        self._metrics = metrics
        self._loop = loop
        self._partitions = partitions
        self._in_flight = in_flight
        self._spawn = spawn
        self._nudge = nudge
        self._tracing = tracing
        self._closed = False
        self._floors: dict[int, int] = {}  # a new child of a split -> its floor, B(p)
        self._completions: list[tuple[Submission, int]] = []
        self._inbox: deque[tuple[ClientPartition, Submission, AppendPayload, float]] = deque()
        self._inbox_lock = threading.Lock()
        self._inbox_scheduled = False
        self._retry_idents: set[int] = set()  # the retry threads' (close() may run on one)
        self._executor = concurrent.futures.ThreadPoolExecutor(
            config.client_num_transaction_retry_threads,
            thread_name_prefix="waltz-retry",
            initializer=self._note_retry_thread,
        )
        # Lock failures' retries that wait for their partition's apply, by partition (any thread):
        # ended if the apply starts to wait for this instance's upgrade (apply_paused).
        self._awaiting_apply: dict[int, set[Submission]] = {}
        self._awaiting_lock = threading.Lock()
        # What the retry threads and the completion thread run: named when they are held long.
        self._busy = BusyThreads()
        self._completing = BusyThreads()
        # Completions (futures, on_completion) on a thread of their own, in commit order: behind
        # re-attempts, which read the application's database, they waited tens of milliseconds.
        self._completer_ident: int | None = None
        self._completion_watch: asyncio.TimerHandle | None = None  # see _watch_completions
        # Batches of completions handed to the completion thread and ended: each count written by
        # one thread only (the loop, the completion thread); their difference is what it still has.
        self._completions_handed = 0
        self._completions_ended = 0
        self._completer = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="waltz-complete", initializer=self._note_completer
        )

    # --- submit: admission, read your writes, the first attempt ----------------------------------

    def submit(self, context: TransactionContext, with_future: bool) -> Submission:
        """Admit a context (blocking at the concurrency limit, up to the context's timeout, after
        which it expires with no slot taken), then run its first attempt on the calling thread
        (``WaltzClient.submit`` and ``WaltzClient.execute``; docs/design/client.md "Back
        pressure").

        A context routed to a partition this client does not have (a new partition of a split, not
        open yet) is admitted on its ancestor's slot and waits for the partition epochs to move,
        as a context refused for its epoch does (:meth:`route_again`).

        An error of its wait to read this client's own writes ends the context with that error
        (its slot freed), as an error of ``execute`` would.

        Raises:
            ClientClosedError: the client is closed.
            PartitionNotMountedError: the partition is not mounted (auto-mount off).
            ValueError: ``partition_id`` returned a partition outside the current count.
            WaltzClientError: called on the completion thread while the partition is at its limit.
        """
        partition, submission = self._new_submission(context, with_future)
        in_flight = self._in_flight
        if self.on_completion_thread():
            if not in_flight.try_admit(submission):
                # Waiting here would wait for completions, which only this thread runs.
                raise WaltzClientError(
                    f"submit() from a completion callback found partition {partition.partition_id} at "
                    f"its limit of {self._config.client_max_concurrent_transactions} transactions in "
                    "flight; waiting would deadlock (completions run on this thread): submit from "
                    "another thread"
                )
        else:
            long_wait = self._config.client_long_wait_threshold
            while not in_flight.admit(submission, _slot_wait(submission, long_wait)):
                self.check_open()
                if submission.expired():  # no slot within its timeout: it ends with none
                    submission.expire()
                    return submission
                self._nudge([partition.partition_id])
        if partition.partition_id != submission.partition_id:  # a partition not open yet
            self._call_on_loop(self._wait_for_route, submission, self._not_open(submission))
            return submission
        wait = self._read_your_writes_wait(partition, submission)
        if wait is not None:
            try:
                _waited_mark(partition, submission).wait(*wait)
            except BaseException as exc:  # the context ends with it, freeing its slot
                submission.fail(exc)
                if not isinstance(exc, Exception):
                    raise  # KeyboardInterrupt, SystemExit: the context ended, the caller goes
                return submission
        self._first_attempt(partition, submission)
        return submission

    async def submit_async(self, context: TransactionContext) -> Submission:
        """As :meth:`submit` with a future, for a coroutine: waits only while the partition is at
        the concurrency limit (up to the context's timeout, as :meth:`submit`) or for read your
        writes (``AsyncWaltzClient.submit``). The first
        attempt runs on the calling loop, or, for a context whose ``execute`` blocks
        (``TransactionContext.execute_blocks``), on a retry thread while the coroutine awaits it:
        the loop never waits for a database.

        Cancelling the await once the context is admitted stops the waiting, not the submission
        (``AsyncWaltzClient.submit_async``): a context cancelled while it waits to read its writes
        waits on, on the client's loop, and has its first attempt on a retry thread; one whose
        first attempt waits for a retry thread keeps its place there. Either way it ends as any
        other, and its concurrency slot is freed then."""
        partition, submission = self._new_submission(context, True)
        long_wait = self._config.client_long_wait_threshold
        while not await self._in_flight.admit_async(submission, _slot_wait(submission, long_wait)):
            self.check_open()
            if submission.expired():  # no slot within its timeout: it ends with none
                submission.expire()
                return submission
            self._nudge([partition.partition_id])
        if partition.partition_id != submission.partition_id:  # a partition not open yet
            self._call_on_loop(self._wait_for_route, submission, self._not_open(submission))
            return submission
        wait = self._read_your_writes_wait(partition, submission)
        if wait is not None:
            target, timeout = wait
            deadline = time.monotonic() + timeout
            try:
                await _waited_mark(partition, submission).wait_async(target, timeout)
            except asyncio.CancelledError:
                left = max(0.0, deadline - time.monotonic())
                self._call_on_loop(self._first_attempt_after_wait, partition, submission, target, left)
                raise
            except Exception as exc:  # the context ends with it, freeing its slot
                submission.fail(exc)
                return submission
        if not context.execute_blocks:
            self._first_attempt(partition, submission)
            return submission
        try:
            attempt = self._executor.submit(self._on_retry_thread, self._first_attempt, partition, submission)
        except RuntimeError:  # the executor shut down: the client closed under us
            submission.fail(ClientClosedError(f"Waltz client {self._client_id} is closed"))
            return submission
        # A cancelled await must not cancel the attempt still queued for a thread: asyncio.wait
        # and shield leave it be.
        ran = asyncio.wrap_future(attempt)
        long_wait = self._config.client_long_wait_threshold
        done, _ = await asyncio.wait({ran}, timeout=long_wait)
        if not done:
            if not attempt.running():
                self._warn_of_busy_retry_threads(submission, long_wait)
            await asyncio.shield(ran)
        ran.result()
        return submission

    def _on_retry_thread(self, attempt: Callable[..., None], partition: ClientPartition, *args: Any) -> None:
        """Run ``attempt(partition, *args)`` (a first or next attempt, on a retry thread), noted
        as the thread's work while it runs."""
        submission = args[0]
        with self._busy.running(
            lambda: f"{type(submission.context).__name__} (partition {partition.partition_id})"
        ):
            attempt(partition, *args)

    def _warn_of_busy_retry_threads(self, submission: Submission, waited: float) -> None:
        """Say that a first attempt waited ``waited`` seconds for a retry thread while one of them
        runs one attempt for as long, naming what they run and the likely cause; at most once per
        :data:`BUSY_WARNING_INTERVAL` seconds."""
        busy = self._busy.held(waited, BUSY_WARNING_INTERVAL)  # not many short attempts: a queue
        if not busy:
            return
        log.warning(
            "%s on partition %d: its first attempt has waited %.1fs for one of the client's %d retry "
            "threads (client.numTransactionRetryThreads), busy with: %s. An attempt (execute, an "
            "entity context's run) that waits there for another transaction's outcome waits for "
            "ever when that transaction's attempt needs one of these threads: take outcomes outside "
            "the attempt; attempts that are only slow (a database a round trip away) want more "
            'threads (docs/design/client.md, "WaltzClient and AsyncWaltzClient")',
            type(submission.context).__name__,
            submission.partition_id,
            waited,
            self._config.client_num_transaction_retry_threads,
            ", ".join(f"{what} for {seconds:.1f}s" for what, seconds in busy),
        )

    def set_floor(self, partition_id: int, floor: int) -> None:
        """A new child of a split: its mark is never read below ``floor``, its parent's ``B(p)``
        (docs/design/splits.md "Clients across a split")."""
        self._floors[partition_id] = floor

    def client_high_water_mark(self, partition_id: int) -> int:
        """The callbacks' ``get_client_high_water_mark``, read as a new child's floor when below
        it (what an attempt builds at)."""
        mark = self._callbacks.get_client_high_water_mark(partition_id)
        if type(mark) is not int or mark < -1:
            mark = check_client_mark(mark, f"the mark get_client_high_water_mark({partition_id}) returned")
        floor = self._floors.get(partition_id)
        return mark if floor is None or mark >= floor else floor

    def check_open(self) -> None:
        """Raise :class:`ClientClosedError` once the client is closing."""
        if self._closed:
            raise ClientClosedError(f"Waltz client {self._client_id} is closed; create a new one")

    def _route(self, context: TransactionContext, view: RoutingView) -> Route:
        """Route a context by ``view`` (docs/design/splits.md "Clients across a split"):
        ``partition_id`` is asked with the newest count, and the route goes down to the count
        before while the key's parent there is not sealing. The context is told its route
        (``TransactionContext.routed``).

        Raises:
            TypeError: the context's ``partition_id`` returned something other than an int.
            ValueError: the context chose a partition outside ``0 .. count - 1``.
        """
        count = view.count
        pid = context.partition_id(count)
        if type(pid) is not int:
            pid = check_integer(pid, f"{type(context).__name__}.partition_id's result")
        if not 0 <= pid < count:
            raise ValueError(f"{type(context).__name__}.partition_id returned {pid}, outside 0..{count - 1}")
        route = view.route(pid)
        context.routed(route.partition_id, count if route.partition_id == pid else view.count_of(route.epoch))
        return route

    def _new_submission(
        self, context: TransactionContext, with_future: bool = True
    ) -> tuple[ClientPartition, Submission]:
        """Route a context and make its submission (not yet admitted; with a future, or without
        one for ``WaltzClient.execute``).

        Returns:
            The partition whose concurrency slot it takes, and the submission. The partition is
            the one it is routed to, or, when this client does not have that one (a new partition
            of a split), its ancestor among the client's partitions (the submission's
            ``partition_id`` then names the new one).

        Raises:
            ClientClosedError: the client is closed.
            ValueError: the context chose a partition outside ``0 .. count - 1``.
            PartitionNotMountedError: the partition is not mounted (auto-mount off).
        """
        self.check_open()
        partitions = self._partitions
        view = self._routing.view
        pid, epoch = self._route(context, view)
        partition = partitions.get(pid)
        if partition is None:  # a new partition of a split: it holds its ancestor's slot
            partition = partitions[_ancestor_among(view, pid, partitions)]
        if not partition.wanted:
            mounted = sorted(p.partition_id for p in list(partitions.values()) if p.wanted)
            raise PartitionNotMountedError(partition.partition_id, mounted)
        submission = Submission(
            context,
            pid,
            self.client_high_water_mark,
            self._config.client_max_message_bytes,
            on_finished=self._finished,
            with_future=with_future,
            epoch=epoch,
            route_serial=view.serial,
            slot_partition=partition.partition_id,
            wait_refusal=self._wait_refusal,
        )
        if self._tracing is not None:
            submission.trace = self._tracing.begin(pid, context)
        return partition, submission

    def _read_your_writes_wait(
        self, partition: ClientPartition, submission: Submission
    ) -> tuple[int, float] | None:
        """What a first attempt waits for: (the mark to reach, seconds at most) on
        :func:`_waited_mark` (the absorbed mark for a context that reads absorbed state, as its
        retries wait, else the applied mark), or None when there is nothing to wait for (the
        partition reached this client's own last commit already, checked first as the common
        case; or no time is left to wait)."""
        target = partition.own_committed_mark
        if _waited_mark(partition, submission).value >= target:
            return None
        if partition.on_apply_thread():
            return None  # called from apply_transaction: waiting for ourselves would only time out
        limit = self._config.client_read_your_writes_timeout
        remaining = submission.remaining()
        timeout = limit if remaining is None else min(limit, remaining)
        return (target, timeout) if timeout > 0 else None

    def _first_attempt(self, partition: ClientPartition, submission: Submission) -> None:
        """Run the first attempt on the calling thread and send its append; or, when a pending
        append of this client holds one of the context's expected locks, queue the context behind
        it, and when a commit of this client that the attempt would not see wrote one, let it wait
        for that commit (``TransactionContext.expected_locks``); or, when another context's first
        attempt claimed one of them that this client writes, let it wait for that context's append
        (:meth:`ClientPartition.claim`; docs/design/locks.md, "Locks of appends in flight").
        A partition whose server refused its mount (the client's mark above the log's) ends the
        context with the refusal at once: nothing would be sent (docs/design/client.md "Mount and
        the client high-water mark")."""
        refusal = partition.refusal
        if refusal is not None:
            submission.fail(refusal)
            return
        try:
            expected = submission.context.expected_locks()
        except Exception as exc:  # the application's hint: its error ends the context, as execute's
            submission.fail(exc)
            return
        if expected and self._config.client_hold_conflicting_appends:
            hashes = [lock.lock_hash for lock in expected]
            if not partition.claim(submission, hashes):
                return  # another context's first attempt claimed one: it goes behind that one
            if partition.holds_any(hashes, _waited_mark(partition, submission).value):
                try:  # it keeps its claims until its append is on the loop: a queue per lock
                    self._loop.call_soon_threadsafe(partition.queue_first_attempt, submission, hashes)
                except RuntimeError:
                    submission.fail(ClientClosedError(f"Waltz client {self._client_id} is closed"))
                    self._release_claims(partition, submission)
                return
        payload = submission.attempt()
        if payload is not None:
            self._post(partition, submission, payload)  # the loop releases its claims
        else:
            self._release_claims(partition, submission)

    def _release_claims(self, partition: ClientPartition, submission: Submission) -> None:
        """End the claims of a context that sends no append after all (any thread): those waiting
        for it are queued on the loop, after whatever this thread handed to the loop before."""
        if not partition.has_claims(submission):
            return
        waiters = partition.release_claims(submission)
        if not waiters:
            return
        try:
            self._loop.call_soon_threadsafe(partition.claims_released, waiters)
        except RuntimeError:  # the loop closed: closing fails the others
            error = ClientClosedError(f"Waltz client {self._client_id} is closed")
            for waiter, _ in waiters:
                waiter.fail(error)

    # --- the append on its way to the partition ---------------------------------------------------

    def _post(self, partition: ClientPartition, submission: Submission, payload: AppendPayload) -> None:
        """Hand an append to the loop (thread-safe; one wake-up for many appends)."""
        queued_at = time.monotonic()  # read outside the lock the loop's drain also takes
        with self._inbox_lock:
            self._inbox.append((partition, submission, payload, queued_at))
            if self._inbox_scheduled:
                return
            self._inbox_scheduled = True
        try:
            self._loop.call_soon_threadsafe(self._drain_inbox)
        except RuntimeError:
            submission.fail(ClientClosedError(f"Waltz client {self._client_id} is closed"))
            self._release_claims(partition, submission)

    def _drain_inbox(self) -> None:
        """Send the appends handed to the loop, in order (on the loop)."""
        with self._inbox_lock:
            items, self._inbox = self._inbox, deque()
            self._inbox_scheduled = False
        now = time.monotonic()
        queued = 0.0
        first = 0.0
        firsts = 0
        for partition, submission, payload, queued_at in items:
            queued += now - queued_at
            if not submission.posted:  # the first attempt's append: its first-attempt time
                submission.posted = True
                first += queued_at - submission.submitted_at
                firsts += 1
            if self._closed:
                submission.fail(ClientClosedError(f"Waltz client {self._client_id} is closed"))
            else:
                partition.send_append(submission, payload)
            if partition.has_claims(submission):  # a first attempt's: its append holds the locks now
                partition.claims_released(partition.release_claims(submission))
        self._metrics.append_queue_seconds.add(queued, len(items))
        if firsts:
            self._metrics.first_attempt_seconds.add(first, firsts)

    # --- outcomes: what the partitions report (on the loop) ---------------------------------------

    def completed(self, committed: list[tuple[Submission, int]]) -> None:
        """Complete submissions committed as these transaction IDs (batched: the contexts'
        callbacks run on the completion thread once this batch of server messages is processed,
        :meth:`hand_over_completions`)."""
        self._completions.extend(committed)

    def hand_over_completions(self) -> None:
        """A batch of server messages is processed: complete its commits on the completion thread."""
        if self._completions:
            completions, self._completions = self._completions, []
            self._completer.submit(self._complete_all, completions, time.monotonic())
            self._completions_handed += 1
            if self._completion_watch is None and not self._closed:
                self._completion_watch = self._loop.call_later(
                    self._config.client_long_wait_threshold, self._watch_completions
                )

    def _watch_completions(self) -> None:
        """Every ``client.longWaitThreshold`` while the completion thread has batches to run or
        runs one (on the loop): warn when one batch has held it that long, whether or not later
        outcomes have come to wait behind it (at most once per :data:`BUSY_WARNING_INTERVAL`;
        docs/design/client.md "WaltzClient and AsyncWaltzClient")."""
        self._completion_watch = None
        if self._closed:
            return
        threshold = self._config.client_long_wait_threshold
        held = self._completing.held(threshold, BUSY_WARNING_INTERVAL)
        if held:
            _warn_of_a_held_completion_thread(*held[0])
        if self._completions_handed > self._completions_ended:
            self._completion_watch = self._loop.call_later(threshold, self._watch_completions)

    def _complete_all(self, completions: list[tuple[Submission, int]], fed_at: float) -> None:
        """Complete the submissions committed in one batch of server messages (seen at ``fed_at``,
        ``time.monotonic()``; on the completion thread), adding their completion delay to its metric."""
        try:
            with self._completing.running(lambda: _completions_of(completions)):
                delay, count = Submission.complete_all(completions, self._in_flight.finished, fed_at)
        finally:
            self._completions_ended += 1
        if count:
            self._metrics.completion_delay_seconds.add(delay, count)

    def rejected(self, submission: Submission, error: BaseException) -> None:
        """End a submission with an error (on a retry thread)."""
        self._executor.submit(submission.fail, error)

    def expired_unsent(self, submission: Submission) -> None:
        """End as expired a submission whose append waited for its partition's mount past the
        context's timeout (never sent; on a retry thread): what followed it goes on."""
        partition = self._partitions[submission.partition_id]

        def expire() -> None:
            submission.expire()
            self._ended_unsent(partition, submission)

        try:
            self._executor.submit(expire)
        except RuntimeError:  # the executor shut down: the client closed under us
            submission.fail(ClientClosedError(f"Waltz client {self._client_id} is closed"))

    def retry(self, submission: Submission, lock_target: int | None) -> None:
        """Re-execute a failed attempt; after a lock failure, once ``lock_target`` is applied.

        When nothing is to be waited for (no pause, the mark already there), the attempt goes
        straight to a retry thread; otherwise a task waits on the loop first.
        """
        if self._closed:
            return
        partition = self._partitions[submission.partition_id]
        if submission.trace is not None:
            submission.trace.retry(lock_target)
        if lock_target is None:
            partition.metrics.failed_appends.inc()
        else:
            partition.metrics.lock_failures.inc()
        pause = _retry_pause(submission, lock_target)
        target = partition.own_committed_mark if lock_target is None else lock_target
        mark = _waited_mark(partition, submission)
        if not pause and mark.value >= target:
            self._submit_attempt(partition, submission, lock_target is not None)
            return
        if lock_target is not None and not self._await_apply(partition, submission):
            return  # the partition waits for this instance's upgrade: ended
        if not pause and lock_target is not None and submission.deadline is None:
            # Nothing to time out: the thread that applies (or absorbs) the target hands it over.
            mark.call_when(target, functools.partial(self._attempt_when_applied, partition, submission))
        else:
            self._spawn(self._retry(partition, submission, lock_target, target, pause))

    def queued_attempt(self, submission: Submission, target: int) -> None:
        """Run the first attempt of a context queued behind a lock (on a retry thread), once
        ``target`` is applied (the holder's commit, this client's own: read your writes)."""
        if self._closed:
            return
        partition = self._partitions[submission.partition_id]
        if _waited_mark(partition, submission).value >= target:
            self._submit_attempt(partition, submission, False)
        else:
            self._spawn(self._retry(partition, submission, None, target, 0.0))

    # --- routed again: a refusal of the epoch, a partition not open yet ---------------------------

    def route_again(self, submission: Submission, error: BaseException) -> None:
        """A server refused the append of ``submission`` for the epoch it was routed by (on the
        loop; its locks and followers are released already): once the client's view of the
        partition epochs moves past the one it was routed by, it is routed again and runs again
        from its first attempt, with the same future and callbacks (docs/design/splits.md "Clients
        across a split"). The wait is bounded by the context's timeout (it then expires) and by
        :data:`~waltz.client.routing.EPOCH_WAIT_SECONDS` (it then fails with ``error``)."""
        if self._closed:
            return
        if submission.trace is not None:
            submission.trace.retry(None)
        self._wait_for_route(submission, error)

    def _wait_for_route(self, submission: Submission, error: BaseException) -> None:
        """Wait (a task on the loop) until the routing view moves past the one ``submission`` was
        routed by, then route it again on a retry thread (on the loop)."""
        if self._closed:
            return
        if submission.route_deadline is None:
            submission.route_deadline = time.monotonic() + EPOCH_WAIT_SECONDS
        self._spawn(self._route_when_moved(submission, error))

    async def _route_when_moved(self, submission: Submission, error: BaseException) -> None:
        deadline = submission.route_deadline
        timeout = EPOCH_WAIT_SECONDS if deadline is None else deadline - time.monotonic()
        remaining = submission.remaining()
        if remaining is not None:
            timeout = min(timeout, remaining)
        if _server_behind(self._routing.view, submission, error):
            # The owner refused a new partition whose genesis this client's view names already:
            # its own view lags (its watch fires later); ask again shortly, within the same bound.
            await asyncio.sleep(max(0.0, min(_NOT_OPEN_PAUSE, timeout)))
        else:
            await self._routing.wait_newer(submission.route_serial, timeout)
        if self._closed:
            return
        try:
            self._executor.submit(self._run_routed_again, submission, error)
        except RuntimeError:  # the executor shut down: the client closed under us
            submission.fail(ClientClosedError(f"Waltz client {self._client_id} is closed"))

    def _run_routed_again(self, submission: Submission, error: BaseException) -> None:
        """On a retry thread: route ``submission`` by the view now and run its first attempt
        again; or, when it goes to a partition this client does not have (not open yet), wait
        again; or end it: expired, or ``error`` when the view did not move in time."""
        if submission.finished:
            return
        if submission.expired():
            submission.expire()
            return
        view = self._routing.view
        behind = _server_behind(view, submission, error)
        bound = submission.route_deadline
        if (view.serial <= submission.route_serial and not behind) or (
            behind and bound is not None and time.monotonic() >= bound
        ):  # the epochs did not move in time, or the owner did not learn the genesis in time
            deadline = submission.deadline
            if deadline is not None and (bound is None or deadline <= bound):
                submission.expire()  # its own timeout bounded the wait
            else:
                submission.fail(error)
            return
        try:
            pid, epoch = self._route(submission.context, view)
        except Exception as exc:  # the application's partition_id: its error ends the context
            submission.fail(exc)
            return
        submission.route(pid, epoch, view.serial)
        partition = self._partitions.get(pid)
        if partition is None:
            self._call_on_loop(self._wait_for_route, submission, self._not_open(submission))
            return
        if not partition.wanted:
            mounted = sorted(p.partition_id for p in list(self._partitions.values()) if p.wanted)
            submission.fail(PartitionNotMountedError(pid, mounted))
            return
        if not behind:  # a refusal of an owner that lags keeps the bound of the first
            submission.route_deadline = None
        wait = self._read_your_writes_wait(partition, submission)
        if wait is None:
            self._first_attempt(partition, submission)
        else:
            self._call_on_loop(self._first_attempt_after_wait, partition, submission, *wait)

    def _first_attempt_after_wait(
        self, partition: ClientPartition, submission: Submission, target: int, timeout: float
    ) -> None:
        """Spawn :meth:`_first_attempt_when_applied` (on the loop)."""
        if not self._closed:
            self._spawn(self._first_attempt_when_applied(partition, submission, target, timeout))

    async def _first_attempt_when_applied(
        self, partition: ClientPartition, submission: Submission, target: int, timeout: float
    ) -> None:
        """Read your writes on the partition a context was routed to again, then its first
        attempt on a retry thread."""
        await _waited_mark(partition, submission).wait_async(target, timeout)
        if self._closed:
            return
        try:
            self._executor.submit(self._on_retry_thread, self._first_attempt, partition, submission)
        except RuntimeError:
            submission.fail(ClientClosedError(f"Waltz client {self._client_id} is closed"))

    def _not_open(self, submission: Submission) -> PartitionNotOpenError:
        """The error of a context routed to a partition this client does not have."""
        view = self._routing.view
        return PartitionNotOpenError(
            submission.partition_id,
            submission.epoch,
            view.count,
            f"partition {submission.partition_id} is a new partition of epoch {submission.epoch} "
            f"({view.count} partitions) that this client has not mounted: it is not open yet "
            '(docs/design/splits.md, "Clients across a split")',
        )

    def _call_on_loop(self, function: Callable[..., Any], *args: Any) -> None:
        """Call ``function(*args)`` on the client's loop (any thread); when the loop is closed,
        the client is: the submission among ``args`` fails."""
        try:
            self._loop.call_soon_threadsafe(function, *args)
        except RuntimeError:
            for arg in args:
                if isinstance(arg, Submission):
                    arg.fail(ClientClosedError(f"Waltz client {self._client_id} is closed"))

    # --- the next attempt -------------------------------------------------------------------------

    async def _retry(
        self,
        partition: ClientPartition,
        submission: Submission,
        lock_target: int | None,
        target: int,
        pause: float,
    ) -> None:
        """Wait ``pause``, then until ``target`` is applied (the transaction a lock failure named,
        or this client's own last commit), then hand the next attempt to a retry thread."""
        if pause:  # a context that keeps failing: pace it (never past its expiry)
            remaining = submission.remaining()
            await asyncio.sleep(pause if remaining is None else min(pause, remaining))
            if submission.finished:  # ended meanwhile (apply_paused): nothing to wait for
                self._stop_awaiting(partition, submission)
                return
        remaining = submission.remaining()
        if lock_target is None:  # read your writes, within its own limit
            limit = self._config.client_read_your_writes_timeout
            remaining = limit if remaining is None else min(limit, remaining)
        await _waited_mark(partition, submission).wait_async(target, remaining)
        if lock_target is not None and not self._applied_awaited(partition, submission):
            return  # ended while it waited: its partition waits for this instance's upgrade
        if not self._closed:
            self._submit_attempt(partition, submission, lock_target is not None)

    def _attempt_when_applied(self, partition: ClientPartition, submission: Submission) -> None:
        """A lock failure's target is applied (on the thread that applied it): re-attempt."""
        if not self._applied_awaited(partition, submission):
            return  # ended while it waited: its partition waits for this instance's upgrade
        if not self._closed:
            self._submit_attempt(partition, submission, True)

    # --- retries that wait for the apply, and a partition that waits for an upgrade ---------------

    def _await_apply(self, partition: ClientPartition, submission: Submission) -> bool:
        """Note that a lock failure's retry waits for the partition's apply; False (the context
        ended) when the apply waits for this instance's upgrade (:meth:`apply_paused`)."""
        with self._awaiting_lock:
            self._awaiting_apply.setdefault(partition.partition_id, set()).add(submission)
        worker = partition.worker
        paused = None if worker is None else worker.paused
        if paused is not None and self._stop_awaiting(partition, submission):
            self._end_paused(partition, submission, paused)
            return False
        return True

    def _stop_awaiting(self, partition: ClientPartition, submission: Submission) -> bool:
        """Take ``submission`` off the retries waiting for the apply; False when it was not there
        any more (:meth:`apply_paused` ended it)."""
        with self._awaiting_lock:
            waiting = self._awaiting_apply.get(partition.partition_id)
            if waiting is None or submission not in waiting:
                return False
            waiting.discard(submission)
            return True

    def _applied_awaited(self, partition: ClientPartition, submission: Submission) -> bool:
        """The apply a retry waited for happened (or its wait ended): True when it goes on, False
        when :meth:`apply_paused` ended it meanwhile."""
        return self._stop_awaiting(partition, submission) or not submission.finished

    def apply_paused(self, partition_id: int, error: ApplyPausedError) -> None:
        """The partition's apply started to wait for this instance's upgrade (on its apply thread):
        the retries of lock failures that wait for it to apply a transaction end with
        :class:`~waltz.errors.PartitionPausedError`, and the contexts following them go on
        (docs/design/client.md "Retries and lock failures")."""
        with self._awaiting_lock:
            waiting = self._awaiting_apply.pop(partition_id, set())
        partition = self._partitions.get(partition_id)
        if partition is None:
            return
        for submission in waiting:
            self._end_paused(partition, submission, error)

    def _end_paused(
        self, partition: ClientPartition, submission: Submission, error: ApplyPausedError
    ) -> None:
        """End a lock failure's retry that waits for a transaction this instance cannot apply."""
        submission.fail(
            PartitionPausedError(
                f"{type(submission.context).__name__} on partition {partition.partition_id}: its lock check "
                "failed on a transaction this instance cannot apply before its upgrade, so its retry "
                f"cannot run here ({error}); nothing of it was committed: submit it to an instance of "
                "the newer release, or again once this one is upgraded"
            )
        )
        self._ended_unsent(partition, submission)

    def _submit_attempt(self, partition: ClientPartition, submission: Submission, lock_failed: bool) -> None:
        try:
            self._executor.submit(
                self._on_retry_thread, self._attempt_again, partition, submission, lock_failed
            )
        except RuntimeError:  # the executor shut down: the client closed under us
            submission.fail(ClientClosedError(f"Waltz client {self._client_id} is closed"))

    def _attempt_again(self, partition: ClientPartition, submission: Submission, lock_failed: bool) -> None:
        """On a retry thread: tell the context of its lock failure, run its next attempt, send it.

        One hand-off per retry: the append joins the loop's inbox like a first attempt's (no
        executor future chained back into the loop).
        """
        if lock_failed:
            submission.lock_failed()
        payload = submission.attempt()
        if payload is not None:
            self._post(partition, submission, payload)
            return
        self._ended_unsent(partition, submission)

    def _ended_unsent(self, partition: ClientPartition, submission: Submission) -> None:
        """A context ended without sending another append (any thread): its claims end (a queued
        first attempt's) and the contexts following it go on."""
        self._release_claims(partition, submission)
        if submission.followers is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed: closing fails them
                self._loop.call_soon_threadsafe(partition.leader_ended, submission)

    # --- in flight --------------------------------------------------------------------------------

    def _finished(self, submission: Submission) -> None:
        self._in_flight.finished((submission,))

    def in_flight(self, partition_id: int | None = None) -> int:
        """Submissions not finished yet (of one partition, or all)."""
        return self._in_flight.count(partition_id)

    def wait_idle(self, timeout: float | None) -> bool:
        """Block until no submission is in flight, nudging with flushes; False on timeout. The
        wait is :meth:`wait_idle_async`'s, run on the client's loop (an interrupted caller ends
        it there too).

        Raises:
            ClientClosedError: the client closed while submissions were in flight.
        """
        return run_on_shared_loop(self.wait_idle_async(timeout))

    async def wait_idle_async(self, timeout: float | None) -> bool:
        """Wait, on the calling loop, until no submission is in flight, nudging with flushes;
        False on timeout (cancellable; no thread waits)."""
        step = self._config.client_long_wait_threshold
        return await self._in_flight.wait_idle_async(timeout, step, self.check_open, self._nudge)

    def _note_completer(self) -> None:
        self._completer_ident = threading.get_ident()

    def _note_retry_thread(self) -> None:
        self._retry_idents.add(threading.get_ident())

    def _wait_refusal(self) -> str | None:
        """Why a wait for a submission's outcome on the calling thread would hold back that
        outcome, or None (:class:`~waltz.client.submission.SubmissionFuture`)."""
        if self.on_completion_thread():
            return (
                "waiting for a submission's outcome in a completion callback (on_completion, a "
                "future's done callback) would deadlock: commits complete on this thread, one after "
                "the other, so this outcome would come only after the callback returned. Wait from "
                "another thread, or take the outcome in a callback (future.add_done_callback)"
            )
        if on_apply_thread() and any(p.on_apply_thread() for p in list(self._partitions.values())):
            return (
                "waiting for a submission's outcome in apply_transaction holds back this partition's "
                "applies: a context that reads what the transaction being applied writes waits for "
                "this apply, which waits for it, until its timeout. Applies are also replayed (by "
                "another instance, a rebuild, a restart), and what an apply submits is submitted "
                "again at each replay: submit from the code that submitted the transaction (its "
                "on_completion), or from a sweeper that reads the database"
            )
        return None

    def on_completion_thread(self) -> bool:
        """Whether the calling thread is the one running completions (their callbacks must not
        wait for other completions: only this thread would end them)."""
        return self._completer_ident == threading.get_ident()

    # --- closing ----------------------------------------------------------------------------------

    def closing(self) -> None:
        """The client is closing: admit nothing more, start no more attempts."""
        self._closed = True

    def close(self) -> None:
        """Fail every submission still in flight (the client's loop no longer serves it) and stop
        the retry and completion threads, waiting for them to end; called on one of them (a
        context's callback, a future's done-callback closing the client), not for that one, which
        ends once its work returns (docs/design/client.md "WaltzClient and AsyncWaltzClient")."""
        self._closed = True
        in_flight = self._in_flight.close()
        error = ClientClosedError(
            f"Waltz client {self._client_id} closed with the transaction in flight; it may or may not "
            "have been committed: check the high-water mark (flush() before close() to avoid this)"
        )
        for submission in in_flight:
            submission.fail(error)
        here = threading.get_ident()  # a thread cannot wait for its own end
        self._completer.shutdown(wait=here != self._completer_ident, cancel_futures=False)
        self._executor.shutdown(wait=here not in self._retry_idents, cancel_futures=False)


#: Seconds between the attempts of a context refused ``PARTITION_NOT_OPEN`` by an owner whose
#: view of the partition epochs lags the client's (the client's names the genesis already).
_NOT_OPEN_PAUSE = 0.1


def _server_behind(view: RoutingView, submission: Submission, error: BaseException) -> bool:
    """Whether ``error`` is an owner's ``PARTITION_NOT_OPEN`` for a new partition whose genesis
    ``view`` names already: the owner's view of the partition epochs lags the client's, and no
    newer view of the client's is to come (docs/design/splits.md "Clients across a split")."""
    if not isinstance(error, PartitionNotOpenError):
        return False
    for epoch in view.epochs.epochs:
        child = epoch.children.get(submission.partition_id)
        if child is not None and child.genesis is not None:
            return True
    return False


def _ancestor_among(view: RoutingView, partition_id: int, partitions: Mapping[int, ClientPartition]) -> int:
    """The nearest ancestor of ``partition_id`` that this client has: a step down per epoch, from
    the newest (``c mod C(n)``), down to the count at creation, whose partitions it always has."""
    c = partition_id
    for epoch in reversed(view.epochs.epochs):
        if c in partitions:
            return c
        if c >= epoch.previous_count:
            c %= epoch.previous_count
    return c % view.epochs.initial_count


def _slot_wait(submission: Submission, long_wait: float) -> float:
    """Seconds a context at its partition's concurrency limit waits for a slot before it looks
    again: ``long_wait`` (``client.longWaitThreshold``, then it nudges the partition), or less when
    its timeout comes first (it then expires without a slot; docs/design/client.md "Back
    pressure")."""
    remaining = submission.remaining()
    return long_wait if remaining is None else min(long_wait, remaining)


def _waited_mark(partition: ClientPartition, submission: Submission) -> Watermark:
    """The mark a next attempt waits on: the absorbed mark for a context that reads absorbed
    state (``TransactionContext.reads_absorbed_state``), else the applied mark."""
    return partition.absorbed if submission.context.reads_absorbed_state else partition.applied


def _completions_of(completions: list[tuple[Submission, int]]) -> str:
    """The name of a batch of completions in messages: how many, of which kinds of context."""
    kinds = sorted({type(submission.context).__name__ for submission, _ in completions})
    return f"the completions of {len(completions)} context(s) of {', '.join(kinds)}"


def _warn_of_a_held_completion_thread(what: str, seconds: float) -> None:
    """Say that the completion thread has run one batch of completions for ``seconds``, holding
    back every later outcome of the client (docs/design/client.md "WaltzClient and
    AsyncWaltzClient")."""
    log.warning(
        "the client's completion thread has run %s for %.1fs: every later outcome (futures, "
        "submit_async, on_completion) waits behind it. on_completion and the done-callbacks of "
        "submit's futures run there: keep them short, and hand slow work (a call to another "
        "service, a wait) to a thread or task of their own "
        '(docs/design/client.md, "WaltzClient and AsyncWaltzClient")',
        what,
        seconds,
    )


def _warn_of_repeated_lock_failures(submission: Submission, failures: int, lock_target: int) -> None:
    """Say that a context failed its lock check ``failures`` times in a row on one transaction,
    with the likely cause (docs/design/client.md, "Retries and lock failures")."""
    context = submission.context
    cause = (
        "a context that sets sets_client_high_water_mark must give builder.set_client_high_water_mark "
        "the mark of the state it read"
        if context.sets_client_high_water_mark
        else "the context may not read the state it waits for (a mark it sets itself), or its lock "
        "collides in the server's lock table with a lock written at every transaction"
    )
    log.warning(
        "%s on partition %d: %d lock failures in a row on transaction %d: its attempts keep sending a "
        "client high-water mark below it, although this client waited until it applied it, and are "
        "retried until the context's timeout, if any; %s (docs/design/client.md, \"Retries and lock "
        'failures")',
        type(context).__name__,
        submission.partition_id,
        failures,
        lock_target,
        cause,
    )


def _retry_pause(submission: Submission, lock_target: int | None) -> float:
    """Seconds to wait before another attempt of a context whose attempt just failed.

    A lock failure already waits for the transaction it names, which paces a hot lock; only a
    context failing again and again on the same transaction (it does not read the state it waited
    for, or a lock table false positive) is slowed down. Other failures (an append lost with a
    connection) are retried at once a few times, then with an exponential pause.
    """
    if lock_target is not None:
        if lock_target == submission.last_lock_target:
            submission.repeated_lock_failures += 1
        else:
            submission.last_lock_target = lock_target
            submission.repeated_lock_failures = 0
        repeats = submission.repeated_lock_failures
        failures = repeats + 1  # in a row on this transaction, this one included
        if failures >= 10 and str(failures).rstrip("0") == "1":  # 10, 100, 1000, ... in a row
            _warn_of_repeated_lock_failures(submission, failures, lock_target)
        return 0.0 if repeats < 2 else min(0.5, 0.005 * 2 ** (repeats - 2))
    submission.lost_appends += 1
    return 0.0 if submission.lost_appends <= 3 else min(1.0, 0.01 * 2 ** (submission.lost_appends - 3))
