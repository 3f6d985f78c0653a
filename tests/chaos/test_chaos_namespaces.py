"""``waltz chaos --network namespaces``: real cuts between hosts, in the default suite and on demand.

Every process (ZooKeeper, the storage nodes, the servers and each client) runs on a host of its
own, a network namespace with its own address; the faults are nftables rules and links taken down
between hosts, not proxies. The short run strikes one cut of each kind, the split-brain cut (the
owner of partition 0 cut from ZooKeeper only) first, and must pass every check; the long run
(``-m slow``) draws 40 faults of every kind namespace mode allows over 20 minutes.
Needs root, iproute2 and nftables (``scripts/setup``); skips saying which is missing.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from waltz.chaos import ChaosOptions, FaultKind, run_chaos
from waltz.chaos.options import database_on_loopback
from waltz.chaos.schedule import NAMESPACE_DEFAULT_FAULTS, NAMESPACE_FAULTS, fixed_schedule, random_schedule
from waltz.local.netns import network_lab_unavailable, nft_unavailable


def _require_namespaces() -> None:
    reason = network_lab_unavailable() or nft_unavailable()
    if reason is not None:
        pytest.skip(reason)


def test_namespace_options_refuse_what_cannot_run_there() -> None:
    with pytest.raises(ValueError, match="need --network namespaces"):
        ChaosOptions(faults=(FaultKind.SPLIT_OWNER,)).validate()
    with pytest.raises(ValueError, match="work through proxies on loopback"):
        ChaosOptions(network="namespaces", faults=(FaultKind.CUT_CLIENTS,)).validate()
    # A database on this machine's loopback is forwarded to the bridge for the client hosts.
    assert database_on_loopback("postgresql+psycopg://postgres@127.0.0.1:5432/ledger")
    assert database_on_loopback("mysql+pymysql://root@localhost/ledger")
    assert not database_on_loopback("postgresql+psycopg://postgres@10.1.2.3/ledger")
    assert not database_on_loopback("sqlite:////tmp/ledger.db")
    with pytest.raises(ValueError, match="unknown network"):
        ChaosOptions(network="docker").validate()
    options = ChaosOptions(
        network="namespaces", faults=tuple(sorted(NAMESPACE_FAULTS, key=lambda k: k.value)), schedule="fixed"
    )
    options.validate()
    assert "--network namespaces" in options.replay_command()


def test_namespace_schedules_hit_a_minority_and_owner_cuts_outlast_the_session() -> None:
    fixed = fixed_schedule(network="namespaces", session_timeout=4.0)
    assert fixed[0].kind is FaultKind.SPLIT_OWNER
    assert {f.kind for f in fixed} == NAMESPACE_FAULTS
    drawn = random_schedule(
        3,
        tuple(sorted(NAMESPACE_FAULTS, key=lambda k: k.value)),
        count=200,
        storages=3,
        servers=3,
        partitions=4,
    )
    for fault in drawn:
        if fault.kind in (FaultKind.SPLIT_OWNER, FaultKind.ONE_WAY_OWNER):
            assert fault.duration > 4.0 and fault.targets[0] in range(4)
            assert "of partition" in fault.describe()
        else:
            assert len(fault.targets) == 1  # one of 3 storage nodes, or one server


# A chaos run: tests/local/test_netns_split_brain.py cuts an owner from ZooKeeper by default.
@pytest.mark.slow
def test_short_namespace_chaos_run_keeps_every_invariant(tmp_path: Path) -> None:
    """3,000 transactions by 3 client hosts; one cut of each kind, the split-brain cut first."""
    _require_namespaces()
    lines: list[str] = []
    options = ChaosOptions(
        transactions=3000,
        seed=1,
        schedule="fixed",
        faults=tuple(sorted(NAMESPACE_FAULTS, key=lambda k: k.value)),
        network="namespaces",
        work_dir=tmp_path / "chaos",
    )
    result = run_chaos(options, lines.append)
    report = "\n".join(lines)
    assert result.passed, report
    assert len(result.faults) == 6 and "split-owner of partition 0" in result.faults[0], report
    assert "cutting server-" in report and "from ZooKeeper, both ways" in report, report
    generations = next(
        c for c in result.checks if c.name.startswith("generations never go back in a partition's log")
    )
    # The split brain happened: partition 0 moved to a newer generation while the old owner lived.
    span = re.search(r"by partition 0: (\d+)\.\.(\d+)", generations.detail)
    assert span is not None and int(span[2]) > int(span[1]), generations.detail
    assert result.acknowledged + result.failed == 3000, report


@pytest.mark.slow
@pytest.mark.timeout(3 * 3600)
def test_long_namespace_chaos_run(tmp_path: Path) -> None:
    """20 minutes, 40 random faults of every kind namespace mode allows (kills, pauses, cuts)."""
    _require_namespaces()
    lines: list[str] = []
    options = ChaosOptions(
        duration=1200.0,
        seed=11,
        network="namespaces",
        faults=NAMESPACE_DEFAULT_FAULTS,
        work_dir=tmp_path / "chaos",
    )
    result = run_chaos(options, lines.append)
    assert result.passed, "\n".join(lines[-80:])
    assert len(result.faults) == 40
