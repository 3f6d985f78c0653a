"""Fixtures of the Spark tests: one Spark session for the whole test run, one ledger cluster.

- ``spark`` (session): a ``local[2]`` Spark session with the ``waltz`` data source registered
  (skipped when PySpark is not installed, failed under CI).
- ``spark_cluster`` (module): ZooKeeper (the session's), 3 storage nodes, 2 servers, 2 partitions.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import support

from waltz.local.cluster import LocalCluster


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The test run's Spark session (one: a session costs 10 to 25 s to start)."""
    try:
        import pyarrow  # noqa: F401
        import pyspark  # noqa: F401
    except ImportError:
        support.unavailable("pyspark/pyarrow are not installed (pip install -e '.[spark]')")
    from waltz.spark.session import spark_session

    session = spark_session("local[2]", app_name="waltz-tests", shuffle_partitions=2)
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory, zookeeper: object) -> Iterator[LocalCluster]:
    """A cluster of the module's own: 3 storage nodes, 2 servers, 2 partitions."""
    with support.session_cluster(tmp_path_factory, zookeeper, name="spark", partitions=2) as cluster:
        cluster.wait_ready(60)
        yield cluster
