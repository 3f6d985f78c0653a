"""``waltz archive run --follow`` exits within the stop bound when ZooKeeper stops with it
(docs/design/server.md, "Stopping within a bound")."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import support

from waltz.local.cluster import LocalCluster
from waltz.protocol.records import ReqId
from waltz.protocol.server_client import ServerAdminClient
from waltz.services.runtime import STOP_BOUND

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    """A cluster with a ZooKeeper of its own (the test stops it)."""
    with LocalCluster(
        security=support.PLAINTEXT, storages=1, servers=1, partitions=2, work_dir=tmp_path / "cluster"
    ) as local:
        local.wait_ready(60)
        yield local


async def _append(cluster: LocalCluster, partition: int, count: int) -> None:
    async with ServerAdminClient(cluster.owner(partition), timeout=60) as admin:
        batch = [(ReqId(5, 1, partition, i), 1, b"archived %d" % i) for i in range(count)]
        assert all(isinstance(o, int) for o in await admin.append(partition, batch))


def test_follow_exits_within_the_bound_when_zookeeper_stops_with_it(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    for partition in (0, 1):
        asyncio.run(_append(cluster, partition, 150))
    zookeeper = cluster.zookeeper
    assert zookeeper is not None and zookeeper.process.pid is not None
    command = [sys.executable, "-m", "waltz", "archive", "run", "--follow", "--to", str(tmp_path / "archive")]
    command += ["--interval", "0.2", "--chunk-transactions", "100", "--seal-after", "0"]
    command += ["--zookeeper", cluster.zookeeper_connect_string, "--root", cluster.root]
    env = {**os.environ, **cluster.zookeeper_env()}
    run = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    assert run.stdout is not None
    seen: list[str] = []
    try:
        deadline = time.monotonic() + 120
        for line in run.stdout:
            seen.append(line.rstrip())
            if "partition 1: chunk written 100.." in line or time.monotonic() > deadline:
                break
        assert any("partition 1: chunk written 100.." in line for line in seen), "\n".join(seen)
        time.sleep(0.3)  # into the next round, which reads ZooKeeper
        started = time.monotonic()
        os.kill(zookeeper.process.pid, signal.SIGTERM)
        run.send_signal(signal.SIGTERM)
        try:
            rest, _ = run.communicate(timeout=STOP_BOUND + 20)
        except subprocess.TimeoutExpired:
            pytest.fail(f"waltz archive run --follow still ran {STOP_BOUND + 20:.0f}s after SIGTERM")
        elapsed = time.monotonic() - started
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    output = "\n".join(seen) + rest
    print(f"exited {elapsed:.2f}s after SIGTERM with status {run.returncode}")
    assert elapsed < STOP_BOUND, f"exited {elapsed:.1f}s after SIGTERM (status {run.returncode}):\n{output}"
    # Stopped after its round (0), or the round's ZooKeeper call failed with ZooKeeper going (2).
    assert run.returncode in (0, 2), output
    assert "stopped by a signal" in output or "ZooKeeper" in output, output
