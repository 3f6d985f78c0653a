"""SmallBank on plain SQL: its schema, its population and its six transactions, one statement each.

What a team would write without waltz-py (docs/design/overview.md, "Why the log is the source of
truth"): the ledger example's workload as PostgreSQL transactions at READ COMMITTED, the
baseline of the SmallBank target (``benchmarks/RESULTS.md``, "The application path: targets and
where they stand"). The statements are PostgreSQL's (``%s`` parameters, ``FOR SHARE OF``); any
peer that runs SmallBank on SQL runs them from here, and keeps only its connections, its drivers
and its report.

The schema is SmallBank's: ``account(custid, name, status)``, ``savings(custid, balance)``,
``checking(custid, balance)``. An operation locks the rows it reads and changes, customer by
customer in ascending customer order, with ``SELECT ... FOR SHARE OF account [and the balances it
only reads] FOR UPDATE OF [the balances it changes]`` (the ledger example's READ and WRITE locks;
every operation takes its locks in one order, so there are no deadlocks), applies SmallBank's
rules in Python (``smallbank_rules``), writes the new balances and commits. A rule violation
(insufficient funds) rolls back: a user abort, counted as dropped. A deadlock or serialization
failure would roll back and retry (counted as retries). Balance is a read-only transaction.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import psycopg
from psycopg import IsolationLevel
from psycopg import errors as pg_errors
from psycopg.rows import TupleRow

from benchmarks.peers.common import MAX_RETRIES, TooManyRetriesError
from benchmarks.peers.smallbank_bank import Outcome
from benchmarks.peers.smallbank_rules import OPEN, State, decide
from benchmarks.peers.smallbank_workload import Op

#: The tables, in the order they are created (``savings`` and ``checking`` reference ``account``).
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
#: The opening rows: every customer's account (open), savings and checking.
_INSERT_ACCOUNT = "INSERT INTO account VALUES (%s, %s, %s)"
_INSERT_SAVINGS = "INSERT INTO savings VALUES (%s, %s)"
_INSERT_CHECKING = "INSERT INTO checking VALUES (%s, %s)"
#: The money held in all, and how many savings balances are below zero (SmallBank allows none).
_TOTALS = (
    "SELECT (SELECT sum(balance) FROM savings) + (SELECT sum(balance) FROM checking), "
    "(SELECT count(*) FROM savings WHERE balance < 0)"
)


#: Errors after which PostgreSQL rolled the transaction back and it may be retried (SQLSTATE
#: class 40: a deadlock, a serialization failure).
_ROLLED_BACK = (pg_errors.DeadlockDetected, pg_errors.SerializationFailure, pg_errors.TransactionRollback)


def create_and_open(conn: psycopg.Connection[TupleRow], opening: Sequence[tuple[int, int]]) -> None:
    """Create SmallBank's tables in an empty database and open every customer's accounts.

    Customer ``i`` gets the name ``customer-i``, an open account and the savings and checking
    balances ``opening[i]``; the tables are then analyzed. The caller commits (a connection used
    as a context manager does).

    Args:
        conn: a connection to the run's database, in a transaction.
        opening: each customer's opening ``(savings, checking)`` in cents, by customer ID.
    """
    for statement in SCHEMA:
        conn.execute(statement)
    with conn.cursor() as cur:
        cur.executemany(
            _INSERT_ACCOUNT, [(custid, f"customer-{custid}", OPEN) for custid in range(len(opening))]
        )
        cur.executemany(_INSERT_SAVINGS, list(enumerate(s for s, _ in opening)))
        cur.executemany(_INSERT_CHECKING, list(enumerate(c for _, c in opening)))
    conn.execute("ANALYZE")


def totals(conn: psycopg.Connection[TupleRow]) -> tuple[int, int]:
    """The money the customers hold in all, and the count of savings balances below zero.

    Args:
        conn: a connection to the run's database.

    Returns:
        ``(the sum of every savings and checking balance in cents, the negative savings)``.
    """
    final, negative = conn.execute(_TOTALS).fetchone() or (0, 0)
    return int(final), int(negative)


class SqlBank:
    """A worker thread's bank on one connection: each operation one transaction at READ COMMITTED.

    Implements :class:`~benchmarks.peers.smallbank_bank.Bank`.

    Args:
        conn: a connection of the bank's own (it closes it); set to READ COMMITTED here.
    """

    def __init__(self, conn: psycopg.Connection[TupleRow]) -> None:
        self.conn = conn
        self.conn.isolation_level = IsolationLevel.READ_COMMITTED
        self.cur = self.conn.cursor()

    def execute(self, op: Op) -> Outcome:
        """Run one operation as one transaction: Balance's read, or a change's locking reads, the
        rules and the new balances; deadlocks and serialization failures are retried.

        Args:
            op: the operation drawn.

        Returns:
            Its outcome: the money it moved in or out if committed, or why it was dropped.

        Raises:
            KeyError: Balance of a customer without an account.
            TooManyRetriesError: the transaction was rolled back :data:`MAX_RETRIES` times.
            psycopg.Error: any other database error (the transaction is rolled back).
        """
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
        """Close the connection (idempotent)."""
        self.conn.close()
