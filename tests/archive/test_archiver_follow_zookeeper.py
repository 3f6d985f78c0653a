"""``waltz archive run --follow`` rides out a ZooKeeper that stalls: the round it failed is logged
and the next one goes on (docs/design/archive.md, "The archiver"). A cluster of its own, with a
ZooKeeper of its own, which the test stops (SIGSTOP) for a while."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import support

from tests.archive.archive_helpers import append_bulk
from waltz.archive.archiver import Archiver, ChunkPolicy
from waltz.archive.layout import ArchiveFiles
from waltz.archive.manifests import read_partition_manifest
from waltz.local.cluster import LocalCluster
from waltz.metadata.zk import ClusterZk
from waltz.metadata.zk_session import connect_zookeeper

pytestmark = pytest.mark.timeout(300)


def _archived_through(location: Path) -> int:
    return read_partition_manifest(ArchiveFiles.open(str(location)), 0).archived_through


def _wait_archived(location: Path, through: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while _archived_through(location) < through:
        assert time.monotonic() < deadline, f"not archived through {through} within {timeout}s"
        time.sleep(0.2)


def test_a_following_archiver_goes_on_after_zookeeper_stalls(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    location = tmp_path / "archive"
    with LocalCluster(
        security=support.PLAINTEXT, storages=1, servers=1, partitions=1, work_dir=tmp_path / "cluster"
    ) as cluster:
        cluster.wait_ready(60)
        append_bulk(cluster, 0, 50)
        zk = connect_zookeeper(cluster.zookeeper_connect_string, security=cluster.zookeeper_security)
        stop = threading.Event()
        archiver = Archiver(
            ClusterZk(zk, cluster.root),
            str(location),
            policy=ChunkPolicy(chunk_transactions=100, seal_after=0),
            storage_timeout=2.0,
        )
        caplog.set_level(logging.ERROR, logger="waltz.archive.archiver")
        following = threading.Thread(
            target=archiver.run, kwargs={"follow": True, "stop": stop, "interval": 0.3}
        )
        following.start()
        try:
            _wait_archived(location, 49, 60)
            zookeeper = cluster.pids()["zookeeper"]
            os.kill(zookeeper, signal.SIGSTOP)
            try:
                deadline = time.monotonic() + 60
                while "a round failed on ZooKeeper" not in caplog.text:
                    assert time.monotonic() < deadline, "no round failed while ZooKeeper was stopped"
                    assert following.is_alive(), "the archiver ended while ZooKeeper was stopped"
                    time.sleep(0.2)
            finally:
                os.kill(zookeeper, signal.SIGCONT)
            cluster.wait_ready(60)
            append_bulk(cluster, 0, 50)
            _wait_archived(location, 99, 90)
            assert following.is_alive()
        finally:
            stop.set()
            following.join(60)
            zk.stop()
            zk.close()
    assert not following.is_alive()
