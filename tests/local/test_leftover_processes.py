"""A local cluster started again on the work directory of a crashed run (docs/local-cluster.md,
"`waltz up`").

The crashed run is a real one: a process that starts a ``LocalCluster`` on the work directory and
is killed with ``kill -9``, its nodes left running, as a run of a system (or of an earlier
version) whose nodes do not die with their supervisor leaves them: the script turns off the
parent-death signal of waltz.local.processes for that. The next start must not take those nodes'
answers for its own: it kills those the work directory lists, and fails before it starts anything,
naming each node and port, when others (unlisted) listen on its nodes' ports.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import support

import waltz
from waltz.local.cluster import LocalCluster
from waltz.local.leftovers import PROCESSES_FILE
from waltz.local.options import SecurityOptions
from waltz.local.processes import ServiceStartError, wait_until

REPO_ROOT = Path(waltz.__file__).resolve().parents[1]

CLUSTER = "storages=1, servers=1, partitions=1"


def _cluster(work_dir: Path) -> LocalCluster:
    return LocalCluster(
        storages=1, servers=1, partitions=1, work_dir=work_dir, security=SecurityOptions.plaintext()
    )


@pytest.fixture
def crashed(tmp_path: Path) -> Iterator[tuple[Path, dict[str, int]]]:
    """A work directory whose cluster's supervisor was killed with ``kill -9``, and the PIDs (by
    name) of the nodes it left running; none of them outlives the test."""
    work_dir = tmp_path / "cluster"
    script = textwrap.dedent(
        f"""
        import json, os, signal
        import waltz.local.processes
        from waltz.local.cluster import LocalCluster
        from waltz.local.options import SecurityOptions

        waltz.local.processes._PRCTL = None  # its nodes do not die with it
        cluster = LocalCluster(
            {CLUSTER}, work_dir={str(work_dir)!r}, security=SecurityOptions.plaintext()
        )
        cluster.start()
        print(json.dumps(cluster.pids()), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=180, check=False
    )
    assert result.returncode == -signal.SIGKILL, result.stderr
    left: dict[str, int] = json.loads(result.stdout.strip().splitlines()[-1])
    commands = {pid: support.cmdline(pid) for pid in left.values()}
    try:
        assert all(support.pid_is_alive(pid) for pid in left.values()), left
        yield work_dir, left
    finally:
        for pid, command in commands.items():  # never leave them running
            if support.pid_is_alive(pid) and support.cmdline(pid) == command:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)


def test_the_next_start_kills_the_nodes_a_crashed_run_left(
    crashed: tuple[Path, dict[str, int]], caplog: pytest.LogCaptureFixture
) -> None:
    work_dir, left = crashed
    assert (work_dir / PROCESSES_FILE).exists()
    with _cluster(work_dir) as cluster:
        assert not any(support.pid_is_alive(pid) for pid in left.values()), left
        assert set(cluster.pids().values()).isdisjoint(left.values())
        assert cluster.pids().keys() == left.keys()
        said = [r.getMessage() for r in caplog.records]
        killed = [line for line in said if "left running by an earlier run" in line]
        assert len(killed) == len(left), killed
        assert any(f"storage-0 (pid {left['storage-0']})" in line for line in killed), killed
    assert not (work_dir / PROCESSES_FILE).exists()  # stopped cleanly: nothing left to kill


def test_a_start_fails_when_others_answer_on_its_nodes_ports(
    crashed: tuple[Path, dict[str, int]],
) -> None:
    work_dir, left = crashed
    (work_dir / PROCESSES_FILE).unlink(missing_ok=True)  # as an earlier version left it
    cluster = _cluster(work_dir)
    with pytest.raises(ServiceStartError) as raised:
        cluster.start()
    message = str(raised.value)
    assert "other processes listen on" in message, message
    for name in ("zookeeper", "storage-0", "server-0"):
        assert f"{name} port " in message, message
    assert all(support.pid_is_alive(pid) for pid in left.values()), "not its processes to stop"
    wait_until(lambda: not cluster.pids(), timeout=10, what="the failed start to stop its processes")
