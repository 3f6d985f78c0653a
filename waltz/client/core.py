"""The client's core: partitions, submissions and their retries, discovery, on the client loop.

Source: docs/design/client.md "The client's parts" (the connections are in
:mod:`waltz.client.connection_pool`, the data RPCs in :mod:`waltz.client.transaction_data`; an
asyncio core on its own thread, a synchronous facade and an async API on top, in
:mod:`waltz.client.client`), "Retries and lock failures" (the retry queue). Application code never
runs on the core's event loop: ``execute`` runs on the submitting thread (first attempt) or a retry
thread, the context callbacks on a retry thread (a committed context's on the completion thread),
``apply_transaction`` on the partition's apply thread, and ``get_client_high_water_mark`` of a
mount on a worker thread of the loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Coroutine, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from waltz.client.callbacks import WaltzClientCallbacks
from waltz.client.client_partition import ClientPartition
from waltz.client.config import WaltzClientConfig
from waltz.client.connection import ServerConnection
from waltz.client.connection_pool import ConnectionPool
from waltz.client.context import AppendPayload, TransactionContext
from waltz.client.discovery import ServerDiscovery
from waltz.client.event_loop import shared_event_loop
from waltz.client.metrics import ClientMetrics, PartitionGauges
from waltz.client.mount_procedure import PartitionState
from waltz.client.submission import Submission
from waltz.client.transaction import TransactionDataSource
from waltz.client.transaction_data import REQUEST_TIMEOUT, TransactionDataClient
from waltz.client.waiting import Watermark
from waltz.errors import (
    ClientClosedError,
    PartitionNotMountedError,
    WaltzClientError,
    WaltzTimeoutError,
)
from waltz.metadata.assignment import PartitionAssignment
from waltz.protocol import client_pb2
from waltz.protocol.records import ReqId
from waltz.tracing import client_tracing

if TYPE_CHECKING:
    from waltz.tracing._otel import ClientTracing

__all__ = ["ClientCore"]

log = logging.getLogger(__name__)

T = TypeVar("T")

_INT32_MAX = (1 << 31) - 1


class ClientCore:
    """Everything of a client but its public API (see :class:`waltz.client.client.WaltzClient`).

    Construction blocks: it connects to ZooKeeper, takes a client ID, reads the number of
    partitions, starts the event loop thread and (with auto-mount) starts mounting every partition.

    Args:
        callbacks: the application's callbacks.
        config: the client configuration.
        metrics: the metrics to count in (default: new ones); their gauges then read this core's
            partitions.

    Raises:
        ZooKeeperUnavailableError: ZooKeeper did not answer.
        ClusterNotFoundError: no cluster under ``config.cluster_root``.
    """

    def __init__(
        self, callbacks: WaltzClientCallbacks, config: WaltzClientConfig, metrics: ClientMetrics | None = None
    ) -> None:
        self.callbacks = callbacks
        self.config = config
        self.metrics = metrics if metrics is not None else ClientMetrics()
        self._discovery = ServerDiscovery(
            config.zookeeper_connect_string,
            config.cluster_root,
            session_timeout=config.zookeeper_session_timeout,
            connect_timeout=config.zookeeper_session_timeout,
            security=config.zookeeper_security(),
        )
        self._closed = False
        self._seq = 0
        self._pool = ConnectionPool(
            on_messages=self._on_messages,
            on_lost=self._connection_lost,
            tls=config.tls(),
            max_message_bytes=config.client_max_message_bytes,
        )
        self._hwm_requests: dict[int, asyncio.Future[int]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._completions: list[tuple[Submission, int]] = []
        self._inbox: deque[tuple[ClientPartition, Submission, AppendPayload, float]] = deque()
        self._inbox_lock = threading.Lock()
        self._inbox_scheduled = False
        self._in_flight: set[Submission] = set()
        self._in_flight_lock = threading.Lock()  # taken alone on the per-transaction paths
        self._in_flight_changed = threading.Condition(self._in_flight_lock)
        self._executor = concurrent.futures.ThreadPoolExecutor(
            config.client_num_transaction_retry_threads, thread_name_prefix="waltz-retry"
        )
        # Completions (futures, on_completion) on a thread of their own, in commit order: behind
        # re-attempts, which read the application's database, they waited tens of milliseconds.
        self._completer_ident: int | None = None
        self._completer = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="waltz-complete", initializer=self._note_completer
        )
        self.metrics.watch(self.partition_gauges)
        self._tracing: ClientTracing | None = None
        try:
            self.client_id = self._discovery.next_client_id()
            if config.client_tracing:  # OpenTelemetry is imported only then (docs/tracing.md)
                self._tracing = client_tracing(self.client_id, config.client_tracing_sample_ratio)
            self.num_partitions = self._discovery.num_partitions
            self._loop, self._thread = shared_event_loop()
            self.partitions: dict[int, ClientPartition] = {}
            self.data_client = TransactionDataClient(
                self._loop,
                self._thread,
                self._pool,
                self.partitions,
                self.client_id,
                self.next_seq_num,
                config.client_transaction_data_timeout,
            )
            self.data_source: TransactionDataSource = self.data_client
            self.partitions.update(self._call(self._create_partitions()))
            self._discovery.watch_assignment(self._assignment_changed)
            if config.client_auto_mount:
                self._call(self._mount(range(self.num_partitions)))
        except BaseException:
            self.close()
            raise
        log.info(
            "Waltz client %d started on %s%s (%d partitions)",
            self.client_id,
            config.zookeeper_connect_string,
            config.cluster_root,
            self.num_partitions,
        )

    # --- the event loop ----------------------------------------------------------------------------

    def _call(self, coroutine: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run a coroutine on the core loop from another thread and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    def _spawn(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        task = self._loop.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("client task failed", exc_info=task.exception())

    async def _create_partitions(self) -> dict[int, ClientPartition]:
        return {
            pid: ClientPartition(
                pid,
                self,
                self.config.client_max_concurrent_transactions,
                self.config.client_max_apply_batch_size,
                self.metrics.partition(pid),
                apply_linger=self.config.client_apply_linger,
                max_apply_backlog=self.config.client_max_apply_backlog,
                hold_conflicting_appends=self.config.client_hold_conflicting_appends,
                retry_linger=self.config.client_retry_linger,
            )
            for pid in range(self.num_partitions)
        }

    # --- PartitionHost ----------------------------------------------------------------------------

    def next_seq_num(self) -> int:
        """The next ReqId sequence number (loop only)."""
        self._seq = self._seq + 1 if self._seq < _INT32_MAX else 1
        return self._seq

    async def connection(self, endpoint: str) -> ServerConnection:
        """A live connection to ``endpoint`` (see :meth:`ConnectionPool.get`)."""
        return await self._pool.get(endpoint)

    def completed(self, committed: list[tuple[Submission, int]]) -> None:
        """Complete submissions committed as these transaction IDs (batched: the contexts'
        callbacks run on the completion thread once this batch of server messages is processed)."""
        self._completions.extend(committed)

    def retry(self, partition: ClientPartition, submission: Submission, lock_target: int | None) -> None:
        """Re-execute a failed attempt; after a lock failure, once ``lock_target`` is applied.

        When nothing is to be waited for (no pause, the mark already there), the attempt goes
        straight to a retry thread; otherwise a task waits on the loop first.
        """
        if self._closed:
            return
        if submission.trace is not None:
            submission.trace.retry(lock_target)
        if lock_target is None:
            partition.metrics.failed_appends.inc()
        else:
            partition.metrics.lock_failures.inc()
        pause = _retry_pause(submission, lock_target)
        target = self.read_your_writes_target(partition) if lock_target is None else lock_target
        mark = _waited_mark(partition, submission)
        if not pause and mark.value >= target:
            self._submit_attempt(partition, submission, lock_target is not None)
        elif not pause and lock_target is not None and submission.deadline is None:
            # Nothing to time out: the thread that applies (or absorbs) the target hands it over.
            mark.call_when(target, functools.partial(self._attempt_when_applied, partition, submission))
        else:
            self._spawn(self._retry(partition, submission, lock_target, target, pause))

    def _attempt_when_applied(self, partition: ClientPartition, submission: Submission) -> None:
        """A lock failure's target is applied (on the thread that applied it): re-attempt."""
        if not self._closed:
            self._submit_attempt(partition, submission, True)

    def rejected(self, submission: Submission, error: BaseException) -> None:
        """End a submission with an error (on a retry thread)."""
        self._executor.submit(submission.fail, error)

    def refresh_assignment(self) -> None:
        """Re-read the assignment from ZooKeeper in the background."""
        if not self._closed:
            self._spawn(self._refresh_assignment())

    async def _refresh_assignment(self) -> None:
        try:
            assignment = await asyncio.to_thread(self._discovery.read_assignment)
        except Exception as exc:
            log.info("cannot read the partition assignment: %s", exc)
            return
        self._apply_assignment(assignment)

    def _assignment_changed(self, assignment: PartitionAssignment) -> None:
        """The assignment watch fired (on a kazoo thread)."""
        if not self._closed:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                self._loop.call_soon_threadsafe(self._apply_assignment, assignment)

    def _apply_assignment(self, assignment: PartitionAssignment) -> None:
        for pid, placement in assignment.placements.items():
            partition = self.partitions.get(pid)
            if partition is not None:
                partition.set_placement(placement.endpoint, placement.generation)

    # --- messages from servers --------------------------------------------------------------------

    def _on_messages(
        self, connection: ServerConnection, messages: Sequence[client_pb2.ServerMessage]
    ) -> None:
        partitions = self.partitions
        fed: set[ClientPartition] = set()
        for message in messages:
            kind = message.WhichOneof("body")
            if kind == "feed_entries":
                feed = message.feed_entries
                partition = partitions.get(feed.partition_id)
                if partition is not None:
                    partition.on_feed_entries(connection, feed)
                    fed.add(partition)
            elif kind == "high_water_mark":
                answer = message.high_water_mark
                partition = partitions.get(answer.req_id.partition_id)
                if partition is not None and answer.transaction_id > partition.server_high_water_mark:
                    partition.server_high_water_mark = answer.transaction_id
                future = self._hwm_requests.pop(answer.req_id.seq_num, None)
                if future is not None and not future.done():
                    future.set_result(answer.transaction_id)
            elif kind is not None:
                body = getattr(message, kind)
                partition = partitions.get(body.req_id.partition_id)
                if partition is not None:
                    partition.on_message(connection, kind, body)
                elif kind == "error":
                    log.warning("server %s reported an error: %s", connection.endpoint, body.message)
        for partition in fed:
            partition.end_of_batch()
        if self._completions:
            completions, self._completions = self._completions, []
            self._completer.submit(self._complete_all, completions, time.monotonic())

    def _connection_lost(self, connection: ServerConnection) -> None:
        for partition in self.partitions.values():
            partition.connection_lost(connection)

    # --- submissions ------------------------------------------------------------------------------

    def check_open(self) -> None:
        if self._closed:
            raise ClientClosedError(f"Waltz client {self.client_id} is closed; create a new one")

    def new_submission(
        self, context: TransactionContext, with_future: bool = True
    ) -> tuple[ClientPartition, Submission]:
        """Choose the partition of a context and make its submission (not yet admitted; with a
        future, or without one for ``WaltzClient.execute``).

        Raises:
            ClientClosedError: the client is closed.
            ValueError: the context chose a partition outside ``0 .. num_partitions - 1``.
            PartitionNotMountedError: the partition is not mounted (auto-mount off).
        """
        self.check_open()
        pid = context.partition_id(self.num_partitions)
        partition = self.partitions.get(pid)
        if partition is None:
            raise ValueError(
                f"{type(context).__name__}.partition_id returned {pid}, outside 0..{self.num_partitions - 1}"
            )
        if not partition.wanted:
            mounted = sorted(p.partition_id for p in self.partitions.values() if p.wanted)
            raise PartitionNotMountedError(pid, mounted)
        submission = Submission(
            context,
            pid,
            self.callbacks.get_client_high_water_mark,
            self.config.client_max_message_bytes,
            on_finished=self._finished,
            with_future=with_future,
        )
        if self._tracing is not None:
            submission.trace = self._tracing.begin(pid, context)
        return partition, submission

    def admitted(self, submission: Submission) -> None:
        """Count a submission in flight (it holds a concurrency slot)."""
        partition = self.partitions[submission.partition_id]
        with self._in_flight_lock:
            self._in_flight.add(submission)
            partition.submitted += 1  # waltz_client_transactions_submitted, read when scraped

    def _finished(self, submission: Submission) -> None:
        self._finished_all((submission,))

    def _finished_all(self, submissions: Iterable[Submission]) -> None:
        """Take ended submissions out of flight and give their concurrency slots back."""
        partitions = self.partitions
        with self._in_flight_changed:
            in_flight = self._in_flight
            for submission in submissions:
                if submission in in_flight:
                    in_flight.discard(submission)
                    partitions[submission.partition_id].limit.release()
            self._in_flight_changed.notify_all()

    def _note_completer(self) -> None:
        self._completer_ident = threading.get_ident()

    def on_completion_thread(self) -> bool:
        """Whether the calling thread is the one running completions (their callbacks must not
        wait for other completions: only this thread would end them)."""
        return self._completer_ident == threading.get_ident()

    def _complete_all(self, completions: list[tuple[Submission, int]], fed_at: float) -> None:
        """Complete the submissions committed in one batch of server messages (seen at ``fed_at``,
        ``time.monotonic()``; on the completion thread), adding their completion delay to its metric."""
        delay, count = Submission.complete_all(completions, self._finished_all, fed_at)
        if count:
            self.metrics.completion_delay_seconds.add(delay, count)

    def run_first_attempt(self, partition: ClientPartition, submission: Submission) -> None:
        """Run the first attempt on the calling thread and send its append; or, when a pending
        append of this client holds one of the context's expected locks, queue the context behind
        it, and when a commit of this client that the attempt would not see wrote one, let it wait
        for that commit (``TransactionContext.expected_locks``); or, when another context's first
        attempt claimed one of them that this client writes, let it wait for that context's append
        (:meth:`ClientPartition.claim`; docs/design/locks.md, "Locks of appends in flight")."""
        try:
            expected = submission.context.expected_locks()
        except Exception as exc:  # the application's hint: its error ends the context, as execute's
            submission.fail(exc)
            return
        if expected and self.config.client_hold_conflicting_appends:
            hashes = [lock.lock_hash for lock in expected]
            if not partition.claim(submission, hashes):
                return  # another context's first attempt claimed one: it goes behind that one
            if partition.holds_any(hashes, _waited_mark(partition, submission).value):
                try:  # it keeps its claims until its append is on the loop: a queue per lock
                    self._loop.call_soon_threadsafe(partition.queue_first_attempt, submission, hashes)
                except RuntimeError:
                    submission.fail(ClientClosedError(f"Waltz client {self.client_id} is closed"))
                    self._release_claims(partition, submission)
                return
        payload = submission.attempt()
        if payload is not None:
            self.post_append(partition, submission, payload)  # the loop releases its claims
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
            error = ClientClosedError(f"Waltz client {self.client_id} is closed")
            for waiter, _ in waiters:
                waiter.fail(error)

    def queued_attempt(self, partition: ClientPartition, submission: Submission, target: int) -> None:
        """Run the first attempt of a context queued behind a lock (on a retry thread), once
        ``target`` is applied (the holder's commit, this client's own: read your writes)."""
        if self._closed:
            return
        if _waited_mark(partition, submission).value >= target:
            self._submit_attempt(partition, submission, False)
        else:
            self._spawn(self._retry(partition, submission, None, target, 0.0))

    def applied_mark(self, partition_id: int) -> Watermark:
        """The applied high-water mark of a partition (see ``WaltzClient.wait_applied``).

        Raises:
            ValueError: no such partition.
        """
        partition = self.partitions.get(partition_id)
        if partition is None:
            raise ValueError(f"partition {partition_id} does not exist (0..{self.num_partitions - 1})")
        return partition.applied

    def read_your_writes_target(self, partition: ClientPartition) -> int:
        """The applied mark an attempt waits for: this client's own last commit on the partition."""
        return partition.own_committed_mark

    def post_append(self, partition: ClientPartition, submission: Submission, payload: AppendPayload) -> None:
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
            submission.fail(ClientClosedError(f"Waltz client {self.client_id} is closed"))
            self._release_claims(partition, submission)

    def _drain_inbox(self) -> None:
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
                submission.fail(ClientClosedError(f"Waltz client {self.client_id} is closed"))
            else:
                partition.send_append(submission, payload)
            if partition.has_claims(submission):  # a first attempt's: its append holds the locks now
                partition.claims_released(partition.release_claims(submission))
        self.metrics.append_queue_seconds.add(queued, len(items))
        if firsts:
            self.metrics.first_attempt_seconds.add(first, firsts)

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
        remaining = submission.remaining()
        if lock_target is None:  # read your writes, within its own limit
            limit = self.config.client_read_your_writes_timeout
            remaining = limit if remaining is None else min(limit, remaining)
        await _waited_mark(partition, submission).wait_async(target, remaining)
        if not self._closed:
            self._submit_attempt(partition, submission, lock_target is not None)

    def _submit_attempt(self, partition: ClientPartition, submission: Submission, lock_failed: bool) -> None:
        try:
            self._executor.submit(self._attempt_again, partition, submission, lock_failed)
        except RuntimeError:  # the executor shut down: the client closed under us
            submission.fail(ClientClosedError(f"Waltz client {self.client_id} is closed"))

    def _attempt_again(self, partition: ClientPartition, submission: Submission, lock_failed: bool) -> None:
        """On a retry thread: tell the context of its lock failure, run its next attempt, send it.

        One hand-off per retry: the append joins the loop's inbox like a first attempt's (no
        executor future chained back into the loop).
        """
        if lock_failed:
            submission.lock_failed()
        payload = submission.attempt()
        if payload is not None:
            self.post_append(partition, submission, payload)
            return
        self._release_claims(partition, submission)  # a queued first attempt that ended here
        if submission.followers is not None:  # it ended: those waiting behind it go on
            with contextlib.suppress(RuntimeError):  # the loop closed: closing fails them
                self._loop.call_soon_threadsafe(partition.leader_ended, submission)

    def in_flight(self, partition_id: int | None = None) -> int:
        """Submissions not finished yet (of one partition, or all)."""
        with self._in_flight_changed:
            if partition_id is None:
                return len(self._in_flight)
            return sum(1 for s in self._in_flight if s.partition_id == partition_id)

    def nudge(self, partition_ids: Iterable[int] | None = None) -> None:
        """Send flush requests to partitions with appends pending (learn lost appends sooner)."""
        ids = list(self.partitions) if partition_ids is None else list(partition_ids)

        def send() -> None:
            for pid in ids:
                self.partitions[pid].send_flush()

        if not self._closed:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                self._loop.call_soon_threadsafe(send)

    def wait_idle(self, timeout: float | None) -> bool:
        """Block until no submission is in flight, nudging with flushes; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        step = self.config.client_long_wait_threshold
        with self._in_flight_changed:
            while self._in_flight:
                self.check_open()
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                if not self._in_flight_changed.wait(step if remaining is None else min(step, remaining)):
                    partitions = {s.partition_id for s in self._in_flight}
                    self.nudge(partitions)
        return True

    # --- mounting ---------------------------------------------------------------------------------

    async def _mount(self, partition_ids: Iterable[int]) -> None:
        for pid in partition_ids:
            self.partitions[pid].mount()
        self._spawn(self._refresh_assignment())

    async def _set_partitions(self, partition_ids: set[int]) -> None:
        for pid, partition in self.partitions.items():
            if pid in partition_ids:
                partition.mount()
            elif partition.wanted:
                worker = partition.detach()
                if worker is not None:
                    await asyncio.to_thread(worker.close)
        self._spawn(self._refresh_assignment())

    def set_partitions(self, partition_ids: Iterable[int]) -> None:
        """Mount exactly these partitions (auto-mount off); unmount the others.

        Raises:
            ValueError: a partition does not exist.
            WaltzError: a partition to unmount has transactions in flight (flush first).
        """
        self.check_open()
        wanted = set(partition_ids)
        bad = sorted(p for p in wanted if p not in self.partitions)
        if bad:
            raise ValueError(f"partitions {bad} do not exist (0..{self.num_partitions - 1})")
        for pid, partition in self.partitions.items():
            if pid not in wanted and partition.wanted and self.in_flight(pid):
                raise WaltzClientError(
                    f"partition {pid} has {self.in_flight(pid)} transaction(s) in flight; flush() before "
                    "unmounting it"
                )
        self._call(self._set_partitions(wanted))

    async def wait_mounted(self, partition_ids: Iterable[int]) -> None:
        """Wait (on the loop) until the partitions are mounted."""
        for pid in partition_ids:
            await self.partitions[pid].wait_mounted()

    def wait_until_mounted(self, timeout: float, partition_ids: Iterable[int] | None = None) -> None:
        """Block until the partitions (default: every wanted one) are mounted.

        Raises:
            WaltzTimeoutError: not mounted within ``timeout`` seconds.
        """
        ids = (
            [p.partition_id for p in self.partitions.values() if p.wanted]
            if partition_ids is None
            else list(partition_ids)
        )
        try:
            self._call(asyncio.wait_for(self.wait_mounted(ids), timeout))
        except (TimeoutError, concurrent.futures.TimeoutError):
            states = {pid: repr(self.partitions[pid]) for pid in ids}
            raise WaltzTimeoutError(f"partitions not mounted within {timeout:g}s: {states}") from None

    # --- requests ---------------------------------------------------------------------------------

    async def high_water_mark(self, partition_id: int, timeout: float) -> int:
        """Ask the owner of a partition for its committed high-water mark (loop only).

        Raises:
            WaltzTimeoutError: no answer within ``timeout`` seconds (no owner, or it is not ready).
        """
        partition = self.partitions[partition_id]
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WaltzTimeoutError(
                    f"partition {partition_id}: no high-water mark from {partition.endpoint} "
                    f"within {timeout:g}s"
                )
            endpoint = partition.endpoint
            if endpoint is None:
                await self._refresh_assignment()
                await asyncio.sleep(min(0.2, remaining))
                continue
            try:
                connection = await asyncio.wait_for(self._pool.get(endpoint), remaining)
            except (ConnectionError, TimeoutError):
                await asyncio.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
                continue
            req_id = ReqId(self.client_id, partition.generation, partition_id, self.next_seq_num())
            future: asyncio.Future[int] = self._loop.create_future()
            self._hwm_requests[req_id.seq_num] = future
            try:
                connection.send(
                    client_pb2.ClientMessage(
                        high_water_mark=client_pb2.HighWaterMarkRequest(req_id=req_id.to_proto())
                    )
                )
                return await asyncio.wait_for(
                    future, min(REQUEST_TIMEOUT, max(0.01, deadline - time.monotonic()))
                )
            except (ConnectionError, TimeoutError):
                continue  # dropped (stale generation, connection lost): try again with fresh news
            finally:
                self._hwm_requests.pop(req_id.seq_num, None)

    def get_high_water_mark(self, partition_id: int, timeout: float) -> int:
        """Blocking :meth:`high_water_mark`."""
        self.check_open()
        if partition_id not in self.partitions:
            raise ValueError(f"partition {partition_id} does not exist (0..{self.num_partitions - 1})")
        return self._call(self.high_water_mark(partition_id, timeout))

    # --- closing ----------------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """True once :meth:`close` began."""
        return self._closed

    async def _shutdown(self) -> None:
        for partition in getattr(self, "partitions", {}).values():
            partition.close()
        for task in list(self._tasks):
            task.cancel()
        await self._pool.close()
        for future in self._hwm_requests.values():
            future.cancel()

    def close(self, timeout: float = 10.0) -> None:
        """Stop everything; submissions still in flight fail with :class:`ClientClosedError`.

        Their appends may or may not have been committed: the log (the high-water mark after the
        next start) tells. Idempotent.
        """
        if self._closed:
            return
        self._closed = True
        self._discovery.close()
        # Stop the apply workers first: an apply in progress may still fetch data over the loop.
        workers = [p.worker for p in getattr(self, "partitions", {}).values() if p.worker is not None]
        for worker in workers:
            worker.close(timeout)
        thread = getattr(self, "_thread", None)
        if thread is not None and thread.is_alive():
            try:
                self._call(self._shutdown(), timeout)
            except Exception:
                log.exception(
                    "Waltz client %s: shutting down its connections failed", getattr(self, "client_id", "?")
                )
        data_client = getattr(self, "data_client", None)
        if data_client is not None:
            data_client.open = False
        with self._in_flight_changed:
            in_flight = list(self._in_flight)
            self._in_flight_changed.notify_all()
        error = ClientClosedError(
            f"Waltz client {getattr(self, 'client_id', '?')} closed with the transaction in flight; it "
            "may or may not have been committed: check the high-water mark (flush() before close() to "
            "avoid this)"
        )
        for submission in in_flight:
            submission.fail(error)
        self._completer.shutdown(wait=True, cancel_futures=False)
        self._executor.shutdown(wait=True, cancel_futures=False)
        if self._tracing is not None:
            self._tracing.close()
        try:
            callbacks = getattr(self, "callbacks", None)
            if callbacks is not None:
                callbacks.client_closed()
        except Exception:
            log.exception(
                "Waltz client %s: its callbacks' client_closed raised", getattr(self, "client_id", "?")
            )
        log.info("Waltz client %s closed", getattr(self, "client_id", "?"))

    def drop_connections(self, reason: str = "dropped on purpose") -> None:
        """Fault injection: break every server connection now, as a network failure would.

        Every mounted partition then runs the reconnect procedure (docs/design/client.md
        "Reconnect"). For fault tests.
        """

        if not self._closed:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._pool.abort_all, reason)

    # --- state for tests and metrics --------------------------------------------------------------

    def partition_states(self) -> dict[int, PartitionState]:
        """Partition ID -> its state."""
        return {pid: p.state for pid, p in self.partitions.items()}

    def unhealthy_partitions(self) -> dict[int, BaseException | None]:
        """Partitions whose ``apply_transaction`` keeps failing -> the last exception."""
        return {
            pid: p.worker.last_error
            for pid, p in getattr(self, "partitions", {}).items()
            if p.worker is not None and not p.worker.healthy
        }

    def apply_backlogs(self) -> dict[int, int]:
        """Partition -> committed transactions queued for ``apply_transaction`` (mounted ones)."""
        return {
            pid: p.worker.backlog
            for pid, p in getattr(self, "partitions", {}).items()
            if p.worker is not None
        }

    def partition_gauges(self) -> list[PartitionGauges]:
        """Every partition's gauges (thread-safe: the metrics registry calls it when scraped)."""
        partitions: dict[int, ClientPartition] = dict(getattr(self, "partitions", {}))
        with self._in_flight_changed:
            in_flight = Counter(s.partition_id for s in self._in_flight)
            submitted = {pid: p.submitted for pid, p in partitions.items()}
        unhealthy = self.unhealthy_partitions()
        return [
            PartitionGauges(
                partition_id=pid,
                in_flight=in_flight[pid],
                client_high_water_mark=p.applied.value,
                server_high_water_mark=p.server_high_water_mark,
                mounted=p.mounted,
                unhealthy=pid in unhealthy,
                apply_backlog=p.worker.backlog if p.worker is not None else 0,
                submitted=submitted[pid],
            )
            for pid, p in partitions.items()
        ]


def _waited_mark(partition: ClientPartition, submission: Submission) -> Watermark:
    """The mark a next attempt waits on: the absorbed mark for a context that reads absorbed
    state (``TransactionContext.reads_absorbed_state``), else the applied mark."""
    return partition.absorbed if submission.context.reads_absorbed_state else partition.applied


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
        return 0.0 if repeats < 2 else min(0.5, 0.005 * 2 ** (repeats - 2))
    submission.lost_appends += 1
    return 0.0 if submission.lost_appends <= 3 else min(1.0, 0.01 * 2 ** (submission.lost_appends - 3))
