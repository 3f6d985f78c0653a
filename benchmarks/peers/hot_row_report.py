"""The one-hot-row peer's result (``hot_row_pg``): the worker processes' figures merged over the
common window, the checks, and the row they make, with ``waltz perf inventory --json``'s keys where
they mean the same (:class:`~waltz.workloads.perf.inventory_report.InventoryPerfReport`'s), and the
same row as ``run_all``'s table reads a peer's (:func:`peer_row`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import psycopg

from benchmarks.peers.hot_row_workers import Harvest, HotRowOptions
from waltz.workloads.application import Check
from waltz.workloads.inventory_workload import InventoryStats

#: The row's ``system``.
SYSTEM = "postgresql"


@dataclass
class HotRowReport:
    """A run's figures, merged over the worker processes, and the checks.

    Attributes:
        options: what ran.
        config: the server: ``1 PostgreSQL 15 (no replication)``, or the quorum's.
        server_settings: its durability settings, e.g. ``synchronous_commit=on, fsync=on, ...``.
        database: the run database's name and server, ``127.0.0.1:5432/waltz_peer_hot_row_1a2b3c4d``.
        harvest: the worker processes' figures and the database's CPU.
        checks: the checks of the database after the run.
        total: the processes' counts and histograms merged; ``seconds`` is the common window (the
            first start to the last end).
        extra: more keys of the row (``replication`` on the quorum).
    """

    options: HotRowOptions
    config: str
    server_settings: str
    database: str
    harvest: Harvest
    checks: list[Check] = field(default_factory=list)
    total: InventoryStats = field(default_factory=InventoryStats)
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        total = InventoryStats()
        processes = self.harvest.processes
        for figures in processes:
            total.add(figures.stats)
        if processes:
            total.seconds = max(1e-6, max(f.ended for f in processes) - min(f.started for f in processes))
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
    def unsent(self) -> int:
        """Requests the threads did not send before the timeout."""
        return sum(f.unsent for f in self.harvest.processes)

    def cpu_microseconds_per_committed(self) -> dict[str, float]:
        """CPU µs per committed reservation: ``workers`` (the client processes), then ``postgres``
        (the run database's backends, when the server runs on this machine)."""
        if not self.total.committed:
            return {}
        spent = {"workers": sum(f.cpu_seconds for f in self.harvest.processes)}
        if self.harvest.database_cpu_seconds is not None:
            spent["postgres"] = self.harvest.database_cpu_seconds
        return {name: seconds * 1e6 / self.total.committed for name, seconds in spent.items()}

    def warnings(self) -> list[str]:
        """What makes the figures hard to compare: requests left unsent at the timeout."""
        if not self.unsent:
            return []
        return [f"{self.unsent:,} request(s) not sent within the {self.options.timeout:g} s timeout"]

    def summary(self) -> dict[str, Any]:
        """The run as one JSON-ready row.

        Keys of ``waltz perf inventory --json`` that mean the same here: ``seconds`` (the common
        window), ``committed_per_second``, ``requests_per_second``, ``requests``, ``committed``,
        ``refused``, ``already_applied``, ``retries``, ``retries_already_applied``,
        ``retries_committed``, ``retries_refused``, ``errors``, ``error_samples``, ``latency_ms``
        (``submit_to_commit``, ``submit_to_applied``: ``p50`` .. ``p99.9``, ``max``, ``mean`` in
        ms, ``count``), ``cpu_us_per_committed``, ``checks``, ``passed``, ``database``,
        ``settings`` (this peer's options), ``warnings``. Its own: ``system`` (``postgresql``),
        ``config``, ``server_settings``, ``load``, ``unsent``, ``warm_up`` (its ``committed`` and
        ``refused``), ``per_process`` (in place of ``per_instance``) and ``extra``'s keys.
        """
        total = self.total
        warm = InventoryStats()
        for figures in self.harvest.processes:
            warm.add(figures.warm_up)
        return {
            "system": SYSTEM,
            "config": self.config,
            "server_settings": self.server_settings,
            "load": self.options.describe(),
            "seconds": round(total.seconds, 3),
            "committed_per_second": round(self.committed_per_second, 1),
            "requests_per_second": round(self.requests_per_second, 1),
            **{name: getattr(total, name) for name in InventoryStats.COUNTS if name != "lock_failures"},
            "error_samples": list(total.error_samples),
            "unsent": self.unsent,
            "latency_ms": {
                "submit_to_commit": total.commit_latency.summary(),
                "submit_to_applied": total.applied_latency.summary(),
            },
            "cpu_us_per_committed": {
                k: round(v, 1) for k, v in self.cpu_microseconds_per_committed().items()
            },
            "warm_up": {"committed": warm.committed, "refused": warm.refused, "errors": warm.errors},
            "per_process": [f.summary() for f in self.harvest.processes],
            "checks": [{"name": c.name, "passed": c.passed, "detail": c.detail} for c in self.checks],
            "passed": self.passed,
            "database": self.database,
            "settings": self.options.summary(),
            "warnings": self.warnings(),
            **self.extra,
        }

    def text(self) -> str:
        """The figures and the checks as ``waltz perf inventory`` prints its own."""
        t = self.total
        lines = [
            f"{SYSTEM}: {self.config}; {self.server_settings}",
            f"load: {self.options.describe()}",
            f"reservations committed {t.committed:,} in {t.seconds:.2f} s: "
            f"{self.committed_per_second:,.1f}/s (all processes, one window; "
            f"{self.requests_per_second:,.1f} requests/s)",
            f"requests {t.requests:,}: committed {t.committed:,}, refused for stock {t.refused:,}, "
            f"already applied {t.already_applied:,}, errors {t.errors:,}",
            f"retries (same idempotency key) {t.retries:,}: already applied {t.retries_already_applied:,}, "
            f"committed again {t.retries_committed:,}, refused {t.retries_refused:,}",
            t.commit_latency.text("submit->commit"),
        ]
        cpu = self.cpu_microseconds_per_committed()
        if cpu:
            lines.append(
                "CPU per committed reservation (µs): " + ", ".join(f"{k} {v:,.0f}" for k, v in cpu.items())
            )
        lines += [f"{'PASS' if c.passed else 'FAIL'}  {c.name}: {c.detail}" for c in self.checks]
        lines += [f"error: {e}" for e in t.error_samples]
        lines += [f"warning: {w}" for w in self.warnings()]
        return "\n".join(lines)


def peer_row(row: dict[str, Any]) -> dict[str, Any]:
    """The row as ``run_all``'s table reads a peer's (``common.result``'s keys): ``transactions``
    and ``transactions_per_second`` are the reservations committed and committed/s,
    ``latency_ms`` is ``submit_to_commit`` (the row's two latencies move to
    ``latency_ms_by_stage``), ``settings`` the server's durability settings, ``mb_per_second`` and
    ``retries_per_transaction`` None (no payload; no retries of a conflict), ``cpu_us_per_transaction``
    the CPU per committed reservation of the ``client`` (the worker processes) and of ``postgres``.

    Args:
        row: :meth:`HotRowReport.summary`.

    Returns:
        A new row.
    """
    return {
        **row,
        "config": f"{row['config']}; {row['settings']['skus']} hot row(s)",
        "settings": f"{row['server_settings']}; one transaction per request at READ COMMITTED, "
        f"SELECT ... FOR UPDATE of the SKU; psycopg {psycopg.__version__}, a connection per thread",
        "options": row["settings"],
        "transactions": row["committed"],
        "failed": row["errors"],
        "transactions_per_second": row["committed_per_second"],
        "mb_per_second": None,
        "retries_per_transaction": None,
        "latency_ms": row["latency_ms"]["submit_to_commit"],
        "latency_ms_by_stage": row["latency_ms"],
        "cpu_us_per_transaction": {
            ("client" if name == "workers" else name): us for name, us in row["cpu_us_per_committed"].items()
        },
        "errors": row["error_samples"],
    }
