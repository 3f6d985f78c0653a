#!/usr/bin/env python
"""SmallBank straight on PostgreSQL: the ledger example's workload as a team would write it
without waltz-py (PostgreSQL at 127.0.0.1:5432, user postgres).

What it measures: committed SmallBank transactions per second and their latency (from the start
of the operation to its commit) when every operation is one PostgreSQL transaction at READ
COMMITTED. The schema is SmallBank's: ``account(custid, name, status)``, ``savings(custid,
balance)``, ``checking(custid, balance)``, in a database created for the run and dropped
afterwards. An operation locks the rows it reads and changes, customer by customer in ascending
customer order, with ``SELECT ... FOR SHARE OF account [and the balances it only reads] FOR
UPDATE OF [the balances it changes]`` (the ledger example's READ and WRITE locks; every operation
takes its locks in one order, so there are no deadlocks), applies SmallBank's rules in Python,
writes the new balances and commits (``synchronous_commit`` at the server's setting, on by
default). A rule violation (insufficient funds) rolls back: a user abort, counted as dropped. A
deadlock or serialization failure would roll back and retry (counted as retries).

The workload is the one of ``examples/waltz_examples/ledger/smallbank.py`` (the demo's): customers
``0 .. accounts-1`` opened before the measured phase with savings and checking drawn from
10,000..50,000 cents; BenchBase's mix (Amalgamate 15 %, Balance 15 %, DepositChecking 15 %,
SendPayment 25 %, TransactSavings 15 %, WriteCheck 15 %) with its amounts; 90 % of the picks from
a hotspot of the first 10 % of the customers (at least 2); the rules of ``operations.py`` (which
operations are dropped, and why). Balance is a read-only transaction, counted as a balance read,
not as committed. Amalgamate and SendPayment between two customers are one transaction (no
partitions here).

Load: ``--processes`` worker processes x ``--threads`` threads, each thread with its own
connection and its own seeded draws, closed loop; ``--transactions`` draws of the mix (Balance
included) split over the threads, after ``--warmup`` draws that are not measured; the measured
phase stops early at ``--time-limit`` seconds. Printed: one JSON line (``common.result``'s keys:
``transactions`` is the committed count, ``transactions_per_second``, ``latency_ms`` of the
committed transactions; and ``dropped``, ``balances_read`` and ``balances_read_per_second``
(Balance's read-only transactions are not in the committed figures), the draws and outcomes by
operation,
``money``: whether the balances add up to the opening balances plus the deposits minus the
withdrawals of the committed operations). Usage::

    .venv/bin/python benchmarks/peers/bench_smallbank_pg.py                  # 6,000 draws, 3 x 21
    .venv/bin/python benchmarks/peers/bench_smallbank_pg.py --transactions 20000 --threads 10
    .venv/bin/python benchmarks/peers/run_all.py --only smallbank-pg,smallbank-es

The eventsourcing variant (``bench_smallbank_es.py``) shares this module's mix, rules, worker
processes and report.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import queue
import random
import re
import threading
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import psycopg
from common import MAX_RETRIES, TooManyRetriesError, result
from psycopg import IsolationLevel
from psycopg import errors as pg_errors

from waltz.perf.stats import PERCENTILES, LatencyHistogram, RunStats
from waltz_examples.ledger.models import AccountStatus
from waltz_examples.ledger.smallbank import (  # the ledger's mix and amounts, exactly
    DEPOSIT_CHECKING,
    MIX,
    SEND_PAYMENT,
    TRANSACT_SAVINGS,
    WRITE_CHECK,
)

HOST, PORT, USER = "127.0.0.1", 5432, "postgres"
ADMIN_DSN = f"host={HOST} port={PORT} user={USER} dbname=postgres"

#: An account's status while it takes debits and credits (``AccountStatus.OPEN``).
OPEN = AccountStatus.OPEN.value

#: Seconds the worker processes may take to connect and warm up before the measured phase.
SETUP_TIMEOUT = 120.0
#: Seconds beyond the time limit for the workers to report after the measured phase.
REPORT_GRACE = 120.0
#: Draws of the second customer of a two-customer operation until it differs from the first.
MAX_SECOND_DRAWS = 10_000


@dataclass(frozen=True)
class Options:
    """One run.

    Attributes:
        transactions: measured draws of the mix (Balance included), split over the threads.
        processes: worker processes.
        threads: threads per worker process, each with its own connection (closed loop).
        accounts: customers ``0 .. accounts-1``.
        hotspot_fraction: share of the customers in the hotspot (at least 2 customers).
        hotspot_probability: share of the picks from the hotspot.
        warmup: draws before the measured phase (not measured; their money is in the check).
        seed: seeds the opening balances and every thread's draws.
        time_limit: seconds the measured phase may take; the threads stop drawing then.
    """

    transactions: int = 6000
    processes: int = 3
    threads: int = 21
    accounts: int = 200
    hotspot_fraction: float = 0.1
    hotspot_probability: float = 0.9
    warmup: int = 300
    seed: int = 7
    time_limit: float = 600.0

    def __post_init__(self) -> None:
        if self.accounts < 2 or self.processes < 1 or self.threads < 1:
            raise ValueError(f"need at least 2 accounts, 1 process and 1 thread: {self}")
        if self.transactions < 0 or self.warmup < 0 or self.time_limit <= 0:
            raise ValueError(f"transactions and warmup must be >= 0 and the time limit > 0: {self}")

    @property
    def hotspot(self) -> int:
        """Customers in the hotspot: ``0 .. hotspot-1``."""
        return min(self.accounts, max(2, int(self.accounts * self.hotspot_fraction)))

    @property
    def workers(self) -> int:
        return self.processes * self.threads

    def share(self, total: int, worker: int) -> int:
        """The draws of worker thread ``worker`` (0 .. workers-1) out of ``total``."""
        return total // self.workers + (1 if worker < total % self.workers else 0)

    def describe(self) -> str:
        """The load, one line."""
        return (
            f"SmallBank (BenchBase mix), {self.accounts} customers, "
            f"{self.hotspot_probability:.0%} of picks on a hotspot of {self.hotspot}; closed loop, "
            f"{self.processes} process(es) x {self.threads} thread(s) = {self.workers} in flight"
        )


class Op(NamedTuple):
    """One draw of the mix: the operation, its customers (in the operation's order), its amount."""

    name: str
    custids: tuple[int, ...]
    amount: int = 0


class Mix:
    """Draws operations as the ledger example's ``SmallBankWorkload`` does."""

    def __init__(self, options: Options, rng: random.Random) -> None:
        self.options = options
        self.rng = rng

    def customer(self) -> int:
        if self.rng.random() < self.options.hotspot_probability:
            return self.rng.randrange(self.options.hotspot)
        return self.rng.randrange(self.options.accounts)

    def two_customers(self) -> tuple[int, int]:
        first = self.customer()
        for _ in range(MAX_SECOND_DRAWS):
            second = self.customer()
            if second != first:
                return first, second
        return first, (first + 1) % self.options.accounts

    def name(self) -> str:
        pick = self.rng.randrange(100)
        for name, weight in MIX.items():
            if pick < weight:
                return name
            pick -= weight
        return "balance"

    def draw(self) -> Op:
        name = self.name()
        if name == "amalgamate":
            return Op(name, self.two_customers())
        if name == "send_payment":
            return Op(name, self.two_customers(), SEND_PAYMENT)
        if name == "deposit_checking":
            return Op(name, (self.customer(),), DEPOSIT_CHECKING)
        if name == "transact_savings":
            custid = self.customer()
            return Op(name, (custid,), TRANSACT_SAVINGS if self.rng.random() < 0.5 else -TRANSACT_SAVINGS)
        if name == "write_check":
            return Op(name, (self.customer(),), WRITE_CHECK)
        return Op(name, (self.customer(),))


def opening_balances(options: Options) -> list[tuple[int, int]]:
    """Every customer's opening ``(savings, checking)`` in cents, 10,000..50,000 each."""
    rng = random.Random(options.seed)
    return [(rng.randint(10_000, 50_000), rng.randint(10_000, 50_000)) for _ in range(options.accounts)]


# --- the rules (operations.py's) ------------------------------------------------------------------

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
    """Apply SmallBank's rules (those of the ledger example's ``operations.py``) to the customers
    of ``op``, read in the operation's order; read-only: the caller writes the new balances.

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


# --- what a system provides ------------------------------------------------------------------------


class Outcome(NamedTuple):
    """How an operation ended.

    Attributes:
        delta: money it brought in (+) or took out (−) if it committed; None: dropped or a read.
        reason: why it was dropped (None: committed, or a Balance read).
        retried: the cause of each retry (a deadlock, a conflict...), usually empty.
    """

    delta: int | None
    reason: str | None = None
    retried: tuple[str, ...] = ()


class Bank(Protocol):
    """One worker thread's access to the system under test."""

    def execute(self, op: Op) -> Outcome:
        """Run one operation to its end (retrying deadlocks or conflicts); raises on an error."""

    def close(self) -> None: ...


class Backend(Protocol):
    """One worker process's access: makes a :class:`Bank` per thread."""

    def bank(self) -> Bank: ...

    def close(self) -> None: ...


#: Makes a worker process's backend from the run's database name and options (a module-level
#: function: it is pickled by reference into the worker processes).
BackendFactory = Callable[[str, Options], Backend]


# --- counting --------------------------------------------------------------------------------------


@dataclass
class Tally:
    """What threads did; merged over threads and processes.

    Attributes:
        stats: committed, failed (errors), retries, the committed transactions' latencies, the span.
        draws: draws by operation (every outcome).
        committed_by_op / dropped_by_op: outcomes by operation.
        drop_reasons: why operations were dropped (numbers as ``N``).
        retry_reasons: causes of the retries.
        balances_read: Balance reads.
        deposits / withdrawals: cents the committed operations brought in / took out.
        op_latency: latency by operation, every outcome (submit to commit, rollback or read).
        time_limited: threads that stopped at the time limit.
    """

    stats: RunStats = field(default_factory=RunStats)
    draws: Counter[str] = field(default_factory=Counter)
    committed_by_op: Counter[str] = field(default_factory=Counter)
    dropped_by_op: Counter[str] = field(default_factory=Counter)
    drop_reasons: Counter[str] = field(default_factory=Counter)
    retry_reasons: Counter[str] = field(default_factory=Counter)
    balances_read: int = 0
    deposits: int = 0
    withdrawals: int = 0
    op_latency: dict[str, LatencyHistogram] = field(default_factory=dict)
    time_limited: int = 0

    @property
    def dropped(self) -> int:
        return sum(self.dropped_by_op.values())

    def record(self, op: Op, outcome: Outcome, seconds: float) -> None:
        self.draws[op.name] += 1
        self.stats.retries += len(outcome.retried)
        self.retry_reasons.update(outcome.retried)
        histogram = self.op_latency.get(op.name)
        if histogram is None:
            histogram = self.op_latency[op.name] = LatencyHistogram()
        histogram.record(seconds)
        if outcome.delta is not None:
            self.stats.committed += 1
            self.stats.latency.record(seconds)
            self.committed_by_op[op.name] += 1
            if outcome.delta > 0:
                self.deposits += outcome.delta
            else:
                self.withdrawals -= outcome.delta
        elif outcome.reason is not None:
            self.dropped_by_op[op.name] += 1
            self.drop_reasons[re.sub(r"\d+", "N", outcome.reason)] += 1
        else:
            self.balances_read += 1

    def error(self, op: Op, exc: BaseException) -> None:
        self.draws[op.name] += 1
        self.stats.failed += 1
        description = f"{op.name}: {exc!r}"
        if description not in self.stats.errors and len(self.stats.errors) < 10:
            self.stats.errors.append(description)

    def merge(self, other: Tally) -> None:
        # The span covers the tallies that ran (a thread that never started has none).
        spans = [(s.started, s.ended) for s in (self.stats, other.stats) if s.started]
        self.stats.merge(other.stats)
        if spans:
            self.stats.started = min(started for started, _ in spans)
            self.stats.ended = max(ended for _, ended in spans)
        for mine, theirs in (
            (self.draws, other.draws),
            (self.committed_by_op, other.committed_by_op),
            (self.dropped_by_op, other.dropped_by_op),
            (self.drop_reasons, other.drop_reasons),
            (self.retry_reasons, other.retry_reasons),
        ):
            mine.update(theirs)
        self.balances_read += other.balances_read
        self.deposits += other.deposits
        self.withdrawals += other.withdrawals
        self.time_limited += other.time_limited
        for name, histogram in other.op_latency.items():
            self.op_latency.setdefault(name, LatencyHistogram()).add(histogram)

    def to_wire(self) -> dict[str, Any]:
        """A picklable dict for :meth:`from_wire` in another process."""
        return {
            "stats": self.stats.to_wire(),
            "counters": {
                name: dict(getattr(self, name))
                for name in ("draws", "committed_by_op", "dropped_by_op", "drop_reasons", "retry_reasons")
            },
            "numbers": {
                name: getattr(self, name)
                for name in ("balances_read", "deposits", "withdrawals", "time_limited")
            },
            "op_latency": {name: h.encode() for name, h in self.op_latency.items()},
        }

    @classmethod
    def from_wire(cls, wire: dict[str, Any]) -> Tally:
        tally = cls(stats=RunStats.from_wire(wire["stats"]))
        for name, counts in wire["counters"].items():
            getattr(tally, name).update(counts)
        for name, value in wire["numbers"].items():
            setattr(tally, name, value)
        tally.op_latency = {name: LatencyHistogram.decode(e) for name, e in wire["op_latency"].items()}
        return tally


# --- worker processes -------------------------------------------------------------------------------


def _run_draws(bank: Bank, mix: Mix, draws: int, tally: Tally, deadline: float) -> None:
    """Run ``draws`` operations one after the other (closed loop), stopping at ``deadline``."""
    for _ in range(draws):
        if time.monotonic() >= deadline:
            tally.time_limited += 1
            return
        op = mix.draw()
        begun = time.perf_counter()
        try:
            outcome = bank.execute(op)
        except Exception as exc:
            tally.error(op, exc)
            continue
        tally.record(op, outcome, time.perf_counter() - begun)


def _worker_process(
    factory: BackendFactory, dbname: str, options: Options, index: int, go: Any, results: Any, close: Any
) -> None:
    """One worker process: ``options.threads`` threads, each with its bank. They warm up; the
    process puts ``ready`` (or the setup's error) on ``results``, runs the measured draws once
    ``go`` is set, puts its tallies (measured and warm-up) on ``results``, and closes its
    connections once ``close`` is set."""
    try:
        backend = factory(dbname, options)
    except Exception:
        results.put({"index": index, "error": traceback.format_exc()})
        return
    threads = options.threads
    banks: list[Bank] = []
    setup_errors: list[str] = []
    measured = [Tally() for _ in range(threads)]
    warmed = [Tally() for _ in range(threads)]
    local_ready = threading.Barrier(threads + 1)
    start = threading.Event()
    guard = threading.Lock()
    deadline = float("inf")  # set before ``start``

    def thread_main(i: int) -> None:
        worker = index * threads + i
        mix = Mix(options, random.Random(f"{options.seed}-{worker}"))
        bank: Bank | None = None
        try:
            bank = backend.bank()
            with guard:
                banks.append(bank)
            _run_draws(bank, mix, options.share(options.warmup, worker), warmed[i], float("inf"))
        except Exception as exc:
            with guard:
                setup_errors.append(f"thread {worker}: {exc!r}")
            bank = None
        try:
            local_ready.wait(timeout=SETUP_TIMEOUT)
        except threading.BrokenBarrierError:
            return
        if bank is None or not start.wait(timeout=SETUP_TIMEOUT):
            return
        tally = measured[i]
        tally.stats.started = tally.stats.ended = time.time()
        _run_draws(bank, mix, options.share(options.transactions, worker), tally, deadline)
        tally.stats.ended = time.time()

    workers = [
        threading.Thread(target=thread_main, args=(i,), name=f"smallbank-{index}-{i}", daemon=True)
        for i in range(threads)
    ]
    try:
        for thread in workers:
            thread.start()
        try:
            local_ready.wait(timeout=SETUP_TIMEOUT)
        except threading.BrokenBarrierError:
            setup_errors.append(f"the threads were not ready within {SETUP_TIMEOUT:g} s")
        if setup_errors:
            local_ready.abort()
            results.put({"index": index, "error": "; ".join(setup_errors[:5])})
            return
        results.put({"index": index, "ready": True})
        for _ in range(int(SETUP_TIMEOUT / 0.1)):  # until ``go``, or ``close`` (the run failed)
            if go.wait(timeout=0.1) or close.is_set():
                break
        if not go.is_set():
            return
        cpu = time.process_time()
        deadline = time.monotonic() + options.time_limit
        start.set()
        for thread in workers:
            thread.join(timeout=max(0.0, deadline - time.monotonic()) + REPORT_GRACE / 2)
        stuck = [thread.name for thread in workers if thread.is_alive()]
        total, warm = Tally(), Tally()
        for tally in measured:
            total.merge(tally)
        for tally in warmed:
            warm.merge(tally)
        total.stats.client_cpu_seconds = time.process_time() - cpu
        if stuck:
            total.stats.errors.append(f"threads still running at the end: {', '.join(stuck)}")
        results.put({"index": index, "measured": total.to_wire(), "warmup": warm.to_wire()})
        close.wait(timeout=REPORT_GRACE)
    finally:
        with guard:
            for bank in banks:
                with suppress(Exception):
                    bank.close()
        backend.close()


@dataclass
class Harvest:
    """The merged tallies of a run, and the CPU the database's backends spent in it."""

    measured: Tally
    warmup: Tally
    database_cpu_seconds: float | None


def _process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a local process (Linux ``/proc``), or None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def backend_cpu(dbname: str) -> dict[int, float]:
    """CPU seconds of each server process (backend) connected to ``dbname``, by pid: readable
    when PostgreSQL runs on this machine, empty otherwise."""
    with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()", (dbname,)
        ).fetchall()
    cpu = {int(pid): _process_cpu_seconds(int(pid)) for (pid,) in rows}
    return {pid: seconds for pid, seconds in cpu.items() if seconds is not None}


def _collect(results: Any, processes: list[Any], timeout: float) -> list[dict[str, Any]]:
    """One message from each worker process (in arrival order).

    Raises:
        RuntimeError: a worker reported an error, or ended without a message, or ``timeout``
            seconds passed.
    """
    messages: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while len(messages) < len(processes):
        try:
            message: dict[str, Any] = results.get(timeout=0.5)
        except queue.Empty:
            ended = [p.name for p in processes if p.exitcode is not None]
            if ended:
                raise RuntimeError(f"worker process(es) ended without reporting: {ended}") from None
            if time.monotonic() > deadline:
                raise RuntimeError(f"worker processes silent for {timeout:g} s") from None
            continue
        if "error" in message:
            raise RuntimeError(f"worker process {message['index']} failed: {message['error']}")
        messages.append(message)
    return messages


def run_workers(factory: BackendFactory, dbname: str, options: Options) -> Harvest:
    """Run the worker processes (``spawn``) against ``dbname``; their merged tallies.

    Raises:
        RuntimeError: a worker process failed to set up or to report.
    """
    context = multiprocessing.get_context("spawn")
    go, close = context.Event(), context.Event()
    results = context.Queue()
    processes = [
        context.Process(
            target=_worker_process,
            args=(factory, dbname, options, index, go, results, close),
            name=f"smallbank-worker-{index}",
            daemon=True,
        )
        for index in range(options.processes)
    ]
    try:
        for process in processes:
            process.start()
        _collect(results, processes, SETUP_TIMEOUT)  # every process ready
        before = backend_cpu(dbname)
        go.set()
        wires = _collect(results, processes, options.time_limit + REPORT_GRACE)
        after = backend_cpu(dbname)
    finally:
        close.set()
        for process in processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
                process.join(timeout=10)
    measured, warmup = Tally(), Tally()
    for wire in sorted(wires, key=lambda w: int(w["index"])):
        measured.merge(Tally.from_wire(wire["measured"]))
        warmup.merge(Tally.from_wire(wire["warmup"]))
    spent = sum(seconds - before.get(pid, 0.0) for pid, seconds in after.items()) if after else None
    return Harvest(measured, warmup, spent)


# --- the report ------------------------------------------------------------------------------------


def money_check(initial: int, final: int, harvest: Harvest) -> dict[str, Any]:
    """Whether the balances add up: opening balances + deposits − withdrawals of every committed
    operation (warm-up included) = the sum of the balances at the end."""
    deposits = harvest.measured.deposits + harvest.warmup.deposits
    withdrawals = harvest.measured.withdrawals + harvest.warmup.withdrawals
    expected = initial + deposits - withdrawals
    return {
        "initial": initial,
        "deposits": deposits,
        "withdrawals": withdrawals,
        "expected": expected,
        "final": final,
        "conserved": final == expected,
    }


def report(
    system: str,
    config: str,
    settings: str,
    options: Options,
    harvest: Harvest,
    money: dict[str, Any],
    **extra: Any,
) -> dict[str, Any]:
    """The result row (``common.result``'s keys and SmallBank's own)."""
    tally = harvest.measured
    stats = tally.stats
    if harvest.database_cpu_seconds is not None:
        stats.node_cpu_seconds = {"postgres": harvest.database_cpu_seconds}
    by_op: dict[str, Any] = {}
    for name in MIX:
        histogram = tally.op_latency.get(name)
        by_op[name] = {
            "draws": tally.draws[name],
            "committed": tally.committed_by_op[name],
            "dropped": tally.dropped_by_op[name],
            "latency_ms": {
                f"p{p:g}": round(histogram.percentile_ms(p), 3) if histogram else None for p in PERCENTILES
            },
        }
    draws = sum(tally.draws.values())
    row = result(
        system,
        config,
        settings,
        None,
        stats,
        committed=stats.committed,
        dropped=tally.dropped,
        balances_read=tally.balances_read,
        balances_read_per_second=round(tally.balances_read / stats.seconds, 1),
        draws=draws,
        operations_per_second=round(draws / stats.seconds, 1),
        drop_reasons=dict(tally.drop_reasons.most_common()),
        retry_reasons=dict(tally.retry_reasons.most_common()),
        by_op=by_op,
        time_limited_threads=tally.time_limited,
        warmup_draws=sum(harvest.warmup.draws.values()),
        money=money,
        money_conserved=money["conserved"],
        processes=options.processes,
        threads=options.threads,
        accounts=options.accounts,
        **extra,
    )
    row["load"] = options.describe()
    row["errors"] = row["errors"] + harvest.warmup.stats.errors[:5]
    return row


# --- PostgreSQL ------------------------------------------------------------------------------------

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


def dsn(dbname: str) -> str:
    return f"host={HOST} port={PORT} user={USER} dbname={dbname}"


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


class PostgresBackend:
    """A worker process's backend: a connection per thread."""

    def __init__(self, dbname: str) -> None:
        self.dbname = dbname

    def bank(self) -> Bank:
        return PostgresBank(self.dbname)

    def close(self) -> None:
        pass


def postgres_backend(dbname: str, options: Options) -> Backend:
    return PostgresBackend(dbname)


@contextmanager
def scratch_database(prefix: str) -> Iterator[str]:
    """A database created for the run (its name), dropped afterwards."""
    dbname = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{dbname}"')
    try:
        yield dbname
    finally:
        with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')


def server_settings() -> tuple[str, str]:
    """The server's major version (``PostgreSQL 15``) and its durability settings."""
    with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
        version = conn.info.server_version // 10000
        values = [
            f"{name}={conn.execute(f'SHOW {name}').fetchone()[0]}"  # type: ignore[index]
            for name in ("synchronous_commit", "fsync", "wal_sync_method")
        ]
    return f"PostgreSQL {version}", ", ".join(values)


def run(options: Options) -> dict[str, Any]:
    """Create a database, open the accounts, run the mix, check the money, drop the database;
    the result row."""
    server, durability = server_settings()
    opening = opening_balances(options)
    with scratch_database("waltz_peer_sb_pg") as dbname:
        with psycopg.connect(dsn(dbname)) as conn:
            for statement in SCHEMA:
                conn.execute(statement)
            with conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO account VALUES (%s, %s, %s)",
                    [(custid, f"customer-{custid}", OPEN) for custid in range(options.accounts)],
                )
                cur.executemany("INSERT INTO savings VALUES (%s, %s)", list(enumerate(s for s, _ in opening)))
                cur.executemany(
                    "INSERT INTO checking VALUES (%s, %s)", list(enumerate(c for _, c in opening))
                )
            conn.execute("ANALYZE")
        harvest = run_workers(postgres_backend, dbname, options)
        with psycopg.connect(dsn(dbname)) as conn:
            final, negative = conn.execute(
                "SELECT (SELECT sum(balance) FROM savings) + (SELECT sum(balance) FROM checking), "
                "(SELECT count(*) FROM savings WHERE balance < 0)"
            ).fetchone() or (0, 0)
    money = money_check(sum(s + c for s, c in opening), int(final), harvest)
    settings = (
        f"{durability}; one transaction per operation at READ COMMITTED, rows locked with "
        f"SELECT ... FOR SHARE/FOR UPDATE customer by customer in customer order; "
        f"psycopg {psycopg.__version__}, a connection per thread"
    )
    return report(
        "PostgreSQL (SmallBank)",
        f"1 {server} (no replication)",
        settings,
        options,
        harvest,
        money,
        negative_savings=int(negative),
    )


# --- command line ----------------------------------------------------------------------------------


def parser(description: str | None) -> argparse.ArgumentParser:
    """The options both SmallBank peers take (defaults: :class:`Options`')."""
    defaults = Options()
    arguments = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    arguments.add_argument(
        "--transactions", type=int, default=defaults.transactions, help="measured draws of the mix"
    )
    arguments.add_argument("--processes", type=int, default=defaults.processes, help="worker processes")
    arguments.add_argument(
        "--threads", type=int, default=defaults.threads, help="threads per process, each a connection"
    )
    arguments.add_argument("--accounts", type=int, default=defaults.accounts, help="customers")
    arguments.add_argument(
        "--warmup", type=int, default=defaults.warmup, help="draws before the measured phase"
    )
    arguments.add_argument("--seed", type=int, default=defaults.seed, help="seed of balances and draws")
    arguments.add_argument(
        "--time-limit", type=float, default=defaults.time_limit, help="seconds of the measured phase, at most"
    )
    return arguments


def options_of(args: argparse.Namespace) -> Options:
    return Options(
        transactions=args.transactions,
        processes=args.processes,
        threads=args.threads,
        accounts=args.accounts,
        warmup=args.warmup,
        seed=args.seed,
        time_limit=args.time_limit,
    )


def main() -> None:
    args = parser(__doc__).parse_args()
    print(json.dumps(run(options_of(args))), flush=True)


if __name__ == "__main__":
    # Run as the module ``bench_smallbank_pg`` (not ``__main__``), the name the worker processes
    # import it by.
    import bench_smallbank_pg

    bench_smallbank_pg.main()
