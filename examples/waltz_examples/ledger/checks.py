"""The ledger's invariants, checked against the database, the log and the storage replicas.

What the demo and the tests assert (issue "The counter and ledger services"):

- **applied exactly once**: per partition, the database's high-water mark equals the server's, and
  ``ledger_applied_transactions`` holds exactly the IDs 0..mark (its primary key refuses a second
  apply, so a duplicate would have failed loudly);
- **money conserved**: savings + checking + money in flight == the sum of the ``delta`` of every
  transaction *as recorded in the log* (read back by a fresh client from the start), which also
  equals the sum recorded by the applies;
- **transfers exactly once**: once quiet, no transfer is pending; every outbox row has exactly one
  target row and their states agree (credited ↔ credited, refunded ↔ rejected);
- **rules**: no savings balance below zero; a checking balance below zero only for a customer
  whose log holds a WriteCheck overdraft or an amalgamation of a negative balance into it
  (SmallBank's rules; SendPayment and transfers never overdraw);
- **replicas identical**: every storage replica of every partition holds the same records up to
  the high-water mark.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, func, select, text

from waltz import WaltzClientCallbacks
from waltz.client.reading import read_up_to
from waltz.client.transaction import Transaction
from waltz.jdbc_style import CHANGE_SET_HEADER, ChangeSet
from waltz_examples.ledger.models import (
    Checking,
    Savings,
    TransferIn,
    TransferInStatus,
    TransferOut,
    applied_transactions,
)
from waltz_examples.ledger.transfers import money_in_flight, pending_transfers

__all__ = ["Check", "LogTally", "read_log", "run_checks"]


@dataclass(frozen=True, slots=True)
class Check:
    """One invariant's result."""

    name: str
    passed: bool
    detail: str


@dataclass
class LogTally:
    """What the log says: per-partition transaction counts, the sum of deltas, ops per customer."""

    transactions: dict[int, int] = field(default_factory=dict)
    delta: int = 0
    ops: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    overdraft_customers: set[int] = field(default_factory=set)


class _Reader(WaltzClientCallbacks):
    def __init__(self, tally: LogTally) -> None:
        self.tally = tally
        self.marks: dict[int, int] = {}
        self.lock = threading.Lock()

    def get_client_high_water_mark(self, partition_id: int) -> int:
        with self.lock:
            return self.marks.get(partition_id, -1)

    def apply_transaction(self, transaction: Transaction) -> None:
        self.apply_transactions([transaction])

    def apply_transactions(self, transactions: Sequence[Transaction]) -> None:
        for t in transactions:
            meta: dict[str, Any] = {}
            if t.header == CHANGE_SET_HEADER:
                meta = dict(ChangeSet.decode(t.get_raw_data()).meta)
            with self.lock:
                self.tally.transactions[t.partition_id] = self.tally.transactions.get(t.partition_id, 0) + 1
                self.tally.delta += int(meta.get("delta", 0))
                self.tally.ops[str(meta.get("op", "?"))] += 1
                if "overdraft_custid" in meta:
                    self.tally.overdraft_customers.add(int(meta["overdraft_custid"]))
                for custid in meta.get("overdraft_custids", ()):  # a batched transfer step's
                    self.tally.overdraft_customers.add(int(custid))
                self.marks[t.partition_id] = t.transaction_id

    def uncaught_exception(self, partition_id: int, transaction_id: int, exception: BaseException) -> None:
        raise RuntimeError(f"reading the log failed at {partition_id}:{transaction_id}") from exception


def read_log(
    zookeeper: str, cluster_root: str, high_water_marks: dict[int, int], timeout: float = 300.0
) -> LogTally:
    """Read every transaction from the start with a fresh client (no database) and tally it."""
    tally = LogTally()
    read_up_to(_Reader(tally), zookeeper, cluster_root, high_water_marks, timeout=timeout)
    return tally


def run_checks(
    engine: Engine,
    *,
    cluster_name: str,
    server_marks: dict[int, int],
    tally: LogTally,
    replicas: dict[int, set[int]] | None = None,
) -> list[Check]:
    """Every invariant of the module docstring (after the workload and the sweepers are quiet)."""
    checks: list[Check] = []
    with engine.connect() as conn:
        db_marks = {
            int(p): int(m)
            for p, m in conn.execute(
                text(
                    "SELECT partition_id, high_water_mark FROM waltz_high_water_marks WHERE cluster_name = :c"
                ),
                {"c": cluster_name},
            )
        }
        applied = defaultdict(list)
        for p, t in conn.execute(
            select(applied_transactions.c.partition_id, applied_transactions.c.transaction_id)
        ):
            applied[int(p)].append(int(t))
        applied_delta = int(
            conn.execute(select(func.coalesce(func.sum(applied_transactions.c.delta), 0))).scalar_one()
        )
        savings_total = int(conn.execute(select(func.coalesce(func.sum(Savings.balance), 0))).scalar_one())
        checking_total = int(conn.execute(select(func.coalesce(func.sum(Checking.balance), 0))).scalar_one())
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

    wrong_marks = {p: (db_marks.get(p), m) for p, m in server_marks.items() if db_marks.get(p, -1) != m}
    checks.append(
        Check(
            "database marks = server high-water marks",
            not wrong_marks,
            f"server {server_marks}, database {db_marks}",
        )
    )
    not_once = {
        p: len(applied.get(p, []))
        for p, m in server_marks.items()
        if sorted(applied.get(p, [])) != list(range(m + 1))
    }
    total = sum(m + 1 for m in server_marks.values())
    checks.append(
        Check(
            "every transaction applied exactly once",
            not not_once,
            f"{total} transactions" if not not_once else f"partitions with wrong apply sets: {not_once}",
        )
    )
    log_total = sum(tally.transactions.values())
    checks.append(
        Check(
            "the log read from the start holds the same transactions",
            log_total == total,
            f"log {log_total}, applied {total}",
        )
    )
    balances = savings_total + checking_total
    checks.append(
        Check(
            "money conserved",
            balances + in_flight == tally.delta == applied_delta,
            f"balances {balances} + in flight {in_flight} = {balances + in_flight}; "
            f"log deltas {tally.delta}; applied deltas {applied_delta}",
        )
    )
    mismatched = [
        k
        for k, s in outs.items()
        if ins.get(k)
        != {"credited": TransferInStatus.CREDITED.value, "refunded": TransferInStatus.REJECTED.value}.get(s)
    ]
    orphans = [k for k in ins if k not in outs]
    checks.append(
        Check(
            "every two-step transfer completed exactly once",
            pending == 0 and not mismatched and not orphans,
            f"{len(outs)} transfers, {sum(1 for s in outs.values() if s == 'refunded')} refunded; "
            f"pending {pending}, mismatched {len(mismatched)}, orphans {len(orphans)}",
        )
    )
    unexplained = sorted(overdrawn - tally.overdraft_customers)
    checks.append(
        Check(
            "no balance below what the rules allow",
            negative_savings == 0 and not unexplained,
            f"negative savings: {negative_savings}; overdrawn checking: {len(overdrawn)} "
            f"(all by WriteCheck or Amalgamate: {not unexplained})",
        )
    )
    if replicas is not None:
        differing = {p: len(d) for p, d in replicas.items() if len(d) != 1}
        checks.append(
            Check(
                "replicas hold identical record sequences",
                not differing,
                f"{len(replicas)} partitions compared" if not differing else f"differing: {differing}",
            )
        )
    return checks
