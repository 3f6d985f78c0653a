"""One submitted transaction context through its attempts, up to exactly one outcome.

Source: docs/design/client.md "Retries and lock failures" (execute, append, retry queue),
"Transaction contexts and callbacks" (``TransactionContext`` callbacks). A :class:`Submission` runs
attempts (``execute`` with a fresh builder at the current client high-water mark) until one is
committed, ``execute`` drops the transaction, raises, or the context expires between attempts (or
while its append waits for the partition's mount, unsent). It
does no networking: the client sends what :meth:`Submission.attempt` returns and reports back what
the feed says.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from waltz.client.context import AppendPayload, TransactionBuilder, TransactionContext, refuse_awaitable
from waltz.client.outcome import Outcome, OutcomeKind
from waltz.errors import MessageTooLargeError, TransactionExpiredError, WaltzClientError

if TYPE_CHECKING:
    from waltz.tracing import TransactionTrace

__all__ = ["Submission", "SubmissionFuture", "Waiting"]

#: A context waiting for a lock of its partition: its submission, the append of its last attempt
#: (None: a context queued before its first attempt ran), and the transaction ID that attempt must
#: have seen (its client high-water mark at least that high) to be sent as it is; otherwise it runs
#: again once that transaction is applied.
Waiting = tuple["Submission", AppendPayload | None, int]

log = logging.getLogger(__name__)

_FINISH_LOCK = threading.Lock()

#: Bytes an append request needs besides its data and lock hashes (ReqId, mark, header, checksum,
#: framing).
APPEND_OVERHEAD_BYTES = 256
#: Bytes a lock hash can take in an append request at most (a 64-bit varint).
LOCK_HASH_BYTES = 10


class SubmissionFuture(concurrent.futures.Future[Outcome]):
    """The future of a submission: an append in flight cannot be recalled, so it cannot be
    cancelled; and its outcome cannot be waited for where the wait would hold back what it waits
    for (the client's completion thread, its ``apply_transaction``): a wait there for an outcome
    not yet known raises ``WaltzClientError`` at once; a poll (``timeout=0``) and a wait for an
    outcome already known are answered as usual (docs/design/client.md "WaltzClient and
    AsyncWaltzClient").

    Args:
        wait_refusal: why a wait on the calling thread would hold back this outcome, or None;
            None: no wait is refused.
    """

    def __init__(self, wait_refusal: Callable[[], str | None] | None = None) -> None:
        super().__init__()
        self.wait_refusal = wait_refusal

    def cancel(self) -> bool:
        return False

    def _refuse_a_wait_that_would_deadlock(self, timeout: float | None) -> None:
        refusal = self.wait_refusal
        if (timeout is None or timeout > 0) and refusal is not None and not self.done():
            why = refusal()
            if why is not None:
                raise WaltzClientError(why)

    def result(self, timeout: float | None = None) -> Outcome:
        self._refuse_a_wait_that_would_deadlock(timeout)
        return super().result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._refuse_a_wait_that_would_deadlock(timeout)
        return super().exception(timeout)


class Submission:
    """A context's attempts and its single outcome.

    Args:
        context: the application's context.
        partition_id: the partition ``context.partition_id`` chose.
        high_water_mark: returns the partition's client high-water mark (the callbacks').
        max_message_bytes: the largest append message; bigger data ends the context with
            :class:`~waltz.errors.MessageTooLargeError`.
        on_finished: called once when the context ends (before the future resolves), e.g. to
            release its concurrency slot.
        with_future: False for a submission without a future (``WaltzClient.execute``): only the
            context's callbacks tell how it ended; :attr:`future` is then None.
        epoch: the partition epoch it was routed by (docs/design/splits.md "Clients across a split").
        route_serial: the serial of the client's routing view it was routed by
            (:class:`~waltz.client.routing.RoutingView`).
        slot_partition: the partition whose concurrency slot it holds until it ends (default
            ``partition_id``; it keeps it when it is routed again).
        wait_refusal: why a wait for its future's outcome on the calling thread would hold back
            that outcome (:class:`SubmissionFuture`), or None.
    """

    __slots__ = (
        "_finished",
        "_high_water_mark",
        "_max_message_bytes",
        "_on_finished",
        "attempts",
        "context",
        "deadline",
        "epoch",
        "followers",
        "future",
        "last_lock_target",
        "lock_failures",
        "lost_appends",
        "partition_id",
        "posted",
        "repeated_lock_failures",
        "route_deadline",
        "route_serial",
        "slot_partition",
        "submitted_at",
        "timeout",
        "trace",
    )

    def __init__(
        self,
        context: TransactionContext,
        partition_id: int,
        high_water_mark: Callable[[int], int],
        max_message_bytes: int,
        on_finished: Callable[[Submission], None] | None = None,
        with_future: bool = True,
        epoch: int = 0,
        route_serial: int = 0,
        slot_partition: int | None = None,
        wait_refusal: Callable[[], str | None] | None = None,
    ) -> None:
        self.context = context
        self.partition_id = partition_id
        self.epoch = epoch
        """The partition epoch its appends carry: the one it was routed by."""
        self.route_serial = route_serial
        """The serial of the routing view it was routed by."""
        self.route_deadline: float | None = None
        """While it waits for the epochs to move (``time.monotonic()``): when waiting fails it."""
        self.slot_partition = partition_id if slot_partition is None else slot_partition
        """The partition whose concurrency slot it holds (``InFlight``)."""
        self.future: concurrent.futures.Future[Outcome] | None = (
            SubmissionFuture(wait_refusal) if with_future else None
        )
        self.attempts = 0
        self.lock_failures = 0
        self.lost_appends = 0
        """Attempts that failed without a lock failure (lost with a connection, a server, ...)."""
        self.last_lock_target = -2
        self.repeated_lock_failures = 0
        """Lock failures in a row naming the same transaction (the client paces those)."""
        self.followers: list[Waiting] | None = None
        """Contexts waiting on a lock behind this one's next attempt (see ``ClientPartition``)."""
        self.submitted_at = time.monotonic()
        self.posted = False
        """True once an attempt's append reached the client's event loop (read and set there)."""
        timeout = getattr(context, "timeout", None)
        self.timeout: float | None = timeout
        self.deadline: float | None = None if timeout is None else self.submitted_at + timeout
        self._high_water_mark = high_water_mark
        self._max_message_bytes = max_message_bytes
        self._on_finished = on_finished
        self._finished = False
        self.trace: TransactionTrace | None = None
        """Its trace when tracing is on and it is sampled (docs/design/client.md, "Traces")."""

    def __repr__(self) -> str:
        return (
            f"Submission({type(self.context).__name__}, partition {self.partition_id}, "
            f"attempts {self.attempts}, finished {self._finished})"
        )

    @property
    def finished(self) -> bool:
        """True once the context ended (committed, dropped, failed or expired)."""
        return self._finished

    def expired(self, now: float | None = None) -> bool:
        """True when the context has a timeout and it has passed."""
        return self.deadline is not None and (time.monotonic() if now is None else now) >= self.deadline

    def remaining(self) -> float | None:
        """Seconds until expiry (never negative), or None without a timeout."""
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())

    def attempt(self) -> AppendPayload | None:
        """Run one attempt: check expiry, read the high-water mark, call ``execute``.

        Returns:
            The append to send, or None when the context ended here (expired, dropped by
            ``execute``, or ``execute`` raised), its callbacks already called.
        """
        if self._finished:
            return None
        if self.expired():
            self.expire()
            return None
        self.attempts += 1
        try:
            context = self.context
            mark = -1 if context.sets_client_high_water_mark else self._high_water_mark(self.partition_id)
            if self.trace is not None:
                self.trace.attempt(self.attempts, mark)
            builder = TransactionBuilder(mark)
            executed = context.execute(builder)
            refuse_awaitable(executed, f"{type(context).__name__}.execute", "True, or builder.drop(reason),")
            if not executed:
                self._end(builder.dropped_outcome(self.partition_id))
                return None
            payload = builder.build()
            locks = len(payload.write_locks) + len(payload.read_locks) + len(payload.append_locks)
            size = len(payload.data) + APPEND_OVERHEAD_BYTES + LOCK_HASH_BYTES * locks
            if size > self._max_message_bytes:
                raise MessageTooLargeError(
                    f"transaction data of {len(payload.data)} bytes and {locks} lock(s) do not fit in a "
                    f"message of {self._max_message_bytes} bytes (client.maxMessageBytes); make it smaller",
                    size,
                    self._max_message_bytes,
                )
        except Exception as exc:
            self.fail(exc)
            return None
        except BaseException as exc:  # KeyboardInterrupt, SystemExit: end the context, then go on
            self.fail(exc)
            raise
        return payload

    def complete(self, transaction_id: int) -> None:
        """End the context: committed as ``transaction_id``."""
        self._end(Outcome(OutcomeKind.COMMITTED, self.partition_id, transaction_id))

    def _end(self, outcome: Outcome) -> None:
        """End the context with ``outcome`` (committed, dropped or already applied)."""
        if not self._end_completed(outcome):
            return
        future = self.future
        self._resolve(None if future is None else lambda: future.set_result(outcome))

    def _end_completed(self, outcome: Outcome) -> bool:
        """End the context as completed and tell it (``on_completion``); False, doing nothing,
        when it had ended already."""
        if not self._finish():
            return False
        committed = outcome.kind is OutcomeKind.COMMITTED
        if self.trace is not None:
            self.trace.committed(outcome.transaction_id if committed else None)
        try:
            self.context.on_completion(committed)
        except Exception:
            log.exception("%r: on_completion raised", self)
        return True

    @staticmethod
    def complete_all(
        committed: Sequence[tuple[Submission, int]],
        on_finished: Callable[[list[Submission]], None],
        fed_at: float = 0.0,
    ) -> tuple[float, int]:
        """End several committed submissions at once (the commits of one batch of feed entries).

        Like :meth:`complete` for each, except that their ``on_finished`` hooks are replaced by one
        call of ``on_finished`` with every submission that ended here (e.g. to release their
        concurrency slots under one lock). Every context's ``on_completion`` runs first, then
        ``on_finished``, then the futures resolve: no future resolves before every slot is free.

        Args:
            committed: (submission, committed transaction ID) pairs.
            on_finished: called once with the submissions that ended here (not with those that
                had ended already).
            fed_at: ``time.monotonic()`` when the commits were seen.

        Returns:
            ``(delay, count)``: the sum over the submissions that ended here of
            ``time.monotonic() - fed_at`` when each was resolved (seconds: the completion delay),
            and how many they were.
        """
        ended: list[tuple[Submission, Outcome]] = []
        for submission, transaction_id in committed:
            outcome = Outcome(OutcomeKind.COMMITTED, submission.partition_id, transaction_id)
            if submission._end_completed(outcome):
                ended.append((submission, outcome))
        if not ended:
            return 0.0, 0
        try:
            on_finished([submission for submission, _ in ended])
        except Exception:
            log.exception("finishing hook of %d submission(s) raised", len(ended))
        monotonic = time.monotonic
        delay = 0.0
        for submission, outcome in ended:
            future = submission.future
            if future is not None:
                future.set_result(outcome)
            delay += monotonic() - fed_at
        return delay, len(ended)

    def fail(self, exception: BaseException) -> None:
        """End the context with an exception (``execute`` raised, a server rejected the append,
        the client closed)."""
        if not self._finish():
            return
        if self.trace is not None:
            self.trace.failed(exception)
        try:
            self.context.on_exception(exception)
        except Exception:
            log.exception("%r: on_exception raised", self)
        future = self.future
        self._resolve(None if future is None else lambda: future.set_exception(exception))

    def expire(self) -> None:
        """End the context as expired: between attempts, or while its append waited for the
        partition's mount (never sent)."""
        if not self._finish():
            return
        try:
            self.context.on_expiration()
        except Exception:
            log.exception("%r: on_expiration raised", self)
        error = TransactionExpiredError(self.partition_id, self.attempts, self.timeout or 0.0)
        if self.trace is not None:
            self.trace.failed(error, "expired")
        future = self.future
        self._resolve(None if future is None else lambda: future.set_exception(error))

    def route(self, partition_id: int, epoch: int, route_serial: int) -> None:
        """Route the context again, before it runs again from its first attempt (after a refusal
        of its epoch; docs/design/splits.md "Clients across a split"): its partition, epoch and
        routing view change, the pacing of its failures starts afresh; its future, callbacks,
        attempts and concurrency slot stay."""
        self.partition_id = partition_id
        self.epoch = epoch
        self.route_serial = route_serial
        self.last_lock_target = -2
        self.repeated_lock_failures = 0
        self.lost_appends = 0

    def lock_failed(self) -> None:
        """Note a lock failure of the last attempt and tell the context."""
        self.lock_failures += 1
        try:
            self.context.on_lock_failure()
        except Exception:
            log.exception("%r: on_lock_failure raised", self)

    def applied(self) -> None:
        """Tell the context that this client applied its committed transaction."""
        if self.trace is not None:
            self.trace.applied()
        try:
            self.context.on_application()
        except Exception:
            log.exception("%r: on_application raised", self)

    def _finish(self) -> bool:
        with _FINISH_LOCK:  # one lock for all: held a moment, once per submission
            if self._finished:
                return False
            self._finished = True
        return True

    def _resolve(self, set_future: Callable[[], None] | None) -> None:
        if self._on_finished is not None:
            try:
                self._on_finished(self)
            except Exception:
                log.exception("%r: finishing hook raised", self)
        if set_future is not None:
            set_future()
