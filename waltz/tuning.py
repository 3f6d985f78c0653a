"""Process-wide tuning for throughput: the garbage collector, and gRPC core's I/O.

Every layer of Waltz allocates a few short-lived objects per transaction (protobuf messages,
futures, feed entries). With CPython's default thresholds (700, 10, 10) the collector runs a young
collection every few hundred transactions and a full one, over every object of the process, every
hundred young ones, a cost that grows with the live objects of the process. Hot processes
therefore collect less often (docs/decisions/0015-garbage-collector-tuning.md).

Every hop of a commit is a gRPC stream message, and at low load every message wakes a process;
gRPC core's EventEngine costs more per message than its older I/O manager, so Waltz's own processes
start with the EventEngine's client and listener turned off
(docs/decisions/0080-grpc-core-without-the-event-engine.md). They fork only to run another program
(Spark's JVM, PostgreSQL's tools), so gRPC core's fork handlers are off as well: with other threads
in gRPC they print a line on every such fork, and they have made a child die before it ran its
program (docs/decisions/0082-grpc-fork-handlers-off.md).
"""

from __future__ import annotations

import gc
import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import MappingProxyType
from typing import Final

__all__ = [
    "GRPC_ENVIRONMENT",
    "GRPC_EXPERIMENTS",
    "GRPC_FORK_SUPPORT",
    "grpc_experiments_in_effect",
    "grpc_fork_support_in_effect",
    "tune_garbage_collector",
    "tune_grpc_fork_support",
    "tune_grpc_transport",
    "tuned_garbage_collector",
]

log = logging.getLogger(__name__)

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


#: The value of gRPC core's ``GRPC_EXPERIMENTS`` environment variable that
#: :func:`tune_grpc_transport` sets: the EventEngine's client channels and listeners off, so gRPC
#: core runs them on its I/O manager (iomgr). Both experiments are known to the pinned grpcio
#: (``tests/test_tuning.py`` checks it starts without an "Unknown experiment" error).
GRPC_EXPERIMENTS: Final = "-event_engine_client,-event_engine_listener"

#: The environment variable gRPC core reads its experiments from, once, when ``grpc`` is imported.
_VARIABLE: Final = "GRPC_EXPERIMENTS"

#: What :func:`grpc_experiments_in_effect` says when nothing was set.
_DEFAULTS: Final = "(gRPC's defaults)"


def tune_grpc_transport() -> bool:
    """Have gRPC core carry this process's streams on its I/O manager instead of its EventEngine.

    Sets the environment variable ``GRPC_EXPERIMENTS`` to :data:`GRPC_EXPERIMENTS`, which the
    processes this one starts inherit. gRPC core reads the variable once, when ``grpc`` is first
    imported, so call this first thing in ``main``: the ``waltz`` command and the storage and
    server processes do it themselves; an application embedding :class:`~waltz.WaltzClient`
    decides for itself (or sets the variable in its environment). Measured on a 2-core VM: a
    stream message costs the sending and the receiving process 15 to 46 % less CPU; at a tenth of
    SmallBank's load the p50 submit -> applied fell by about a third (median 14.9 to 10.0 ms) and
    the p99 median from 64.5 to 52.0 ms, lower in 3 pairs of 5
    (docs/decisions/0080-grpc-core-without-the-event-engine.md).

    Returns:
        True if it set the variable; False, changing nothing, when ``GRPC_EXPERIMENTS`` is already
        in the environment (the operator's choice, an empty value included: gRPC's own defaults)
        or when ``grpc`` is already imported (too late for this process: its children would differ
        from it).
    """
    return _set_before_grpc(_VARIABLE, GRPC_EXPERIMENTS)


def grpc_experiments_in_effect() -> str:
    """The gRPC core experiments this process runs with, as a node logs them at start-up.

    Returns:
        The value of ``GRPC_EXPERIMENTS`` now, which is what gRPC read when ``grpc`` was imported
        unless something changed the variable since, or ``"(gRPC's defaults)"`` when it is unset
        or empty.
    """
    return os.environ.get(_VARIABLE) or _DEFAULTS


#: The value of gRPC core's ``GRPC_ENABLE_FORK_SUPPORT`` environment variable that
#: :func:`tune_grpc_fork_support` sets: no fork handlers.
GRPC_FORK_SUPPORT: Final = "false"

#: The environment variable gRPC core reads its fork support from, once, when ``grpc`` is imported.
_FORK_VARIABLE: Final = "GRPC_ENABLE_FORK_SUPPORT"


def tune_grpc_fork_support() -> bool:
    """Turn gRPC core's fork handlers off in this process and the processes it starts.

    Sets the environment variable ``GRPC_ENABLE_FORK_SUPPORT`` to :data:`GRPC_FORK_SUPPORT`.
    gRPC's fork handlers prepare a child that goes on using gRPC after ``fork()`` without ``exec``;
    Waltz's processes never make one: they start processes with ``spawn`` or run another program
    (Spark's JVM, whose launcher forks because it passes ``preexec_fn``; PostgreSQL's tools). With
    gRPC's default, every such fork while other threads are in gRPC printed
    ``fork_posix.cc:71] Other threads are currently calling into gRPC, skipping fork() handlers``,
    at times with an ``epoll_wait error: Bad file descriptor`` line after it, into the output of
    ``waltz demo`` and ``waltz rebuild``, and now and then the handlers killed the child (SIGABRT)
    before it ran the program: 4 forks of 180 in a test, none of 150 with the handlers off. The
    same rules and callers as :func:`tune_grpc_transport`
    (docs/decisions/0082-grpc-fork-handlers-off.md).

    Returns:
        True if it set the variable; False, changing nothing, when ``GRPC_ENABLE_FORK_SUPPORT`` is
        already in the environment (the operator's choice) or when ``grpc`` is already imported.
    """
    return _set_before_grpc(_FORK_VARIABLE, GRPC_FORK_SUPPORT)


#: Every variable :func:`tune_grpc_transport` and :func:`tune_grpc_fork_support` set, with its value:
#: for a process started with an environment of its own (``env.setdefault`` keeps the operator's).
GRPC_ENVIRONMENT: Final = MappingProxyType({_VARIABLE: GRPC_EXPERIMENTS, _FORK_VARIABLE: GRPC_FORK_SUPPORT})


def grpc_fork_support_in_effect() -> str:
    """The value of ``GRPC_ENABLE_FORK_SUPPORT`` now, as a node logs it at start-up, or
    ``"(gRPC's default)"`` when it is unset or empty."""
    return os.environ.get(_FORK_VARIABLE) or "(gRPC's default)"


def _set_before_grpc(variable: str, value: str) -> bool:
    """Set the environment ``variable`` that gRPC core reads when it is imported, unless it is
    already set or ``grpc`` is already imported; True if it was set."""
    if variable in os.environ:
        return False
    if "grpc" in sys.modules:
        log.debug("grpc is already imported: %s stays as it is", variable)
        return False
    os.environ[variable] = value
    return True
