"""A Spark standalone cluster on loopback (``waltz.local.spark.LocalSparkCluster``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support.spark import local_spark_cluster


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_standalone_cluster_registers_two_workers_on_loopback_and_leaves_no_process(
    tmp_path: Path,
) -> None:
    spark_cluster = local_spark_cluster(tmp_path)
    with spark_cluster:
        state = spark_cluster.state()
        assert state["status"] == "ALIVE" and state["aliveworkers"] == 2, state
        assert spark_cluster.master_url.startswith("spark://127.0.0.1:")
        hosts = sorted(w["host"] for w in state["workers"])
        assert hosts == sorted(spark_cluster.worker_hosts) and all(h.startswith("127.") for h in hosts)
        pids = [p.pid for p in spark_cluster.processes()]
        assert len(pids) == 3 and all(pid is not None and _alive(pid) for pid in pids)
    assert not [pid for pid in pids if pid is not None and _alive(pid)], "a Spark daemon outlived close()"
    with pytest.raises(OSError):
        spark_cluster.state()
