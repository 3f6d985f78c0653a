"""``waltz chaos``: a local cluster, client processes writing with random locks, faults, then checks.

See docs/chaos.md "What runs", "The fault schedule", "The checks". :func:`run_chaos`:

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

import contextlib
import json
import logging
import multiprocessing
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event
from pathlib import Path

from waltz.chaos.archive_checks import (
    check_archive_verified,
    check_chunks_once,
    check_local_ranges,
    check_online_local_ranges,
    compare_local_ranges,
    local_ranges,
)
from waltz.chaos.archiving import RETENTION_ENV, ChaosArchiver
from waltz.chaos.checks import (
    ChaosCheck,
    WorkerResult,
    check_gaps,
    check_progress,
    check_replicas_on_disk,
    check_run,
    compare_readings,
    failure_kinds,
    lock_failure_total,
    read_log,
    segment_digests,
)
from waltz.chaos.clients import MOUNTED_STATES, ClientProcesses
from waltz.chaos.faults import FaultInjector
from waltz.chaos.options import ChaosOptions, ChaosResult, database_on_loopback
from waltz.chaos.proxy import ClusterProxies, forward_database
from waltz.chaos.schedule import NETWORK_FAULTS, Fault
from waltz.chaos.worker import WorkerSpec
from waltz.client.config import WaltzClientConfig
from waltz.local.certificates import ClusterCertificates
from waltz.local.cluster import LocalCluster
from waltz.local.options import NetworkOptions, ProcessOptions
from waltz.local.security import CERTIFICATES_DIR, DIGEST_FILE

__all__ = ["run_chaos"]

log = logging.getLogger(__name__)

Say = Callable[[str], None]

#: Seconds between progress lines.
_PROGRESS_EVERY = 5.0
#: Seconds a ``duration`` run keeps its clients submitting past its end while faults still strike.
_LAST_FAULTS_GRACE = 300.0


def _make_cluster(options: ChaosOptions, work_dir: Path, proxies: ClusterProxies) -> LocalCluster:
    cluster = LocalCluster(
        storages=options.storages,
        servers=options.servers,
        partitions=options.partitions,
        replicas=options.storages,
        name="chaos",
        work_dir=work_dir / "cluster",
        processes=ProcessOptions(
            tick_time_ms=options.tick_time_ms,
            session_timeout=options.session_timeout,
            start_timeout=180.0,
            server_args_of=proxies.server_args,
            storage_env=dict(RETENTION_ENV) if options.archive else {},
        ),
        network=NetworkOptions(
            mode="namespaces" if options.network == "namespaces" else "loopback",
            client_hosts=options.clients if options.network == "namespaces" else 0,
            storage_connect_string_of=proxies.storage_connect_string,
        ),
    )
    proxies.cluster = cluster
    return cluster


def run_chaos(options: ChaosOptions, say: Say = log.info) -> ChaosResult:
    """Run a chaos run (see the module docstring) and return every check's verdict.

    Args:
        options: what to run.
        say: receives the progress and result lines (the CLI prints them).

    Returns:
        The result; ``passed`` is False when any check failed or the run could not finish.

    Raises:
        ValueError: bad options (:meth:`ChaosOptions.validate`).
    """
    options.validate()
    schedule = options.make_schedule()
    work_dir = (options.work_dir or Path(tempfile.mkdtemp(prefix="waltz-chaos-"))).resolve()
    work_dir.mkdir(parents=True, exist_ok=True)
    result = ChaosResult(work_dir=work_dir)
    bound = (
        f"{options.duration:g}s (at most {options.transaction_bound:,} transactions)"
        if options.duration is not None
        else f"{options.transaction_bound:,} transactions"
    )
    say(
        f"waltz chaos: seed {options.seed}, {bound} by {options.clients} client processes, "
        f"{options.storages} storage nodes, {options.servers} servers, {options.partitions} partitions"
        + (f" split to {options.split_to} at {options.split_at:.0%}" if options.split_to else "")
        + ", "
        f"workload {options.workload}, network {options.network}; work dir {work_dir}"
    )
    say(f"fault schedule ({options.schedule}, {len(schedule)} faults):")
    for fault in schedule:
        say(f"  {fault.describe()}")
    say(f"replay: {options.replay_command()}")
    try:
        with (
            ClusterProxies(
                options.servers, options.storages, enabled=any(f.kind in NETWORK_FAULTS for f in schedule)
            ) as proxies,
            _client_environment(work_dir / "cluster"),
        ):
            _run(options, schedule, work_dir, proxies, result, say)
    except Exception as exc:
        log.exception("the chaos run stopped")
        result.errors.append(f"{type(exc).__name__}: {exc}")
    except BaseException:  # Ctrl-C, SIGTERM, SIGHUP: everything started is stopped; say what is left
        with contextlib.suppress(OSError):  # a closed terminal takes no more lines
            say(f"INTERRUPTED; logs and data kept in {work_dir}")
        raise
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


@contextlib.contextmanager
def _client_environment(cluster_dir: Path) -> Iterator[None]:
    """Name the chaos cluster's ZooKeeper credential and client certificate files in this
    process's environment for the run.

    Every client of the run (the worker processes, spawned with this environment, the readers,
    the ledger's setup) builds a ``WaltzClientConfig``, which reads ``WALTZ_ZOOKEEPER_*`` and
    ``WALTZ_CLIENT_TLS_*``; the previous values come back afterwards.
    """
    files = ClusterCertificates(cluster_dir / CERTIFICATES_DIR)
    variables = {
        "WALTZ_ZOOKEEPER_AUTH_DIGEST_FILE": str(cluster_dir / DIGEST_FILE),
        **files.client_env(),
    }
    previous = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _worker_specs(
    options: ChaosOptions, cluster: LocalCluster, work_dir: Path, db_url: str
) -> list[WorkerSpec]:
    clients_dir = work_dir / "clients"
    share, extra = divmod(options.transaction_bound, options.clients)
    apply_timeout = 600.0 + (
        options.duration if options.duration is not None else 0.01 * options.transaction_bound
    )
    return [
        WorkerSpec(
            index=index,
            zookeeper=cluster.zookeeper_connect_string,
            root=cluster.root,
            seed=options.seed,
            transactions=share + (1 if index < extra else 0),
            in_flight=options.in_flight,
            lock_pool=options.lock_pool,
            result_path=str(clients_dir / f"worker-{index}.json"),
            log_path=str(clients_dir / f"worker-{index}.log"),
            apply_timeout=apply_timeout,
            workload=options.workload,
            db_url=db_url,
            accounts=options.accounts,
            app=options.app,
            batch=options.batch,
            namespace=cluster.host(f"client-{index}").namespace if cluster.network_lab else None,
        )
        for index in range(options.clients)
    ]


def _run(
    options: ChaosOptions,
    schedule: list[Fault],
    work_dir: Path,
    proxies: ClusterProxies,
    result: ChaosResult,
    say: Say,
) -> None:
    started = time.monotonic()
    cluster = _make_cluster(options, work_dir, proxies)
    with cluster, contextlib.ExitStack() as stack:
        say(
            f"cluster ready in {time.monotonic() - started:.1f}s "
            f"(ZooKeeper {cluster.zookeeper_connect_string})"
        )
        db_url = options.db_url or f"sqlite:///{work_dir / 'ledger.db'}"
        if options.workload == "ledger":
            from waltz.chaos.ledger import prepare_ledger

            prepare_ledger(
                options.app,
                db_url,
                cluster.zookeeper_connect_string,
                cluster.root,
                options.accounts,
                options.seed,
            )
            say(f"ledger database {db_url.split('@')[-1]}: migrated, {options.accounts} accounts opened")
        clients_db_url = db_url
        if cluster.network_lab is not None and database_on_loopback(db_url):
            # The client hosts cannot reach this machine's loopback: forward the database to the
            # bridge address, where every host reaches this machine.
            gateway, clients_db_url = forward_database(db_url, cluster.network_lab.bridge_address)
            stack.enter_context(gateway)
            say(f"the client hosts reach the database through {gateway.address}")
        archiver: ChaosArchiver | None = None
        if options.archive:
            archiver = stack.enter_context(
                ChaosArchiver(cluster, work_dir / "archive", work_dir / "archiver.log")
            )
            archiver.start()
            say(f"archiver following the log into {archiver.location} (its output: {archiver.log_path})")
        context = multiprocessing.get_context("spawn")
        stop = context.Event()
        gate = context.Value("d", 1.0 if options.duration is not None or not schedule else schedule[0].at)
        with ClientProcesses(
            _worker_specs(options, cluster, work_dir, clients_db_url), stop, gate
        ) as clients:
            # Not held by a fault (none scheduled, or a --duration run), a client may have
            # submitted everything before it is seen mounted: past running is mounted too.
            clients.wait_states(MOUNTED_STATES, 180.0, "every client mounted")
            say(f"{len(clients.clients)} client processes mounted every partition; submitting")
            result.seconds = _submit_phase(
                options, schedule, cluster, proxies, clients, stop, gate, result, say, archiver
            )
            proxies.heal()
            owners = cluster.heal(180.0)
            if options.workload == "ledger":
                from waltz.chaos.ledger import wait_transfers_settled

                say("waiting for the ledger's sweepers to settle every two-step transfer")
                wait_transfers_settled(options.app, db_url)
                owners = cluster.wait_ready(180.0)
            marks = {pid: owner.high_water_mark for pid, owner in sorted(owners.items())}
            say(f"healed; high-water marks {marks}; clients applying up to them")
            clients.send(("marks", marks))
            clients.wait_states({"done"}, _read_timeout(marks), "every client applied up to the final marks")
            results = [
                WorkerResult.from_json(json.loads(Path(c.result_path).read_text()))
                for c in clients.clients
                if c.result_path
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
        # Where each partition's log starts: a split's new partitions at their genesis.
        first_ids = cluster.partition_epochs().first_transaction_ids if options.split_to else {}
        if options.split_to:
            result.checks.append(_split_check(options.partitions, options.split_to, marks, first_ids))
        read_started = time.monotonic()
        reading = read_log(
            WaltzClientConfig(**cluster.client_settings()),
            marks,
            options.seed,
            timeout=_read_timeout(marks),
            workload=workload,
            keys=options.lock_pool,
            progress=_read_progress(say),
            first_ids=first_ids,
        )
        say(
            f"read {sum(reading.counts.values()):,} transactions in "
            f"{time.monotonic() - read_started:.0f}s; checking"
        )
        if workload != "ledger":
            # Each worker's own count: its outcomes must cover exactly those submissions.
            submitted = {w.worker: w.submitted for w in results if w.submitted is not None}
            result.checks += check_run(workers=results, submitted=submitted, marks=marks, reading=reading)
            if archiver is None:
                result.checks.append(_online_replicas(cluster, marks))
        else:
            from waltz.chaos.ledger import ledger_checks

            draws = sum(int(w.ledger.get("draws", 0)) for w in results)
            result.checks.append(check_progress(result.acknowledged, draws))
            result.checks.append(check_gaps(marks, reading, results))
            result.checks += ledger_checks(options.app, db_url, cluster, marks, [w.ledger for w in results])
        if archiver is not None:
            archived_through = _archive_checks(cluster, archiver, marks, result, say)
    storage_dirs = {n.process.name: n.directory for n in cluster.storages}
    digests = segment_digests(storage_dirs)
    if options.archive:
        ranges = local_ranges(storage_dirs)
        result.checks += check_local_ranges(ranges, marks, archived_through, cluster.replicas)
    else:
        result.checks.append(check_replicas_on_disk(digests, marks, cluster.replicas, first_ids))
    if not options.restart_check:
        return
    say("stopped everything cleanly; starting it again on the same directories")
    restart_started = time.monotonic()
    again = _make_cluster(options, work_dir, proxies)
    with again:
        owners = again.wait_ready(180.0)
        marks_again = {pid: owner.high_water_mark for pid, owner in sorted(owners.items())}
        reading_again = read_log(
            WaltzClientConfig(**again.client_settings()),
            marks_again,
            options.seed,
            timeout=_read_timeout(marks),
            workload=workload,
            keys=options.lock_pool,
            progress=_read_progress(say),
            first_ids=first_ids,
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
    if options.archive:
        result.checks.append(compare_local_ranges(ranges, local_ranges(storage_dirs), archived_through))
        return
    digests_again = segment_digests(storage_dirs)
    result.checks.append(
        ChaosCheck(
            "after the restart, every segment body on every replica is unchanged",
            digests_again == digests,
            "same CRC-32s" if digests_again == digests else "segment CRCs changed across the restart",
        )
    )


def _read_progress(say: Say) -> Callable[[int, int], None]:
    """A progress callback of a whole-log read that reports to ``say``."""

    def report(done: int, total: int) -> None:
        say(f"  read {done:,} of {total:,} transactions ({100 * done // max(1, total)}%)")

    return report


def _read_timeout(marks: Mapping[int, int]) -> float:
    """Seconds allowed to read (or apply) the whole log: 10 minutes plus 10 ms per transaction."""
    return 600.0 + 0.01 * sum(m + 1 for m in marks.values())


def _submit_phase(
    options: ChaosOptions,
    schedule: list[Fault],
    cluster: LocalCluster,
    proxies: ClusterProxies,
    clients: ClientProcesses,
    stop: Event,
    gate: Synchronized[float],
    result: ChaosResult,
    say: Say,
    archiver: ChaosArchiver | None = None,
) -> float:
    """Let the clients submit while the faults strike; returns the phase's seconds.

    Without ``duration`` the clients submit their transactions, held at each fault's point until
    it struck. With it they submit until the duration is over and every fault of the schedule has
    struck (at most :data:`_LAST_FAULTS_GRACE` seconds more), then stop.
    """
    started = time.monotonic()
    total = options.transaction_bound
    timeout = options.submit_timeout
    duration = options.duration
    done_label = "drawn" if options.workload == "ledger" else "acknowledged"
    workers = clients.clients

    def progress() -> float:
        if duration is not None:
            return (time.monotonic() - started) / duration
        return sum(w.acked + w.failed for w in workers) / max(1, total)

    def set_gate(fraction: float) -> None:
        if duration is None:
            gate.value = fraction

    injector = FaultInjector(
        lambda: cluster,
        schedule,
        progress,
        proxies.clients,
        proxies.storages,
        say,
        gate=set_gate,
        archiver=archiver,
        split_to=options.split_to,
    )
    injector.start()
    last = started
    try:
        while not all(w.state in ("submitted", "done", "error") for w in workers):
            clients.pump(0.5)
            failure = archiver.failure() if archiver is not None else None
            if failure is not None:  # the archive checks would fail: say so now, not at the end
                raise RuntimeError(failure)
            now = time.monotonic()
            elapsed = now - started
            if duration is not None and elapsed > duration and not stop.is_set():
                pending = len(schedule) - len(injector.struck) - len(injector.errors)
                if pending <= 0 or elapsed > duration + _LAST_FAULTS_GRACE:
                    say(f"[{elapsed:7.1f}s] --duration {duration:g}s is over: submitting no more")
                    stop.set()
            if elapsed > timeout:
                raise TimeoutError(
                    f"the clients did not finish submitting within {timeout:g}s: "
                    + ", ".join(f"worker {w.index} {w.state} {w.acked} acked" for w in workers)
                )
            if now - last >= _PROGRESS_EVERY:
                last = now
                acked = sum(w.acked for w in workers)
                failed = sum(w.failed for w in workers)
                share = (
                    f"{elapsed / duration:.0%} of {duration:g}s"
                    if duration is not None
                    else f"{acked / max(1, total):.0%} of {total:,}"
                )
                say(
                    f"[{elapsed:7.1f}s] {acked:,} {done_label} ({share}), {failed} failed, "
                    f"{acked / elapsed:,.0f}/s"
                )
        clients.raise_errors()
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
            not injector.errors and unstruck == 0,
            f"{len(injector.struck)} struck"
            + (f", {unstruck} not reached" if unstruck else "")
            + (f"; errors: {injector.errors}" if injector.errors else "")
            + (f"; slow to recover: {len(injector.not_ready)}" if injector.not_ready else ""),
        )
    )
    return seconds


def _split_check(
    previous: int, to: int, marks: Mapping[int, int], first_ids: Mapping[int, int]
) -> ChaosCheck:
    """The split of ``--split-to`` completed: every partition of the new count has a writable
    owner, and every new one a genesis where its log starts (docs/design/splits.md "The handover")."""
    missing = sorted(set(range(to)) - set(marks))
    no_genesis = [pid for pid in range(previous, to) if pid not in first_ids]
    starts = ", ".join(f"{pid}: {first}" for pid, first in sorted(first_ids.items()))
    return ChaosCheck(
        f"the log split from {previous} to {to} partitions under the faults (a parent's owner "
        "killed during the handover)",
        not missing and not no_genesis,
        f"{len(marks)} partitions writable; the new ones start at {starts or 'nothing'}"
        + (f"; no writable owner for {missing}" if missing else "")
        + (f"; no genesis for {no_genesis}" if no_genesis else ""),
    )


def _archive_checks(
    cluster: LocalCluster,
    archiver: ChaosArchiver,
    marks: Mapping[int, int],
    result: ChaosResult,
    say: Say,
) -> dict[int, int]:
    """Stop the archiver and check the archive and the replicas' local ranges; the archived-throughs."""
    code = archiver.stop()
    say(f"archiver stopped (exit {code}) after {archiver.chunks} chunks over {archiver.starts} start(s)")
    result.checks.append(
        ChaosCheck(
            "the archiver ran through the run and stopped cleanly",
            code == 0 and archiver.chunks > 0,
            f"exit {code}, {archiver.chunks} chunks reported, started {archiver.starts} time(s)",
        )
    )
    result.checks.append(check_archive_verified(cluster, archiver.location))
    chunks, archived_through = check_chunks_once(archiver.location, cluster.num_partitions)
    result.checks.append(chunks)
    result.checks.append(check_online_local_ranges(cluster, marks))
    return archived_through


def _online_replicas(cluster: LocalCluster, marks: Mapping[int, int]) -> ChaosCheck:
    """Every replica holds the same records 0..mark, read through the admin ports."""
    digests = cluster.replica_digests(marks, timeout=120.0)
    differing = {pid: len(d) for pid, d in digests.items() if len(d) != 1}
    return ChaosCheck(
        "every replica serves the same records (admin port, after catching up)",
        not differing,
        f"{len(digests)} partitions compared" if not differing else f"differing: {differing}",
    )
