"""The figures of a ``waltz perf inventory`` run: each instance's, and the report that merges them.

Part of :mod:`waltz.workloads.perf` (:mod:`~waltz.workloads.perf.inventory_run` describes the run).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from waltz.perf.stats import BATCH_COUNTS, add_batch_counts, batch_counts_of, stage_means_ms
from waltz.workloads.application import Check
from waltz.workloads.inventory_workload import InventoryStats
from waltz.workloads.perf.settings import InventoryPerfSettings

__all__ = ["InventoryInstanceFigures", "InventoryPerfReport"]


@dataclass
class InventoryInstanceFigures:
    """What one instance process measured.

    Attributes:
        index: the instance (0-based).
        requests: its requests (retries not counted).
        seed: its workload's seed.
        started / ended: wall-clock seconds (``time.time()``) of its measured phase.
        stats: its counts and latency histograms.
        unapplied: first commits its client had not applied in time (missing from submit->applied).
        first_commits: its requests whose first submission committed, warm-up included.
        cpu_seconds: CPU seconds the process spent in the phase.
        entity_cache: ``(hits, misses)`` of its entity cache over the phase.
        batches: ``(batches, members, lingered)``: log transactions of more than one request its
            batcher committed over the phase, the requests they carried, and its log
            transactions that waited for the batch linger.
        uncaught: ``uncaught_exception`` calls of its callbacks (failed applies).
        partitions: the partitions it mounted (None: all).
        sku_ids: the SKUs its requests drew from (None: all; empty: none, a routed instance that
            owns no SKU).
        in_flight: its requests in flight (0: none, or not reported).
        client_stages: its client's stage metrics over the phase, ``stage -> (seconds, count)``
            (``waltz.perf.producer.CLIENT_STAGES``; empty: not reported).
    """

    index: int
    requests: int
    seed: int
    started: float
    ended: float
    stats: InventoryStats
    unapplied: int = 0
    first_commits: int = 0
    cpu_seconds: float = 0.0
    entity_cache: tuple[int, int] = (0, 0)
    batches: tuple[int, int, int] = (0, 0, 0)
    uncaught: int = 0
    partitions: tuple[int, ...] | None = None
    sku_ids: tuple[int, ...] | None = None
    in_flight: int = 0
    client_stages: dict[str, tuple[float, float]] = field(default_factory=dict)

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> InventoryInstanceFigures:
        """The figures of an instance process's ``result`` message."""
        return cls(
            index=int(wire["index"]),
            requests=int(wire["requests"]),
            seed=int(wire["seed"]),
            started=float(wire["started"]),
            ended=float(wire["ended"]),
            stats=InventoryStats.from_wire(dict(wire)),
            unapplied=int(wire["unapplied"]),
            first_commits=int(wire["first_commits"]),
            cpu_seconds=float(wire["cpu_seconds"]),
            entity_cache=(int(wire["entity_cache"][0]), int(wire["entity_cache"][1])),
            batches=batch_counts_of(wire),
            partitions=None if wire.get("partitions") is None else tuple(wire["partitions"]),
            sku_ids=None if wire.get("sku_ids") is None else tuple(wire["sku_ids"]),
            in_flight=int(wire.get("in_flight", 0)),
            client_stages={k: (float(s), float(c)) for k, (s, c) in wire.get("client_stages", {}).items()},
        )

    @property
    def seconds(self) -> float:
        """Seconds of its measured phase (never below 1 µs)."""
        return max(1e-6, self.ended - self.started)

    def summary(self) -> dict[str, Any]:
        """JSON-ready: ``instance``, ``requests``, ``seed``, ``seconds``, ``committed``,
        ``committed_per_second``, ``refused``, ``errors``, ``unapplied``, ``cpu_seconds``,
        ``entity_cache`` (``hits``, ``misses``), ``batches``, ``partitions`` (None: all),
        ``sku_ids`` (None: all), ``in_flight``."""
        return {
            "instance": self.index,
            "requests": self.requests,
            "seed": self.seed,
            "seconds": round(self.seconds, 3),
            "committed": self.stats.committed,
            "committed_per_second": round(self.stats.committed / self.seconds, 1),
            "refused": self.stats.refused,
            "errors": self.stats.errors,
            "unapplied": self.unapplied,
            "cpu_seconds": round(self.cpu_seconds, 3),
            "entity_cache": {"hits": self.entity_cache[0], "misses": self.entity_cache[1]},
            "batches": dict(zip(BATCH_COUNTS, self.batches, strict=True)),
            "partitions": None if self.partitions is None else list(self.partitions),
            "sku_ids": None if self.sku_ids is None else list(self.sku_ids),
            "in_flight": self.in_flight,
        }


@dataclass
class InventoryPerfReport:
    """A run's figures (merged over the instances) and the checks.

    Attributes:
        settings: what ran.
        database: the database URL, password hidden.
        instances: each instance's figures, by index.
        total: the instances' counts and histograms merged; ``seconds`` is the common window
            (the first start to the last end).
        checks: the checks after the run.
        node_cpu_seconds: CPU seconds each cluster process spent in the measured phase (empty
            for a cluster the run did not start).
        partitions: the log's partitions.
        warnings: what makes the figures hard to compare.
    """

    settings: InventoryPerfSettings
    database: str
    instances: list[InventoryInstanceFigures]
    total: InventoryStats = field(default_factory=InventoryStats)
    checks: list[Check] = field(default_factory=list)
    node_cpu_seconds: dict[str, float] = field(default_factory=dict)
    partitions: int = 0
    warnings: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        total = InventoryStats()
        for figures in self.instances:
            total.add(figures.stats)
        if self.instances:
            started = min(f.started for f in self.instances)
            total.seconds = max(1e-6, max(f.ended for f in self.instances) - started)
        self.total = total

    @property
    def passed(self) -> bool:
        """Every check passed (and there were checks)."""
        return bool(self.checks) and all(c.passed for c in self.checks)

    @property
    def committed_per_second(self) -> float:
        """Reservations committed per second of the common window."""
        return self.total.committed / self.total.seconds if self.total.seconds else 0.0

    @property
    def requests_per_second(self) -> float:
        """Requests answered (committed, refused, already applied, failed) per second of the window."""
        return self.total.requests / self.total.seconds if self.total.seconds else 0.0

    @property
    def unapplied(self) -> int:
        """First commits whose apply their instance did not see in time."""
        return sum(f.unapplied for f in self.instances)

    def entity_cache_counts(self) -> tuple[int, int]:
        """``(hits, misses)`` of the instances' entity caches over their phases."""
        return sum(f.entity_cache[0] for f in self.instances), sum(f.entity_cache[1] for f in self.instances)

    def entity_cache_hit_rate(self) -> float | None:
        """Hits over hits and misses (None: no cache, or nothing counted)."""
        hits, misses = self.entity_cache_counts()
        return hits / (hits + misses) if hits + misses else None

    def cpu_microseconds_per_committed(self) -> dict[str, float]:
        """CPU µs per committed reservation: ``instances``, then each cluster process."""
        if not self.total.committed:
            return {}
        spent = {"instances": sum(f.cpu_seconds for f in self.instances), **self.node_cpu_seconds}
        return {name: seconds * 1e6 / self.total.committed for name, seconds in spent.items()}

    def batch_counts(self) -> tuple[int, int, int]:
        """``(batches, members, lingered)`` of the instances' batchers over their phases."""
        return add_batch_counts(f.batches for f in self.instances)

    def client_stage_ms(self) -> dict[str, float]:
        """Mean milliseconds of each stage the instances' clients timed, over every log
        transaction they submitted (a batch counts once)."""
        return stage_means_ms(figures.client_stages for figures in self.instances)

    def summary(self) -> dict[str, Any]:
        """The figures as one JSON-ready dict: ``seconds``, ``committed_per_second``,
        ``requests_per_second``, the counts of :class:`InventoryStats` (``requests``,
        ``committed``, ``refused``, ``already_applied``, ``retries``, ``retries_already_applied``,
        ``retries_committed``, ``retries_refused``, ``lock_failures``, ``errors``),
        ``error_samples``, ``unapplied``, ``latency_ms`` (``submit_to_commit``,
        ``submit_to_applied``: ``p50`` .. ``max``, ``mean``, ``count``), ``entity_cache``
        (``hits``, ``misses``, ``hit_rate``), ``batches`` (``batches``, ``members``,
        ``lingered``), ``cpu_us_per_committed``, ``client_stage_ms`` (:meth:`client_stage_ms`),
        ``per_instance``, ``checks``, ``passed``, ``database``, ``partitions``, ``settings``, ``warnings``."""
        total = self.total
        hits, misses = self.entity_cache_counts()
        rate = self.entity_cache_hit_rate()
        return {
            "seconds": round(total.seconds, 3),
            "committed_per_second": round(self.committed_per_second, 1),
            "requests_per_second": round(self.requests_per_second, 1),
            **{name: getattr(total, name) for name in InventoryStats.COUNTS},
            "error_samples": list(total.error_samples),
            "unapplied": self.unapplied,
            "latency_ms": {
                "submit_to_commit": total.commit_latency.summary(),
                "submit_to_applied": total.applied_latency.summary(),
            },
            "entity_cache": {
                "hits": hits,
                "misses": misses,
                "hit_rate": None if rate is None else round(rate, 4),
            },
            "batches": dict(zip(BATCH_COUNTS, self.batch_counts(), strict=True)),
            "cpu_us_per_committed": {
                k: round(v, 1) for k, v in self.cpu_microseconds_per_committed().items()
            },
            "client_stage_ms": {stage: round(ms, 3) for stage, ms in self.client_stage_ms().items()},
            "per_instance": [f.summary() for f in self.instances],
            "checks": [{"name": c.name, "passed": c.passed, "detail": c.detail} for c in self.checks],
            "passed": self.passed,
            "database": self.database,
            "partitions": self.partitions,
            "settings": self.settings.summary(),
            "warnings": list(self.warnings),
        }

    def text(self) -> str:
        """The figures and the checks as the lines the CLI prints."""
        t = self.total
        lines = [
            f"reservations committed {t.committed:,} in {t.seconds:.2f} s: "
            f"{self.committed_per_second:,.1f}/s (all instances, one window; "
            f"{self.requests_per_second:,.1f} requests/s)",
            f"requests {t.requests:,}: committed {t.committed:,}, refused for stock {t.refused:,}, "
            f"already applied {t.already_applied:,}, errors {t.errors:,}",
            f"retries (same idempotency key) {t.retries:,}: already applied {t.retries_already_applied:,}, "
            f"committed again (applied nothing) {t.retries_committed:,}, refused {t.retries_refused:,}",
            f"lock failures per request: {t.lock_failures / t.requests if t.requests else 0.0:.3f} "
            f"({t.lock_failures:,} in all)",
        ]
        hits, misses = self.entity_cache_counts()
        rate = self.entity_cache_hit_rate()
        if rate is not None:
            lines.append(f"entity cache: {hits:,} hit(s), {misses:,} miss(es): hit rate {100 * rate:.1f} %")
        elif self.settings.entity_cache:
            lines.append("entity cache: no hit or miss counted")
        else:
            lines.append("entity cache: off")
        if self.settings.batch:
            batches, members, lingered = self.batch_counts()
            mean = f", {members / batches:.1f} per batch" if batches else ""
            lines.append(
                f"batches: {batches:,} log transaction(s) carried {members:,} request(s){mean}; "
                f"{lingered:,} log transaction(s) waited for the linger"
            )
        lines.append(t.commit_latency.text("submit->commit"))
        lines.append(t.applied_latency.text("submit->applied"))
        if self.unapplied:
            lines.append(f"not seen applied in time (left out of submit->applied): {self.unapplied:,}")
        cpu = self.cpu_microseconds_per_committed()
        if cpu:
            lines.append(
                "CPU per committed reservation (µs): " + ", ".join(f"{k} {v:,.0f}" for k, v in cpu.items())
            )
        stages = self.client_stage_ms()
        if stages:
            parts = ", ".join(f"{stage} {ms:,.2f}" for stage, ms in stages.items())
            lines.append(f"client stages, mean (ms): {parts}")
        lines += [f"{'PASS' if c.passed else 'FAIL'}  {c.name}: {c.detail}" for c in self.checks]
        lines += [f"error: {e}" for e in t.error_samples]
        lines += [f"warning: {w}" for w in self.warnings]
        return "\n".join(lines)
