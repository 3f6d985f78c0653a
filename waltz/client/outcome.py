"""How a submitted transaction context ended without an error: the result of ``submit``.

Source: docs/design/client.md "Outcomes". A context either commits a transaction, or its
``execute`` drops it: for a reason of its own (a business rule refused the request), or because
the request was applied before (an idempotency key an earlier transaction carried). The client's
futures resolve to an :class:`Outcome` that tells the three apart; errors and expiry still raise.
"""

from __future__ import annotations

import enum
import operator
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
    """The transaction ID a read-your-writes wait was given, checked: an outcome's
    ``transaction_id`` (a committed one's own, an already-applied one's earlier transaction).

    Raises:
        TypeError: None, which is what a dropped outcome carries (the message says to check the
            outcome first), or a value that is not an integer (a ``bool``, a float, a string).
    """
    if transaction_id is None:
        raise TypeError(
            "transaction_id is None: a dropped outcome has no transaction to wait for; check it "
            "first, e.g. `if outcome.transaction_id is not None: "
            "wait_applied(outcome.partition_id, outcome.transaction_id)`"
        )
    if isinstance(transaction_id, bool):
        raise TypeError("transaction_id must be an integer, got a bool")
    try:
        return operator.index(transaction_id)  # type: ignore[arg-type]
    except TypeError:
        kind = type(transaction_id).__name__
        raise TypeError(f"transaction_id must be an integer (an outcome's), got {kind}") from None
