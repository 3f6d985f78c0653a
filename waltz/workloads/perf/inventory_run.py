"""``waltz perf inventory``: reservations of a few hot SKUs from N instance processes on one database.

Part of :mod:`waltz.workloads.perf` (its module docstring describes the machinery it shares with
``smallbank``). The run, against an inventory application (:mod:`waltz.workloads.inventory`, the
inventory example's by default):

1. the database is prepared and every SKU given ``stock`` units, through one instance in this
   process, applied before anything else starts;
2. ``instances`` processes (``spawn``) each start an instance, mount, send their warm-up
   reservations (counted nowhere), report ready and wait for the start event; then each sends its
   share of the requests (:class:`~waltz.workloads.inventory_workload.InventoryWorkload`: a share
   re-sent under the same idempotency key) and reports its figures, histograms encoded. Partition
   routed (``settings.partition_routing``), instance ``i`` of ``N`` mounts the partitions ``p``
   with ``p mod N == i`` and sends the requests of the SKUs whose stock went to them, its share
   of the requests and of the requests in flight in proportion to those SKUs;
3. the instances stop; an instance in this process applies the log up to the servers' high-water
   marks, another replays the log into an empty SQLite database, and the run is checked: the
   database's marks equal the servers', no SKU oversold, reserved = the sum of the reservations,
   each idempotency key applied at most once, one reservation per request committed first, the
   replay holds the same rows, no apply failed.

Every wait is bounded; on an error, a timeout or Ctrl-C the instance processes are killed and
reaped (:class:`~waltz.workloads.perf.processes.InstanceProcesses`).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine

from waltz import WaltzClientConfig, tune_garbage_collector
from waltz.jdbc_style import create_framework_engine
from waltz.jdbc_style.binding import url_text
from waltz.perf.cost import measure_nodes
from waltz.perf.producer import client_stage_totals, client_stages_since
from waltz.protocol.channels import TlsConfig
from waltz.workloads.application import Check, instance_batch_counts
from waltz.workloads.checks import database_marks_check
from waltz.workloads.inventory import (
    InventoryApplication,
    InventoryInstance,
    inventory_checks,
    load_inventory_application,
    replay_check,
)
from waltz.workloads.inventory_workload import InventoryWorkload
from waltz.workloads.perf.inventory_report import InventoryInstanceFigures, InventoryPerfReport
from waltz.workloads.perf.processes import (
    InstanceProcesses,
    PerfRunError,
    entity_cache_counts,
    run_reporting_errors,
)
from waltz.workloads.perf.settings import (
    APPLIED_TIMEOUT,
    POPULATE_TIMEOUT,
    START_TIMEOUT,
    STOP_TIMEOUT,
    InventoryPerfSettings,
    routing_refusal,
)

__all__ = ["InventoryInstanceSpec", "InventoryRunError", "inventory_instance_process", "run_inventory"]

Say = Callable[[str], None]


class InventoryRunError(PerfRunError):
    """The inventory run could not complete: an instance process failed, or a phase timed out."""


@dataclass(frozen=True, slots=True)
class InventoryInstanceSpec:
    """What an instance process runs (pickled to it).

    Attributes:
        index: the instance (0-based).
        requests: its requests (retries not counted).
        db_url: the shared database.
        config: its Waltz client's configuration.
        settings: the run's settings.
        cluster_name: the log's name in the mark rows.
        run: the run's token (in its requests' keys).
        partitions: the partitions it mounts (None: all; partition routing).
        sku_ids: the SKUs its requests draw from (empty: all, or none when ``partitions`` is
            given: a routed instance that owns no SKU sends nothing, warm-up included).
        in_flight: its requests in flight (None: the settings').
    """

    index: int
    requests: int
    db_url: str
    config: WaltzClientConfig
    settings: InventoryPerfSettings
    cluster_name: str
    run: str
    partitions: tuple[int, ...] | None = None
    sku_ids: tuple[int, ...] = ()
    in_flight: int | None = None

    @property
    def idle(self) -> bool:
        """A partition-routed instance that owns no SKU: it mounts and applies, and sends nothing."""
        return self.partitions is not None and not self.sku_ids


def _run_instance(spec: InventoryInstanceSpec, start: Any, stop: Any, results: Any) -> None:
    """One instance: mount, warm up, report ready, send its requests at the start event, report
    its figures, then close at the stop event and report its apply failures."""
    settings = spec.settings
    app = load_inventory_application(settings.app)
    # ``batch`` and ``partitions`` only when asked: an application written before batching or
    # routing takes no such argument.
    options: dict[str, Any] = {"batch": True} if settings.batch else {}
    if spec.partitions is not None:
        options["partitions"] = spec.partitions
    service = app.instance(
        spec.db_url,
        spec.config,
        cluster_name=spec.cluster_name,
        entity_cache=settings.entity_cache,
        **options,
    )
    try:
        service.client.wait_mounted(START_TIMEOUT)
        tune_garbage_collector()
        config = settings.workload(spec.index, spec.run, spec.sku_ids, spec.in_flight or None)
        workload = InventoryWorkload(service, config)
        try:
            workload.run(0 if spec.idle else settings.warm_up, APPLIED_TIMEOUT)
            workload.wait_applied(APPLIED_TIMEOUT)
            results.put(("ready", spec.index, workload.unapplied))
            if not start.wait(START_TIMEOUT + 30):
                raise TimeoutError(f"no start within {START_TIMEOUT + 30:g}s")
            started, cpu_started = time.time(), time.process_time()
            cache_started = entity_cache_counts(service.callbacks)
            batches_started = instance_batch_counts(service)
            stages_started = client_stage_totals(service.client)
            stats = workload.run(spec.requests, settings.timeout)
            cache = entity_cache_counts(service.callbacks)
            batches = instance_batch_counts(service)
            ended, cpu_seconds = time.time(), time.process_time() - cpu_started
            stages = client_stages_since(service.client, stages_started)
            workload.wait_applied(APPLIED_TIMEOUT)
            unapplied, first_commits = workload.unapplied, workload.first_commits
        finally:
            workload.close()
        wire = stats.to_wire()
        wire.update(
            index=spec.index,
            requests=spec.requests,
            seed=settings.seed + 1 + spec.index,
            started=started,
            ended=ended,
            cpu_seconds=cpu_seconds,
            unapplied=unapplied,
            first_commits=first_commits,
            entity_cache=[cache[0] - cache_started[0], cache[1] - cache_started[1]],
            batches=[now - then for now, then in zip(batches, batches_started, strict=True)],
            client_stages={stage: list(pair) for stage, pair in stages.items()},
            partitions=None if spec.partitions is None else list(spec.partitions),
            sku_ids=None if spec.partitions is None else list(spec.sku_ids),
            in_flight=0 if spec.idle else config.in_flight,
        )
        results.put(("result", spec.index, wire))
        if not stop.wait(STOP_TIMEOUT + 30):
            raise TimeoutError("no stop from the coordinator")
        service.client.flush(STOP_TIMEOUT)
    finally:
        uncaught = service.callbacks.uncaught_count
        service.close()
    results.put(("closed", spec.index, {"uncaught": uncaught}))


def inventory_instance_process(spec: InventoryInstanceSpec, start: Any, stop: Any, results: Any) -> None:
    """The target of an instance process: runs it, and reports an error on ``results`` instead of
    raising it."""
    run_reporting_errors(_run_instance, spec, start, stop, results)


def run_inventory(
    config: WaltzClientConfig,
    settings: InventoryPerfSettings,
    db_url: str,
    *,
    metrics_urls: Mapping[str, str] | None = None,
    metrics_tls: TlsConfig | None = None,
    say: Say | None = None,
) -> InventoryPerfReport:
    """Run the reservations from ``settings.instances`` processes and check the inventory.

    Call :func:`~waltz.workloads.perf.check_database` first (before starting a cluster).

    Args:
        config: the client configuration of the cluster (its explicitly set ``client_*`` fields go
            to every instance's client).
        settings: what the run does.
        db_url: the shared database (prepared here).
        metrics_urls: ``/metrics`` URL of each cluster process by name, for their CPU; None or
            empty: the instances' CPU alone.
        say: called with a line at each stage (progress), if given.

    Returns:
        The merged figures of the measured phase and the checks.

    Raises:
        ConfigurationError: ``settings.app`` names no inventory application.
        WaltzError: the cluster could not be reached.
        InventoryRunError: an instance failed or a phase did not finish in time.
        SQLAlchemyError: the database failed.
    """
    tell = say or (lambda line: None)
    app = load_inventory_application(settings.app)
    cluster_name = settings.cluster_name or app.name
    engine = create_framework_engine(db_url)
    try:
        app.prepare_database(engine)
        tell(f"prepared {url_text(db_url, hide_password=True)}; mounting the log's partitions")
        uncaught, partitions, sku_partitions = _stock(app, db_url, config, cluster_name, settings, tell)
        before = app.state(engine).reservations  # an earlier run's, on a database given with --db
        run = uuid.uuid4().hex[:8]
        warnings: list[str] = []
        specs = _specs(settings, db_url, config, cluster_name, run, partitions, sku_partitions)
        for spec in specs:
            if spec.idle:
                warnings.append(
                    f"instance {spec.index} mounts partitions {list(spec.partitions or ())}, which hold "
                    "no SKU: it applies them and serves no request"
                )
                tell(f"warning: {warnings[-1]}")
        if settings.partition_routing:
            tell(
                "routed: "
                + "; ".join(
                    f"instance {s.index} partitions {list(s.partitions or ())} SKUs {list(s.sku_ids)} "
                    f"{s.requests:,} requests, {s.in_flight or 0} in flight"
                    for s in specs
                )
            )
        tell(f"starting {settings.instances} instance process(es)")
        instances = InstanceProcesses(
            specs, inventory_instance_process, "waltz-perf-inventory", InventoryRunError
        )
        try:
            unsettled = instances.gather("ready", START_TIMEOUT + 2 * APPLIED_TIMEOUT, "ready")
            warnings += [
                f"instance {i} began the measured phase with {n:,} warm-up reservation(s) not applied"
                for i, n in sorted(unsettled.items())
                if n
            ]
            tell(f"running {settings.transactions:,} requests")
            with measure_nodes(metrics_urls or {}, metrics_tls) as usage:
                instances.start.set()
                wires = instances.gather(
                    "result", settings.timeout + APPLIED_TIMEOUT + 30, "through the requests"
                )
            figures = [InventoryInstanceFigures.from_wire(wires[i]) for i in sorted(wires)]
            instances.stop.set()
            closed = instances.gather("closed", STOP_TIMEOUT + 30, "stopped")
            for f in figures:
                f.uncaught = int(closed[f.index]["uncaught"])
        finally:
            instances.close()
        tell("applying the log up to the servers' marks, replaying it into an empty database, checking")
        first_commits = before + sum(f.first_commits for f in figures)
        checks, last = _check(app, engine, config, db_url, cluster_name, first_commits)
        uncaught += last + sum(f.uncaught for f in figures)
        checks.append(Check("no apply ever failed", uncaught == 0, f"uncaught_exception calls: {uncaught}"))
    finally:
        engine.dispose()
    return InventoryPerfReport(
        settings,
        url_text(db_url, hide_password=True),
        figures,
        checks=checks,
        node_cpu_seconds=dict(usage.cpu_seconds),
        partitions=partitions,
        warnings=warnings,
    )


def _specs(
    settings: InventoryPerfSettings,
    db_url: str,
    config: WaltzClientConfig,
    cluster_name: str,
    run: str,
    num_partitions: int,
    sku_partitions: Mapping[int, int],
) -> list[InventoryInstanceSpec]:
    """Each instance process's spec: an equal share of the requests each, or, partition-routed,
    the partitions it mounts, the SKUs of those partitions and its share of the requests and of
    the requests in flight (:meth:`InventoryPerfSettings.routed_shares`). Partition routing with
    more instances than partitions is refused before this, by :func:`_stock`.
    """
    if not settings.partition_routing:
        return [
            InventoryInstanceSpec(i, requests, db_url, config, settings, cluster_name, run)
            for i, requests in enumerate(settings.shares())
        ]
    mounted = [settings.mounted(i, num_partitions) or () for i in range(settings.instances)]
    owned = [tuple(sku for sku, p in sorted(sku_partitions.items()) if p in parts) for parts in mounted]
    return [
        InventoryInstanceSpec(
            i, requests, db_url, config, settings, cluster_name, run, mounted[i], owned[i], in_flight
        )
        for i, (requests, in_flight) in enumerate(settings.routed_shares(owned))
    ]


def _stock(
    app: InventoryApplication,
    db_url: str,
    config: WaltzClientConfig,
    cluster_name: str,
    settings: InventoryPerfSettings,
    tell: Say,
) -> tuple[int, int, dict[int, int]]:
    """Give every SKU its stock through one instance in this process, and wait until applied.

    Returns:
        Its failed applies, the log's number of partitions, and each SKU's partition (the one
        its stock was submitted to).

    Raises:
        InventoryRunError: partition routing with more instances than the log's partitions
            (refused once the instance has mounted, before any stock is written), or a SKU's
            stock was not committed.
    """
    instance = app.instance(db_url, config, cluster_name=cluster_name, entity_cache=False)
    with contextlib.closing(instance) as stocker:
        stocker.client.wait_mounted(START_TIMEOUT)
        refusal = routing_refusal(settings.instances, stocker.client.num_partitions)
        if settings.partition_routing and refusal is not None:
            raise InventoryRunError(refusal)
        tell(f"stocking {settings.skus} SKU(s) with {settings.stock:,} units")
        operations = [stocker.set_stock(sku, settings.stock) for sku in range(settings.skus)]
        futures = [stocker.submit(operation) for operation in operations]
        for sku, future in enumerate(futures):
            try:
                outcome = future.result(POPULATE_TIMEOUT)
            except Exception as exc:
                raise InventoryRunError(f"stocking SKU {sku}: {exc!r}") from exc
            if not outcome.committed:
                raise InventoryRunError(f"stocking SKU {sku} was refused: {outcome.reason}")
        _apply_all(stocker, POPULATE_TIMEOUT)
        sku_partitions = {sku: operation.chosen_partition for sku, operation in enumerate(operations)}
        return stocker.callbacks.uncaught_count, stocker.client.num_partitions, sku_partitions


def _apply_all(instance: InventoryInstance, timeout: float) -> dict[int, int]:
    """Wait until ``instance`` applied every partition up to the servers' marks; returns them."""
    marks = {p: instance.client.get_high_water_mark(p) for p in instance.client.partition_ids}
    for pid, mark in marks.items():
        if mark >= 0 and not instance.callbacks.wait_for(pid, mark, timeout):
            raise InventoryRunError(f"partition {pid} not applied up to {mark} within {timeout:g}s")
    return marks


def _check(
    app: InventoryApplication,
    engine: Engine,
    config: WaltzClientConfig,
    db_url: str,
    cluster_name: str,
    first_commits: int,
) -> tuple[list[Check], int]:
    """Apply the log up to the servers' marks, replay it into an empty SQLite database, and check.

    Returns:
        The checks (marks, the inventory's, the replay's), and the failed applies of the two
        instances this runs.
    """
    checker = app.instance(db_url, config, cluster_name=cluster_name, entity_cache=False)
    with contextlib.closing(checker):
        checker.client.wait_mounted(START_TIMEOUT)
        marks = _apply_all(checker, STOP_TIMEOUT)
        uncaught = checker.callbacks.uncaught_count
    state = app.state(engine)
    directory = tempfile.mkdtemp(prefix="waltz-perf-replay-")
    try:
        replay_url = f"sqlite:///{directory}/{app.name}.db"
        replay_engine = create_framework_engine(replay_url)
        try:
            app.prepare_database(replay_engine)
            replayer = app.instance(replay_url, config, cluster_name=cluster_name, entity_cache=False)
            with contextlib.closing(replayer):
                replayer.client.wait_mounted(START_TIMEOUT)
                for pid, mark in marks.items():
                    if mark >= 0 and not replayer.callbacks.wait_for(pid, mark, START_TIMEOUT):
                        raise InventoryRunError(f"the replay: partition {pid} not applied up to {mark}")
                uncaught += replayer.callbacks.uncaught_count
            replayed = app.state(replay_engine)
        finally:
            replay_engine.dispose()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    checks = [
        database_marks_check(engine, cluster_name, marks),
        *inventory_checks(state, first_commits),
        replay_check(state, replayed),
    ]
    return checks, uncaught
