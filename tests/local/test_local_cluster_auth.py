"""A local cluster whose znodes are protected by ZooKeeper digest credentials per role, and one that
speaks TLS to ZooKeeper: servers, tools and a client still work end to end, and the client's
credential reads only what discovery needs (docs/design/zookeeper.md "Security", "Roles")."""

from __future__ import annotations

import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.security import ACL
from support.tls import make_certificates

from tests.client.client_helpers import Append, MemoryStore
from waltz import WaltzClient, WaltzClientConfig
from waltz.local.certificates import make_cluster_certificates
from waltz.local.cluster import LocalCluster
from waltz.local.nodes import LocalServer
from waltz.local.options import SecurityOptions
from waltz.local.processes import ServiceStartError
from waltz.local.zookeeper import LocalZooKeeper
from waltz.metadata.zk import ClusterPaths, ClusterZk
from waltz.metadata.zk_roles import Role
from waltz.metadata.zk_security import ZooKeeperSecurity
from waltz.metadata.zk_session import ZooKeeperAuthError, ZooKeeperUnavailableError, connect_zookeeper


def walk(zk: KazooClient, root: str) -> list[str]:
    paths, pending = [], [root]
    while pending:
        path = pending.pop()
        paths.append(path)
        pending.extend(f"{path}/{child}" for child in zk.get_children(path))
    return sorted(paths)


def acl_set(acls: list[ACL]) -> set[tuple[int, str, str]]:
    """The entries, digest identities by user: ZooKeeper shows them as ``user:x``."""
    return {(a.perms, a.id.scheme, a.id.id.partition(":")[0]) for a in acls}


def append_and_apply(cluster: LocalCluster, data: bytes, role: Role = Role.OPERATOR) -> None:
    store = MemoryStore({0: -1})
    with WaltzClient(store, WaltzClientConfig(**cluster.zookeeper_settings(role))) as client:  # type: ignore[arg-type]
        transaction_id = client.submit(Append(0, data)).result(60).transaction_id
        assert transaction_id is not None
        assert client.wait_applied(0, transaction_id, 30)
    assert [a.data for a in store.applied[0]][-1] == data


def cluster_with_roles(tmp_path: Path, zookeeper: LocalZooKeeper) -> LocalCluster:
    """One storage node, one server and one partition, with ZooKeeper credentials per role."""
    return LocalCluster(
        storages=1,
        servers=1,
        partitions=1,
        zookeeper=zookeeper.connect_string,
        work_dir=tmp_path / "cluster",
        delete_root=True,
        # ZooKeeper's roles alone: the nodes' TLS is another matter (tests/services/test_roles.py)
        security=SecurityOptions(secure=False, zookeeper_auth=True),
    )


def test_a_local_cluster_with_zookeeper_auth_serves_a_client_and_gives_every_znode_its_roles_acl(
    tmp_path: Path, zookeeper: LocalZooKeeper
) -> None:
    with cluster_with_roles(tmp_path, zookeeper) as cluster:
        append_and_apply(cluster, b"authenticated", Role.CLIENT)
        credentials = cluster.zookeeper_role_credentials
        assert credentials is not None
        for role in Role:
            settings = cluster.zookeeper_settings(role)
            digest_file = settings["zookeeper_auth_digest_file"]
            assert isinstance(digest_file, Path) and stat.S_IMODE(digest_file.stat().st_mode) == 0o600
            assert ZooKeeperSecurity.read_digest_file(digest_file) == credentials.digest(role)
        assert "WALTZ_ZOOKEEPER_AUTH_DIGEST_FILE" in cluster.describe()
        security = cluster.zookeeper_security
        zk = connect_zookeeper(zookeeper.connect_string, security=security)
        roles = ClusterZk(zk, cluster.root).access.roles()
        assert roles == credentials.identities()
        try:
            paths = walk(zk, cluster.root)
            # servers' members and election, the assignment and the client ID counter included
            assert {"/server/members", "/server/election", "/server/assignment", "/client/id"} <= {
                p.removeprefix(cluster.root) for p in paths
            }
            for path in paths:
                expected = roles.acl_for(path.removeprefix(cluster.root).lstrip("/"))
                assert acl_set(zk.get_acls(path)[0]) == acl_set(expected), path
        finally:
            zk.stop()
            zk.close()
        anonymous = WaltzClientConfig(
            zookeeper_connect_string=zookeeper.connect_string, cluster_root=cluster.root
        )
        with pytest.raises(ZooKeeperAuthError, match="has none"):
            WaltzClient(MemoryStore({0: -1}), anonymous)
        intruder = LocalServer(
            zookeeper.connect_string,
            cluster.root,
            name="wrong-credential",
            log_path=tmp_path / "wrong-credential.log",
            env={"WALTZ_ZOOKEEPER_AUTH_DIGEST": "waltz:not-the-password"},
            insecure=True,
        )
        try:
            with pytest.raises(ServiceStartError, match=r"ZooKeeper refused reading .*not one the cluster"):
                intruder.start()
        finally:
            intruder.close()


@pytest.mark.security
def test_the_client_credential_reads_what_discovery_needs_and_not_the_cluster_key(
    tmp_path: Path, zookeeper: LocalZooKeeper
) -> None:
    with cluster_with_roles(tmp_path, zookeeper) as cluster:
        append_and_apply(cluster, b"found through discovery", Role.CLIENT)  # a real client, a real server
        # A role by its name, as the docs give it, is the same role; an unknown name is refused.
        assert cluster.zookeeper_settings("client") == cluster.zookeeper_settings(Role.CLIENT)
        assert cluster.zookeeper_env("client") == cluster.zookeeper_env(Role.CLIENT)
        assert cluster.zookeeper_env("client") != cluster.zookeeper_env("operator")
        with pytest.raises(ValueError, match="no ZooKeeper role 'admin': the roles are 'server'"):
            cluster.zookeeper_settings("admin")
        # check-connectivity with the client's credential cannot list the storage nodes: it says
        # they were not checked, rather than OK.
        from typer.testing import CliRunner

        from waltz.cli.main import app

        checked = CliRunner().invoke(
            app, ["client", "check-connectivity"], env={**cluster.client_env(), "COLUMNS": "300"}
        )
        assert checked.exit_code == 0, checked.output
        assert "SKIPPED storage" in checked.output and "waltz cluster verify checks them" in checked.output
        assert "OK      storage" not in checked.output
        credentials = cluster.zookeeper_role_credentials
        assert credentials is not None
        paths = ClusterPaths.of(cluster.root)
        sessions = {
            role: connect_zookeeper(
                zookeeper.connect_string, security=ZooKeeperSecurity(credentials.digest(role))
            )
            for role in Role
        }
        anonymous = connect_zookeeper(zookeeper.connect_string)
        emptied = b'{"format_version": 1, "replicas": {}}'
        try:
            client, server, operator = sessions[Role.CLIENT], sessions[Role.SERVER], sessions[Role.OPERATOR]
            with pytest.raises(NoAuthError):
                client.get(paths.cluster)  # the cluster key
            with pytest.raises(ZooKeeperAuthError, match="ZooKeeper refused reading"):
                ClusterZk(client, cluster.root).params()
            with pytest.raises(NoAuthError):
                client.set(paths.assignment, emptied)
            with pytest.raises(NoAuthError):
                client.set(paths.partition(0), b"{}")
            with pytest.raises(NoAuthError):
                server.set(paths.assignment, emptied)  # servers read the replica assignments only
            # A tool given the server's credential is told it holds another role's credential.
            from waltz.admin.storage_admin import StorageNodeAdmin, _Write

            current = ClusterZk(server, cluster.root).assignments()
            refused = r"ZooKeeper refused writing under .* another role's"
            with pytest.raises(ZooKeeperAuthError, match=refused):
                StorageNodeAdmin(ClusterZk(server, cluster.root))._commit(
                    [_Write(paths.assignment, emptied, current.version)]
                )
            with pytest.raises(NoAuthError):
                anonymous.delete(paths.cluster)  # the root is not open: nobody replaces the key
            assert ClusterZk(client, cluster.root).discovery().num_partitions == 1
            assert (
                ClusterZk(server, cluster.root).params().cluster_key
                == ClusterZk(operator, cluster.root).params().cluster_key
            )
            assert ClusterZk(operator, cluster.root).assignments().value.replicas  # untouched
        finally:
            for session in (*sessions.values(), anonymous):
                session.stop()
                session.close()


@pytest.fixture
def tls_zookeeper(tmp_path: Path) -> Iterator[tuple[LocalZooKeeper, dict[str, Path]]]:
    files = make_certificates(tmp_path)
    key_store = tmp_path / "zookeeper-keystore.pem"
    key_store.write_bytes(files["server-key"].read_bytes() + files["server"].read_bytes())
    with LocalZooKeeper(
        data_dir=tmp_path / "zookeeper",
        tick_time_ms=500,
        tls_key_store=key_store,
        tls_trust_store=files["ca"],
    ) as server:
        yield server, files


def test_servers_tools_and_a_client_reach_zookeeper_over_tls(
    tmp_path: Path, tls_zookeeper: tuple[LocalZooKeeper, dict[str, Path]]
) -> None:
    server, files = tls_zookeeper
    security = ZooKeeperSecurity(ca_file=files["ca"], cert_file=files["client"], key_file=files["client-key"])
    with pytest.raises(ZooKeeperUnavailableError, match=r"zookeeper\.ssl"):
        connect_zookeeper(
            server.secure_connect_string,
            connect_timeout=2,
            security=ZooKeeperSecurity(ca_file=files["ca"]),  # no client certificate: refused
        )
    with LocalCluster(
        storages=1,
        servers=1,
        partitions=1,
        zookeeper=server.secure_connect_string,
        work_dir=tmp_path / "cluster",
        delete_root=True,
        security=SecurityOptions(secure=False, zookeeper_auth=True, zookeeper_security=security),
    ) as cluster:
        assert cluster.zookeeper_env()["WALTZ_ZOOKEEPER_SSL_CA_FILE"] == str(files["ca"])
        append_and_apply(cluster, b"over ZooKeeper TLS")


def test_a_local_cluster_gives_its_servers_its_own_zookeeper_security_not_the_callers(
    tmp_path: Path, zookeeper: LocalZooKeeper, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another cluster's ``WALTZ_ZOOKEEPER_AUTH_*``/``SSL_*`` exports in the caller's shell do not
    reach the servers of a cluster that decides them itself (docs/local-cluster.md): here one
    without a credential nor TLS to ZooKeeper, whose servers would otherwise speak TLS to its plain
    port with a credential it never made."""
    other = make_cluster_certificates(tmp_path / "other-tls")
    monkeypatch.setenv("WALTZ_ZOOKEEPER_AUTH_DIGEST", "other:not-this-clusters")
    monkeypatch.setenv("WALTZ_ZOOKEEPER_SSL_CA_FILE", str(other.ca_file))
    monkeypatch.setenv("WALTZ_ZOOKEEPER_SSL_CERT_FILE", str(other.cert_file("node")))
    monkeypatch.setenv("WALTZ_ZOOKEEPER_SSL_KEY_FILE", str(other.key_file("node")))
    with LocalCluster(
        storages=1,
        servers=1,
        partitions=1,
        zookeeper=zookeeper.connect_string,
        work_dir=tmp_path / "cluster",
        delete_root=True,
        security=SecurityOptions.plaintext(),
    ) as cluster:
        owners = cluster.wait_ready(60)
        assert set(owners) == {0}
