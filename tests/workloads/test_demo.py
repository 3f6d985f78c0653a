"""The demo (``waltz demo``'s logic): the ledger under the SmallBank mix and faults passes its checks."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import support
from typer.testing import CliRunner

from waltz.local.processes import free_port
from waltz.services.storage import format as fmt
from waltz.services.storage.inspect.reader import read_control_file
from waltz.workloads.demo import DemoOptions, DemoResult, run_demo


# PostgreSQL under faults with -m slow: the faults are the log's, and the other demo tests run on it.
@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.slow)])
def test_the_demo_passes_its_checks_under_faults(
    request: pytest.FixtureRequest, tmp_path: Path, backend: str
) -> None:
    db_url = None if backend == "sqlite" else str(request.getfixturevalue("postgres_url"))
    lines: list[str] = []
    options = DemoOptions(
        work_dir=tmp_path, db_url=db_url, transactions=200, accounts=40, partitions=2, instances=3
    )
    result = run_demo(options, lines.append, lambda label, total: lambda n: None)
    report = "\n".join(lines)
    assert result.passed, report
    assert [c.name for c in result.checks if not c.passed] == []
    assert len(result.faults) == 4, report  # two kills, two restarts
    assert result.stats.committed > 100, report
    # Every draw is a transaction or a balance read; the run's own closings and payments are named.
    ran = re.search(
        r"ran (\d+) transactions \((\d+) of them the run's own account closings and payments to closed "
        r"accounts\) and (\d+) balance reads",
        report,
    )
    assert ran is not None, report
    submitted, added, reads = (int(x) for x in ran.groups())
    assert added > 0 and submitted + reads == options.transactions + added, report
    # The ledger's releases 2 and 3 rolled out while the mix ran, release 4 once it was over.
    assert [e for e in result.deploys if e.endswith("every instance runs it")] == [
        "release 2: every instance runs it",
        "release 3: every instance runs it",
    ], report
    assert "release 4: migrated; 3 instances run it" in result.deploys, report
    versions = next(c for c in result.checks if c.name == "the log holds every schema version of the models")
    assert "ledger.account v1 40, v2 " in versions.detail and ", v3 " in versions.detail, report
    _assert_secure_and_key_never_shown(tmp_path, report)


def _assert_secure_and_key_never_shown(work_dir: Path, report: str) -> None:
    """The demo ran on a secure cluster (the default), and neither what it printed nor any log of
    its processes holds the cluster key (docs/design/overview.md, "The cluster key")."""
    assert (work_dir / "cluster" / "tls" / "ca.pem").is_file(), "the demo's cluster made no certificates"
    controls = sorted(work_dir.rglob(fmt.CONTROL_FILE_NAME))
    assert controls, f"no storage control file under {work_dir}"
    keys = {read_control_file(path.parent).header.cluster_key for path in controls}
    assert len(keys) == 1, keys
    key = keys.pop()
    logs = sorted(work_dir.rglob("*.log"))
    assert len(logs) >= 6, logs  # ZooKeeper, 3 storage nodes, 2 servers
    for name, text in [("the demo's output", report)] + [
        (str(p), p.read_text(errors="replace")) for p in logs
    ]:
        assert str(key) not in text and key.hex not in text, f"{name} holds the cluster key"


# Two demo runs: a kept cluster starting again is tests/local/test_local_cluster.py's by default.
@pytest.mark.slow
def test_a_demo_run_again_on_its_work_directory_goes_on_with_the_same_log(tmp_path: Path) -> None:
    """``waltz demo --work-dir`` kept: a second run resumes the cluster, its log and the SQLite
    database the first one migrated through the releases, and goes on with the current release."""
    options = DemoOptions(
        work_dir=tmp_path, transactions=150, accounts=30, partitions=2, instances=2, spark=False
    )
    first: list[str] = []
    result = run_demo(options, first.append, lambda label, total: lambda n: None)
    assert result.passed, "\n".join(first)
    assert not any(line.startswith("resuming") for line in first)
    assert len([e for e in result.deploys if e.endswith("every instance runs it")]) == 2, first
    before = _applied(result)
    again: list[str] = []
    result = run_demo(options, again.append, lambda label, total: lambda n: None)
    report = "\n".join(again)
    assert result.passed, report
    assert f"resuming the log of {tmp_path}" in report
    assert [e for e in result.deploys if e.endswith("every instance runs it")] == [], report
    assert _applied(result) > before, report  # the same log, longer


def _applied(result: DemoResult) -> int:
    """The log transactions the exactly-once check counted."""
    check = next(c for c in result.checks if c.name.startswith("every (transaction, member) applied"))
    found = re.search(r"(\d+) transactions", check.detail)
    assert found is not None, check.detail
    return int(found.group(1))


@pytest.mark.slow
def test_the_full_demo(tmp_path: Path) -> None:
    lines: list[str] = []
    result = run_demo(DemoOptions(work_dir=tmp_path), lines.append, lambda label, total: lambda n: None)
    assert result.passed, "\n".join(lines)


# Batches run by default in tests/jdbc_style/test_batch_crash.py, tests/perf/test_perf_smallbank.py
# and tests/spark/test_views_and_target.py (a log of batches rebuilt).
@pytest.mark.slow
def test_the_demo_with_batch_commits_batches_and_passes_its_checks(tmp_path: Path) -> None:
    """``waltz demo --batch``: the instances submit through an EntityBatcher, batches of several
    operations commit, and every check passes, each member counted as applied exactly once
    (docs/design/sql.md "Batched entity transactions"), and the tables Spark rebuilds from the log
    of batches equal the live database (docs/design/spark.md)."""
    from waltz.cli.main import app

    args = ["demo", "--batch", "--transactions", "200", "--accounts", "40", "--partitions", "2"]
    args += ["--no-faults", "--work-dir", str(tmp_path)]
    result = CliRunner().invoke(app, args)
    output = result.output
    assert result.exit_code == 0, output + result.stderr
    assert not [line for line in output.splitlines() if line.startswith("FAIL")], output
    # The batchers' own count, in the summary: batches of more than one operation committed.
    summary = re.search(
        r"^PASSED in \d+s \(batches on: ([\d,]+) batches carried ([\d,]+) operations", output, re.M
    )
    assert summary is not None, output
    batches, members = (int(g.replace(",", "")) for g in summary.groups())
    assert batches > 0 and members >= 2 * batches, output
    # The log's count, in the per-member exactly-once check: it saw the batches' members.
    once = re.search(
        r"^PASS  every \(transaction, member\) applied exactly once: (\d+) transactions, "
        r"(\d+) change-sets \((\d+) batches\)$",
        output,
        re.M,
    )
    assert once is not None, output
    transactions, change_sets, logged = (int(g) for g in once.groups())
    assert logged > 0 and change_sets > transactions, output
    assert re.search(r"^PASS  Spark rebuild from the log equals the live database", output, re.M), output


def test_the_demo_refuses_a_module_that_is_no_smallbank_application(tmp_path: Path) -> None:
    from waltz.cli.main import app

    result = CliRunner().invoke(app, ["demo", "--app", "waltz_examples.counter", "--work-dir", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert "the demo could not run" in result.stderr and "defines SMALLBANK" in result.stderr
    assert not (tmp_path / "cluster").exists()  # refused before a cluster started


def test_the_demo_refuses_an_unreachable_database_before_starting_a_cluster(tmp_path: Path) -> None:
    """``--db`` on a port nothing listens on: one line naming the database and the refusal, exit
    2 ("could not run"), and no cluster started for it."""
    from waltz.cli.main import app

    port = free_port()
    url = f"postgresql+psycopg://postgres@127.0.0.1:{port}/nowhere"
    result = CliRunner().invoke(app, ["demo", "--db", url, "--no-spark", "--work-dir", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert f"the demo could not run: cannot use the database {url}: OperationalError" in result.stderr
    assert "Traceback" not in result.output + result.stderr
    assert not (tmp_path / "cluster").exists()


def test_the_demo_with_a_split_in_the_middle_passes_its_checks_on_every_partition(tmp_path: Path) -> None:
    """``waltz demo --split-to``: the log's partitions split while the mix runs
    (docs/design/splits.md "The handover"); every check then covers the partitions of both counts
    (each transaction applied once, from a new partition's genesis on and but the split records;
    every replica; the Spark rebuild at every partition's mark), money is conserved, and an
    operation decided at the old count that parts at the new one is drawn again, not failed."""
    from waltz.cli.main import app

    args = ["demo", "--split-to", "4", "--transactions", "300", "--accounts", "40", "--partitions", "2"]
    args += ["--no-faults", "--no-evolve", "--work-dir", str(tmp_path)]
    result = CliRunner().invoke(app, args)
    output = result.output
    assert result.exit_code == 0, output + result.stderr
    assert not [line for line in output.splitlines() if line.startswith("FAIL")], output

    def passed(check: str) -> str:
        """The detail of the check ``check``, which passed."""
        found = re.search(rf"^PASS  {re.escape(check)}: (.*)$", output, re.M)
        assert found is not None, f"{check!r} did not pass:\n{output}"
        return found.group(1)

    assert passed("the log split to 4 partitions under the mix").startswith("split to 4 partitions complete")
    marks = passed("database marks = server high-water marks")
    assert re.match(r"server \{0: \d+, 1: \d+, 2: \d+, 3: \d+\}, database", marks), marks
    assert passed("replicas hold identical record sequences") == "4 partitions compared"
    rebuilt = passed("Spark rebuild from the log equals the live database")
    assert re.search(r"at marks \{0: \d+, 1: \d+, 2: \d+, 3: \d+\}$", rebuilt), rebuilt
    assert passed("money conserved")


def test_ctrl_c_while_a_release_rolls_out_stops_everything_and_says_so(tmp_path: Path) -> None:
    """SIGINT in the middle of the mix, while a release rolls out (a retire waits for requests the
    interrupted run will never resolve): the demo stops its instances and cluster, says so in one
    line, and exits 130, with no traceback and no process left behind."""
    work = tmp_path / "work"
    # Python keeps SIGINT ignored when its parent ignored it (a background job of a script): the
    # demo's process is given Python's own handler back, as an interactive shell would.
    start = (
        "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        f"sys.argv = ['waltz', 'demo', '--no-spark', '--work-dir', {str(work)!r}]; "
        "runpy.run_module('waltz', run_name='__main__')"
    )
    command = [sys.executable, "-c", start]
    demo = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert demo.stdout is not None
    seen: list[str] = []
    try:
        deadline = time.monotonic() + 180
        for line in demo.stdout:
            seen.append(line.rstrip())
            if "migrating, then one instance at a time" in line or time.monotonic() > deadline:
                break
        assert any("migrating, then one instance at a time" in s for s in seen), "\n".join(seen)
        time.sleep(0.5)  # the roll under way: its first instance started, the old one retiring
        started = support.descendants(demo.pid)  # ZooKeeper, storage nodes, servers
        assert any("waltz.services" in c for c in started.values()), started
        demo.send_signal(signal.SIGINT)
        rest, _ = demo.communicate(timeout=90)
    finally:
        if demo.poll() is None:  # the test failed first: nothing of the demo's is left running
            for pid in support.descendants(demo.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            demo.kill()
            demo.wait()
    output = "\n".join(seen) + "\n" + rest
    assert demo.returncode == 130, output
    assert f"interrupted: the demo's cluster was stopped; its work directory was kept in {work}" in output
    assert "Traceback" not in output, output
    assert not {p: c for p, c in started.items() if support.pid_is_alive(p)}, started
