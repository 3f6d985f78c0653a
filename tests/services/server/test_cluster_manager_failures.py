"""The cluster manager's failures to join the election or to update the assignment: a refused
access names the setting to check, and a failure that lasts is logged once per interval, not at
every retry (docs/design/server.md "Cluster manager")."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient
from kazoo.security import make_digest_acl

from waltz.local.processes import wait_until
from waltz.local.zookeeper import LocalZooKeeper
from waltz.metadata.zk import ClusterPaths
from waltz.metadata.zk_session import ZooKeeperAuthError
from waltz.services.server import cluster_manager
from waltz.services.server.cluster_manager import ClusterManager

#: The operators' credential, the only one the protected znode lets in.
_ACL = [make_digest_acl("operator", "secret", all=True)]


@pytest.fixture
def owner(zookeeper: LocalZooKeeper) -> Iterator[KazooClient]:
    """A session holding the operators' credential, which creates the protected znode."""
    client = KazooClient(hosts=zookeeper.connect_string, auth_data=[("digest", "operator:secret")])
    client.start(timeout=10)
    try:
        yield client
    finally:
        client.stop()
        client.close()


def _logged_once(
    manager: ClusterManager, caplog: pytest.LogCaptureFixture, message: str, retries_for: float
) -> ZooKeeperAuthError:
    """Run ``manager`` until it logs ``message`` and ``retries_for`` seconds longer; the failure
    it logged, which must be the only one."""
    caplog.set_level(logging.ERROR, logger=cluster_manager.__name__)

    def refusals() -> list[logging.LogRecord]:
        return [r for r in caplog.records if message in r.getMessage()]

    manager.start()
    try:
        wait_until(lambda: bool(refusals()), timeout=30, what="the refusal logged")
        time.sleep(retries_for)
    finally:
        assert manager.stop()
    logged = refusals()
    assert len(logged) == 1, [r.getMessage() for r in logged]
    assert logged[0].exc_info is not None
    error = logged[0].exc_info[1]
    assert isinstance(error, ZooKeeperAuthError), error
    assert "zookeeper.auth.digestFile" in str(error), error
    return error


def test_a_refused_assignment_update_names_the_credential_and_is_logged_once(
    owner: KazooClient, zk_client: KazooClient, zk_root: str, caplog: pytest.LogCaptureFixture
) -> None:
    paths = ClusterPaths.of(zk_root)
    # The members' znode is the operators' only; the election's is open, so that the manager
    # without a credential is elected and then refused when it reads the members.
    owner.ensure_path(paths.election)
    owner.create(paths.members, acl=_ACL, makepath=True)
    try:
        manager = ClusterManager(zk_client, paths, 2, "test")
        # Four more retries, every half second, after the first.
        error = _logged_once(manager, caplog, "could not update the assignment", 2.0)
        assert "the cluster manager's update of the partition assignment" in str(error), error
    finally:
        owner.delete(paths.members)


def test_a_refused_election_names_the_credential_and_is_logged_once(
    owner: KazooClient, zk_client: KazooClient, zk_root: str, caplog: pytest.LogCaptureFixture
) -> None:
    paths = ClusterPaths.of(zk_root)
    # The election's znode is the operators' only: the manager without a credential cannot join,
    # and tries again every second. Its parent stays open, as the root's cleaner needs.
    owner.ensure_path(paths.election.rsplit("/", 1)[0])
    owner.create(paths.election, acl=_ACL)
    try:
        manager = ClusterManager(zk_client, paths, 2, "test")
        error = _logged_once(manager, caplog, "election failed", 2.5)  # two more tries
        assert not manager.leading
        assert "the cluster manager's election" in str(error), error
    finally:
        owner.delete(paths.election)
