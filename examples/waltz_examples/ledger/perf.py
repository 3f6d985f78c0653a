"""``waltz perf smallbank``: the ledger's SmallBank mix from N instance processes on one database.

It measures the application path as a user sees it: a :class:`LedgerService` (Waltz client, SQL
change-set callbacks, transfer sweeper) per process, as a deployment runs one instance per process
(instances in one process would share one GIL), all on one shared database.

1. :func:`check_database`: the database is reachable and empty, or holds only this ledger's
   tables (and, for a new log, no marks of another one); :func:`perf_database` makes a temporary
   SQLite database when none is given.
2. :func:`run_smallbank` migrates the database, opens the accounts once (one instance in this
   process, closed before the measured phase) and waits until they are applied; then starts
   ``instances`` processes (``spawn``), each with its own ``LedgerService`` and its share of the
   draws with its own seed. Each mounts, reads one balance (a warm-up), reports ready and waits
   for the start event: the measured phase starts together, so committed/s covers one window,
   from the start to the end of the last instance's mix (every transaction resolved).
3. Each instance times, per log transaction of its mix that committed, submit -> commit and
   submit -> applied (its own client applied it: read-your-writes), in HdrHistograms
   (:class:`~waltz_examples.ledger.smallbank.SmallBankStats`); dropped transactions and errors
   are counted. The histograms cross processes encoded and are merged here.
4. The instances' sweepers keep finishing two-step transfers until none is pending; the
   instances then stop, an instance in this process applies the log up to the servers'
   high-water marks, and the ledger's invariants are checked
   (:func:`waltz_examples.ledger.checks.run_checks`, without the replica comparison: the run does
   not know the cluster's nodes).

Every wait is bounded; on an error, a timeout or Ctrl-C the instance processes are killed and
reaped. Figures are reported, never asserted.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import queue
import shutil
import signal
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, inspect, select
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError, SQLAlchemyError

from waltz import WaltzClientConfig, tune_garbage_collector
from waltz.jdbc_style import create_framework_engine
from waltz.jdbc_style import migrations_api as framework_migrations
from waltz.jdbc_style.schema import high_water_marks
from waltz.jdbc_style.schema import metadata as framework_metadata
from waltz.local.processes import wait_until
from waltz.perf.cost import measure_nodes
from waltz.perf.producer import client_stage_totals
from waltz.perf.stats import LatencyHistogram
from waltz_examples.ledger import migrations_api as ledger_migrations
from waltz_examples.ledger.checks import Check, read_log, run_checks
from waltz_examples.ledger.models import Base
from waltz_examples.ledger.service import LedgerService, prepare_database
from waltz_examples.ledger.smallbank import SmallBankConfig, SmallBankStats, SmallBankWorkload
from waltz_examples.ledger.transfers import pending_transfers

__all__ = [
    "InstanceFigures",
    "SmallBankPerfReport",
    "SmallBankPerfSettings",
    "SmallBankRunError",
    "UnusableDatabaseError",
    "check_database",
    "perf_database",
    "run_smallbank",
]

#: Seconds an instance may take to start, mount every partition and warm up.
START_TIMEOUT = 120.0
#: Seconds the accounts' openings may take to commit and apply.
POPULATE_TIMEOUT = 120.0
#: Seconds an instance waits, after its mix, for its client to apply what it committed.
APPLIED_TIMEOUT = 60.0
#: Seconds the sweepers may take to finish every two-step transfer after the mix.
QUIET_TIMEOUT = 120.0
#: Seconds an instance may take to stop (flush its client, close), and the final applies.
STOP_TIMEOUT = 60.0
#: Seconds between the sweepers' outbox scans.
SWEEP_INTERVAL = 0.5
#: Error descriptions kept per instance and in the report.
ERROR_SAMPLES = 10

#: The tables a database may hold besides none: the framework's and the ledger's, with their
#: alembic version tables.
LEDGER_TABLES = (
    frozenset(framework_metadata.tables)
    | frozenset(Base.metadata.tables)
    | {
        framework_migrations.VERSION_TABLE,
        ledger_migrations.VERSION_TABLE,
    }
)

Say = Callable[[str], None]


class UnusableDatabaseError(ValueError):
    """The ``--db`` database cannot be used: a bad URL, unreachable, or holding other tables."""


class SmallBankRunError(RuntimeError):
    """The run could not complete: an instance process failed, or a phase timed out."""


@dataclass(frozen=True, slots=True)
class SmallBankPerfSettings:
    """A ``waltz perf smallbank`` run.

    Attributes:
        instances: instance processes, each with its own ``LedgerService``.
        transactions: measured SmallBank draws in all (Balance reads included), split across the
            instances (the first ones take one more when it does not divide).
        accounts: SmallBank customers (at least 2), opened once before the measured phase.
        in_flight: log transactions each instance keeps submitted and unresolved at most.
        submitters: threads per instance that submit (each runs a first attempt's reads).
        seed: the accounts' opening balances use it; instance ``i`` draws with ``seed + 1 + i``.
        timeout: seconds the measured phase may take.
        cluster_name: the log's name in the database's mark rows.
        partition_routing: partition-routed instances: instance ``i`` of ``N`` mounts the
            partitions ``p`` with ``p mod N == i`` and submits the transactions of their
            customers (a request goes to the instance of its customer's partition), so each
            partition is applied by one instance. Off: every instance mounts every partition
            and submits for any customer (requests spread round-robin).
        entity_cache: the instances keep entity rows as their applies leave them (operations on
            cached entities read no database snapshot); off: every attempt reads a snapshot.
        rate: draws per second in all (Balance reads included), split evenly across the
            instances, each on a fixed schedule whose start times the latencies count from;
            None: as fast as ``in_flight`` allows.
        warm_up: draws each instance runs before the measured phase, as fast as ``in_flight``
            allows, counted nowhere, and applies before the phase starts: its first transactions
            open database connections and fill the entity cache, which a service that has been
            running has done (0: none).

    Raises:
        ValueError: a count below its minimum, or a timeout not above 0.
    """

    instances: int = 3
    transactions: int = 6000
    accounts: int = 200
    in_flight: int = 21
    submitters: int = SmallBankConfig.submitters
    seed: int = 7
    timeout: float = 600.0
    cluster_name: str = "ledger"
    partition_routing: bool = False
    entity_cache: bool = True
    rate: float | None = None
    warm_up: int = 100

    def __post_init__(self) -> None:
        if self.rate is not None and not self.rate > 0:
            raise ValueError(f"rate must be above 0 draws per second, got {self.rate}")
        minimums = {
            "instances": 1,
            "transactions": 0,
            "accounts": 2,
            "in_flight": 1,
            "submitters": 1,
            "warm_up": 0,
        }
        for name, minimum in minimums.items():
            if getattr(self, name) < minimum:
                raise ValueError(f"{name} must be at least {minimum}, got {getattr(self, name)}")
        if not self.timeout > 0:
            raise ValueError(f"timeout must be above 0 seconds, got {self.timeout}")

    def shares(self) -> list[int]:
        """Each instance's draws (they add up to :attr:`transactions`)."""
        base, extra = divmod(self.transactions, self.instances)
        return [base + (1 if i < extra else 0) for i in range(self.instances)]

    def describe(self) -> str:
        """One line: instances, draws, accounts, concurrency, seed."""
        share = self.shares()
        each = f"{share[0]:,}" if len(set(share)) == 1 else f"{min(share):,}-{max(share):,}"
        return (
            f"{self.instances} instance process(es) x {each} draws ({self.transactions:,} in all), "
            f"{self.accounts} accounts, {self.in_flight} in flight and {self.submitters} submitter(s) "
            f"per instance, seed {self.seed}"
            + (", partition-routed" if self.partition_routing else "")
            + ("" if self.entity_cache else ", no entity cache")
            + ("" if self.rate is None else f", {self.rate:,g} draws/s scheduled")
            + f", {self.warm_up:,} warm-up draws per instance"
        )

    def summary(self) -> dict[str, Any]:
        """The settings as a JSON-ready dict."""
        return {
            "instances": self.instances,
            "transactions": self.transactions,
            "accounts": self.accounts,
            "in_flight": self.in_flight,
            "submitters": self.submitters,
            "seed": self.seed,
            "timeout": self.timeout,
            "partition_routing": self.partition_routing,
            "entity_cache": self.entity_cache,
            "rate": self.rate,
        }


# --- the database -----------------------------------------------------------------------------------


def _render(url: str) -> str:
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return url


@contextlib.contextmanager
def perf_database(db_url: str | None) -> Iterator[str]:
    """Yield ``db_url``, or without one the URL of a SQLite file in a temporary directory that is
    removed when the block ends."""
    if db_url is not None:
        yield db_url
        return
    directory = tempfile.mkdtemp(prefix="waltz-perf-smallbank-")
    try:
        yield f"sqlite:///{directory}/ledger.db"
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def check_database(db_url: str, *, new_log: bool, cluster_name: str = "ledger") -> None:
    """Check that the run may use the database, before anything starts.

    Args:
        db_url: a SQLAlchemy URL (SQLite, PostgreSQL, MariaDB/MySQL).
        new_log: the log is new (a local cluster started for the run): the database must then hold
            no marks of ``cluster_name`` either (they would belong to another log).
        cluster_name: the log's name in the mark rows.

    Raises:
        UnusableDatabaseError: a bad URL or a missing driver; the database cannot be reached; it
            holds tables that are not this ledger's; or (``new_log``) it holds another log's marks.
    """
    shown = _render(db_url)
    try:
        engine = create_framework_engine(db_url)
    except (ArgumentError, NoSuchModuleError, ImportError, ValueError) as exc:
        raise UnusableDatabaseError(
            f"--db {shown!r} is not a usable database URL ({type(exc).__name__}: {exc}); e.g. "
            "postgresql+psycopg://postgres@127.0.0.1/bench or mysql+pymysql://root@127.0.0.1/bench"
        ) from exc
    try:
        with engine.connect() as conn:
            tables = set(inspect(conn).get_table_names())
            foreign = sorted(tables - LEDGER_TABLES)
            if foreign:
                more = f" and {len(foreign) - 8} more" if len(foreign) > 8 else ""
                listed = ", ".join(foreign[:8]) + more
                raise UnusableDatabaseError(
                    f"the database {shown} holds tables that are not the ledger's ({listed}): give "
                    "--db an empty database, or one that holds only this ledger's tables"
                )
            if new_log and high_water_marks.name in tables:
                marks = conn.execute(
                    select(high_water_marks.c.partition_id).where(
                        high_water_marks.c.cluster_name == cluster_name
                    )
                ).all()
                if marks:
                    raise UnusableDatabaseError(
                        f"the database {shown} holds the ledger of another log (marks of "
                        f"{cluster_name!r} for {len(marks)} partition(s)); a cluster started for the "
                        "run has a new log: give --db an empty database"
                    )
    except (SQLAlchemyError, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UnusableDatabaseError(
            f"cannot use the database {shown}: {type(exc).__name__}: {first}"
        ) from exc
    finally:
        engine.dispose()


# --- an instance process -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _InstanceSpec:
    """What an instance process runs (pickled to it)."""

    index: int
    draws: int
    db_url: str
    zookeeper: str
    cluster_root: str
    client_settings: dict[str, Any]
    settings: SmallBankPerfSettings
    partitions: tuple[int, ...] | None = None


def _stats_to_wire(stats: SmallBankStats) -> dict[str, Any]:
    return {
        "submitted": stats.submitted,
        "committed": stats.committed,
        "dropped": stats.dropped,
        "balances_read": stats.balances_read,
        "lock_failures": stats.lock_failures,
        "error_count": len(stats.errors),
        "errors": list(dict.fromkeys(stats.errors))[:ERROR_SAMPLES],
        "by_op": dict(stats.by_op),
        "drop_reasons": dict(stats.drop_reasons),
        "seconds": stats.seconds,
        "commit_latency": stats.commit_latency.encode(),
        "applied_latency": stats.applied_latency.encode(),
    }


def _run_instance(spec: _InstanceSpec, start: Any, stop: Any, results: Any) -> None:
    """One instance: mount, warm up, report ready, run the mix at the start event, report its
    figures, sweep until told to stop, then close and report its apply failures."""
    settings = spec.settings
    service = LedgerService(
        spec.db_url,
        zookeeper=spec.zookeeper,
        cluster_root=spec.cluster_root,
        cluster_name=settings.cluster_name,
        client_settings=spec.client_settings,
        sweep_interval=SWEEP_INTERVAL,
        prepare=False,
        partitions=spec.partitions,
        entity_cache=settings.entity_cache,
    )
    try:
        service.client.wait_mounted(START_TIMEOUT)
        with contextlib.suppress(KeyError):
            service.balance(0)  # a first connection and query before the window opens
        # The process is this instance's alone: its start-up objects (modules, models, compiled
        # statements) leave the collector's generations, as in the cluster's own processes.
        tune_garbage_collector()
        config = SmallBankConfig(
            accounts=settings.accounts,
            in_flight=settings.in_flight,
            seed=settings.seed + 1 + spec.index,
            submitters=settings.submitters,
            rate=None if settings.rate is None else settings.rate / settings.instances,
        )
        workload = SmallBankWorkload([service], config)
        try:
            unsettled = workload.warm_up(settings.warm_up, APPLIED_TIMEOUT)
            results.put(("ready", spec.index, unsettled))
            if not start.wait(START_TIMEOUT + 30):
                raise TimeoutError(f"no start within {START_TIMEOUT + 30:g}s")
            started = time.time()
            cpu_started = time.process_time()
            stages_started = client_stage_totals(service.client)
            cache_started = _cache_counts(service)
            stats = workload.run(spec.draws)
            cache_counts = _cache_counts(service)
            ended = time.time()
            cpu_seconds = time.process_time() - cpu_started
            stages = client_stage_totals(service.client)
            workload.wait_applied(APPLIED_TIMEOUT)
            unapplied = workload.unapplied
        finally:
            workload.close()
        wire = _stats_to_wire(stats)
        wire.update(
            index=spec.index,
            draws=spec.draws,
            seed=config.seed,
            started=started,
            ended=ended,
            cpu_seconds=cpu_seconds,
            unapplied=unapplied,
            client_stages={
                stage: [seconds - stages_started[stage][0], count - stages_started[stage][1]]
                for stage, (seconds, count) in stages.items()
            },
            entity_cache=[now - then for now, then in zip(cache_counts, cache_started, strict=True)],
        )
        results.put(("result", spec.index, wire))
        # The sweeper keeps finishing transfers (of every instance) until the coordinator says stop.
        if not stop.wait(QUIET_TIMEOUT + STOP_TIMEOUT + 30):
            raise TimeoutError("no stop from the coordinator")
        service.client.flush(STOP_TIMEOUT)  # steps the sweeper has in flight end first
    finally:
        uncaught = service.callbacks.uncaught_count
        service.close()
    results.put(("closed", spec.index, {"uncaught": uncaught}))


def _cache_counts(service: LedgerService) -> tuple[int, int]:
    """The instance's entity cache hits and misses so far ((0, 0) when it has none)."""
    cache = service.callbacks.entity_cache
    return (0, 0) if cache is None else (cache.hits, cache.misses)


def _instance_process(spec: _InstanceSpec, start: Any, stop: Any, results: Any) -> None:
    # Ctrl-C reaches the whole process group: the coordinator stops the instances.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        _run_instance(spec, start, stop, results)
    except BaseException as exc:
        results.put(("error", spec.index, f"{type(exc).__name__}: {exc}"))


# --- the figures -------------------------------------------------------------------------------------


@dataclass
class InstanceFigures:
    """What one instance process measured.

    Attributes:
        index: the instance (0-based).
        draws: its SmallBank draws.
        seed: its workload's seed.
        started / ended: wall-clock seconds (``time.time()``) of its measured phase.
        stats: its counts and latency histograms.
        error_count: its errors (``stats.errors`` holds up to :data:`ERROR_SAMPLES` of them).
        unapplied: committed transactions its client had not applied :data:`APPLIED_TIMEOUT`
            seconds after its mix (missing from ``stats.applied_latency``).
        cpu_seconds: CPU seconds (user + system, every thread) the process spent in the phase.
        client_stages: the client's stage metrics over the phase, ``stage -> (seconds, count)``
            (``waltz.perf.producer.CLIENT_STAGES``).
        uncaught: ``uncaught_exception`` calls of its callbacks (failed applies).
        entity_cache: attempts whose entities its entity cache held, and attempts that read a
            database snapshot, over the phase (``(0, 0)`` without a cache).
    """

    index: int
    draws: int
    seed: int
    started: float
    ended: float
    stats: SmallBankStats
    error_count: int = 0
    unapplied: int = 0
    cpu_seconds: float = 0.0
    client_stages: dict[str, tuple[float, float]] = field(default_factory=dict)
    uncaught: int = 0
    entity_cache: tuple[int, int] = (0, 0)

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> InstanceFigures:
        """The figures of an instance process's message (its histograms decoded)."""
        stats = SmallBankStats(
            submitted=int(wire["submitted"]),
            committed=int(wire["committed"]),
            dropped=int(wire["dropped"]),
            balances_read=int(wire["balances_read"]),
            lock_failures=int(wire["lock_failures"]),
            errors=list(wire["errors"]),
            by_op=Counter(wire["by_op"]),
            drop_reasons=Counter(wire["drop_reasons"]),
            seconds=float(wire["seconds"]),
            commit_latency=LatencyHistogram.decode(wire["commit_latency"]),
            applied_latency=LatencyHistogram.decode(wire["applied_latency"]),
        )
        return cls(
            index=int(wire["index"]),
            draws=int(wire["draws"]),
            seed=int(wire["seed"]),
            started=float(wire["started"]),
            ended=float(wire["ended"]),
            stats=stats,
            error_count=int(wire["error_count"]),
            unapplied=int(wire["unapplied"]),
            cpu_seconds=float(wire["cpu_seconds"]),
            client_stages={k: (float(s), float(c)) for k, (s, c) in wire["client_stages"].items()},
            entity_cache=(int(wire["entity_cache"][0]), int(wire["entity_cache"][1])),
        )

    @property
    def seconds(self) -> float:
        """Seconds of its measured phase (never below 1 µs)."""
        return max(1e-6, self.ended - self.started)

    @property
    def committed_per_second(self) -> float:
        """Its committed log transactions per second of its own phase."""
        return self.stats.committed / self.seconds

    def summary(self) -> dict[str, Any]:
        """JSON-ready: ``instance``, ``draws``, ``seed``, ``seconds``, ``committed``,
        ``committed_per_second``, ``submitted``, ``dropped``, ``balances_read``,
        ``lock_failures``, ``errors`` (a count), ``unapplied``, ``cpu_seconds``."""
        return {
            "instance": self.index,
            "draws": self.draws,
            "seed": self.seed,
            "seconds": round(self.seconds, 3),
            "committed": self.stats.committed,
            "committed_per_second": round(self.committed_per_second, 1),
            "submitted": self.stats.submitted,
            "dropped": self.stats.dropped,
            "balances_read": self.stats.balances_read,
            "lock_failures": self.stats.lock_failures,
            "errors": self.error_count,
            "unapplied": self.unapplied,
            "cpu_seconds": round(self.cpu_seconds, 3),
        }


@dataclass
class SmallBankPerfReport:
    """A run's figures (merged over the instances) and the ledger's checks.

    Attributes:
        settings: what ran.
        database: the database URL, password hidden.
        instances: each instance's figures, by index.
        total: the instances' counts and histograms merged; ``seconds`` is the common window.
        checks: the ledger's invariants after the run.
        node_cpu_seconds: CPU seconds each cluster process spent from the start of the measured
            phase until every instance reported (empty for a cluster the run did not start).
        partitions: the log's partitions (0: not known).
        warnings: what makes the figures hard to compare (e.g. instances of unequal shares).
        server_lock_failures: appends the servers' lock checks refused during the measured phase
            (each cost a round trip; the others of ``lock_failures`` the clients found themselves),
            None when the servers' metrics were not read.
    """

    settings: SmallBankPerfSettings
    database: str
    instances: list[InstanceFigures]
    total: SmallBankStats = field(default_factory=SmallBankStats)
    checks: list[Check] = field(default_factory=list)
    node_cpu_seconds: dict[str, float] = field(default_factory=dict)
    partitions: int = 0
    warnings: list[str] = field(default_factory=list)
    server_lock_failures: int | None = None

    def __post_init__(self) -> None:
        total = SmallBankStats()
        for figures in self.instances:
            stats = figures.stats
            total.submitted += stats.submitted
            total.committed += stats.committed
            total.dropped += stats.dropped
            total.balances_read += stats.balances_read
            total.lock_failures += stats.lock_failures
            total.errors.extend(e for e in stats.errors if e not in total.errors)
            total.by_op.update(stats.by_op)
            total.drop_reasons.update(stats.drop_reasons)
            total.commit_latency.add(stats.commit_latency)
            total.applied_latency.add(stats.applied_latency)
        del total.errors[ERROR_SAMPLES:]
        if self.instances:
            started = min(f.started for f in self.instances)
            total.seconds = max(1e-6, max(f.ended for f in self.instances) - started)
        self.total = total

    @property
    def error_count(self) -> int:
        """Errors over every instance."""
        return sum(f.error_count for f in self.instances)

    @property
    def unapplied(self) -> int:
        """Committed transactions whose apply their instance did not see in time."""
        return sum(f.unapplied for f in self.instances)

    def entity_cache_counts(self) -> tuple[int, int]:
        """``(hits, misses)`` of the instances' entity caches over their phases."""
        return (
            sum(f.entity_cache[0] for f in self.instances),
            sum(f.entity_cache[1] for f in self.instances),
        )

    @property
    def lock_failures_per_committed(self) -> float:
        """Lock failures (each a re-executed attempt) per committed log transaction."""
        return self.total.lock_failures / self.total.committed if self.total.committed else 0.0

    @property
    def passed(self) -> bool:
        """Every check passed (and there were checks)."""
        return bool(self.checks) and all(c.passed for c in self.checks)

    def cpu_microseconds_per_transaction(self) -> dict[str, float]:
        """CPU µs per committed transaction: ``instances`` (all instance processes, their measured
        phase), then each cluster process by name; empty when nothing committed."""
        if not self.total.committed:
            return {}
        spent = {"instances": sum(f.cpu_seconds for f in self.instances), **self.node_cpu_seconds}
        return {name: seconds * 1e6 / self.total.committed for name, seconds in spent.items()}

    def client_stage_ms(self) -> dict[str, float]:
        """Mean milliseconds of each stage the instances' clients timed, over every transaction
        they submitted (the sweepers' steps included)."""
        totals: dict[str, tuple[float, float]] = {}
        for figures in self.instances:
            for stage, (seconds, count) in figures.client_stages.items():
                mine = totals.get(stage, (0.0, 0.0))
                totals[stage] = (mine[0] + seconds, mine[1] + count)
        return {stage: seconds * 1e3 / count for stage, (seconds, count) in totals.items() if count}

    def summary(self) -> dict[str, Any]:
        """The figures as one JSON-ready dict.

        Keys: ``seconds`` (the common window), ``committed_per_second``, ``draws``,
        ``submitted``, ``committed``, ``dropped``, ``drop_reasons`` (reason with numbers as
        ``N`` -> count), ``balances_read``, ``lock_failures``, ``lock_failures_per_committed``,
        ``errors`` (a count), ``error_samples``, ``unapplied``, ``latency_ms``
        (``submit_to_commit`` and ``submit_to_applied``: ``p50``, ``p90``, ``p99``, ``p99.9``,
        ``max``, ``mean`` in ms, None when empty, and ``count``), ``cpu_us_per_transaction``,
        ``client_stage_ms``, ``per_instance`` (:meth:`InstanceFigures.summary` each),
        ``checks`` (``name``, ``passed``, ``detail``), ``passed``, ``database``, ``settings``,
        ``partitions``, ``warnings``, ``server_lock_failures`` (None: not read).
        """
        total = self.total
        return {
            "seconds": round(total.seconds, 3),
            "committed_per_second": round(total.transactions_per_second, 1),
            "draws": sum(f.draws for f in self.instances),
            "submitted": total.submitted,
            "committed": total.committed,
            "dropped": total.dropped,
            "drop_reasons": dict(total.drop_reasons.most_common()),
            "balances_read": total.balances_read,
            "lock_failures": total.lock_failures,
            "lock_failures_per_committed": round(self.lock_failures_per_committed, 4),
            "entity_cache": dict(zip(("hits", "misses"), self.entity_cache_counts(), strict=True)),
            "errors": self.error_count,
            "error_samples": list(total.errors),
            "unapplied": self.unapplied,
            "latency_ms": {
                "submit_to_commit": total.commit_latency.summary(),
                "submit_to_applied": total.applied_latency.summary(),
            },
            "cpu_us_per_transaction": {
                name: round(us, 1) for name, us in self.cpu_microseconds_per_transaction().items()
            },
            "client_stage_ms": {stage: round(ms, 3) for stage, ms in self.client_stage_ms().items()},
            "per_instance": [f.summary() for f in self.instances],
            "checks": [{"name": c.name, "passed": c.passed, "detail": c.detail} for c in self.checks],
            "passed": self.passed,
            "database": self.database,
            "settings": self.settings.summary(),
            "partitions": self.partitions,
            "warnings": list(self.warnings),
            "server_lock_failures": self.server_lock_failures,
        }

    def text(self) -> str:
        """The figures and the checks as the lines the CLI prints."""
        total = self.total
        lines = [
            f"committed {total.committed:,} log transactions in {total.seconds:.2f} s: "
            f"{total.transactions_per_second:,.1f} committed/s (all instances, one window)",
            f"submitted {total.submitted:,}, dropped by the rules {total.dropped:,}, balances read "
            f"{total.balances_read:,}, errors {self.error_count:,}",
        ]
        lines += [f"  dropped {count:,}: {reason}" for reason, count in total.drop_reasons.most_common()]
        refused = ""
        if self.server_lock_failures is not None:
            refused = f", {self.server_lock_failures:,} refused by the servers"
        lines.append(
            f"lock failures per committed transaction: {self.lock_failures_per_committed:.4f} "
            f"({total.lock_failures:,} in all{refused})"
        )
        hits, misses = self.entity_cache_counts()
        if hits + misses:
            lines.append(
                f"entity cache: {hits:,} attempt(s) read no database snapshot, {misses:,} read one "
                f"({100 * hits / (hits + misses):.1f} % from the cache)"
            )
        lines.append(total.commit_latency.text("submit->commit"))
        lines.append(total.applied_latency.text("submit->applied"))
        if self.unapplied:
            lines.append(f"not seen applied in time (left out of submit->applied): {self.unapplied:,}")
        per = ", ".join(f"{f.index} {f.committed_per_second:,.1f}" for f in self.instances)
        lines.append(f"committed/s per instance: {per}")
        cpu = self.cpu_microseconds_per_transaction()
        if cpu:
            parts = ", ".join(f"{name} {us:,.0f}" for name, us in cpu.items())
            lines.append(f"CPU per committed transaction (µs): {parts}")
        stages = self.client_stage_ms()
        if stages:
            parts = ", ".join(f"{stage} {ms:,.2f}" for stage, ms in stages.items())
            lines.append(f"client stages, mean (ms): {parts}")
        lines += [f"{'PASS' if c.passed else 'FAIL'}  {c.name}: {c.detail}" for c in self.checks]
        lines += [f"error: {e}" for e in total.errors]
        lines += [f"warning: {w}" for w in self.warnings]
        return "\n".join(lines)


# --- the coordinator ---------------------------------------------------------------------------------


def _client_settings(config: WaltzClientConfig) -> dict[str, Any]:
    """The configuration's explicitly set client fields, for each ``LedgerService``'s client."""
    settings = config.model_dump(exclude_unset=True)
    settings.pop("zookeeper_connect_string", None)
    settings.pop("cluster_root", None)
    return settings


def _open_accounts(
    db_url: str, zookeeper: str, root: str, client_settings: dict[str, Any], settings: SmallBankPerfSettings
) -> tuple[int, int]:
    """Open every account through one instance in this process; returns its failed applies and
    the log's number of partitions."""
    with LedgerService(
        db_url,
        zookeeper=zookeeper,
        cluster_root=root,
        cluster_name=settings.cluster_name,
        client_settings=client_settings,
        sweep_interval=None,
        prepare=False,
    ) as opener:
        opener.client.wait_mounted(START_TIMEOUT)
        config = SmallBankConfig(
            accounts=settings.accounts,
            in_flight=max(settings.in_flight, 64),
            seed=settings.seed,
            submitters=settings.submitters,
            record_latency=False,
        )
        workload = SmallBankWorkload([opener], config)
        try:
            workload.populate(timeout=POPULATE_TIMEOUT)
        except TimeoutError as exc:
            raise SmallBankRunError(f"opening the accounts: {exc}") from exc
        finally:
            workload.close()
        if workload.stats.errors:
            raise SmallBankRunError(f"opening the accounts failed: {workload.stats.errors[:3]}")
        return opener.callbacks.uncaught_count, opener.num_partitions


class _Instances:
    """The instance processes and their messages; kills and reaps them on :meth:`close`."""

    def __init__(self, specs: Sequence[_InstanceSpec]) -> None:
        context = multiprocessing.get_context("spawn")
        self.start = context.Event()
        self.stop = context.Event()
        self.results = context.Queue()
        self.processes = [
            context.Process(
                target=_instance_process,
                args=(spec, self.start, self.stop, self.results),
                name=f"waltz-perf-smallbank-{spec.index}",
                daemon=True,
            )
            for spec in specs
        ]
        for process in self.processes:
            process.start()

    def gather(self, kind: str, timeout: float, what: str) -> dict[int, Any]:
        """One ``kind`` message from every instance, within ``timeout`` seconds.

        Raises:
            SmallBankRunError: an instance reported an error or died, or the time ran out.
        """
        received: dict[int, Any] = {}
        deadline = time.monotonic() + timeout
        while len(received) < len(self.processes):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = sorted(set(range(len(self.processes))) - set(received))
                raise SmallBankRunError(f"instance(s) {missing}: not {what} within {timeout:g}s")
            try:
                message, index, payload = self.results.get(timeout=min(1.0, remaining))
            except queue.Empty:
                for i, process in enumerate(self.processes):
                    if i not in received and process.exitcode not in (None, 0):
                        raise SmallBankRunError(
                            f"instance {i}: its process exited with code {process.exitcode}"
                        ) from None
                continue
            if message == "error":
                raise SmallBankRunError(f"instance {index} failed: {payload}")
            if message != kind:
                raise SmallBankRunError(f"instance {index}: expected {kind!r}, got {message!r}")
            received[index] = payload
        return received

    def close(self) -> None:
        """Let stopped processes end (10 s at most), then terminate, kill and reap the rest."""
        stopping = self.stop.is_set()  # else an error or Ctrl-C: no use waiting
        self.stop.set()
        deadline = time.monotonic() + (10.0 if stopping else 0.5)
        for process in self.processes:
            process.join(max(0.1, deadline - time.monotonic()))
        for process in self.processes:
            if process.is_alive():
                process.terminate()
                process.join(5)
            if process.is_alive():
                process.kill()
                process.join(5)
        self.results.close()
        self.results.cancel_join_thread()


def run_smallbank(
    config: WaltzClientConfig,
    settings: SmallBankPerfSettings,
    db_url: str,
    *,
    metrics_urls: Mapping[str, str] | None = None,
    say: Say | None = None,
) -> SmallBankPerfReport:
    """Run the SmallBank mix from ``settings.instances`` processes and check the ledger.

    Call :func:`check_database` first (before starting a cluster for the run).

    Args:
        config: the client configuration of the cluster (ZooKeeper, root; its explicitly set
            ``client_*`` fields go to every instance's client).
        settings: instances, draws, accounts, concurrency, seed, timeout.
        db_url: the shared database (migrated here).
        metrics_urls: ``/metrics`` URL of each cluster process by name, for their CPU per
            committed transaction; None or empty: the instances' CPU alone.
        say: called with a line at each stage (progress), if given.

    Returns:
        The merged figures of the measured phase and the ledger's checks.

    Raises:
        WaltzError: the cluster could not be reached.
        SmallBankRunError: an instance failed or a phase did not finish in time.
        SQLAlchemyError: the database failed.
    """
    tell = say or (lambda line: None)
    zookeeper, root = config.zookeeper_connect_string, config.cluster_root
    client_settings = _client_settings(config)
    engine = create_framework_engine(db_url)
    try:
        prepare_database(engine)
        tell(f"opening {settings.accounts} accounts (migrated {_render(db_url)})")
        uncaught, num_partitions = _open_accounts(db_url, zookeeper, root, client_settings, settings)
        if settings.partition_routing and settings.instances > num_partitions:
            raise SmallBankRunError(
                f"partition routing needs at most one instance per partition: {settings.instances} "
                f"instances, {num_partitions} partitions"
            )

        def mounted(index: int) -> tuple[int, ...] | None:
            if not settings.partition_routing:
                return None
            return tuple(p for p in range(num_partitions) if p % settings.instances == index)

        specs = [
            _InstanceSpec(i, draws, db_url, zookeeper, root, client_settings, settings, mounted(i))
            for i, draws in enumerate(settings.shares())
        ]
        warnings = []
        counts = [len(spec.partitions) for spec in specs if spec.partitions is not None]
        if counts and min(counts) < max(counts):
            warnings.append(_unequal_shares(num_partitions, counts))
            tell(f"warning: {warnings[-1]}")
        tell(f"starting {settings.instances} instance process(es)")
        instances = _Instances(specs)
        try:
            unsettled = instances.gather("ready", START_TIMEOUT, "ready")
            for index, count in sorted(unsettled.items()):
                if count:
                    warnings.append(_unsettled_warm_up(index, count))
                    tell(f"warning: {warnings[-1]}")
            tell(f"running {settings.transactions:,} draws")
            with measure_nodes(metrics_urls or {}) as usage:
                instances.start.set()
                wires = instances.gather("result", settings.timeout + APPLIED_TIMEOUT + 30, "through the mix")
            figures = [InstanceFigures.from_wire(wires[i]) for i in sorted(wires)]
            tell("waiting for the sweepers to finish every two-step transfer")
            _wait_quiet(engine)
            instances.stop.set()
            closed = instances.gather("closed", STOP_TIMEOUT + 30, "stopped")
            for f in figures:
                f.uncaught = int(closed[f.index]["uncaught"])
        finally:
            instances.close()
        tell("applying the log up to the servers' marks and checking the ledger")
        checks, last = _check_ledger(engine, db_url, zookeeper, root, client_settings, settings.cluster_name)
        uncaught += last + sum(f.uncaught for f in figures)
        checks.append(Check("no apply ever failed", uncaught == 0, f"uncaught_exception calls: {uncaught}"))
    finally:
        engine.dispose()
    return SmallBankPerfReport(
        settings,
        _render(db_url),
        figures,
        checks=checks,
        node_cpu_seconds=dict(usage.cpu_seconds),
        partitions=num_partitions,
        warnings=warnings,
        server_lock_failures=(
            round(sum(usage.server_lock_failures.values())) if usage.server_lock_failures else None
        ),
    )


def _unequal_shares(partitions: int, counts: Sequence[int]) -> str:
    """The warning for partition-routed instances that mount unequal numbers of partitions
    (``counts``: each instance's).

    Each instance draws the same number of transactions among its own partitions' customers, so
    one with fewer partitions has fewer hot customers, more lock conflicts and a longer mix; the
    common window, and committed/s, follow the slowest.
    """
    instances, fewest = len(counts), min(counts)
    fewer = counts.count(fewest)
    return (
        f"{partitions} partitions over {instances} partition-routed instances: {fewer} instance(s) "
        f"mount {fewest} partition(s), the others {max(counts)}; each draws the same number of "
        "transactions from its own partitions' customers, so those with fewer partitions have "
        "fewer hot customers, more lock conflicts and a longer mix, which sets the window of "
        f"committed/s (give --partitions a multiple of {instances} for equal shares)"
    )


def _unsettled_warm_up(index: int, unapplied: int) -> str:
    """The warning for an instance whose client had not applied all its warm-up transactions
    after :data:`APPLIED_TIMEOUT` seconds: its measured phase began with that backlog."""
    return (
        f"instance {index} began the measured phase with {unapplied:,} warm-up transaction(s) its "
        f"client had not applied after {APPLIED_TIMEOUT:g}s: its first latencies include that "
        "backlog (is the database keeping up?)"
    )


def _wait_quiet(engine: Engine, timeout: float = QUIET_TIMEOUT) -> None:
    try:
        wait_until(
            lambda: pending_transfers(engine) == 0,
            timeout=timeout,
            what="every two-step transfer to be credited or refunded",
        )
    except TimeoutError as exc:
        raise SmallBankRunError(str(exc)) from exc


def _check_ledger(
    engine: Engine,
    db_url: str,
    zookeeper: str,
    root: str,
    client_settings: dict[str, Any],
    cluster_name: str,
) -> tuple[list[Check], int]:
    """Finish what the instances left (a sweeper, the applies), then the ledger's invariants.

    Returns:
        The checks, and the failed applies of this last instance.
    """
    with LedgerService(
        db_url,
        zookeeper=zookeeper,
        cluster_root=root,
        cluster_name=cluster_name,
        client_settings=client_settings,
        sweep_interval=SWEEP_INTERVAL,
        prepare=False,
    ) as checker:
        checker.client.wait_mounted(START_TIMEOUT)
        _wait_quiet(engine)
        marks = {p: checker.client.get_high_water_mark(p) for p in range(checker.num_partitions)}
        for pid, mark in marks.items():
            if mark >= 0 and not checker.callbacks.wait_for(pid, mark, STOP_TIMEOUT):
                raise SmallBankRunError(f"partition {pid} not applied up to {mark} within {STOP_TIMEOUT:g}s")
        uncaught = checker.callbacks.uncaught_count
    tally = read_log(zookeeper, root, marks)
    return run_checks(engine, cluster_name=cluster_name, server_marks=marks, tally=tally), uncaught
