"""Prometheus metrics of the archiver (``waltz archive run --metrics-port``).

Source: docs/design/archive.md "The archiver" (its metrics); docs/operations.md "Archiver
metrics" lists them for operators. One registry per archiver, so that several may share a
process (tests). The storage nodes' retention deletions are the storage node's own metrics
(``waltz_storage_retention_deleted_segments_total``, ``..._bytes_total``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge

from waltz.archive.manifests import ChunkEntry

__all__ = ["ArchiverMetrics", "RoundOutcome"]


class RoundOutcome(Protocol):
    """What the metrics read of a partition's round (:class:`~waltz.archive.archiver.PartitionRound`)."""

    partition_id: int
    high_water_mark: int
    archived_through: int
    error: str | None
    untold: dict[str, str]


class ArchiverMetrics:
    """The archiver's metrics: what it wrote, and how far each partition's archive lags.

    Attributes:
        registry: the registry holding them (served on ``/metrics``).
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.chunks = Counter(
            "waltz_archive_chunks",
            "Chunks written to the archive (adopted or written again included), by partition.",
            ["partition"],
            registry=self.registry,
        )
        self.records = Counter(
            "waltz_archive_records",
            "Records in the chunks written to the archive, by partition.",
            ["partition"],
            registry=self.registry,
        )
        self.bytes = Counter(
            "waltz_archive_bytes",
            "Bytes of the chunk files written to the archive, by partition.",
            ["partition"],
            registry=self.registry,
        )
        self.archived_through = Gauge(
            "waltz_archive_archived_through",
            "The last transaction archived and verified (-1: none), by partition.",
            ["partition"],
            registry=self.registry,
        )
        self.high_water_mark = Gauge(
            "waltz_archive_committed_high_water_mark",
            "The committed high-water mark the archiver last saw (-1: none), by partition.",
            ["partition"],
            registry=self.registry,
        )
        self.lag = Gauge(
            "waltz_archive_lag_transactions",
            "Committed transactions not yet archived: the committed high-water mark minus the "
            "archived-through, by partition.",
            ["partition"],
            registry=self.registry,
        )
        self.stopped = Gauge(
            "waltz_archive_partition_stopped",
            "1 when the partition's last round stopped with an error (see the archiver's log), else 0.",
            ["partition"],
            registry=self.registry,
        )
        self.untold = Gauge(
            "waltz_archive_replicas_not_told",
            "Replicas the partition's last round could not tell its archived-through (a node down, a "
            "certificate without the admin role): they keep their archived segments, by partition.",
            ["partition"],
            registry=self.registry,
        )
        self.rounds = Counter("waltz_archive_rounds", "Rounds over the partitions.", registry=self.registry)
        self.last_round = Gauge(
            "waltz_archive_last_round_timestamp_seconds",
            "When the last round ended (Unix time).",
            registry=self.registry,
        )

    def chunk_added(self, partition_id: int, entry: ChunkEntry) -> None:
        """Count a chunk recorded in a partition's manifest."""
        label = str(partition_id)
        self.chunks.labels(label).inc()
        self.records.labels(label).inc(entry.rows)
        self.bytes.labels(label).inc(entry.size_bytes)

    def round_done(self, results: Sequence[RoundOutcome]) -> None:
        """Set each partition's gauges from a round's outcome."""
        for result in results:
            label = str(result.partition_id)
            self.stopped.labels(label).set(0 if result.error is None else 1)
            self.untold.labels(label).set(len(result.untold))
            if result.error is not None:
                continue  # its marks were not all read: the last good values stay
            self.archived_through.labels(label).set(result.archived_through)
            self.high_water_mark.labels(label).set(result.high_water_mark)
            self.lag.labels(label).set(max(0, result.high_water_mark - result.archived_through))
        self.rounds.inc()
        self.last_round.set(time.time())

    def stopped_partitions(self) -> list[int]:
        """The partitions whose last round stopped with an error."""
        return sorted(
            int(sample.labels["partition"])
            for metric in self.stopped.collect()
            for sample in metric.samples
            if sample.value
        )
