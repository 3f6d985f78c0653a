"""SmallBank on the ``eventsourcing`` library on PostgreSQL (127.0.0.1:5432, user postgres): the
ledger example's workload as a team would write it with event sourcing instead of waltz-py.

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

The workload, the worker processes (``--processes`` x ``--threads``, closed loop, each process
with one application and a connection pool of ``--threads``), the money check and the printed
JSON line are those of ``bench_smallbank_pg.py`` (see its docstring), from the modules it shares. Usage::

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
from benchmarks.peers.pg_server import scratch_database, server_settings
from benchmarks.peers.smallbank_bank import Backend, Bank, Outcome
from benchmarks.peers.smallbank_report import money_check, report
from benchmarks.peers.smallbank_rules import OPEN, Decision, State, decide
from benchmarks.peers.smallbank_workers import run_workers
from benchmarks.peers.smallbank_workload import Op, Options, opening_balances, options_of, parser

NAMESPACE = uuid.UUID("1b7e0c55-0d0e-4d8e-9b0a-5a3c2f1e6d47")


def customer_id(custid: int) -> uuid.UUID:
    return uuid.uuid5(NAMESPACE, f"customer-{custid}")


class Customer(Aggregate):
    """A SmallBank customer: its account's status and its two balances, in cents."""

    def __init__(self, custid: int, name: str, savings: int, checking: int) -> None:
        self.custid = custid
        self.name = name
        self.status = OPEN
        self.savings = savings
        self.checking = checking

    @staticmethod
    def create_id(custid: int) -> uuid.UUID:
        return customer_id(custid)

    @event("CheckingDeposited")
    def deposit_checking(self, amount: int) -> None:
        self.checking += amount

    @event("SavingsTransacted")
    def transact_savings(self, amount: int) -> None:
        self.savings += amount

    @event("CheckWritten")
    def write_check(self, charge: int) -> None:
        self.checking -= charge

    @event("PaymentSent")
    def send_payment(self, to_custid: int, amount: int) -> None:
        self.checking -= amount

    @event("PaymentReceived")
    def receive_payment(self, from_custid: int, amount: int) -> None:
        self.checking += amount

    @event("Amalgamated")
    def amalgamate_out(self, to_custid: int, amount: int) -> None:
        self.savings = 0
        self.checking = 0

    @event("AmalgamationReceived")
    def amalgamate_in(self, from_custid: int, amount: int) -> None:
        self.checking += amount


class SmallBank(Application[uuid.UUID]):
    """The application: saves ``Customer`` aggregates."""


def app_env(dbname: str, pool: int, accounts: int, cache: bool, create_table: bool = False) -> dict[str, str]:
    """The application's settings: PostgreSQL (``bench_eventsourcing.env_for``), the cache, and
    whether it creates its tables (the run's first application does; the worker processes' would
    race in PostgreSQL's catalog)."""
    env = env_for(dbname, pool) | {"CREATE_TABLE": "y" if create_table else "n"}
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
    """A worker thread's access: the process's application (its connection pool is shared)."""

    def __init__(self, app: SmallBank) -> None:
        self.app = app

    def _load(self, custid: int) -> Customer | None:
        try:
            customer: Customer = self.app.repository.get(customer_id(custid))
        except AggregateNotFoundError:
            return None
        return customer

    def execute(self, op: Op) -> Outcome:
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
        pass


class EventSourcedBackend:
    """A worker process's backend: one application (pool of ``threads`` connections)."""

    def __init__(self, env: dict[str, str]) -> None:
        self.app = SmallBank(env=env)

    def bank(self) -> Bank:
        return EventSourcedBank(self.app)

    def close(self) -> None:
        self.app.close()


def cached_backend(dbname: str, options: Options) -> Backend:
    """A worker process's backend with the aggregate cache (a connection per thread in its pool)."""
    return EventSourcedBackend(app_env(dbname, options.threads, options.accounts, cache=True))


def uncached_backend(dbname: str, options: Options) -> Backend:
    """A worker process's backend without the cache."""
    return EventSourcedBackend(app_env(dbname, options.threads, options.accounts, cache=False))


def run(options: Options, cache: bool = True) -> dict[str, Any]:
    """Create a database, open the customers, run the mix, check the money, drop the database;
    the result row."""
    server, durability = server_settings()
    opening = opening_balances(options)
    with scratch_database("waltz_peer_sb_es") as dbname:
        app = SmallBank(env=app_env(dbname, 2, options.accounts, cache=False, create_table=True))
        try:
            app.save(
                *[
                    Customer(custid, f"customer-{custid}", savings, checking)
                    for custid, (savings, checking) in enumerate(opening)
                ]
            )
            harvest = run_workers(cached_backend if cache else uncached_backend, dbname, options)
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
