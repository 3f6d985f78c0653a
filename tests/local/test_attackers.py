"""Attackers against a secured local cluster: every destructive request is refused, and the data is
intact afterwards.

One ``LocalCluster(security=SecurityOptions(secure=True, zookeeper_auth=True))``: mutual TLS with
role certificates on every port, ZooKeeper credentials per role, 3 storage nodes, 1 server, 2
partitions, and a ``waltz console --operator`` over HTTPS that requires browser certificates, as
an operator runs it. A real client commits transactions first. Then two attackers, each a process
of its own (``tests/local/attacker.py``) holding only what it is given, try to truncate, fence,
unassign, delete, disable writes, mark as archived, claim an empty node, append without locks,
rewrite or create znodes, and act through the console:

- an application host: the ``client`` certificate, its key and the CA, and the client's ZooKeeper
  credential (no cluster key: the client's credential cannot read it);
- a process holding the cluster key and nothing else, over plaintext and over TLS without a
  certificate, and ZooKeeper without a credential.

Each attempt must meet its specific refusal: ``PERMISSION_DENIED`` naming the role it needed, a
TLS handshake that asks for a certificate, ``NoAuth``, or ``403``. Afterwards the replicas are
byte-identical, every committed transaction reads back, and ``waltz client validate`` passes.

Design: docs/design/overview.md, "Roles"; docs/design/zookeeper.md, "Roles"; docs/design/console.md,
"Access".
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import ssl
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient

from tests.client.client_helpers import Append, MemoryStore
from waltz import WaltzClient, WaltzClientConfig
from waltz.local.certificates import ClusterCertificates
from waltz.local.cluster import LocalCluster
from waltz.local.nodes import LocalStorageNode
from waltz.local.options import SecurityOptions
from waltz.local.processes import wait_until
from waltz.metadata.zk import ClusterPaths
from waltz.metadata.zk_roles import Role
from waltz.metadata.zk_security import ZooKeeperSecurity
from waltz.protocol.storage_client import StorageAdminClient
from waltz.services.storage import format as fmt

pytestmark = pytest.mark.security

ATTACKER = Path(__file__).with_name("attacker.py")
#: Transactions the client commits to each partition before the attacks.
COMMITTED = 6
#: Seconds an attacker process may take in all.
ATTACK_TIMEOUT = 120.0


@dataclass(frozen=True, slots=True)
class Secured:
    """The cluster under attack, what was committed to it, and what else the attackers aim at."""

    cluster: LocalCluster
    committed: dict[int, list[tuple[int, bytes]]]
    empty_storage: LocalStorageNode
    console_url: str
    znodes: dict[str, bytes]


def certificates(cluster: LocalCluster) -> ClusterCertificates:
    assert cluster.certificates is not None
    return cluster.certificates


def digest_file(cluster: LocalCluster, role: Role) -> Path:
    """The file holding a role's ZooKeeper credential."""
    path = cluster.zookeeper_settings(role)["zookeeper_auth_digest_file"]
    assert isinstance(path, Path)
    return path


def client_config(cluster: LocalCluster) -> WaltzClientConfig:
    """An application's settings: the client certificate and the client's ZooKeeper credential."""
    files = certificates(cluster)
    return WaltzClientConfig(
        **cluster.zookeeper_settings(Role.CLIENT),  # type: ignore[arg-type]
        client_tls_ca_file=files.ca_file,
        client_tls_cert_file=files.cert_file("client"),
        client_tls_key_file=files.key_file("client"),
    )


@contextmanager
def operator_zookeeper(cluster: LocalCluster) -> Iterator[KazooClient]:
    """A ZooKeeper session with the operator's credential."""
    digest = ZooKeeperSecurity.read_digest_file(digest_file(cluster, Role.OPERATOR))
    zk = KazooClient(hosts=cluster.zookeeper_connect_string, auth_data=[("digest", digest)])
    zk.start(timeout=15)
    try:
        yield zk
    finally:
        zk.stop()
        zk.close()


def read_znodes(cluster: LocalCluster) -> dict[str, bytes]:
    """The values and ACLs of the znodes the attackers aim at, read with the operator's credential."""
    paths = ClusterPaths.of(cluster.root)
    with operator_zookeeper(cluster) as zk:
        values = {
            path: zk.get(path)[0]
            for path in (paths.cluster, paths.assignment, paths.partition(0), paths.partition(1), paths.roles)
        }
        values["acl of the root"] = repr(sorted(map(repr, zk.get_acls(paths.root)[0]))).encode()
        values["children of the root"] = repr(sorted(zk.get_children(paths.root))).encode()
        values["children of store/partition"] = repr(sorted(zk.get_children(paths.partitions))).encode()
        values["members"] = repr(sorted(zk.get_children(paths.members))).encode()
        return values


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory, zookeeper: Any) -> Iterator[Secured]:
    from tests.console.console_helpers import launch_console

    work = tmp_path_factory.mktemp("attacked")
    with LocalCluster(
        storages=3,
        servers=1,
        partitions=2,
        name="attacked",
        zookeeper=zookeeper.connect_string,
        work_dir=work / "cluster",
        delete_root=True,
        security=SecurityOptions(secure=True, zookeeper_auth=True),
    ) as cluster:
        files = certificates(cluster)
        store = MemoryStore({0: -1, 1: -1})
        committed: dict[int, list[tuple[int, bytes]]] = {0: [], 1: []}
        with WaltzClient(store, client_config(cluster)) as client:
            for n in range(COMMITTED):
                for partition in (0, 1):
                    data = f"before the attack: partition {partition} number {n}".encode()
                    transaction_id = client.submit(Append(partition, data)).result(60).transaction_id
                    assert transaction_id is not None
                    committed[partition].append((transaction_id, data))
        empty = LocalStorageNode(
            work / "empty", name="empty", log_path=work / "empty.log", env=files.storage_env()
        )
        # The console an operator runs: HTTPS requiring browser certificates, the operator's
        # ZooKeeper credential and the admin certificate for the storage nodes.
        console_env = {
            **os.environ,
            **cluster.zookeeper_env(Role.OPERATOR),
            "WALTZ_CLUSTER_SSL_CA_FILE": str(files.ca_file),
            "WALTZ_CLUSTER_SSL_CERT_FILE": str(files.cert_file("admin")),
            "WALTZ_CLUSTER_SSL_KEY_FILE": str(files.key_file("admin")),
        }
        operator = ssl.create_default_context(cafile=str(files.ca_file))
        operator.load_cert_chain(files.cert_file("operator"), files.key_file("operator"))
        console = launch_console(
            work,
            cluster,
            "--operator",
            "--tls-cert",
            str(files.cert_file("node")),
            "--tls-key",
            str(files.key_file("node")),
            "--tls-ca",
            str(files.ca_file),
            name="console",
            tls=operator,
            env=console_env,
        )
        try:
            empty.start()
            console.wait_ready()
            yield Secured(cluster, committed, empty, console.url, read_znodes(cluster))
        finally:
            console.close()
            empty.close()


def plan(secured: Secured, directory: Path, channels: list[dict[str, Any]], **held: Any) -> Path:
    """Write an attacker's plan: the addresses to attack, and what it holds (``held``)."""
    cluster = secured.cluster
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "plan.json"
    path.write_text(
        json.dumps(
            {
                "channels": channels,
                "num_partitions": cluster.num_partitions,
                "storage_admin": [node.admin_address for node in cluster.storages],
                "storage": [node.address for node in cluster.storages],
                "servers": cluster.server_endpoints,
                "empty_storage_admin": secured.empty_storage.admin_address,
                "zookeeper": cluster.zookeeper_connect_string,
                "root": cluster.root,
                "console": secured.console_url,
                **held,
            }
        )
    )
    return path


def attack(plan_path: Path) -> list[dict[str, str]]:
    """Run an attacker process with ``plan_path`` and nothing else (no ``WALTZ_*`` settings); its
    report is kept beside the plan, in ``report.json``."""
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(plan_path.parent), "LANG": "C.UTF-8"}
    result = subprocess.run(
        [sys.executable, str(ATTACKER), str(plan_path)],
        capture_output=True,
        text=True,
        timeout=ATTACK_TIMEOUT,
        env=env,
        cwd=plan_path.parent,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines: list[dict[str, str]] = json.loads(result.stdout)
    (plan_path.parent / "report.json").write_text(result.stdout)
    return lines


def copy_files(directory: Path, *files: Path) -> list[str]:
    """Copies of ``files`` in the attacker's own directory (the paths it is given)."""
    directory.mkdir(parents=True, exist_ok=True)
    return [str(shutil.copy(file, directory / file.name)) for file in files]


def outcomes(lines: list[dict[str, str]], attempt: str, channel: str | None = None) -> list[dict[str, str]]:
    found = [
        line
        for line in lines
        if line["attempt"].startswith(attempt) and (channel is None or line["channel"] == channel)
    ]
    assert found, f"no attempt {attempt!r} on {channel!r} in the report"
    return found


def assert_refused(
    lines: list[dict[str, str]], attempt: str, outcome: str, detail: str = "", channel: str | None = None
) -> None:
    """Every attempt starting with ``attempt`` met ``outcome``, with ``detail`` in its message."""
    wrong = [
        line
        for line in outcomes(lines, attempt, channel)
        if line["outcome"] != outcome or detail not in line["detail"]
    ]
    assert not wrong, f"expected {outcome} ({detail!r}) for {attempt!r}, got:\n" + "\n".join(map(str, wrong))


def assert_intact(secured: Secured) -> None:
    """The cluster after an attack: byte-identical replicas, the znodes as they were, the empty
    node unclaimed, every committed transaction read back by a fresh client, and ``waltz client
    validate`` passing (the partitions still take transactions, in order)."""
    cluster = secured.cluster
    cluster.wait_ready(60)
    marks = {p: max(t for t, _ in txs) for p, txs in secured.committed.items()}
    digests = cluster.replica_digests(marks)
    assert all(len(found) == 1 for found in digests.values()), digests
    assert read_znodes(cluster) == secured.znodes
    assert not (secured.empty_storage.directory / fmt.CONTROL_FILE_NAME).exists()

    store = MemoryStore({0: -1, 1: -1})
    with WaltzClient(store, client_config(cluster)) as client:
        for partition, mark in marks.items():
            assert client.wait_applied(partition, mark, 60)
    for partition, transactions in secured.committed.items():
        applied = {a.transaction_id: a.data for a in store.applied[partition]}
        assert [applied.get(t) for t, _ in transactions] == [data for _, data in transactions]
    assert store.errors == []

    files = certificates(cluster)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "waltz",
            "client",
            "validate",
            "--zookeeper",
            cluster.zookeeper_connect_string,
            "--root",
            cluster.root,
            "--ssl-ca-file",
            str(files.ca_file),
            "--ssl-cert-file",
            str(files.cert_file("client")),
            "--ssl-key-file",
            str(files.key_file("client")),
            "--producers",
            "2",
            "--transactions",
            "5",
            "--run-timeout",
            "60",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **cluster.zookeeper_env(Role.CLIENT)},
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["passed"] is True and report["committed"] == 10 and report["mismatches"] == []


@pytest.mark.parametrize(
    "leaked_key", [False, True], ids=["without the cluster key", "with a leaked cluster key"]
)
def test_an_application_host_with_the_client_certificate_destroys_nothing(
    secured: Secured, tmp_path: Path, leaked_key: bool
) -> None:
    """An application host cannot read the cluster key; with one made up, and with the real one
    (leaked some other way), its certificate's role is what refuses every request."""
    files = certificates(secured.cluster)
    ca, cert, key, digest = copy_files(
        tmp_path / "held",
        files.ca_file,
        files.cert_file("client"),
        files.key_file("client"),
        digest_file(secured.cluster, Role.CLIENT),
    )
    channel = {"name": "client certificate", "tls": {"ca": ca, "cert": cert, "key": key}}
    leaked = {"cluster_key": secured.cluster.cluster_key} if leaked_key else {}
    lines = attack(plan(secured, tmp_path, [channel], zookeeper_digest_file=digest, **leaked))

    admin_role = "urn:waltz:role:admin or urn:waltz:role:operator"
    assert_refused(
        lines,
        "admin ",
        "PERMISSION_DENIED",
        f"the storage admin service needs a certificate with the role {admin_role}",
    )
    assert_refused(lines, "claim empty-node", "PERMISSION_DENIED", admin_role)
    assert_refused(lines, "store truncate", "PERMISSION_DENIED", "store session")
    assert_refused(lines, "store floor-truncate", "PERMISSION_DENIED", "store session")
    assert_refused(lines, "store reset-start", "PERMISSION_DENIED", "store session")
    assert_refused(lines, "server admin-append", "PERMISSION_DENIED", "urn:waltz:role:admin")
    assert_refused(lines, "console ", "HTTP 403", "urn:waltz:role:")
    assert_refused(lines, "zookeeper ", "NoAuth")
    # The control: the certificate is good, the handshake passes; the roles refuse.
    assert_refused(lines, "probe", "ACCEPTED")
    assert Counter(line["attempt"] for line in lines)["admin set-fence"] == 3
    assert_intact(secured)


def test_the_cluster_key_without_a_certificate_destroys_nothing(secured: Secured, tmp_path: Path) -> None:
    files = certificates(secured.cluster)
    [ca] = copy_files(tmp_path / "held", files.ca_file)
    channels: list[dict[str, Any]] = [
        {"name": "plaintext", "tls": None},
        {"name": "tls without certificate", "tls": {"ca": ca}},
    ]
    lines = attack(
        plan(secured, tmp_path, channels, cluster_key=secured.cluster.cluster_key, client_id_value=0)
    )

    for attempt in (
        "admin ",
        "claim empty-node",
        "store truncate",
        "store floor-truncate",
        "store reset-start",
        "server admin-append",
    ):
        assert_refused(lines, attempt, "UNAVAILABLE", channel="plaintext")
        assert_refused(lines, attempt, "UNAVAILABLE", channel="tls without certificate")
    # Every port speaks only TLS, and asks for a certificate of the cluster's CA.
    assert_refused(lines, "probe", "CLOSED", "without an answer", channel="plaintext")
    assert_refused(
        lines, "probe", "TLS handshake:UNEXPECTED_EOF_WHILE_READING", channel="tls without certificate"
    )
    assert_refused(lines, "console ", "CLOSED", channel="plaintext")
    assert_refused(lines, "console ", "TLS:UNEXPECTED_EOF_WHILE_READING", channel="tls without certificate")
    assert_refused(lines, "zookeeper ", "NoAuth")
    assert_intact(secured)


def test_a_server_certificate_with_the_cluster_key_erases_no_committed_transaction(
    secured: Secured, tmp_path: Path
) -> None:
    """What a server host holds (its certificate and the cluster key, not its ZooKeeper credential):
    a store session is its role, but no session truncates below what the cluster recorded as
    committed (docs/design/storage.md, "The committed floor")."""
    cluster = secured.cluster
    files = certificates(cluster)

    async def low_water_marks() -> dict[tuple[str, int], int]:
        marks = {}
        for node in cluster.storages:
            async with StorageAdminClient(
                node.admin_address, cluster.cluster_key, cluster.num_partitions, tls=files.tls("admin")
            ) as admin:
                for status in (await admin.partition_status(-1)).partitions:
                    marks[(node.address, status.partition_id)] = status.low_water_mark
        return marks

    # The sessions' probes record what they committed on their writers within a few seconds.
    committed = {p: max(t for t, _ in txs) for p, txs in secured.committed.items()}
    wait_until(
        lambda: all(mark >= committed[p] for (_, p), mark in asyncio.run(low_water_marks()).items()),
        timeout=60,
        what="every replica's low-water mark at the committed transactions",
        interval=0.5,
    )
    ca, cert, key = copy_files(
        tmp_path / "held", files.ca_file, files.cert_file("node"), files.key_file("node")
    )
    channel = {"name": "server certificate", "tls": {"ca": ca, "cert": cert, "key": key}}
    lines = attack(plan(secured, tmp_path, [channel], cluster_key=cluster.cluster_key))

    assert_refused(lines, "admin ", "PERMISSION_DENIED", "the storage admin service needs a certificate")
    assert_refused(lines, "claim empty-node", "PERMISSION_DENIED", "urn:waltz:role:admin")
    assert_refused(lines, "store truncate", "StorageRpcError:SESSION_JUMP_TOO_LARGE", "storage.fence.maxJump")
    assert_refused(lines, "store floor-truncate", "StorageRpcError:INVALID_REQUEST", "the floor is")
    assert_refused(
        lines, "store reset-start", "StorageRpcError:INVALID_REQUEST", "knows the archive holds the partition"
    )
    assert_refused(lines, "server admin-append", "PERMISSION_DENIED", "urn:waltz:role:admin")
    assert_refused(lines, "zookeeper ", "NoAuth")
    assert_intact(secured)


def test_the_client_credential_cannot_rewind_the_client_id_counter(secured: Secured, tmp_path: Path) -> None:
    cluster = secured.cluster
    [digest] = copy_files(tmp_path / "held", digest_file(cluster, Role.CLIENT))
    paths = ClusterPaths.of(cluster.root)
    with operator_zookeeper(cluster) as zk:
        before = {path: zk.get(path)[0] for path in (paths.client_id, paths.client_ids)}
        try:
            lines = attack(plan(secured, tmp_path, [], zookeeper_digest_file=digest, client_id_value=0))
        finally:
            for path, data in before.items():  # as they were, whatever the attacker did
                if zk.exists(path) is None:
                    zk.create(path, data)
                zk.set(path, data)
        after = {path: zk.get(path)[0] for path in (paths.client_id, paths.client_ids)}
    for attempt in ("set client-id", "set client-ids", "delete client-ids", "open client-ids-acl"):
        assert outcomes(lines, f"zookeeper {attempt}", None), f"{attempt} was not attempted"
        assert_refused(lines, f"zookeeper {attempt}", "NoAuth")
    assert after == before
