"""A Prometheus histogram that takes its observations a batch at a time, for per-transaction timings.

``prometheus_client.Histogram.observe`` takes a lock and walks the buckets for every value (about a
microsecond each, with two more locked increments); the client and the server time every
transaction they commit, tens of thousands a second, so :class:`BatchedHistogram` finds a value's
bucket by bisection and adds a whole batch under one lock. It is a registry ``Collector`` that
exposes the same samples as ``prometheus_client.Histogram`` does for one unlabelled series
(``_bucket{le}`` cumulative, ``+Inf``, ``_count``, ``_sum``; the ``_created`` sample aside), built
by ``prometheus_client``'s own ``HistogramMetricFamily``.
"""

from __future__ import annotations

import math
import threading
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Sequence
from itertools import pairwise

from prometheus_client import CollectorRegistry
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

__all__ = ["BatchedHistogram"]


class BatchedHistogram(Collector):
    """One unlabelled Prometheus histogram, observed one value or a batch at a time (thread-safe).

    Args:
        name: the metric name (``<name>_bucket``, ``_count`` and ``_sum`` samples).
        documentation: its help text.
        buckets: upper bounds (``le``), strictly increasing; ``+Inf`` is added when missing.
        registry: where to register it (None: not registered).

    Raises:
        ValueError: no bucket, or bounds not strictly increasing.
    """

    def __init__(
        self,
        name: str,
        documentation: str,
        buckets: Sequence[float],
        registry: CollectorRegistry | None = None,
    ) -> None:
        bounds = [float(b) for b in buckets]
        if bounds and math.isinf(bounds[-1]):
            bounds.pop()
        if not bounds or any(a >= b for a, b in pairwise(bounds)):
            raise ValueError(f"histogram {name}: buckets must be strictly increasing, got {list(buckets)}")
        self.name = name
        self.documentation = documentation
        self._bounds = tuple(bounds)
        self._counts = [0] * (len(bounds) + 1)  # the last one: above every bound (+Inf only)
        self._sum = 0.0
        self._lock = threading.Lock()
        if registry is not None:
            registry.register(self)

    def observe(self, value: float) -> None:
        """Count one value (seconds, or whatever unit the name says)."""
        self.observe_all((value,))

    def observe_all(self, values: Iterable[float]) -> None:
        """Count several values under one lock."""
        bounds = self._bounds
        with self._lock:
            counts = self._counts
            total = 0.0
            for value in values:
                counts[bisect_left(bounds, value)] += 1
                total += value
            self._sum += total

    def collect(self) -> Iterator[HistogramMetricFamily]:
        """The histogram's samples now (called by the registry when it is scraped)."""
        with self._lock:
            counts = list(self._counts)
            total = self._sum
        cumulative = 0
        buckets: list[tuple[str, float]] = []
        for bound, count in zip((*self._bounds, math.inf), counts, strict=True):
            cumulative += count
            buckets.append((floatToGoString(bound), cumulative))  # type: ignore[no-untyped-call]
        yield HistogramMetricFamily(self.name, self.documentation, buckets=buckets, sum_value=total)
