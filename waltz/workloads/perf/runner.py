"""The coordinator of ``waltz perf smallbank``: the accounts, the instance processes, the checks.

Part of :mod:`waltz.workloads.perf` (its module docstring describes the run).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence

from sqlalchemy import Engine

from waltz import WaltzClientConfig
from waltz.jdbc_style import create_framework_engine
from waltz.jdbc_style.binding import url_text
from waltz.local.processes import wait_until
from waltz.perf.cost import measure_nodes
from waltz.protocol.channels import TlsConfig
from waltz.workloads.application import SmallBankApplication, load_application
from waltz.workloads.checks import Check, check_application
from waltz.workloads.perf.instance import InstanceSpec, instance_process
from waltz.workloads.perf.processes import InstanceProcesses, PerfRunError
from waltz.workloads.perf.report import InstanceFigures, SmallBankPerfReport
from waltz.workloads.perf.settings import (
    APPLIED_TIMEOUT,
    POPULATE_TIMEOUT,
    QUIET_TIMEOUT,
    START_TIMEOUT,
    STOP_TIMEOUT,
    SWEEP_INTERVAL,
    SmallBankPerfSettings,
    routed_partitions,
    routing_refusal,
)
from waltz.workloads.smallbank import SmallBankConfig, SmallBankWorkload

__all__ = ["SmallBankRunError", "run_smallbank"]

Say = Callable[[str], None]


class SmallBankRunError(PerfRunError):
    """The run could not complete: an instance process failed, or a phase timed out."""


def _open_accounts(
    app: SmallBankApplication,
    db_url: str,
    config: WaltzClientConfig,
    cluster_name: str,
    settings: SmallBankPerfSettings,
    tell: Say,
) -> tuple[int, int]:
    """Open every account through one instance in this process; returns its failed applies and
    the log's number of partitions.

    Raises:
        SmallBankRunError: partition routing with more instances than the log's partitions
            (refused once the instance has mounted, before any account is opened), or the
            accounts could not be opened.
    """
    instance = app.instance(db_url, config, cluster_name=cluster_name, sweep_interval=None)
    with contextlib.closing(instance) as opener:
        opener.client.wait_mounted(START_TIMEOUT)
        refusal = routing_refusal(settings.instances, opener.client.num_partitions)
        if settings.partition_routing and refusal is not None:
            raise SmallBankRunError(refusal)
        tell(f"opening {settings.accounts} accounts")
        mix = SmallBankConfig(
            accounts=settings.accounts,
            in_flight=max(settings.in_flight, 64),
            seed=settings.seed,
            submitters=settings.submitters,
            record_latency=False,
        )
        workload = SmallBankWorkload([opener], mix)
        try:
            workload.populate(timeout=POPULATE_TIMEOUT)
        except TimeoutError as exc:
            raise SmallBankRunError(f"opening the accounts: {exc}") from exc
        finally:
            workload.close()
        if workload.stats.errors:
            raise SmallBankRunError(f"opening the accounts failed: {workload.stats.errors[:3]}")
        return opener.callbacks.uncaught_count, opener.client.num_partitions


def run_smallbank(
    config: WaltzClientConfig,
    settings: SmallBankPerfSettings,
    db_url: str,
    *,
    metrics_urls: Mapping[str, str] | None = None,
    metrics_tls: TlsConfig | None = None,
    say: Say | None = None,
) -> SmallBankPerfReport:
    """Run the SmallBank mix from ``settings.instances`` processes and check the application.

    Call :func:`check_database` first (before starting a cluster for the run).

    Args:
        config: the client configuration of the cluster (ZooKeeper, root; its explicitly set
            ``client_*`` fields go to every instance's client).
        settings: instances, draws, accounts, concurrency, seed, timeout, the application.
        db_url: the shared database (migrated here).
        metrics_urls: ``/metrics`` URL of each cluster process by name, for their CPU per
            committed transaction; None or empty: the instances' CPU alone.
        say: called with a line at each stage (progress), if given.

    Returns:
        The merged figures of the measured phase and the application's checks.

    Raises:
        ConfigurationError: ``settings.app`` names no SmallBank application.
        WaltzError: the cluster could not be reached.
        SmallBankRunError: an instance failed or a phase did not finish in time.
        SQLAlchemyError: the database failed.
    """
    tell = say or (lambda line: None)
    app = load_application(settings.app)
    cluster_name = settings.cluster_name or app.name
    engine = create_framework_engine(db_url)
    try:
        app.prepare_database(engine)
        tell(f"migrated {url_text(db_url, hide_password=True)}; mounting the log's partitions")
        uncaught, num_partitions = _open_accounts(app, db_url, config, cluster_name, settings, tell)

        def mounted(index: int) -> tuple[int, ...] | None:
            if not settings.partition_routing:
                return None
            return routed_partitions(index, settings.instances, num_partitions)

        specs = [
            InstanceSpec(i, draws, db_url, config, settings, cluster_name, mounted(i))
            for i, draws in enumerate(settings.shares())
        ]
        warnings = []
        counts = [len(spec.partitions) for spec in specs if spec.partitions is not None]
        if counts and min(counts) < max(counts):
            warnings.append(_unequal_shares(num_partitions, counts))
            tell(f"warning: {warnings[-1]}")
        tell(f"starting {settings.instances} instance process(es)")
        instances = InstanceProcesses(specs, instance_process, "waltz-perf-smallbank", SmallBankRunError)
        try:
            unsettled = instances.gather("ready", START_TIMEOUT, "ready")
            for index, count in sorted(unsettled.items()):
                if count:
                    warnings.append(_unsettled_warm_up(index, count))
                    tell(f"warning: {warnings[-1]}")
            tell(f"running {settings.transactions:,} draws")
            with measure_nodes(metrics_urls or {}, metrics_tls) as usage:
                instances.start.set()
                wires = instances.gather("result", settings.timeout + APPLIED_TIMEOUT + 30, "through the mix")
            figures = [InstanceFigures.from_wire(wires[i]) for i in sorted(wires)]
            tell("waiting for the sweepers to finish every two-step transfer")
            _wait_quiet(app, engine)
            instances.stop.set()
            closed = instances.gather("closed", STOP_TIMEOUT + 30, "stopped")
            for f in figures:
                f.uncaught = int(closed[f.index]["uncaught"])
        finally:
            instances.close()
        tell(f"applying the log up to the servers' marks and checking the {app.name}")
        checks, last = _check_application(app, engine, db_url, config, cluster_name)
        uncaught += last + sum(f.uncaught for f in figures)
        checks.append(Check("no apply ever failed", uncaught == 0, f"uncaught_exception calls: {uncaught}"))
    finally:
        engine.dispose()
    return SmallBankPerfReport(
        settings,
        url_text(db_url, hide_password=True),
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


def _wait_quiet(app: SmallBankApplication, engine: Engine, timeout: float = QUIET_TIMEOUT) -> None:
    try:
        wait_until(
            lambda: app.pending_steps(engine) == 0,
            timeout=timeout,
            what="every two-step transfer to be credited or refunded",
        )
    except TimeoutError as exc:
        raise SmallBankRunError(str(exc)) from exc


def _check_application(
    app: SmallBankApplication, engine: Engine, db_url: str, config: WaltzClientConfig, cluster_name: str
) -> tuple[list[Check], int]:
    """Finish what the instances left (a sweeper, the applies), then the checks of
    :func:`~waltz.workloads.checks.check_application` (no replica comparison: the run does not
    know the cluster's nodes).

    Returns:
        The checks, and the failed applies of this last instance.
    """
    instance = app.instance(db_url, config, cluster_name=cluster_name, sweep_interval=SWEEP_INTERVAL)
    with contextlib.closing(instance) as checker:
        checker.client.wait_mounted(START_TIMEOUT)
        _wait_quiet(app, engine)
        marks = {p: checker.client.get_high_water_mark(p) for p in checker.client.partition_ids}
        for pid, mark in marks.items():
            if mark >= 0 and not checker.callbacks.wait_for(pid, mark, STOP_TIMEOUT):
                raise SmallBankRunError(f"partition {pid} not applied up to {mark} within {STOP_TIMEOUT:g}s")
        uncaught = checker.callbacks.uncaught_count
    checks = check_application(
        app,
        engine,
        cluster_name=cluster_name,
        server_marks=marks,
        client_config=config,
    )
    return checks, uncaught
