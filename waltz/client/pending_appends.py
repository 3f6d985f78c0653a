"""A partition's appends of this client on their way: sent, held back, blocked; and how each ends.

Source: docs/design/client.md "Appends, the feed and flush", "Failed-append detection", "Retries
and lock failures"; docs/design/locks.md "Locks of appends in flight" (client side). An attempt's
append is sent on the partition's connection and enters the transaction monitor; or it is held
back behind an own pending append holding one of its locks (:class:`~waltz.client.lock_holds.
LockHolds`); or it is found stale against an own commit it did not see; or, while the partition is
not mounted, it is blocked until the mount succeeds, or until its context's timeout passes (it
then ends as expired: nothing was sent), or ends with the server's refusal of the mount (the
client's mark above the partition's high-water mark). The feed, lock failures, flush answers,
server errors and mounts resolve what was sent, and the outcome goes to the attempt path
(:class:`AttemptOutcomes`). Runs on the client's event loop, but for
the claims (:class:`~waltz.client.lock_claims.LockClaims`), which any thread takes and releases.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Sequence
from typing import Protocol

from waltz.client.context import AppendPayload
from waltz.client.lock_claims import ClaimWaiter, LockClaims
from waltz.client.lock_holds import LockHolds, PendingAppend
from waltz.client.metrics import PartitionMetrics
from waltz.client.monitor import TransactionMonitor
from waltz.client.mount_procedure import MountProcedure, PartitionState
from waltz.client.submission import Submission, Waiting
from waltz.errors import ApplyPausedError, ClientAheadOfLogError, ProtocolError
from waltz.protocol import client_pb2
from waltz.protocol.records import ReqId

__all__ = ["AttemptOutcomes", "PendingAppends", "RequestIds"]

log = logging.getLogger(__name__)

# Module constants for the per-append checks (an enum member read through its class costs more).
_MOUNTED = PartitionState.MOUNTED
_CLOSED = PartitionState.CLOSED


class RequestIds(Protocol):
    """Where request IDs come from: the client's ID and its ReqId sequence (on the event loop)."""

    client_id: int

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

    def expired_unsent(self, submission: Submission) -> None:
        """End as expired a submission whose append waited for the partition's mount past the
        context's timeout: never sent, so it cannot commit (its callbacks run on a retry thread)."""
        ...

    def apply_paused(self, partition_id: int, error: ApplyPausedError) -> None:
        """The partition's apply started to wait for this instance's upgrade (on its apply
        thread): end the retries waiting for a transaction it cannot apply."""
        ...

    def route_again(self, submission: Submission, error: BaseException) -> None:
        """Run a submission again from its first attempt, routed anew once the partition epochs
        moved: the server refused its append for the epoch it was routed by (``error``: a
        :class:`~waltz.errors.StalePartitionEpochError` or
        :class:`~waltz.errors.PartitionNotOpenError`)."""
        ...


class PendingAppends:
    """One partition's appends of this client between an attempt and its outcome.

    Args:
        partition_id: the partition.
        ids: the client's ID and ReqId sequence.
        outcomes: where the outcomes of the appends go (the attempt path).
        mount: the partition's mount procedure (its state, connection and generation).
        holds: the locks of the partition's pending appends and its remembered own commits.
        claims: the claims of first attempts on their expected locks.
        metrics: the partition's counters.
        retry_linger: seconds a re-attempt's append may wait for the next first attempt's append
            to share its stream message (``client.retryLinger``; see :meth:`send`).
    """

    def __init__(
        self,
        partition_id: int,
        ids: RequestIds,
        outcomes: AttemptOutcomes,
        mount: MountProcedure,
        holds: LockHolds,
        claims: LockClaims,
        metrics: PartitionMetrics,
        retry_linger: float = 0.0,
    ) -> None:
        self._partition_id = partition_id
        self._ids = ids
        self._outcomes = outcomes
        self._mount = mount
        self._holds = holds
        self._claims = claims
        self._metrics = metrics
        self._retry_linger = retry_linger
        self.monitor: TransactionMonitor[PendingAppend] = TransactionMonitor()
        """The appends sent and not resolved yet, in the order sent."""
        self._blocked: deque[tuple[Submission, AppendPayload]] = deque()
        self._flush_reqs: dict[int, int] = {}  # flush ReqId sequence number -> monitor position
        self._flush_marks: list[tuple[int, int]] = []  # (monitor position, high-water mark)

    @property
    def blocked(self) -> int:
        """Appends waiting for the partition to be mounted."""
        return len(self._blocked)

    # --- sending ----------------------------------------------------------------------------------

    def send(self, submission: Submission, payload: AppendPayload) -> None:
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
            self._reject_closed(submission)
            return
        connection = mount.connection
        if state is not _MOUNTED or connection is None or connection.closed:
            refusal = mount.refusal
            if refusal is not None:  # the client's mark is above the log's: nothing is sent
                self._outcomes.rejected(submission, refusal)
                return
            self._blocked.append((submission, payload))
            remaining = submission.remaining()
            if remaining is not None:  # the context's timeout bounds the wait for the mount too
                asyncio.get_running_loop().call_later(remaining, self._expire_blocked, submission)
            if state is _MOUNTED:
                mount.remount("connection lost")
            return
        holds = self._holds
        followers = submission.followers
        if followers is not None:  # its turn came: they wait behind this attempt
            holds.stop_leading(submission)
        committed = holds.place(submission, payload, followers)
        if committed is None:  # held back
            if submission.trace is not None:
                submission.trace.held()
            self._metrics.held_appends.inc()
            return
        if committed > payload.client_high_water_mark:
            # An own commit the attempt did not see wrote one of its locks: the server would
            # refuse it. A lock failure found here, without the round trip.
            if followers:
                holds.follow(submission, [(s, p, max(after, committed)) for s, p, after in followers])
            self._outcomes.retry(submission, committed)
            return
        ids = self._ids
        req_id = ReqId(ids.client_id, mount.generation, self._partition_id, ids.next_seq_num())
        pending = PendingAppend(submission, payload, followers or None, time.monotonic())
        self.monitor.register(req_id, pending)
        holds.hold(pending)
        trace = submission.trace
        connection.send_append(
            req_id,
            payload,
            self._retry_linger if submission.attempts > 1 else 0.0,
            "" if trace is None else trace.traceparent,
            submission.epoch,
        )

    def _expire_blocked(self, submission: Submission) -> None:
        """The timeout of a context whose append still waits for the mount has passed (on the
        loop): it leaves the blocked appends and ends as expired. Nothing was sent, so nothing
        can commit; an append sent before, whose outcome only a mount tells, waits for it."""
        for index, (blocked, _) in enumerate(self._blocked):
            if blocked is submission:
                del self._blocked[index]
                self._outcomes.expired_unsent(submission)
                return

    def on_mounted(self) -> tuple[int, int]:
        """The partition is mounted: every append still pending failed (re-executed, and what it
        held back is sent), and the blocked appends are sent. Returns how many of each."""
        failed = self.monitor.fail_all()
        counts = len(failed), len(self._blocked)
        for pending in failed:  # after the state is MOUNTED: what they held is sent now
            self._failed(pending, None)
        blocked, self._blocked = self._blocked, deque()
        for submission, payload in blocked:
            self.send(submission, payload)
        return counts

    def on_refused(self, error: ClientAheadOfLogError) -> int:
        """The server refused the mount: the client's mark is above the partition's high-water
        mark (docs/design/client.md "Mount and the client high-water mark"). Every append still
        pending, and every blocked one, ends with ``error`` instead of running again (what they
        held back follows, and ends with it when it is sent); flushes sent before are answered no
        more. Returns how many ended here."""
        self.forget_flushes()
        pending = self.monitor.fail_all()
        blocked, self._blocked = self._blocked, deque()
        for item in pending:
            self._outcomes.rejected(item.submission, error)
            self._resolved(item, None)
        for submission, _ in blocked:
            self._outcomes.rejected(submission, error)
        return len(pending) + len(blocked)

    # --- contexts before their first attempt ------------------------------------------------------

    def queue_first_attempt(self, submission: Submission, lock_hashes: Sequence[int]) -> None:
        """Queue a context behind the pending append holding one of its expected locks, before its
        first attempt runs (``TransactionContext.expected_locks``); when none holds them any more,
        the attempt runs on a retry thread (on the loop): once this client has seen its own latest
        commit on them (:meth:`LockHolds.committed_after`), at once when there is none."""
        if self._mount.state is _CLOSED:
            self._reject_closed(submission)
            return
        if self._holds.queue_first_attempt(submission, lock_hashes):
            self._metrics.held_appends.inc()
            return
        self._outcomes.queued_attempt(submission, self._holds.committed_after(lock_hashes, -1))

    def claims_released(self, waiters: deque[ClaimWaiter]) -> None:
        """Go on with the contexts that waited for a claim (on the loop, after the claimant's
        append went through :meth:`send`, or its context ended): the first that claims its locks
        is queued as :meth:`queue_first_attempt` queues (behind the append that holds one of them,
        or to run once the own commits on them are applied), and the rest wait for its append in
        turn, in order. A context whose claim meets another claimant's waits for that one instead.
        So a hot lock costs a few steps per commit, however many wait."""
        while waiters:
            submission, lock_hashes = waiters.popleft()
            if self._mount.state is _CLOSED:
                self._reject_closed(submission)
            elif self._claims.claim(submission, lock_hashes, waiters):
                self.queue_first_attempt(submission, lock_hashes)
                return

    # --- outcomes ---------------------------------------------------------------------------------

    def on_feed(self, req_id: ReqId) -> PendingAppend | None:
        """A feed entry of this client's: the append it confirms (None when not pending), to be
        resolved with :meth:`committed`; every older pending append failed and runs again
        (docs/design/client.md "Failed-append detection")."""
        succeeded, failed = self.monitor.on_feed(req_id)
        for pending in failed:
            self._failed(pending, None)
        return succeeded

    def committed(self, pending: PendingAppend, transaction_id: int) -> None:
        """A pending append committed as ``transaction_id``: release its locks and what it held
        back (the outcome itself goes to the attempt path with the feed run's other commits)."""
        self._resolved(pending, transaction_id)

    def on_lock_failure(self, req_id: ReqId, transaction_id: int) -> None:
        """The server's lock check refused an append, naming ``transaction_id``: run it again."""
        pending = self.monitor.on_lock_failure(req_id)
        if pending is not None:
            self._failed(pending, transaction_id)

    def on_rejected(self, req_id: ReqId, error: BaseException) -> None:
        """The server rejected an append for good (a server error naming it)."""
        pending = self.monitor.remove(req_id)
        if pending is not None:
            self._outcomes.rejected(pending.submission, error)
            self._resolved(pending, None)

    def on_refused_epoch(self, req_id: ReqId, error: BaseException) -> None:
        """The server refused an append for the epoch it was routed by (``STALE_PARTITION_EPOCH``,
        ``PARTITION_NOT_OPEN``; nothing of it was kept): its locks and the contexts held back
        behind it, or following it, are released as for a context that ended without an append
        (docs/design/locks.md "Locks of appends in flight"), and its context runs again from its
        first attempt, routed anew (docs/design/splits.md "Clients across a split")."""
        pending = self.monitor.remove(req_id)
        if pending is not None:
            self._resolved(pending, None)
            self._outcomes.route_again(pending.submission, error)

    def leader_ended(self, leader: Submission) -> None:
        """``leader`` ended without another append (on the loop): release those following it."""
        followers = self._holds.leader_ended(leader)
        if followers is not None:
            self._release(followers, -1)

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
        None when it failed): release its locks and what it held back (see :meth:`send`).

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
                self.send(submission, payload)
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

    # --- flush ------------------------------------------------------------------------------------

    def send_flush(self) -> None:
        """Nudge the server with a flush request when appends are pending (learn their fate)."""
        mount = self._mount
        connection = mount.connection
        if not mount.mounted or not self.monitor or connection is None or connection.closed:
            return
        ids = self._ids
        req_id = ReqId(ids.client_id, mount.generation, self._partition_id, ids.next_seq_num())
        self._flush_reqs[req_id.seq_num] = self.monitor.position
        connection.send(client_pb2.ClientMessage(flush=client_pb2.FlushRequest(req_id=req_id.to_proto())))

    def on_flush(self, response: client_pb2.FlushResponse, feed_mark: int, mount_mark: int) -> None:
        """A flush answer: once the feed (now at ``feed_mark``) reaches its high-water mark, every
        append sent before the flush that is still pending failed.

        An answer whose mark is below ``mount_mark``, the mark the partition was mounted from,
        fails nothing: the feed starts after the mount mark, so it never shows a commit at or
        below it, and a pending append the server committed there would run again, and commit
        again, at every flush. A server refuses such a mount (docs/protocol.md "Mount"); one that
        does not (a release before the refusal) gets a warning here instead
        (docs/design/client.md "Failed-append detection")."""
        position = self._flush_reqs.pop(response.req_id.seq_num, None)
        if position is None:
            return
        mark = response.transaction_id
        if mark < mount_mark:
            log.warning(
                "partition %d: a flush answered with high-water mark %d, below the mark %d the "
                "partition was mounted from: the application's database is ahead of this log "
                "(restored from another cluster? wrong cluster root?); the %d append(s) pending "
                "are not failed on it, as their commits would never show in the feed",
                self._partition_id,
                mark,
                mount_mark,
                len(self.monitor),
            )
            return
        self._flush_marks.append((position, mark))
        self.feed_reached(feed_mark)

    @property
    def awaits_flushes(self) -> bool:
        """Whether a flush answer waits for the feed to reach its mark (see :meth:`feed_reached`)."""
        return bool(self._flush_marks)

    def feed_reached(self, feed_mark: int) -> bool:
        """The feed reached ``feed_mark``: fail appends sent before a flush whose high-water mark it
        reached. Returns whether flush answers still wait."""
        remaining = []
        for position, mark in self._flush_marks:
            if feed_mark >= mark:
                for pending in self.monitor.fail_before(position):
                    self._failed(pending, None)
            else:
                remaining.append((position, mark))
        self._flush_marks = remaining
        return bool(remaining)

    def forget_flushes(self) -> None:
        """The partition mounts again: flushes sent before are answered no more."""
        self._flush_reqs.clear()
        self._flush_marks.clear()

    # --- closing ----------------------------------------------------------------------------------

    def _reject_closed(self, submission: Submission) -> None:
        """End a context that came to the partition after it closed."""
        self._outcomes.rejected(submission, ProtocolError(f"partition {self._partition_id} is closed"))

    def close(self) -> list[Submission]:
        """Forget everything (the partition closes); returns every submission still held here."""
        pending = self.monitor.fail_all()
        held = [p.submission for p in pending] + [s for s, _ in self._blocked]
        held += [submission for p in pending for submission, _, _ in p.held or ()]
        held += self._holds.clear()
        held += self._claims.clear()
        self._blocked.clear()
        return held
