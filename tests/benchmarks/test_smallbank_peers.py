"""The SmallBank peers of the peer benchmarks (benchmarks/peers/bench_smallbank_pg.py, with and
without ``--quorum``, and bench_smallbank_es.py): a short run of each on the real PostgreSQL (for
``--quorum`` a primary and two synchronous standbys of the run's own) must commit, keep the money
(balances = opening balances + deposits − withdrawals) and follow the ledger example's mix and
rules, and the two, run one operation at a time, must decide every operation alike, for their
figures to stand beside the ledger's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

import psycopg
import pytest
import support

from benchmarks.peers import smallbank_rules, smallbank_workload
from benchmarks.peers.pg_quorum import PgQuorumError, find_bindir
from waltz.workloads.smallbank import MIX

#: The repository's root: the peers run as modules of the ``benchmarks`` package from there.
_ROOT = Path(__file__).resolve().parents[2]
_DRAWS = 400


@pytest.fixture
def smallbank() -> tuple[ModuleType, ModuleType]:
    """The peers' SmallBank workload and rules."""
    return smallbank_workload, smallbank_rules


def _eventsourcing() -> None:
    try:
        import eventsourcing  # noqa: F401
    except ImportError:
        support.unavailable("eventsourcing is not installed (benchmarks/peers/setup.sh)")


def _run(
    peer: str, threads: int = 4, draws: int = _DRAWS, *options: str, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """Run a peer briefly (``python -m benchmarks.peers.<peer> [options]``, 1 process x
    ``threads``, in ``env`` when given) and parse the JSON line it prints."""
    command = [
        sys.executable,
        *("-m", f"benchmarks.peers.{peer}", *options),
        *("--transactions", str(draws), "--processes", "1", "--threads", str(threads)),
        *("--warmup", "20", "--time-limit", "60"),
    ]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=120, check=False, cwd=_ROOT, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    row: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return row


def _check(row: dict[str, Any]) -> None:
    assert row["errors"] == []
    assert row["failed"] == 0
    assert row["committed"] > 0
    assert row["transactions"] == row["committed"] == row["latency_ms"]["count"]
    assert row["money_conserved"] is True
    money = row["money"]
    assert money["final"] == money["initial"] + money["deposits"] - money["withdrawals"]
    assert row["negative_savings"] == 0
    assert row["draws"] == _DRAWS and row["time_limited_threads"] == 0
    assert row["committed"] + row["dropped"] + row["balances_read"] == _DRAWS
    by_op = row["by_op"]
    assert set(by_op) == set(MIX)
    for name, percent in MIX.items():
        share = by_op[name]["draws"] / _DRAWS
        assert abs(share - percent / 100) < 0.08, (name, share)
        assert by_op[name]["committed"] + by_op[name]["dropped"] <= by_op[name]["draws"]
    assert by_op["balance"]["committed"] == 0
    assert by_op["balance"]["draws"] == row["balances_read"]
    # Only the operations with a funds rule are dropped (operations.py)
    for name in ("amalgamate", "deposit_checking", "write_check"):
        assert by_op[name]["dropped"] == 0, name
    assert set(row["drop_reasons"]) <= {
        "customer N has insufficient funds for N",
        "customer N's savings cannot cover N",
    }


def test_the_mix_and_the_rules_are_the_ledger_examples(smallbank: tuple[ModuleType, ModuleType]) -> None:
    workload, rules = smallbank
    assert workload.MIX == MIX
    options = workload.Options(accounts=200)
    assert options.hotspot == 20
    assert workload.Options(accounts=5).hotspot == 2
    op, decide = workload.Op, rules.decide
    rich, poor = ("open", 1000, 1000), ("open", 100, 300)
    assert decide(op("send_payment", (1, 2), 500), [poor, rich]).reason == (
        "customer 1 has insufficient funds for 500"
    )
    paid = decide(op("send_payment", (2, 1), 500), [rich, poor])
    assert (paid.delta, paid.checking) == (0, {2: 500, 1: 800})
    assert decide(op("transact_savings", (1,), -2020), [rich]).delta is None
    check = decide(op("write_check", (1,), 500), [("open", 100, 300)])  # 400 < 500: penalty of 1
    assert (check.delta, check.checking) == (-501, {1: -201})
    merged = decide(op("amalgamate", (1, 2), 0), [poor, rich])
    assert (merged.delta, merged.savings, merged.checking) == (0, {1: 0}, {1: 0, 2: 1400})
    assert decide(op("deposit_checking", (1,), 130), [("closed", 0, 0)]).reason == (
        "customer 1's account is closed"
    )
    assert decide(op("deposit_checking", (1,), 130), [None]).reason == "customer 1 has no account"


def test_smallbank_on_postgresql_commits_and_keeps_the_money(postgres_server: support.DatabaseServer) -> None:
    row = _run("bench_smallbank_pg")
    _check(row)
    assert row["system"] == "PostgreSQL (SmallBank)"
    assert set(row["retry_reasons"]) <= {"DeadlockDetected", "SerializationFailure"}


def _quorum_leftovers(root: Path) -> tuple[list[Path], list[int]]:
    """What is left under ``root`` (the benchmark's ``TMPDIR``): directories, and the processes
    running in them."""
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if str(root).encode() in cmdline.read_bytes():
                pids.append(int(cmdline.parent.name))
        except OSError:  # the process ended meanwhile
            continue
    return sorted(root.iterdir()), pids


def test_smallbank_on_postgresql_with_two_synchronous_standbys_keeps_the_money_and_cleans_up(
    quorum_tmp: Path,
) -> None:
    try:
        find_bindir()
    except PgQuorumError as exc:
        support.unavailable(str(exc))
    env = {**os.environ, "TMPDIR": str(quorum_tmp)}
    row = _run("bench_smallbank_pg", 4, _DRAWS, "--quorum", env=env)
    _check(row)
    assert row["system"] == "PostgreSQL, 2 synchronous standbys (ANY 1) (SmallBank)"
    assert row["config"].startswith("3 PostgreSQL ")
    assert "synchronous_standby_names=ANY 1 (s1, s2), synchronous_commit=on" in row["settings"]
    assert row["replication"] == {
        "synchronous_standby_names": "ANY 1 (s1, s2)",
        "synchronous_commit": "on",
        "standbys": [
            {"application_name": name, "state": "streaming", "sync_state": "quorum"} for name in ("s1", "s2")
        ],
    }
    assert set(row["retry_reasons"]) <= {"DeadlockDetected", "SerializationFailure"}
    assert _quorum_leftovers(quorum_tmp) == ([], [])


def test_smallbank_on_eventsourcing_commits_and_keeps_the_money(
    postgres_server: support.DatabaseServer,
) -> None:
    _eventsourcing()
    row = _run("bench_smallbank_es")
    _check(row)
    assert row["system"] == "eventsourcing+PostgreSQL (SmallBank)"
    assert set(row["retry_reasons"]) <= {"RecordConflictError"}


def test_run_one_after_the_other_both_peers_decide_every_operation_alike(
    postgres_server: support.DatabaseServer,
) -> None:
    # One thread: both draw the same operations (same seed) and run them in the same order, so
    # every outcome and the final balances must agree; with threads only the interleaving differs.
    _eventsourcing()
    plain, events = _run("bench_smallbank_pg", 1, 300), _run("bench_smallbank_es", 1, 300)
    for key in ("committed", "dropped", "balances_read", "drop_reasons", "money"):
        assert plain[key] == events[key], key
    for name in MIX:
        outcomes = ("draws", "committed", "dropped")
        assert [plain["by_op"][name][k] for k in outcomes] == [events["by_op"][name][k] for k in outcomes]
    assert plain["retries"] == events["retries"] == 0


def test_smallbank_on_waltz_py_gives_a_row_the_peers_rows_stand_beside(
    postgres_server: support.DatabaseServer,
) -> None:
    """``bench_smallbank_waltz`` runs ``waltz perf smallbank`` (one instance here, on a local
    cluster and a database of its own, dropped afterwards) and counts as the peers count."""
    row = _run("bench_smallbank_waltz", 4, 300)
    assert row["system"] == "waltz-py (SmallBank)"
    assert row["passed"] is True, row["checks"]
    assert {check["name"] for check in row["checks"]} >= {
        "money conserved",
        "every (transaction, member) applied exactly once",
    }
    assert row["errors"] == [] and row["failed"] == 0
    assert row["transactions"] == row["committed"] == row["latency_ms"]["count"] > 0
    assert row["transactions_per_second"] == row["waltz"]["committed_per_second"] > 0
    assert row["balances_read"] > 0 and row["draws"] == 300
    assert row["dropped"] == row["waltz"]["dropped"] == sum(row["waltz"]["drop_reasons"].values())
    assert row["latency_ms"]["p50"] <= row["latency_ms"]["p99"] <= row["latency_ms"]["max"]
    # submit -> applied, the peers' commit: each transaction's is timed once its submit -> commit
    # was (when the instance had applied it by then, at once), so every percentile is at least as long.
    applied, committed = row["latency_ms"], row["latency_ms_submit_to_commit"]
    for percentile in ("p50", "p99", "max"):
        assert applied[percentile] >= committed[percentile], (percentile, applied, committed)
    assert (row["processes"], row["threads"]) == (1, 4)
    assert row["config"].startswith("1 ledger instance, partition-routed, batched, 1 partition, 2 servers")
    assert {"instances", "server-0", "storage-0", "storage-2"} <= set(row["cpu_us_per_transaction"])
    assert "closed loop" in row["load"]
    assert row["settings"].endswith(", batch linger 15 ms")  # client.batchLinger's default
    database = row["waltz"]["database"].rsplit("/", 1)[-1]
    with psycopg.connect("host=127.0.0.1 port=5432 user=postgres dbname=postgres") as conn:
        left = conn.execute("SELECT count(*) FROM pg_database WHERE datname = %s", (database,)).fetchone()
    assert left == (0,), f"{database} was not dropped"


def test_a_rate_not_above_zero_is_refused_by_the_row_and_by_the_sitting() -> None:
    commands = (
        ("bench_smallbank_waltz", "--rate", "0"),
        ("run_all", "--only", "smallbank-waltz", "--smallbank-rate", "0"),
    )
    for module, *options in commands:
        done = subprocess.run(
            [sys.executable, "-m", f"benchmarks.peers.{module}", *options],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            cwd=_ROOT,
        )
        assert done.returncode == 2, done.stderr
        assert "must be above 0, got 0.0" in done.stderr


def _command_tree(root: int, command: str) -> set[int]:
    """The processes under ``root`` whose command line holds ``command``, and the processes under
    them."""
    found: set[int] = set()
    for pid, line in support.descendants(root).items():
        if command in line:
            found |= {pid, *support.descendants(pid)}
    return found


@pytest.mark.slow  # waits out a run's timeout
def test_a_waltz_run_past_its_timeout_stops_the_cluster_it_started(
    postgres_server: support.DatabaseServer,
) -> None:
    """The command is sent SIGTERM, so that it stops its local cluster's nodes (each in a session of
    its own, out of reach of a signal to the command) before it exits."""
    from benchmarks.peers import bench_smallbank_waltz

    options = smallbank_workload.Options(transactions=10_000_000, processes=1, threads=4, warmup=20)
    seen: set[int] = set()
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(0.2):
            seen.update(_command_tree(os.getpid(), "waltz perf smallbank"))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            bench_smallbank_waltz.run(options, timeout=20.0)
    finally:
        stop.set()
        watcher.join(timeout=10)
    assert len(seen) >= 5, f"the command and its cluster's nodes were not seen: {seen}"
    assert [pid for pid in seen if support.pid_is_alive(pid)] == []
