"""Claims on expected locks: first attempts that take turns on a lock their client writes.

Source: docs/design/locks.md "Locks of appends in flight" (claims); docs/decisions/0044. Before its
first attempt a context claims the locks it expects to take (``TransactionContext.expected_locks``)
and keeps the claims until its append reaches the client's event loop, or it ends without one. A
context that finds one of its expected locks claimed, when an append of this client writes that
lock, waits for the claimant without running. Claims are taken and released from any thread,
under a lock of their own.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence

from waltz.client.lock_holds import LockHolds
from waltz.client.metrics import PartitionMetrics
from waltz.client.submission import Submission

__all__ = ["ClaimWaiter", "LockClaims"]

#: A context waiting for another's claim, with the lock hashes it expects (see LockClaims.claim).
ClaimWaiter = tuple[Submission, Sequence[int]]


class LockClaims:
    """The claims of one partition's first attempts, and the contexts waiting for them.

    Args:
        holds: the partition's lock holds (which locks an append of this client writes).
        metrics: the partition's counters (``claim_waits``).
    """

    def __init__(self, holds: LockHolds, metrics: PartitionMetrics) -> None:
        self._holds = holds
        self._metrics = metrics
        self._lock = threading.Lock()
        self._claims: dict[int, Submission] = {}  # lock hash -> the context whose first attempt claimed it
        self._claimed: dict[Submission, tuple[Sequence[int], deque[ClaimWaiter]]] = {}

    def claim(
        self, submission: Submission, lock_hashes: Sequence[int], waiters: deque[ClaimWaiter] | None = None
    ) -> bool:
        """Claim these expected locks for the first attempt of ``submission``, which runs now or
        is queued (any thread), until its append reaches the event loop or the context ends
        without one (:meth:`release`). False when another context claimed one of them first:
        ``submission`` then waits, without running, for that context's append, and goes on when
        that claim is released (docs/design/locks.md "Locks of appends in flight").

        Only a lock that an own append writes, pending or among the commits this client
        remembers, makes a context wait for another's claim: two contexts that expect to read an
        entity nobody here writes run side by side, as their locks allow.

        The holders of locks are only known on the loop, once an append gets there: two contexts
        on a hot lock that both looked before either append arrived would both run, and one
        would be held back behind the other and run again.

        ``waiters``: contexts that wait for this one's append from the start, ahead of any that
        find its claim later.
        """
        writes = self._holds.writes  # read from any thread: hints
        with self._lock:
            claims = self._claims
            for lock in lock_hashes:
                claimant = claims.get(lock)
                if claimant is not None and writes(lock):
                    self._claimed[claimant][1].append((submission, lock_hashes))
                    self._metrics.claim_waits.inc()
                    return False
            for lock in lock_hashes:
                claims[lock] = submission
            self._claimed[submission] = (lock_hashes, deque() if waiters is None else waiters)
            return True

    def has_claims(self, submission: Submission) -> bool:
        """Whether ``submission`` holds claims (a hint read without the lock)."""
        return submission in self._claimed

    def release(self, submission: Submission) -> deque[ClaimWaiter]:
        """End the claims of ``submission`` (any thread); returns the contexts that waited for
        them, in order."""
        with self._lock:
            entry = self._claimed.pop(submission, None)
            if entry is None:
                return deque()
            lock_hashes, waiters = entry
            claims = self._claims
            for lock in lock_hashes:
                if claims.get(lock) is submission:
                    del claims[lock]
            return waiters

    def clear(self) -> list[Submission]:
        """Forget every claim (the partition closes); returns the contexts still waiting."""
        waiting: list[Submission] = []
        with self._lock:
            for _, waiters in self._claimed.values():
                waiting += [submission for submission, _ in waiters]
            self._claimed.clear()
            self._claims.clear()
        return waiting
