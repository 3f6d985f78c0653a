"""The client-side partition: mount state, pending appends, the feed, and the apply worker.

Source: docs/design/client.md "Mount and the client high-water mark", "Failed-append detection",
"Reconnect"; ``docs/protocol.md``. A :class:`ClientPartition` is a proxy of a partition owned by
some server. It lives on the client's event loop (only the apply worker, the concurrency limit and
the applied mark are touched from other threads).

Its parts: the mount procedure (:class:`~waltz.client.mount_procedure.MountProcedure`, with the
partition's own steps of it: the mark to mount from, and what a mount fails and unblocks), the feed
window (:class:`~waltz.client.feed_window.FeedWindow`), the locks its pending appends hold
(:class:`~waltz.client.lock_holds.LockHolds`) and the claims of first attempts
(:class:`~waltz.client.lock_claims.LockClaims`).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Sequence
from typing import Protocol

from waltz.client.apply_worker import ApplyWorker
from waltz.client.connection import ServerConnection
from waltz.client.context import AppendPayload
from waltz.client.feed_window import FeedWindow
from waltz.client.lock_claims import ClaimWaiter, LockClaims
from waltz.client.lock_holds import LockHolds, PendingAppend
from waltz.client.metrics import ClientMetrics, PartitionMetrics
from waltz.client.monitor import TransactionMonitor
from waltz.client.mount_procedure import MountHost, MountProcedure, PartitionState
from waltz.client.submission import Submission, Waiting
from waltz.client.transaction import Transaction, TransactionDataSource
from waltz.client.waiting import Watermark
from waltz.errors import ProtocolError
from waltz.protocol import client_pb2
from waltz.protocol.records import ReqId, unequal_columns

__all__ = ["AttemptOutcomes", "ClientPartition", "PartitionHost"]

log = logging.getLogger(__name__)

# Module constants for the per-append checks (an enum member read through its class costs more).
_MOUNTED = PartitionState.MOUNTED
_CLOSED = PartitionState.CLOSED


class PartitionHost(MountHost, Protocol):
    """What a partition needs from the client that owns it (all on the event loop)."""

    client_id: int
    data_source: TransactionDataSource

    def next_seq_num(self) -> int:
        """The next ReqId sequence number (one per request of the client, across partitions)."""
        ...


class AttemptOutcomes(Protocol):
    """Where a partition reports how the attempts handed to it ended (on the event loop): the
    attempt path (:class:`~waltz.client.attempt_runner.AttemptRunner`)."""

    def completed(self, committed: list[tuple[Submission, int]]) -> None:
        """These submissions' appends were committed (as the transaction IDs paired with them)."""
        ...

    def retry(self, submission: Submission, lock_target: int | None) -> None:
        """Re-execute a submission whose append failed (after a lock failure, once ``lock_target``
        is applied)."""
        ...

    def queued_attempt(self, submission: Submission, target: int) -> None:
        """Run the first attempt of a context that was queued behind a lock, once ``target`` (the
        transaction its holder committed as, or -1) is applied."""
        ...

    def rejected(self, submission: Submission, error: BaseException) -> None:
        """End a submission whose append cannot be sent (the server rejected it for good, or the
        partition closed)."""
        ...


class ClientPartition:
    """One partition as this client sees it.

    Args:
        partition_id: the partition.
        host: the client.
        outcomes: where the outcomes of the attempts handed to the partition go.
        max_apply_batch: transactions per ``apply_transactions`` call.
        metrics: the partition's counters (default: counters of a registry of its own).
        apply_linger: seconds the apply worker waits to fill a batch (``client.applyLinger``).
        max_apply_backlog: the feed window: transactions the server may feed beyond what the
            application applied (``client.maxApplyBacklog``; 0: no limit).
        hold_conflicting_appends: hold back an append whose WRITE or READ lock a pending append of
            this client holds as a WRITE or APPEND lock (``client.holdConflictingAppends``; see
            :meth:`send_append`).
        retry_linger: seconds a re-attempt's append may wait for the next first attempt's append
            to share its stream message (``client.retryLinger``; see :meth:`send_append`).
    """

    def __init__(
        self,
        partition_id: int,
        host: PartitionHost,
        outcomes: AttemptOutcomes,
        max_apply_batch: int,
        metrics: PartitionMetrics | None = None,
        *,
        apply_linger: float = 0.0,
        max_apply_backlog: int = 0,
        hold_conflicting_appends: bool = True,
        retry_linger: float = 0.0,
    ) -> None:
        self.partition_id = partition_id
        self.metrics = metrics if metrics is not None else ClientMetrics().partition(partition_id)
        self._host = host
        self._outcomes = outcomes
        self._max_apply_batch = max_apply_batch
        self._apply_linger = apply_linger
        self._retry_linger = retry_linger
        self.applied = Watermark(-1)
        """The highest transaction ID this client applied (or found applied) on the partition."""
        self.absorbed = Watermark(-1)
        """The highest transaction ID the callbacks absorbed (``absorb_transactions``; with
        callbacks that do not absorb, the same as :attr:`applied`); never below it."""
        self.monitor: TransactionMonitor[PendingAppend] = TransactionMonitor()
        self.worker: ApplyWorker | None = None
        self.own_committed_mark = -1
        """The highest transaction ID of this client's own commits on the partition."""
        self.server_high_water_mark = -1
        """The server's committed high-water mark as last known (feed, flush and mark responses)."""
        self.feed_gaps = 0
        self._blocked: deque[tuple[Submission, AppendPayload]] = deque()
        self._holds = LockHolds(self.applied, hold_conflicting_appends)
        self._claims = LockClaims(self._holds, self.metrics)
        self._feed_mark = -1
        self._queued_mark: int | None = None
        self._to_queue: list[tuple[Transaction, Submission | None]] = []  # handed over by end_of_batch
        window = FeedWindow(partition_id, max_apply_backlog, self.applied, self._new_req_id, self.metrics)
        self._mount = MountProcedure(partition_id, host, self, window, self._new_req_id, self.metrics)
        self._flush_reqs: dict[int, int] = {}  # flush ReqId sequence number -> monitor position
        self._flush_marks: list[tuple[int, int]] = []  # (monitor position, high-water mark)

    def __repr__(self) -> str:
        return (
            f"ClientPartition({self.partition_id}, {self.state.value}, {self.endpoint} "
            f"generation {self.generation}, pending {len(self.monitor)}, blocked {len(self._blocked)})"
        )

    def _new_req_id(self, generation: int) -> ReqId:
        """The ReqId of this client's next request on the partition under ``generation``."""
        return ReqId(self._host.client_id, generation, self.partition_id, self._host.next_seq_num())

    # --- life cycle -------------------------------------------------------------------------------

    @property
    def state(self) -> PartitionState:
        """Where the partition is in its life cycle."""
        return self._mount.state

    @property
    def endpoint(self) -> str | None:
        """The server the assignment names for the partition (None: no server)."""
        return self._mount.endpoint

    @property
    def generation(self) -> int:
        """The partition's generation as the assignment names it (-1: not known yet)."""
        return self._mount.generation

    @property
    def connection(self) -> ServerConnection | None:
        """The connection of the partition's latest mount request (None: none, or it broke)."""
        return self._mount.connection

    @property
    def wanted(self) -> bool:
        """True while the application wants the partition mounted."""
        return self._mount.wanted

    @property
    def mounted(self) -> bool:
        """True when the partition is mounted and appends flow."""
        return self._mount.mounted

    def on_apply_thread(self) -> bool:
        """True when called from the partition's apply worker (inside ``apply_transaction``)."""
        worker = self.worker
        return worker is not None and worker.is_current_thread()

    async def wait_mounted(self) -> None:
        """Wait until the partition is mounted."""
        await self._mount.wait_mounted()

    def mount(self) -> None:
        """Start mounting (and applying the feed); no-op when already mounted or mounting."""
        mount = self._mount
        if mount.state is _CLOSED or mount.wanted:
            return
        if self.worker is None:
            self.worker = ApplyWorker(
                self.partition_id,
                self._host.callbacks,
                self.applied,
                max_batch=self._max_apply_batch,
                linger=self._apply_linger,
                metrics=self.metrics,
                absorbed=self.absorbed,
            )
            self.worker.start()
        mount.start()

    def remount(self, reason: str) -> None:
        """Run the reconnect procedure: block appends, mount again (docs/design/client.md "Reconnect")."""
        self._mount.remount(reason)

    def detach(self, *, unmount: bool = True) -> ApplyWorker | None:
        """Stop mounting and following the feed (unmount, or close); returns the worker to close.

        The caller makes sure nothing is in flight; the feed and the queue of the worker are
        forgotten, so the next mount starts from the callbacks' high-water mark. Feed entries
        already on their way are ignored.

        Args:
            unmount: tell the server on the partition's connection to stop its feed
                (``UnmountRequest``, ``docs/protocol.md`` "Unmount"); False when the connections
                close anyway (the client closes).
        """
        self._mount.stop(unmount=unmount)
        self._queued_mark = None
        self._to_queue.clear()
        worker, self.worker = self.worker, None
        return worker

    def close(self) -> tuple[ApplyWorker | None, list[Submission]]:
        """Stop for good; returns the worker to close and every submission still held."""
        worker = self.detach(unmount=False)
        self._mount.close()
        pending = self.monitor.fail_all()
        held = [p.submission for p in pending] + [s for s, _ in self._blocked]
        held += [submission for p in pending for submission, _, _ in p.held or ()]
        held += self._holds.clear()
        held += self._claims.clear()
        self._blocked.clear()
        return worker, held

    def set_placement(self, endpoint: str | None, generation: int) -> None:
        """Take the partition's place from the assignment; a change means mounting again."""
        self._mount.set_placement(endpoint, generation)

    def connection_lost(self, connection: ServerConnection) -> None:
        """A connection broke: when it is the partition's, mount again (with a new network client)."""
        self._mount.connection_lost(connection)

    # --- the partition's steps of the mount procedure ---------------------------------------------

    def mount_from(self, callbacks_mark: int) -> int:
        """The high-water mark to mount from (docs/design/client.md "Mount and the client high-water
        mark", step 3): the callbacks' mark on a first mount; with appends pending, the lower of
        the callbacks' mark and the last transaction this client saw in its own feed, so that the
        fate of each pending append shows in the feed even when another instance sharing the
        database is ahead; otherwise the higher of the two. The feed restarts after it."""
        worker = self.worker
        assert worker is not None
        mark = self._mount_mark(callbacks_mark, worker)
        self._feed_mark = mark
        return mark

    def _mount_mark(self, callbacks_mark: int, worker: ApplyWorker) -> int:
        if self._queued_mark is None:
            self._queued_mark = callbacks_mark
            worker.set_floor(callbacks_mark)
            return callbacks_mark
        if self.monitor:
            return min(callbacks_mark, self._queued_mark)
        if callbacks_mark > self._queued_mark:
            self._queued_mark = callbacks_mark
            worker.set_floor(callbacks_mark)
        return self._queued_mark

    def on_mounted(self, mount_mark: int) -> None:
        """The server is ready for the mount: every append still pending failed (re-executed,
        and what it held back is sent), and the blocked appends are sent."""
        failed = self.monitor.fail_all()
        log.info(
            "partition %d: mounted on %s (generation %d, from transaction %d, feed at %d); "
            "%d pending append(s) failed, %d blocked",
            self.partition_id,
            self._mount.endpoint,
            self._mount.generation,
            mount_mark,
            self._feed_mark,
            len(failed),
            len(self._blocked),
        )
        for pending in failed:  # after the state is MOUNTED: what they held is sent now
            self._failed(pending, None)
        blocked, self._blocked = self._blocked, deque()
        for submission, payload in blocked:
            self.send_append(submission, payload)

    def on_remount(self) -> None:
        """The partition mounts again: flushes sent before are answered no more."""
        self._flush_reqs.clear()
        self._flush_marks.clear()

    # --- appends ----------------------------------------------------------------------------------

    def send_append(self, submission: Submission, payload: AppendPayload) -> None:
        """Send an attempt's append, or hold it until the partition is mounted.

        An append one of whose WRITE or READ locks is a WRITE or APPEND lock of a pending append of
        this client (its *holder*, the latest such one) is held back (``docs/protocol.md``
        "Append", client side): as a rule its client high-water mark is below the holder's
        transaction (this client has not seen it commit), so the server would refuse it if the
        holder commits. When the holder commits, the held append
        is a lock failure on the holder's transaction ID, found by the client (re-executed once that
        transaction is applied, like one the server refused, without its round trip to the server);
        when the holder fails, or the held attempt's mark turns out to cover the holder's commit (a
        mark read from a database another instance had already applied it to), it is sent as it is.

        The append of a re-attempt (after a lock failure or a lost append) may wait up to
        ``retry_linger`` seconds for another append to wake the connection's writer, so that it
        shares a stream message, and then a store batch, with the first attempts that follow it
        (``docs/protocol.md`` "Append"): a re-attempt starts when the transaction it waited for is
        applied, just before the completions of that commit let new transactions in.
        """
        mount = self._mount
        state = mount.state
        if state is _CLOSED:
            self._outcomes.rejected(submission, ProtocolError(f"partition {self.partition_id} is closed"))
            return
        connection = mount.connection
        if state is not _MOUNTED or connection is None or connection.closed:
            self._blocked.append((submission, payload))
            if state is _MOUNTED:
                self.remount("connection lost")
            return
        holds = self._holds
        followers = holds.take_followers(submission)  # its turn came: they wait behind this attempt
        if holds.hold_back(submission, payload, followers):
            if submission.trace is not None:
                submission.trace.held()
            self.metrics.held_appends.inc()
            return
        committed = holds.stale_after(payload)
        if committed > payload.client_high_water_mark:
            # An own commit the attempt did not see wrote one of its locks: the server would
            # refuse it. A lock failure found here, without the round trip.
            if followers:
                holds.follow(submission, [(s, p, max(after, committed)) for s, p, after in followers])
            self._outcomes.retry(submission, committed)
            return
        req_id = ReqId(self._host.client_id, mount.generation, self.partition_id, self._host.next_seq_num())
        pending = PendingAppend(submission, payload, followers or None, time.monotonic())
        self.monitor.register(req_id, pending)
        holds.hold(pending)
        trace = submission.trace
        connection.send_append(
            req_id,
            payload,
            self._retry_linger if submission.attempts > 1 else 0.0,
            "" if trace is None else trace.traceparent,
        )

    def holds_any(self, lock_hashes: Sequence[int], seen: int = -1) -> bool:
        """Whether a pending append of this client holds one of these locks now, or a commit of
        this client after ``seen`` (the mark an attempt would read at) wrote one (read from any
        thread: a hint, confirmed on the loop by :meth:`queue_first_attempt`)."""
        return self._holds.holds_any(lock_hashes, seen)

    def committed_after(self, lock_hashes: Sequence[int], seen: int) -> int:
        """The latest commit of this client after ``seen`` that wrote one of ``lock_hashes``
        (see :meth:`LockHolds.committed_after`; on the loop)."""
        return self._holds.committed_after(lock_hashes, seen)

    def queue_first_attempt(self, submission: Submission, lock_hashes: Sequence[int]) -> None:
        """Queue a context behind the pending append holding one of its expected locks, before its
        first attempt runs (``TransactionContext.expected_locks``); when none holds them any more,
        the attempt runs on a retry thread (on the loop): once this client has seen its own latest
        commit on them (:meth:`committed_after`), at once when there is none."""
        if self.state is _CLOSED:
            self._outcomes.rejected(submission, ProtocolError(f"partition {self.partition_id} is closed"))
            return
        if self._holds.queue_first_attempt(submission, lock_hashes):
            self.metrics.held_appends.inc()
            return
        self._outcomes.queued_attempt(submission, self.committed_after(lock_hashes, -1))

    def claim(
        self, submission: Submission, lock_hashes: Sequence[int], waiters: deque[ClaimWaiter] | None = None
    ) -> bool:
        """Claim these expected locks for the first attempt of ``submission`` (any thread; see
        :meth:`LockClaims.claim`); False when it waits for another context's claim."""
        return self._claims.claim(submission, lock_hashes, waiters)

    def has_claims(self, submission: Submission) -> bool:
        """Whether ``submission`` holds claims (a hint read without the lock)."""
        return self._claims.has_claims(submission)

    def release_claims(self, submission: Submission) -> deque[ClaimWaiter]:
        """End the claims of ``submission`` (any thread); returns the contexts that waited for
        them, in order, for :meth:`claims_released` on the loop."""
        return self._claims.release(submission)

    def claims_released(self, waiters: deque[ClaimWaiter]) -> None:
        """Go on with the contexts that waited for a claim (on the loop, after the claimant's
        append went through :meth:`send_append`, or its context ended): the first that claims its
        locks is queued as :meth:`queue_first_attempt` queues (behind the append that holds one
        of them, or to run once the own commits on them are applied), and the rest wait for its
        append in turn, in order. A context whose claim meets another claimant's waits for that
        one instead. So a hot lock costs a few steps per commit, however many wait."""
        while waiters:
            submission, lock_hashes = waiters.popleft()
            if self.state is _CLOSED:
                self._outcomes.rejected(submission, ProtocolError(f"partition {self.partition_id} is closed"))
            elif self.claim(submission, lock_hashes, waiters):
                self.queue_first_attempt(submission, lock_hashes)
                return

    def _failed(self, pending: PendingAppend, lock_target: int | None) -> None:
        """A pending append failed (a lock failure naming ``lock_target``, or lost: None): run its
        context again.

        What it held back waits behind that next attempt after a lock failure (the transaction
        that failed it most likely wrote the lock they share, so they would fail too); after a lost
        append it is sent as it is (nothing it waited for was written).
        """
        # Followers first: the next attempt may run (and end) on a retry thread at once.
        self._resolved(pending, None, retried_after=lock_target)
        self._outcomes.retry(pending.submission, lock_target)

    def _resolved(
        self, pending: PendingAppend, committed_as: int | None, retried_after: int | None = None
    ) -> None:
        """A pending append left the transaction monitor (``committed_as``: its transaction ID, or
        None when it failed): release its locks and what it held back (see :meth:`send_append`).

        ``retried_after`` is set when the append's own context runs again after a lock failure
        on that transaction: what it held back then follows that next attempt, in order.
        """
        held = self._holds.release(pending, committed_as)
        if held:
            if retried_after is not None:
                self._holds.follow(
                    pending.submission, [(s, p, max(after, retried_after)) for s, p, after in held]
                )
            else:
                self._release(held, -1 if committed_as is None else committed_as)

    def _release(self, waiting: list[Waiting], barrier: int) -> None:
        """Let contexts that waited for a lock go on, in order, now that its holder has resolved
        (committed as ``barrier``, or failed: -1).

        An attempt whose client high-water mark covers what it must have seen is sent as it is
        (it may wait again behind another holder). Of the others, only the first runs again (a
        lock failure found by the client, once the transaction is applied); the rest follow its
        next attempt and run again when their turn comes, so that a commit re-executes one waiting
        context, not every one (docs/design/locks.md "Locks of appends in flight").
        """
        leader: Waiting | None = None
        followers: list[Waiting] = []
        for submission, payload, own_barrier in waiting:
            after = max(own_barrier, barrier)
            if payload is not None and payload.client_high_water_mark >= after:
                self.send_append(submission, payload)
            elif leader is None:
                leader = (submission, payload, after)
            else:
                followers.append((submission, payload, after))
        if leader is not None:
            if followers:  # before the retry: its next attempt may run (and end) at once
                self._holds.follow(leader[0], followers)
            if leader[1] is None:  # queued before its first attempt: no lock failure of its own
                self._outcomes.queued_attempt(leader[0], leader[2])
            else:
                self._outcomes.retry(leader[0], leader[2])

    def leader_ended(self, leader: Submission) -> None:
        """``leader`` ended without another append (on the loop): release those following it."""
        followers = self._holds.leader_ended(leader)
        if followers is not None:
            self._release(followers, -1)

    def send_flush(self) -> None:
        """Nudge the server with a flush request when appends are pending (learn their fate)."""
        connection = self.connection
        if not self.mounted or not self.monitor or connection is None or connection.closed:
            return
        req_id = self._new_req_id(self._mount.generation)
        self._flush_reqs[req_id.seq_num] = self.monitor.position
        connection.send(client_pb2.ClientMessage(flush=client_pb2.FlushRequest(req_id=req_id.to_proto())))

    # --- the feed and other server messages -------------------------------------------------------

    def on_feed_entries(self, connection: ServerConnection, feed: client_pb2.FeedEntries) -> None:
        """Process a run of feed entries (``FeedEntries``, docs/protocol.md "Feed entries"), each in
        turn: contiguity, the transaction monitor, the apply queue. A run whose columns differ in
        length (or are empty) is malformed, and a run that starts past the next transaction is a
        gap: either is dropped whole and the partition mounts again, which restarts the feed after
        what was applied."""
        mount = self._mount
        if connection is not mount.connection or not mount.wanted:
            return  # a stale connection's leftovers, or not following this partition
        client_ids = list(feed.client_ids)
        generations = list(feed.generations)
        seq_nums = list(feed.seq_nums)
        headers = list(feed.headers)
        count = len(client_ids)
        problem = unequal_columns(
            {
                "client_ids": count,
                "generations": len(generations),
                "seq_nums": len(seq_nums),
                "headers": len(headers),
            }
        )
        if problem is not None or not count:
            log.warning(
                "partition %d: %s sent feed entries whose %s; mounting again",
                self.partition_id,
                connection.endpoint,
                problem or "columns hold no entry",
            )
            self.remount("malformed feed entries")
            return
        first = feed.first_transaction_id
        last = first + count - 1
        self.server_high_water_mark = max(self.server_high_water_mark, last)
        expected = self._feed_mark + 1
        if first > expected:  # transactions missing: restart the feed after what was applied
            self.feed_gaps += 1
            self.metrics.feed_gaps.inc()
            log.warning(
                "partition %d: %s sent transaction %d after %d (a gap in the feed); mounting again",
                self.partition_id,
                connection.endpoint,
                first,
                self._feed_mark,
            )
            self.remount(f"feed gap after transaction {self._feed_mark}")
            return
        partition_id = self.partition_id
        own_client = self._host.client_id
        monitor = self.monitor
        data_source = self._host.data_source
        to_queue = self._to_queue
        committed: list[tuple[Submission, int]] = []
        sent_at_sum = 0.0  # of the committed appends: their log round trips in one sum
        try:
            for index in range(expected - first, count):
                transaction_id = first + index
                self._feed_mark = transaction_id
                client_id = client_ids[index]
                req_id: ReqId | None = None
                data: bytes | None = None
                own: Submission | None = None
                if client_id == own_client and monitor:
                    req_id = ReqId(client_id, generations[index], partition_id, seq_nums[index])
                    succeeded, failed = monitor.on_feed(req_id)
                    for pending in failed:
                        self._failed(pending, None)
                    if succeeded is not None:
                        own, data = succeeded.submission, succeeded.payload.data
                        sent_at_sum += succeeded.sent_at
                        self.own_committed_mark = transaction_id
                        committed.append((own, transaction_id))
                        self._resolved(succeeded, transaction_id)
                queued = self._queued_mark
                if queued is not None and transaction_id > queued and self.worker is not None:
                    self._queued_mark = transaction_id
                    if req_id is None:
                        req_id = ReqId(client_id, generations[index], partition_id, seq_nums[index])
                    to_queue.append(
                        (
                            Transaction(
                                partition_id, transaction_id, req_id, headers[index], data_source, data
                            ),
                            own,
                        )
                    )
                if self._flush_marks:
                    self._check_flushes()
        finally:  # what committed before an error is still completed
            if committed:
                self.metrics.committed.inc(len(committed))
                now = time.monotonic()
                self.metrics.commit_seconds.observe_all([now - s.submitted_at for s, _ in committed])
                self.metrics.log_round_trip_seconds.add(len(committed) * now - sent_at_sum, len(committed))
                self._outcomes.completed(committed)

    def end_of_batch(self) -> None:
        """Hand the feed entries of the last batch of server messages to the apply worker at once."""
        if self._to_queue and self.worker is not None:
            self.worker.enqueue_many(self._to_queue)
            self._to_queue = []

    def on_message(self, connection: ServerConnection, kind: str, body: object) -> None:
        """Process a server message other than feed data (``kind`` is its oneof field name)."""
        if connection is not self.connection:
            return
        if kind == "mount":
            assert isinstance(body, client_pb2.MountResponse)
            self._mount.on_response(body)
        elif kind == "lock_failure":
            assert isinstance(body, client_pb2.LockFailure)
            pending = self.monitor.on_lock_failure(ReqId.from_proto(body.req_id))
            if pending is not None:
                self._failed(pending, body.transaction_id)
        elif kind == "flush":
            assert isinstance(body, client_pb2.FlushResponse)
            position = self._flush_reqs.pop(body.req_id.seq_num, None)
            self.server_high_water_mark = max(self.server_high_water_mark, body.transaction_id)
            if position is not None:
                self._flush_marks.append((position, body.transaction_id))
                self._check_flushes()
        elif kind == "feed_suspended":
            self._host.refresh_assignment()
            self.remount(f"{connection.endpoint} suspended the feed")
        elif kind == "error":
            assert isinstance(body, client_pb2.ServerError)
            self._on_server_error(body)

    def _check_flushes(self) -> None:
        """Fail appends sent before a flush once the feed reached the flush's high-water mark."""
        remaining = []
        for position, mark in self._flush_marks:
            if self._feed_mark >= mark:
                for pending in self.monitor.fail_before(position):
                    self._failed(pending, None)
            else:
                remaining.append((position, mark))
        self._flush_marks = remaining

    def _on_server_error(self, error: client_pb2.ServerError) -> None:
        req_id = ReqId.from_proto(error.req_id)
        log.warning("partition %d: server error for %s: %s", self.partition_id, req_id, error.message)
        if self._mount.on_error(req_id):
            return
        pending = self.monitor.remove(req_id)
        if pending is not None:
            self._outcomes.rejected(
                pending.submission,
                ProtocolError(f"server {self.endpoint} rejected the append {req_id}: {error.message}"),
            )
            self._resolved(pending, None)
