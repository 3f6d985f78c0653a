"""The ledger's test fixtures, on the ``waltz.testing`` pytest plugin (docs/local-cluster.md).

The plugin is enabled for this repository's tests in ``pyproject.toml`` (``-p waltz.testing``); a
team's own suite enables it with ``pytest_plugins = ["waltz.testing"]`` in its root conftest.py.

- ``ledger_cluster`` (session): a cluster of the ledger's own, 4 partitions, from
  ``waltz_cluster_factory``: the checks read the whole log, which must hold ledger transactions
  only. The tests share it, each under a cluster name (mark rows) of its own, with customer IDs no
  other test uses; a fresh database applies everything earlier tests wrote.
- ``ledger_config``: a client configuration for that cluster; its credential in the environment.
- ``ledger_db``: a database holding the framework's and the ledger's tables, parametrized over
  ``sqlite`` (a file in the test's directory) and ``postgresql`` (``waltz_postgres_database``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from waltz import WaltzClientConfig
from waltz.local.cluster import LocalCluster
from waltz_examples.ledger.service import prepare_database


@pytest.fixture(scope="session")
def ledger_cluster(waltz_cluster_factory: Callable[..., LocalCluster]) -> LocalCluster:
    """A started cluster of 4 partitions whose log only the ledger's tests write."""
    return waltz_cluster_factory(name="ledger", partitions=4)


@pytest.fixture
def ledger_config(ledger_cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch) -> WaltzClientConfig:
    """The client configuration of ``ledger_cluster``.

    What reaches the cluster as an application (the client role's ZooKeeper credential and
    certificate) is also in the ``WALTZ_*`` variables for the test, as a deployed instance reads
    it: every client the test starts (its services, the log reader of the checks, a child
    process) finds it there.
    """
    for name, value in ledger_cluster.client_env().items():
        monkeypatch.setenv(name, value)
    return WaltzClientConfig(**ledger_cluster.client_settings())


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """URL of a migrated database: ``sqlite:///<tmp_path>/ledger.db``, or a fresh PostgreSQL one."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'ledger.db'}"
    else:
        url = str(request.getfixturevalue("waltz_postgres_database"))
    prepare_database(url).dispose()
    return url
