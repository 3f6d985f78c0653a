"""A chaos client process: submits transactions with random write locks, applies the whole log.

Each worker is its own OS process (started with ``spawn`` by :mod:`waltz.chaos.runner`) with one
:class:`~waltz.client.client.WaltzClient`. Like upstream Waltz's smoke test it submits
``transactions`` transactions, each to a random partition with one WRITE lock drawn from a pool
and a random payload (:func:`~waltz.chaos.sequence.payload_for`), at most ``in_flight`` at once;
a lock failure makes the client run the context again (docs/design/locks.md "The compatibility rule").
A worker that has waited a second for a free slot flushes briefly, so that flush requests wait
on the servers that hold its stalled appends.
Meanwhile it applies every partition into a running checksum
(:class:`~waltz.chaos.sequence.ChecksumCallbacks`).

Messages to the coordinator on the pipe: ``("ready", client_id)``, ``("progress", acked,
failed)`` about twice a second, ``("submitted", acked, failed)``, then after it received
``("marks", {partition: mark})`` and applied up to them, ``("done", result_path)``; on an error
``("error", text)``. The result file is JSON: the number of submissions made (``submitted``:
sequences ``0..submitted-1``), acknowledged submissions ``[sequence, partition, transaction ID]``,
failed ones ``[sequence, error]``, lock failures, and per partition ``[mark, checksum, count,
errors]``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import random
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event
from pathlib import Path

from waltz.chaos.checks import DROPPED
from waltz.chaos.sequence import ChecksumCallbacks, counter_key_for, counter_payload, payload_for
from waltz.client import (
    Outcome,
    PartitionLocalLock,
    TransactionBuilder,
    TransactionContext,
    WaltzClient,
    WaltzClientConfig,
)
from waltz.errors import WaltzTimeoutError
from waltz.workloads.application import DEFAULT_APPLICATION

__all__ = ["ChaosAppend", "CounterIncrement", "WorkerSpec", "worker_main"]

log = logging.getLogger(__name__)

#: Seconds between progress messages.
_PROGRESS_INTERVAL = 0.5
#: Seconds a worker waits for a free slot before it flushes, as an application waiting for its
#: transactions would: the flush requests then wait on the owners of the stalled partitions
#: (docs/chaos.md "The fault schedule", ``pause-owner``).
_FLUSH_WHEN_STALLED = 1.0
#: The workers' ``client.longWaitThreshold``: a waiting flush sends its flush requests after this.
_NUDGE_AFTER = 0.2


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """What one chaos client process does.

    Attributes:
        index: the worker's index (the writer number in its payloads).
        zookeeper: ZooKeeper connect string.
        root: the cluster root znode.
        seed: the run's seed (payloads, partitions and locks are drawn from it).
        transactions: how many transactions to submit.
        in_flight: the most submissions without an outcome at once.
        lock_pool: write locks are drawn from ``0..lock_pool-1``.
        result_path: where the JSON result goes.
        stall_timeout: seconds without any outcome after which the worker gives up (an error).
        apply_timeout: seconds allowed to apply up to the final marks.
        log_path: the worker's log file.
        workload: ``raw`` or ``counter`` (this module), or ``ledger`` (:mod:`waltz.chaos.ledger`).
        db_url: the shared application database (ledger).
        accounts: SmallBank customers (ledger).
        app: the SmallBank application's module (ledger).
        batch: the instance submits through an ``EntityBatcher`` (ledger).
        namespace: the network namespace of the worker's host in namespace mode (joined before
            anything else), or None to stay in the machine's own.
    """

    index: int
    zookeeper: str
    root: str
    seed: int
    transactions: int
    in_flight: int
    lock_pool: int
    result_path: str
    stall_timeout: float = 180.0
    apply_timeout: float = 300.0
    log_path: str | None = None
    workload: str = "raw"
    db_url: str | None = None
    accounts: int = 200
    app: str = DEFAULT_APPLICATION
    batch: bool = False
    namespace: str | None = None


class ChaosAppend(TransactionContext):
    """One chaos transaction: a payload on a partition under one WRITE lock.

    The client high-water mark is what this client applied (the callbacks' mark), so the append
    fails the lock check when another client wrote the same lock since; the client then runs it
    again once it has applied more.
    """

    def __init__(self, partition: int, lock_id: int, payload: bytes, header: int) -> None:
        super().__init__()
        self.partition = partition
        self.lock = PartitionLocalLock("chaos", lock_id)
        self.payload = payload
        self.header = header
        self.lock_failures = 0

    def partition_id(self, num_partitions: int) -> int:
        return self.partition

    def routed(self, partition_id: int, num_partitions: int) -> None:
        # During a split, a new partition's context goes to its parent until the parent seals:
        # the acknowledgement names the partition that committed it.
        self.partition = partition_id

    def execute(self, builder: TransactionBuilder) -> bool:
        builder.set_header(self.header)
        builder.set_write_locks([self.lock])
        builder.set_raw_data(self.payload)
        return True

    def on_lock_failure(self) -> None:
        self.lock_failures += 1


class CounterIncrement(TransactionContext):
    """One counter increment: read the key's value, write value + 1.

    The read-modify-write of docs/design/overview.md "Why the log is the source of truth". The
    value and the high-water mark are read together from what this client applied; the WRITE
    lock on the key makes the server refuse the append when another increment of the key
    committed since, and the client then runs it again on fresher state. A lost update (two
    increments from the same value) would show in the log as a repeated value.
    """

    def __init__(
        self, callbacks: ChecksumCallbacks, partition: int, key: int, writer: int, sequence: int
    ) -> None:
        super().__init__()
        self.callbacks = callbacks
        self.partition = partition
        self.key = key
        self.lock = PartitionLocalLock("counter", key)
        self.writer = writer
        self.sequence = sequence
        self.lock_failures = 0

    def partition_id(self, num_partitions: int) -> int:
        # The key's partition at the count the client routes by: a split moves the key to its new
        # partition (docs/design/splits.md "Clients across a split").
        return self.key % num_partitions

    def routed(self, partition_id: int, num_partitions: int) -> None:
        self.partition = partition_id  # the mark read with the value is this partition's

    def execute(self, builder: TransactionBuilder) -> bool:
        mark, value = self.callbacks.snapshot(self.partition, self.key)
        builder.set_client_high_water_mark(mark)
        builder.set_header(self.writer)
        builder.set_write_locks([self.lock])
        builder.set_raw_data(counter_payload(self.writer, self.sequence, self.key, value + 1))
        return True

    def on_lock_failure(self) -> None:
        self.lock_failures += 1


class _Outcomes:
    """Outcomes of the submissions, filled in by the futures' callbacks."""

    def __init__(self, in_flight: int) -> None:
        self.lock = threading.Lock()
        self.slots = threading.Semaphore(in_flight)
        self.acked: list[tuple[int, int, int]] = []
        self.failed: list[tuple[int, str]] = []
        self.lock_failures = 0
        self.last_outcome = time.monotonic()
        self.submitted = 0
        """Submissions made: sequences ``0..submitted-1``, each with one outcome once it ended."""


def _wait_for_gate(
    spec: WorkerSpec, sequence: int, gate: Synchronized[float], stop: Event, report: Callable[[], None]
) -> None:
    """Wait while ``sequence`` is past the share of the run the fault injector lets through."""
    deadline = time.monotonic() + 3 * spec.stall_timeout
    while sequence >= math.ceil(gate.value * spec.transactions) and not stop.is_set():
        report()
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"worker {spec.index}: held at transaction {sequence} by the fault schedule for "
                f"{3 * spec.stall_timeout:g}s"
            )
        stop.wait(0.02)


def _flush_briefly(client: WaltzClient) -> None:
    """Flush for a moment (long enough to send flush requests to the partitions with appends
    pending), without waiting for the outcome."""
    with contextlib.suppress(WaltzTimeoutError):
        client.flush(timeout=2 * _NUDGE_AFTER)


def _submit_all(
    spec: WorkerSpec,
    client: WaltzClient,
    callbacks: ChecksumCallbacks,
    conn: Connection,
    stop: Event,
    gate: Synchronized[float],
) -> _Outcomes:
    rng = random.Random(f"chaos-worker-{spec.seed}-{spec.index}")
    outcomes = _Outcomes(spec.in_flight)
    last_report = 0.0

    def report() -> None:
        nonlocal last_report
        now = time.monotonic()
        if now - last_report >= _PROGRESS_INTERVAL:
            conn.send(("progress", len(outcomes.acked), len(outcomes.failed)))
            last_report = now

    def record(sequence: int, context: ChaosAppend | CounterIncrement, future: Future[Outcome]) -> None:
        try:
            transaction_id = future.result().transaction_id
            with outcomes.lock:
                if transaction_id is None:
                    outcomes.failed.append((sequence, DROPPED))
                else:
                    outcomes.acked.append((sequence, context.partition, transaction_id))
        except Exception as exc:
            with outcomes.lock:
                outcomes.failed.append((sequence, repr(exc)))
        with outcomes.lock:
            outcomes.lock_failures += context.lock_failures
        outcomes.last_outcome = time.monotonic()
        outcomes.slots.release()

    for sequence in range(spec.transactions):
        _wait_for_gate(spec, sequence, gate, stop, report)
        if stop.is_set():
            break
        while not outcomes.slots.acquire(timeout=_FLUSH_WHEN_STALLED):
            _flush_briefly(client)
            if time.monotonic() - outcomes.last_outcome > spec.stall_timeout:
                raise TimeoutError(
                    f"worker {spec.index}: no submission ended for {spec.stall_timeout:g}s "
                    f"({len(outcomes.acked)} acknowledged so far)"
                )
        context: ChaosAppend | CounterIncrement
        if spec.workload == "counter":
            key = counter_key_for(spec.seed, spec.index, sequence, spec.lock_pool)
            context = CounterIncrement(callbacks, key % client.num_partitions, key, spec.index, sequence)
        else:
            payload = payload_for(spec.seed, spec.index, sequence)
            # Drawn among the partitions there are now: a split's new ones too, once opened.
            context = ChaosAppend(
                rng.randrange(client.num_partitions), rng.randrange(spec.lock_pool), payload, spec.index
            )
        future = client.submit(context)
        outcomes.submitted = sequence + 1
        future.add_done_callback(functools.partial(record, sequence, context))
        report()
    # Wait for every outcome: take back every slot.
    for _ in range(spec.in_flight):
        while not outcomes.slots.acquire(timeout=_FLUSH_WHEN_STALLED):
            _flush_briefly(client)
            if time.monotonic() - outcomes.last_outcome > spec.stall_timeout:
                raise TimeoutError(
                    f"worker {spec.index}: {spec.in_flight} submissions still without an outcome "
                    f"after {spec.stall_timeout:g}s"
                )
            conn.send(("progress", len(outcomes.acked), len(outcomes.failed)))
    return outcomes


def worker_main(spec: WorkerSpec, conn: Connection, stop: Event, gate: Synchronized[float]) -> None:
    """Run one chaos client (the process's target; see the module docstring for the messages).

    Args:
        spec: what to do.
        conn: the pipe to the coordinator.
        stop: set by the coordinator when ``--duration`` is over: submit no more.
        gate: the fraction (0..1) of its transactions the worker may have submitted; the fault
            injector holds the clients at the next fault's point until it has struck.
    """
    if spec.namespace is not None:
        from waltz.local.netns import enter_namespace

        enter_namespace(spec.namespace)
    if spec.log_path is not None:
        logging.basicConfig(
            filename=spec.log_path,
            level=logging.INFO,
            format="%(asctime)s %(levelname)s %(name)s %(message)s",
        )
    try:
        if spec.workload == "ledger":
            _ledger_main(spec, conn, stop, gate)
            return
        callbacks = ChecksumCallbacks(counters=spec.workload == "counter")
        config = WaltzClientConfig(
            zookeeper_connect_string=spec.zookeeper,
            cluster_root=spec.root,
            client_max_concurrent_transactions=max(spec.in_flight, 1),
            client_long_wait_threshold=_NUDGE_AFTER,
        )
        with WaltzClient(callbacks, config) as client:
            client.wait_mounted(120)
            conn.send(("ready", client.client_id))
            outcomes = _submit_all(spec, client, callbacks, conn, stop, gate)
            conn.send(("submitted", len(outcomes.acked), len(outcomes.failed)))
            if not conn.poll(spec.apply_timeout + 600):
                raise TimeoutError(f"worker {spec.index}: the coordinator never sent the final marks")
            kind, marks = conn.recv()
            if kind != "marks":
                raise RuntimeError(f"worker {spec.index}: expected the final marks, got {kind!r}")
            deadline = time.monotonic() + spec.apply_timeout
            for pid, mark in sorted(marks.items()):
                if not client.wait_applied(int(pid), int(mark), max(1.0, deadline - time.monotonic())):
                    applied = callbacks.sequence(int(pid)).mark
                    raise TimeoutError(
                        f"worker {spec.index} (client {client.client_id}): partition {pid} applied up to "
                        f"{applied}, not {mark}, after {spec.apply_timeout:g}s"
                    )
            result = {
                "worker": spec.index,
                "client_id": client.client_id,
                "submitted": outcomes.submitted,
                "acked": outcomes.acked,
                "failed": outcomes.failed,
                "lock_failures": outcomes.lock_failures,
                "partitions": {
                    str(pid): [s.mark, s.checksum, s.count, s.errors]
                    for pid, s in callbacks.partitions.items()
                },
                "uncaught": callbacks.uncaught,
            }
        Path(spec.result_path).write_text(json.dumps(result))
        conn.send(("done", spec.result_path))
    except BaseException as exc:
        log.exception("chaos worker %d failed", spec.index)
        with contextlib.suppress(OSError):
            conn.send(("error", f"worker {spec.index}: {exc!r}\n{traceback.format_exc()}"))
        raise SystemExit(1) from None


def _ledger_main(spec: WorkerSpec, conn: Connection, stop: Event, gate: Synchronized[float]) -> None:
    from waltz.chaos.ledger import run_ledger_worker

    if spec.db_url is None:
        raise ValueError("the ledger workload needs db_url")
    result = run_ledger_worker(
        app=spec.app,
        index=spec.index,
        db_url=spec.db_url,
        zookeeper=spec.zookeeper,
        cluster_root=spec.root,
        accounts=spec.accounts,
        seed=spec.seed,
        transactions=spec.transactions,
        in_flight=spec.in_flight,
        batch=spec.batch,
        conn=conn,
        stop=stop,
        gate=gate,
        wait_for_gate=lambda sequence, report: _wait_for_gate(spec, sequence, gate, stop, report),
        apply_timeout=spec.apply_timeout,
    )
    Path(spec.result_path).write_text(json.dumps(result))
    conn.send(("done", spec.result_path))
