"""Latency histograms (HdrHistogram) and the figures a perf run prints.

Latencies are recorded in microseconds in an :class:`hdrh.histogram.HdrHistogram` (the
``hdrhistogram`` package) that tracks 1 µs to 1 hour with 3 significant digits. Histograms travel
between processes in HdrHistogram's compressed encoding (:meth:`LatencyHistogram.encode`).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hdrh.histogram import HdrHistogram  # type: ignore[import-untyped]

__all__ = [
    "BATCH_COUNTS",
    "PERCENTILES",
    "LatencyHistogram",
    "RunStats",
    "add_batch_counts",
    "add_stages",
    "batch_counts_of",
    "stage_means_ms",
]

#: The names of an instance's batch counts, in their order: log transactions of more than one
#: request its ``EntityBatcher`` committed, the requests they carried, and its log transactions
#: that waited for the batch linger (docs/design/sql.md "Batched entity transactions").
BATCH_COUNTS = ("batches", "members", "lingered")

#: The percentiles every report prints.
PERCENTILES: tuple[float, ...] = (50.0, 90.0, 99.0, 99.9)

_LOWEST_US = 1
_HIGHEST_US = 3_600_000_000
_SIGNIFICANT_DIGITS = 3
_BYTES_PER_MB = 1024 * 1024


class LatencyHistogram:
    """A thread-safe HdrHistogram of latencies in microseconds (1 µs to 1 h, 3 significant digits).

    Values above one hour are recorded as one hour; values below 1 µs as 1 µs.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._histogram = HdrHistogram(_LOWEST_US, _HIGHEST_US, _SIGNIFICANT_DIGITS)

    def record(self, seconds: float) -> None:
        """Record one latency given in seconds."""
        micros = min(_HIGHEST_US, max(_LOWEST_US, round(seconds * 1_000_000)))
        with self._lock:
            self._histogram.record_value(micros)

    def record_all(self, seconds: Iterable[float]) -> None:
        """Record latencies given in seconds (like :meth:`record`, under one lock)."""
        with self._lock:
            record = self._histogram.record_value
            for value in seconds:
                record(min(_HIGHEST_US, max(_LOWEST_US, round(value * 1_000_000))))

    @property
    def count(self) -> int:
        """The number of recorded latencies."""
        with self._lock:
            return int(self._histogram.get_total_count())

    def percentile_ms(self, percentile: float) -> float:
        """The latency at ``percentile`` (0 to 100) in milliseconds; NaN when nothing was recorded."""
        with self._lock:
            if self._histogram.get_total_count() == 0:
                return float("nan")
            return float(self._histogram.get_value_at_percentile(percentile)) / 1000.0

    def max_ms(self) -> float:
        """The largest latency in milliseconds; NaN when nothing was recorded."""
        with self._lock:
            if self._histogram.get_total_count() == 0:
                return float("nan")
            return float(self._histogram.get_max_value()) / 1000.0

    def mean_ms(self) -> float:
        """The mean latency in milliseconds; NaN when nothing was recorded."""
        with self._lock:
            if self._histogram.get_total_count() == 0:
                return float("nan")
            return float(self._histogram.get_mean_value()) / 1000.0

    def summary(self) -> dict[str, float | int | None]:
        """``p50``, ``p90``, ``p99``, ``p99.9``, ``max`` and ``mean`` in milliseconds (rounded to
        the microsecond; None when nothing was recorded) and ``count``: JSON-ready."""
        summary: dict[str, float | int | None] = {}
        for p in PERCENTILES:
            value = self.percentile_ms(p)
            summary[f"p{p:g}"] = None if math.isnan(value) else round(value, 3)
        for key, value in (("max", self.max_ms()), ("mean", self.mean_ms())):
            summary[key] = None if math.isnan(value) else round(value, 3)
        summary["count"] = self.count
        return summary

    def text(self, label: str) -> str:
        """One line: ``latency <label> (ms): p50 .. p99.9 .. max .. (HdrHistogram, N values)``."""
        if not self.count:
            return f"latency {label} (ms): none recorded"
        parts = " ".join(f"p{p:g} {self.percentile_ms(p):.2f}" for p in PERCENTILES)
        return f"latency {label} (ms): {parts} max {self.max_ms():.2f} (HdrHistogram, {self.count:,} values)"

    def add(self, other: LatencyHistogram) -> None:
        """Add every value of ``other`` to this histogram."""
        with other._lock:
            encoded = other._histogram.encode()
        with self._lock:
            self._histogram.decode_and_add(encoded)

    def encode(self) -> bytes:
        """HdrHistogram's compressed, base64 encoding (to send the histogram to another process)."""
        with self._lock:
            return bytes(self._histogram.encode())

    @classmethod
    def decode(cls, encoded: bytes) -> LatencyHistogram:
        """The histogram of an :meth:`encode` result.

        Raises:
            ValueError: ``encoded`` is not an HdrHistogram encoding.
        """
        histogram = cls()
        try:
            histogram._histogram.decode_and_add(encoded)
        except Exception as exc:  # hdrh raises assorted errors on bad input
            raise ValueError(f"not an HdrHistogram encoding: {exc!r}") from exc
        return histogram


def add_stages(totals: dict[str, tuple[float, float]], stages: Mapping[str, tuple[float, float]]) -> None:
    """Add one client's stage metrics, ``stage -> (seconds, count)``, into ``totals``, in place."""
    for stage, (seconds, count) in stages.items():
        mine = totals.get(stage, (0.0, 0.0))
        totals[stage] = (mine[0] + seconds, mine[1] + count)


def batch_counts_of(wire: Mapping[str, Any]) -> tuple[int, int, int]:
    """An instance process's ``batches`` (:data:`BATCH_COUNTS`, in order) from its message; zeros
    when it carries none."""
    batches, members, lingered = (int(count) for count in wire.get("batches", (0, 0, 0)))
    return batches, members, lingered


def add_batch_counts(per_instance: Iterable[tuple[int, int, int]]) -> tuple[int, int, int]:
    """The instances' batch counts (:data:`BATCH_COUNTS`, in order), added."""
    batches = members = lingered = 0
    for b, m, lg in per_instance:
        batches, members, lingered = batches + b, members + m, lingered + lg
    return batches, members, lingered


def stage_means_ms(per_client: Iterable[Mapping[str, tuple[float, float]]]) -> dict[str, float]:
    """Mean milliseconds of each client stage over several clients' ``stage -> (seconds, count)``
    (the stages with observations), in the order the stages first appear."""
    totals: dict[str, tuple[float, float]] = {}
    for stages in per_client:
        add_stages(totals, stages)
    return {stage: seconds * 1e3 / count for stage, (seconds, count) in totals.items() if count}


@dataclass(slots=True)
class RunStats:
    """What a load run measured (one client, or several merged with :meth:`merge`).

    Attributes:
        committed: transactions committed (or, for a consumer, applied).
        failed: submitted transactions that ended with an error or had not ended at the run's
            timeout.
        submitted: transactions handed to the client (a producer's ``committed + failed``; 0 for
            a consumer).
        not_submitted: transactions of the run never submitted because its timeout came first
            (docs/benchmarks.md "`waltz perf producer` and `waltz perf consumer`").
        retries: attempts beyond the first, summed over the transactions.
        payload_bytes: payload bytes of the committed transactions.
        started: wall-clock time (``time.time()``, seconds) when the measured phase started.
        ended: wall-clock time when its last transaction ended.
        latency: submit-to-commit latencies (seconds in, microseconds inside).
        errors: up to 10 distinct error descriptions, for the report.
        client_cpu_seconds: CPU seconds (user + system, every thread) the client processes spent in
            the measured phase.
        node_cpu_seconds: CPU seconds each cluster process spent during the run, by name (empty
            when the nodes are unknown: a cluster the run did not start). Read from the nodes'
            ``process_cpu_seconds_total``, from before the clients connect to after they end (their
            mount and warm-up included).
        storage_batches: for each storage node of the run, ``(records, flushes)`` it appended and
            made durable over the same span (``waltz_storage_*_total``); see
            :meth:`records_per_storage_flush`.
        server_commits: for each server of the run, ``(seconds, commits)``: the seconds from
            receiving an append to its commit, summed over its commits, and their number
            (``waltz_server_commit_seconds``); see :meth:`server_commit_ms`.
        server_batches: for each server of the run, ``(records, batches)``: the records it
            committed and the store batches it sent to the replicas over the same span; see
            :meth:`records_per_store_batch`.
        client_stages: for each stage of a transaction's latency that the clients time (the
            producer's ``CLIENT_STAGES``), ``(seconds, count)`` summed over the clients' measured
            phases; see :meth:`client_stage_ms`.
    """

    committed: int = 0
    failed: int = 0
    submitted: int = 0
    not_submitted: int = 0
    retries: int = 0
    payload_bytes: int = 0
    started: float = 0.0
    ended: float = 0.0
    latency: LatencyHistogram = field(default_factory=LatencyHistogram)
    errors: list[str] = field(default_factory=list)
    client_cpu_seconds: float = 0.0
    node_cpu_seconds: dict[str, float] = field(default_factory=dict)
    storage_batches: dict[str, tuple[float, float]] = field(default_factory=dict)
    server_commits: dict[str, tuple[float, float]] = field(default_factory=dict)
    server_batches: dict[str, tuple[float, float]] = field(default_factory=dict)
    client_stages: dict[str, tuple[float, float]] = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        """Seconds from the start to the end of the measured phase (never below 1 µs)."""
        return max(1e-6, self.ended - self.started)

    @property
    def transactions_per_second(self) -> float:
        """Committed transactions per second."""
        return self.committed / self.seconds

    @property
    def megabytes_per_second(self) -> float:
        """Committed payload in MiB (2**20 bytes) per second."""
        return self.payload_bytes / _BYTES_PER_MB / self.seconds

    @property
    def retries_per_transaction(self) -> float:
        """Retries per committed transaction (0 when none committed)."""
        return self.retries / self.committed if self.committed else 0.0

    def cpu_microseconds_per_transaction(self) -> dict[str, float]:
        """CPU microseconds per committed transaction: ``client`` (all client processes, when
        measured), then each cluster process by name; empty when nothing committed."""
        if not self.committed:
            return {}
        spent = {"client": self.client_cpu_seconds} if self.client_cpu_seconds else {}
        spent.update(self.node_cpu_seconds)
        return {name: seconds * 1e6 / self.committed for name, seconds in spent.items()}

    def records_per_storage_flush(self) -> dict[str, float]:
        """Records each storage node wrote per flush (fsync) on average, by name (nodes that
        flushed); the larger, the less CPU per transaction a storage node spends."""
        return {name: records / flushes for name, (records, flushes) in self.storage_batches.items()}

    def records_per_store_batch(self) -> dict[str, float]:
        """Records each server committed per store batch it sent to the replicas, on average, by
        server (servers that sent batches): a storage flush can hold several batches of one
        partition (``storage.linger``, ``docs/configuration.md``)."""
        return {name: records / batches for name, (records, batches) in self.server_batches.items()}

    def server_commit_ms(self) -> dict[str, float]:
        """Mean milliseconds from a server receiving an append to its commit (a quorum of
        replicas durable), by server (servers that committed): the share of the submit-to-commit
        latency spent in the cluster rather than in the client and on the way."""
        return {name: seconds * 1e3 / commits for name, (seconds, commits) in self.server_commits.items()}

    def client_stage_ms(self) -> dict[str, float]:
        """Mean milliseconds of each stage the clients timed (stages with observations), in the
        order they were recorded: where a transaction's latency goes inside the client."""
        return stage_means_ms([self.client_stages])

    def merge(self, other: RunStats) -> None:
        """Add another client's figures: counts add up, the phase spans both, histograms merge."""
        if self.committed + self.failed == 0 and self.started == 0.0:
            self.started, self.ended = other.started, other.ended
        else:
            self.started = min(self.started, other.started)
            self.ended = max(self.ended, other.ended)
        self.committed += other.committed
        self.failed += other.failed
        self.submitted += other.submitted
        self.not_submitted += other.not_submitted
        self.retries += other.retries
        self.payload_bytes += other.payload_bytes
        self.latency.add(other.latency)
        self.client_cpu_seconds += other.client_cpu_seconds
        add_stages(self.client_stages, other.client_stages)
        self.errors.extend(e for e in other.errors if e not in self.errors)
        del self.errors[10:]

    def to_wire(self) -> dict[str, Any]:
        """A picklable dict (the histogram encoded) for :meth:`from_wire` in another process."""
        return {
            "committed": self.committed,
            "failed": self.failed,
            "submitted": self.submitted,
            "not_submitted": self.not_submitted,
            "retries": self.retries,
            "payload_bytes": self.payload_bytes,
            "started": self.started,
            "ended": self.ended,
            "latency": self.latency.encode(),
            "errors": list(self.errors),
            "client_cpu_seconds": self.client_cpu_seconds,
            "client_stages": {stage: list(pair) for stage, pair in self.client_stages.items()},
        }

    @classmethod
    def from_wire(cls, wire: dict[str, Any]) -> RunStats:
        """The stats of a :meth:`to_wire` dict."""
        return cls(
            committed=int(wire["committed"]),
            failed=int(wire["failed"]),
            submitted=int(wire.get("submitted", 0)),
            not_submitted=int(wire.get("not_submitted", 0)),
            retries=int(wire["retries"]),
            payload_bytes=int(wire["payload_bytes"]),
            started=float(wire["started"]),
            ended=float(wire["ended"]),
            latency=LatencyHistogram.decode(wire["latency"]),
            errors=list(wire["errors"]),
            client_cpu_seconds=float(wire["client_cpu_seconds"]),
            client_stages={
                stage: (float(seconds), float(count))
                for stage, (seconds, count) in wire.get("client_stages", {}).items()
            },
        )

    def summary(self) -> dict[str, Any]:
        """The figures as a JSON-ready dict.

        Keys: ``transactions`` (committed), ``failed``, ``submitted``, ``not_submitted``
        (before the timeout came; see the attributes), ``seconds``, ``transactions_per_second``,
        ``mb_per_second``, ``retries``, ``retries_per_transaction``, ``latency_ms`` (``p50``,
        ``p90``, ``p99``, ``p99.9``, ``max``, ``mean``, ``count``; values NaN-free: None when no
        latency was recorded), ``cpu_us_per_transaction`` (:meth:`cpu_microseconds_per_transaction`,
        rounded), ``records_per_storage_flush`` (:meth:`records_per_storage_flush`, rounded),
        ``records_per_store_batch`` (:meth:`records_per_store_batch`, rounded),
        ``server_commit_ms`` (:meth:`server_commit_ms`, rounded), ``client_stage_ms``
        (:meth:`client_stage_ms`, rounded) and ``errors``.
        """
        return {
            "transactions": self.committed,
            "failed": self.failed,
            "submitted": self.submitted,
            "not_submitted": self.not_submitted,
            "seconds": round(self.seconds, 3),
            "transactions_per_second": round(self.transactions_per_second, 1),
            "mb_per_second": round(self.megabytes_per_second, 4),
            "retries": self.retries,
            "retries_per_transaction": round(self.retries_per_transaction, 4),
            "latency_ms": self.latency.summary(),
            "cpu_us_per_transaction": {
                name: round(us, 1) for name, us in self.cpu_microseconds_per_transaction().items()
            },
            "records_per_storage_flush": {
                name: round(records, 1) for name, records in self.records_per_storage_flush().items()
            },
            "records_per_store_batch": {
                name: round(records, 1) for name, records in self.records_per_store_batch().items()
            },
            "server_commit_ms": {name: round(ms, 3) for name, ms in self.server_commit_ms().items()},
            "client_stage_ms": {stage: round(ms, 3) for stage, ms in self.client_stage_ms().items()},
            "errors": list(self.errors),
        }

    def text(
        self, what: str = "committed", latency_label: str = "submit->commit", span: str | None = None
    ) -> str:
        """The figures as the lines the CLI prints (upstream ProducerPerf's, plus percentiles).

        The first line says how many of the submitted transactions committed and failed (the
        submitted count left out when none were, as for a consumer); a second says how many were
        not submitted before the timeout, when any. ``span``, when given, names what the seconds
        run from and to, in brackets after them and after ``transactions/s`` and ``MB/s``.
        """
        mb = self.payload_bytes / _BYTES_PER_MB
        of = f" of {self.submitted:,} submitted" if self.submitted else ""
        over = f" ({span})" if span else ""
        lines = [
            f"{what} {self.committed:,} transactions ({self.failed:,} failed){of}, {mb:.4f} MB, "
            f"in {self.seconds:.2f} s{over}",
        ]
        if self.not_submitted:
            lines.append(f"not submitted before the timeout: {self.not_submitted:,} transactions")
        lines += [
            f"transactions/s{over}: {self.transactions_per_second:,.1f}",
            f"MB/s{over}: {self.megabytes_per_second:.4f}",
            f"retries/transaction: {self.retries_per_transaction:.4f}",
        ]
        lines.append(self.latency.text(latency_label))
        cpu = self.cpu_microseconds_per_transaction()
        if cpu:
            parts = ", ".join(f"{name} {us:,.0f}" for name, us in cpu.items())
            known = self.node_cpu_seconds
            nodes = f", all {sum(cpu.values()):,.0f}" if known else " (cluster processes unknown)"
            lines.append(f"CPU per transaction (µs): {parts}{nodes}")
        batches = self.records_per_storage_flush()
        if batches:
            parts = ", ".join(f"{name} {records:,.1f}" for name, records in batches.items())
            lines.append(f"records per storage flush: {parts}")
        per_batch = self.records_per_store_batch()
        if per_batch:
            parts = ", ".join(f"{name} {records:,.1f}" for name, records in per_batch.items())
            lines.append(f"records per store batch: {parts}")
        commits = self.server_commit_ms()
        if commits:
            parts = ", ".join(f"{name} {ms:,.2f}" for name, ms in commits.items())
            lines.append(f"server receipt->commit, mean (ms): {parts}")
        stages = self.client_stage_ms()
        if stages:
            parts = ", ".join(f"{stage} {ms:,.2f}" for stage, ms in stages.items())
            lines.append(f"client stages, mean (ms): {parts}")
        lines += [f"error: {e}" for e in self.errors]
        return "\n".join(lines)
