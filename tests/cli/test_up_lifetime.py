"""``waltz up`` leaves no process behind when its terminal closes (SIGHUP) or it is killed (SIGKILL).

The nodes run in sessions of their own, so a closed terminal's SIGHUP reaches ``waltz up`` alone:
it stops the cluster as Ctrl-C does. Killed with ``kill -9`` it cannot stop anything, and the kernel
kills every node it started instead (docs/local-cluster.md, "`waltz up`"). Every process ``waltz
up`` started is found as its descendant before the signal, and must be gone soon after.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import support

from waltz.local.processes import wait_until

#: Seconds ``waltz up`` has to start, then to stop after a signal.
START_TIMEOUT = 120.0
STOP_TIMEOUT = 60.0
#: Seconds the nodes of a killed ``waltz up`` have to die.
ORPHAN_TIMEOUT = 10.0


def _alive(pid: int, cmdline: str) -> bool:
    """Whether ``pid`` still runs the same program (not a reused process ID, not a zombie)."""
    return support.pid_is_alive(pid) and support.cmdline(pid) == cmdline


@contextlib.contextmanager
def _running_up(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path, dict[int, str]]]:
    """``waltz up`` (one storage node, one server, one partition, a temporary work directory) in a
    session of its own, as a terminal runs it; yields it once ready, with its output file and the
    processes it started. Whatever the test does, none of them is left running afterwards."""
    output = tmp_path / "up.out"
    argv = [sys.executable, "-m", "waltz", "up", "--storages", "1", "--servers", "1", "--partitions", "1"]
    argv += ["--insecure", "--no-zookeeper-auth"]
    with output.open("w") as out:
        up = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    started: dict[int, str] = {}
    try:
        wait_until(
            lambda: "ready in" in output.read_text() or up.poll() is not None,
            timeout=START_TIMEOUT,
            what="waltz up to print 'ready in'",
        )
        assert up.poll() is None, output.read_text()
        started.update(support.descendants(up.pid))
        kinds = " ".join(started.values())
        for kind in ("waltz.services.storage", "waltz.services.server", "ZooKeeperServerMain"):
            assert kind in kinds, f"no {kind} process among {started}"
        yield up, output, started
    finally:
        if up.poll() is None:
            up.kill()
            up.wait(10)
        for pid, cmdline in started.items():  # never leave them running, even when the test fails
            if _alive(pid, cmdline):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def _left_running(started: dict[int, str], timeout: float) -> dict[int, str]:
    """The processes of ``started`` still running after up to ``timeout`` seconds."""
    with contextlib.suppress(TimeoutError):
        wait_until(
            lambda: not any(_alive(pid, cmd) for pid, cmd in started.items()),
            timeout=timeout,
            what="every process waltz up started to exit",
        )
    return {pid: cmd for pid, cmd in started.items() if _alive(pid, cmd)}


def test_a_closed_terminal_stops_the_cluster_and_removes_its_directory(tmp_path: Path) -> None:
    with _running_up(tmp_path) as (up, output, started):
        found = re.search(r"work dir\s+(\S+) \(removed at stop\)", output.read_text())
        assert found is not None, output.read_text()
        work_dir = Path(found.group(1))
        up.send_signal(signal.SIGHUP)
        returncode = up.wait(STOP_TIMEOUT)
        left = _left_running(started, ORPHAN_TIMEOUT)
    said = output.read_text()
    assert left == {}, f"processes left running after SIGHUP: {left}\n{said}"
    assert returncode == 0, said
    assert "SIGHUP: stopping the cluster" in said, said
    assert not work_dir.exists(), f"{work_dir} left behind\n{said}"


def test_a_killed_waltz_up_leaves_no_node_running(tmp_path: Path) -> None:
    with _running_up(tmp_path) as (up, output, started):
        found = re.search(r"work dir\s+(\S+) \(removed at stop\)", output.read_text())
        up.send_signal(signal.SIGKILL)
        up.wait(STOP_TIMEOUT)
        left = _left_running(started, ORPHAN_TIMEOUT)
        if found is not None:  # nobody is left to remove it
            shutil.rmtree(found.group(1), ignore_errors=True)
    assert left == {}, f"processes left running after kill -9 of waltz up: {left}"


def test_a_failed_start_keeps_the_temporary_directory_its_error_names() -> None:
    """The error of a start that failed names a log in the temporary work directory, and says that
    the directory is kept: the log it names is there to read. The server fails for certain: the
    environment it inherits gives it a setting it refuses."""
    argv = [sys.executable, "-m", "waltz", "up", "--storages", "1", "--servers", "1", "--partitions", "1"]
    result = subprocess.run(
        [*argv, "--insecure", "--no-zookeeper-auth"],
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT,
        check=False,
        env={**os.environ, "WALTZ_SERVER_LOCK_TABLE_SIZE": "-1"},
    )
    found = re.search(r"its temporary work directory (\S+), with every log, is kept", result.stderr)
    named = re.search(r"\((/tmp/waltz-local-[^/]+)/\S+\.log\)", result.stderr)
    try:
        assert result.returncode == 1, result.stderr
        assert "server-0 exited with code 2" in result.stderr, result.stderr
        assert named is not None, result.stderr
        assert found is not None and found.group(1) == named.group(1), result.stderr
        assert Path(named.group(1)).is_dir(), result.stderr
    finally:
        for match in (found, named):
            if match is not None:
                shutil.rmtree(match.group(1), ignore_errors=True)
