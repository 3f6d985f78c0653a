"""Metrics the console draws from the processes' own Prometheus endpoints.

Design: docs/design/console.md "Metrics". Each target's ``/metrics`` text is parsed with
``prometheus_client``'s parser; two scrapes in a row give rates (a counter that went down was
reset, by a restart or a partition that moved, and counts from zero, as Prometheus's ``rate``
does) and, from the histograms' buckets, the latency quantiles of the interval. What the console
charts, by partition or by process:

- commits per second: ``waltz_server_committed_records_total``;
- lock failures per second: ``waltz_server_partition_lock_failures`` (a count since the partition
  opened on its server);
- records pending in the store: ``waltz_server_partition_pending_records``;
- apply backlog: ``waltz_client_partition_apply_backlog`` of the clients given as targets;
- commit latency p50/p99 of each server: ``waltz_server_commit_seconds``; append latency of each
  storage node: ``waltz_storage_append_seconds``.
"""

from __future__ import annotations

import collections
import math
import re
import ssl
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from waltz.console.config import MetricsTarget

__all__ = [
    "MetricsHistory",
    "PartitionMetrics",
    "Scrape",
    "TargetMetrics",
    "derive",
    "histogram_quantile",
    "parse_scrape",
]

#: A sample's identity: its name and its labels, sorted.
SampleKey = tuple[str, tuple[tuple[str, str], ...]]


@dataclass(frozen=True, slots=True)
class Scrape:
    """One target's samples at one moment.

    Attributes:
        target: the target scraped.
        at: monotonic time of the scrape, seconds.
        samples: every sample, by name and labels; empty when the scrape failed.
        error: why the scrape failed, or None.
    """

    target: MetricsTarget
    at: float
    samples: Mapping[SampleKey, float] = field(default_factory=dict)
    error: str | None = None

    @property
    def kind(self) -> str:
        """``server``, ``storage``, ``client`` or ``other``, from the metric names it exports."""
        names = {name for name, _ in self.samples}
        for kind in ("server", "storage", "client"):
            if any(n.startswith(f"waltz_{kind}_") for n in names):
                return kind
        return "other"

    def by_label(self, name: str, label: str = "partition") -> dict[str, float]:
        """Label value -> sample value of the samples of ``name`` (other labels summed)."""
        found: dict[str, float] = {}
        for (sample, labels), value in self.samples.items():
            if sample == name:
                key = dict(labels).get(label)
                if key is not None:
                    found[key] = found.get(key, 0.0) + value
        return found

    def buckets(self, name: str) -> list[tuple[float, float]]:
        """``(upper bound, cumulative count)`` of the unlabelled histogram ``name``, sorted."""
        found = []
        for (sample, labels), value in self.samples.items():
            if sample == f"{name}_bucket":
                bound = dict(labels).get("le")
                if bound is not None:
                    found.append((float(bound), value))
        return sorted(found)


def parse_scrape(target: MetricsTarget, text: str, at: float) -> Scrape:
    """Parse a ``/metrics`` reply (Prometheus text format).

    Raises:
        ValueError: the text is not in the Prometheus text format.
    """
    samples: dict[SampleKey, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = float(sample.value)
    return Scrape(target, at, samples)


def _increase(now: float, before: float | None) -> float:
    """The increase of a counter since the scrape before: a drop means it was reset and counts from
    zero, and a series the scrape before lacked (a partition that moved here) started from zero."""
    if before is None or now < before:
        return now
    return now - before


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """Estimate the ``q`` quantile from cumulative buckets, interpolating linearly within a bucket.

    Args:
        q: the quantile, 0..1.
        buckets: ``(upper bound, cumulative count)`` sorted by bound, ``+Inf`` last.

    Returns:
        The estimate (in the buckets' unit), or None without observations. An estimate in the
        ``+Inf`` bucket is the highest finite bound.
    """
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower
            if count == below:
                return bound
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    return lower


def _bucket_increase(now: Scrape, before: Scrape | None, name: str) -> list[tuple[float, float]]:
    current = now.buckets(name)
    if before is None:
        return []
    previous = dict(before.buckets(name))
    increases = [(bound, count - previous.get(bound, 0.0)) for bound, count in current]
    if any(delta < 0 for _, delta in increases):  # reset: the process restarted
        return current
    return increases


@dataclass(frozen=True, slots=True)
class PartitionMetrics:
    """One partition's figures over the last interval.

    Attributes:
        commits_per_second: records committed per second (every server that reports it).
        lock_failures_per_second: appends refused by the lock check per second.
        pending_records: records waiting or in flight in the store, now.
        apply_backlog: committed transactions the clients given as targets have yet to apply.
    """

    commits_per_second: float = 0.0
    lock_failures_per_second: float = 0.0
    pending_records: float = 0.0
    apply_backlog: float | None = None


@dataclass(frozen=True, slots=True)
class TargetMetrics:
    """One target's state and latency over the last interval.

    Attributes:
        name, url: the target.
        kind: ``server``, ``storage``, ``client`` or ``other``; ``unknown`` before its first scrape.
        up: the last scrape succeeded.
        error: why it failed, or None.
        p50_ms, p99_ms: commit latency (servers and clients) or append latency (storage nodes)
            over the interval, in milliseconds; None without observations.
        per_second: records committed (servers) or appended (storage nodes) per second.
    """

    name: str
    url: str
    kind: str
    up: bool
    error: str | None = None
    p50_ms: float | None = None
    p99_ms: float | None = None
    per_second: float | None = None


#: The latency histogram of each kind of process.
LATENCY_HISTOGRAM = {
    "server": "waltz_server_commit_seconds",
    "storage": "waltz_storage_append_seconds",
    "client": "waltz_client_commit_seconds",
}
#: The per-partition counter whose rate is each kind's throughput.
THROUGHPUT_COUNTER = {
    "server": "waltz_server_committed_records_total",
    "storage": "waltz_storage_appended_records_total",
    "client": "waltz_client_transactions_committed_total",
}


@dataclass(slots=True)
class _TargetFigures:
    """What one target's scrape adds to the partitions' figures, and its own."""

    commits: dict[int, float] = field(default_factory=dict)
    failures: dict[int, float] = field(default_factory=dict)
    pending: dict[int, float] = field(default_factory=dict)
    backlog: dict[int, float] = field(default_factory=dict)
    per_second: float | None = None
    p50: float | None = None
    p99: float | None = None


def _partition_id(label: str) -> int:
    """A ``partition`` label's value as a partition ID.

    Raises:
        ValueError: the value is not a partition ID (ASCII digits).
    """
    if not (label.isascii() and label.isdecimal()):
        raise ValueError(f"partition label {label!r} is not a partition ID")
    return int(label)


def _target_figures(scrape: Scrape, before: Scrape | None) -> _TargetFigures:
    """One target's figures from its scrape and the one before.

    Raises:
        ValueError: a ``partition`` label is not a partition ID, or a bucket bound not a number.
    """
    figures = _TargetFigures()
    seconds = scrape.at - before.at if before is not None else 0.0
    kind = scrape.kind

    def add(into: dict[int, float], label: str, value: float) -> None:
        pid = _partition_id(label)
        into[pid] = into.get(pid, 0.0) + value

    if kind in THROUGHPUT_COUNTER and seconds > 0 and before is not None:
        name = THROUGHPUT_COUNTER[kind]
        old = before.by_label(name)
        total = 0.0
        for pid, value in scrape.by_label(name).items():
            rate = _increase(value, old.get(pid)) / seconds
            total += rate
            if kind == "server":
                add(figures.commits, pid, rate)
        figures.per_second = total
    if kind == "server" and seconds > 0 and before is not None:
        old = before.by_label("waltz_server_partition_lock_failures")
        for pid, value in scrape.by_label("waltz_server_partition_lock_failures").items():
            add(figures.failures, pid, _increase(value, old.get(pid)) / seconds)
    if kind == "server":
        for pid, value in scrape.by_label("waltz_server_partition_pending_records").items():
            add(figures.pending, pid, value)
    if kind == "client":
        for pid, value in scrape.by_label("waltz_client_partition_apply_backlog").items():
            add(figures.backlog, pid, value)
    if kind in LATENCY_HISTOGRAM:
        increase = _bucket_increase(scrape, before, LATENCY_HISTOGRAM[kind])
        figures.p50, figures.p99 = histogram_quantile(0.5, increase), histogram_quantile(0.99, increase)
    return figures


def derive(
    scrapes: Sequence[Scrape], previous: Mapping[str, Scrape]
) -> tuple[dict[int, PartitionMetrics], list[TargetMetrics]]:
    """Per-partition and per-target figures from this round of scrapes and the one before.

    A target whose scrape failed, or whose samples make no figures (a ``partition`` label that is
    not a partition ID, a bucket bound that is not a number), is down with its error and adds
    nothing to the partitions' figures; the other targets count as usual (docs/design/console.md
    "Metrics").

    Args:
        scrapes: this round's scrapes, one per target.
        previous: the last successful scrape of each target, by target name.

    Returns:
        ``(partition ID -> figures, one TargetMetrics per target in order)``.
    """
    commits: dict[int, float] = collections.defaultdict(float)
    failures: dict[int, float] = collections.defaultdict(float)
    pending: dict[int, float] = collections.defaultdict(float)
    backlog: dict[int, float] = collections.defaultdict(float)
    targets = []
    has_clients = False
    for scrape in scrapes:
        target = scrape.target
        if scrape.error is not None:
            targets.append(TargetMetrics(target.name, target.url, "unknown", False, scrape.error))
            continue
        try:
            figures = _target_figures(scrape, previous.get(target.name))
        except (ValueError, ArithmeticError) as exc:
            error = f"{type(exc).__name__}: {exc}"
            targets.append(TargetMetrics(target.name, target.url, scrape.kind, False, error))
            continue
        for into, values in (
            (commits, figures.commits),
            (failures, figures.failures),
            (pending, figures.pending),
            (backlog, figures.backlog),
        ):
            for pid, value in values.items():
                into[pid] += value
        has_clients = has_clients or scrape.kind == "client"
        targets.append(
            TargetMetrics(
                target.name,
                target.url,
                scrape.kind,
                True,
                p50_ms=None if figures.p50 is None else figures.p50 * 1000.0,
                p99_ms=None if figures.p99 is None else figures.p99 * 1000.0,
                per_second=figures.per_second,
            )
        )
    partitions = {
        pid: PartitionMetrics(
            commits_per_second=commits.get(pid, 0.0),
            lock_failures_per_second=failures.get(pid, 0.0),
            pending_records=pending.get(pid, 0.0),
            apply_backlog=backlog.get(pid, 0.0) if has_clients else None,
        )
        for pid in sorted(set(commits) | set(failures) | set(pending) | set(backlog))
    }
    return partitions, targets


@dataclass(frozen=True, slots=True)
class _Point:
    at: float
    values: Mapping[str, float | None]


class MetricsHistory:
    """The last ``size`` rounds of figures, as chart series (wall-clock seconds on the x axis).

    Args:
        size: rounds kept (the charts span ``size`` times the refresh interval).
    """

    #: The charts: id -> (title, unit).
    CHARTS: Mapping[str, tuple[str, str]] = {
        "commits": ("Commits per partition", "tx/s"),
        "lock_failures": ("Lock failures per partition", "/s"),
        "latency": ("Commit latency p99 per server", "ms"),
        "backlog": ("Pending store records and client apply backlog", "records"),
    }

    def __init__(self, size: int = 300) -> None:
        self._points: collections.deque[_Point] = collections.deque(maxlen=size)

    def add(
        self, at: float, partitions: Mapping[int, PartitionMetrics], targets: Iterable[TargetMetrics]
    ) -> None:
        """Record one round of figures taken at wall-clock time ``at``."""
        values: dict[str, float | None] = {}
        for pid, figures in partitions.items():
            values[f"commits/p{pid}"] = figures.commits_per_second
            values[f"lock_failures/p{pid}"] = figures.lock_failures_per_second
            values[f"backlog/p{pid} pending"] = figures.pending_records
            if figures.apply_backlog is not None:
                values[f"backlog/p{pid} apply"] = figures.apply_backlog
        for target in targets:
            if target.kind == "server":
                values[f"latency/{target.name}"] = target.p99_ms
        self._points.append(_Point(at, values))

    def charts(self) -> list[dict[str, Any]]:
        """Every chart as ``{"id", "title", "unit", "series": [names], "data": [xs, ys...]}``.

        ``data`` is uPlot's column layout: the x values (seconds since the epoch), then one list per
        series (``null`` where a point lacks the series).
        """
        points = list(self._points)
        xs = [round(p.at, 3) for p in points]
        charts = []
        for chart_id, (title, unit) in self.CHARTS.items():
            prefix = f"{chart_id}/"
            names = sorted({k for p in points for k in p.values if k.startswith(prefix)}, key=_natural)
            data: list[list[float | None]] = [list(xs)]
            for name in names:
                data.append([p.values.get(name) for p in points])
            charts.append(
                {
                    "id": chart_id,
                    "title": title,
                    "unit": unit,
                    "series": [n.removeprefix(prefix) for n in names],
                    "data": data,
                }
            )
        return charts


def _natural(name: str) -> tuple[Any, ...]:
    """Sort ``p10`` after ``p9``."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name))


def client_ssl_context(
    ca_file: str | None, cert_file: str | None, key_file: str | None
) -> ssl.SSLContext | None:
    """The TLS context to scrape ``https`` targets with, or None for the system's defaults.

    Args:
        ca_file: PEM CA bundle verifying the targets (the cluster's ``cluster.ssl.caFile``).
        cert_file, key_file: the client certificate the targets may require.

    Raises:
        OSError, ssl.SSLError: a file is missing or not PEM.
    """
    if ca_file is None and cert_file is None:
        return None
    context = ssl.create_default_context(cafile=ca_file)
    if cert_file is not None:
        context.load_cert_chain(cert_file, key_file)
    return context


def now() -> float:
    """Monotonic seconds (the scrapes' clock)."""
    return time.monotonic()
