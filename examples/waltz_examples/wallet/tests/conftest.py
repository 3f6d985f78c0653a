"""The wallet's test fixtures, on the ``waltz.testing`` pytest plugin (docs/local-cluster.md).

- ``wallet_cluster`` (session): a cluster of the wallet's own, 2 partitions. The tests share its
  log, each with wallet IDs of its own; a fresh database applies what earlier tests wrote.
- ``wallet_config``: a client configuration for that cluster.
- ``wallet_db``: the URL of an empty database, parametrized over ``sqlite`` (a file in the test's
  directory) and ``postgresql`` (``waltz_postgres_database``); the app prepares it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from waltz import WaltzClientConfig
from waltz.local.cluster import LocalCluster


@pytest.fixture(scope="session")
def wallet_cluster(waltz_cluster_factory: Callable[..., LocalCluster]) -> LocalCluster:
    """A started cluster of 2 partitions whose log only the wallet's tests write."""
    return waltz_cluster_factory(name="wallet", partitions=2)


@pytest.fixture
def wallet_config(wallet_cluster: LocalCluster) -> WaltzClientConfig:
    """The client configuration of ``wallet_cluster`` (its TLS files and ZooKeeper credential)."""
    return WaltzClientConfig(**wallet_cluster.client_settings())


@pytest.fixture(params=["sqlite", "postgresql"])
def wallet_db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """URL of an empty database: ``sqlite:///<tmp_path>/wallet.db``, or a fresh PostgreSQL one."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'wallet.db'}"
    return str(request.getfixturevalue("waltz_postgres_database"))
