"""SmallBank on plain SQL: the schema, and the six transactions as PostgreSQL statements.

The schema is SmallBank's: ``account(custid, name, status)``, ``savings(custid, balance)``,
``checking(custid, balance)``. An operation locks the rows it reads and changes, customer by
customer in ascending customer order, with ``SELECT ... FOR SHARE OF account [and the balances it
only reads] FOR UPDATE OF [the balances it changes]`` (the ledger example's READ and WRITE locks;
every operation takes its locks in one order, so there are no deadlocks), applies SmallBank's
rules in Python, writes the new balances and commits. A rule violation (insufficient funds) rolls
back: a user abort, counted as dropped. A deadlock or serialization failure would roll back and
retry (counted as retries).
"""

from __future__ import annotations

from collections import Counter

import psycopg
from psycopg import IsolationLevel
from psycopg import errors as pg_errors

from benchmarks.peers.common import MAX_RETRIES, TooManyRetriesError
from benchmarks.peers.pg_server import dsn
from benchmarks.peers.smallbank_bank import Outcome
from benchmarks.peers.smallbank_rules import State, decide
from benchmarks.peers.smallbank_workload import Op

SCHEMA = (
    "CREATE TABLE account (custid integer PRIMARY KEY, name text NOT NULL, status text NOT NULL)",
    "CREATE TABLE savings (custid integer PRIMARY KEY REFERENCES account, balance bigint NOT NULL)",
    "CREATE TABLE checking (custid integer PRIMARY KEY REFERENCES account, balance bigint NOT NULL)",
)

_READ = (
    "SELECT a.status, s.balance, c.balance FROM account a "
    "JOIN savings s ON s.custid = a.custid JOIN checking c ON c.custid = a.custid WHERE a.custid = %s "
)
_SHARE_CHANGE_CHECKING = _READ + "FOR SHARE OF a FOR UPDATE OF c"
#: Each operation's locking read of each of its customers (in the operation's order): the account
#: row shared (its status is read), the balance rows read shared, those changed exclusive, as the
#: ledger example's READ and WRITE locks. An operation runs them customer after customer in
#: ascending customer order, each locking account, savings, checking rows in that order: every
#: operation takes its locks in one global order, so none waits for another in a cycle. One
#: customer per statement: its primary key is the index lookup (``= ANY(array)`` of the customers
#: makes the planner scan these small tables instead).
LOCKING_READS: dict[str, tuple[str, ...]] = {
    "deposit_checking": (_SHARE_CHANGE_CHECKING,),
    "transact_savings": (_READ + "FOR SHARE OF a FOR UPDATE OF s",),
    "write_check": (_READ + "FOR SHARE OF a, s FOR UPDATE OF c",),
    "amalgamate": (_READ + "FOR SHARE OF a FOR UPDATE OF s, c", _SHARE_CHANGE_CHECKING),
    "send_payment": (_SHARE_CHANGE_CHECKING, _SHARE_CHANGE_CHECKING),
}
_BALANCE = (
    "SELECT s.balance, c.balance FROM savings s JOIN checking c ON c.custid = s.custid WHERE s.custid = %s"
)
_UPDATE_SAVINGS = "UPDATE savings SET balance = %s WHERE custid = %s"
_UPDATE_CHECKING = "UPDATE checking SET balance = %s WHERE custid = %s"


#: Errors after which PostgreSQL rolled the transaction back and it may be retried (SQLSTATE
#: class 40: a deadlock, a serialization failure).
_ROLLED_BACK = (pg_errors.DeadlockDetected, pg_errors.SerializationFailure, pg_errors.TransactionRollback)


class PostgresBank:
    """A worker thread's connection: one transaction per operation (READ COMMITTED)."""

    def __init__(self, dbname: str) -> None:
        self.conn = psycopg.connect(dsn(dbname))
        self.conn.isolation_level = IsolationLevel.READ_COMMITTED
        self.cur = self.conn.cursor()

    def execute(self, op: Op) -> Outcome:
        try:
            if op.name == "balance":
                return self._balance(op.custids[0])
            return self._change(op)
        except BaseException:
            if not self.conn.closed:
                self.conn.rollback()
            raise

    def _balance(self, custid: int) -> Outcome:
        row = self.cur.execute(_BALANCE, (custid,)).fetchone()
        self.conn.commit()
        if row is None:
            raise KeyError(f"customer {custid} has no account")
        return Outcome(None)

    def _change(self, op: Op) -> Outcome:
        retried: list[str] = []
        for _ in range(MAX_RETRIES + 1):
            try:
                reads = LOCKING_READS[op.name]
                found: dict[int, State] = {}
                for custid, statement in sorted(zip(op.custids, reads, strict=True)):
                    found[custid] = self.cur.execute(statement, (custid,)).fetchone()
                decision = decide(op, [found[custid] for custid in op.custids])
                if decision.delta is None:
                    self.conn.rollback()
                    return Outcome(None, decision.reason, tuple(retried))
                for custid, balance in decision.savings.items():
                    self.cur.execute(_UPDATE_SAVINGS, (balance, custid))
                for custid, balance in decision.checking.items():
                    self.cur.execute(_UPDATE_CHECKING, (balance, custid))
                self.conn.commit()
                return Outcome(decision.delta, None, tuple(retried))
            except _ROLLED_BACK as exc:
                self.conn.rollback()
                retried.append(type(exc).__name__)
        raise TooManyRetriesError(f"{op}: {MAX_RETRIES} retries ({Counter(retried)})")

    def close(self) -> None:
        self.conn.close()
