"""ZooKeeper digest authentication and creator-only ACLs of a cluster's znodes, against a real
ZooKeeper and a real storage node (docs/design/zookeeper.md "Security"; docs/operations.md)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError, NoNodeError
from typer.testing import CliRunner, Result

from waltz.cli.main import app
from waltz.local.nodes import LocalStorageNode
from waltz.local.zookeeper import DockerZooKeeper, LocalZooKeeper
from waltz.metadata.values import PartitionMetadata, ReplicaAssignments
from waltz.metadata.zk import ClusterPaths, ClusterZk
from waltz.metadata.zk_security import ZooKeeperSecurity
from waltz.metadata.zk_session import ZooKeeperAuthError, connect_zookeeper

DIGEST = "waltz-test:s3cret-digest"
WRONG = "waltz-test:not-the-password"


@pytest.fixture
def authed(zookeeper: LocalZooKeeper | DockerZooKeeper, zk_root: str) -> Iterator[KazooClient]:
    """A session holding :data:`DIGEST`; deletes the root at the end (the unauthenticated cleaner of
    ``zk_root`` may not)."""
    client = connect_zookeeper(zookeeper.connect_string, security=ZooKeeperSecurity(DIGEST))
    try:
        yield client
    finally:
        with contextlib.suppress(NoNodeError):  # the test failed before creating it
            client.delete(zk_root, recursive=True)
        client.stop()
        client.close()


def cluster_cli(
    zookeeper: LocalZooKeeper | DockerZooKeeper, root: str, *args: str, digest: str | None, expect: int
) -> Result:
    env = {"WALTZ_ZOOKEEPER_AUTH_DIGEST": digest} if digest is not None else {}
    result = CliRunner().invoke(
        app,
        ["cluster", *args, "--zookeeper", zookeeper.connect_string, "--root", root, "--timeout", "3"],
        env=env,
    )
    assert result.exit_code == expect, f"exit code {result.exit_code}:\n{result.output}"
    return result


def create(
    zookeeper: LocalZooKeeper | DockerZooKeeper, root: str, node: LocalStorageNode, digest: str | None
) -> None:
    storage = f"{node.address}={node.admin_port}"
    args = ("create", "--name", "secured", "--partitions", "2", "--storage", storage)
    open_on_purpose = ("--insecure",) if digest is None else ()
    cluster_cli(zookeeper, root, *args, *open_on_purpose, digest=digest, expect=0)


def walk(zk: KazooClient, root: str) -> list[str]:
    paths, pending = [], [root]
    while pending:
        path = pending.pop()
        paths.append(path)
        pending.extend(f"{path}/{child}" for child in zk.get_children(path))
    return sorted(paths)


def test_an_unauthenticated_session_can_neither_read_the_key_nor_change_the_assignment_nor_bump_a_generation(
    zookeeper: LocalZooKeeper | DockerZooKeeper,
    zk_root: str,
    zk_client: KazooClient,
    authed: KazooClient,
    storage: LocalStorageNode,
) -> None:
    create(zookeeper, zk_root, storage, DIGEST)
    paths = ClusterPaths.of(zk_root)
    # zk_client is a plain kazoo session: no credential.
    with pytest.raises(NoAuthError):
        zk_client.get(paths.cluster)
    with pytest.raises(NoAuthError):
        zk_client.set(paths.assignment, ReplicaAssignments({"evil:1": (0, 1)}).encode())
    with pytest.raises(NoAuthError):
        zk_client.set(paths.partition(0), PartitionMetadata(99, 99, {}).encode())
    with pytest.raises(NoAuthError):
        zk_client.create(f"{paths.store}/intruder", b"")
    with pytest.raises(ZooKeeperAuthError, match="has none"):
        ClusterZk(zk_client, zk_root).begin_store_session(0, 7)

    # The credential can do all of it; every znode of the cluster grants all rights to it alone.
    cluster = ClusterZk(authed, zk_root)
    assert cluster.params().name == "secured"
    cluster.begin_store_session(0, 7)
    assert cluster.partition_metadata(0).value.generation == 7
    acl = ZooKeeperSecurity(DIGEST).acl()
    for path in walk(authed, zk_root):
        assert authed.get_acls(path)[0] == acl, path
    # The parents' ACL: tests/admin/test_zookeeper_roles.py (a parent of its own, which this
    # root's shared /waltz-test is not: another test may have made it first).


def test_a_wrong_or_missing_credential_fails_with_the_setting_to_check(
    zookeeper: LocalZooKeeper | DockerZooKeeper, zk_root: str, authed: KazooClient, storage: LocalStorageNode
) -> None:
    create(zookeeper, zk_root, storage, DIGEST)
    wrong = cluster_cli(zookeeper, zk_root, "list", digest=WRONG, expect=2)
    assert "ZooKeeper refused" in wrong.output
    assert "not one the cluster's znodes were created with" in wrong.output
    assert "WALTZ_ZOOKEEPER_AUTH_DIGEST" in wrong.output
    missing = cluster_cli(zookeeper, zk_root, "list", digest=None, expect=2)
    assert "has none" in missing.output and "zookeeper.auth.digestFile" in missing.output
    listed = cluster_cli(zookeeper, zk_root, "list", "--json", digest=DIGEST, expect=0)
    assert json.loads(listed.stdout)["name"] == "secured"


def test_cluster_secure_protects_a_cluster_created_without_a_credential(
    zookeeper: LocalZooKeeper | DockerZooKeeper,
    zk_root: str,
    zk_client: KazooClient,
    authed: KazooClient,
    storage: LocalStorageNode,
) -> None:
    create(zookeeper, zk_root, storage, None)  # as an older version did: open ACLs
    paths = ClusterPaths.of(zk_root)
    zk_client.get(paths.cluster)  # readable by anyone
    refused = cluster_cli(zookeeper, zk_root, "secure", digest=None, expect=2)
    assert "no digest credential" in refused.output
    done = cluster_cli(zookeeper, zk_root, "secure", digest=DIGEST, expect=0)
    assert f"protected {len(walk(authed, zk_root))} znodes" in done.output
    with pytest.raises(NoAuthError):
        zk_client.get(paths.cluster)
    cluster_cli(zookeeper, zk_root, "list", digest=DIGEST, expect=0)
    again = cluster_cli(zookeeper, zk_root, "secure", digest=WRONG, expect=2)
    assert "ZooKeeper refused" in again.output
