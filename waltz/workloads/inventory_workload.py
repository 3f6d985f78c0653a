"""The inventory workload: reservations of a few hot SKUs, each under an idempotency key, some retried.

The driver of ``waltz perf inventory`` (:mod:`waltz.workloads.inventory` describes the application's
interface; docs/design/overview.md, "Workloads"). Each request reserves 1 to ``max_quantity`` units
of a SKU drawn uniformly from ``skus`` (every SKU is hot: all requests contend on them), or from
``sku_ids`` (a partition-routed instance's own), under a key of its own. A share ``retry_fraction``
of the requests is sent a second time with the same key once the first answer came back, as a client
whose answer was lost retries: the retry must come back ``ALREADY_APPLIED`` (or, when it raced the
first copy's apply, commit a copy whose apply changes nothing; the checks count the reservations),
or be refused as the first was.

Requests are kept ``in_flight`` at a time (retries besides). Each request that committed first is
timed twice (HdrHistograms): submit -> commit (the submit future gives the transaction ID) and
submit -> applied (the instance's own client applied it: read-your-writes). Refusals, already
applied answers and errors are counted.
"""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from waltz.client.outcome import Outcome, OutcomeKind
from waltz.perf.stats import LatencyHistogram
from waltz.workloads.inventory import InventoryInstance, InventoryOperation

__all__ = ["InventoryConfig", "InventoryStats", "InventoryWorkload"]

#: Error descriptions kept in :attr:`InventoryStats.errors`.
ERROR_SAMPLES = 10


@dataclass(frozen=True, slots=True)
class InventoryConfig:
    """Workload parameters.

    Attributes:
        skus: SKUs ``0 .. skus-1`` the requests draw from, uniformly (unless ``sku_ids``).
        max_quantity: each request reserves 1 to this many units.
        retry_fraction: share of requests sent again with the same key (0 to 1).
        in_flight: first submissions outstanding at most (retries come on top).
        submitters: threads that submit (each runs a first attempt's database reads).
        seed: the random seed.
        key_prefix: the requests' keys are ``<key_prefix>-<n>``: unique per workload.
        sku_ids: the SKUs the requests draw from, uniformly, when not empty: those of the
            partitions a partition-routed instance mounts (each within ``0 .. skus-1``).

    Raises:
        ValueError: a count below 1, ``retry_fraction`` outside 0..1, or a SKU of ``sku_ids``
            outside ``0 .. skus-1`` or given twice.
    """

    skus: int = 4
    max_quantity: int = 3
    retry_fraction: float = 0.1
    in_flight: int = 21
    submitters: int = 4
    seed: int = 7
    key_prefix: str = "request"
    sku_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for name in ("skus", "max_quantity", "in_flight", "submitters"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if not 0.0 <= self.retry_fraction <= 1.0:
            raise ValueError(f"retry_fraction must be within 0..1, got {self.retry_fraction}")
        outside = [sku for sku in self.sku_ids if not 0 <= sku < self.skus]
        if outside or len(set(self.sku_ids)) != len(self.sku_ids):
            raise ValueError(
                f"sku_ids must be distinct SKUs within 0..{self.skus - 1}, got {list(self.sku_ids)}"
            )


@dataclass
class InventoryStats:
    """What a run did.

    Attributes:
        requests: first submissions.
        committed: of those, committed (a reservation each).
        refused: of those, refused for stock (dropped by the rule).
        already_applied: of those, answered already applied (0 unless keys repeat across runs).
        retries: second submissions with the same key.
        retries_already_applied / retries_committed / retries_refused: their outcomes
            (a retry that committed put a copy in the log whose apply changes nothing).
        lock_failures: attempts refused by the lock check, summed over every submission.
        errors: how many submissions failed; ``error_samples`` keeps a few descriptions.
        seconds: from the first draw to the last resolution.
        commit_latency / applied_latency: per request committed first, seconds from submit to
            commit, and to the instance's client having applied it.
    """

    requests: int = 0
    committed: int = 0
    refused: int = 0
    already_applied: int = 0
    retries: int = 0
    retries_already_applied: int = 0
    retries_committed: int = 0
    retries_refused: int = 0
    lock_failures: int = 0
    errors: int = 0
    error_samples: list[str] = field(default_factory=list)
    seconds: float = 0.0
    commit_latency: LatencyHistogram = field(default_factory=LatencyHistogram)
    applied_latency: LatencyHistogram = field(default_factory=LatencyHistogram)

    COUNTS = (
        "requests",
        "committed",
        "refused",
        "already_applied",
        "retries",
        "retries_already_applied",
        "retries_committed",
        "retries_refused",
        "lock_failures",
        "errors",
    )

    def add(self, other: InventoryStats) -> None:
        """Add another run's counts and histograms to these (``seconds`` is left alone)."""
        for name in self.COUNTS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.error_samples.extend(e for e in other.error_samples if e not in self.error_samples)
        del self.error_samples[ERROR_SAMPLES:]
        self.commit_latency.add(other.commit_latency)
        self.applied_latency.add(other.applied_latency)

    def to_wire(self) -> dict[str, Any]:
        """A picklable dict of the figures (histograms encoded; :meth:`from_wire`)."""
        wire: dict[str, Any] = {name: getattr(self, name) for name in self.COUNTS}
        wire.update(
            error_samples=list(self.error_samples),
            seconds=self.seconds,
            commit_latency=self.commit_latency.encode(),
            applied_latency=self.applied_latency.encode(),
        )
        return wire

    @classmethod
    def from_wire(cls, wire: dict[str, Any]) -> InventoryStats:
        """The figures of :meth:`to_wire`'s dict."""
        stats = cls()
        for name in cls.COUNTS:
            setattr(stats, name, int(wire[name]))
        stats.error_samples = list(wire["error_samples"])
        stats.seconds = float(wire["seconds"])
        stats.commit_latency = LatencyHistogram.decode(wire["commit_latency"])
        stats.applied_latency = LatencyHistogram.decode(wire["applied_latency"])
        return stats


@dataclass(frozen=True, slots=True)
class _Request:
    sku_id: int
    quantity: int
    key: str
    retried: bool  # this request is sent a second time
    first: bool = True  # this submission is the first


class InventoryWorkload:
    """Sends reservations to one instance (see the module docstring); :meth:`close` it after use."""

    def __init__(self, instance: InventoryInstance, config: InventoryConfig | None = None) -> None:
        self.instance = instance
        self.config = config or InventoryConfig()
        self._random = random.Random(self.config.seed)
        self._slots = threading.BoundedSemaphore(self.config.in_flight)
        self._changed = threading.Condition()
        self._outstanding = 0  # submissions not resolved yet, retries included
        self._applied_pending = 0  # first commits whose apply is awaited
        self._drawn = 0
        #: Requests whose first submission committed, over every run of this workload.
        self.first_commits = 0
        self.stats = InventoryStats()
        self._submitters = ThreadPoolExecutor(self.config.submitters, thread_name_prefix="inventory")

    def close(self) -> None:
        """Stop the submitter threads (after :meth:`drain`)."""
        self._submitters.shutdown(wait=True)

    def run(self, requests: int, timeout: float = 300.0) -> InventoryStats:
        """Send ``requests`` reservations (and their retries), then wait until all are resolved.

        Raises:
            TimeoutError: some are unresolved after ``timeout`` seconds.
        """
        self.stats = stats = InventoryStats()
        started = time.monotonic()
        stats_offset = self._drawn
        for _ in range(requests):
            n = self._drawn
            self._drawn += 1
            sku_ids = self.config.sku_ids
            request = _Request(
                sku_id=self._random.choice(sku_ids) if sku_ids else self._random.randrange(self.config.skus),
                quantity=self._random.randint(1, self.config.max_quantity),
                key=f"{self.config.key_prefix}-{n}",
                retried=self._random.random() < self.config.retry_fraction,
            )
            if not self._slots.acquire(timeout=max(0.0, timeout - (time.monotonic() - started))):
                raise TimeoutError(
                    f"{requests - n + stats_offset} reservations not submitted after {timeout:g}s: "
                    f"{self.config.in_flight} still unresolved"
                )
            self._submit(request, stats)
        self.drain(max(0.0, timeout - (time.monotonic() - started)))
        stats.seconds = time.monotonic() - started
        return stats

    def drain(self, timeout: float) -> None:
        """Wait until every submission is resolved.

        Raises:
            TimeoutError: some are still unresolved after ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        with self._changed:
            while self._outstanding:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(
                        f"{self._outstanding} reservations still unresolved after {timeout:g}s"
                    )
                self._changed.wait(remaining)

    def wait_applied(self, timeout: float) -> bool:
        """Wait until the instance applied every first commit (False: some not after ``timeout`` s)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while self._applied_pending:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._changed.wait(remaining)
        return True

    @property
    def unapplied(self) -> int:
        """First commits not yet applied by the instance."""
        with self._changed:
            return self._applied_pending

    def _submit(self, request: _Request, stats: InventoryStats) -> None:
        with self._changed:
            self._outstanding += 1
            stats.requests += 1
        self._submitters.submit(self._submit_now, request, stats)

    def _submit_now(self, request: _Request, stats: InventoryStats) -> None:
        started = time.perf_counter()
        try:
            operation = self.instance.reservation(request.sku_id, request.quantity, request.key)
            future = self.instance.submit(operation)
        except Exception as exc:
            self._failed(request, stats, f"submit: {exc!r}")
            return
        future.add_done_callback(lambda f: self._resolved(f, request, operation, stats, started))

    def _failed(self, request: _Request, stats: InventoryStats, error: str) -> None:
        with self._changed:
            self._error_locked(stats, error)
            self._done_locked(request)

    @staticmethod
    def _error_locked(stats: InventoryStats, error: str) -> None:
        stats.errors += 1
        if len(stats.error_samples) < ERROR_SAMPLES:
            stats.error_samples.append(error)

    def _done_locked(self, request: _Request) -> None:
        self._outstanding -= 1
        if request.first:
            self._slots.release()
        self._changed.notify_all()

    def _resolved(
        self,
        future: Future[Outcome],
        request: _Request,
        operation: InventoryOperation,
        stats: InventoryStats,
        started: float,
    ) -> None:
        exc = future.exception()
        if exc is not None:
            self._failed(request, stats, f"reserve {request.key}: {exc!r}")
            return
        outcome = future.result()
        timed = False
        with self._changed:
            stats.lock_failures += operation.lock_failures
            kind = outcome.kind
            if request.first:
                if kind is OutcomeKind.COMMITTED:
                    stats.committed += 1
                    self.first_commits += 1
                    stats.commit_latency.record(time.perf_counter() - started)
                    timed = outcome.transaction_id is not None  # its apply is waited for and timed
                    self._applied_pending += int(timed)
                elif kind is OutcomeKind.DROPPED:
                    stats.refused += 1
                else:
                    stats.already_applied += 1
            elif kind is OutcomeKind.COMMITTED:
                stats.retries_committed += 1
            elif kind is OutcomeKind.DROPPED:
                stats.retries_refused += 1
            else:
                stats.retries_already_applied += 1
            if request.first and request.retried:
                self._outstanding += 1  # the retry, counted before this request is over
                stats.retries += 1
                retry = _Request(request.sku_id, request.quantity, request.key, retried=False, first=False)
                self._submitters.submit(self._submit_now, retry, stats)
            self._done_locked(request)
        if timed and outcome.transaction_id is not None:
            try:
                self.instance.client.when_applied(
                    operation.chosen_partition, outcome.transaction_id, lambda: self._applied(stats, started)
                )
            except Exception as exc:  # no such partition: never timed
                with self._changed:
                    self._applied_pending -= 1
                    self._error_locked(stats, f"when_applied: {exc!r}")
                    self._changed.notify_all()

    def _applied(self, stats: InventoryStats, started: float) -> None:
        stats.applied_latency.record(time.perf_counter() - started)
        with self._changed:
            self._applied_pending -= 1
            self._changed.notify_all()
