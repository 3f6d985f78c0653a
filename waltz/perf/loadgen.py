"""The load generator shared by ``waltz perf`` and the peer benchmarks (``benchmarks/peers``).

A run offers ``transactions`` requests to a *submitter*, a callable that starts one transaction
and calls ``done(Outcome)`` once when it ends, on any thread. Each request names a write lock
drawn uniformly from a pool (or none) and carries a payload whose first 12 bytes are a marker
and the submit time (``time.time_ns()``), so a reader can measure submit-to-read latency.

Arrival processes:

- closed loop (``rate == 0``): at most ``max_in_flight`` transactions outstanding; a new one
  starts as soon as one ends. Latency runs from the submit call to ``done``.
- Poisson (``rate > 0``): transactions arrive with exponential gaps of mean ``1/rate`` seconds
  (upstream ProducerPerf's ``--interval``, as a rate). ``max_in_flight`` still caps the
  outstanding transactions; latency runs from the *scheduled* arrival time, so time spent
  waiting behind a slow system counts (no coordinated omission).

Either way the run stops submitting at its ``timeout``: no transaction starts after it, and none
whose scheduled arrival lies past it. Those it never started are reported as not submitted, not
as failed (docs/benchmarks.md "`waltz perf producer` and `waltz perf consumer`").
"""

from __future__ import annotations

import functools
import queue
import random
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from waltz.perf.stats import RunStats

__all__ = ["PAYLOAD_MARKER", "LoadSpec", "Outcome", "Request", "Submitter", "payload_submit_time", "run_load"]

#: The first four bytes of a generated payload of at least 12 bytes.
PAYLOAD_MARKER = b"WPRF"
_STAMP = struct.Struct(">4sq")


@dataclass(frozen=True, slots=True)
class LoadSpec:
    """What one load generator offers.

    Attributes:
        transactions: transactions to run (at least 0).
        payload_size: payload bytes per transaction.
        lock_pool_size: write locks are drawn uniformly from ``0 .. lock_pool_size - 1``; 0 means
            no lock (upstream ProducerPerf's ``--lock-pool-size``).
        max_in_flight: transactions outstanding at most (closed loop: exactly this many).
        rate: Poisson arrivals at this mean rate in transactions/s; 0 means closed loop.
        timeout: seconds the whole run may take: no transaction is submitted after it (nor one
            scheduled to arrive after it), and those submitted but not ended by then count as
            failed.
        seed: seed of the lock and arrival draws (None: random).
    """

    transactions: int
    payload_size: int = 200
    lock_pool_size: int = 1000
    max_in_flight: int = 100
    rate: float = 0.0
    timeout: float = 600.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.transactions < 0 or self.payload_size < 0 or self.lock_pool_size < 0:
            raise ValueError(f"transactions, payload size and lock pool size must be >= 0: {self}")
        if self.max_in_flight < 1:
            raise ValueError(f"max_in_flight must be at least 1, got {self.max_in_flight}")
        if self.rate < 0 or self.timeout <= 0:
            raise ValueError(f"rate must be >= 0 and timeout > 0: {self}")

    def describe(self) -> str:
        """One line: payload, locks, arrival process."""
        locks = f"1 write lock of {self.lock_pool_size:,}" if self.lock_pool_size else "no lock"
        arrival = (
            f"Poisson {self.rate:,.0f}/s (at most {self.max_in_flight:,} in flight)"
            if self.rate
            else f"closed loop, {self.max_in_flight:,} in flight"
        )
        return f"{self.payload_size} B payload, {locks}, {arrival}"


@dataclass(slots=True)
class Request:
    """One transaction to run: its index in the run, its write lock (None: no lock), its payload.

    Not frozen: a frozen dataclass costs more to make, and the generator makes one per transaction.
    """

    index: int
    lock_id: int | None
    payload: bytes


class Outcome(NamedTuple):
    """How a transaction ended: attempts beyond the first, and the error (None: committed)."""

    retries: int = 0
    error: BaseException | None = None


#: Starts one transaction; must call the callback exactly once when it ends (on any thread).
Submitter = Callable[[Request, Callable[[Outcome], None]], None]


def make_payload(size: int) -> bytes:
    """A payload of ``size`` bytes: marker and submit time (when it fits), then ``x`` bytes."""
    if size < _STAMP.size:
        return b"x" * size
    return _STAMP.pack(PAYLOAD_MARKER, time.time_ns()) + _filler(size - _STAMP.size)


@functools.lru_cache(maxsize=16)
def _filler(size: int) -> bytes:
    return b"x" * size


def payload_submit_time(payload: bytes) -> float | None:
    """The submit time (``time.time()`` seconds) stamped in a generated payload, or None."""
    if len(payload) < _STAMP.size:
        return None
    marker, stamp = _STAMP.unpack_from(payload)
    return stamp / 1e9 if marker == PAYLOAD_MARKER else None


def run_load(submit: Submitter, spec: LoadSpec) -> RunStats:
    """Offer ``spec.transactions`` transactions to ``submit`` and measure them.

    The generator runs on the calling thread; the completions come on the submitter's threads. It
    keeps its own cost per transaction low (about 4 µs here), since it shares the client's process
    and, in CPython, its interpreter lock: the in-flight slots are tokens in a ``SimpleQueue`` and
    the latencies go to a list, folded into the histogram once the run is over.

    Args:
        submit: starts a transaction and calls back once it ended (see :data:`Submitter`); an
            exception it raises counts the transaction as failed.
        spec: the load.

    Returns:
        The run's stats: submitted, committed and failed counts (committed + failed ==
        submitted), the transactions not submitted because ``spec.timeout`` seconds passed
        first (``not_submitted``), retries, payload bytes of the committed transactions, the
        measured phase's wall-clock start and end, and the latency histogram (committed
        transactions only). Submitted transactions still outstanding after ``spec.timeout``
        seconds count as failed (and are reported in ``errors``).
    """
    stats = RunStats()
    rng = random.Random(spec.seed)
    slots: queue.SimpleQueue[None] = queue.SimpleQueue()  # one token per transaction that may start
    for _ in range(spec.max_in_flight):
        slots.put(None)
    lock = threading.Lock()
    all_done = threading.Condition(lock)
    latencies: list[float] = []  # seconds, committed transactions only
    outstanding = 0
    closed = False
    size = spec.payload_size

    def finish(begun: float, outcome: Outcome) -> None:
        nonlocal outstanding
        now = time.perf_counter()
        with lock:
            if closed:
                return  # ended after the timeout: already counted as failed
            stats.retries += outcome.retries
            if outcome.error is None:
                stats.committed += 1
                stats.payload_bytes += size
                latencies.append(now - begun)
            else:
                stats.failed += 1
                text = f"{type(outcome.error).__name__}: {outcome.error}"
                if len(stats.errors) < 10 and text not in stats.errors:
                    stats.errors.append(text)
            outstanding -= 1
            stats.ended = time.time()
            if outstanding == 0:
                all_done.notify_all()
        slots.put(None)

    stats.started = stats.ended = time.time()
    start = time.perf_counter()
    deadline = start + spec.timeout
    arrival = start
    perf_counter = time.perf_counter
    randrange = rng.randrange
    pool = spec.lock_pool_size
    for index in range(spec.transactions):
        lock_id = randrange(pool) if pool else None
        if spec.rate:
            arrival += rng.expovariate(spec.rate)
            if arrival >= deadline:
                break  # scheduled after the timeout: neither it nor a later one is submitted
            delay = arrival - perf_counter()
            if delay > 0:
                time.sleep(delay)
        try:
            slots.get(timeout=max(0.0, deadline - perf_counter()))
        except queue.Empty:
            break
        if perf_counter() >= deadline:
            slots.put(None)
            break
        begun = arrival if spec.rate else perf_counter()
        request = Request(index, lock_id, make_payload(size))
        with lock:
            outstanding += 1
            stats.submitted += 1
        token = [True]  # list.pop is atomic: only the first call of done() gets it

        def done(outcome: Outcome, begun: float = begun, token: list[bool] = token) -> None:
            try:
                token.pop()
            except IndexError:
                return  # a submitter that calls back twice must not count twice
            finish(begun, outcome)

        try:
            submit(request, done)
        except Exception as exc:
            done(Outcome(0, exc))
    with lock:
        while outstanding and all_done.wait(max(0.0, deadline - time.perf_counter())):
            pass
        if outstanding:
            stats.failed += outstanding
            stats.errors.append(f"{outstanding} transaction(s) not ended after the {spec.timeout:g}s timeout")
        stats.not_submitted = spec.transactions - stats.submitted
        closed = True
    stats.latency.record_all(latencies)
    return stats
