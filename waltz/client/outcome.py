"""How a submitted transaction context ended without an error: the result of ``submit``.

Source: docs/design/client.md "Outcomes". A context either commits a transaction, or its
``execute`` drops it: for a reason of its own (a business rule refused the request), or because
the request was applied before (an idempotency key an earlier transaction carried). The client's
futures resolve to an :class:`Outcome` that tells the three apart; errors and expiry still raise.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["Outcome", "OutcomeKind", "waited_transaction_id"]


class OutcomeKind(enum.Enum):
    """The ways a context ends without an error (docs/design/client.md "Outcomes")."""

    COMMITTED = "committed"
    """The context's transaction was committed."""
    DROPPED = "dropped"
    """``execute`` dropped the transaction (returned False): nothing was appended."""
    ALREADY_APPLIED = "already_applied"
    """``execute`` found the request applied before (an idempotency key an earlier transaction
    carried) and appended nothing."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """The result of a submitted context that ended without an error.

    True in a boolean context when, and only when, the transaction was committed.

    Attributes:
        kind: committed, dropped or already applied.
        partition_id: the partition of :attr:`transaction_id` (committed: the context's own; already
            applied: the partition of the earlier transaction); dropped: the context's partition.
        transaction_id: committed: the new transaction's ID; already applied: the ID of the earlier
            transaction that carried the request; dropped: None.
        reason: dropped: the reason the context gave (``TransactionBuilder.drop``), or None when
            ``execute`` returned False without one; already applied: None, or a reason given.
    """

    kind: OutcomeKind
    partition_id: int
    transaction_id: int | None = None
    reason: str | None = None

    def __bool__(self) -> bool:
        return self.kind is OutcomeKind.COMMITTED

    @property
    def committed(self) -> bool:
        """True when the context's transaction was committed."""
        return self.kind is OutcomeKind.COMMITTED

    @property
    def dropped(self) -> bool:
        """True when ``execute`` dropped the transaction for a reason of its own."""
        return self.kind is OutcomeKind.DROPPED

    @property
    def already_applied(self) -> bool:
        """True when the request was applied before, by :attr:`transaction_id`."""
        return self.kind is OutcomeKind.ALREADY_APPLIED


def waited_transaction_id(transaction_id: object) -> int:
    """The transaction ID a read-your-writes wait was given, checked: a committed outcome's
    ``transaction_id``.

    Raises:
        TypeError: not an ``int``; None is what an outcome that did not commit (dropped, already
            applied) carries, so the message says to check the outcome first.
    """
    if isinstance(transaction_id, int) and not isinstance(transaction_id, bool):
        return transaction_id
    if transaction_id is None:
        raise TypeError(
            "transaction_id is None: only a committed outcome has a transaction ID to wait for "
            "(a dropped or already-applied one has none); check the outcome first, e.g. "
            "`if outcome: wait_for(partition, outcome.transaction_id)`"
        )
    kind = type(transaction_id).__name__
    raise TypeError(f"transaction_id must be an int (a committed outcome's), got {kind}")
