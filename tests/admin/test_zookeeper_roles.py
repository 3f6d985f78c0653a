"""ZooKeeper credentials per role and the check of the cluster's root, against a real ZooKeeper, a
real storage node and a real server (docs/design/zookeeper.md, "Roles", "Checking the root";
docs/deploy.md, "ZooKeeper credentials")."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import support
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError, NoNodeError
from kazoo.security import Permissions, make_acl, make_digest_acl
from typer.testing import CliRunner, Result

from tests.client.client_helpers import Append, MemoryStore
from waltz import WaltzClient, WaltzClientConfig
from waltz.admin.verify import CheckStatus
from waltz.admin.verify_acls import acl_checks
from waltz.cli.main import app
from waltz.client.discovery import ServerDiscovery
from waltz.local.nodes import LocalServer, LocalStorageNode
from waltz.local.processes import ServiceStartError
from waltz.local.zookeeper import DockerZooKeeper, LocalZooKeeper
from waltz.metadata.values import ClusterParams, ConnectionMetadata, GroupDescriptor, ReplicaAssignments
from waltz.metadata.zk import ClusterPaths, ClusterZk
from waltz.metadata.zk_roles import ROLE_DIGEST_FILES, Role, RoleCredentials
from waltz.metadata.zk_security import ZooKeeperSecurity
from waltz.metadata.zk_session import connect_zookeeper

pytestmark = pytest.mark.security

DIGEST = "waltz-test:s3cret-digest"


@pytest.fixture
def digests(zookeeper: LocalZooKeeper | DockerZooKeeper, zk_root: str, tmp_path: Path) -> Iterator[Path]:
    """The directory of the role credentials; the root is deleted at the end with every credential
    the test used (the unauthenticated cleaner of ``zk_root`` may not)."""
    directory = tmp_path / "digests"
    yield directory
    auth = [("digest", DIGEST)]
    if directory.exists():
        auth += [("digest", RoleCredentials.load_or_generate(directory).operator)]
    cleaner = KazooClient(hosts=zookeeper.connect_string, auth_data=auth)
    cleaner.start(timeout=10)
    try:
        with contextlib.suppress(NoNodeError):
            cleaner.delete(zk_root, recursive=True)
    finally:
        cleaner.stop()
        cleaner.close()


Zk = LocalZooKeeper | DockerZooKeeper


def cluster_cli(zookeeper: Zk, root: str, *args: str, env: dict[str, str], expect: int | None) -> Result:
    where = ["--zookeeper", zookeeper.connect_string, "--root", root, "--timeout", "5"]
    result = CliRunner().invoke(app, ["cluster", *args, *where], env=env)
    if expect is not None:
        assert result.exit_code == expect, f"exit code {result.exit_code}:\n{result.output}"
    return result


def start_server(
    request: pytest.FixtureRequest, zookeeper: Zk, root: str, log: Path, env: dict[str, str]
) -> LocalServer:
    """A server (not started yet) with ``env``, its log shown when the test fails."""
    server = LocalServer(
        zookeeper.connect_string,
        root,
        name=log.stem,
        log_path=log,
        env=env,
        session_timeout=4.0,
        insecure=True,
    )
    support.add_failure_logs(request.node, f"{log.stem} log", server.process.log_tail)
    return server


def append(zookeeper: Zk, root: str, data: bytes, **credential: object) -> None:
    """Append through a real client holding ``credential`` (a ``zookeeper_auth_*`` setting)."""
    where = {"zookeeper_connect_string": zookeeper.connect_string, "cluster_root": root}
    config = WaltzClientConfig(**where, **credential)  # type: ignore[arg-type]
    store = MemoryStore({0: -1})
    with WaltzClient(store, config) as client:
        transaction_id = client.submit(Append(0, data)).result(60).transaction_id
        assert transaction_id is not None
        assert client.wait_applied(0, transaction_id, 30)
    assert [a.data for a in store.applied[0]][-1] == data


def acl_check(verified: Result) -> dict[str, str]:
    """The root-and-children ACL check of ``waltz cluster verify --json``."""
    checks = json.loads(verified.stdout)["checks"]
    return next(c for c in checks if c["name"] == "zookeeper: root and children ACLs")  # type: ignore[no-any-return]


def test_a_squatted_root_is_refused_by_create_and_by_a_server_and_failed_by_verify(
    request: pytest.FixtureRequest,
    zookeeper: LocalZooKeeper | DockerZooKeeper,
    zk_root: str,
    digests: Path,
    storage: LocalStorageNode,
    tmp_path: Path,
) -> None:
    squatter = connect_zookeeper(zookeeper.connect_string)  # no credential: world:anyone ACLs
    try:
        squatter.create(zk_root, b"", makepath=True)  # before the operator's create
        ClusterZk(squatter, zk_root).create(
            ClusterParams("squatted", 1, uuid.uuid4()),  # the squatter's key and partition count
            ReplicaAssignments({storage.address: (0,)}),
            GroupDescriptor({storage.address: 0}),
            ConnectionMetadata({storage.address: storage.admin_port}),
        )
        squatter.create(f"{zk_root}/planted", b"")  # a znode no cluster makes
    finally:
        squatter.stop()
        squatter.close()
    spec = f"{storage.address}={storage.admin_port}"
    create = ("create", "--name", "real", "--partitions", "1", "--storage", spec)
    refused = cluster_cli(zookeeper, zk_root, *create, "--digest-dir", str(digests), env={}, expect=2)
    assert f"refusing creating the cluster under {zk_root}" in refused.output
    assert f"{zk_root}/cluster: open to anyone: world:anyone:cdrwa" in refused.output
    assert "delete the root" in refused.output
    one = {"WALTZ_ZOOKEEPER_AUTH_DIGEST": DIGEST}
    one_credential = cluster_cli(zookeeper, zk_root, *create, env=one, expect=2)
    assert f"refusing using the cluster under {zk_root}" in one_credential.output

    server_file = {"WALTZ_ZOOKEEPER_AUTH_DIGEST_FILE": str(digests / ROLE_DIGEST_FILES[Role.SERVER])}
    server = start_server(request, zookeeper, zk_root, tmp_path / "server-0.log", server_file)
    try:
        with pytest.raises(ServiceStartError, match=rf"refusing using the cluster under {zk_root}"):
            server.start()
    finally:
        server.close()

    operator_file = {"WALTZ_ZOOKEEPER_AUTH_DIGEST_FILE": str(digests / ROLE_DIGEST_FILES[Role.OPERATOR])}
    verified = cluster_cli(zookeeper, zk_root, "verify", "--json", env=operator_file, expect=None)
    assert verified.exit_code == 1, verified.output
    check = acl_check(verified)
    assert check["status"] == "FAILED"
    assert f"{zk_root}/cluster open to anyone: world:anyone" in check["detail"]
    checks = json.loads(verified.stdout)["checks"]
    children = next(c for c in checks if c["name"] == "zookeeper: root children")
    assert children["status"] == "WARNING" and "planted" in children["detail"]


def test_a_cluster_made_with_one_credential_still_starts_then_moves_to_role_credentials(
    request: pytest.FixtureRequest,
    zookeeper: LocalZooKeeper | DockerZooKeeper,
    zk_root: str,
    digests: Path,
    storage: LocalStorageNode,
    tmp_path: Path,
) -> None:
    spec = f"{storage.address}={storage.admin_port}"
    one = {"WALTZ_ZOOKEEPER_AUTH_DIGEST": DIGEST}
    create = ("create", "--name", "older", "--partitions", "1", "--storage", spec)
    cluster_cli(zookeeper, zk_root, *create, env=one, expect=0)
    paths = ClusterPaths.of(zk_root)
    authed = connect_zookeeper(zookeeper.connect_string, security=ZooKeeperSecurity(DIGEST))
    try:
        authed.delete(paths.discovery)  # the previous version's layout: no discovery, no roles
        assert authed.exists(paths.roles) is None
    finally:
        authed.stop()
        authed.close()
    older = start_server(request, zookeeper, zk_root, tmp_path / "server-older.log", one)
    try:
        older.start()
        append(zookeeper, zk_root, b"one credential", zookeeper_auth_digest=DIGEST)
    finally:
        older.close()

    moved = cluster_cli(zookeeper, zk_root, "secure", "--digest-dir", str(digests), env=one, expect=0)
    assert f"with the role credentials of {digests}" in moved.output
    credentials = RoleCredentials.load_or_generate(digests)
    files = {role: digests / name for role, name in ROLE_DIGEST_FILES.items()}
    server = start_server(
        request,
        zookeeper,
        zk_root,
        tmp_path / "server-roles.log",
        {"WALTZ_ZOOKEEPER_AUTH_DIGEST_FILE": str(files[Role.SERVER])},
    )
    client = connect_zookeeper(zookeeper.connect_string, security=ZooKeeperSecurity(credentials.client))
    try:
        server.start()
        append(zookeeper, zk_root, b"role credentials", zookeeper_auth_digest_file=files[Role.CLIENT])
        with pytest.raises(NoAuthError):
            client.get(paths.cluster)
        with pytest.raises(NoAuthError):
            client.set(paths.assignment, b'{"format_version": 1, "replicas": {}}')
        assert ClusterZk(client, zk_root).discovery().name == "older"
        # The counter handed out 1 before the move; clients now take IDs after it under
        # client/ids, and can no longer set the counter back.
        assert client.get(paths.client_ids)[0] == b"1"
        with ServerDiscovery(
            zookeeper.connect_string, zk_root, security=ZooKeeperSecurity(credentials.client)
        ) as discovery:
            taken = [discovery.next_client_id() for _ in range(3)]
        assert len(set(taken)) == 3 and min(taken) > 1, taken
        with pytest.raises(NoAuthError):
            client.set(paths.client_id, b"0")
    finally:
        client.stop()
        client.close()
        server.close()
    verified = cluster_cli(
        zookeeper,
        zk_root,
        "verify",
        "--json",
        env={"WALTZ_ZOOKEEPER_AUTH_DIGEST_FILE": str(files[Role.OPERATOR])},
        expect=None,
    )
    assert acl_check(verified)["status"] == "PASSED", verified.output
    # `create` again by mistake, with the operator's credential: the cluster is there, and its own
    # roles' znodes are not taken for a squatter's.
    again = cluster_cli(
        zookeeper,
        zk_root,
        *create,
        env={"WALTZ_ZOOKEEPER_AUTH_DIGEST_FILE": str(files[Role.OPERATOR])},
        expect=2,
    )
    assert f"a cluster already exists under {zk_root}" in again.output, again.output
    assert "tampered" not in again.output


@pytest.mark.security
def test_verify_warns_of_a_parent_of_the_root_anyone_may_take_over(
    zookeeper: LocalZooKeeper | DockerZooKeeper,
) -> None:
    """Parents that ``create`` makes may be listed, created in and deleted from by anyone, never
    changed; an open parent (ZooKeeper's default, older versions') or one another identity took
    over is a warning of ``verify``."""
    top = f"/waltz-parents-{uuid.uuid4().hex[:8]}"
    root = f"{top}/shared/cluster"
    zk = connect_zookeeper(zookeeper.connect_string)
    intruder = connect_zookeeper(zookeeper.connect_string)
    intruder.add_auth("digest", "intruder:pw")
    intruder_acl = make_digest_acl("intruder", "pw", all=True)
    try:
        cluster = ClusterZk(zk, root)
        cluster.create(
            ClusterParams("parents", 1, uuid.uuid4()),
            ReplicaAssignments({"127.0.0.1:1": (0,)}),
            GroupDescriptor({"127.0.0.1:1": 0}),
            ConnectionMetadata({"127.0.0.1:1": 2}),
        )
        parents = {c.name: c for c in acl_checks(cluster)}["zookeeper: root's parents"]
        assert parents.status is CheckStatus.PASSED, parents
        assert parents.detail == f"{top}, {top}/shared: nobody else may change them"
        for path in (top, f"{top}/shared"):
            with pytest.raises(NoAuthError):  # nobody may take a parent over
                intruder.set_acls(path, [make_digest_acl("intruder", "pw", all=True)])
        # A parent made open, then taken over.
        zk.create(f"{top}/open", b"")  # ZooKeeper's default: world:anyone:cdrwa
        open_cluster = ClusterZk(zk, f"{top}/open/cluster")
        warned = {c.name: c for c in acl_checks(open_cluster)}["zookeeper: root's parents"]
        assert warned.status is CheckStatus.WARNING
        assert f"{top}/open: anyone may change it (world:anyone:ALL)" in warned.detail
        assert "setAcl <parent> world:anyone:crd" in warned.detail
        intruder.set_acls(f"{top}/open", [make_acl("world", "anyone", read=True), intruder_acl])
        taken = {c.name: c for c in acl_checks(open_cluster)}["zookeeper: root's parents"]
        assert taken.status is CheckStatus.WARNING
        assert "digest:intruder:" in taken.detail and "none of the cluster's identities" in taken.detail
        intruder.set_acls(f"{top}/open", [intruder_acl])
        hidden = {c.name: c for c in acl_checks(open_cluster)}["zookeeper: root's parents"]
        assert hidden.status is CheckStatus.WARNING
        assert "may not even read its ACL (another identity holds it)" in hidden.detail
    finally:
        with contextlib.suppress(NoNodeError, NoAuthError):
            intruder.delete(f"{top}/open", recursive=True)
        with contextlib.suppress(NoNodeError):
            zk.delete(top, recursive=True)
        for client in (zk, intruder):
            client.stop()
            client.close()


def _session(zookeeper: Zk, digest: str) -> KazooClient:
    return connect_zookeeper(zookeeper.connect_string, security=ZooKeeperSecurity(digest))


def _create_with_roles(
    zookeeper: Zk, root: str, credentials: RoleCredentials, name: str, partitions: int
) -> None:
    """Create a cluster with role credentials under ``root``, on a storage node that need not run."""
    operator = _session(zookeeper, credentials.operator)
    try:
        ClusterZk(operator, root).create(
            ClusterParams(name, partitions, uuid.uuid4()),
            ReplicaAssignments({"127.0.0.1:1": tuple(range(partitions))}),
            GroupDescriptor({"127.0.0.1:1": 0}),
            ConnectionMetadata({"127.0.0.1:1": 2}),
            roles=credentials.identities(),
        )
    finally:
        operator.stop()
        operator.close()


def test_a_server_can_neither_take_nor_remove_the_operators_preferred_partitions(
    zookeeper: LocalZooKeeper | DockerZooKeeper, zk_root: str, digests: Path
) -> None:
    """``server/preferred`` is the operators' (docs/design/zookeeper.md, "Roles"): a server session,
    which creates its member and election znodes under ``server``, may not delete, re-create or
    write it; ``verify`` fails a ``server`` znode that still lets servers delete its children (the
    table of older versions) and warns of a missing ``server/preferred``; ``secure`` mends both."""
    credentials = RoleCredentials.load_or_generate(digests)
    paths = ClusterPaths.of(zk_root)
    operator = _session(zookeeper, credentials.operator)
    server = _session(zookeeper, credentials.server)
    try:
        cluster = ClusterZk(operator, zk_root)
        cluster.create(
            ClusterParams("preferred", 2, uuid.uuid4()),
            ReplicaAssignments({"127.0.0.1:1": (0, 1)}),
            GroupDescriptor({"127.0.0.1:1": 0}),
            ConnectionMetadata({"127.0.0.1:1": 2}),
            roles=credentials.identities(),
        )
        assert json.loads(operator.get(paths.server_preferred)[0])["servers"] == {}
        ClusterZk(server, zk_root).check_security()  # the server role's default ACL, as a server runs
        server.ensure_path(paths.election)  # what a server still creates under `server`
        with pytest.raises(NoAuthError):
            server.delete(paths.server_preferred)
        with pytest.raises(NoAuthError):
            server.set(paths.server_preferred, b'{"format_version": 1, "servers": {"x:1": [0]}}')
        with pytest.raises(NoAuthError):  # nor give itself the right to delete them
            server.set_acls(paths.server, credentials.identities().acl({Role.SERVER: Permissions.ALL}))
        checks = {c.name: c for c in acl_checks(cluster)}
        assert checks["zookeeper: role ACLs"].status is CheckStatus.PASSED, checks["zookeeper: role ACLs"]

        # A cluster secured by an older version: servers held every right on `server`, and no
        # `server/preferred` was made, so a server could create it with its own ACL.
        everything, read = Permissions.ALL, Permissions.READ
        old = credentials.identities().acl(
            {Role.SERVER: everything, Role.OPERATOR: everything, Role.CLIENT: read}
        )
        operator.set_acls(paths.server, old)
        operator.delete(paths.server_preferred)
        role_acls = {c.name: c for c in acl_checks(cluster)}["zookeeper: role ACLs"]
        assert role_acls.status is CheckStatus.FAILED, role_acls
        assert f"{paths.server} grants server cdrwa (the table: cr)" in role_acls.detail
        assert f"{paths.server_preferred} is missing" in role_acls.detail
        assert "waltz cluster secure" in role_acls.detail
        cluster.access.secure()
        assert json.loads(operator.get(paths.server_preferred)[0])["servers"] == {}
        role_acls = {c.name: c for c in acl_checks(cluster)}["zookeeper: role ACLs"]
        assert role_acls.status is CheckStatus.PASSED, role_acls
        with pytest.raises(NoAuthError):
            server.delete(paths.server_preferred)
    finally:
        for session in (operator, server):
            session.stop()
            session.close()


def test_a_server_holding_the_operators_credential_refuses_to_start(
    request: pytest.FixtureRequest,
    zookeeper: LocalZooKeeper | DockerZooKeeper,
    zk_root: str,
    digests: Path,
    tmp_path: Path,
) -> None:
    """Its election and assignment znodes would get the operators' ACL, which the servers started
    with their own credential could not use (docs/design/zookeeper.md, "Roles")."""
    credentials = RoleCredentials.load_or_generate(digests)
    _create_with_roles(zookeeper, zk_root, credentials, "roles", 1)
    operator_file = {"WALTZ_ZOOKEEPER_AUTH_DIGEST_FILE": str(digests / ROLE_DIGEST_FILES[Role.OPERATOR])}
    server = start_server(request, zookeeper, zk_root, tmp_path / "server-as-operator.log", operator_file)
    try:
        with pytest.raises(
            ServiceStartError, match="runs as the server role but its ZooKeeper credential is the operator's"
        ):
            server.start()
        assert "server.digest of the cluster's --digest-dir" in server.process.log_tail()
    finally:
        server.close()
    checker = _session(zookeeper, credentials.operator)
    try:
        assert checker.exists(ClusterPaths.of(zk_root).election) is None  # it made nothing
    finally:
        checker.stop()
        checker.close()


def test_wrong_roots_and_refused_commands_get_one_clear_line_and_no_advice_to_delete(
    zookeeper: LocalZooKeeper | DockerZooKeeper, zk_root: str, digests: Path
) -> None:
    """A root that is the parent of a cluster is named as such (never "delete the root", which would
    wipe every cluster under it); `server preferred` and `client check-connectivity` refused by
    ZooKeeper say which credential to check, without a traceback (docs/design/zookeeper.md,
    "Checking the root")."""
    credentials = RoleCredentials.load_or_generate(digests)
    inner = f"{zk_root}/c1"
    _create_with_roles(zookeeper, inner, credentials, "inner", 2)
    files = {role: str(digests / name) for role, name in ROLE_DIGEST_FILES.items()}
    as_operator = {"WALTZ_ZOOKEEPER_AUTH_DIGEST_FILE": files[Role.OPERATOR]}
    listed = cluster_cli(zookeeper, zk_root, "list", env=as_operator, expect=2)
    assert f"no cluster under {zk_root} (clusters under it: {inner})" in listed.output, listed.output
    assert "delete the root" not in listed.output and "tampered" not in listed.output
    made = cluster_cli(
        zookeeper, zk_root, "create", "--name", "x", "--partitions", "1", "--storage", "127.0.0.1:1=2",
        env=as_operator, expect=2,
    )  # fmt: skip
    assert f"a new cluster takes a root of its own, such as {zk_root}/<name>" in made.output, made.output
    assert "delete the root" not in made.output

    where = ["--zookeeper", zookeeper.connect_string, "--root", inner, "--timeout", "5"]
    as_server = {"WALTZ_ZOOKEEPER_AUTH_DIGEST_FILE": files[Role.SERVER]}
    preferred = CliRunner().invoke(
        app, ["server", "preferred", "add", "127.0.0.1:9", "-p", "0", *where], env=as_server
    )
    assert preferred.exit_code == 2, preferred.output
    assert "ZooKeeper refused the command (NoAuthError)" in preferred.output, preferred.output
    assert "servers take the server's, the cluster tools the operator's" in preferred.output
    by_operator = CliRunner().invoke(
        app, ["server", "preferred", "add", "127.0.0.1:9", "-p", "0", *where], env=as_operator
    )
    assert by_operator.exit_code == 0, by_operator.output

    anonymous = CliRunner().invoke(app, ["client", "check-connectivity", *where], env={})
    assert anonymous.exit_code == 2, anonymous.output
    assert anonymous.exception is None or isinstance(anonymous.exception, SystemExit), anonymous.exception
    assert "Traceback" not in anonymous.output
    assert f"ZooKeeper refused reading the servers' members under {inner}/server/members" in anonymous.output
