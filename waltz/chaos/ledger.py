"""The ledger workload of ``waltz chaos``: the SmallBank mix of ``waltz_examples.ledger`` in client processes.

The ledger example's money is conserved when it is the workload (docs/chaos.md "The checks"). The
coordinator prepares the shared application database and opens the accounts
(:func:`prepare_ledger`); each client process runs one
:class:`~waltz_examples.ledger.service.LedgerService` (with its transfer sweeper) on that database
and draws its share of the SmallBank mix (:func:`run_ledger_worker`); at the end the ledger's own
invariants (:func:`waltz_examples.ledger.checks.run_checks`: applied exactly once, money conserved
counting money in flight, transfers exactly once, balance rules, replicas identical) are reused as
chaos checks (:func:`ledger_checks`).

This module imports SQLAlchemy and the examples: it is only imported for ``--workload ledger``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from multiprocessing.connection import Connection
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event
from typing import Any

from waltz.chaos.checks import ChaosCheck
from waltz.jdbc_style import create_framework_engine
from waltz.local.cluster import LocalCluster
from waltz.local.processes import wait_until
from waltz.workloads.smallbank import SmallBankConfig, SmallBankWorkload
from waltz_examples.ledger.checks import read_log as read_ledger_log
from waltz_examples.ledger.checks import run_checks
from waltz_examples.ledger.service import LedgerService, prepare_database
from waltz_examples.ledger.transfers import pending_transfers

__all__ = ["ledger_checks", "prepare_ledger", "run_ledger_worker", "wait_transfers_settled"]

#: The name of the log in the ledger database's mark rows.
CLUSTER_NAME = "ledger"


def _workload(service: LedgerService, accounts: int, seed: int, in_flight: int) -> SmallBankWorkload:
    # No deactivations: each worker runs its share in chunks, and SmallBank deactivates half-way
    # through each run() call.
    config = SmallBankConfig(accounts=accounts, seed=seed, in_flight=in_flight, deactivate=0)
    return SmallBankWorkload([service], config)


def prepare_ledger(db_url: str, zookeeper: str, cluster_root: str, accounts: int, seed: int) -> None:
    """Migrate the database and open ``accounts`` SmallBank accounts through a ledger instance.

    Raises:
        TimeoutError: the openings were not resolved within 300 s.
    """
    engine = create_framework_engine(db_url)
    try:
        prepare_database(engine)
    finally:
        engine.dispose()
    with LedgerService(
        db_url, zookeeper=zookeeper, cluster_root=cluster_root, cluster_name=CLUSTER_NAME, prepare=False
    ) as service:
        workload = _workload(service, accounts, seed, 64)
        try:
            workload.populate()
        finally:
            workload.close()


def run_ledger_worker(
    *,
    index: int,
    db_url: str,
    zookeeper: str,
    cluster_root: str,
    accounts: int,
    seed: int,
    transactions: int,
    in_flight: int,
    conn: Connection,
    stop: Event,
    gate: Synchronized[float],
    wait_for_gate: Callable[[int, Callable[[], None]], None],
    apply_timeout: float,
) -> dict[str, Any]:
    """One client process's share of the SmallBank mix, then apply up to the final marks.

    Messages on ``conn`` as :mod:`waltz.chaos.worker`: ``ready``, ``progress`` (draws done, 0),
    ``submitted``; it then waits for ``("marks", {partition: mark})``.

    Returns:
        The worker's result: ``ledger`` holds the SmallBank counts and errors.

    Raises:
        TimeoutError: the marks never came, or were not applied within ``apply_timeout`` seconds.
    """
    with LedgerService(
        db_url, zookeeper=zookeeper, cluster_root=cluster_root, cluster_name=CLUSTER_NAME, prepare=False
    ) as service:
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


def wait_transfers_settled(db_url: str, timeout: float = 300.0) -> None:
    """Wait until every two-step transfer is credited or refunded (the workers' sweepers run).

    Raises:
        TimeoutError: transfers still pending after ``timeout`` seconds.
    """
    engine = create_framework_engine(db_url)
    try:
        wait_until(
            lambda: pending_transfers(engine) == 0,
            timeout=timeout,
            what="every two-step transfer to be credited or refunded",
        )
    finally:
        engine.dispose()


def ledger_checks(
    db_url: str, cluster: LocalCluster, marks: Mapping[int, int], worker_ledgers: list[Mapping[str, Any]]
) -> list[ChaosCheck]:
    """The ledger's invariants (money conserved and the rest) as chaos checks.

    Args:
        db_url: the shared application database.
        cluster: the running cluster (its log is read again from the start, and its replicas).
        marks: partition -> the servers' high-water mark.
        worker_ledgers: the ``ledger`` part of every worker's result.
    """
    engine = create_framework_engine(db_url)
    try:
        tally = read_ledger_log(cluster.zookeeper_connect_string, cluster.root, dict(marks))
        replicas = cluster.replica_digests(marks, timeout=120.0)
        checks = [
            ChaosCheck(f"ledger: {c.name}", c.passed, c.detail)
            for c in run_checks(
                engine, cluster_name=CLUSTER_NAME, server_marks=dict(marks), tally=tally, replicas=replicas
            )
        ]
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
