"""The figures of a ``waltz perf smallbank`` run: each instance's, and the report that merges them.

Part of :mod:`waltz.workloads.perf` (its module docstring describes the run).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from waltz.perf.stats import BATCH_COUNTS, LatencyHistogram, add_batch_counts, batch_counts_of, stage_means_ms
from waltz.workloads.checks import Check
from waltz.workloads.perf.settings import ERROR_SAMPLES, SmallBankPerfSettings
from waltz.workloads.smallbank import SmallBankStats

__all__ = ["InstanceFigures", "SmallBankPerfReport"]


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
        batches: ``(batches, members, lingered)``: log transactions of more than one SmallBank
            transaction its batcher committed over the phase, the transactions they carried, and
            its log transactions that waited for the batch linger (``(0, 0, 0)`` when it does
            not batch).
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
    batches: tuple[int, int, int] = (0, 0, 0)

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> InstanceFigures:
        """The figures of an instance process's message (its histograms decoded)."""
        stats = SmallBankStats(
            submitted=int(wire["submitted"]),
            added=int(wire.get("added", 0)),
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
            batches=batch_counts_of(wire),
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
        ``lock_failures``, ``errors`` (a count), ``unapplied``, ``cpu_seconds``, ``batches``
        (``batches``, ``members``, ``lingered``)."""
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
            "batches": dict(zip(BATCH_COUNTS, self.batches, strict=True)),
        }


@dataclass
class SmallBankPerfReport:
    """A run's figures (merged over the instances) and the application's checks.

    Attributes:
        settings: what ran.
        database: the database URL, password hidden.
        instances: each instance's figures, by index.
        total: the instances' counts and histograms merged; ``seconds`` is the common window.
        checks: the application's checks after the run.
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
            total.added += stats.added
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

    def batch_counts(self) -> tuple[int, int, int]:
        """``(batches, members, lingered)`` of the instances' batchers over their phases."""
        return add_batch_counts(f.batches for f in self.instances)

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
        return stage_means_ms(figures.client_stages for figures in self.instances)

    def summary(self) -> dict[str, Any]:
        """The figures as one JSON-ready dict.

        Keys: ``seconds`` (the common window), ``committed_per_second``, ``draws``, ``submitted``,
        ``added`` (of those, the instances' own account closings and payments to closed accounts,
        beside the draws), ``committed``, ``dropped``, ``drop_reasons`` (reason with numbers as
        ``N`` -> count), ``balances_read``, ``lock_failures``, ``lock_failures_per_committed``,
        ``entity_cache`` (``hits``, ``misses``), ``batches`` (``batches``, ``members``,
        ``lingered``: log transactions of several SmallBank transactions, those they carried, and
        log transactions that waited for the batch linger), ``errors`` (a count), ``error_samples``,
        ``unapplied``, ``latency_ms`` (``submit_to_commit`` and ``submit_to_applied``: ``p50``,
        ``p90``, ``p99``, ``p99.9``, ``max``, ``mean`` in ms, None when empty, and ``count``),
        ``cpu_us_per_transaction``, ``client_stage_ms``, ``per_instance``
        (:meth:`InstanceFigures.summary` each), ``checks`` (``name``, ``passed``, ``detail``),
        ``passed``, ``database``, ``settings``, ``partitions``, ``warnings``,
        ``server_lock_failures`` (None: not read).
        """
        total = self.total
        return {
            "seconds": round(total.seconds, 3),
            "committed_per_second": round(total.transactions_per_second, 1),
            "draws": sum(f.draws for f in self.instances),
            "submitted": total.submitted,
            "added": total.added,
            "committed": total.committed,
            "dropped": total.dropped,
            "drop_reasons": dict(total.drop_reasons.most_common()),
            "balances_read": total.balances_read,
            "lock_failures": total.lock_failures,
            "lock_failures_per_committed": round(self.lock_failures_per_committed, 4),
            "entity_cache": dict(zip(("hits", "misses"), self.entity_cache_counts(), strict=True)),
            "batches": dict(zip(BATCH_COUNTS, self.batch_counts(), strict=True)),
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
        # Batched, a log transaction carries several SmallBank transactions: the counts are theirs.
        what = "SmallBank transactions" if self.settings.batch else "log transactions"
        lines = [
            f"committed {total.committed:,} {what} in {total.seconds:.2f} s: "
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
        if self.settings.batch:
            batches, members, lingered = self.batch_counts()
            mean = f", {members / batches:.1f} per batch" if batches else ""
            lines.append(
                f"batches: {batches:,} log transaction(s) carried {members:,} SmallBank "
                f"transaction(s){mean}; {lingered:,} log transaction(s) waited for the linger"
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
