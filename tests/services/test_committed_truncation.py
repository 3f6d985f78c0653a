"""Committed transactions on a secured cluster: a server certificate's store session cannot remove
them, and an operator's truncation with the admin certificate is one the cluster recovers from.

One ``LocalCluster(security=SecurityOptions(secure=True))`` with three storage nodes and one
server; a real client commits transactions, the server is stopped, and the storage nodes are
asked directly, as a process holding a certificate would.

Design: docs/design/storage.md, "The committed floor"; docs/operations.md, "Truncating committed
transactions".
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.client.client_helpers import Append, MemoryStore
from waltz import WaltzClient, WaltzClientConfig
from waltz.cli.main import app as waltz_app
from waltz.errors import StorageRpcError
from waltz.local.certificates import ClusterCertificates
from waltz.local.cluster import LocalCluster
from waltz.local.options import SecurityOptions
from waltz.protocol.storage_client import StorageAdminClient, StorageSessionClient

pytestmark = pytest.mark.security

COMMITTED = 10
KEPT = 3


@pytest.fixture
def secured(zookeeper: object) -> Iterator[LocalCluster]:
    with LocalCluster(
        storages=3,
        servers=1,
        partitions=1,
        zookeeper=zookeeper.connect_string,  # type: ignore[attr-defined]
        security=SecurityOptions(secure=True),
    ) as cluster:
        yield cluster


def certificates(cluster: LocalCluster) -> ClusterCertificates:
    assert cluster.certificates is not None
    return cluster.certificates


def client_config(cluster: LocalCluster) -> WaltzClientConfig:
    return WaltzClientConfig(**cluster.client_settings())


async def logs(cluster: LocalCluster) -> list[tuple[int, int, int]]:
    """Each storage node's (fence, max transaction ID, low-water mark) of partition 0."""
    found = []
    for node in cluster.storages:
        async with StorageAdminClient(
            node.admin_address, cluster.cluster_key, 1, tls=certificates(cluster).tls("admin")
        ) as admin:
            (status,) = (await admin.partition_status(0)).partitions
            found.append((status.session_id, status.max_transaction_id, status.low_water_mark))
    return found


def test_a_server_certificate_cannot_truncate_committed_transactions_and_an_admin_can(
    secured: LocalCluster,
) -> None:
    cluster = secured
    files = certificates(cluster)
    store = MemoryStore({0: -1})
    with WaltzClient(store, client_config(cluster)) as client:
        outcomes = [client.submit(Append(0, f"committed {i}".encode())).result(60) for i in range(COMMITTED)]
    assert all(o.committed for o in outcomes), outcomes
    ids = [o.transaction_id for o in outcomes]
    mark = max(ids)
    first = mark - COMMITTED + 1
    # A new store session's recovery records on every replica that everything up to the mark is
    # committed (its low-water mark); then the writes stop, as the operator's procedure says.
    cluster.restart_server(0)
    cluster.wait_ready(120)
    cluster.stop_server(0)
    before = asyncio.run(logs(cluster))
    assert [(max_id, lwm) for _, max_id, lwm in before] == [(mark, mark)] * 3, before

    async def as_a_server() -> None:
        for node, (fence, _, low_water_mark) in zip(cluster.storages, before, strict=True):
            async with StorageSessionClient(
                node.address, cluster.cluster_key, 1, fence + 1, tls=files.tls("node")
            ) as hostile:
                await hostile.open_session(0)
                with pytest.raises(StorageRpcError, match=f"the floor is {low_water_mark}"):
                    await hostile.truncate(0, -1)
                with pytest.raises(StorageRpcError, match="never lowers it"):
                    await hostile.set_low_water_mark(0, -1)

    asyncio.run(as_a_server())
    assert [(m, lwm) for _, m, lwm in asyncio.run(logs(cluster))] == [(m, lwm) for _, m, lwm in before]
    assert len(cluster.replica_digests({0: mark})[0]) == 1

    kept = first + KEPT - 1

    async def as_the_admin() -> None:
        for node in cluster.storages:
            async with StorageAdminClient(
                node.admin_address, cluster.cluster_key, 1, tls=files.tls("admin")
            ) as admin:
                answer = await admin.truncate_below_committed(0, kept, operator="test", reason="poison")
                assert answer.max_transaction_id == kept

    asyncio.run(as_the_admin())
    cluster.restart_server(0)
    cluster.wait_ready(120)
    # The next recovery resolves the high-water mark from what the replicas hold, and the log
    # goes on from there on every replica.
    after = MemoryStore({0: -1})
    with WaltzClient(after, client_config(cluster)) as client:
        assert client.get_high_water_mark(0) == kept
        assert client.submit(Append(0, b"after the truncation")).result(60).transaction_id == kept + 1
        assert client.wait_applied(0, kept + 1, 60)
    assert [a.data for a in after.applied[0]][-1] == b"after the truncation"
    assert len(cluster.replica_digests({0: kept + 1})[0]) == 1
    assert all(m == kept + 1 and lwm >= kept for _, m, lwm in asyncio.run(logs(cluster)))


def test_a_truncation_below_what_the_archive_holds_is_refused_by_the_tool_and_the_node(
    secured: LocalCluster, tmp_path: Path
) -> None:
    """Archived transactions stay in the archive: truncating them away on the replicas would have
    readers below the local start read them back in place of the transactions committed next under
    their IDs. ``waltz cluster storage truncate-committed`` refuses before touching a node, and the
    node refuses the admin request itself; nothing changes (docs/design/archive.md, "Reads below the
    local start")."""
    cluster = secured
    files = certificates(cluster)
    store = MemoryStore({0: -1})
    with WaltzClient(store, client_config(cluster)) as client:
        outcomes = [client.submit(Append(0, f"archived {i}".encode())).result(60) for i in range(COMMITTED)]
    mark = max(o.transaction_id for o in outcomes)
    env = cluster.admin_env("admin")
    archived = CliRunner().invoke(
        waltz_app,
        ["archive", "run", "--to", str(tmp_path / "archive"), "--once", "--seal-after", "0"],
        env=env,
    )
    assert archived.exit_code == 0, archived.output
    cluster.stop_server(0)  # as the operator's procedure says
    before = asyncio.run(logs(cluster))
    node = cluster.storages[0]
    refused = CliRunner().invoke(
        waltz_app,
        [
            "cluster",
            "storage",
            "truncate-committed",
            node.address,
            "-p",
            "0",
            "--to",
            str(mark - KEPT),
            "--yes",
        ],
        env=env,
    )
    assert refused.exit_code == 1, refused.output
    assert (
        f"archive ({tmp_path / 'archive'}) holds the partition through transaction {mark}" in refused.output
    )
    assert "waltz db skip" in refused.output and "nothing was changed" in refused.output

    async def as_the_admin() -> None:
        async with StorageAdminClient(
            node.admin_address, cluster.cluster_key, 1, tls=files.tls("admin")
        ) as admin:
            with pytest.raises(
                StorageRpcError, match=f"the archive holds this partition through transaction {mark}"
            ):
                await admin.truncate_below_committed(0, mark - KEPT, operator="test", reason="poison")

    asyncio.run(as_the_admin())
    assert asyncio.run(logs(cluster)) == before
