"""Fixtures of the documentation's code examples (``test_doc_examples.py``).

- ``waltz_cluster``: a fresh :class:`~waltz.local.cluster.LocalCluster` for one example (3 storage
  nodes, 2 servers, 2 partitions, on the session ZooKeeper of ``tests/conftest.py``, secure as
  every local cluster is by default), named by ``WALTZ_ZOOKEEPER_CONNECT_STRING``,
  ``WALTZ_CLUSTER_ROOT`` and the client's credential and certificate variables while the example
  runs, as a reader's shell has them after ``waltz up``. Each example is an application of its own whose
  database applies the log from its start, so each gets a log of its own (about 1.5 s to start).
- ``waltz_log_start``: the pytest plugin's own fixture (:mod:`waltz.testing`), here over that
  cluster, for the ``test_*`` functions an example of the plugin defines.
- ``waltz_client_config``, ``waltz_client_env``: the plugin's, of that cluster (here per example,
  as the cluster is).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import support

from waltz.client.config import WaltzClientConfig
from waltz.local.cluster import LocalCluster
from waltz.testing import waltz_log_start

__all__ = ["waltz_client_config", "waltz_client_env", "waltz_cluster", "waltz_log_start"]


@pytest.fixture
def waltz_cluster(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    zookeeper: object,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[LocalCluster]:
    """A started local cluster for one example, exported as ``waltz up`` prints it."""
    with support.session_cluster(tmp_path_factory, zookeeper, name="docs", partitions=2) as cluster:
        support.healed_cluster(request, cluster)  # a failed example's report shows the server logs
        # What `waltz up` tells a shell to export: the client certificate for applications, the
        # operator's ZooKeeper credential and certificate for the tools (and a Spark job).
        for name, value in {**cluster.client_env(), **cluster.admin_env()}.items():
            monkeypatch.setenv(name, value)
        yield cluster


@pytest.fixture
def waltz_client_config(waltz_cluster: LocalCluster) -> WaltzClientConfig:
    """The plugin's ``waltz_client_config``, of this example's cluster."""
    return WaltzClientConfig(**waltz_cluster.client_settings())


@pytest.fixture
def waltz_client_env(waltz_cluster: LocalCluster) -> dict[str, str]:
    """The plugin's ``waltz_client_env``, of this example's cluster."""
    return waltz_cluster.client_env()
