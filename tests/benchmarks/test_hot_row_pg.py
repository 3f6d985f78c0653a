"""The one-hot-row peer of ``waltz perf inventory`` (benchmarks/peers/hot_row_pg.py): reservations
of one SKU row straight on PostgreSQL, each a transaction with the row locked ``FOR UPDATE``. A
short run on the real PostgreSQL must never oversell, leave one reservation per request committed,
count its requests as ``waltz perf inventory`` does (every request committed, refused for stock,
already applied or failed) and report committed/s over the processes' common window; its checks
must catch an oversold SKU; and its command line, on the local server and on the quorum server,
must write the JSON row and leave nothing behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
import pytest
import support

from benchmarks.peers.hot_row_pg import create_and_stock, run_in, server_of, state_checks
from benchmarks.peers.hot_row_workers import Answer, HotRowOptions, connect, reserve
from benchmarks.peers.pg_quorum import PgQuorumError, find_bindir
from benchmarks.peers.pg_server import Database
from waltz.local.processes import wait_until
from waltz.workloads.perf.settings import InventoryPerfSettings

#: The repository's root: the peer runs as a module of the ``benchmarks`` package from there.
_ROOT = Path(__file__).resolve().parents[2]
#: The checks' names (``waltz.workloads.inventory.inventory_checks``).
_CHECKS = [
    "no SKU oversold (reserved <= stock)",
    "each SKU's reserved = the sum of its reservations",
    "each idempotency key applied at most once",
    "one reservation per request committed (retries left none)",
]
#: A short run on one row whose stock runs out midway (about 2 units asked per request, 410
#: requests with the warm-up, 300 units): requests are committed, then refused.
_OPTIONS = HotRowOptions(
    transactions=400, processes=1, threads=2, stock=300, retry_fraction=0.25, warm_up=10, timeout=60
)


def _database(url: str) -> Database:
    """The test's database (an SQLAlchemy URL of the ``postgres_url`` fixture) as the peer names it."""
    name = url.rsplit("/", 1)[1]
    return Database(name, server_of(url))


def _counts_add_up(row: dict[str, Any], requests: int) -> None:
    assert row["system"] == "postgresql"
    assert row["requests"] == requests
    assert row["committed"] + row["refused"] + row["already_applied"] + row["errors"] == requests
    assert (row["errors"], row["error_samples"], row["unsent"], row["warnings"]) == (0, [], 0, [])
    assert row["already_applied"] == 0  # every key is new; only retries repeat one
    assert row["retries"] == row["retries_already_applied"] + row["retries_refused"]
    assert row["retries_committed"] == 0
    assert row["latency_ms"]["submit_to_commit"]["count"] == row["committed"]
    assert [check["name"] for check in row["checks"]] == _CHECKS
    assert row["passed"] is True, row["checks"]


def test_the_defaults_are_those_of_waltz_perf_inventory_with_three_instances_and_one_sku() -> None:
    options, inventory = HotRowOptions(), InventoryPerfSettings()
    assert options.processes * options.threads == 3 * inventory.in_flight  # requests in flight
    assert options.skus == 1
    for name in ("transactions", "stock", "max_quantity", "retry_fraction", "warm_up", "seed"):
        assert getattr(options, name) == getattr(inventory, name), name
    shares = [options.share(3001, p, t) for p in range(options.processes) for t in range(options.threads)]
    assert sum(shares) == 3001 and max(shares) - min(shares) == 1


def test_a_short_run_never_oversells_and_counts_committed_per_second_over_the_window(
    postgres_url: str,
) -> None:
    database = _database(postgres_url)
    began = time.time()
    report = run_in(database, _OPTIONS)
    wall = time.time() - began
    row = report.summary()

    with psycopg.connect(database.dsn) as conn:
        (units,) = conn.execute("SELECT units FROM stock WHERE sku_id = 0").fetchone() or (None,)
        reserved, reservations = conn.execute(
            "SELECT coalesce(sum(quantity), 0), count(*) FROM reservations"
        ).fetchone() or (None, None)
    assert units is not None and 0 <= units < _OPTIONS.stock
    assert reserved == _OPTIONS.stock - units  # every unit taken is in a reservation
    assert reservations == row["committed"] + row["warm_up"]["committed"]
    _counts_add_up(row, _OPTIONS.transactions)
    assert row["committed"] > 0 and row["refused"] > 0 and row["retries"] > 0

    # The rate is the committed count over the common window of the processes, not a constant.
    processes = row["per_process"]
    window = max(p["ended"] for p in processes) - min(p["started"] for p in processes)
    assert 0 < window < wall
    assert row["seconds"] == pytest.approx(window, abs=1e-3)
    assert row["committed_per_second"] == pytest.approx(row["committed"] / window, abs=0.06)
    assert row["requests_per_second"] == pytest.approx(row["requests"] / window, abs=0.06)
    assert sum(p["committed"] for p in processes) == row["committed"]


def test_a_reservation_takes_units_once_per_key_and_the_checks_catch_an_oversold_sku(
    postgres_url: str,
) -> None:
    database = _database(postgres_url)
    options = HotRowOptions(skus=2, stock=10)
    with connect(database) as conn:
        create_and_stock(conn, options)
        assert reserve(conn, 0, 3, "a") is Answer.COMMITTED
        assert reserve(conn, 0, 3, "a") is Answer.ALREADY_APPLIED  # a retry: nothing taken
        assert reserve(conn, 1, 11, "b") is Answer.REFUSED
        assert reserve(conn, 1, 10, "c") is Answer.COMMITTED
        assert reserve(conn, 1, 1, "c") is Answer.ALREADY_APPLIED  # a retry after the stock ran out
        assert reserve(conn, 1, 1, "d") is Answer.REFUSED
        assert dict(conn.execute("SELECT sku_id, units FROM stock").fetchall()) == {0: 7, 1: 0}
        assert all(check.passed for check in state_checks(conn, options, first_commits=2))

        conn.execute("UPDATE stock SET units = -1 WHERE sku_id = 1")  # one unit more than there was
        failed = [check.name for check in state_checks(conn, options, first_commits=3) if not check.passed]
    assert failed == [_CHECKS[0], _CHECKS[1], _CHECKS[3]]


def test_a_reservation_waits_for_the_rows_lock_and_decides_on_the_units_left(postgres_url: str) -> None:
    # Another transaction takes the last units meanwhile: the reservation must wait for its lock
    # and be refused on the units it left, not take them again from the units it read before.
    database = _database(postgres_url)
    with connect(database) as holder, connect(database) as conn, ThreadPoolExecutor(1) as pool:
        create_and_stock(holder, HotRowOptions(stock=5))
        pid = conn.info.backend_pid
        with holder.transaction():
            holder.execute("UPDATE stock SET units = 0 WHERE sku_id = 0")
            answer = pool.submit(reserve, conn, 0, 3, "late")
            wait_until(
                lambda: (
                    holder.execute(
                        "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", (pid,)
                    ).fetchone()
                    == (True,)
                ),
                timeout=30,
                what="the reservation to wait for the SKU's row lock",
            )
            assert not answer.done()
        assert answer.result(timeout=30) is Answer.REFUSED
        assert conn.execute("SELECT units FROM stock").fetchall() == [(0,)]
        assert conn.execute("SELECT count(*) FROM reservations").fetchall() == [(0,)]


def _run_command(*options: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "benchmarks.peers.hot_row_pg", *options],
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
        cwd=_ROOT,
        env=env,
    )


def test_the_command_line_prints_the_figures_writes_the_row_and_drops_its_database(
    postgres_server: support.DatabaseServer, tmp_path: Path
) -> None:
    out = tmp_path / "row.json"
    server = postgres_server.admin_url.render_as_string(hide_password=True)
    done = _run_command(
        *("--db", server, "-n", "200", "--processes", "1", "--threads", "2", "--warm-up", "5"),
        *("--json", str(out)),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "reservations committed" in done.stdout
    assert f"PASS  {_CHECKS[0]}" in done.stdout
    row = json.loads(out.read_text())
    _counts_add_up(row, 200)
    assert row["config"].startswith("1 PostgreSQL ")
    assert row["settings"]["processes"] == 1 and row["settings"]["threads"] == 2
    assert not postgres_server.database_exists(row["database"].rsplit("/", 1)[1])


def test_on_the_quorum_server_the_row_names_the_standbys_and_nothing_is_left(quorum_tmp: Path) -> None:
    try:
        find_bindir()
    except PgQuorumError as exc:
        support.unavailable(str(exc))
    out = quorum_tmp / "row.json"
    env = {**os.environ, "TMPDIR": str(quorum_tmp)}
    done = _run_command(
        *("--quorum", "-n", "200", "--processes", "1", "--threads", "2", "--warm-up", "5"),
        *("--json", str(out)),
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    row = json.loads(out.read_text())
    out.unlink()
    _counts_add_up(row, 200)
    assert row["config"].startswith("3 PostgreSQL ")
    assert row["replication"]["synchronous_standby_names"] == "ANY 1 (s1, s2)"
    assert [s["sync_state"] for s in row["replication"]["standbys"]] == ["quorum", "quorum"]
    assert sorted(quorum_tmp.iterdir()) == []


def test_run_all_runs_the_case_and_reads_its_row_as_a_peers(postgres_server: support.DatabaseServer) -> None:
    done = subprocess.run(
        [
            *(sys.executable, "-m", "benchmarks.peers.run_all", "--case", "hot-row-pg", "--quick"),
            *("--transactions", "150", "--hot-row-processes", "1", "--hot-row-threads", "2"),
        ],
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
        cwd=_ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(line for line in reversed(done.stdout.splitlines()) if line.startswith("RESULT "))
    row = json.loads(line[len("RESULT ") :])
    # run_all's keys in place of the peer's: back to the peer's to check them.
    peer = {
        **row,
        "errors": row["failed"],
        "error_samples": row["errors"],
        "latency_ms": row["latency_ms_by_stage"],
    }
    _counts_add_up(peer, 150)
    assert row["transactions"] == row["committed"]
    assert row["transactions_per_second"] == row["committed_per_second"]
    assert row["latency_ms"] == row["latency_ms_by_stage"]["submit_to_commit"]
    assert row["config"].endswith("; 1 hot row(s)")
