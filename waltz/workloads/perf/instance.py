"""An instance process of ``waltz perf smallbank``: one instance of the application, its share of the mix.

Part of :mod:`waltz.workloads.perf` (its module docstring describes the run). The process is
started with ``spawn``; it talks to the coordinator through a queue of ``(kind, index, payload)``
messages: ``ready``, ``result`` (its figures on the wire), ``closed``, or ``error``.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any

from waltz import WaltzClientConfig, tune_garbage_collector
from waltz.perf.producer import client_stage_totals, client_stages_since
from waltz.workloads.application import instance_batch_counts, load_application
from waltz.workloads.perf.processes import entity_cache_counts, run_reporting_errors
from waltz.workloads.perf.settings import (
    APPLIED_TIMEOUT,
    ERROR_SAMPLES,
    QUIET_TIMEOUT,
    START_TIMEOUT,
    STOP_TIMEOUT,
    SWEEP_INTERVAL,
    SmallBankPerfSettings,
)
from waltz.workloads.smallbank import SmallBankConfig, SmallBankStats, SmallBankWorkload

__all__ = ["InstanceSpec", "instance_process", "stats_to_wire"]


@dataclass(frozen=True, slots=True)
class InstanceSpec:
    """What an instance process runs (pickled to it).

    Attributes:
        index: the instance (0-based).
        draws: its SmallBank draws.
        db_url: the shared database.
        config: its Waltz client's configuration.
        settings: the run's settings (the application's module among them).
        cluster_name: the log's name in the database's mark rows.
        partitions: the partitions it mounts (None: all).
    """

    index: int
    draws: int
    db_url: str
    config: WaltzClientConfig
    settings: SmallBankPerfSettings
    cluster_name: str
    partitions: tuple[int, ...] | None = None


def stats_to_wire(stats: SmallBankStats) -> dict[str, Any]:
    """A workload's figures as a picklable dict (its histograms encoded; ``InstanceFigures.from_wire``)."""
    return {
        "submitted": stats.submitted,
        "added": stats.added,
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


def _run_instance(spec: InstanceSpec, start: Any, stop: Any, results: Any) -> None:
    """One instance: mount, warm up, report ready, run the mix at the start event, report its
    figures, sweep until told to stop, then close and report its apply failures."""
    settings = spec.settings
    # ``batch`` only when asked: an application written before batching takes no such argument.
    batching = {"batch": True} if settings.batch else {}
    service = load_application(settings.app).instance(
        spec.db_url,
        spec.config,
        cluster_name=spec.cluster_name,
        sweep_interval=SWEEP_INTERVAL,
        partitions=spec.partitions,
        entity_cache=settings.entity_cache,
        **batching,
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
            cache_started = entity_cache_counts(service.callbacks)
            batches_started = instance_batch_counts(service)
            stats = workload.run(spec.draws)
            cache_counts = entity_cache_counts(service.callbacks)
            batches = instance_batch_counts(service)
            ended = time.time()
            cpu_seconds = time.process_time() - cpu_started
            stages = client_stages_since(service.client, stages_started)
            workload.wait_applied(APPLIED_TIMEOUT)
            unapplied = workload.unapplied
        finally:
            workload.close()
        wire = stats_to_wire(stats)
        wire.update(
            index=spec.index,
            draws=spec.draws,
            seed=config.seed,
            started=started,
            ended=ended,
            cpu_seconds=cpu_seconds,
            unapplied=unapplied,
            client_stages={stage: list(pair) for stage, pair in stages.items()},
            entity_cache=[now - then for now, then in zip(cache_counts, cache_started, strict=True)],
            batches=[now - then for now, then in zip(batches, batches_started, strict=True)],
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


def instance_process(spec: InstanceSpec, start: Any, stop: Any, results: Any) -> None:
    """The target of an instance process: runs it, and reports an error on ``results`` instead of
    raising it."""
    run_reporting_errors(_run_instance, spec, start, stop, results)
