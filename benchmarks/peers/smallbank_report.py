"""The SmallBank peers' result row: ``common.result``'s keys, SmallBank's own, and the money check.

The row's fields are what ``run_all.py`` prints and stores and ``tests/benchmarks`` checks:
``transactions`` (committed), ``transactions_per_second``, ``latency_ms``, ``dropped``,
``balances_read``, ``by_op``, ``drop_reasons``, ``retry_reasons``, ``money`` and
``money_conserved`` among them.
"""

from __future__ import annotations

from typing import Any

from benchmarks.peers.common import result
from benchmarks.peers.smallbank_workers import Harvest
from benchmarks.peers.smallbank_workload import Options
from waltz.perf.stats import PERCENTILES
from waltz.workloads.smallbank import MIX


def money_check(initial: int, final: int, harvest: Harvest) -> dict[str, Any]:
    """Whether the balances add up: opening balances + deposits − withdrawals of every committed
    operation (warm-up included) = the sum of the balances at the end.

    Args:
        initial: the opening balances' sum, in cents.
        final: the balances' sum at the end, in cents.
        harvest: the run's tallies.

    Returns:
        ``initial``, ``deposits``, ``withdrawals``, ``expected``, ``final`` and ``conserved``.
    """
    deposits = harvest.measured.deposits + harvest.warmup.deposits
    withdrawals = harvest.measured.withdrawals + harvest.warmup.withdrawals
    expected = initial + deposits - withdrawals
    return {
        "initial": initial,
        "deposits": deposits,
        "withdrawals": withdrawals,
        "expected": expected,
        "final": final,
        "conserved": final == expected,
    }


def report(
    system: str,
    config: str,
    settings: str,
    options: Options,
    harvest: Harvest,
    money: dict[str, Any],
    **extra: Any,
) -> dict[str, Any]:
    """The result row (``common.result``'s keys and SmallBank's own).

    Args:
        system: the system's name, e.g. ``PostgreSQL (SmallBank)``.
        config: its topology, e.g. ``1 PostgreSQL 15 (no replication)``.
        settings: its durability and driver settings, printed beside the figure.
        options: the run.
        harvest: the run's tallies.
        money: :func:`money_check`'s dict.
        extra: more keys of the peer's own (e.g. ``negative_savings``).

    Returns:
        The row, JSON-ready.
    """
    tally = harvest.measured
    stats = tally.stats
    if harvest.database_cpu_seconds is not None:
        stats.node_cpu_seconds = {"postgres": harvest.database_cpu_seconds}
    by_op: dict[str, Any] = {}
    for name in MIX:
        histogram = tally.op_latency.get(name)
        by_op[name] = {
            "draws": tally.draws[name],
            "committed": tally.committed_by_op[name],
            "dropped": tally.dropped_by_op[name],
            "latency_ms": {
                f"p{p:g}": round(histogram.percentile_ms(p), 3) if histogram else None for p in PERCENTILES
            },
        }
    draws = sum(tally.draws.values())
    row = result(
        system,
        config,
        settings,
        None,
        stats,
        committed=stats.committed,
        dropped=tally.dropped,
        balances_read=tally.balances_read,
        balances_read_per_second=round(tally.balances_read / stats.seconds, 1),
        draws=draws,
        operations_per_second=round(draws / stats.seconds, 1),
        drop_reasons=dict(tally.drop_reasons.most_common()),
        retry_reasons=dict(tally.retry_reasons.most_common()),
        by_op=by_op,
        time_limited_threads=tally.time_limited,
        warmup_draws=sum(harvest.warmup.draws.values()),
        money=money,
        money_conserved=money["conserved"],
        processes=options.processes,
        threads=options.threads,
        accounts=options.accounts,
        **extra,
    )
    row["load"] = options.describe()
    row["errors"] = row["errors"] + harvest.warmup.stats.errors[:5]
    return row
