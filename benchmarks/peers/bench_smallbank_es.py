"""SmallBank on the ``eventsourcing`` library on PostgreSQL (127.0.0.1:5432, user postgres): the
ledger example's workload as a team would write it with event sourcing instead of waltz-py
(docs/design/overview.md, "Why the log is the source of truth").

What it measures: committed SmallBank transactions per second and their latency (from the start
of the operation to its events being stored) when every customer is an event-sourced aggregate
(``Customer``: savings, checking, status) in the library's PostgreSQL event store. An operation
loads its customers from the repository, checks SmallBank's rules, triggers events (a deposit, a
savings transaction, a check, a payment sent and received, an amalgamation out and in) and saves:
the two customers of Amalgamate and SendPayment in one ``app.save(a, b)``, which the library
stores in one database transaction. The stored-events table's primary key (originator id,
version) is the optimistic concurrency check: on ``RecordConflictError`` the operation reloads
its customers and starts again (a retry). A rule violation triggers nothing: a user abort,
counted as dropped. Balance loads the customer and reads it (counted as a balance read).

The repository keeps an aggregate cache per process with fast-forward (``AGGREGATE_CACHE_MAXSIZE``,
``AGGREGATE_CACHE_FASTFORWARD``): a load reads only the events stored since the cached version,
not a customer's whole history (``--no-cache`` replays it every time, the library's default).
Every save takes the library's EXCLUSIVE lock on the stored-events table (it keeps the
notification log in commit order), so saves are serialized. PostgreSQL settings go to the
application through its environment (``bench_eventsourcing.env_for``); the database is created
for the run and dropped afterwards.

The workload, the rules, the worker processes (``--processes`` x ``--threads``, closed loop, each
process with one application and a connection pool of ``--threads``), the money check and the
printed JSON line are the shared ones of the SmallBank peers (``smallbank_*``; see
``bench_smallbank_pg``). Usage::

    .venv/bin/python -m benchmarks.peers.bench_smallbank_es                  # 6,000 draws, 3 x 21
    .venv/bin/python -m benchmarks.peers.bench_smallbank_es --no-cache --transactions 2000
    .venv/bin/python -m benchmarks.peers.run_all --only smallbank-pg,smallbank-es
"""

from __future__ import annotations

import json
import uuid
from importlib.metadata import version
from typing import Any

from eventsourcing.application import AggregateNotFoundError, Application
from eventsourcing.domain import Aggregate, event
from eventsourcing.persistence import RecordConflictError

from benchmarks.peers.bench_eventsourcing import env_for
from benchmarks.peers.common import MAX_RETRIES, TooManyRetriesError
from benchmarks.peers.pg_server import LOCAL, Database, scratch_database, server_settings
from benchmarks.peers.smallbank_bank import Backend, Bank, Outcome
from benchmarks.peers.smallbank_report import money_check, report
from benchmarks.peers.smallbank_rules import OPEN, Decision, State, decide
from benchmarks.peers.smallbank_workers import run_workers
from benchmarks.peers.smallbank_workload import Op, Options, opening_balances, options_of, parser

NAMESPACE = uuid.UUID("1b7e0c55-0d0e-4d8e-9b0a-5a3c2f1e6d47")


def customer_id(custid: int) -> uuid.UUID:
    """The aggregate ID of customer ``custid`` (a UUID 5, the same in every process).

    Args:
        custid: the customer's number.

    Returns:
        Its aggregate's ID.
    """
    return uuid.uuid5(NAMESPACE, f"customer-{custid}")


class Customer(Aggregate):
    """A SmallBank customer: its account's status and its two balances, in cents.

    Args:
        custid: the customer's number.
        name: its name.
        savings: the opening savings balance.
        checking: the opening checking balance.
    """

    def __init__(self, custid: int, name: str, savings: int, checking: int) -> None:
        self.custid = custid
        self.name = name
        self.status = OPEN
        self.savings = savings
        self.checking = checking

    @staticmethod
    def create_id(custid: int) -> uuid.UUID:
        """The aggregate's ID from its creation's arguments (the library calls it).

        Args:
            custid: the customer's number.

        Returns:
            :func:`customer_id` of it.
        """
        return customer_id(custid)

    @event("CheckingDeposited")
    def deposit_checking(self, amount: int) -> None:
        """Event ``CheckingDeposited``: ``amount`` cents into checking."""
        self.checking += amount

    @event("SavingsTransacted")
    def transact_savings(self, amount: int) -> None:
        """Event ``SavingsTransacted``: ``amount`` cents into savings (negative: out)."""
        self.savings += amount

    @event("CheckWritten")
    def write_check(self, charge: int) -> None:
        """Event ``CheckWritten``: ``charge`` cents out of checking (the amount, or one more as a penalty)."""
        self.checking -= charge

    @event("PaymentSent")
    def send_payment(self, to_custid: int, amount: int) -> None:
        """Event ``PaymentSent``: ``amount`` cents out of checking to customer ``to_custid``."""
        self.checking -= amount

    @event("PaymentReceived")
    def receive_payment(self, from_custid: int, amount: int) -> None:
        """Event ``PaymentReceived``: ``amount`` cents into checking from customer ``from_custid``."""
        self.checking += amount

    @event("Amalgamated")
    def amalgamate_out(self, to_custid: int, amount: int) -> None:
        """Event ``Amalgamated``: both balances (``amount`` cents in all) moved to customer ``to_custid``."""
        self.savings = 0
        self.checking = 0

    @event("AmalgamationReceived")
    def amalgamate_in(self, from_custid: int, amount: int) -> None:
        """Event ``AmalgamationReceived``: ``amount`` cents into checking from customer ``from_custid``."""
        self.checking += amount


class SmallBank(Application[uuid.UUID]):
    """The application: saves ``Customer`` aggregates."""


def app_env(
    database: Database, pool: int, accounts: int, cache: bool, create_table: bool = False
) -> dict[str, str]:
    """The application's settings, as its environment.

    Args:
        database: the run's database.
        pool: connections in the application's pool (4 more may overflow).
        accounts: customers (the aggregate cache's size).
        cache: keep an aggregate cache with fast-forward.
        create_table: create the library's tables (the run's first application does; the worker
            processes' would race in PostgreSQL's catalog).

    Returns:
        PostgreSQL's settings (``bench_eventsourcing.env_for``), the cache's and the tables'.
    """
    env = env_for(database.name, pool, database.server) | {"CREATE_TABLE": "y" if create_table else "n"}
    if cache:
        env |= {"AGGREGATE_CACHE_MAXSIZE": str(accounts), "AGGREGATE_CACHE_FASTFORWARD": "y"}
    return env


def _trigger(op: Op, customers: list[Customer], decision: Decision) -> None:
    """Trigger the events of an operation the rules accepted."""
    first = customers[0]
    if op.name == "deposit_checking":
        first.deposit_checking(decision.moved)
    elif op.name == "transact_savings":
        first.transact_savings(decision.moved)
    elif op.name == "write_check":
        first.write_check(decision.moved)
    elif op.name == "send_payment":
        first.send_payment(op.custids[1], decision.moved)
        customers[1].receive_payment(op.custids[0], decision.moved)
    elif op.name == "amalgamate":
        first.amalgamate_out(op.custids[1], decision.moved)
        customers[1].amalgamate_in(op.custids[0], decision.moved)
    else:
        raise ValueError(f"no events for {op.name!r}")


class EventSourcedBank:
    """A worker thread's bank: the process's application (its connection pool is shared).

    Implements :class:`~benchmarks.peers.smallbank_bank.Bank`.

    Args:
        app: the worker process's application.
    """

    def __init__(self, app: SmallBank) -> None:
        self.app = app

    def _load(self, custid: int) -> Customer | None:
        try:
            customer: Customer = self.app.repository.get(customer_id(custid))
        except AggregateNotFoundError:
            return None
        return customer

    def execute(self, op: Op) -> Outcome:
        """Run one operation: load its customers, decide, trigger its events and save them together;
        reload and start again on a conflict.

        Args:
            op: the operation drawn.

        Returns:
            Its outcome: the money it moved in or out if saved, or why it was dropped.

        Raises:
            KeyError: Balance of a customer without an account.
            RuntimeError: the events disagree with what the rules decided.
            TooManyRetriesError: the save conflicted :data:`~benchmarks.peers.common.MAX_RETRIES` times.
        """
        if op.name == "balance":
            if self._load(op.custids[0]) is None:
                raise KeyError(f"customer {op.custids[0]} has no account")
            return Outcome(None)
        retried: list[str] = []
        for _ in range(MAX_RETRIES + 1):
            loaded = [self._load(custid) for custid in op.custids]
            states: list[State] = [None if c is None else (c.status, c.savings, c.checking) for c in loaded]
            decision = decide(op, states)
            if decision.delta is None:
                return Outcome(None, decision.reason, tuple(retried))
            customers = [c for c in loaded if c is not None]
            _trigger(op, customers, decision)
            for customer in customers:  # the events must say what the rules decided
                expected = (
                    decision.savings.get(customer.custid, customer.savings),
                    decision.checking.get(customer.custid, customer.checking),
                )
                if (customer.savings, customer.checking) != expected:
                    raise RuntimeError(f"{op}: customer {customer.custid}'s events disagree with {decision}")
            try:
                self.app.save(*customers)
            except RecordConflictError:
                retried.append("RecordConflictError")
                continue
            return Outcome(decision.delta, None, tuple(retried))
        raise TooManyRetriesError(f"{op}: {MAX_RETRIES} conflicts")

    def close(self) -> None:
        """Nothing to close: the application is the backend's."""
        pass


class EventSourcedBackend:
    """A worker process's backend: one application (pool of ``threads`` connections).

    Implements :class:`~benchmarks.peers.smallbank_bank.Backend`.

    Args:
        env: the application's settings (:func:`app_env`).
    """

    def __init__(self, env: dict[str, str]) -> None:
        self.app = SmallBank(env=env)

    def bank(self) -> Bank:
        """A bank on the process's application.

        Returns:
            An :class:`EventSourcedBank`.
        """
        return EventSourcedBank(self.app)

    def close(self) -> None:
        """Close the application and its connection pool."""
        self.app.close()


def cached_backend(database: Database, options: Options) -> Backend:
    """A worker process's backend with the aggregate cache (a connection per thread in its pool).

    Args:
        database: the run's database.
        options: the run (its threads and customers).

    Returns:
        An :class:`EventSourcedBackend`.
    """
    return EventSourcedBackend(app_env(database, options.threads, options.accounts, cache=True))


def uncached_backend(database: Database, options: Options) -> Backend:
    """A worker process's backend without the cache (every load replays the customer's events).

    Args:
        database: the run's database.
        options: the run (its threads and customers).

    Returns:
        An :class:`EventSourcedBackend`.
    """
    return EventSourcedBackend(app_env(database, options.threads, options.accounts, cache=False))


def run(options: Options, cache: bool = True) -> dict[str, Any]:
    """Create a database, open the customers, run the mix, check the money, drop the database.

    Args:
        options: the run.
        cache: the worker processes keep an aggregate cache.

    Returns:
        The result row (``smallbank_report.report``'s keys, and ``negative_savings``).

    Raises:
        RuntimeError: a worker process failed.
    """
    server, durability = server_settings()
    opening = opening_balances(options)
    with scratch_database("waltz_peer_sb_es") as dbname:
        database = Database(dbname, LOCAL)
        app = SmallBank(env=app_env(database, 2, options.accounts, cache=False, create_table=True))
        try:
            app.save(
                *[
                    Customer(custid, f"customer-{custid}", savings, checking)
                    for custid, (savings, checking) in enumerate(opening)
                ]
            )
            harvest = run_workers(cached_backend if cache else uncached_backend, database, options)
            customers: list[Customer] = [
                app.repository.get(customer_id(custid)) for custid in range(options.accounts)
            ]
        finally:
            app.close()
    final = sum(c.savings + c.checking for c in customers)
    negative = len([c for c in customers if c.savings < 0])
    money = money_check(sum(s + c for s, c in opening), final, harvest)
    cache_setting = (
        f"aggregate cache with fast-forward (AGGREGATE_CACHE_MAXSIZE={options.accounts})"
        if cache
        else "no aggregate cache (every load replays the customer's events)"
    )
    settings = (
        f"{durability}; eventsourcing {version('eventsourcing')}, {cache_setting}; every save locks "
        f"the stored-events table (EXCLUSIVE); an application per process, "
        f"pool of {options.threads}+4 connections"
    )
    return report(
        "eventsourcing+PostgreSQL (SmallBank)",
        f"1 {server} (no replication)",
        settings,
        options,
        harvest,
        money,
        negative_savings=negative,
    )


def main() -> None:
    """Run from the command line (the peers' options and ``--no-cache``); print the row as one JSON line."""
    arguments = parser(__doc__)
    arguments.add_argument(
        "--no-cache", action="store_true", help="no aggregate cache: every load replays the events"
    )
    args = arguments.parse_args()
    print(json.dumps(run(options_of(args), cache=not args.no_cache)), flush=True)


if __name__ == "__main__":
    # Run as the module ``benchmarks.peers.bench_smallbank_es`` (not ``__main__``): the worker
    # processes import it by that name, and the stored events' topics name the module of their
    # classes.
    from benchmarks.peers import bench_smallbank_es  # noqa: PLW0406

    bench_smallbank_es.main()
