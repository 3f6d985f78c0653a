"""What the SmallBank peers' threads did, counted, merged over threads and processes.

A :class:`Tally` crosses from a worker process to the parent as a plain dict (:meth:`Tally.to_wire`)
and becomes the figures of the result row (``smallbank_report``).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from benchmarks.peers.smallbank_bank import Outcome
from benchmarks.peers.smallbank_workload import Op
from waltz.perf.stats import LatencyHistogram, RunStats


@dataclass
class Tally:
    """What threads did; merged over threads and processes.

    Attributes:
        stats: committed, failed (errors), retries, the committed transactions' latencies, the span.
        draws: draws by operation (every outcome).
        committed_by_op / dropped_by_op: outcomes by operation.
        drop_reasons: why operations were dropped (numbers as ``N``).
        retry_reasons: causes of the retries.
        balances_read: Balance reads.
        deposits / withdrawals: cents the committed operations brought in / took out.
        op_latency: latency by operation, every outcome (submit to commit, rollback or read).
        time_limited: threads that stopped at the time limit.
    """

    stats: RunStats = field(default_factory=RunStats)
    draws: Counter[str] = field(default_factory=Counter)
    committed_by_op: Counter[str] = field(default_factory=Counter)
    dropped_by_op: Counter[str] = field(default_factory=Counter)
    drop_reasons: Counter[str] = field(default_factory=Counter)
    retry_reasons: Counter[str] = field(default_factory=Counter)
    balances_read: int = 0
    deposits: int = 0
    withdrawals: int = 0
    op_latency: dict[str, LatencyHistogram] = field(default_factory=dict)
    time_limited: int = 0

    @property
    def dropped(self) -> int:
        """Operations the rules dropped, all operations together."""
        return sum(self.dropped_by_op.values())

    def record(self, op: Op, outcome: Outcome, seconds: float) -> None:
        """Count one operation that ended.

        Args:
            op: the operation.
            outcome: how it ended (committed, dropped, or a Balance read).
            seconds: its latency, from the start of the operation to its end.
        """
        self.draws[op.name] += 1
        self.stats.retries += len(outcome.retried)
        self.retry_reasons.update(outcome.retried)
        histogram = self.op_latency.get(op.name)
        if histogram is None:
            histogram = self.op_latency[op.name] = LatencyHistogram()
        histogram.record(seconds)
        if outcome.delta is not None:
            self.stats.committed += 1
            self.stats.latency.record(seconds)
            self.committed_by_op[op.name] += 1
            if outcome.delta > 0:
                self.deposits += outcome.delta
            else:
                self.withdrawals -= outcome.delta
        elif outcome.reason is not None:
            self.dropped_by_op[op.name] += 1
            self.drop_reasons[re.sub(r"\d+", "N", outcome.reason)] += 1
        else:
            self.balances_read += 1

    def error(self, op: Op, exc: BaseException) -> None:
        """Count one operation that failed with an error (kept: the first 10 distinct errors).

        Args:
            op: the operation.
            exc: what it raised.
        """
        self.draws[op.name] += 1
        self.stats.failed += 1
        description = f"{op.name}: {exc!r}"
        if description not in self.stats.errors and len(self.stats.errors) < 10:
            self.stats.errors.append(description)

    def merge(self, other: Tally) -> None:
        # The span covers the tallies that ran (a thread that never started has none).
        """Add another tally to this one; the span covers both (a tally that never started has none).

        Args:
            other: a tally of another thread or process.
        """
        spans = [(s.started, s.ended) for s in (self.stats, other.stats) if s.started]
        self.stats.merge(other.stats)
        if spans:
            self.stats.started = min(started for started, _ in spans)
            self.stats.ended = max(ended for _, ended in spans)
        for mine, theirs in (
            (self.draws, other.draws),
            (self.committed_by_op, other.committed_by_op),
            (self.dropped_by_op, other.dropped_by_op),
            (self.drop_reasons, other.drop_reasons),
            (self.retry_reasons, other.retry_reasons),
        ):
            mine.update(theirs)
        self.balances_read += other.balances_read
        self.deposits += other.deposits
        self.withdrawals += other.withdrawals
        self.time_limited += other.time_limited
        for name, histogram in other.op_latency.items():
            self.op_latency.setdefault(name, LatencyHistogram()).add(histogram)

    def to_wire(self) -> dict[str, Any]:
        """This tally as a picklable dict, for :meth:`from_wire` in another process.

        Returns:
            Plain dicts, numbers and encoded histograms.
        """
        return {
            "stats": self.stats.to_wire(),
            "counters": {
                name: dict(getattr(self, name))
                for name in ("draws", "committed_by_op", "dropped_by_op", "drop_reasons", "retry_reasons")
            },
            "numbers": {
                name: getattr(self, name)
                for name in ("balances_read", "deposits", "withdrawals", "time_limited")
            },
            "op_latency": {name: h.encode() for name, h in self.op_latency.items()},
        }

    @classmethod
    def from_wire(cls, wire: dict[str, Any]) -> Tally:
        """A tally from :meth:`to_wire`'s dict.

        Args:
            wire: what :meth:`to_wire` returned, in another process.

        Returns:
            The tally.
        """
        tally = cls(stats=RunStats.from_wire(wire["stats"]))
        for name, counts in wire["counters"].items():
            getattr(tally, name).update(counts)
        for name, value in wire["numbers"].items():
            setattr(tally, name, value)
        tally.op_latency = {name: LatencyHistogram.decode(e) for name, e in wire["op_latency"].items()}
        return tally
