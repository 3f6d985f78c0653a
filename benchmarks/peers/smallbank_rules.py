"""SmallBank's rules (those of the ledger example's ``operations.py``), applied to the customers an
operation read: which operations are dropped, and why, and the balances the others leave.

Every SmallBank peer decides with these, so that a peer's figures stand beside the ledger's
(docs/design/sql.md, "Entity transactions": the ledger's operations are entity transactions
with the same rules); run one operation at a time, two peers decide every operation alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from benchmarks.peers.smallbank_workload import Op
from waltz_examples.ledger.models import AccountStatus

#: An account's status while it takes debits and credits (``AccountStatus.OPEN``).
OPEN = AccountStatus.OPEN.value


#: A customer as an operation reads it: ``(status, savings, checking)``; None: no account.
State = tuple[str, int, int] | None


@dataclass(frozen=True, slots=True)
class Decision:
    """What the rules make of an operation.

    Attributes:
        delta: money the operation brings in (+) or takes out (−); None: dropped.
        reason: why it is dropped.
        moved: cents its events carry (the charge of a check, the amalgamated total, the amount).
        savings: new savings balances by customer.
        checking: new checking balances by customer.
    """

    delta: int | None
    reason: str | None = None
    moved: int = 0
    savings: dict[int, int] = field(default_factory=dict)
    checking: dict[int, int] = field(default_factory=dict)


def _dropped(reason: str) -> Decision:
    return Decision(None, reason)


def decide(op: Op, states: Sequence[State]) -> Decision:
    """Apply SmallBank's rules to the customers of ``op``, read in the operation's order.

    Read-only: the caller writes the new balances (or triggers the events that do).

    Args:
        op: the operation (not Balance).
        states: each of its customers as read, in ``op.custids``' order.

    Returns:
        The decision: the money moved and the new balances, or why the operation is dropped.

    Raises:
        ValueError: ``op`` is Balance or an unknown operation.
    """
    for custid, state in zip(op.custids, states, strict=True):
        if state is None:
            return _dropped(f"customer {custid} has no account")
        if state[0] != OPEN:
            return _dropped(f"customer {custid}'s account is closed")
    first = op.custids[0]
    _, savings, checking = states[0]  # type: ignore[misc]  # checked above
    if op.name == "deposit_checking":
        return Decision(op.amount, moved=op.amount, checking={first: checking + op.amount})
    if op.name == "transact_savings":
        if savings + op.amount < 0:
            return _dropped(f"customer {first}'s savings cannot cover {-op.amount}")
        return Decision(op.amount, moved=op.amount, savings={first: savings + op.amount})
    if op.name == "write_check":
        charge = op.amount + 1 if savings + checking < op.amount else op.amount
        return Decision(-charge, moved=charge, checking={first: checking - charge})
    second = op.custids[1]
    _, _, target = states[1]  # type: ignore[misc]
    if op.name == "amalgamate":
        total = savings + checking
        return Decision(0, moved=total, savings={first: 0}, checking={first: 0, second: target + total})
    if op.name == "send_payment":
        if checking < op.amount:
            return _dropped(f"customer {first} has insufficient funds for {op.amount}")
        return Decision(
            0, moved=op.amount, checking={first: checking - op.amount, second: target + op.amount}
        )
    raise ValueError(f"no rules for {op.name!r}")
