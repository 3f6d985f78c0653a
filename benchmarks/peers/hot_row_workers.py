"""The one-hot-row peer's load: its options, the reservation transaction on PostgreSQL, and the
worker processes that send the requests (``hot_row_pg`` runs them and reports).

A request reserves 1 to ``max_quantity`` units of a SKU drawn uniformly from ``skus`` under an
idempotency key of its own, as a request of ``waltz perf inventory`` does
(:mod:`waltz.workloads.inventory_workload`), in one PostgreSQL transaction at READ COMMITTED
(:func:`reserve`). A share ``retry_fraction`` of the requests is sent a second time under the same
key once the first answer came back, as a client whose answer was lost: the retry must come back
already applied, or refused as the first was.

Load: ``processes`` worker processes (``spawn``) x ``threads`` threads, each thread with its own
connection and its own seeded draws, one request at a time (closed loop): ``processes x threads``
requests in flight, as ``waltz perf inventory --instances P --in-flight T`` keeps ``P x T``. Each
process first sends its ``warm_up`` requests (counted nowhere but in the checks), reports ready,
and sends its share of the requests at the start event; its window runs from the start event to
its last thread's last answer (wall clock, as an instance's of ``waltz perf inventory``).
"""

from __future__ import annotations

import enum
import multiprocessing
import queue
import random
import threading
import time
import traceback
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

import psycopg

from benchmarks.peers.pg_server import Database, backend_cpu
from waltz.workloads.inventory_workload import ERROR_SAMPLES, InventoryStats
from waltz.workloads.perf.settings import InventoryPerfSettings

#: Seconds the worker processes may take to connect and send their warm-up requests.
SETUP_TIMEOUT = 120.0
#: Seconds beyond the timeout for the workers to report after the measured phase.
REPORT_GRACE = 120.0
#: Milliseconds a statement may run (a lock wait included) before PostgreSQL cancels it: an error.
STATEMENT_TIMEOUT_MS = 30_000
#: The tables: a SKU's units on hand, and one row per reservation under its idempotency key.
SCHEMA = (
    "CREATE TABLE stock (sku_id bigint PRIMARY KEY, units bigint NOT NULL)",
    "CREATE TABLE reservations (idempotency_key text PRIMARY KEY, sku_id bigint NOT NULL, "
    "quantity integer NOT NULL)",
)


#: ``waltz perf inventory``'s defaults, which the peer's follow.
_INVENTORY = InventoryPerfSettings()


@dataclass(frozen=True, slots=True)
class HotRowOptions:
    """A run of the one-hot-row peer; the defaults are ``waltz perf inventory --instances 3
    --skus 1``'s.

    Attributes:
        transactions: reservation requests in all (retries not counted), split across the
            processes, then across each process's threads (the first ones take one more).
        processes: worker processes (``waltz perf inventory --instances``).
        threads: threads per process, each with a connection and one request at a time
            (``--in-flight`` of an instance).
        skus: the hot SKUs (rows) every request draws from, uniformly.
        stock: units of each SKU on hand at the start.
        max_quantity: each request reserves 1 to this many units.
        retry_fraction: share of requests sent again under the same key, 0 to 1.
        warm_up: requests each process sends before the measured phase (they take stock).
        seed: thread ``t`` of process ``p`` draws with ``f"{seed + 1 + p}-{t}"``.
        timeout: seconds the measured phase may take; a thread sends nothing after it.

    Raises:
        ValueError: a count below its minimum, a fraction outside 0..1, a timeout not above 0.
    """

    transactions: int = _INVENTORY.transactions
    processes: int = 3
    threads: int = _INVENTORY.in_flight
    skus: int = 1
    stock: int = _INVENTORY.stock
    max_quantity: int = _INVENTORY.max_quantity
    retry_fraction: float = _INVENTORY.retry_fraction
    warm_up: int = _INVENTORY.warm_up
    seed: int = _INVENTORY.seed
    timeout: float = _INVENTORY.timeout

    def __post_init__(self) -> None:
        minimums = {
            "transactions": 0,
            "processes": 1,
            "threads": 1,
            "skus": 1,
            "stock": 0,
            "max_quantity": 1,
            "warm_up": 0,
        }
        for name, minimum in minimums.items():
            if getattr(self, name) < minimum:
                raise ValueError(f"{name} must be at least {minimum}, got {getattr(self, name)}")
        if not 0.0 <= self.retry_fraction <= 1.0:
            raise ValueError(f"retry_fraction must be within 0..1, got {self.retry_fraction}")
        if not self.timeout > 0:
            raise ValueError(f"timeout must be above 0 seconds, got {self.timeout}")

    def share(self, total: int, process: int, thread: int) -> int:
        """Thread ``thread`` of process ``process``'s part of ``total`` requests.

        Args:
            total: requests in all: :attr:`transactions`, or :attr:`warm_up` x :attr:`processes`.
            process: the process (0-based).
            thread: the thread within it (0-based).

        Returns:
            Its requests; the parts of every thread add up to ``total``.
        """
        base, extra = divmod(total, self.processes)
        mine = base + (1 if process < extra else 0)
        base, extra = divmod(mine, self.threads)
        return base + (1 if thread < extra else 0)

    def describe(self) -> str:
        """One line: processes, threads, requests, SKUs and stock, retries, seed, warm-up."""
        return (
            f"{self.processes} process(es) x {self.threads} thread(s) (a connection each, one request "
            f"in flight), {self.transactions:,} requests in all, {self.skus} SKU(s) of {self.stock:,} "
            f"units, 1-{self.max_quantity} units each, {self.retry_fraction:.0%} re-sent, seed "
            f"{self.seed}, {self.warm_up:,} warm-up requests per process"
        )

    def summary(self) -> dict[str, Any]:
        """The options as a JSON-ready dict (every attribute by name)."""
        return {name: getattr(self, name) for name in self.__slots__}


class Answer(enum.Enum):
    """How a reservation request ended (``waltz perf inventory``'s outcome kinds)."""

    COMMITTED = "committed"
    REFUSED = "refused"
    ALREADY_APPLIED = "already applied"


def connect(database: Database) -> psycopg.Connection[Any]:
    """A connection to the run's database, in autocommit mode (:func:`reserve` opens its own
    transaction), each statement bounded by :data:`STATEMENT_TIMEOUT_MS`.

    Raises:
        psycopg.OperationalError: the server refused the connection.
    """
    return psycopg.connect(
        database.dsn, autocommit=True, options=f"-c statement_timeout={STATEMENT_TIMEOUT_MS}"
    )


def reserve(conn: psycopg.Connection[Any], sku_id: int, quantity: int, key: str) -> Answer:
    """Reserve ``quantity`` units of a SKU for the request ``key``: one transaction at READ
    COMMITTED, the work of a reservation of the inventory example.

    ``BEGIN``; ``SELECT units ... FOR UPDATE`` (the SKU's row lock: every request on the SKU
    waits its turn); with units enough, ``INSERT`` the reservation under its key (``ON CONFLICT
    DO NOTHING``: a key already there is a retry, answered already applied, nothing written) and
    ``UPDATE`` the units; with too few, a retry of a request that took them is answered already
    applied, another refused; ``COMMIT``. Four or five round trips.

    Args:
        conn: a connection of :func:`connect` (autocommit; no transaction open).
        sku_id: the SKU.
        quantity: units, at least 1.
        key: the request's idempotency key.

    Returns:
        How it ended.

    Raises:
        psycopg.Error: the server failed it (rolled back), e.g. the statement timeout.
        LookupError: no such SKU.
    """
    with conn.transaction():
        row = conn.execute("SELECT units FROM stock WHERE sku_id = %s FOR UPDATE", (sku_id,)).fetchone()
        if row is None:
            raise LookupError(f"no SKU {sku_id}")
        if row[0] >= quantity:
            inserted = conn.execute(
                "INSERT INTO reservations (idempotency_key, sku_id, quantity) VALUES (%s, %s, %s) "
                "ON CONFLICT (idempotency_key) DO NOTHING",
                (key, sku_id, quantity),
            ).rowcount
            if not inserted:
                return Answer.ALREADY_APPLIED
            conn.execute("UPDATE stock SET units = units - %s WHERE sku_id = %s", (quantity, sku_id))
            return Answer.COMMITTED
        applied = conn.execute("SELECT 1 FROM reservations WHERE idempotency_key = %s", (key,)).fetchone()
        return Answer.REFUSED if applied is None else Answer.ALREADY_APPLIED


def _error(stats: InventoryStats, error: str) -> None:
    stats.errors += 1
    if len(stats.error_samples) < ERROR_SAMPLES:
        stats.error_samples.append(error)


@dataclass
class _Thread:
    """One worker thread's connection, draws and counts."""

    database: Database
    options: HotRowOptions
    draws: random.Random
    key_prefix: str
    conn: psycopg.Connection[Any] | None = None
    stats: InventoryStats = field(default_factory=InventoryStats)
    unsent: int = 0

    def send(self, requests: int, stats: InventoryStats, deadline: float, tag: str) -> None:
        """Send ``requests`` requests (and their retries) one after the other, none after
        ``deadline`` (``time.monotonic()``); counted in ``stats`` as ``waltz perf inventory``
        counts, the ones left unsent in :attr:`unsent`."""
        for n in range(requests):
            if time.monotonic() >= deadline:
                self.unsent += requests - n
                return
            sku_id = self.draws.randrange(self.options.skus)
            quantity = self.draws.randint(1, self.options.max_quantity)
            retried = self.draws.random() < self.options.retry_fraction
            key = f"{self.key_prefix}-{tag}{n}"
            stats.requests += 1
            started = time.perf_counter()
            try:
                answer = self._reserve(sku_id, quantity, key)
            except Exception as exc:
                _error(stats, f"reserve {key}: {exc!r}")
                continue
            if answer is Answer.COMMITTED:
                seconds = time.perf_counter() - started
                stats.committed += 1
                stats.commit_latency.record(seconds)
                stats.applied_latency.record(seconds)  # PostgreSQL's commit is its apply
            elif answer is Answer.REFUSED:
                stats.refused += 1
            else:
                stats.already_applied += 1
            if not retried:
                continue
            stats.retries += 1
            try:
                again = self._reserve(sku_id, quantity, key)
            except Exception as exc:
                _error(stats, f"retry {key}: {exc!r}")
                continue
            if again is Answer.COMMITTED:
                stats.retries_committed += 1
            elif again is Answer.REFUSED:
                stats.retries_refused += 1
            else:
                stats.retries_already_applied += 1

    def _reserve(self, sku_id: int, quantity: int, key: str) -> Answer:
        """:func:`reserve` on this thread's connection, opened again when the last one broke."""
        if self.conn is None or self.conn.closed:
            self.conn = connect(self.database)
        return reserve(self.conn, sku_id, quantity, key)

    def close(self) -> None:
        """Close the connection."""
        if self.conn is not None:
            with suppress(Exception):
                self.conn.close()


def _worker_process(
    database: Database, options: HotRowOptions, index: int, run: str, go: Any, results: Any, close: Any
) -> None:
    """One worker process: ``options.threads`` threads connect and send their warm-up requests;
    the process puts ``("ready", index, warm-up wire)`` (or ``("error", index, text)``) on
    ``results``, starts the measured phase at ``go`` and puts ``("result", index, wire)``:
    :meth:`InventoryStats.to_wire` plus ``started``/``ended`` (wall clock), ``cpu_seconds`` and
    ``unsent``; it keeps its connections until ``close`` (their backends' CPU is read before)."""
    threads = [
        _Thread(database, options, random.Random(f"{options.seed + 1 + index}-{t}"), f"{run}-p{index}-t{t}")
        for t in range(options.threads)
    ]
    warm = [InventoryStats() for _ in threads]
    ready = threading.Barrier(len(threads) + 1)
    start = threading.Event()
    deadline = [float("inf")]  # set before ``start``
    setup_errors: list[str] = []

    def thread_main(t: int) -> None:
        worker = threads[t]
        try:
            worker.conn = connect(database)
        except Exception as exc:
            setup_errors.append(f"thread {t}: {exc!r}")
            ready.abort()
            return
        worker.send(options.share(options.warm_up * options.processes, index, t), warm[t], float("inf"), "w")
        with suppress(threading.BrokenBarrierError):
            ready.wait(timeout=SETUP_TIMEOUT)
        if start.wait(timeout=SETUP_TIMEOUT):
            worker.send(options.share(options.transactions, index, t), worker.stats, deadline[0], "")

    running = [
        threading.Thread(target=thread_main, args=(t,), name=f"hot-row-{index}-{t}", daemon=True)
        for t in range(len(threads))
    ]
    try:
        for thread in running:
            thread.start()
        try:
            ready.wait(timeout=SETUP_TIMEOUT)
        except threading.BrokenBarrierError:
            reason = "; ".join(setup_errors[:3]) or f"the threads did not warm up within {SETUP_TIMEOUT:g} s"
            results.put(("error", index, reason))
            return
        warmed = InventoryStats()
        for stats in warm:
            warmed.add(stats)
        results.put(("ready", index, warmed.to_wire()))
        if not go.wait(timeout=SETUP_TIMEOUT):
            return
        started, cpu = time.time(), time.process_time()
        deadline[0] = time.monotonic() + options.timeout
        start.set()
        for thread in running:
            thread.join(timeout=max(0.0, deadline[0] - time.monotonic()) + REPORT_GRACE / 2)
        ended, cpu_seconds = time.time(), time.process_time() - cpu
        total = InventoryStats()
        for worker in threads:
            total.add(worker.stats)
        stuck = [thread.name for thread in running if thread.is_alive()]
        if stuck:
            _error(total, f"threads still running at the end: {', '.join(stuck)}")
        wire = total.to_wire()
        wire.update(
            started=started,
            ended=ended,
            cpu_seconds=cpu_seconds,
            unsent=sum(worker.unsent for worker in threads),
        )
        results.put(("result", index, wire))
        close.wait(timeout=REPORT_GRACE)
    except Exception:
        results.put(("error", index, traceback.format_exc()))
    finally:
        for worker in threads:
            worker.close()


@dataclass
class ProcessFigures:
    """What one worker process measured.

    Attributes:
        index: the process (0-based).
        requests: requests it was given (its share of ``transactions``).
        started / ended: wall-clock seconds (``time.time()``) of its measured phase.
        stats: its counts and latency histograms (``waltz perf inventory``'s).
        cpu_seconds: CPU seconds the process spent in the phase.
        unsent: requests its threads did not send before the timeout.
        warm_up: its warm-up's counts (their reservations are in the database).
    """

    index: int
    requests: int
    started: float
    ended: float
    stats: InventoryStats
    cpu_seconds: float
    unsent: int
    warm_up: InventoryStats

    @property
    def seconds(self) -> float:
        """Seconds of its measured phase (never below 1 µs)."""
        return max(1e-6, self.ended - self.started)

    def summary(self) -> dict[str, Any]:
        """JSON-ready: ``process``, ``requests``, ``seconds``, ``committed``,
        ``committed_per_second``, ``refused``, ``errors``, ``unsent``, ``cpu_seconds``,
        ``started`` and ``ended`` (wall clock, seconds)."""
        return {
            "process": self.index,
            "requests": self.requests,
            "seconds": round(self.seconds, 3),
            "committed": self.stats.committed,
            "committed_per_second": round(self.stats.committed / self.seconds, 1),
            "refused": self.stats.refused,
            "errors": self.stats.errors,
            "unsent": self.unsent,
            "cpu_seconds": round(self.cpu_seconds, 3),
            "started": self.started,
            "ended": self.ended,
        }


@dataclass
class Harvest:
    """The worker processes' figures, and the CPU the database's backends spent meanwhile.

    Attributes:
        processes: each process's figures, by index.
        database_cpu_seconds: CPU seconds of the run database's backends in the measured phase;
            None when the server runs on another machine.
    """

    processes: list[ProcessFigures]
    database_cpu_seconds: float | None


def _gather(results: Any, workers: list[Any], kind: str, timeout: float) -> dict[int, dict[str, Any]]:
    """One ``kind`` message from each worker process, by index.

    Raises:
        RuntimeError: a worker reported an error, ended without a message, or ``timeout`` passed.
    """
    messages: dict[int, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout
    while len(messages) < len(workers):
        try:
            what, index, payload = results.get(timeout=0.5)
        except queue.Empty:
            ended = [w.name for w in workers if w.exitcode is not None]
            if ended:
                raise RuntimeError(f"worker process(es) ended without reporting {kind}: {ended}") from None
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"worker processes silent for {timeout:g} s (waiting for {kind})"
                ) from None
            continue
        if what == "error":
            raise RuntimeError(f"worker process {index} failed: {payload}")
        messages[int(index)] = payload
    return messages


def run_workers(database: Database, options: HotRowOptions, run: str) -> Harvest:
    """Run the worker processes (``spawn``) against ``database`` (stocked) and gather their figures.

    Args:
        database: the run's database, its SKUs stocked.
        options: the run.
        run: a token of the run, in every request's key.

    Returns:
        Every process's figures, and the database's CPU.

    Raises:
        RuntimeError: a worker process failed to set up or to report in time.
    """
    context = multiprocessing.get_context("spawn")
    go, close = context.Event(), context.Event()
    results = context.Queue()
    workers = [
        context.Process(
            target=_worker_process,
            args=(database, options, index, run, go, results, close),
            name=f"hot-row-worker-{index}",
            daemon=True,
        )
        for index in range(options.processes)
    ]
    try:
        for worker in workers:
            worker.start()
        warm = _gather(results, workers, "ready", SETUP_TIMEOUT)
        before = backend_cpu(database.name, database.server)
        go.set()
        wires = _gather(results, workers, "result", options.timeout + REPORT_GRACE)
        after = backend_cpu(database.name, database.server)
    finally:
        close.set()
        for worker in workers:
            worker.join(timeout=30)
            if worker.is_alive():
                worker.kill()
                worker.join(timeout=10)
    figures = [
        ProcessFigures(
            index=index,
            requests=sum(options.share(options.transactions, index, t) for t in range(options.threads)),
            started=float(wire["started"]),
            ended=float(wire["ended"]),
            stats=InventoryStats.from_wire(wire),
            cpu_seconds=float(wire["cpu_seconds"]),
            unsent=int(wire["unsent"]),
            warm_up=InventoryStats.from_wire(warm[index]),
        )
        for index, wire in sorted(wires.items())
    ]
    spent = sum(seconds - before.get(pid, 0.0) for pid, seconds in after.items()) if after else None
    return Harvest(figures, spent)
