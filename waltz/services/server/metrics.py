"""Prometheus metrics of a server: per partition, read from the partitions when scraped."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, ProcessCollector
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from waltz.batched_histogram import BatchedHistogram
from waltz.services.server.server_partition import Partition

__all__ = ["ServerMetrics"]


#: Per-partition gauges: name suffix, help text, and how to read the value from a partition.
_GAUGES: tuple[tuple[str, str, Callable[[Partition], float]], ...] = (
    ("high_water_mark", "Committed high-water mark.", lambda p: p.store.high_water_mark),
    ("generation", "Generation under which this server owns it.", lambda p: p.generation),
    ("writable", "1 while a store session writes.", lambda p: 1.0 if p.store.writable else 0.0),
    (
        "replicas_in_session",
        "Replicas the store session writes to.",
        lambda p: len(p.store.replicas_in_session),
    ),
    (
        "replicas_catching_up",
        "Replicas the store session catches up in the background.",
        lambda p: len(p.store.replicas_catching_up),
    ),
    ("store_sessions", "Store sessions (recoveries) started.", lambda p: p.store.sessions_started),
    ("store_batches", "Append batches sent to the replicas.", lambda p: p.store.batches_sent),
    ("pending_records", "Records waiting or in flight.", lambda p: p.store.pending_records),
    ("appends", "Append requests accepted for the store.", lambda p: p.appends),
    ("lock_failures", "Append requests refused by the lock check.", lambda p: p.lock_failures),
    (
        "dropped_requests",
        "Requests dropped: another generation, or an older connection of the client.",
        lambda p: p.dropped,
    ),
    ("mounted_clients", "Client connections receiving the feed.", lambda p: p.mounted_clients),
    ("client_states", "Client IDs the partition keeps state for.", lambda p: p.client_states),
    (
        "feed_windows",
        "FeedWindow grants that raised a connection's feed window (client.maxApplyBacklog).",
        lambda p: p.feed_windows,
    ),
    (
        "archived_reads",
        "Records read from the archive: below the replicas' local start (docs/design/archive.md).",
        lambda p: p.archived_reads,
    ),
    (
        "parked_feeds",
        "Times a connection's feed stopped at the end of its window until the client granted more.",
        lambda p: p.parked_feeds,
    ),
    (
        "refused_mounts",
        "Mounts refused because the client's high-water mark was above the partition's (the "
        "application's database is ahead of this log: docs/protocol.md).",
        lambda p: p.refused_mounts,
    ),
)


class _PartitionCollector(Collector):
    def __init__(self, partitions: Callable[[], Mapping[int, Partition]]) -> None:
        self._partitions = partitions

    def collect(self) -> Iterator[GaugeMetricFamily]:
        partitions = sorted(self._partitions().items())
        for suffix, documentation, read in _GAUGES:
            family = GaugeMetricFamily(
                f"waltz_server_partition_{suffix}", documentation, labels=["partition"]
            )
            for pid, partition in partitions:
                family.add_metric([str(pid)], read(partition))
            yield family
        lag = GaugeMetricFamily(
            "waltz_server_partition_catch_up_lag_records",
            "Committed records a replica caught up in the background lacks: the session's high-water "
            "mark minus the replica's last record (docs/design/recovery.md); gone once its catch-up ends.",
            labels=["partition", "replica"],
        )
        for pid, partition in partitions:
            for replica, records in partition.store.catch_up_lags.items():
                lag.add_metric([str(pid), replica], records)
        yield lag
        cache = GaugeMetricFamily(
            "waltz_server_partition_cache_lookups",
            "Feed cache and transaction data cache lookups, by cache and outcome.",
            labels=["partition", "cache", "outcome"],
        )
        for pid, p in partitions:
            for name, hits, misses in (
                ("feed", p.feed_cache_hits, p.feed_cache_misses),
                ("data", p.data_cache_hits, p.data_cache_misses),
            ):
                cache.add_metric([str(pid), name, "hit"], hits)
                cache.add_metric([str(pid), name, "miss"], misses)
        yield cache


class ServerMetrics:
    """The server's metrics registry."""

    def __init__(self, partitions: Callable[[], Mapping[int, Partition]]) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_PartitionCollector(partitions))
        # process_cpu_seconds_total, process_resident_memory_bytes, process_open_fds, ...
        ProcessCollector(registry=self.registry)
        self.committed_records = Counter(
            "waltz_server_committed_records",
            "Records committed, by partition.",
            ["partition"],
            registry=self.registry,
        )
        self.failed_appends = Counter(
            "waltz_server_failed_appends",
            "Appends not committed, by partition.",
            ["partition"],
            registry=self.registry,
        )
        self.commit_seconds = BatchedHistogram(
            "waltz_server_commit_seconds",
            "Time from receiving an append (client or admin) to its commit, in seconds.",
            buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0),
            registry=self.registry,
        )
