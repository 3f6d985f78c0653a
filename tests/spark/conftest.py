"""Fixtures of the Spark tests: one Spark session for the whole test run, one ledger cluster.

- ``spark`` (session): a ``local[2]`` Spark session with the ``waltz`` data source registered
  (skipped when PySpark is not installed, failed under CI).
- ``spark_cluster`` (module): ZooKeeper (the session's), 3 storage nodes, 2 servers, 2 partitions.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import support
import tenacity

from waltz.local.cluster import LocalCluster

#: Launches of the test run's Spark session before its fixture fails.
LAUNCH_ATTEMPTS = 3


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The test run's Spark session (one: a session costs 10 to 25 s to start)."""
    try:
        import pyarrow  # noqa: F401
        import pyspark  # noqa: F401
    except ImportError:
        support.unavailable("pyspark/pyarrow are not installed (pip install -e '.[spark]')")
    from waltz.spark.errors import SparkUnavailableError
    from waltz.spark.session import spark_session

    def launch_failed(state: tenacity.RetryCallState) -> None:
        warnings.warn(
            f"Spark's JVM did not start (attempt {state.attempt_number} of {LAUNCH_ATTEMPTS}): "
            f"{state.outcome.exception() if state.outcome else ''}",
            stacklevel=1,
        )

    # A JVM that exits while it starts is the machine's trouble, not the code's: launched again,
    # a bounded number of times, each failure reported as a warning (the JVM's own output is in
    # the first failing test's captured standard error).
    session = tenacity.Retrying(
        stop=tenacity.stop_after_attempt(LAUNCH_ATTEMPTS),
        wait=tenacity.wait_fixed(5),
        retry=tenacity.retry_if_exception_type(SparkUnavailableError),
        before_sleep=launch_failed,
        reraise=True,
    )(spark_session, "local[2]", app_name="waltz-tests", shuffle_partitions=2)
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
