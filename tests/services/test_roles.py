"""Roles on a secured cluster: each certificate may do what its role allows and nothing else.

One ``LocalCluster(security=SecurityOptions(secure=True))``: a CA and role certificates made by
the harness, mutual TLS on every port, the supervisor acting as ``admin``. Each test presents one
role's certificate to a real port and checks both what it may do (the control that makes each
refusal mean something) and what it may not, and that a refused request changed nothing.

Design: docs/design/overview.md, "Roles".
"""

from __future__ import annotations

import asyncio
import ssl
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest
from kazoo.client import KazooClient
from typer.testing import CliRunner

from tests.client.client_helpers import Append, MemoryStore
from waltz import WaltzClient, WaltzClientConfig
from waltz.admin.storage_nodes import StorageAccessDeniedError, call_admin
from waltz.cli.main import app
from waltz.errors import StorageRpcError, WaltzTimeoutError
from waltz.local.certificates import ClusterCertificates
from waltz.local.cluster import LocalCluster
from waltz.local.nodes import LocalStorageNode
from waltz.local.options import SecurityOptions
from waltz.local.processes import wait_for_port
from waltz.metadata.zk import ClusterZk
from waltz.protocol.records import ReqId
from waltz.protocol.server_client import ServerAdminClient
from waltz.protocol.storage_client import StorageAdminClient, StorageSessionClient, StorageStreamError
from waltz.services.storage import format as fmt

pytestmark = pytest.mark.security

TIMEOUT = 30.0


@pytest.fixture(scope="module")
def secured(zookeeper: object) -> Iterator[LocalCluster]:
    with LocalCluster(
        storages=1,
        servers=1,
        partitions=1,
        zookeeper=zookeeper.connect_string,  # type: ignore[attr-defined]
        # The nodes' roles alone (ZooKeeper's: tests/local/test_local_cluster_auth.py).
        security=SecurityOptions(secure=True, zookeeper_auth=False),
    ) as cluster:
        yield cluster


def certificates(cluster: LocalCluster) -> ClusterCertificates:
    assert cluster.certificates is not None
    return cluster.certificates


def admin_client(cluster: LocalCluster, role: str) -> StorageAdminClient:
    node = cluster.storages[0]
    return StorageAdminClient(
        node.admin_address, cluster.cluster_key, cluster.num_partitions, tls=certificates(cluster).tls(role)
    )


def client_config(cluster: LocalCluster, role: str) -> WaltzClientConfig:
    return WaltzClientConfig(**cluster.client_settings(role))


def test_a_client_certificate_commits_but_cannot_open_an_admin_session(secured: LocalCluster) -> None:
    store = MemoryStore({0: -1})
    with WaltzClient(store, client_config(secured, "client")) as client:
        transaction_id = client.submit(Append(0, b"with the client role")).result(60).transaction_id
        assert transaction_id is not None

    async def admin_as_client() -> None:
        async with admin_client(secured, "client") as admin:
            await admin.partition_status(0)

    with pytest.raises(StorageStreamError, match=r"PERMISSION_DENIED.*urn:waltz:role") as denied:
        asyncio.run(admin_as_client())
    assert denied.value.status is grpc.StatusCode.PERMISSION_DENIED
    # The tools' way in says what to do: another certificate, not "unreachable".
    node = secured.storages[0]
    with pytest.raises(StorageAccessDeniedError, match=r"refused this certificate.*operator role"):
        asyncio.run(
            call_admin(
                node.admin_address,
                secured.cluster_key,
                secured.num_partitions,
                lambda admin: admin.partition_status(0),
                tls=certificates(secured).tls("client"),
            )
        )

    async def server_status_as_client() -> None:
        async with ServerAdminClient(
            secured.servers[0].endpoint, tls=certificates(secured).tls("client")
        ) as admin:
            await admin.status()

    with pytest.raises(grpc.aio.AioRpcError) as refused:
        asyncio.run(server_status_as_client())
    assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED


def test_a_client_with_another_role_s_certificate_is_told_why_it_cannot_mount_and_backs_off(
    secured: LocalCluster,
) -> None:
    """The server ends the stream of a certificate without the client role at once: the client
    says so when its mount times out (not a bare timeout), and mounts again with its backoff, not
    in a tight loop of new connections."""
    with WaltzClient(MemoryStore({0: -1}), client_config(secured, "operator")) as client:
        started = time.monotonic()
        with pytest.raises(WaltzTimeoutError, match=r"PERMISSION_DENIED.*urn:waltz:role:client"):
            client.ready(4)
        seconds = time.monotonic() - started
        remounts = client.metrics.get_sample_value("waltz_client_remounts_total", {"partition": "0"})
    assert remounts is not None and remounts <= 10 * seconds, f"{remounts} remounts in {seconds:.1f}s"


def test_an_operator_reads_but_cannot_change_a_storage_node(secured: LocalCluster) -> None:
    async def scenario() -> None:
        async with admin_client(secured, "operator") as admin:
            status = await admin.partition_status(0)  # the control: reads are allowed
            assert [p.partition_id for p in status.partitions] == [0]
            with pytest.raises(ConnectionError, match=r"PERMISSION_DENIED.*partition_assignment"):
                await admin.assign_partition(0, False, delete_storage_files=True)
        async with admin_client(secured, "operator") as admin:
            with pytest.raises(ConnectionError, match=r"PERMISSION_DENIED.*set_fence"):
                await admin.set_fence(0, -1, operator="not an admin")
        async with admin_client(secured, "admin") as admin:  # nothing was deleted
            status = await admin.partition_status(0)
            assert [p.partition_id for p in status.partitions] == [0]

    asyncio.run(scenario())


def test_a_server_certificate_cannot_delete_a_partition(secured: LocalCluster) -> None:
    async def scenario() -> None:
        async with admin_client(secured, "node") as admin:
            await admin.assign_partition(0, False, delete_storage_files=True)

    with pytest.raises(ConnectionError, match="PERMISSION_DENIED"):
        asyncio.run(scenario())
    store = MemoryStore({0: -1})
    with WaltzClient(store, client_config(secured, "client")) as client:  # the partition still serves
        assert client.submit(Append(0, b"still here")).result(60).committed


def test_only_a_server_or_admin_certificate_opens_a_store_session(secured: LocalCluster) -> None:
    node = secured.storages[0]
    files = certificates(secured)

    async def session(role: str) -> None:
        async with StorageSessionClient(
            node.address, secured.cluster_key, secured.num_partitions, session_id=0, tls=files.tls(role)
        ) as storage:
            await storage.max_transaction_id(0)

    for role in ("client", "operator"):
        with pytest.raises(ConnectionError, match=r"PERMISSION_DENIED.*store session"):
            asyncio.run(session(role))


def test_a_server_with_a_certificate_of_another_role_for_its_store_sessions_does_not_start(
    secured: LocalCluster,
) -> None:
    """The check a server makes before it joins (docs/design/server.md "What a server does"):
    the node completes the TLS connection of any certificate of the cluster's CA, so only an empty
    store session stream tells that this one's role may open none; the node's own certificate
    passes the same check (the control)."""
    from waltz.services.server.storage_probe import StorageUnusableError, check_storage_connections

    node = secured.storages[0]
    files = certificates(secured)
    asyncio.run(check_storage_connections([node.address], files.tls("node"), timeout=10, period=10))
    with pytest.raises(StorageUnusableError, match=r"refuse this server's store sessions.*role") as refused:
        asyncio.run(check_storage_connections([node.address], files.tls("client"), timeout=10, period=10))
    assert "Give the server a certificate of the server role" in str(refused.value)


def test_admin_appends_need_the_admin_role(secured: LocalCluster) -> None:
    endpoint = secured.servers[0].endpoint
    files = certificates(secured)
    forged = [(ReqId(99, 0, 0, 1), 0, b"forged")]

    async def append(role: str) -> list[int | str]:
        async with ServerAdminClient(endpoint, tls=files.tls(role), timeout=TIMEOUT) as admin:
            return await admin.append(0, forged)

    with pytest.raises(grpc.aio.AioRpcError, match="admin append") as refused:
        asyncio.run(append("operator"))
    assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED
    [outcome] = asyncio.run(append("admin"))  # the control: the admin role may
    assert isinstance(outcome, int) and outcome >= 0


def test_the_archiver_tells_the_replicas_only_with_the_admin_role(
    secured: LocalCluster, tmp_path: Path
) -> None:
    """``waltz archive run`` with the operator's certificate writes the archive but exits 1 naming
    the replica it could not tell and the certificate it needs; a run with the admin's, with nothing
    new to archive, tells it (docs/operations.md, "Archive")."""
    import json

    from typer.testing import CliRunner

    from waltz.cli.main import app

    async def commit() -> None:
        async with ServerAdminClient(
            secured.servers[0].endpoint, tls=certificates(secured).tls("admin")
        ) as admin:
            batch = [(ReqId(98, 0, 0, i), 0, b"to archive %d" % i) for i in range(20)]
            assert all(isinstance(o, int) for o in await admin.append(0, batch))

    asyncio.run(commit())
    node = secured.storages[0].address
    run = ["archive", "run", "--to", str(tmp_path / "archive"), "--seal-after", "0"]
    as_operator = CliRunner().invoke(app, run, env=secured.admin_env("operator"))
    assert as_operator.exit_code == 1, as_operator.output
    assert f"replicas NOT TOLD: {node}" in as_operator.output and "PERMISSION_DENIED" in as_operator.output
    assert "tls/admin.pem" in as_operator.output
    status = CliRunner().invoke(app, ["archive", "status", "--json"], env=secured.admin_env("operator"))
    (line,) = json.loads(status.stdout)["partitions"]
    through = line["zookeeper"]["archived_through"]
    assert through >= 19 and line["archive"]["archived_through"] == through
    assert line["replicas_not_told"] == [node] and line["replicas"][0]["archived_through"] != through
    as_admin = CliRunner().invoke(app, run, env=secured.admin_env("admin"))
    assert as_admin.exit_code == 0, as_admin.output
    status = CliRunner().invoke(app, ["archive", "status", "--json"], env=secured.admin_env("operator"))
    (line,) = json.loads(status.stdout)["partitions"]
    assert line["replicas_not_told"] == [] and line["replicas"][0]["archived_through"] == through
    assert status.exit_code == 0, status.output
    # Without the TLS files the node does not answer: named once, with why, and the status fails.
    operator_env = secured.admin_env("operator")
    plaintext = {k: v for k, v in operator_env.items() if not k.startswith("WALTZ_CLUSTER_SSL")}
    blind = CliRunner().invoke(app, ["archive", "status", "--timeout", "2"], env=plaintext)
    assert blind.exit_code == 1, blind.output
    assert blind.output.count(f"storage node {node} did not answer: ") == 1, blind.output
    assert f"  {node}: did not answer (above)" in blind.output and "committed through unknown" in blind.output

    # verify --hold of a damaged chunk: the operator's certificate lowers ZooKeeper only, and says so.
    (chunk,) = (tmp_path / "archive" / "partition_id=0").glob("*.parquet")
    chunk.write_bytes(chunk.read_bytes()[:-10] + b"damaged!!!")
    hold = ["archive", "verify", "--hold"]
    as_operator = CliRunner().invoke(app, hold, env=secured.admin_env("operator"))
    assert as_operator.exit_code == 1, as_operator.output
    assert "NOT HELD on every replica: partition 0 is archived through -1 in ZooKeeper" in as_operator.output
    assert f"  {node}: " in as_operator.output and "PERMISSION_DENIED" in as_operator.output
    assert "held: partition 0" not in as_operator.output
    as_admin = CliRunner().invoke(app, hold, env=secured.admin_env("admin"))
    assert as_admin.exit_code == 1, as_admin.output  # the damage is still there
    assert "held: partition 0 is archived through -1 in ZooKeeper and on its replicas" in as_admin.output


def test_check_connectivity_with_a_client_and_an_operator_certificate(secured: LocalCluster) -> None:
    """``waltz client check-connectivity`` on a secured cluster: the client certificate reaches the
    servers' client service, the operator certificate the storage admin ports."""
    from waltz.admin.client_tools import check_connectivity

    checks = check_connectivity(
        client_config(secured, "client"), timeout=TIMEOUT, storage_tls=certificates(secured).tls("operator")
    )
    assert [(c.kind, c.error) for c in checks if not c.ok] == []
    assert {c.kind for c in checks} == {"server", "storage", "storage-admin"}
    # With the client certificate alone every node answers; what it may not read is said.
    as_client = check_connectivity(
        client_config(secured, "client"), timeout=TIMEOUT, storage_tls=certificates(secured).tls("client")
    )
    assert [c.error for c in as_client if not c.ok] == []
    assert [c.detail for c in as_client if c.kind == "storage-admin"] == [
        "answers (its status needs the operator role)"
    ]


@pytest.fixture
def empty_storage(secured: LocalCluster, tmp_path: Path) -> Iterator[LocalStorageNode]:
    """A storage node with the cluster's TLS files and no control file yet, serving /metrics."""
    node = LocalStorageNode(
        tmp_path / "empty",
        name="empty",
        log_path=tmp_path / "empty.log",
        metrics=True,
        env=certificates(secured).storage_env(),
    )
    try:
        node.start()
        assert node.metrics_port is not None
        # The node serves /metrics on a port of its own, opened after the gRPC ports start waits for.
        wait_for_port("127.0.0.1", node.metrics_port, timeout=30, what="the empty node's metrics port")
        yield node
    finally:
        node.close()


def test_an_operator_cannot_initialise_an_empty_storage_node(
    secured: LocalCluster, empty_storage: LocalStorageNode
) -> None:
    """An operator's admin open of a node without a control file is refused and writes nothing: the
    node stays free for the admin of its real cluster (the control)."""
    claimed = str(uuid.uuid4())

    async def open_as(role: str, key: str, *, initialise: bool = True) -> None:
        async with StorageAdminClient(
            empty_storage.admin_address, key, 1, tls=certificates(secured).tls(role), initialise=initialise
        ) as admin:
            await admin.partition_status(-1)

    with pytest.raises(StorageStreamError, match=r"PERMISSION_DENIED.*initialising.*urn:waltz:role:admin"):
        asyncio.run(open_as("operator", claimed))
    assert not (empty_storage.directory / fmt.CONTROL_FILE_NAME).exists()
    # A reading tool's open (existing_only) initialises nothing, even the admin's: it is told why.
    for role in ("operator", "admin"):
        with pytest.raises(StorageRpcError, match=r"not initialised .* storage\.directory") as refused:
            asyncio.run(open_as(role, claimed, initialise=False))
        assert refused.value.code == "NOT_INITIALIZED"
    assert not (empty_storage.directory / fmt.CONTROL_FILE_NAME).exists()
    real = str(uuid.uuid4())
    asyncio.run(open_as("admin", real))  # the control: the admin role initialises it
    assert (empty_storage.directory / fmt.CONTROL_FILE_NAME).exists()
    asyncio.run(open_as("operator", real))  # and an operator may then open it, with its key
    with pytest.raises(StorageRpcError, match="CLUSTER_KEY_MISMATCH"):
        asyncio.run(open_as("operator", claimed))


def _https_get(url: str, files: ClusterCertificates, role: str) -> tuple[int, bytes]:
    context = ssl.create_default_context(cafile=str(files.ca_file))
    context.load_cert_chain(files.cert_file(role), files.key_file(role))
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT, context=context) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def test_metrics_and_health_need_an_operator_admin_or_node_certificate(
    secured: LocalCluster, empty_storage: LocalStorageNode
) -> None:
    """A certificate of the cluster's CA is not enough for /metrics and /health: an application's
    (role ``client``) is refused with 403, the operator's, the admin's and the nodes' own read them."""
    files = certificates(secured)
    base = f"https://127.0.0.1:{empty_storage.metrics_port}"
    for path in ("/metrics", "/health"):
        status, body = _https_get(base + path, files, "client")
        assert status == 403, (path, status, body)
        assert b"urn:waltz:role:operator" in body and b"waltz_" not in body
        for role in ("operator", "admin", "node"):
            status, body = _https_get(base + path, files, role)
            assert status in (200, 503), (path, role, status, body)  # 503: /health of an empty node
            assert path != "/metrics" or b"waltz_storage" in body


@contextmanager
def store_znodes(cluster: LocalCluster) -> Iterator[Callable[[], list[tuple[bytes, int]]]]:
    """A reader of ``store/assignment``, ``store/connection`` and ``store/group``: (data, version)."""
    zk = KazooClient(hosts=cluster.zookeeper_connect_string)
    zk.start(TIMEOUT)
    try:
        paths = ClusterZk(zk, cluster.root, timeout=TIMEOUT).paths

        def read() -> list[tuple[bytes, int]]:
            found = [zk.get(path) for path in (paths.assignment, paths.connection, paths.group)]
            return [(data, stat.version) for data, stat in found]

        yield read
    finally:
        zk.stop()
        zk.close()


def test_an_operator_certificate_changes_no_storage_node_or_replica_in_zookeeper(
    secured: LocalCluster,
) -> None:
    """Operators and admins hold the same ZooKeeper credential, so the tools check the certificate's
    role before writing there: with the operator's certificate, unassign, remove, add, assign and
    auto-assign are refused (exit 1) naming the admin role, and store/* keeps its data and versions
    (before, unassign removed the replica from ZooKeeper and only then did the node refuse, and
    remove took a node out of the cluster). The admin's certificate is the control."""
    storage = secured.storages[0].address
    runner = CliRunner()
    as_operator = secured.admin_env("operator")
    as_admin = secured.admin_env("admin")

    def refused_as_operator(*arguments: str) -> None:
        result = runner.invoke(app, ["cluster", "storage", *arguments], env=as_operator)
        assert result.exit_code == 1, (arguments, result.output)
        assert "needs a certificate with the role urn:waltz:role:admin" in result.output, result.output
        assert (
            "this certificate's roles: operator" in result.output and "Nothing was written" in result.output
        )

    with store_znodes(secured) as read:
        before = read()
        for arguments in (
            ("unassign", storage, "--partition", "0", "--force"),
            ("assign", storage, "--partition", "0"),
            ("auto-assign", "--group", "0", "--force"),
            ("add", "127.0.0.1:1", "--admin-port", "2"),
        ):
            refused_as_operator(*arguments)
            assert read() == before, arguments
        try:
            unassigned = runner.invoke(
                app, ["cluster", "storage", "unassign", storage, "--partition", "0", "--force"], env=as_admin
            )
            assert unassigned.exit_code == 0, unassigned.output
            emptied = read()
            assert emptied != before
            refused_as_operator("remove", storage)  # a node without replicas: removable by an admin
            assert read() == emptied
        finally:
            back = runner.invoke(
                app, ["cluster", "storage", "assign", storage, "--partition", "0"], env=as_admin
            )
            assert back.exit_code == 0, back.output
