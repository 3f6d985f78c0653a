"""The SmallBank mix (Alomari et al., ICDE 2008; as OLTPBench/BenchBase run it) and its driver.

The driver runs the mix against the instances of any SmallBank application
(:mod:`waltz.workloads.application`; docs/design/overview.md, "Workloads"), the ledger example's
by default. Customers ``0 .. accounts-1`` start with savings and checking balances drawn from
10,000..50,000 cents. Each transaction is drawn from BenchBase's mix: Amalgamate 15 %, Balance
15 %, DepositChecking 15 %, SendPayment 25 %, TransactSavings 15 %, WriteCheck 15 %, with
BenchBase's amounts (DepositChecking 1.30, TransactSavings ±20.20, WriteCheck 5.00, SendPayment
5.00, in cents). Hotspot skew as in H-Store's and DrTM's SmallBank: 90 % of transactions pick
their customers from a hotspot of the first ``hotspot_fraction`` of the customers. Amalgamate and
SendPayment between customers of different partitions become two-step transfers.

Transactions are spread round-robin over the given instances and kept ``in_flight`` at a
time; a lock failure is retried by the client, a rule violation (insufficient funds) drops the
transaction, as SmallBank's user aborts do. Where instances mount only some partitions, every
request (a Balance read too) goes to an instance mounting its customer's partition, and each
workload draws the customers of its instances' partitions; a Balance read is the instance's
``balance`` (the ledger's reads the entity cache, else the database).

Each committed log transaction the workload submitted is timed twice (HdrHistograms on
:class:`SmallBankStats`): submit -> commit (the instance's ``submit`` called to its future giving a
transaction ID) and submit -> applied (to the submitting instance's client having applied that
transaction, ``WaltzClient.when_applied``: when a read on that instance sees the write). Dropped
transactions, errors, Balance reads and the sweepers' transfer steps are counted, not timed.

Instances may change while the mix runs (a rolling deploy, :mod:`waltz.workloads.rollout`):
:meth:`SmallBankWorkload.retire` takes one out of the rotation and waits until what it was given
is resolved and applied, :meth:`SmallBankWorkload.add` puts one in.
"""

from __future__ import annotations

import functools
import math
import random
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from waltz.client.outcome import Outcome
from waltz.errors import CrossPartitionError
from waltz.perf.stats import LatencyHistogram
from waltz.workloads.application import SmallBankInstance, SmallBankOperation

__all__ = [
    "DEPOSIT_CHECKING",
    "MIX",
    "SEND_PAYMENT",
    "TRANSACT_SAVINGS",
    "WRITE_CHECK",
    "SmallBankConfig",
    "SmallBankStats",
    "SmallBankWorkload",
]

#: BenchBase's SmallBank mix, in percent.
MIX: dict[str, int] = {
    "amalgamate": 15,
    "balance": 15,
    "deposit_checking": 15,
    "send_payment": 25,
    "transact_savings": 15,
    "write_check": 15,
}
#: BenchBase's amounts, in cents.
DEPOSIT_CHECKING = 130
SEND_PAYMENT = 500
TRANSACT_SAVINGS = 2020  # added or taken, at even odds
WRITE_CHECK = 500


@dataclass(frozen=True)
class SmallBankConfig:
    """Workload parameters.

    Attributes:
        accounts: customers.
        hotspot_fraction: share of customers in the hotspot (at least 2 customers).
        hotspot_probability: share of transactions that pick hotspot customers.
        in_flight: transactions submitted and not yet resolved, at most.
        seed: the random seed (the run is reproducible up to timing).
        deactivate: customers closed half-way through (credits to them are refunded).
        submitters: threads that submit (each runs a first attempt's database reads).
        record_latency: time each committed transaction (:attr:`SmallBankStats.commit_latency`,
            :attr:`SmallBankStats.applied_latency`); off, the histograms stay empty.
        rate: draws per second (Balance reads included) this workload starts, on a fixed
            schedule; a transaction's latencies count from its scheduled start, so a schedule
            the instances cannot keep shows as latency (and ``in_flight`` still caps what is
            outstanding). None: as fast as ``in_flight`` allows.

    Raises:
        ValueError: ``rate`` is not above 0.
    """

    accounts: int = 1000
    hotspot_fraction: float = 0.1
    hotspot_probability: float = 0.9
    in_flight: int = 64
    seed: int = 7
    deactivate: int = 3
    submitters: int = 4
    record_latency: bool = True
    rate: float | None = None

    def __post_init__(self) -> None:
        if self.rate is not None and not self.rate > 0:
            raise ValueError(f"rate must be above 0 draws per second, got {self.rate}")


@dataclass
class SmallBankStats:
    """What a run did.

    Attributes:
        submitted: log transactions submitted (Balance reads are not).
        added: of those, the run's own besides the mix's draws: the account closings halfway
            through and the payments to closed accounts three quarters through.
        committed: of those, committed (their future gave a transaction ID).
        dropped: dropped by the rules (their future gave None); ``drop_reasons`` says why, with
            numbers replaced by ``N``.
        balances_read: Balance reads.
        lock_failures: attempts refused by the lock check, summed over the resolved transactions.
        errors: descriptions of the transactions and reads that failed.
        redrawn: transactions decided at a partition count a split replaced, refused
            (``CrossPartitionError``) and drawn again at the count in force.
        by_op: resolved transactions and reads per SmallBank operation.
        seconds: the run's wall-clock seconds, from its first draw to its last resolution.
        commit_latency: per committed transaction, seconds from the instance's ``submit`` to its
            future giving the transaction ID (microseconds inside).
        applied_latency: per committed transaction, seconds from the instance's ``submit`` to the
            submitting instance's client having applied it (read-your-writes on that instance);
            complete once :meth:`SmallBankWorkload.wait_applied` returned True.
    """

    submitted: int = 0
    added: int = 0
    committed: int = 0
    dropped: int = 0
    balances_read: int = 0
    lock_failures: int = 0
    errors: list[str] = field(default_factory=list)
    redrawn: int = 0
    by_op: Counter[str] = field(default_factory=Counter)
    drop_reasons: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0
    commit_latency: LatencyHistogram = field(default_factory=LatencyHistogram)
    applied_latency: LatencyHistogram = field(default_factory=LatencyHistogram)

    @property
    def transactions_per_second(self) -> float:
        """Committed log transactions per second of the run."""
        return self.committed / self.seconds if self.seconds else 0.0

    def latency_line(self) -> str:
        """Committed/s and the p50/p99 of both latencies in one line, e.g. ``committed/s 812;
        submit->commit p50 9.1 ms, p99 41.3 ms; submit->applied p50 12.0 ms, p99 55.2 ms``
        ("n/a" when nothing was timed)."""

        def ms(histogram: LatencyHistogram, percentile: float) -> str:
            value = histogram.percentile_ms(percentile)
            return "n/a" if math.isnan(value) else f"{value:,.1f} ms"

        parts = [f"committed/s {self.transactions_per_second:,.0f}"]
        for label, histogram in (
            ("submit->commit", self.commit_latency),
            ("submit->applied", self.applied_latency),
        ):
            parts.append(f"{label} p50 {ms(histogram, 50.0)}, p99 {ms(histogram, 99.0)}")
        return "; ".join(parts)


class SmallBankWorkload:
    """Runs the mix against one or more instances of an application (see the module docstring)."""

    def __init__(self, services: Sequence[SmallBankInstance], config: SmallBankConfig | None = None) -> None:
        if not services:
            raise ValueError("SmallBank needs at least one application instance")
        self.services = list(services)
        self.config = config or SmallBankConfig()
        self._random = random.Random(self.config.seed)
        self._slots = threading.BoundedSemaphore(self.config.in_flight)
        self._lock = threading.Lock()
        self._applied_changed = threading.Condition(self._lock)
        self._closed = False  # set by close(): a retire still waiting gives up
        self._applied_pending = 0  # committed transactions whose apply this workload still awaits
        # Per instance (by id): requests given to it and not yet over (resolved, and applied
        # when committed); an instance is retired once it has none.
        self._outstanding: Counter[int] = Counter()
        self._next = 0
        self.stats = SmallBankStats()
        hot = max(2, int(self.config.accounts * self.config.hotspot_fraction))
        self._hotspot = min(hot, self.config.accounts)
        self.closed: list[int] = []
        # Customers whose transactions these instances can submit: all of them, unless the
        # instances mount only some partitions (partition-routed instances).
        everyone = range(self.config.accounts)
        self._owned = [c for c in everyone if any(s.owns_customer(c) for s in self.services)]
        if not self._owned:
            raise ValueError("no customer belongs to a partition these instances mount")
        self._owned_hot = [c for c in self._owned if c < self._hotspot] or self._owned
        self._submitters = ThreadPoolExecutor(
            max_workers=self.config.submitters, thread_name_prefix="smallbank"
        )

    def close(self) -> None:
        """Stop the submitter threads (after :meth:`drain`); a :meth:`retire` still waiting (the
        run was interrupted, with requests it will never resolve) raises."""
        self._submitters.shutdown(wait=True)
        with self._applied_changed:
            self._closed = True
            self._applied_changed.notify_all()

    # --- choosing ----------------------------------------------------------------------------------

    def _customer(self) -> int:
        if self._random.random() < self.config.hotspot_probability:
            return self._random.randrange(self._hotspot)
        return self._random.randrange(self.config.accounts)

    def _own_customer(self) -> int:
        """A customer drawn like :meth:`_customer` among those the instances' partitions hold
        (the one whose partition a transaction goes to: its source)."""
        if len(self._owned) == self.config.accounts:
            return self._customer()
        if self._random.random() < self.config.hotspot_probability:
            return self._random.choice(self._owned_hot)
        return self._random.choice(self._owned)

    def _two_customers(self) -> tuple[int, int]:
        """A source the instances can submit for and a distinct target of any partition."""
        first = self._own_customer()
        second = self._customer()
        for _ in range(1000):  # bounded: the hotspot has at least 2 customers
            if second != first:
                break
            second = self._customer()
        else:
            second = (first + 1) % self.config.accounts
        return first, second

    def _service(self, custid: int | None = None) -> SmallBankInstance:
        """The next instance in turn, among those mounting ``custid``'s partition (None: any),
        with one request reserved on it: :meth:`_submit` or :meth:`_over` ends the reservation."""
        with self._lock:
            owners = self.services
            if custid is not None:
                owners = [s for s in self.services if s.owns_customer(custid)]
            self._next = (self._next + 1) % len(owners)
            service = owners[self._next]
            self._outstanding[id(service)] += 1
            return service

    def _over(self, service: SmallBankInstance) -> None:
        """One request given to ``service`` is over (the caller holds no lock)."""
        with self._applied_changed:
            self._over_locked(service)

    def _over_locked(self, service: SmallBankInstance) -> None:
        self._outstanding[id(service)] -= 1
        if self._outstanding[id(service)] <= 0:
            self._applied_changed.notify_all()

    def retire(self, service: SmallBankInstance, timeout: float = 60.0) -> None:
        """Take an instance out of the rotation, then wait until every request it was given is
        resolved and, when committed, applied by it: then it may be closed.

        Raises:
            ValueError: it is not in the rotation, or it is the last one there.
            TimeoutError: its requests are not over after ``timeout`` seconds.
            RuntimeError: the workload was closed meanwhile.
        """
        deadline = time.monotonic() + timeout
        with self._applied_changed:
            if not any(s is service for s in self.services):
                raise ValueError("the instance to retire is not in the workload's rotation")
            if len(self.services) == 1:
                raise ValueError("the workload's last instance cannot be retired: add its successor first")
            self.services = [s for s in self.services if s is not service]
            while self._outstanding[id(service)] > 0:
                if self._closed:
                    raise RuntimeError("the workload was closed while an instance was being retired")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(
                        f"{self._outstanding[id(service)]} requests of a retired instance still not "
                        f"resolved and applied after {timeout}s"
                    )
                self._applied_changed.wait(remaining)
            del self._outstanding[id(service)]

    def add(self, service: SmallBankInstance) -> None:
        """Put an instance into the rotation (it must mount the same partitions as the others)."""
        with self._lock:
            self.services = [*self.services, service]

    def _draw(self) -> str:
        pick = self._random.randrange(100)
        for name, weight in MIX.items():
            if pick < weight:
                return name
            pick -= weight
        return "balance"

    # --- running -----------------------------------------------------------------------------------

    def populate(self, progress: Callable[[int], None] | None = None, timeout: float = 120.0) -> None:
        """Open every customer's account (skips customers that exist already).

        Returns once the openings are applied to the database, not merely committed to the log,
        and every instance's client has taken them in from its feed: the mix reads balances at
        once, on any instance, and an instance whose entity cache is behind its feed would read a
        customer as absent (a Balance read is answered from the cache when it holds the rows,
        docs/design/sql.md); a failover can hold applies back for seconds.

        Raises:
            TimeoutError: the openings were not committed and applied within ``timeout`` seconds.
        """
        for custid in range(self.config.accounts):
            service = self._service(custid)
            savings = self._random.randint(10_000, 50_000)
            checking = self._random.randint(10_000, 50_000)
            self._submit(service, service.open_account(custid, f"customer-{custid}", savings, checking))
            if progress is not None:
                progress(1)
        self.drain(timeout)
        service = self.services[0]  # the instances share one database: one of them is enough
        marks = {pid: service.client.get_high_water_mark(pid) for pid in service.client.partition_ids}
        for pid, mark in marks.items():
            if mark >= 0 and not service.callbacks.wait_for(pid, mark, timeout):
                raise TimeoutError(f"partition {pid}: the accounts' openings not applied within {timeout}s")
        for instance, other in enumerate(self.services):
            for pid in other.client.mounted_partitions():  # with partition routing, its own
                mark = marks[pid]
                if mark >= 0 and not other.client.wait_applied(pid, mark, timeout):
                    raise TimeoutError(
                        f"instance {instance}, partition {pid}: the accounts' openings not taken in from "
                        f"its feed within {timeout}s"
                    )

    def run(self, transactions: int, progress: Callable[[int], None] | None = None) -> SmallBankStats:
        """Run ``transactions`` draws of the mix (Balance reads included), then wait for the rest."""
        self.stats = SmallBankStats()  # the accounts' openings are not part of the mix
        started = time.monotonic()
        halfway = transactions // 2
        late = (3 * transactions) // 4
        rate = self.config.rate
        schedule_start = time.perf_counter()
        for i in range(transactions):
            if i == halfway and self.config.deactivate:
                self._deactivate_some()
            if i == late and self.closed:
                self._pay_closed_accounts()
            scheduled = None
            if rate is not None:
                scheduled = schedule_start + i / rate
                pause = scheduled - time.perf_counter()
                if pause > 0:
                    time.sleep(pause)
            self._one(self._draw(), scheduled)
            if progress is not None:
                progress(1)
        self.drain()
        self.stats.seconds = time.monotonic() - started
        return self.stats

    def warm_up(self, draws: int, timeout: float = 60.0) -> int:
        """Run ``draws`` of the mix as fast as ``in_flight`` allows, closing no accounts, and
        wait until this instance has applied them, so that the next :meth:`run`, which counts
        from nothing, starts on a settled system.

        Returns:
            How many of them were still not applied after ``timeout`` seconds (0: settled).
        """
        for _ in range(draws):
            self._one(self._draw())
        self.drain()
        self.wait_applied(timeout)
        return self.unapplied

    def drain(self, timeout: float = 300.0) -> None:
        """Wait until every submitted transaction is resolved.

        Raises:
            TimeoutError: some are still unresolved after ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        for _ in range(self.config.in_flight):
            if not self._slots.acquire(timeout=max(0.0, deadline - time.monotonic())):
                raise TimeoutError(f"SmallBank transactions still unresolved after {timeout}s")
        for _ in range(self.config.in_flight):
            self._slots.release()

    def wait_applied(self, timeout: float = 60.0) -> bool:
        """Wait until the instances have applied every transaction this workload saw commit (so
        that :attr:`SmallBankStats.applied_latency` holds one value per committed transaction).

        Returns:
            True once they all are; False when some are not after ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        with self._applied_changed:
            while self._applied_pending:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._applied_changed.wait(remaining)
        return True

    @property
    def unapplied(self) -> int:
        """Committed transactions not yet applied by the instance that submitted them."""
        with self._lock:
            return self._applied_pending

    def _deactivate_some(self) -> None:
        # Close customers outside the hotspot so that most of the mix still finds open accounts.
        pool = [c for c in self._owned if c >= self._hotspot] or list(self._owned)
        for custid in self._random.sample(pool, min(self.config.deactivate, len(pool))):
            service = self._service(custid)
            self.closed.append(custid)
            with self._lock:
                self.stats.added += 1
            self._submit(service, service.close_account(custid))

    def _pay_closed_accounts(self) -> None:
        """Payments to the closed accounts: across partitions their credits are rejected and the
        money goes back to the payers (refunds); within a partition they are refused at once."""
        for custid in self.closed:
            for _ in range(2):
                payer = self._own_customer()
                if payer == custid:
                    continue
                service = self._service(payer)
                with self._lock:
                    self.stats.added += 1
                self._submit(service, service.send_payment(payer, custid, 100), "send_payment")

    def _one(self, name: str, scheduled: float | None = None) -> None:
        """Draw ``name`` of the mix and submit it (``scheduled``: its start on the
        ``time.perf_counter`` clock, where its latencies count from; None: when submitted)."""
        operation: SmallBankOperation
        if name == "balance":
            custid = self._own_customer()  # routed as the other requests: to an owner's instance
            reader = self._service(custid)
            try:
                reader.balance(custid)
                with self._lock:
                    self.stats.balances_read += 1
                    self.stats.by_op[name] += 1
            except KeyError as exc:
                with self._lock:
                    self.stats.errors.append(str(exc))
            finally:
                self._over(reader)
            return
        remake: Callable[[], SmallBankOperation] | None = None
        if name in ("amalgamate", "send_payment"):
            source, target = self._two_customers()
            service = self._service(source)
            if name == "amalgamate":
                remake = functools.partial(service.amalgamate, source, target)
            else:
                remake = functools.partial(service.send_payment, source, target, SEND_PAYMENT)
            operation = remake()
        else:
            custid = self._own_customer()
            service = self._service(custid)
            if name == "deposit_checking":
                operation = service.deposit_checking(custid, DEPOSIT_CHECKING)
            elif name == "transact_savings":
                amount = TRANSACT_SAVINGS if self._random.random() < 0.5 else -TRANSACT_SAVINGS
                operation = service.transact_savings(custid, amount)
            else:
                operation = service.write_check(custid, WRITE_CHECK)
        self._submit(service, operation, name, scheduled, remake)

    def _submit(
        self,
        service: SmallBankInstance,
        operation: SmallBankOperation,
        name: str | None = None,
        scheduled: float | None = None,
        remake: Callable[[], SmallBankOperation] | None = None,
    ) -> None:
        """Submit ``operation``; ``remake`` draws it again (one step or two, by the partition
        count in force) when it was decided at a count a split has replaced since: the client
        refuses it with ``CrossPartitionError`` (docs/design/splits.md "Why no update is lost")."""
        self._slots.acquire()
        stats = self.stats  # this run's (a later run starts new stats)
        with self._lock:
            stats.submitted += 1
        # submit() runs the first attempt (a database snapshot, unless the entity cache holds its
        # rows) on the calling thread: a few submitters let those reads overlap.
        self._submitters.submit(
            self._submit_now, service, operation, name or operation.op, stats, scheduled, remake
        )

    def _submit_now(
        self,
        service: SmallBankInstance,
        operation: SmallBankOperation,
        name: str,
        stats: SmallBankStats,
        scheduled: float | None = None,
        remake: Callable[[], SmallBankOperation] | None = None,
    ) -> None:
        # The latencies start at the application's submit call, or at the schedule's start time.
        started = time.perf_counter() if scheduled is None else min(scheduled, time.perf_counter())
        try:
            future = service.submit(operation)
        except Exception as exc:
            if remake is not None and isinstance(exc, CrossPartitionError):
                with self._lock:
                    stats.redrawn += 1
                self._submit_now(service, remake(), name, stats, scheduled)  # the same slot
                return
            self._slots.release()
            with self._applied_changed:
                stats.errors.append(f"{operation.op}: {exc!r}")
                self._over_locked(service)
            return
        future.add_done_callback(
            lambda f: self._resolved(f, service, operation, name, stats, started, remake)
        )

    def _resolved(
        self,
        future: Future[Outcome],
        service: SmallBankInstance,
        operation: SmallBankOperation,
        name: str,
        stats: SmallBankStats,
        started: float,
        remake: Callable[[], SmallBankOperation] | None = None,
    ) -> None:
        transaction_id: int | None = None
        exc = future.exception()
        if remake is not None and isinstance(exc, CrossPartitionError):
            # Routed again after a split and parted: drawn again at the count in force, on a
            # submitter thread (never the client's completion thread), in the same slot.
            with self._lock:
                stats.redrawn += 1
            self._submitters.submit(self._submit_now, service, remake(), name, stats, None)
            return
        try:
            with self._lock:
                stats.lock_failures += operation.lock_failures
                stats.by_op[name] += 1
                if exc is not None:
                    stats.errors.append(f"{operation.op}: {exc!r}")
                elif (transaction_id := future.result().transaction_id) is None:
                    stats.dropped += 1
                    stats.drop_reasons[re.sub(r"\d+", "N", operation.reason or "dropped")] += 1
                else:
                    stats.committed += 1
                    if self.config.record_latency:
                        stats.commit_latency.record(time.perf_counter() - started)
                        self._applied_pending += 1
                    else:
                        transaction_id = None
                if transaction_id is None:
                    self._over_locked(service)
        finally:
            self._slots.release()
        if transaction_id is not None:
            # Outside the lock: the callback runs on this thread when the client applied it already.
            try:
                service.client.when_applied(
                    operation.chosen_partition, transaction_id, lambda: self._applied(stats, started, service)
                )
            except Exception as exc:  # no such partition: never timed
                with self._applied_changed:
                    stats.errors.append(f"{operation.op}: when_applied: {exc!r}")
                    self._applied_pending -= 1
                    self._over_locked(service)
                    self._applied_changed.notify_all()

    def _applied(self, stats: SmallBankStats, started: float, service: SmallBankInstance) -> None:
        stats.applied_latency.record(time.perf_counter() - started)
        with self._applied_changed:
            self._applied_pending -= 1
            self._over_locked(service)
            if not self._applied_pending:
                self._applied_changed.notify_all()
