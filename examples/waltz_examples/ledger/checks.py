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
  (SmallBank's rules; SendPayment and transfers never overdraw);
- **each row as the log last wrote it**: the row changes of that read, replayed as the rebuild
  replays them (the last write per key wins, a delete removes the row; docs/design/splits.md
  "Spark across a split"), give every account's status, every savings and checking balance and
  every transfer row; the database holds exactly those rows with those values. The sums above
  agree when money moved between two customers behind the log, or a transfer is there twice or
  lost with its balances moved to match; this check names the rows.

The replay keeps one small tuple per row of those tables (a row's key, the partition that last
wrote it and the values compared), as many as the database holds, and reads the database's rows
in pages of :data:`PAGE_ROWS`.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnExpressionArgument, Connection, Engine, func, select

from waltz.jdbc_style import ChangeSet, Operation
from waltz.workloads.application import Check
from waltz_examples.ledger.models import (
    Account,
    Checking,
    Savings,
    TransferIn,
    TransferInStatus,
    TransferOut,
    applied_transactions,
    registry,
)
from waltz_examples.ledger.transfers import money_in_flight, pending_transfers

__all__ = ["PAGE_ROWS", "ROWS_CHECK", "LedgerInvariants", "applied_transaction_ids"]

#: The name of the check that the database holds each row as the log last wrote it.
ROWS_CHECK = "the database holds each row as the log last wrote it"
#: Rows fetched at a time while the database's rows are compared with the log's.
PAGE_ROWS = 1000
#: Rows named in the check's detail, at most.
NAMED_ROWS = 8


@dataclass(frozen=True, slots=True)
class _Folded:
    """A table the log's replay is compared with: its model, its key attributes and the
    attributes compared (each attribute is the column of the same name)."""

    model: type[Any]
    key: tuple[str, ...]
    values: tuple[str, ...]

    @property
    def table(self) -> str:
        return str(self.model.__tablename__)


#: The tables replayed, in the order they are compared. An account's holder is not compared: its
#: column is ``name`` on the earlier releases' databases (``releases.py``).
_FOLDED = (
    _Folded(Account, ("custid",), ("status",)),
    _Folded(Savings, ("custid",), ("balance",)),
    _Folded(Checking, ("custid",), ("balance",)),
    _Folded(TransferOut, ("from_custid", "transfer_id"), ("to_custid", "amount", "kind", "status")),
    _Folded(TransferIn, ("to_custid", "transfer_id"), ("from_custid", "amount", "status")),
)


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
        entities = registry()
        self._chains = entities.schema_chains()
        self._folded = {entities.info(f.model).name: f for f in _FOLDED}
        self._rows: dict[str, dict[tuple[Any, ...], tuple[int, tuple[Any, ...] | None]]] = {
            f.table: {} for f in _FOLDED
        }
        self._keys: set[str] = set()
        self.change_sets = 0
        """The change-sets replayed (:meth:`observe_change_set`)."""

    def observe(self, meta: Mapping[str, Any]) -> None:
        """Add a change-set's ``delta`` and the overdrafts it records."""
        self.delta += int(meta.get("delta", 0))
        if "overdraft_custid" in meta:
            self.overdraft_customers.add(int(meta["overdraft_custid"]))
        for custid in meta.get("overdraft_custids", ()):  # a batched transfer step's
            self.overdraft_customers.add(int(custid))

    def observe_change_set(self, partition_id: int, transaction_id: int, change_set: ChangeSet) -> None:
        """Replay one change-set of the log into the rows it leaves: each row change of the
        ledger's tables, upcast to the current models, replaces the row's last write (a delete
        leaves none), as the live apply does (docs/design/sql.md "Change-sets").

        A row last written by a higher partition keeps that write: a split's new partition
        writes a customer's rows after its parent did, as the rebuild orders them
        (docs/design/splits.md "Spark across a split"). A change-set whose idempotency key an
        earlier one carried changes nothing, as the live apply skips it (docs/design/sql.md
        "Idempotency keys"); the ledger's carry none.

        Args:
            partition_id: the partition of its log transaction.
            transaction_id: that transaction's ID (the calls come in its order per partition).
            change_set: the decoded change-set.

        Raises:
            SchemaVersionAheadError: a row change of a newer schema version than the ledger's
                models.
            UpcastError: an upcaster failed.
        """
        del transaction_id  # the order is the calls' within a partition
        key = change_set.idempotency_key
        if key is not None:
            if key in self._keys:
                return
            self._keys.add(key)
        self.change_sets += 1
        for change in self._chains.upcast(change_set).changes:
            folded = self._folded.get(change.entity)
            if folded is None:
                continue
            rows = self._rows[folded.table]
            row_key = tuple(_compact(change.key[a]) for a in folded.key)
            last = rows.get(row_key)
            if last is not None and last[0] > partition_id:
                continue
            image = (
                None
                if change.operation is Operation.DELETE
                else tuple(_compact(change.values.get(a)) for a in folded.values)
            )
            rows[row_key] = (partition_id, image)

    def checks(self, engine: Engine) -> list[Check]:
        """Money conserved, every transfer completed exactly once, no balance below the rules,
        and each row of the ledger's tables as the log last wrote it (the module docstring)."""
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
        checks.append(self._rows_check(engine))
        return checks

    def _rows_check(self, engine: Engine) -> Check:
        """The database's rows of every replayed table against the log's last writes, each
        table read in its key's order; the detail names the first rows that differ."""
        named: list[str] = []
        differing = compared = 0
        with engine.connect() as conn:
            for folded in _FOLDED:
                remaining = dict(self._rows[folded.table])
                columns = [getattr(folded.model, a) for a in (*folded.key, *folded.values)]
                query = select(*columns).order_by(*columns[: len(folded.key)])
                width = len(folded.key)
                result = conn.execution_options(yield_per=PAGE_ROWS).execute(query)
                for row in result:
                    compared += 1
                    row_key = tuple(row[:width])
                    found = tuple(row[width:])
                    last = remaining.pop(row_key, None)
                    logged = None if last is None else last[1]
                    if logged == found:
                        continue
                    differing += 1
                    if len(named) < NAMED_ROWS:
                        named.append(_difference(folded, row_key, found, logged))
                missing = sorted(k for k, (_, image) in remaining.items() if image is not None)
                differing += len(missing)
                for row_key in missing[: max(0, NAMED_ROWS - len(named))]:
                    named.append(f"{_name(folded, row_key)}: not in the database, written by the log")
        tables = ", ".join(f.table for f in _FOLDED)
        return Check(
            ROWS_CHECK,
            differing == 0,
            f"{compared} rows of {tables} as {self.change_sets} change-sets left them"
            if differing == 0
            else f"{differing} rows differ from the log's last write"
            + (f" (the first {len(named)})" if differing > len(named) else "")
            + ": "
            + "; ".join(named),
        )


def _total(conn: Connection, column: ColumnExpressionArgument[int]) -> int:
    """The sum of a column over its table (0 when empty)."""
    return int(conn.execute(select(func.coalesce(func.sum(column), 0))).scalar_one())


def _compact(value: Any) -> Any:
    """A logged value as it is kept: a string once for all its rows (a status, a kind)."""
    return sys.intern(value) if isinstance(value, str) else value


def _name(folded: _Folded, key: tuple[Any, ...]) -> str:
    """A row by its table and key: ``ledger_transfers_out from_custid=7 transfer_id='ab'``."""
    return f"{folded.table} " + " ".join(f"{a}={v!r}" for a, v in zip(folded.key, key, strict=True))


def _difference(
    folded: _Folded, key: tuple[Any, ...], found: tuple[Any, ...], logged: tuple[Any, ...] | None
) -> str:
    """What differs in one row the database holds: the log wrote none, or other values."""
    if logged is None:
        return f"{_name(folded, key)}: in the database, not in the log"
    changed = [
        f"{a} {d!r} in the database, {g!r} by the log"
        for a, d, g in zip(folded.values, found, logged, strict=True)
        if d != g
    ]
    return f"{_name(folded, key)}: " + ", ".join(changed)
