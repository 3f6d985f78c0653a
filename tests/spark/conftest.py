"""Fixtures of the Spark tests: one Spark session for the whole test run, one ledger cluster.

- ``spark`` (session): a ``local[2]`` Spark session with the ``waltz`` data source registered
  (skipped when PySpark is not installed, failed under CI).
- ``spark_cluster`` (module): ZooKeeper (the session's), 3 storage nodes, 2 servers, 2 partitions.
"""

from __future__ import annotations

import os
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
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The test run's Spark session (one: a session costs 10 to 25 s to start)."""
    try:
        import pyarrow  # noqa: F401
        import pyspark  # noqa: F401
    except ImportError:
        support.unavailable("pyspark/pyarrow are not installed (pip install -e '.[spark]')")
    from waltz.spark.errors import SparkUnavailableError
    from waltz.spark.session import spark_session

    jvm_output = tmp_path_factory.mktemp("spark") / "jvm-stderr.log"

    def launch() -> Any:
        """One launch, the JVM's standard error (inherited from this process's) going to a file
        of the run's: a failure's warning quotes its end."""
        with jvm_output.open("ab") as output:
            saved = os.dup(2)
            os.dup2(output.fileno(), 2)
            try:
                return spark_session("local[2]", app_name="waltz-tests", shuffle_partitions=2)
            finally:
                os.dup2(saved, 2)
                os.close(saved)

    def launch_failed(state: tenacity.RetryCallState) -> None:
        said = jvm_output.read_bytes()[-1500:].decode(errors="replace")
        warnings.warn(
            f"Spark's JVM did not start (attempt {state.attempt_number} of {LAUNCH_ATTEMPTS}): "
            f"{state.outcome.exception() if state.outcome else ''}; its output ends: {said!r}",
            stacklevel=1,
        )

    # A JVM that exits while it starts is the machine's trouble, not the code's: launched again,
    # a bounded number of times, each failure reported as a warning with the JVM's own words.
    session = tenacity.Retrying(
        stop=tenacity.stop_after_attempt(LAUNCH_ATTEMPTS),
        wait=tenacity.wait_fixed(5),
        retry=tenacity.retry_if_exception_type(SparkUnavailableError),
        before_sleep=launch_failed,
        reraise=True,
    )(launch)
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
