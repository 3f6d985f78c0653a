"""Prometheus metrics of a server: per partition, read from the partitions when scraped."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from waltz.services.server.partition import Partition

__all__ = ["ServerMetrics"]


class _PartitionCollector(Collector):
    def __init__(self, partitions: Callable[[], Mapping[int, Partition]]) -> None:
        self._partitions = partitions

    def collect(self) -> Iterator[GaugeMetricFamily]:
        families = {
            "high_water_mark": GaugeMetricFamily(
                "waltz_server_partition_high_water_mark", "Committed high-water mark.", labels=["partition"]
            ),
            "generation": GaugeMetricFamily(
                "waltz_server_partition_generation",
                "Generation under which this server owns it.",
                labels=["partition"],
            ),
            "writable": GaugeMetricFamily(
                "waltz_server_partition_writable", "1 while a store session writes.", labels=["partition"]
            ),
            "replicas": GaugeMetricFamily(
                "waltz_server_partition_replicas_in_session",
                "Replicas the store session writes to.",
                labels=["partition"],
            ),
            "sessions": GaugeMetricFamily(
                "waltz_server_partition_store_sessions",
                "Store sessions (recoveries) started.",
                labels=["partition"],
            ),
            "batches": GaugeMetricFamily(
                "waltz_server_partition_store_batches",
                "Append batches sent to the replicas.",
                labels=["partition"],
            ),
            "appends": GaugeMetricFamily(
                "waltz_server_partition_appends",
                "Append requests accepted for the store.",
                labels=["partition"],
            ),
            "lock_failures": GaugeMetricFamily(
                "waltz_server_partition_lock_failures",
                "Append requests refused by the lock check.",
                labels=["partition"],
            ),
            "dropped": GaugeMetricFamily(
                "waltz_server_partition_dropped_requests",
                "Requests dropped: another generation, or an older connection of the client.",
                labels=["partition"],
            ),
            "feeds": GaugeMetricFamily(
                "waltz_server_partition_mounted_clients",
                "Client connections receiving the feed.",
                labels=["partition"],
            ),
            "cache": GaugeMetricFamily(
                "waltz_server_partition_cache_lookups",
                "Feed cache and transaction data cache lookups, by cache and outcome.",
                labels=["partition", "cache", "outcome"],
            ),
            "queued": GaugeMetricFamily(
                "waltz_server_partition_pending_records",
                "Records waiting or in flight.",
                labels=["partition"],
            ),
        }
        for pid, owned in sorted(self._partitions().items()):
            label = [str(pid)]
            families["appends"].add_metric(label, owned.appends)
            families["lock_failures"].add_metric(label, owned.lock_failures)
            families["dropped"].add_metric(label, owned.dropped)
            families["feeds"].add_metric(label, owned.mounted_clients)
            for cache, hits, misses in (
                ("feed", owned.feed_cache_hits, owned.feed_cache_misses),
                ("data", owned.data_cache_hits, owned.data_cache_misses),
            ):
                families["cache"].add_metric([*label, cache, "hit"], hits)
                families["cache"].add_metric([*label, cache, "miss"], misses)
            partition = owned.store
            families["high_water_mark"].add_metric(label, partition.high_water_mark)
            families["generation"].add_metric(label, partition.generation)
            families["writable"].add_metric(label, 1.0 if partition.writable else 0.0)
            families["replicas"].add_metric(label, len(partition.replicas_in_session))
            families["sessions"].add_metric(label, partition.sessions_started)
            families["queued"].add_metric(label, partition.pending_records)
            families["batches"].add_metric(label, partition.batches_sent)
        yield from families.values()


class ServerMetrics:
    """The server's metrics registry."""

    def __init__(self, partitions: Callable[[], Mapping[int, Partition]]) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_PartitionCollector(partitions))
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
        self.commit_seconds = Histogram(
            "waltz_server_commit_seconds",
            "Time from receiving an append (client or admin) to its commit, in seconds.",
            registry=self.registry,
            buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0),
        )
