"""Errors of the counter service; each message says what happened and what to do next."""

from __future__ import annotations

from waltz.errors import WaltzError

__all__ = [
    "CounterOverflowError",
    "CounterRequestTimeoutError",
    "CounterServiceError",
    "InsufficientCountError",
]


class CounterServiceError(WaltzError):
    """Base class of the counter service's errors."""


class InsufficientCountError(CounterServiceError):
    """A decrement would make a counter negative; nothing was appended to the log.

    Attributes:
        counter_id: the counter.
        current: its value when the decrement was refused (0 for a counter never written).
        requested: the amount the caller asked to subtract.
    """

    def __init__(self, counter_id: int, current: int, requested: int) -> None:
        super().__init__(
            f"counter {counter_id} holds {current}: cannot decrement it by {requested} (a counter never "
            f"goes negative); decrement by at most {current}, or increment it first"
        )
        self.counter_id = counter_id
        self.current = current
        self.requested = requested


class CounterOverflowError(CounterServiceError):
    """An increment would take a counter past the largest 64-bit value; nothing was appended.

    Attributes:
        counter_id: the counter.
        current: its value when the increment was refused.
        requested: the amount the caller asked to add.
    """

    def __init__(self, counter_id: int, current: int, requested: int, maximum: int) -> None:
        super().__init__(
            f"counter {counter_id} holds {current}: adding {requested} would exceed {maximum}, the "
            "largest value a counter can hold; add at most "
            f"{maximum - current}"
        )
        self.counter_id = counter_id
        self.current = current
        self.requested = requested


class CounterRequestTimeoutError(CounterServiceError, TimeoutError):
    """A change did not complete in time.

    Attributes:
        committed: True when the log committed the change (this database has not applied it yet:
            it will), False when it certainly did not commit (safe to retry), None when unknown
            (an attempt was still in flight: it may still commit; a retry then applies the change
            twice, and with other writers reading the counter cannot tell; the counter has no
            request IDs, see its README).
        transaction_id: the committed transaction's ID when ``committed`` is True.
    """

    def __init__(self, message: str, *, committed: bool | None, transaction_id: int | None = None) -> None:
        super().__init__(message)
        self.committed = committed
        self.transaction_id = transaction_id
