"""The locks a client's pending appends hold on one partition, and the contexts held back behind them.

Source: docs/design/locks.md "Locks of appends in flight" (the client side); docs/design/client.md
"Retries and lock failures"; ``docs/protocol.md`` "Append" (client side). Everything here runs on
the client's event loop, but for the hints :meth:`LockHolds.holds_any` and
:meth:`LockHolds.writes`, which other threads read.

A pending append of this client *holds* its WRITE and APPEND locks until it resolves
(``client.holdConflictingAppends``). An attempt whose WRITE or READ lock a holder holds is held
back behind it, and so is a context queued before its first attempt; when the holder resolves,
what it held back goes on as a queue (:data:`~waltz.client.submission.Waiting`): one context runs
again, the others *follow* its next attempt. The locks of this client's own commits are
remembered until it has applied them, and then among its latest :data:`KEEP_APPLIED_COMMITS`: an
attempt built from a mark below such a commit that takes one of its locks would fail the server's
lock check.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from waltz.client.context import AppendPayload
from waltz.client.submission import Submission, Waiting
from waltz.client.waiting import Watermark

__all__ = ["KEEP_APPLIED_COMMITS", "MAX_REMEMBERED_COMMITS", "LockHolds", "PendingAppend"]

#: Own commits whose locks a partition remembers at most, applied or not (the oldest are forgotten
#: beyond: their lock failures are then found by the server).
MAX_REMEMBERED_COMMITS = 100_000
#: Own commits a partition still remembers after applying them, the latest ones: an attempt that
#: read from a mark below one of them before it was applied is sent only after, and fails here.
KEEP_APPLIED_COMMITS = 1_000


@dataclass(slots=True)
class PendingAppend:
    """An append sent and not resolved yet, with the appends held back behind its locks."""

    submission: Submission
    payload: AppendPayload
    held: list[Waiting] | None = None
    sent_at: float = 0.0
    """``time.monotonic()`` when it was handed to the connection (the log round trip's start)."""


class LockHolds:
    """The lock holders among a partition's pending appends, the contexts waiting behind them, and
    the locks of the partition's own recent commits (docs/design/locks.md "Locks of appends in
    flight").

    Args:
        applied: the partition's applied mark (applied commits beyond the latest
            :data:`KEEP_APPLIED_COMMITS` are forgotten).
        enabled: ``client.holdConflictingAppends``: pending appends hold their locks and commits
            are remembered; off, nothing is ever held or remembered.
    """

    def __init__(self, applied: Watermark, enabled: bool = True) -> None:
        self.enabled = enabled
        self._applied = applied
        self._holders: dict[int, PendingAppend] = {}  # lock hash -> the latest pending append locking it
        # This client's commits that its applies have not reached yet: lock hash -> the latest such
        # transaction ID writing it, and the commits in order (forgotten once applied).
        self._committed_locks: dict[int, int] = {}
        self._committed_order: deque[tuple[int, tuple[int, ...]]] = deque()
        # Contexts running again whose followers wait for their next attempt (see follow).
        self._leaders: set[Submission] = set()

    # --- an attempt's append on its way out ------------------------------------------------------

    def stop_leading(self, leader: Submission) -> list[Waiting]:
        """``leader``'s next attempt is being sent: the contexts that followed it (taken from it)
        now wait behind that append. Call it only for a submission with followers."""
        followers = leader.followers
        assert followers is not None
        leader.followers = None
        self._leaders.discard(leader)
        return followers

    def place(
        self, submission: Submission, payload: AppendPayload, followers: list[Waiting] | None
    ) -> int | None:
        """Where an attempt's append goes before it is sent.

        Returns:
            None when it is held back, with the contexts that follow it, behind the pending append
            holding one of its WRITE or READ locks; else the latest own commit that wrote one of
            them and that its client high-water mark does not cover (the server would refuse it:
            a lock failure found by the client), or that mark itself when there is none (it may be
            sent).
        """
        holders = self._holders
        if holders:
            for lock in payload.write_locks + payload.read_locks:
                holder = holders.get(lock)
                if holder is not None:
                    if holder.held is None:
                        holder.held = [(submission, payload, -1)]
                    else:
                        holder.held.append((submission, payload, -1))
                    if followers:
                        holder.held += followers
                    return None
        mark = payload.client_high_water_mark
        if not self._committed_locks:
            return mark
        return self.committed_after(payload.write_locks + payload.read_locks, mark)

    def hold(self, pending: PendingAppend) -> None:
        """A pending append just sent holds its WRITE and APPEND locks (when enabled)."""
        if self.enabled:
            holders = self._holders
            payload = pending.payload
            for lock in payload.write_locks:
                holders[lock] = pending
            for lock in payload.append_locks:
                holders[lock] = pending

    # --- a pending append resolved -----------------------------------------------------------------

    def release(self, pending: PendingAppend, committed_as: int | None) -> list[Waiting] | None:
        """A pending append resolved (committed as ``committed_as``, or failed: None): remember a
        commit's locks, drop its holds, and return what it held back (taken from it), in order."""
        holders = self._holders
        if committed_as is not None and self.enabled:
            self._remember_commit(pending.payload, committed_as)
        if holders:
            payload = pending.payload
            for lock in payload.write_locks:
                if holders.get(lock) is pending:
                    del holders[lock]
            for lock in payload.append_locks:
                if holders.get(lock) is pending:
                    del holders[lock]
        held = pending.held
        if held:
            pending.held = None
            return held
        return None

    def follow(self, leader: Submission, waiting: list[Waiting]) -> None:
        """Queue ``waiting`` behind the next attempt of ``leader``, which runs again."""
        if leader.followers is None:
            leader.followers = waiting
        else:
            leader.followers += waiting
        self._leaders.add(leader)

    def leader_ended(self, leader: Submission) -> list[Waiting] | None:
        """``leader`` ended without another append: the contexts that followed it (taken from it)."""
        followers = leader.followers
        if followers is not None:
            leader.followers = None
            self._leaders.discard(leader)
        return followers

    # --- contexts queued before their first attempt ---------------------------------------------

    def queue_first_attempt(self, submission: Submission, lock_hashes: Sequence[int]) -> bool:
        """Queue a context behind the pending append holding one of these locks, before its first
        attempt runs; False when none holds them."""
        holders = self._holders
        for lock in lock_hashes:
            holder = holders.get(lock)
            if holder is not None:
                waiting: Waiting = (submission, None, -1)
                if holder.held is None:
                    holder.held = [waiting]
                else:
                    holder.held.append(waiting)
                return True
        return False

    # --- what other threads read -----------------------------------------------------------------

    def holds_any(self, lock_hashes: Sequence[int], seen: int = -1) -> bool:
        """Whether a pending append of this client holds one of these locks now, or a commit of
        this client after ``seen`` (the mark an attempt would read at) wrote one (read from any
        thread: a hint, confirmed on the loop)."""
        holders = self._holders
        if holders and any(lock in holders for lock in lock_hashes):
            return True
        committed = self._committed_locks
        return bool(committed) and any(committed.get(lock, -1) > seen for lock in lock_hashes)

    def writes(self, lock: int) -> bool:
        """Whether an append of this client writes ``lock``: a pending one, or a commit it
        remembers (read from any thread: a hint)."""
        return lock in self._holders or lock in self._committed_locks

    def committed_after(self, lock_hashes: Sequence[int], seen: int) -> int:
        """The latest commit of this client after ``seen`` that wrote one of ``lock_hashes``
        (a WRITE or APPEND lock) among those it remembers (every one not yet applied here, and the
        latest applied ones); ``seen`` when there is none (on the loop).

        An attempt whose client high-water mark is ``seen`` would fail the server's lock check on
        it (docs/design/locks.md "Locks of appends in flight").
        """
        self._forget_applied()
        committed = self._committed_locks
        latest = seen
        for lock in lock_hashes:
            latest = max(latest, committed.get(lock, -1))
        return latest

    # --- own commits -------------------------------------------------------------------------------

    def _remember_commit(self, payload: AppendPayload, transaction_id: int) -> None:
        """Keep the WRITE and APPEND locks of an own commit until this client has applied it and
        :data:`KEEP_APPLIED_COMMITS` later own commits."""
        locks = payload.write_locks + payload.append_locks
        if not locks:
            return
        order = self._committed_order
        if len(order) >= MAX_REMEMBERED_COMMITS:
            self._forget(order.popleft())  # only a lock failure found here is lost
        order.append((transaction_id, locks))
        committed = self._committed_locks
        for lock in locks:
            committed[lock] = transaction_id

    def _forget_applied(self) -> None:
        """Forget applied commits beyond the latest :data:`KEEP_APPLIED_COMMITS` (in ID order)."""
        order = self._committed_order
        applied = self._applied.value
        while len(order) > KEEP_APPLIED_COMMITS and order[0][0] <= applied:
            self._forget(order.popleft())

    def _forget(self, commit: tuple[int, tuple[int, ...]]) -> None:
        transaction_id, locks = commit
        committed = self._committed_locks
        for lock in locks:
            if committed.get(lock) == transaction_id:
                del committed[lock]

    # --- closing -----------------------------------------------------------------------------------

    def clear(self) -> list[Submission]:
        """Forget everything (the partition closes); returns the contexts that followed a leader."""
        followers: list[Submission] = []
        for leader in self._leaders:
            followers += [submission for submission, _, _ in leader.followers or ()]
            leader.followers = None
        self._leaders.clear()
        self._holders.clear()
        return followers
