"""The cluster manager's failures to join the election or to update the assignment: a refused
access names the setting to check, and a failure that lasts is logged once per interval, not at
every retry (docs/design/server.md "Cluster manager")."""

from __future__ import annotations

import logging
import time

import pytest
from kazoo.client import KazooClient
from kazoo.security import make_digest_acl

from waltz.local.processes import wait_until
from waltz.local.zookeeper import LocalZooKeeper
from waltz.metadata.zk import ClusterPaths
from waltz.metadata.zk_session import ZooKeeperAuthError
from waltz.services.server import cluster_manager
from waltz.services.server.cluster_manager import ClusterManager


def test_a_refused_assignment_update_names_the_credential_and_is_logged_once(
    zookeeper: LocalZooKeeper, zk_client: KazooClient, zk_root: str, caplog: pytest.LogCaptureFixture
) -> None:
    paths = ClusterPaths.of(zk_root)
    owner = KazooClient(hosts=zookeeper.connect_string, auth_data=[("digest", "operator:secret")])
    owner.start(timeout=10)
    try:
        # The members' znode is the operators' only; the election's is open, so that the manager
        # without a credential is elected and then refused when it reads the members.
        owner.ensure_path(paths.election)
        owner.create(paths.members, acl=[make_digest_acl("operator", "secret", all=True)], makepath=True)
        manager = ClusterManager(zk_client, paths, 2, "test")
        caplog.set_level(logging.ERROR, logger=cluster_manager.__name__)
        manager.start()
        try:

            def refusals() -> list[logging.LogRecord]:
                return [r for r in caplog.records if "could not update the assignment" in r.getMessage()]

            wait_until(lambda: bool(refusals()), timeout=30, what="the refusal logged")
            time.sleep(2.0)  # four more retries, every half second
            assert manager.leading
        finally:
            assert manager.stop()
        logged = refusals()
        assert len(logged) == 1, [r.getMessage() for r in logged]
        assert logged[0].exc_info is not None
        error = logged[0].exc_info[1]
        assert isinstance(error, ZooKeeperAuthError), error
        assert "zookeeper.auth.digestFile" in str(error), error
        assert "the cluster manager's update of the partition assignment" in str(error), error
    finally:
        owner.delete(paths.members)
        owner.stop()
        owner.close()


def test_a_refused_election_names_the_credential_and_is_logged_once(
    zookeeper: LocalZooKeeper, zk_client: KazooClient, zk_root: str, caplog: pytest.LogCaptureFixture
) -> None:
    paths = ClusterPaths.of(zk_root)
    owner = KazooClient(hosts=zookeeper.connect_string, auth_data=[("digest", "operator:secret")])
    owner.start(timeout=10)
    try:
        # The election's znode is the operators' only: the manager without a credential cannot
        # join, and tries again every second.
        owner.ensure_path(paths.election.rsplit("/", 1)[0])  # open, as the root's cleaner needs
        owner.create(paths.election, acl=[make_digest_acl("operator", "secret", all=True)])
        manager = ClusterManager(zk_client, paths, 2, "test")
        caplog.set_level(logging.ERROR, logger=cluster_manager.__name__)
        manager.start()
        try:

            def refusals() -> list[logging.LogRecord]:
                return [r for r in caplog.records if "election failed" in r.getMessage()]

            wait_until(lambda: bool(refusals()), timeout=30, what="the refusal logged")
            time.sleep(2.5)  # two more tries, every second
            assert not manager.leading
        finally:
            assert manager.stop()
        logged = refusals()
        assert len(logged) == 1, [r.getMessage() for r in logged]
        assert logged[0].exc_info is not None
        error = logged[0].exc_info[1]
        assert isinstance(error, ZooKeeperAuthError), error
        assert "the cluster manager's election" in str(error), error
    finally:
        owner.delete(paths.election)
        owner.stop()
        owner.close()
