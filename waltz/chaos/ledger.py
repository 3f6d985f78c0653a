"""The ledger workload of ``waltz chaos``: the SmallBank mix of an application in client processes.

The application is found by its module's name (``--app``, the ledger example by default;
docs/design/overview.md, "Workloads"), and the ledger example's money is conserved when it is the
workload (docs/chaos.md "The checks"). The coordinator prepares the shared application database
and opens the accounts (:func:`prepare_ledger`); each client process runs one instance of the
application (the ledger's: a ``LedgerService`` with its transfer sweeper) on that database and
draws its share of the SmallBank mix (:func:`run_ledger_worker`); at the end the checks of
:func:`waltz.workloads.checks.check_application` (applied exactly once, the log read back,
replicas identical, and the application's own invariants: for the ledger money conserved counting
money in flight, transfers exactly once, balance rules) are reused as chaos checks
(:func:`ledger_checks`).

This module imports SQLAlchemy and the application: it is only imported for ``--workload ledger``.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Mapping
from multiprocessing.connection import Connection
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event
from typing import Any

from waltz.chaos.checks import ChaosCheck
from waltz.client import WaltzClientConfig
from waltz.jdbc_style import create_framework_engine
from waltz.local.cluster import LocalCluster
from waltz.local.processes import wait_until
from waltz.workloads.application import SmallBankApplication, SmallBankInstance, load_application
from waltz.workloads.checks import check_application
from waltz.workloads.smallbank import SmallBankConfig, SmallBankWorkload

__all__ = ["ledger_checks", "prepare_ledger", "run_ledger_worker", "wait_transfers_settled"]

#: Seconds between the instances' scans for pending cross-partition steps.
SWEEP_INTERVAL = 0.5


def _instance(
    app: SmallBankApplication, db_url: str, zookeeper: str, cluster_root: str, batch: bool = False
) -> SmallBankInstance:
    """An instance of the application on the run's cluster; the log's name is the application's.
    ``batch`` is passed only when true, so an application that does not batch may leave it out."""
    config = WaltzClientConfig(zookeeper_connect_string=zookeeper, cluster_root=cluster_root)
    if batch:
        return app.instance(db_url, config, cluster_name=app.name, sweep_interval=SWEEP_INTERVAL, batch=True)
    return app.instance(db_url, config, cluster_name=app.name, sweep_interval=SWEEP_INTERVAL)


def _workload(service: SmallBankInstance, accounts: int, seed: int, in_flight: int) -> SmallBankWorkload:
    # No deactivations: each worker runs its share in chunks, and SmallBank deactivates half-way
    # through each run() call.
    config = SmallBankConfig(accounts=accounts, seed=seed, in_flight=in_flight, deactivate=0)
    return SmallBankWorkload([service], config)


def prepare_ledger(
    app: str, db_url: str, zookeeper: str, cluster_root: str, accounts: int, seed: int
) -> None:
    """Migrate the database and open ``accounts`` SmallBank accounts through an instance.

    Args:
        app: the application's module.
        db_url: the shared application database.
        zookeeper: ZooKeeper connect string of the cluster.
        cluster_root: the cluster's root znode.
        accounts: SmallBank customers.
        seed: the seed of their opening balances.

    Raises:
        ConfigurationError: ``app`` names no SmallBank application.
        TimeoutError: the openings were not resolved within 300 s.
    """
    application = load_application(app)
    engine = create_framework_engine(db_url)
    try:
        application.prepare_database(engine)
    finally:
        engine.dispose()
    with contextlib.closing(_instance(application, db_url, zookeeper, cluster_root)) as service:
        workload = _workload(service, accounts, seed, 64)
        try:
            workload.populate()
        finally:
            workload.close()


def run_ledger_worker(
    *,
    app: str,
    index: int,
    db_url: str,
    zookeeper: str,
    cluster_root: str,
    accounts: int,
    seed: int,
    transactions: int,
    in_flight: int,
    batch: bool = False,
    conn: Connection,
    stop: Event,
    gate: Synchronized[float],
    wait_for_gate: Callable[[int, Callable[[], None]], None],
    apply_timeout: float,
) -> dict[str, Any]:
    """One client process's share of the SmallBank mix, then apply up to the final marks.

    Messages on ``conn`` as :mod:`waltz.chaos.worker`: ``ready``, ``progress`` (draws done, 0),
    ``submitted``; it then waits for ``("marks", {partition: mark})``. The instance runs the
    application of the module ``app``, through an ``EntityBatcher`` when ``batch`` is true
    (docs/design/sql.md "Batched entity transactions").

    Returns:
        The worker's result: ``ledger`` holds the SmallBank counts and errors.

    Raises:
        TimeoutError: the marks never came, or were not applied within ``apply_timeout`` seconds.
    """
    instance = _instance(load_application(app), db_url, zookeeper, cluster_root, batch)
    with contextlib.closing(instance) as service:
        service.client.wait_mounted(120)
        conn.send(("ready", service.client.client_id))
        workload = _workload(service, accounts, seed * 1000 + index + 1, in_flight)
        totals: dict[str, Any] = {"committed": 0, "dropped": 0, "lock_failures": 0, "errors": []}
        done = 0
        last = 0.0

        def report() -> None:
            nonlocal last
            if time.monotonic() - last >= 0.5:
                conn.send(("progress", done, 0))
                last = time.monotonic()

        chunk = max(1, min(100, transactions // 50))
        try:
            while done < transactions and not stop.is_set():
                wait_for_gate(done, report)
                if stop.is_set():
                    break
                allowed = max(1, math.ceil(gate.value * transactions) - done)
                n = min(chunk, transactions - done, allowed)
                stats = workload.run(n)
                totals["committed"] += stats.committed
                totals["dropped"] += stats.dropped
                totals["lock_failures"] += stats.lock_failures
                totals["errors"] += stats.errors[:10]
                done += n
                report()
        finally:
            workload.close()
        conn.send(("submitted", done, 0))
        if not conn.poll(apply_timeout + 600):
            raise TimeoutError(f"worker {index}: the coordinator never sent the final marks")
        kind, marks = conn.recv()
        if kind != "marks":
            raise RuntimeError(f"worker {index}: expected the final marks, got {kind!r}")
        for pid, mark in sorted(marks.items()):
            if mark >= 0 and not service.callbacks.wait_for(int(pid), int(mark), apply_timeout):
                raise TimeoutError(
                    f"worker {index}: partition {pid} not applied up to {mark} in {apply_timeout}s"
                )
        return {
            "worker": index,
            "client_id": service.client.client_id,
            "acked": [],
            "failed": [],
            "lock_failures": totals["lock_failures"],
            "partitions": {},
            "uncaught": [f"{service.callbacks.uncaught_count} apply exceptions"]
            if service.callbacks.uncaught_count
            else [],
            "ledger": {**totals, "draws": done},
        }


def wait_transfers_settled(app: str, db_url: str, timeout: float = 300.0) -> None:
    """Wait until every two-step transfer is credited or refunded (the workers' sweepers run).

    Raises:
        TimeoutError: transfers still pending after ``timeout`` seconds.
    """
    application = load_application(app)
    engine = create_framework_engine(db_url)
    try:
        wait_until(
            lambda: application.pending_steps(engine) == 0,
            timeout=timeout,
            what="every two-step transfer to be credited or refunded",
        )
    finally:
        engine.dispose()


def ledger_checks(
    app: str,
    db_url: str,
    cluster: LocalCluster,
    marks: Mapping[int, int],
    worker_ledgers: list[Mapping[str, Any]],
) -> list[ChaosCheck]:
    """The application's checks (for the ledger: money conserved and the rest) as chaos checks.

    Args:
        app: the application's module.
        db_url: the shared application database.
        cluster: the running cluster (its log is read again from the start, and its replicas).
        marks: partition -> the servers' high-water mark.
        worker_ledgers: the ``ledger`` part of every worker's result.
    """
    application = load_application(app)
    engine = create_framework_engine(db_url)
    try:
        replicas = cluster.replica_digests(marks, timeout=120.0)
        found = check_application(
            application,
            engine,
            cluster_name=application.name,
            server_marks=dict(marks),
            client_config=WaltzClientConfig(**cluster.client_settings()),
            replicas=replicas,
        )
        checks = [ChaosCheck(f"ledger: {c.name}", c.passed, c.detail) for c in found]
    finally:
        engine.dispose()
    errors = [e for w in worker_ledgers for e in w.get("errors", [])]
    committed = sum(int(w.get("committed", 0)) for w in worker_ledgers)
    dropped = sum(int(w.get("dropped", 0)) for w in worker_ledgers)
    checks.append(
        ChaosCheck(
            "ledger: the SmallBank mix raised no error",
            not errors,
            f"{committed} committed, {dropped} dropped by the rules"
            if not errors
            else f"{len(errors)} errors: {errors[:3]}",
        )
    )
    return checks
