"""Prometheus metrics of a storage node (one registry per node, so several can share a process)."""

from __future__ import annotations

import contextlib
from typing import NamedTuple

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector

__all__ = ["PartitionAppendMetrics", "StorageMetrics"]


class PartitionAppendMetrics(NamedTuple):
    """One partition's append metrics, resolved once (``labels()`` looks its arguments up each
    time it is called: a few microseconds for each of the five per append batch)."""

    flushes: Counter  # waltz_storage_append_flushes{partition}
    records: Counter  # waltz_storage_appended_records{partition}
    data_bytes: Counter  # waltz_storage_appended_bytes{partition}
    max_transaction_id: Gauge  # waltz_storage_max_transaction_id{partition}


class StorageMetrics:
    """The storage node's metrics.

    Attributes:
        registry: the registry holding them (served on ``/metrics`` and by the admin port).
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        # process_cpu_seconds_total, process_resident_memory_bytes, process_open_fds, ...
        ProcessCollector(registry=self.registry)
        self.requests = Counter(
            "waltz_storage_requests",
            "Storage and admin requests handled, by request type and outcome (ok or failure code).",
            ["type", "outcome"],
            registry=self.registry,
        )
        self.appended_records = Counter(
            "waltz_storage_appended_records",
            "Records appended and flushed, by partition.",
            ["partition"],
            registry=self.registry,
        )
        self.appended_bytes = Counter(
            "waltz_storage_appended_bytes",
            "Transaction data bytes appended and flushed, by partition.",
            ["partition"],
            registry=self.registry,
        )
        self.append_flushes = Counter(
            "waltz_storage_append_flushes",
            "Append batches written with one data flush (fdatasync) each (group commit), by partition.",
            ["partition"],
            registry=self.registry,
        )
        self.append_seconds = Histogram(
            "waltz_storage_append_seconds",
            "Time to write and flush one append batch, in seconds.",
            registry=self.registry,
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0),
        )
        self.max_transaction_id = Gauge(
            "waltz_storage_max_transaction_id",
            "The highest transaction ID stored, by partition (not necessarily committed).",
            ["partition"],
            registry=self.registry,
        )
        # Retention (docs/design/archive.md, "Retention on the storage nodes").
        self.retention_deleted_segments = Counter(
            "waltz_storage_retention_deleted_segments",
            "Segments retention deleted (archived, past the keep settings), by partition.",
            ["partition"],
            registry=self.registry,
        )
        self.retention_deleted_bytes = Counter(
            "waltz_storage_retention_deleted_bytes",
            "Bytes of segment data files retention deleted, by partition.",
            ["partition"],
            registry=self.registry,
        )
        self.local_start = Gauge(
            "waltz_storage_local_start",
            "The first transaction ID held on this node's disk, by partition.",
            ["partition"],
            registry=self.registry,
        )
        self.archived_through = Gauge(
            "waltz_storage_archived_through",
            "What the archiver last said is archived (-1: nothing), by partition.",
            ["partition"],
            registry=self.registry,
        )
        self._partition_appends: dict[int, PartitionAppendMetrics] = {}
        self.appends_ok = self.requests.labels("append", "ok")  # once per append batch

    def partition_appends(self, partition_id: int) -> PartitionAppendMetrics:
        """The metrics an append batch of ``partition_id`` updates (made once per partition)."""
        found = self._partition_appends.get(partition_id)
        if found is None:
            label = str(partition_id)
            found = self._partition_appends[partition_id] = PartitionAppendMetrics(
                self.append_flushes.labels(label),
                self.appended_records.labels(label),
                self.appended_bytes.labels(label),
                self.max_transaction_id.labels(label),
            )
        return found

    def set_retention_state(self, partition_id: int, local_start: int, archived_through: int) -> None:
        """Set a partition's local start and archived-through gauges."""
        label = str(partition_id)
        self.local_start.labels(label).set(local_start)
        self.archived_through.labels(label).set(archived_through)

    def forget_partition(self, partition_id: int) -> None:
        """Drop a partition's local start and archived-through gauges (it left the node)."""
        label = str(partition_id)
        for gauge in (self.local_start, self.archived_through):
            with contextlib.suppress(KeyError):  # never set
                gauge.remove(label)

    def snapshot(self) -> dict[str, float]:
        """Return every sample as ``name{label="value",...}`` -> value (for the admin port)."""
        values: dict[str, float] = {}
        for metric in self.registry.collect():
            for sample in metric.samples:
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
                values[f"{sample.name}{{{labels}}}" if labels else sample.name] = float(sample.value)
        return values
