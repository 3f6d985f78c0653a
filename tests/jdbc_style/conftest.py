"""Fixtures of the SQL framework tests: a local Waltz cluster for the session, application databases.

- ``sql_cluster`` (session): 3 storage nodes, 2 servers, 4 partitions, under a cluster root of its
  own on the session's ZooKeeper. Its log is shared by every test of the session, so a test's
  database (fresh, marks at -1) also applies what earlier tests wrote.
- ``sql_cluster_ready``: the same cluster with every process running and every partition
  writable (undoes faults of earlier tests); the servers' logs appear in a failed test's report.
- ``app_db_url``: an application database with the framework's tables at the latest migration,
  parametrized over ``sqlite`` (a file in the test's tmp dir), ``postgresql`` and ``mariadb``
  (fresh databases from ``postgres_url`` / ``mariadb_url``, dropped afterwards).

The modules of this directory define their own ``db_url``, ``engine`` and ``callbacks`` fixtures;
this file does not use those names.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import support

from waltz.jdbc_style import create_framework_engine
from waltz.jdbc_style.migrations_api import upgrade
from waltz.local.cluster import LocalCluster

#: The backends ``app_db_url`` is parametrized over (also its test IDs).
APP_DB_BACKENDS = ("sqlite", "postgresql", "mariadb")


@pytest.fixture(scope="session")
def sql_cluster(tmp_path_factory: pytest.TempPathFactory, zookeeper: object) -> Iterator[LocalCluster]:
    """ZooKeeper (the session's), 3 storage nodes, 2 servers, 4 partitions; root deleted at the end."""
    with support.session_cluster(tmp_path_factory, zookeeper, name="sql", partitions=4) as local:
        yield local


@pytest.fixture
def sql_cluster_ready(request: pytest.FixtureRequest, sql_cluster: LocalCluster) -> LocalCluster:
    """The session's SQL cluster with every process running and every partition writable."""
    return support.healed_cluster(request, sql_cluster)


@pytest.fixture(params=APP_DB_BACKENDS)
def app_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """URL of an empty application database with the framework's tables upgraded.

    ``sqlite``: ``sqlite:///<tmp_path>/app.db``; ``postgresql`` / ``mariadb``: a fresh database
    on the local server (skipped when the server is unreachable, failed under CI).
    """
    backend: str = request.param
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'app.db'}"
    elif backend == "postgresql":
        url = request.getfixturevalue("postgres_url")
    else:
        url = request.getfixturevalue("mariadb_url")
    engine = create_framework_engine(url)
    try:
        upgrade(engine)
    finally:
        engine.dispose()
    return url
