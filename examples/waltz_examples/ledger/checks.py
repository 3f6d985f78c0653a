"""The ledger's own invariants, checked against the log and the database once a run is quiet.

The workloads check what holds for any application first (database marks, each transaction and
each member of a batched one applied exactly once, the log read back, replicas:
:mod:`waltz.workloads.checks`), with the ledger's record of its applies
(:func:`applied_transaction_ids`); then :class:`LedgerInvariants`:

- **money conserved**: savings + checking + money in flight == the sum of the ``delta`` of every
  transaction *as recorded in the log* (read back by a fresh client from the start), which also
  equals the sum recorded by the applies;
- **transfers exactly once**: once quiet, no transfer is pending; every outbox row has exactly one
  target row and their states agree (credited ↔ credited, refunded ↔ rejected);
- **rules**: no savings balance below zero; a checking balance below zero only for a customer
  whose log holds a WriteCheck overdraft or an amalgamation of a negative balance into it
  (SmallBank's rules; SendPayment and transfers never overdraw).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from sqlalchemy import ColumnExpressionArgument, Connection, Engine, func, select

from waltz.workloads.application import Check
from waltz_examples.ledger.models import (
    Checking,
    Savings,
    TransferIn,
    TransferInStatus,
    TransferOut,
    applied_transactions,
)
from waltz_examples.ledger.transfers import money_in_flight, pending_transfers

__all__ = ["LedgerInvariants", "applied_transaction_ids"]


def applied_transaction_ids(engine: Engine) -> dict[int, list[tuple[int, int]]]:
    """The ``(transaction ID, member)`` pairs the database applied, by partition
    (``ledger_applied_transactions``, one row per applied change-set; ``member`` is 0 but for the
    members of a batch after the first, docs/design/sql.md "Batched change-sets")."""
    applied: dict[int, list[tuple[int, int]]] = defaultdict(list)
    t = applied_transactions.c
    with engine.connect() as conn:
        for p, tid, member in conn.execute(select(t.partition_id, t.transaction_id, t.member)):
            applied[int(p)].append((int(tid), int(member)))
    return applied


class LedgerInvariants:
    """The ledger's invariants of the module docstring: the log's deltas and overdrafts first
    (:meth:`observe`), then the database (:meth:`checks`)."""

    def __init__(self) -> None:
        self.delta = 0
        """The sum of the ``delta`` of every change-set observed."""
        self.overdraft_customers: set[int] = set()
        """Customers whose checking a logged transaction took below zero by SmallBank's rules."""

    def observe(self, meta: Mapping[str, Any]) -> None:
        """Add a change-set's ``delta`` and the overdrafts it records."""
        self.delta += int(meta.get("delta", 0))
        if "overdraft_custid" in meta:
            self.overdraft_customers.add(int(meta["overdraft_custid"]))
        for custid in meta.get("overdraft_custids", ()):  # a batched transfer step's
            self.overdraft_customers.add(int(custid))

    def checks(self, engine: Engine) -> list[Check]:
        """Money conserved, every transfer completed exactly once, no balance below the rules."""
        with engine.connect() as conn:
            applied_delta = _total(conn, applied_transactions.c.delta)
            savings_total = _total(conn, Savings.balance)
            checking_total = _total(conn, Checking.balance)
            negative_savings = conn.execute(select(func.count()).where(Savings.balance < 0)).scalar_one()
            overdrawn = {int(c) for (c,) in conn.execute(select(Checking.custid).where(Checking.balance < 0))}
            outs = {
                (int(a), str(b)): str(s)
                for a, b, s in conn.execute(
                    select(TransferOut.to_custid, TransferOut.transfer_id, TransferOut.status)
                )
            }
            ins = {
                (int(a), str(b)): str(s)
                for a, b, s in conn.execute(
                    select(TransferIn.to_custid, TransferIn.transfer_id, TransferIn.status)
                )
            }
        in_flight = money_in_flight(engine)
        pending = pending_transfers(engine)

        balances = savings_total + checking_total
        checks = [
            Check(
                "money conserved",
                balances + in_flight == self.delta == applied_delta,
                f"balances {balances} + in flight {in_flight} = {balances + in_flight}; "
                f"log deltas {self.delta}; applied deltas {applied_delta}",
            )
        ]
        agreeing = {"credited": TransferInStatus.CREDITED.value, "refunded": TransferInStatus.REJECTED.value}
        mismatched = [k for k, s in outs.items() if ins.get(k) != agreeing.get(s)]
        orphans = [k for k in ins if k not in outs]
        checks.append(
            Check(
                "every two-step transfer completed exactly once",
                pending == 0 and not mismatched and not orphans,
                f"{len(outs)} transfers, {sum(1 for s in outs.values() if s == 'refunded')} refunded; "
                f"pending {pending}, mismatched {len(mismatched)}, orphans {len(orphans)}",
            )
        )
        unexplained = sorted(overdrawn - self.overdraft_customers)
        checks.append(
            Check(
                "no balance below what the rules allow",
                negative_savings == 0 and not unexplained,
                f"negative savings: {negative_savings}; overdrawn checking: {len(overdrawn)} "
                f"(all by WriteCheck or Amalgamate: {not unexplained})",
            )
        )
        return checks


def _total(conn: Connection, column: ColumnExpressionArgument[int]) -> int:
    """The sum of a column over its table (0 when empty)."""
    return int(conn.execute(select(func.coalesce(func.sum(column), 0))).scalar_one())
