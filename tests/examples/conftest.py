"""Fixtures of the example services' tests (``examples/``): one Waltz cluster for the session.

- ``examples_cluster`` (session): ZooKeeper (the session's), 3 storage nodes, 2 servers,
  2 partitions, under a cluster root of its own. Its log is shared by every example test of the
  session (and by every example service: counter, ledger), so a fresh database also applies
  what earlier tests wrote: services under test either ignore transactions that are not theirs
  or use IDs no other test uses.
- ``examples_cluster_ready``: the same cluster with every process running and every partition
  writable (undoes faults of earlier tests); the servers' logs appear in a failed test's report.
- ``example_db_url``: an empty application database, parametrized over ``sqlite`` (a file in
  the test's tmp dir) and ``postgresql`` (a fresh database from ``postgres_url``, dropped
  afterwards). Nothing is created in it: the services create their tables.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import support

from waltz.local.cluster import LocalCluster

#: The backends ``example_db_url`` is parametrized over (also its test IDs).
EXAMPLE_DB_BACKENDS = ("sqlite", "postgresql")


@pytest.fixture(scope="session")
def examples_cluster(tmp_path_factory: pytest.TempPathFactory, zookeeper: object) -> Iterator[LocalCluster]:
    """ZooKeeper (the session's), 3 storage nodes, 2 servers, 2 partitions; root deleted at the end."""
    with support.session_cluster(tmp_path_factory, zookeeper, name="examples", partitions=2) as local:
        yield local


@pytest.fixture
def examples_cluster_ready(request: pytest.FixtureRequest, examples_cluster: LocalCluster) -> LocalCluster:
    """The session's examples cluster with every process running and every partition writable."""
    return support.healed_cluster(request, examples_cluster)


@pytest.fixture(params=EXAMPLE_DB_BACKENDS)
def example_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """URL of an empty application database: ``sqlite:///<tmp_path>/app.db`` or a fresh PostgreSQL one
    (skipped when the server is unreachable, failed under CI)."""
    backend: str = request.param
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'app.db'}"
    url: str = request.getfixturevalue("postgres_url")
    return url
