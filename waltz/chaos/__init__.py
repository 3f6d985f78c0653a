"""``waltz chaos``: a local cluster under a seeded fault schedule, and the invariants it must keep.

The guide is docs/chaos.md. :func:`run_chaos` runs it (:mod:`waltz.chaos.runner`); the pieces are the
options (:mod:`waltz.chaos.options`), the TCP fault proxy (:mod:`waltz.chaos.proxy`), fault
schedules (:mod:`waltz.chaos.schedule`), the injector (:mod:`waltz.chaos.faults`), the client
processes (:mod:`waltz.chaos.worker`, coordinated by :mod:`waltz.chaos.clients`), the checks
(:mod:`waltz.chaos.checks`), and with ``--archive`` the archiver (:mod:`waltz.chaos.archiving`)
and the archive's checks (:mod:`waltz.chaos.archive_checks`). See ``docs/chaos.md``.
"""

from __future__ import annotations

from waltz.chaos.options import ChaosOptions, ChaosResult
from waltz.chaos.proxy import ClusterProxies, FaultProxy
from waltz.chaos.runner import run_chaos
from waltz.chaos.schedule import Fault, FaultKind, fixed_schedule, parse_fault_kinds, random_schedule

__all__ = [
    "ChaosOptions",
    "ChaosResult",
    "ClusterProxies",
    "Fault",
    "FaultKind",
    "FaultProxy",
    "fixed_schedule",
    "parse_fault_kinds",
    "random_schedule",
    "run_chaos",
]
