"""The counters of a client's entity batchers, in that client's Prometheus registry.

Source: docs/design/sql.md "Batched entity transactions". Every
:class:`~waltz.jdbc_style.entity_batches.EntityBatcher` of one client adds to one
:class:`BatcherCounts`, registered once in the client's registry (``WaltzClient.metrics``), so
the counts of several batchers add up and outlive a closed one. As the client's own counters
(:mod:`waltz.client.metrics`), nothing goes through ``prometheus_client`` per event: the counts are
plain integers under a lock, read when the registry is collected.

Metric names (``partition`` label: the partition of the log transaction):

- ``waltz_client_entity_batches_total``: log transactions of more than one context that a batcher
  sent and saw committed.
- ``waltz_client_entity_batch_members_total``: the contexts those log transactions carried that
  committed with them (not those that left a batch with an outcome of their own).
- ``waltz_client_entity_batches_lingered_total``: log transactions that waited for the linger
  (``client.batchLinger``) before they were sent: zero while the partition's contexts come less
  often than three per linger.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

__all__ = ["BatcherCounts", "batcher_counts", "counts_in"]

_BATCHES, _MEMBERS, _LINGERED = range(3)

#: The counts of each client registry that a batcher has counted in.
_COUNTS: weakref.WeakKeyDictionary[CollectorRegistry, BatcherCounts] = weakref.WeakKeyDictionary()
_COUNTS_LOCK = threading.Lock()


class BatcherCounts(Collector):
    """The batchers' counts of one client, by partition (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[int, list[int]] = {}

    def _row(self, partition: int) -> list[int]:
        row = self._counts.get(partition)
        if row is None:
            row = self._counts[partition] = [0, 0, 0]
        return row

    def committed(self, partition: int, members: int) -> None:
        """A log transaction of ``members`` contexts (more than one) committed on ``partition``."""
        with self._lock:
            row = self._row(partition)
            row[_BATCHES] += 1
            row[_MEMBERS] += members

    def lingered(self, partition: int) -> None:
        """A log transaction of ``partition`` waited for the linger before it was sent."""
        with self._lock:
            self._row(partition)[_LINGERED] += 1

    def totals(self) -> tuple[int, int, int]:
        """``(batches, members, lingered)`` over every partition."""
        with self._lock:
            rows = list(self._counts.values())
        return (
            sum(row[_BATCHES] for row in rows),
            sum(row[_MEMBERS] for row in rows),
            sum(row[_LINGERED] for row in rows),
        )

    def collect(self) -> Iterator[CounterMetricFamily]:
        with self._lock:
            rows = {partition: list(row) for partition, row in self._counts.items()}
        families = [
            CounterMetricFamily(
                "waltz_client_entity_batches",
                "Log transactions of more than one context an entity batcher saw committed, by partition.",
                labels=["partition"],
            ),
            CounterMetricFamily(
                "waltz_client_entity_batch_members",
                "Contexts carried by the entity batchers' committed log transactions of more than one, "
                "by partition.",
                labels=["partition"],
            ),
            CounterMetricFamily(
                "waltz_client_entity_batches_lingered",
                "Log transactions of an entity batcher that waited for the linger (client.batchLinger) "
                "before they were sent, by partition.",
                labels=["partition"],
            ),
        ]
        for partition in sorted(rows):
            for index, family in enumerate(families):
                family.add_metric([str(partition)], rows[partition][index])
        yield from families


def counts_in(registry: CollectorRegistry) -> BatcherCounts | None:
    """The batchers' counts of the client whose registry is ``registry``; None when no batcher
    of that client has counted (nothing is registered)."""
    with _COUNTS_LOCK:
        return _COUNTS.get(registry)


def batcher_counts(registry: CollectorRegistry) -> BatcherCounts:
    """The batchers' counts of the client whose registry is ``registry``, registered in it at the
    first call."""
    with _COUNTS_LOCK:
        counts = _COUNTS.get(registry)
        if counts is None:
            counts = _COUNTS[registry] = BatcherCounts()
            registry.register(counts)
        return counts
