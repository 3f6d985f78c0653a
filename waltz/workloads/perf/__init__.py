"""``waltz perf smallbank``: the SmallBank mix from N instance processes of an application on one
database; and ``waltz perf inventory``, reservations of hot SKUs under idempotency keys, on the same
machinery (:mod:`~waltz.workloads.perf.inventory_run`).

It measures the application path as a user sees it (docs/design/overview.md, "Workloads"): an
instance of the SmallBank application (the ledger example's by default: a ``LedgerService``, with
its Waltz client, SQL change-set callbacks and transfer sweeper) per process, as a deployment runs
one instance per process (instances in one process would share one GIL), all on one shared
database.

1. :func:`check_database`: the database is reachable and empty, or holds only the application's
   tables (and, for a new log, no marks of another one); :func:`perf_database` makes a temporary
   SQLite database when none is given.
2. :func:`run_smallbank` migrates the database, opens the accounts once (one instance in this
   process, closed before the measured phase) and waits until they are applied; then starts
   ``instances`` processes (``spawn``), each with its own instance and its share of the draws with
   its own seed. Each mounts, reads one balance (a warm-up), reports ready and waits for the start
   event: the measured phase starts together, so committed/s covers one window, from the start to
   the end of the last instance's mix (every transaction resolved).
3. Each instance times, per log transaction of its mix that committed, submit -> commit and
   submit -> applied (its own client applied it: read-your-writes), in HdrHistograms
   (:class:`~waltz.workloads.smallbank.SmallBankStats`); dropped transactions and errors
   are counted. The histograms cross processes encoded and are merged here.
4. The instances' sweepers keep finishing two-step transfers until none is pending; the
   instances then stop, an instance in this process applies the log up to the servers'
   high-water marks, and the run is checked (:func:`waltz.workloads.checks.check_application`,
   without the replica comparison: the run does not know the cluster's nodes).

The modules: :mod:`~waltz.workloads.perf.settings` (what a run does), ``database`` (step 1),
``processes`` (the instance processes and their messages, shared by both runs), ``runner`` (the
coordinator), ``instance`` (an instance process), ``report`` (the figures); for ``inventory``,
``inventory_run`` (its coordinator and instance process) and ``inventory_report``.

Every wait is bounded; on an error, a timeout or Ctrl-C the instance processes are killed and
reaped. Figures are reported, never asserted.
"""

from __future__ import annotations

from waltz.workloads.perf.database import UnusableDatabaseError, check_database, perf_database
from waltz.workloads.perf.inventory_report import InventoryPerfReport
from waltz.workloads.perf.inventory_run import InventoryRunError, run_inventory
from waltz.workloads.perf.processes import PerfRunError
from waltz.workloads.perf.report import InstanceFigures, SmallBankPerfReport
from waltz.workloads.perf.runner import SmallBankRunError, run_smallbank
from waltz.workloads.perf.settings import InventoryPerfSettings, SmallBankPerfSettings

__all__ = [
    "InstanceFigures",
    "InventoryPerfReport",
    "InventoryPerfSettings",
    "InventoryRunError",
    "PerfRunError",
    "SmallBankPerfReport",
    "SmallBankPerfSettings",
    "SmallBankRunError",
    "UnusableDatabaseError",
    "check_database",
    "perf_database",
    "run_inventory",
    "run_smallbank",
]
