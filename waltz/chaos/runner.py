"""``waltz chaos``: a local cluster, client processes writing with random locks, faults, then checks.

Issue 8, "waltz chaos". :func:`run_chaos`:

1. prints the fault schedule (random from ``seed``, or the fixed one) and how to replay it;
2. starts fault proxies (when the schedule has network faults: one in front of every server, which
   advertises it to clients, and one in front of every storage node, whose connect string in
   ZooKeeper names it), and a local cluster: its own ZooKeeper, 3 or 5 storage nodes, the servers;
3. starts ``clients`` client processes (:mod:`waltz.chaos.worker`) that submit the transactions
   with random WRITE locks while :class:`~waltz.chaos.faults.FaultInjector` strikes the faults;
4. heals everything, tells every client the final high-water marks, and collects what each
   acknowledged and the checksum of what each applied;
5. checks (:mod:`waltz.chaos.checks`): every acknowledged transaction in the log exactly once, no
   gaps, every client the same sequence as a fresh reader, replicas identical through the admin
   port; then stops everything cleanly and compares the CRC-32 of every segment body of every
   replica; then starts everything again on the same directories and checks that a fresh reader
   sees the same log and the disks did not change.

Every node's log stays in the work directory when the run fails.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import multiprocessing.connection
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

from waltz.chaos.checks import (
    ChaosCheck,
    WorkerResult,
    check_gaps,
    check_replicas_on_disk,
    check_run,
    compare_readings,
    failure_kinds,
    lock_failure_total,
    read_log,
    segment_digests,
)
from waltz.chaos.faults import FaultInjector
from waltz.chaos.proxy import FaultProxy
from waltz.chaos.schedule import (
    DEFAULT_FAULTS,
    NETWORK_FAULTS,
    Fault,
    FaultKind,
    fixed_schedule,
    random_schedule,
)
from waltz.chaos.worker import WorkerSpec, worker_main
from waltz.services.local import LocalStorageNode
from waltz.services.local_cluster import LocalCluster

__all__ = ["ChaosOptions", "ChaosResult", "run_chaos"]

log = logging.getLogger(__name__)

Say = Callable[[str], None]

#: Seconds between progress lines.
_PROGRESS_EVERY = 5.0


@dataclass(frozen=True)
class ChaosOptions:
    """What a chaos run does (the ``waltz chaos`` options).

    Attributes:
        transactions: transactions to submit in all (split evenly between the clients).
        duration: seconds after which the clients submit no more (None: until ``transactions``).
        seed: the seed of the payloads, partitions, locks and the random schedule.
        faults: the fault kinds the schedule may use.
        schedule: ``"random"`` (``fault_count`` faults drawn from ``seed``) or ``"fixed"``
            (:func:`~waltz.chaos.schedule.fixed_schedule`).
        fault_count: faults of a random schedule; None means one per 5,000 transactions, at
            least 3 and at most 200.
        max_fault_duration: the longest fault of a random schedule, in seconds.
        workload: ``"raw"`` (random payloads under random WRITE locks, as upstream's smoke test)
            ``"counter"`` (read-modify-write increments of ``lock_pool`` counters, seed 001's
            counter: no update may be lost), or ``"ledger"`` (the SmallBank mix of
            ``examples/ledger``; money must be conserved).
        db_url: the ledger's shared database (None: SQLite in the work directory).
        accounts: SmallBank customers of the ledger workload.
        storages: storage nodes (3 or 5); every partition has a replica on each, so a fault on a
            minority of the nodes hits a minority of every partition's replicas.
        servers: servers.
        partitions: partitions.
        clients: client processes.
        in_flight: submissions in flight per client.
        lock_pool: the WRITE lock of each transaction is drawn from this many.
        work_dir: where data and logs go, always kept (None: a temporary directory).
        keep: keep the temporary work directory after a passing run (a failing run always keeps it).
        timeout: seconds the submission phase may take (None: 600 s + 20 ms per transaction).
        restart_check: stop everything cleanly and check again after starting it again.
        tick_time_ms: ZooKeeper's tickTime.
        session_timeout: the servers' ZooKeeper session timeout in seconds.
    """

    transactions: int = 3000
    duration: float | None = None
    seed: int = 1
    faults: tuple[FaultKind, ...] = DEFAULT_FAULTS
    schedule: str = "random"
    fault_count: int | None = None
    max_fault_duration: float = 6.0
    workload: str = "raw"
    db_url: str | None = None
    accounts: int = 200
    storages: int = 3
    servers: int = 3
    partitions: int = 4
    clients: int = 3
    in_flight: int = 32
    lock_pool: int = 1000
    work_dir: Path | None = None
    keep: bool = False
    timeout: float | None = None
    restart_check: bool = True
    tick_time_ms: int = 500
    session_timeout: float = 4.0

    def make_schedule(self) -> list[Fault]:
        """The run's fault schedule.

        Raises:
            ValueError: an unknown ``schedule``.
        """
        if self.schedule == "fixed":
            return fixed_schedule(self.faults)
        if self.schedule == "random":
            count = self.fault_count
            if count is None:
                count = min(200, max(3, self.transactions // 5000))
            return random_schedule(
                self.seed,
                self.faults,
                count=count,
                storages=self.storages,
                servers=self.servers,
                max_duration=self.max_fault_duration,
            )
        raise ValueError(f"unknown schedule {self.schedule!r}: use random or fixed")


@dataclass
class ChaosResult:
    """What a chaos run saw.

    Attributes:
        checks: every invariant's verdict, in order.
        faults: the faults struck, as described.
        acknowledged: transactions the clients saw committed.
        failed: submissions that ended with an exception.
        lock_failures: lock failures the clients retried.
        seconds: the submission phase's duration.
        work_dir: the work directory (kept when the run failed or ``keep`` was set).
        errors: what stopped the run before its checks (a worker error, a timeout).
    """

    checks: list[ChaosCheck] = field(default_factory=list)
    faults: list[str] = field(default_factory=list)
    acknowledged: int = 0
    failed: int = 0
    lock_failures: int = 0
    seconds: float = 0.0
    work_dir: Path | None = None
    errors: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """True when there were checks, all passed, and nothing stopped the run."""
        return bool(self.checks) and all(c.passed for c in self.checks) and not self.errors


class _Proxies:
    """The fault proxies in front of the servers and the storage nodes, and the cluster they front."""

    def __init__(self, options: ChaosOptions, enabled: bool) -> None:
        self.cluster: LocalCluster | None = None
        self.clients: list[FaultProxy] = []
        self.storages: list[FaultProxy] = []
        if not enabled:
            return
        for j in range(options.servers):
            self.clients.append(FaultProxy(self._server_target(j), name=f"server-{j}"))
        for i in range(options.storages):
            self.storages.append(FaultProxy(self._storage_target(i), name=f"storage-{i}"))

    def _server_target(self, index: int) -> Callable[[], tuple[str, int]]:
        def target() -> tuple[str, int]:
            assert self.cluster is not None
            server = self.cluster.servers[index]
            return server.host, server.port

        return target

    def _storage_target(self, index: int) -> Callable[[], tuple[str, int]]:
        def target() -> tuple[str, int]:
            assert self.cluster is not None
            node = self.cluster.storages[index]
            return node.host, node.port

        return target

    def server_args(self, index: int) -> list[str]:
        if not self.clients:
            return []
        return ["--advertised-endpoint", self.clients[index].address]

    def storage_connect_string(self, node: LocalStorageNode) -> str:
        if not self.storages:
            return node.address
        index = int(node.process.name.rsplit("-", 1)[1])
        return self.storages[index].address

    def heal(self) -> None:
        for proxy in self.clients + self.storages:
            proxy.unblock()
            proxy.set_delay(0.0)

    def close(self) -> None:
        for proxy in self.clients + self.storages:
            proxy.close()


def _make_cluster(options: ChaosOptions, work_dir: Path, proxies: _Proxies) -> LocalCluster:
    cluster = LocalCluster(
        storages=options.storages,
        servers=options.servers,
        partitions=options.partitions,
        replicas=options.storages,
        name="chaos",
        work_dir=work_dir / "cluster",
        tick_time_ms=options.tick_time_ms,
        session_timeout=options.session_timeout,
        start_timeout=180.0,
        server_args_of=proxies.server_args,
        storage_connect_string_of=proxies.storage_connect_string,
    )
    proxies.cluster = cluster
    return cluster


@dataclass
class _Worker:
    index: int
    process: multiprocessing.process.BaseProcess
    conn: multiprocessing.connection.Connection
    planned: int
    state: str = "starting"
    acked: int = 0
    failed: int = 0
    result_path: str | None = None
    error: str | None = None


def _handle(worker: _Worker, message: tuple[Any, ...]) -> None:
    kind = message[0]
    if kind == "ready":
        worker.state = "running"
    elif kind == "progress":
        worker.acked, worker.failed = int(message[1]), int(message[2])
    elif kind == "submitted":
        worker.acked, worker.failed = int(message[1]), int(message[2])
        worker.state = "submitted"
    elif kind == "done":
        worker.state, worker.result_path = "done", str(message[1])
    elif kind == "error":
        worker.state, worker.error = "error", str(message[1])


def _pump(workers: list[_Worker], timeout: float) -> None:
    """Receive the workers' messages for up to ``timeout`` seconds; notice dead workers."""
    live = {w.conn: w for w in workers if w.state not in ("done", "error")}
    if not live:
        return
    for conn in multiprocessing.connection.wait(list(live), timeout):
        worker = live[conn]  # type: ignore[index]
        try:
            while worker.conn.poll():
                _handle(worker, worker.conn.recv())
        except (EOFError, OSError):
            if worker.state not in ("done", "error"):
                worker.state = "error"
                worker.error = worker.error or f"worker {worker.index} exited ({worker.process.exitcode})"
    for worker in workers:
        if worker.state not in ("done", "error") and not worker.process.is_alive():
            worker.state = "error"
            worker.error = (
                f"worker {worker.index} exited with code {worker.process.exitcode} without a result"
            )


def _wait_states(workers: list[_Worker], states: set[str], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not all(w.state in states or w.state == "error" for w in workers):
        if time.monotonic() > deadline:
            late = [f"worker {w.index}: {w.state}" for w in workers if w.state not in states]
            raise TimeoutError(f"{what} not within {timeout:g}s: {', '.join(late)}")
        _pump(workers, 0.5)
    errors = [w.error for w in workers if w.state == "error"]
    if errors:
        raise RuntimeError("; ".join(e or "?" for e in errors))


def run_chaos(options: ChaosOptions, say: Say = log.info) -> ChaosResult:
    """Run a chaos run (see the module docstring) and return every check's verdict.

    Args:
        options: what to run.
        say: receives the progress and result lines (the CLI prints them).

    Returns:
        The result; ``passed`` is False when any check failed or the run could not finish.

    Raises:
        ValueError: bad options (storages not 3 or 5, an unknown workload or schedule).
    """
    if options.storages not in (3, 5):
        raise ValueError(f"storages must be 3 or 5, got {options.storages}")
    if options.workload not in ("raw", "counter", "ledger"):
        raise ValueError(f"unknown workload {options.workload!r}: use raw, counter or ledger")
    if options.transactions < options.clients:
        raise ValueError(
            f"transactions ({options.transactions}) must be at least clients ({options.clients})"
        )
    schedule = options.make_schedule()
    work_dir = (options.work_dir or Path(tempfile.mkdtemp(prefix="waltz-chaos-"))).resolve()
    work_dir.mkdir(parents=True, exist_ok=True)
    result = ChaosResult(work_dir=work_dir)
    say(
        f"waltz chaos: seed {options.seed}, {options.transactions:,} transactions by {options.clients} "
        f"client processes, {options.storages} storage nodes, {options.servers} servers, "
        f"{options.partitions} partitions, workload {options.workload}; work dir {work_dir}"
    )
    say(f"fault schedule ({options.schedule}, {len(schedule)} faults):")
    for fault in schedule:
        say(f"  {fault.describe()}")
    kinds = ",".join(k.value for k in options.faults) or "none"
    say(
        f"replay: waltz chaos --seed {options.seed} --transactions {options.transactions} "
        f"--schedule {options.schedule} --faults {kinds} --storages {options.storages}"
        + (f" --fault-count {options.fault_count}" if options.fault_count is not None else "")
        + (f" --duration {options.duration:g}" if options.duration is not None else "")
    )
    proxies = _Proxies(options, enabled=any(f.kind in NETWORK_FAULTS for f in schedule))
    try:
        _run(options, schedule, work_dir, proxies, result, say)
    except Exception as exc:
        log.exception("the chaos run stopped")
        result.errors.append(f"{type(exc).__name__}: {exc}")
    finally:
        proxies.close()
    for check in result.checks:
        say(f"{'PASS' if check.passed else 'FAIL'}  {check.name}: {check.detail}")
    for error in result.errors:
        say(f"ERROR {error}")
    if result.passed and not options.keep and options.work_dir is None:
        shutil.rmtree(work_dir, ignore_errors=True)
        result.work_dir = None
    verdict = "PASSED" if result.passed else "FAILED"
    kept = f"; logs and data kept in {work_dir}" if result.work_dir is not None else ""
    say(f"{verdict}: {result.acknowledged:,} transactions acknowledged, {len(result.faults)} faults{kept}")
    return result


def _run(
    options: ChaosOptions,
    schedule: list[Fault],
    work_dir: Path,
    proxies: _Proxies,
    result: ChaosResult,
    say: Say,
) -> None:
    started = time.monotonic()
    cluster = _make_cluster(options, work_dir, proxies)
    with cluster:
        say(
            f"cluster ready in {time.monotonic() - started:.1f}s "
            f"(ZooKeeper {cluster.zookeeper_connect_string})"
        )
        db_url = options.db_url or f"sqlite:///{work_dir / 'ledger.db'}"
        if options.workload == "ledger":
            from waltz.chaos.ledger import prepare_ledger

            prepare_ledger(
                db_url, cluster.zookeeper_connect_string, cluster.root, options.accounts, options.seed
            )
            say(f"ledger database {db_url.split('@')[-1]}: migrated, {options.accounts} accounts opened")
        context = multiprocessing.get_context("spawn")
        stop = context.Event()
        gate = context.Value("d", 1.0 if options.duration is not None or not schedule else schedule[0].at)
        workers = _start_workers(options, cluster, work_dir, stop, gate, db_url)
        try:
            _wait_states(workers, {"running"}, 180.0, "every client mounted")
            say(f"{len(workers)} client processes mounted every partition; submitting")
            result.seconds = _submit_phase(
                options, schedule, cluster, proxies, workers, stop, gate, result, say
            )
            proxies.heal()
            owners = cluster.heal(180.0)
            if options.workload == "ledger":
                from waltz.chaos.ledger import wait_transfers_settled

                say("waiting for the ledger's sweepers to settle every two-step transfer")
                wait_transfers_settled(db_url)
                owners = cluster.wait_ready(180.0)
            marks = {pid: owner.high_water_mark for pid, owner in sorted(owners.items())}
            say(f"healed; high-water marks {marks}; clients applying up to them")
            for worker in workers:
                worker.conn.send(("marks", marks))
            _wait_states(
                workers, {"done"}, _read_timeout(marks), "every client applied up to the final marks"
            )
        finally:
            _stop_workers(workers)
        results = [
            WorkerResult.from_json(json.loads(Path(w.result_path).read_text()))
            for w in workers
            if w.result_path
        ]
        result.acknowledged = sum(len(w.acked) for w in results) + sum(
            int(w.ledger.get("committed", 0)) for w in results
        )
        result.failed = sum(len(w.failed) for w in results)
        result.lock_failures = lock_failure_total(results)
        say(
            f"{result.acknowledged:,} acknowledged, {result.failed} failed "
            f"{dict(failure_kinds(results))}, {result.lock_failures:,} lock failures retried; "
            "reading the whole log with a fresh client"
        )
        workload = options.workload
        read_started = time.monotonic()
        reading = read_log(
            cluster.zookeeper_connect_string,
            cluster.root,
            marks,
            options.seed,
            timeout=_read_timeout(marks),
            workload=workload,
            keys=options.lock_pool,
        )
        say(
            f"read {sum(reading.counts.values()):,} transactions in "
            f"{time.monotonic() - read_started:.0f}s; checking"
        )
        if workload != "ledger":
            submitted = {w.worker: len(w.acked) + len(w.failed) for w in results}
            result.checks += check_run(workers=results, submitted=submitted, marks=marks, reading=reading)
            result.checks.append(_online_replicas(cluster, marks))
        else:
            from waltz.chaos.ledger import ledger_checks

            result.checks.append(check_gaps(marks, reading, results))
            result.checks += ledger_checks(db_url, cluster, marks, [w.ledger for w in results])
    storage_dirs = {n.process.name: n.directory for n in cluster.storages}
    digests = segment_digests(storage_dirs)
    result.checks.append(check_replicas_on_disk(digests, marks, cluster.replicas))
    if not options.restart_check:
        return
    say("stopped everything cleanly; starting it again on the same directories")
    restart_started = time.monotonic()
    again = _make_cluster(options, work_dir, proxies)
    with again:
        owners = again.wait_ready(180.0)
        marks_again = {pid: owner.high_water_mark for pid, owner in sorted(owners.items())}
        reading_again = read_log(
            again.zookeeper_connect_string,
            again.root,
            marks_again,
            options.seed,
            timeout=_read_timeout(marks),
            workload=workload,
            keys=options.lock_pool,
        )
        say(f"restarted and read the whole log again in {time.monotonic() - restart_started:.0f}s")
    check = compare_readings(
        "after a clean restart of everything, a fresh reader sees the same", reading, reading_again
    )
    if marks_again != marks:
        check = ChaosCheck(
            check.name, False, f"high-water marks {marks_again}, before {marks}; {check.detail}"
        )
    result.checks.append(check)
    digests_again = segment_digests(storage_dirs)
    result.checks.append(
        ChaosCheck(
            "after the restart, every segment body on every replica is unchanged",
            digests_again == digests,
            "same CRC-32s" if digests_again == digests else "segment CRCs changed across the restart",
        )
    )


def _read_timeout(marks: Mapping[int, int]) -> float:
    """Seconds allowed to read (or apply) the whole log: 10 minutes plus 10 ms per transaction."""
    return 600.0 + 0.01 * sum(m + 1 for m in marks.values())


def _start_workers(
    options: ChaosOptions,
    cluster: LocalCluster,
    work_dir: Path,
    stop: Event,
    gate: Synchronized[float],
    db_url: str,
) -> list[_Worker]:
    context = multiprocessing.get_context("spawn")
    clients_dir = work_dir / "clients"
    clients_dir.mkdir(exist_ok=True)
    workers: list[_Worker] = []
    share, extra = divmod(options.transactions, options.clients)
    for index in range(options.clients):
        planned = share + (1 if index < extra else 0)
        spec = WorkerSpec(
            index=index,
            zookeeper=cluster.zookeeper_connect_string,
            root=cluster.root,
            seed=options.seed,
            transactions=planned,
            in_flight=options.in_flight,
            lock_pool=options.lock_pool,
            result_path=str(clients_dir / f"worker-{index}.json"),
            log_path=str(clients_dir / f"worker-{index}.log"),
            apply_timeout=600.0 + 0.01 * options.transactions,
            workload=options.workload,
            db_url=db_url,
            accounts=options.accounts,
        )
        parent, child = context.Pipe()
        process = context.Process(
            target=worker_main, args=(spec, child, stop, gate), name=f"chaos-worker-{index}"
        )
        process.start()
        child.close()
        workers.append(_Worker(index, process, parent, planned))
    return workers


def _stop_workers(workers: list[_Worker]) -> None:
    for worker in workers:
        worker.process.join(30 if worker.state == "done" else 0.1)
        if worker.process.is_alive():
            worker.process.terminate()
            worker.process.join(10)
        if worker.process.is_alive():
            worker.process.kill()
            worker.process.join(5)
        worker.conn.close()


def _submit_phase(
    options: ChaosOptions,
    schedule: list[Fault],
    cluster: LocalCluster,
    proxies: _Proxies,
    workers: list[_Worker],
    stop: Event,
    gate: Synchronized[float],
    result: ChaosResult,
    say: Say,
) -> float:
    """Let the workers submit while the faults strike; returns the phase's seconds."""
    started = time.monotonic()
    total = sum(w.planned for w in workers)
    timeout = options.timeout if options.timeout is not None else 600.0 + 0.02 * total

    done_label = "drawn" if options.workload == "ledger" else "acknowledged"

    def progress() -> float:
        done = sum(w.acked + w.failed for w in workers) / max(1, total)
        if options.duration is not None:
            done = max(done, (time.monotonic() - started) / options.duration)
        return done

    def set_gate(fraction: float) -> None:
        if options.duration is None:
            gate.value = fraction

    injector = FaultInjector(
        lambda: cluster, schedule, progress, proxies.clients, proxies.storages, say, gate=set_gate
    )
    injector.start()
    last = started
    try:
        while not all(w.state in ("submitted", "done", "error") for w in workers):
            _pump(workers, 0.5)
            now = time.monotonic()
            if options.duration is not None and now - started > options.duration and not stop.is_set():
                say(f"[{now - started:7.1f}s] --duration {options.duration:g}s is over: submitting no more")
                stop.set()
            if now - started > timeout:
                raise TimeoutError(
                    f"the clients did not finish submitting within {timeout:g}s: "
                    + ", ".join(f"worker {w.index} {w.state} {w.acked} acked" for w in workers)
                )
            if now - last >= _PROGRESS_EVERY:
                last = now
                acked = sum(w.acked for w in workers)
                failed = sum(w.failed for w in workers)
                say(
                    f"[{now - started:7.1f}s] {acked:,}/{total:,} {done_label} "
                    f"({acked / max(1, total):.0%}), {failed} failed, {acked / (now - started):,.0f}/s"
                )
        errors = [w.error for w in workers if w.state == "error"]
        if errors:
            raise RuntimeError("; ".join(e or "?" for e in errors))
    finally:
        injector.stop()
        result.faults = list(injector.struck)
    seconds = time.monotonic() - started
    acked = sum(w.acked for w in workers)
    say(
        f"[{seconds:7.1f}s] submitted: {acked:,} acknowledged ({acked / seconds:,.0f}/s); "
        f"{len(injector.struck)} faults"
    )
    unstruck = len(schedule) - len(injector.struck)
    result.checks.append(
        ChaosCheck(
            "every fault of the schedule struck and healed",
            not injector.errors and (unstruck == 0 or options.duration is not None),
            f"{len(injector.struck)} struck"
            + (f", {unstruck} not reached" if unstruck else "")
            + (f"; errors: {injector.errors}" if injector.errors else "")
            + (f"; slow to recover: {len(injector.not_ready)}" if injector.not_ready else ""),
        )
    )
    return seconds


def _online_replicas(cluster: LocalCluster, marks: Mapping[int, int]) -> ChaosCheck:
    """Every replica holds the same records 0..mark, read through the admin ports (the ledger's check)."""
    from examples.ledger.checks import replica_digests

    digests = replica_digests(cluster, dict(marks), timeout=120.0)
    differing = {pid: len(d) for pid, d in digests.items() if len(d) != 1}
    return ChaosCheck(
        "every replica serves the same records (admin port, after catching up)",
        not differing,
        f"{len(digests)} partitions compared" if not differing else f"differing: {differing}",
    )
