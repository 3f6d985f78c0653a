"""Process-wide tuning for throughput: the garbage collector.

Every layer of Waltz allocates a few short-lived objects per transaction (protobuf messages,
futures, feed entries). With CPython's default thresholds (700, 10, 10) the collector runs a young
collection every few hundred transactions and a full one, over every object of the process, every
hundred young ones, a cost that grows with the live objects of the process. Hot processes
therefore collect less often (docs/decisions/0015-garbage-collector-tuning.md).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["tune_garbage_collector", "tuned_garbage_collector"]

#: Young-generation threshold after tuning (allocations minus deallocations of tracked objects).
YOUNG_THRESHOLD = 50_000


def tune_garbage_collector() -> None:
    """Move the objects alive now out of the collector's way and collect young objects less often.

    Call it once, after start-up (imports, configuration, connections), in a process whose hot path
    is Waltz: the storage and server processes do it themselves; an application embedding
    :class:`~waltz.WaltzClient` decides for itself (``waltz perf`` and the benchmarks call it). It
    changes process-wide settings: ``gc.freeze()`` then ``gc.set_threshold(50_000, 20, 100)``.
    Reference cycles are still collected, only less often; memory held by garbage cycles can grow
    by up to about the young threshold's worth of objects between collections.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, 20, 100)


@contextmanager
def tuned_garbage_collector() -> Iterator[None]:
    """:func:`tune_garbage_collector` for the duration of a block, then the previous settings back.

    For code that runs a hot phase inside a longer-lived process (``waltz perf`` run in-process,
    tests): the thresholds are restored and the frozen objects unfrozen at the end.
    """
    thresholds = gc.get_threshold()
    was_frozen = gc.get_freeze_count() > 0
    tune_garbage_collector()
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        if not was_frozen:
            gc.unfreeze()
