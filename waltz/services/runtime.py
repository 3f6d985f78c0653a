"""Process-wide runtime settings of the long-running services (storage nodes, servers)."""

from __future__ import annotations

import gc

__all__ = ["tune_garbage_collector"]


def tune_garbage_collector() -> None:
    """Move start-up objects out of the collector's way and collect young objects less often.

    The append path allocates many short-lived objects; the default thresholds make full
    collections (tens of milliseconds, measured with benchmarks/store_commit.py) frequent enough
    to dominate tail latency. Call once the service has started.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)
