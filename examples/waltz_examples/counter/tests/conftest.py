"""The counter's test fixtures, on the ``waltz.testing`` pytest plugin (docs/local-cluster.md).

The plugin is enabled for this repository's tests in ``pyproject.toml`` (``-p waltz.testing``); a
team's own suite enables it with ``pytest_plugins = ["waltz.testing"]`` in its root conftest.py.

- ``counter_cluster``: the plugin's session cluster (``waltz_cluster``), healed of what earlier
  tests did to it (``waltz_log_start``). Its log is shared with other tests of the session: the
  services pass over transactions that are not theirs, and use counter IDs no other test uses.
- ``counter_db_url``: an empty database, parametrized over ``sqlite`` (a file in the test's
  directory) and ``postgresql`` (``waltz_postgres_database``, dropped afterwards). The services
  create their tables.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from waltz.local.cluster import LocalCluster


@pytest.fixture
def counter_cluster(waltz_cluster: LocalCluster, waltz_log_start: dict[int, int]) -> LocalCluster:
    """The session's cluster with every process running and every partition writable."""
    return waltz_cluster


@pytest.fixture(params=["sqlite", "postgresql"])
def counter_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """URL of an empty database: ``sqlite:///<tmp_path>/counter.db``, or a fresh PostgreSQL one."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'counter.db'}"
    url: str = request.getfixturevalue("waltz_postgres_database")
    return url
