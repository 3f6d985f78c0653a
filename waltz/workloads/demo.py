"""The demo: an application under the SmallBank mix on a local Waltz cluster, with faults, then checked.

``waltz demo`` (README command one) runs :func:`run_demo` on the application of ``app``, the ledger
example by default (docs/design/overview.md, "Workloads"):

1. starts a local cluster (ZooKeeper, 3 storage nodes, 2 servers, as processes on loopback) and
   ``instances`` instances of the application sharing one database (SQLite by default);
2. opens the accounts and runs the SmallBank mix for ``transactions`` draws, with progress, then
   prints committed/s and the p50/p99 of submit -> commit and submit -> applied
   (:meth:`~waltz.workloads.smallbank.SmallBankStats.latency_line`);
3. unless ``faults`` is off: ``kill -9`` of one storage node at a third of the run and of the
   server owning partition 0 at half of it, both restarted a few seconds later;
4. unless ``evolve`` is off, for an application that keeps its earlier releases (the ledger's
   ``Account`` changed twice): the instances start on its first release, and its later releases
   are deployed while the mix runs, as docs/sql.md ("Changing a model") says a rolling deploy
   goes (:mod:`waltz.workloads.rollout`), so that the log holds every schema version; with
   ``batch`` every instance runs the current release from the start instead (a rolling deploy
   starts instances of earlier releases, and ``EvolvingApplication.release_instance`` does not
   batch);
5. waits for the sweepers to finish every transfer, then checks the invariants
   (:func:`~waltz.workloads.checks.check_application`: the ledger's include money conserved; after
   a deploy, the schema versions the log holds per entity) and prints them;
6. unless ``spark`` is off: rebuilds the application's tables from the log with Spark (``waltz
   rebuild``, into ``<name>-rebuilt.db`` in the work directory) at the live database's marks and
   checks that the live database has no drift from it (``docs/spark.md``); without PySpark this
   check fails and says what to install;
7. returns whether every check passed (the command's exit code).

With ``batch`` the instances submit through an ``EntityBatcher`` (docs/design/sql.md "Batched
entity transactions"): operations ready for a partition while its last log transaction is in
flight go as one log transaction, whose members the checks count one by one (each applied
exactly once); the run prints how many batches the instances committed and the operations they
carried.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from waltz.client import WaltzClientConfig
from waltz.jdbc_style import create_framework_engine
from waltz.local.cluster import LocalCluster
from waltz.local.layout import LAYOUT_FILE
from waltz.local.processes import wait_until
from waltz.perf.stats import add_batch_counts
from waltz.workloads.application import (
    DEFAULT_APPLICATION,
    EvolvingApplication,
    SmallBankApplication,
    SmallBankInstance,
    instance_batch_counts,
    load_application,
)
from waltz.workloads.checks import Check, check_application
from waltz.workloads.perf.database import check_database
from waltz.workloads.rollout import Rollout
from waltz.workloads.smallbank import SmallBankConfig, SmallBankStats, SmallBankWorkload

__all__ = ["DemoOptions", "DemoResult", "run_demo"]

log = logging.getLogger(__name__)

#: Seconds between the instances' scans for pending cross-partition steps.
SWEEP_INTERVAL = 0.5

Say = Callable[[str], None]
Progress = Callable[[str, int], Callable[[int], None]]


@dataclass(frozen=True)
class DemoOptions:
    """What the demo runs (the ``waltz demo`` options; ``app``: the application's module;
    ``batch``: the instances submit through an ``EntityBatcher``, and run the current release
    from the start, whatever ``evolve`` says)."""

    work_dir: Path
    db_url: str | None = None
    transactions: int = 3000
    instances: int = 3
    partitions: int = 4
    accounts: int = 200
    faults: bool = True
    seed: int = 7
    in_flight: int = 64
    spark: bool = True
    spark_master: str | None = None
    app: str = DEFAULT_APPLICATION
    evolve: bool = True
    batch: bool = False
    split_to: int | None = None


@dataclass
class DemoResult:
    """What happened (``batches``: ``(batches, members)``, the log transactions of more than one
    operation the instances' batchers committed and the operations they carried, ``(0, 0)``
    without ``batch``)."""

    stats: SmallBankStats
    checks: list[Check] = field(default_factory=list)
    faults: list[str] = field(default_factory=list)
    deploys: list[str] = field(default_factory=list)
    batches: tuple[int, int] = (0, 0)

    @property
    def passed(self) -> bool:
        """Every check passed and the workload raised no error."""
        return bool(self.checks) and all(c.passed for c in self.checks) and not self.stats.errors


class _Faults:
    """Kills a storage node and a server at set points of the run and restarts them later."""

    def __init__(self, cluster: LocalCluster, total: int, say: Say) -> None:
        self.cluster = cluster
        self.total = total
        self.say = say
        self.done = 0
        self.events: list[str] = []
        self._timers: list[threading.Timer] = []
        self._lock = threading.Lock()
        self._cancelled = False

    def progress(self, n: int) -> None:
        with self._lock:
            before, self.done = self.done, self.done + n
        if before < self.total // 3 <= self.done:
            self._kill_storage()
        if before < self.total // 2 <= self.done:
            self._kill_server()

    def _kill_storage(self) -> None:
        self.cluster.kill_storage(0)
        self._note("kill -9 storage node 0")
        self._later(3.0, lambda: self._restart("storage node 0", lambda: self.cluster.restart_storage(0)))

    def _kill_server(self) -> None:
        index = self.cluster.owner_index(0)
        self.cluster.kill_server(index)
        self._note(f"kill -9 server {index} (owner of partition 0)")
        self._later(3.0, lambda: self._restart(f"server {index}", lambda: self.cluster.restart_server(index)))

    def _restart(self, what: str, restart: Callable[[], None]) -> None:
        if self._cancelled:
            return
        try:
            restart()
        except Exception as exc:
            if self._cancelled:  # the run was interrupted: the cluster stopped under the restart
                return
            self._note(f"restarting {what} FAILED: {exc}")  # the checks then fail, naming the losses
            return
        self._note(f"restarted {what}")

    def _note(self, event: str) -> None:
        self.events.append(event)
        self.say(f"  fault: {event}")

    def _later(self, seconds: float, action: Callable[[], object]) -> None:
        timer = threading.Timer(seconds, action)
        timer.daemon = True
        self._timers.append(timer)
        timer.start()

    def finish(self) -> None:
        for timer in self._timers:
            timer.join(30)

    def cancel(self) -> None:
        """The run was interrupted: no restart starts any more, and one under way stops quietly
        when the cluster stops under it."""
        self._cancelled = True
        for timer in self._timers:
            timer.cancel()


class _Split:
    """Splits the log's partitions to ``to`` at 60 % of the run (``waltz cluster split``), on a
    thread of its own while the mix goes on (docs/design/splits.md "The handover")."""

    def __init__(self, cluster: LocalCluster, total: int, to: int, say: Say) -> None:
        self.cluster, self.total, self.to, self.say = cluster, total, to, say
        self.done = 0
        self.events: list[str] = []
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def progress(self, n: int) -> None:
        with self._lock:
            before, self.done = self.done, self.done + n
            start = before < self.total * 3 // 5 <= self.done and self._thread is None
            if start:
                self._thread = threading.Thread(target=self._run, name="waltz-demo-split", daemon=True)
        if start and self._thread is not None:
            self._thread.start()

    def _run(self) -> None:
        started = time.monotonic()
        self.say(f"  split: {self.to} partitions, under the mix")
        try:
            report = self.cluster.split(self.to, wait=120)
        except BaseException as exc:
            self.error = exc
            self.events.append(f"split to {self.to} failed: {exc!r}")
            self.say(f"  split: failed: {exc!r}")
            return
        state = "complete" if report.complete else "not complete"
        line = f"split to {self.to} partitions {state} in {time.monotonic() - started:.1f}s"
        self.events.append(line)
        self.say(f"  split: {line}")

    def finish(self) -> None:
        if self._thread is not None:
            self._thread.join(180)


def run_demo(options: DemoOptions, say: Say, progress: Progress) -> DemoResult:
    """Run the demo (see the module docstring).

    Args:
        options: what to run.
        say: prints a line.
        progress: ``progress(label, total)`` returns a function to call with increments.

    Returns:
        The workload's statistics and every check's result.

    Raises:
        ConfigurationError: ``options.app`` names no SmallBank application.
        UnusableDatabaseError: ``options.db_url`` is not a usable URL, cannot be reached, holds
            tables that are not the application's, or holds another log's marks (when the demo's
            cluster is a new one, not resumed from a kept work directory); checked before
            anything starts.
    """
    app = load_application(options.app)
    # A kept work directory resumes its cluster, and with it the same log.
    resumed = (options.work_dir / "cluster" / LAYOUT_FILE).exists()
    if options.db_url:
        check_database(app, options.db_url, new_log=not resumed, cluster_name=app.name)
    db_url = options.db_url or f"sqlite:///{options.work_dir / f'{app.name}.db'}"
    started = time.monotonic()
    say(
        "starting a local Waltz cluster: ZooKeeper, 3 storage nodes, 2 servers, "
        f"{options.partitions} partitions"
    )
    with LocalCluster(
        storages=3, servers=2, partitions=options.partitions, work_dir=options.work_dir / "cluster"
    ) as cluster:
        cluster.wait_ready(60)
        say(f"  ready in {time.monotonic() - started:.1f}s (work directory {options.work_dir})")
        engine = create_framework_engine(db_url)
        config = WaltzClientConfig(**cluster.client_settings())
        rollout: Rollout | None = None
        services: list[SmallBankInstance] = []
        migrated = ""
        evolves = options.evolve and isinstance(app, EvolvingApplication) and len(app.releases()) > 1
        if evolves and resumed:
            # The log (and the work directory's database) already hold the later releases' records:
            # instances of the first release could not read them, nor use a database migrated past it.
            evolves = False
            say(
                f"resuming the log of {options.work_dir}: the {app.name}'s releases were deployed on it "
                "before, so every instance runs the current release from the start (a new --work-dir "
                "shows the deploys mid-run)"
            )
        if evolves and options.batch:
            say(
                f"batches on: every {app.name} instance runs its current release from the start "
                "(no deploy mid-run: a deploy starts instances of earlier releases, which do not batch)"
            )
        if evolves and not options.batch and isinstance(app, EvolvingApplication):
            evolving = app
            rollout = Rollout(
                evolving,
                engine,
                lambda release: evolving.release_instance(
                    release, db_url, config, cluster_name=app.name, sweep_interval=SWEEP_INTERVAL
                ),
                instances=options.instances,
                total=options.transactions,
                first_customer=options.accounts,
                say=say,
            )
            rollout.prepare_first()
            migrated = f" for release 1 of {len(evolving.releases())}"
        else:
            app.prepare_database(engine)
        say(
            f"database {engine.url.render_as_string(hide_password=True)}: "
            f"framework and {app.name} tables migrated{migrated}"
        )
        try:
            if rollout is not None:
                services = rollout.start_first()
            else:
                # ``batch`` only when asked: an application written before batching takes no such argument.
                batching: dict[str, Any] = {"batch": True} if options.batch else {}
                for _ in range(options.instances):  # one by one: interrupted, those started are closed
                    services.append(
                        app.instance(
                            db_url, config, cluster_name=app.name, sweep_interval=SWEEP_INTERVAL, **batching
                        )
                    )
            workload = SmallBankWorkload(
                services,
                SmallBankConfig(accounts=options.accounts, seed=options.seed, in_flight=options.in_flight),
            )
            if rollout is not None:
                rollout.workload = workload
            say(
                f"{options.instances} {app.name} instances share the database"
                + (", each submitting through an EntityBatcher" if options.batch else "")
                + f"; opening {options.accounts} accounts"
            )
            workload.populate(progress("opening accounts", options.accounts))
            faults = _Faults(cluster, options.transactions, say) if options.faults else None
            split = _Split(cluster, options.transactions, options.split_to, say) if options.split_to else None
            bar = progress("SmallBank mix", options.transactions)

            def step(n: int) -> None:
                bar(n)
                if faults is not None:
                    faults.progress(n)
                if rollout is not None:
                    rollout.progress(n)
                if split is not None:
                    split.progress(n)

            try:
                stats = workload.run(options.transactions, step)
                if rollout is not None:
                    rollout.join()
                workload.wait_applied(60)  # the submit->applied latencies of the last ones
            except BaseException:
                if faults is not None:
                    faults.cancel()  # Ctrl-C: the cluster stops next, under any restart under way
                raise
            finally:
                workload.close()
            if faults is not None:
                faults.finish()
            if split is not None:
                split.finish()
            added = (
                f" ({stats.added} of them the run's own account closings and payments to closed accounts)"
                if stats.added
                else ""
            )
            say(
                f"ran {stats.submitted} transactions{added} and {stats.balances_read} balance reads in "
                f"{stats.seconds:.1f}s: {stats.committed} committed "
                f"({stats.transactions_per_second:,.0f}/s), "
                f"{stats.dropped} dropped by the rules, {stats.lock_failures} lock failures retried"
            )
            say(f"  {stats.latency_line()}")
            for reason, count in stats.drop_reasons.most_common(4):
                say(f"  dropped {count}: {reason}")
            say("waiting for the sweepers to finish every two-step transfer")
            _wait_quiet(app, engine, timeout=120)
            if rollout is not None:
                rollout.finish()
                services = list(rollout.instances)
            # Every partition there is, a split's new ones too once opened.
            client = services[0].client
            server_marks = {p: client.get_high_water_mark(p) for p in client.partition_ids}
            for service in services:
                for pid, mark in server_marks.items():
                    if mark >= 0 and not service.callbacks.wait_for(pid, mark, 60):
                        raise TimeoutError(f"partition {pid} not applied up to {mark} within 60s")
            batches = _batch_totals(services)
            if options.batch:
                say(f"  {_batches_line(batches)}")
            say("reading the whole log back with a fresh client, and every replica from the storage nodes")
            replicas = cluster.replica_digests(server_marks)
            checks = check_application(
                app,
                engine,
                cluster_name=app.name,
                server_marks=server_marks,
                client_config=config,
                replicas=replicas,
                schema_versions=None if rollout is None else rollout.app.schema_versions(),
            )
            if options.spark:
                checks.append(
                    spark_rebuild_check(
                        app,
                        cluster,
                        db_url,
                        f"sqlite:///{options.work_dir / f'{app.name}-rebuilt.db'}",
                        app.name,
                        say,
                        master=options.spark_master,
                    )
                )
            uncaught = sum(s.callbacks.uncaught_count for s in services)
            uncaught += 0 if rollout is None else rollout.retired_uncaught
            checks.append(
                Check("no apply ever failed", uncaught == 0, f"uncaught_exception calls: {uncaught}")
            )
            if split is not None:
                checks.append(
                    Check(
                        f"the log split to {options.split_to} partitions under the mix",
                        split.error is None and any("complete in" in e for e in split.events),
                        "; ".join(split.events) or "the split never started",
                    )
                )
            result = DemoResult(
                stats,
                checks,
                [
                    *(faults.events if faults is not None else []),
                    *(split.events if split is not None else []),
                ],
                [] if rollout is None else rollout.events,
                batches,
            )
        finally:
            if rollout is not None:
                rollout.close()
            for service in services:
                service.close()
            engine.dispose()
    for check in result.checks:
        say(f"{'PASS' if check.passed else 'FAIL'}  {check.name}: {check.detail}")
    for error in result.stats.errors[:5]:
        say(f"ERROR {error}")
    summary = f"{'PASSED' if result.passed else 'FAILED'} in {time.monotonic() - started:.0f}s"
    if options.batch:
        summary += f" (batches on: {_batches_line(result.batches)})"
    say(summary)
    return result


def _batch_totals(services: list[SmallBankInstance]) -> tuple[int, int]:
    """``(batches, members)`` of every instance's batcher since it started."""
    batches, members, _ = add_batch_counts(instance_batch_counts(service) for service in services)
    return (batches, members)


def _batches_line(batches: tuple[int, int]) -> str:
    """``12 batches carried 80 operations (6.7 per batch)``: what the instances' batchers committed."""
    count, members = batches
    mean = f" ({members / count:.1f} per batch)" if count else ""
    return f"{count:,} batches carried {members:,} operations{mean}"


def spark_rebuild_check(
    app: SmallBankApplication,
    cluster: LocalCluster,
    live_url: str,
    rebuilt_url: str,
    cluster_name: str,
    say: Say,
    *,
    master: str | None = None,
) -> Check:
    """Rebuild an application's tables from the log with Spark and compare them with the live database.

    The live database is read in one snapshot with its marks, the log up to exactly those marks
    (``waltz.spark.drift.verify``, from ``cluster``'s storage nodes with the operator's
    certificate and ZooKeeper credential) through the application's views; the views are also written to
    ``rebuilt_url``.

    Returns:
        A check that passes when no table differs; it fails (saying what to install) when PySpark
        or pyarrow is missing, or the JDBC driver of a PostgreSQL or MariaDB database, and when
        the rebuild could not run.
    """
    name = "Spark rebuild from the log equals the live database"
    from waltz.errors import ConfigurationError
    from waltz.spark.errors import SparkUnavailableError
    from waltz.spark.session import require_jdbc_driver, require_spark

    try:
        require_spark()
        require_jdbc_driver(live_url, "the live database")
        require_jdbc_driver(rebuilt_url, "the rebuilt database")
    except (SparkUnavailableError, ConfigurationError) as exc:
        say(f"Spark rebuild: cannot run: {exc}")
        return Check(name, False, f"not run: {exc}")
    from pyspark.sql import SparkSession

    from waltz.spark.drift import verify
    from waltz.spark.rebuild import LogSource
    from waltz.spark.session import spark_session

    say(f"rebuilding the {app.name} from the log with Spark ({master or 'local[*]'}) and checking for drift")
    shared = SparkSession.getActiveSession() is not None  # a caller's session (tests) is left running
    # The demo prints its own progress lines; Spark's stage bars would be drawn over them, and its
    # start-up notices printed between them.
    spark = spark_session(master, app_name="waltz-demo-rebuild", console_progress=False, quiet_start=True)
    try:
        spark.sparkContext.setLogLevel("ERROR")
        report = verify(
            spark,
            app.views(),
            LogSource.live(cluster.admin_settings("operator")),
            live_url,
            db_url=rebuilt_url,
            cluster_name=cluster_name,
            progress=lambda line: say(f"  {line}"),
        )
    except Exception as exc:  # a failed Spark job (Py4J's errors), the log or a database: a failed check
        log.warning("the Spark rebuild failed", exc_info=True)
        return Check(name, False, f"the rebuild failed: {type(exc).__name__}: {str(exc)[:500]}")
    finally:
        if not shared:
            spark.stop()
    for line in report.lines():
        say(f"  {line}")
    detail = f"{len(report.tables)} tables compared at marks {dict(report.marks)}" + (
        "" if not report.drift else ": " + "; ".join(f"{t.table} differs" for t in report.tables if t.drift)
    )
    return Check(name, not report.drift, detail)


def _wait_quiet(app: SmallBankApplication, engine: Engine, timeout: float) -> None:
    wait_until(
        lambda: app.pending_steps(engine) == 0,
        timeout=timeout,
        what="every two-step transfer to be credited or refunded",
    )
