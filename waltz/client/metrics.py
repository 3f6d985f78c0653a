"""Prometheus metrics of a client: counters per partition, gauges read from the partitions when scraped.

Each client owns a :class:`ClientMetrics` with a ``CollectorRegistry`` of its own (exposed as
``WaltzClient.metrics``). Nothing is counted per transaction through ``prometheus_client``: the
submitted count is a plain integer per partition, kept under the lock that admits a context
(:class:`~waltz.client.in_flight.InFlight`); counters of events (commits, failures, remounts) are
incremented once per batch on a child bound once per partition (:class:`PartitionMetrics`); the
commit latencies of a batch of feed entries go into a
:class:`~waltz.batched_histogram.BatchedHistogram` at once; the summaries of the stages of a
transaction's latency add to plain totals once per batch (:class:`StageTotals`). The submitted
count, the summaries and the gauges (in flight, high-water marks, mounted, unhealthy) are read only
when the registry is collected. Serve it with
``prometheus_client.start_http_server(port, registry=client.metrics)``.

Metric names (``partition`` label on all but the histogram and the summaries):

- ``waltz_client_transactions_submitted_total``: contexts admitted by ``submit``.
- ``waltz_client_transactions_committed_total``: own appends seen committed in the feed.
- ``waltz_client_failed_appends_total``: appends that failed without a lock failure (lost with a
  connection, a server, a reassignment) and were re-executed.
- ``waltz_client_lock_failures_total``: appends the server's lock check refused, or that the client
  held back behind a pending append of its own holding their lock which then committed
  (re-executed).
- ``waltz_client_held_appends_total``: appends held back behind a pending append of this client
  holding one of their locks (``client.holdConflictingAppends``; sent once that one fails, a lock
  failure once it commits).
- ``waltz_client_claim_waits_total``: contexts that waited, before their first attempt, for
  another context's claim on an expected lock that an append of this client writes (docs/design/locks.md
  "Locks of appends in flight").
- ``waltz_client_transactions_applied_total``: transactions ``apply_transaction`` returned for.
- ``waltz_client_apply_errors_total``: exceptions raised by ``apply_transaction(s)``.
- ``waltz_client_remounts_total``: runs of the reconnect procedure (docs/design/client.md "Mount
  and the client high-water mark") after a mount.
- ``waltz_client_feed_gaps_total``: feed entries that skipped past the next transaction (the
  partition mounts again, which restarts the feed after what was applied).
- ``waltz_client_feed_windows_total``: ``FeedWindow`` grants sent (the feed window of
  ``client.maxApplyBacklog`` moved on as the application applied).
- ``waltz_client_commit_seconds``: histogram of submit-to-commit latency, in seconds.
- ``waltz_client_first_attempt_seconds``: summary of the time from ``submit`` to the end of the
  first attempt's ``execute`` (its append handed to the client's event loop), in seconds: waits
  for another context's claim, for an own pending append holding an expected lock to commit, or for
  read-your-writes, then ``execute`` with its reads. Counted for contexts whose first attempt
  produced an append.
- ``waltz_client_append_queue_seconds``: summary of the time an attempt's append waits for the
  client's event loop (from the end of ``execute`` to the loop writing it into the next stream
  message to the server, or holding it while its partition mounts), in seconds: the client's own
  share of the commit latency on the way out (like a Kafka producer's record queue time).
- ``waltz_client_log_round_trip_seconds``: summary of the time from the event loop handing an
  append to the server connection to seeing it committed in the feed, in seconds (committed
  appends only): the stream message to the server, its lock check, the store batch with its quorum
  of replicas, and the feed back. For a commit of a first attempt, first attempt + append queue +
  log round trip + completion delay is its submit-to-completion latency, but for the time its
  append was held back behind an own pending append (``waltz_client_held_appends_total``).
- ``waltz_client_completion_delay_seconds``: summary of the time from seeing a commit in the feed
  to the end of its context's completion (``on_completion`` and the ``submit`` future's callbacks,
  on the completion thread), in seconds: the client's share on the way back.
- ``waltz_client_apply_wait_seconds``: summary of the time from the feed handing a committed
  transaction to the partition's apply worker to the start of its apply, in seconds: the wait
  behind earlier applies (the apply backlog).
- ``waltz_client_apply_seconds``: summary of the time a transaction's apply took, in seconds:
  its data loaded, absorbed (the entity cache), ``apply_transaction(s)`` with its retries, and its
  mark moved; a group applied together counts the group's time for each of its transactions. For
  a transaction this client submitted, submit-to-commit latency, apply wait and apply add up to
  its time from submit to applied (read-your-writes).
- ``waltz_client_partition_transactions_in_flight``: contexts submitted and not ended.
- ``waltz_client_partition_client_high_water_mark``: the highest transaction ID applied.
- ``waltz_client_partition_server_high_water_mark``: the server's mark as last known (feed,
  flush and high-water-mark responses); -1 before any news.
- ``waltz_client_partition_mounted``: 1 while mounted.
- ``waltz_client_partition_unhealthy``: 1 while ``apply_transaction`` keeps failing.
- ``waltz_client_partition_apply_backlog``: committed transactions queued for
  ``apply_transaction`` (bounded by ``client.maxApplyBacklog``).

An ``EntityBatcher`` of the SQL framework adds its batches, their members and the log transactions
that waited for its linger to the same registry (:mod:`waltz.jdbc_style.batch_metrics`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily
from prometheus_client.registry import Collector

from waltz.batched_histogram import BatchedHistogram

__all__ = ["ClientMetrics", "PartitionGauges", "PartitionMetrics", "StageTotals"]

#: Buckets of the submit-to-commit histogram, in seconds.
COMMIT_SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@dataclass(frozen=True, slots=True)
class PartitionGauges:
    """One partition's state as the gauges show it, read at scrape time."""

    partition_id: int
    in_flight: int
    client_high_water_mark: int
    server_high_water_mark: int
    mounted: bool
    unhealthy: bool
    apply_backlog: int = 0
    submitted: int = 0


class _PartitionCollector(Collector):
    def __init__(self) -> None:
        self.source: Callable[[], Iterable[PartitionGauges]] | None = None

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
            "in_flight": GaugeMetricFamily(
                "waltz_client_partition_transactions_in_flight",
                "Transaction contexts submitted and not ended yet.",
                labels=["partition"],
            ),
            "client_mark": GaugeMetricFamily(
                "waltz_client_partition_client_high_water_mark",
                "The highest transaction ID this client applied (or found applied).",
                labels=["partition"],
            ),
            "server_mark": GaugeMetricFamily(
                "waltz_client_partition_server_high_water_mark",
                "The server's committed high-water mark as last known to this client (-1: no news).",
                labels=["partition"],
            ),
            "mounted": GaugeMetricFamily(
                "waltz_client_partition_mounted", "1 while the partition is mounted.", labels=["partition"]
            ),
            "unhealthy": GaugeMetricFamily(
                "waltz_client_partition_unhealthy",
                "1 while apply_transaction keeps failing on the partition.",
                labels=["partition"],
            ),
            "submitted": CounterMetricFamily(
                "waltz_client_transactions_submitted",
                "Transaction contexts admitted by submit, by partition.",
                labels=["partition"],
            ),
            "apply_backlog": GaugeMetricFamily(
                "waltz_client_partition_apply_backlog",
                "Committed transactions queued for apply_transaction (at most client.maxApplyBacklog).",
                labels=["partition"],
            ),
        }
        source = self.source
        for gauges in sorted(source() if source is not None else (), key=lambda g: g.partition_id):
            label = [str(gauges.partition_id)]
            families["in_flight"].add_metric(label, gauges.in_flight)
            families["client_mark"].add_metric(label, gauges.client_high_water_mark)
            families["server_mark"].add_metric(label, gauges.server_high_water_mark)
            families["mounted"].add_metric(label, 1.0 if gauges.mounted else 0.0)
            families["unhealthy"].add_metric(label, 1.0 if gauges.unhealthy else 0.0)
            families["apply_backlog"].add_metric(label, gauges.apply_backlog)
            families["submitted"].add_metric(label, gauges.submitted)
        yield from families.values()


class StageTotals:
    """The count and the sum of seconds of one summary, added to a batch at a time.

    A summary observation of ``prometheus_client`` costs a lock and two increments per value; the
    client times its own stages for every transaction, so it sums a batch first and adds it here
    once (thread-safe). Exposed as a ``SummaryMetricFamily`` when the registry is collected.

    Args:
        name: the metric name (``_count`` and ``_sum`` samples).
        documentation: its help text.
    """

    __slots__ = ("_lock", "count", "documentation", "name", "seconds")

    def __init__(self, name: str, documentation: str) -> None:
        self.name = name
        self.documentation = documentation
        self.count = 0
        self.seconds = 0.0
        self._lock = threading.Lock()

    def add(self, seconds: float, count: int) -> None:
        """Add ``count`` observations of ``seconds`` in all."""
        with self._lock:
            self.seconds += seconds
            self.count += count

    def family(self) -> SummaryMetricFamily:
        """The summary's samples now."""
        with self._lock:
            return SummaryMetricFamily(
                self.name, self.documentation, count_value=self.count, sum_value=self.seconds
            )


class _StageCollector(Collector):
    def __init__(self, stages: Iterable[StageTotals]) -> None:
        self._stages = list(stages)

    def collect(self) -> Iterator[SummaryMetricFamily]:
        for stage in self._stages:
            yield stage.family()


class PartitionMetrics:
    """The counters of one partition, bound once so that counting costs one increment.

    Args:
        metrics: the client's metrics.
        partition_id: the partition (its ``partition`` label).
    """

    __slots__ = (
        "applied",
        "apply_errors",
        "apply_seconds",
        "apply_wait_seconds",
        "claim_waits",
        "commit_seconds",
        "committed",
        "failed_appends",
        "feed_gaps",
        "feed_windows",
        "held_appends",
        "lock_failures",
        "log_round_trip_seconds",
        "remounts",
    )

    def __init__(self, metrics: ClientMetrics, partition_id: int) -> None:
        label = str(partition_id)
        self.committed = metrics.transactions_committed.labels(label)
        self.failed_appends = metrics.failed_appends.labels(label)
        self.lock_failures = metrics.lock_failures.labels(label)
        self.held_appends = metrics.held_appends.labels(label)
        self.claim_waits = metrics.claim_waits.labels(label)
        self.applied = metrics.transactions_applied.labels(label)
        self.apply_errors = metrics.apply_errors.labels(label)
        self.remounts = metrics.remounts.labels(label)
        self.feed_gaps = metrics.feed_gaps.labels(label)
        self.feed_windows = metrics.feed_windows.labels(label)
        self.commit_seconds = metrics.commit_seconds
        self.log_round_trip_seconds = metrics.log_round_trip_seconds
        self.apply_wait_seconds = metrics.apply_wait_seconds
        self.apply_seconds = metrics.apply_seconds


class ClientMetrics:
    """A client's metrics registry (see the module docstring for the metric names).

    The registry is :attr:`registry`; the client exposes it as ``WaltzClient.metrics``. The
    gauges show nothing until :meth:`watch` names where to read them from.
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._collector = _PartitionCollector()
        self.registry.register(self._collector)

        def counter(name: str, documentation: str) -> Counter:
            return Counter(name, documentation, ["partition"], registry=self.registry)

        self.transactions_committed = counter(
            "waltz_client_transactions_committed",
            "This client's appends seen committed in the feed, by partition.",
        )
        self.failed_appends = counter(
            "waltz_client_failed_appends",
            "Appends that failed without a lock failure and were re-executed, by partition.",
        )
        self.lock_failures = counter(
            "waltz_client_lock_failures",
            "Appends refused by the server's lock check, or held back behind an own pending append "
            "holding their lock that committed, by partition.",
        )
        self.held_appends = counter(
            "waltz_client_held_appends",
            "Appends held back behind a pending append of this client holding one of their locks, "
            "by partition.",
        )
        self.claim_waits = counter(
            "waltz_client_claim_waits",
            "Contexts that waited before their first attempt for another's claim on a lock this "
            "client writes, by partition.",
        )
        self.transactions_applied = counter(
            "waltz_client_transactions_applied",
            "Transactions apply_transaction(s) returned for on this client, by partition.",
        )
        self.apply_errors = counter(
            "waltz_client_apply_errors",
            "Exceptions raised by apply_transaction(s) (the transaction is applied again), by partition.",
        )
        self.remounts = counter(
            "waltz_client_remounts", "Runs of the reconnect procedure (mounting again), by partition."
        )
        self.feed_gaps = counter(
            "waltz_client_feed_gaps",
            "Feed entries that skipped past the next transaction (the partition mounts again), by partition.",
        )
        self.feed_windows = counter(
            "waltz_client_feed_windows",
            "FeedWindow grants sent as the application applied (client.maxApplyBacklog), by partition.",
        )
        self.commit_seconds = BatchedHistogram(
            "waltz_client_commit_seconds",
            "Time from submit to seeing the commit in the feed, in seconds.",
            buckets=COMMIT_SECONDS_BUCKETS,
            registry=self.registry,
        )
        self.first_attempt_seconds = StageTotals(
            "waltz_client_first_attempt_seconds",
            "Time from submit to the end of the first attempt's execute (its append handed to the "
            "client's event loop), waits for claims, held locks and read-your-writes included, in seconds.",
        )
        self.append_queue_seconds = StageTotals(
            "waltz_client_append_queue_seconds",
            "Time from the end of an attempt's execute to the client's event loop sending its append "
            "(or holding it while the partition mounts), in seconds.",
        )
        self.log_round_trip_seconds = StageTotals(
            "waltz_client_log_round_trip_seconds",
            "Time from handing an append to the server connection to seeing it committed in the feed, "
            "in seconds (committed appends).",
        )
        self.completion_delay_seconds = StageTotals(
            "waltz_client_completion_delay_seconds",
            "Time from seeing a commit in the feed to the end of its context's completion callbacks, "
            "in seconds.",
        )
        self.apply_wait_seconds = StageTotals(
            "waltz_client_apply_wait_seconds",
            "Time from the feed handing a committed transaction to the apply worker to the start of "
            "its apply, in seconds.",
        )
        self.apply_seconds = StageTotals(
            "waltz_client_apply_seconds",
            "Time a transaction's apply took (data loaded, absorbed, applied with retries, mark moved; "
            "a group's time for each of its transactions), in seconds.",
        )
        self.registry.register(
            _StageCollector(
                [
                    self.first_attempt_seconds,
                    self.append_queue_seconds,
                    self.log_round_trip_seconds,
                    self.completion_delay_seconds,
                    self.apply_wait_seconds,
                    self.apply_seconds,
                ]
            )
        )

    def partition(self, partition_id: int) -> PartitionMetrics:
        """The counters of a partition (its samples exist, at 0, from this call on)."""
        return PartitionMetrics(self, partition_id)

    def watch(self, source: Callable[[], Iterable[PartitionGauges]]) -> None:
        """Read the gauges from ``source`` at every collection (called on the scraping thread)."""
        self._collector.source = source
