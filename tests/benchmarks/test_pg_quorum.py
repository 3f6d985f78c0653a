"""The quorum server of the SmallBank peer (benchmarks/peers/pg_quorum.py): a PostgreSQL primary
whose commits wait for one of its two synchronous standbys (2 of 3 copies, as a Waltz partition's
quorum write at RF 3; docs/design/server.md, "Quorum writes and batching"), started on loopback
for a run and gone, processes and directory, when it ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import support

from benchmarks.peers.pg_quorum import STANDBY_NAMES, PgQuorum, PgQuorumError, find_bindir
from benchmarks.peers.pg_server import PgServer, show
from waltz.local.processes import free_port, wait_until


@pytest.fixture
def quorum() -> Iterator[PgQuorum]:
    """A started quorum server, closed after the test."""
    _binaries()
    with PgQuorum() as servers:
        yield servers


def _postmasters(root: Path) -> list[int]:
    """The pids in the ``postmaster.pid`` files of the quorum's data directories."""
    return [int(path.read_text().split("\n", 1)[0]) for path in sorted(root.glob("*/postmaster.pid"))]


def _walreceiver(standby: PgServer) -> int:
    """The pid of a standby's WAL receiver (the process that acknowledges the primary's WAL)."""
    with psycopg.connect(standby.dsn(), autocommit=True) as conn:
        row = conn.execute("SELECT pid FROM pg_stat_wal_receiver WHERE status = 'streaming'").fetchone()
    assert row is not None, f"{standby} has no streaming WAL receiver"
    return int(row[0])


def _commit(primary: PgServer, value: int, wait: float) -> list[str]:
    """Insert ``value`` into ``t`` in a transaction of its own, cancelling the commit's wait for
    the standbys after ``wait`` seconds; the warnings the commit raised."""
    warnings: list[str] = []
    with psycopg.connect(primary.dsn()) as conn:
        conn.add_notice_handler(lambda notice: warnings.append(str(notice.message_primary)))
        conn.execute("INSERT INTO t VALUES (%s)", (value,))
        # A statement timeout stops before the commit's wait: only a cancel request ends it.
        timer = threading.Timer(wait, conn.cancel_safe)
        timer.start()
        try:
            conn.commit()
        finally:
            timer.cancel()
    return warnings


def _binaries() -> Path:
    try:
        return find_bindir()
    except PgQuorumError as exc:
        support.unavailable(str(exc))


def test_both_standbys_are_in_quorum_a_commit_reaches_them_and_closing_leaves_nothing() -> None:
    _binaries()
    quorum = PgQuorum()
    with quorum:
        root = quorum.root
        assert root is not None and root.is_dir()
        pids = _postmasters(root)
        assert len(pids) == 3 and all(support.pid_is_alive(pid) for pid in pids)
        _check_quorum_and_a_commit(quorum)
    assert quorum.root is None
    assert not root.exists()
    assert [pid for pid in pids if support.pid_is_alive(pid)] == []
    quorum.close()  # idempotent


def _check_quorum_and_a_commit(quorum: PgQuorum) -> None:
    assert quorum.replication() == [(name, "streaming", "quorum") for name in STANDBY_NAMES]
    settings = show(quorum.primary, ("synchronous_standby_names", "synchronous_commit", "listen_addresses"))
    assert settings == {
        "synchronous_standby_names": "ANY 1 (s1, s2)",
        "synchronous_commit": "on",
        "listen_addresses": "127.0.0.1",
    }
    assert len({quorum.primary.port, *(s.port for s in quorum.standbys)}) == 3
    with psycopg.connect(quorum.primary.dsn()) as conn:
        conn.execute("CREATE TABLE t (v integer PRIMARY KEY)")
        conn.commit()
        conn.execute("INSERT INTO t VALUES (1)")
        (before_commit,) = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone() or ("",)
        conn.commit()
        # The commit returned: a standby has flushed its WAL (its commit record lies past ``before``).
        flushed = conn.execute(
            "SELECT application_name FROM pg_stat_replication WHERE flush_lsn > %s::pg_lsn",
            (before_commit,),
        ).fetchall()
    assert flushed, "the commit returned before any standby flushed it"

    def on_both_standbys() -> bool:
        for standby in quorum.standbys:
            with psycopg.connect(standby.dsn(), autocommit=True) as conn:
                if conn.execute("SELECT v FROM t").fetchall() != [(1,)]:
                    return False
        return True

    wait_until(on_both_standbys, timeout=20, what="the committed row readable on both standbys")


def test_a_commit_waits_for_one_standby_not_two(quorum: PgQuorum) -> None:
    with psycopg.connect(quorum.primary.dsn()) as conn:
        conn.execute("CREATE TABLE t (v integer PRIMARY KEY)")
        conn.commit()
    receivers = [_walreceiver(standby) for standby in quorum.standbys]
    paused: list[int] = []
    try:
        os.kill(receivers[0], signal.SIGSTOP)
        paused.append(receivers[0])
        assert _commit(quorum.primary, 1, wait=10) == []  # s2 is enough for ANY 1
        os.kill(receivers[1], signal.SIGSTOP)
        paused.append(receivers[1])
        # Neither standby can acknowledge: the commit waits until it is cancelled (the row is then
        # committed on the primary alone, and PostgreSQL says so).
        warnings = _commit(quorum.primary, 2, wait=1)
        assert any("canceling wait for synchronous replication" in w for w in warnings), warnings
    finally:
        for pid in paused:
            os.kill(pid, signal.SIGCONT)


def test_missing_binaries_are_an_error_that_says_where_it_looked(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("WALTZ_PG_BIN", str(tmp_path))
    with pytest.raises(PgQuorumError, match=r"WALTZ_PG_BIN=.*no executable initdb, pg_ctl, pg_basebackup"):
        find_bindir()
    with pytest.raises(PgQuorumError, match="no executable initdb"):
        PgQuorum(bindir=tmp_path).start()


@pytest.fixture
def failing_bindir() -> Iterator[Path]:
    """A directory of the real server binaries whose ``pg_ctl start`` gives the server a setting
    it does not know, so that it exits at once, logging why (readable by the servers' OS user)."""
    bindir = _binaries()
    with tempfile.TemporaryDirectory(prefix="waltz-test-pg-bin-") as directory:
        fake = Path(directory)
        fake.chmod(0o755)
        for name in ("initdb", "pg_basebackup"):
            (fake / name).symlink_to(bindir / name)
        pg_ctl = bindir / "pg_ctl"
        (fake / "pg_ctl").write_text(
            "#!/bin/sh\n"
            f'case " $* " in *" start "*) exec {pg_ctl} "$@" -o "-c no_such_setting=1";; esac\n'
            f'exec {pg_ctl} "$@"\n'
        )
        (fake / "pg_ctl").chmod(0o755)
        yield fake


def test_a_server_that_does_not_start_is_an_error_with_its_log_and_leaves_nothing(
    failing_bindir: Path, quorum_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(quorum_tmp))  # the quorum's directory goes there
    quorum = PgQuorum(bindir=failing_bindir, start_timeout=20)
    with pytest.raises(PgQuorumError) as raised:
        quorum.start()
    message = str(raised.value)
    assert "pg_ctl" in message and "start" in message
    assert 'unrecognized configuration parameter "no_such_setting"' in message  # the server's log
    assert quorum.root is None
    assert list(quorum_tmp.iterdir()) == []


_QUORUM_BESIDE_GRPC = """
import grpc
from benchmarks.peers.pg_quorum import PgQuorum

channel = grpc.insecure_channel("127.0.0.1:{port}")  # nothing listens: gRPC keeps reconnecting
grpc.channel_ready_future(channel)  # its threads run while the servers are made
with PgQuorum(start_timeout=60) as quorum:
    print(quorum.replication())
channel.close()
"""


def test_servers_are_made_without_running_grpc_fork_handlers_in_a_grpc_process(quorum_tmp: Path) -> None:
    """A test worker or the benchmark has gRPC threads running. Switching to the servers' OS
    user in ``subprocess`` makes Python fork rather than vfork, and gRPC's fork handlers then
    run in the child, which can die of them before it runs ``initdb`` (exit code -11). gRPC
    traces each fork it handles: there must be none."""
    _binaries()
    env = {**os.environ, "TMPDIR": str(quorum_tmp), "GRPC_VERBOSITY": "debug", "GRPC_TRACE": "fork"}
    code = _QUORUM_BESIDE_GRPC.format(port=free_port())
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=180, env=env, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "'streaming', 'quorum'" in done.stdout
    forks = [line for line in done.stderr.splitlines() if "fork_posix" in line]
    assert forks == [], forks
    assert list(quorum_tmp.iterdir()) == []
