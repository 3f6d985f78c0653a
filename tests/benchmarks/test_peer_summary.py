"""The peer benchmark's summary of repeated runs (``python -m benchmarks.peers.run_all --repeat``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.peers import run_all


def _run(tx_s: float) -> dict[str, Any]:
    return {
        "system": "waltz-py",
        "config": "c",
        "transactions_per_second": tx_s,
        "mb_per_second": 1.0,
        "retries_per_transaction": 0.1,
        "latency_ms": {"p50": tx_s, "p90": 1.0, "p99": 1.0, "p99.9": 1.0},
        "load": "l",
        "settings": "s",
    }


def test_the_median_run_stands_for_the_case_with_the_range_and_the_failures() -> None:
    failed = {"system": "waltz-py", "case": "waltz-p1-s1", "error": "exit code 1"}
    row = run_all.summarize([_run(300.0), failed, _run(100.0), _run(200.0)])
    assert row["transactions_per_second"] == 200.0
    assert row["latency_ms"]["p50"] == 200.0  # the whole row of that run, not a mix
    assert row["runs_tx_s"] == [300.0, 100.0, 200.0]
    assert row["failed_runs"] == 1
    line = run_all.table([row]).splitlines()[-1]
    assert "| 200.0 | 3: 100 to 300, 1 failed | 1.00 |" in line


def test_an_even_count_takes_the_lower_middle_run_and_all_failures_give_the_first() -> None:
    assert run_all.summarize([_run(4.0), _run(1.0), _run(3.0), _run(2.0)])["transactions_per_second"] == 2.0
    first = {"system": "etcd", "case": "etcd", "error": "timed out after 900s"}
    assert run_all.summarize([first, {**first, "error": "exit code 2"}]) is first
    assert "| etcd | - |" in run_all.table([first])


def test_a_single_run_shows_one_run_and_the_cpu_per_transaction_when_measured() -> None:
    row = run_all.summarize([_run(150.0)])
    assert "| 150.0 | 1 | 1.00 |" in run_all.table([row])
    assert "| 1.00 | 1.00 | - | l |" in run_all.table([row])  # no CPU figures: a peer's row
    row["cpu_us_per_transaction"] = {"client": 140.0, "server-0": 90.0, "storage-0": 30.0}
    assert "| 260 (client 140, cluster 120) | l |" in run_all.table([row])


def test_a_row_s_ratio_is_to_the_best_waltz_py_row_of_its_own_workload() -> None:
    log = _run(400.0)
    smallbank = {**_run(150.0), "system": "waltz-py (SmallBank)"}
    plain = {**_run(120.0), "system": "PostgreSQL (SmallBank)"}
    quorum = {**_run(90.0), "system": "PostgreSQL, 2 synchronous standbys (ANY 1) (SmallBank)"}
    hot_row = {**_run(50.0), "system": "PostgreSQL (one hot row)"}
    lines = run_all.table([log, smallbank, plain, quorum, hot_row]).splitlines()[2:]
    assert "| 400.0 | 1 | 1.00 |" in lines[0]
    assert "| 150.0 | 1 | 1.00 |" in lines[1]
    assert "| 120.0 | 1 | 0.80 |" in lines[2]  # against waltz-py (SmallBank), not the log's row
    assert "| 90.0 | 1 | 0.60 |" in lines[3]
    assert "| 50.0 | 1 | - |" in lines[4]  # no waltz-py row of its workload in the table
    assert run_all.workload("PostgreSQL, 2 synchronous standbys (ANY 1) (SmallBank)") == "SmallBank"
    assert run_all.workload("waltz-py") == ""


def test_the_instances_cpu_counts_as_the_client_side() -> None:
    row = {
        **_run(100.0),
        "cpu_us_per_transaction": {"instances": 500.0, "server-0": 300.0, "storage-0": 200.0},
    }
    assert "| 1,000 (client 500, cluster 500) |" in run_all.table([row])


def test_the_empty_loop_is_timed_in_a_new_interpreter() -> None:
    seconds = run_all.empty_loop_seconds()
    assert 0.01 < seconds < 60.0
    assert run_all.EMPTY_LOOP == "for i in range(10_000_000): pass"


_ROOT = Path(__file__).resolve().parents[2]


def test_run_by_its_path_it_says_to_run_it_as_a_module_before_any_run() -> None:
    done = subprocess.run(
        [sys.executable, str(_ROOT / "benchmarks" / "peers" / "run_all.py"), "--only", "smallbank-pg-quorum"],
        cwd=_ROOT,
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done
    assert "-m benchmarks.peers.run_all" in done.stderr
    assert "round" not in done.stdout and "tx/s" not in done.stdout


def test_a_case_that_cannot_run_is_said_before_the_first_round(tmp_path: Path) -> None:
    # An empty PATH: etcd cannot be found, whatever the machine has installed.
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.peers.run_all", "--only", "etcd", "--repeat", "2"],
        cwd=_ROOT,
        check=False,
        env={**os.environ, "PATH": str(tmp_path)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout
    lines = done.stdout.splitlines()
    skipped = [
        i
        for i, line in enumerate(lines)
        if line.startswith("etcd: skipped in every round: etcd not installed")
    ]
    assert len(skipped) == 1, done.stdout
    assert skipped[0] < lines.index("round 1 of 2"), done.stdout
