"""The inventory's test fixtures, on the ``waltz.testing`` pytest plugin (docs/local-cluster.md).

- ``inventory_cluster`` (session): a cluster of the inventory's own, 2 partitions. The tests share
  its log, each with SKU IDs of its own; a fresh database applies what earlier tests wrote.
- ``inventory_config``: a client configuration for that cluster.
- ``inventory_db``: the URL of a prepared database, parametrized over ``sqlite`` (a file in the
  test's directory) and ``postgresql`` (``waltz_postgres_database``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from waltz import WaltzClientConfig
from waltz.local.cluster import LocalCluster
from waltz_examples.inventory.service import prepare_database


@pytest.fixture(scope="session")
def inventory_cluster(waltz_cluster_factory: Callable[..., LocalCluster]) -> LocalCluster:
    """A started cluster of 2 partitions whose log only the inventory's tests write."""
    return waltz_cluster_factory(name="inventory", partitions=2)


@pytest.fixture
def inventory_config(inventory_cluster: LocalCluster) -> WaltzClientConfig:
    """The client configuration of ``inventory_cluster`` (its TLS files and ZooKeeper credential)."""
    return WaltzClientConfig(**inventory_cluster.client_settings())


@pytest.fixture(params=["sqlite", "postgresql"])
def inventory_db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """URL of a prepared database: ``sqlite:///<tmp_path>/inventory.db``, or a fresh PostgreSQL one."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'inventory.db'}"
    else:
        url = str(request.getfixturevalue("waltz_postgres_database"))
    prepare_database(url).dispose()
    return url
