"""The committed floor on a real storage node: no store session truncates below the partition's
low-water mark or lowers it, whatever key or certificate it holds; only an admin certificate over
mutual TLS truncates committed transactions, and the node logs it (docs/design/storage.md, "The
committed floor")."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from support.storage import NUM_PARTITIONS, run

from waltz.errors import StorageRpcError
from waltz.local.certificates import ClusterCertificates, make_cluster_certificates
from waltz.local.nodes import LocalStorageNode
from waltz.protocol.channels import TlsConfig
from waltz.protocol.records import Record, ReqId
from waltz.protocol.storage_client import StorageAdminClient, StorageSessionClient, StorageStreamError


def records(first: int, count: int) -> list[Record]:
    return [
        Record.create(t, ReqId(1, 1, 0, t), 0, f"record {t}".encode()) for t in range(first, first + count)
    ]


async def commit(
    node: LocalStorageNode, key: str, count: int, *, low_water_mark: int, tls: TlsConfig | None = None
) -> None:
    """Session 1 writes ``count`` records to partition 0; session 2's recovery then records that
    everything up to ``low_water_mark`` is committed, as a server's recovery does."""
    async with StorageSessionClient(node.address, key, NUM_PARTITIONS, 1, tls=tls) as first:
        await first.open_session(0)
        await first.append(0, records(0, count))
    async with StorageSessionClient(node.address, key, NUM_PARTITIONS, 2, tls=tls) as second:
        await second.open_session(0)
        await second.truncate(0, low_water_mark)
        await second.set_low_water_mark(0, low_water_mark)


async def log_of(
    node: LocalStorageNode, key: str, tls: TlsConfig | None = None
) -> tuple[int, int, list[Record]]:
    """Partition 0's max transaction ID, low-water mark and records, read on the admin port."""
    async with StorageAdminClient(node.admin_address, key, NUM_PARTITIONS, tls=tls) as admin:
        (status,) = (await admin.partition_status(0)).partitions
        return status.max_transaction_id, status.low_water_mark, await admin.records(0, 0, 100)


def test_a_session_with_only_the_key_cannot_truncate_committed_transactions(
    storage_node: LocalStorageNode, cluster_key: str
) -> None:
    """A plaintext node (no mutual TLS): a session at the fence + 1 cannot truncate below the
    low-water mark, nor lower it first; the log is unchanged, also after a restart."""

    async def attack() -> None:
        await commit(storage_node, cluster_key, 10, low_water_mark=9)
        before = await log_of(storage_node, cluster_key)
        assert before[:2] == (9, 9)
        async with StorageSessionClient(storage_node.address, cluster_key, NUM_PARTITIONS, 3) as hostile:
            # Refused before it takes the partition: the fence stays with session 2.
            for request in (hostile.truncate(0, -1), hostile.set_low_water_mark(0, -1)):
                with pytest.raises(StorageRpcError, match="the floor is 9"):
                    await request
            async with StorageAdminClient(storage_node.admin_address, cluster_key, NUM_PARTITIONS) as admin:
                (status,) = (await admin.partition_status(0)).partitions
                assert status.session_id == 2
            await hostile.open_session(0)
            with pytest.raises(StorageRpcError) as refused:
                await hostile.truncate(0, -1)
            assert refused.value.code == "INVALID_REQUEST"
            message = refused.value.remote_message
            assert "partition 0: refused to truncate to transaction -1" in message
            assert "the floor is 9" in message and "truncate-committed" in message
            with pytest.raises(StorageRpcError, match=r"refused to set the low-water mark to -1.*floor is 9"):
                await hostile.set_low_water_mark(0, -1)
            with pytest.raises(StorageRpcError, match="the floor is 9"):
                await hostile.truncate(0, 8)
            assert await hostile.max_transaction_id(0) == 9
        assert await log_of(storage_node, cluster_key) == before

    run(attack())
    storage_node.kill()
    storage_node.start()

    async def after_restart() -> None:
        async with StorageSessionClient(storage_node.address, cluster_key, NUM_PARTITIONS, 4) as hostile:
            with pytest.raises(StorageRpcError, match="the floor is 9"):
                await hostile.truncate(0, -1)
        max_transaction_id, low_water_mark, kept = await log_of(storage_node, cluster_key)
        assert (max_transaction_id, low_water_mark, kept) == (9, 9, records(0, 10))

    run(after_restart())


def test_recovery_truncations_above_the_floor_still_work(
    storage_node: LocalStorageNode, cluster_key: str
) -> None:
    """The truncations a recovery makes: an uncommitted tail down to the low-water mark, a replica
    that holds less than its low-water mark (lagging) to that mark, and a higher low-water mark."""

    async def scenario() -> None:
        await commit(storage_node, cluster_key, 10, low_water_mark=6)  # 7..9 were never committed
        assert (await log_of(storage_node, cluster_key))[:2] == (6, 6)
        async with StorageSessionClient(storage_node.address, cluster_key, NUM_PARTITIONS, 3) as session:
            await session.append(0, records(7, 5))  # an uncommitted tail: 7..11
            await session.truncate(0, 6)  # to the floor exactly
            assert await session.max_transaction_id(0) == 6
            await session.set_low_water_mark(0, 6)  # the same mark again
            await session.set_low_water_mark(0, 20)  # a lagging replica: the cluster is at 20
        async with StorageSessionClient(storage_node.address, cluster_key, NUM_PARTITIONS, 4) as session:
            await session.open_session(0)
            assert await session.last_session_info(0) == (3, 20)
            await session.truncate(0, 20)  # to its own low-water mark: removes nothing
            await session.truncate(0, 6)  # to its max: removes nothing
            with pytest.raises(StorageRpcError, match="the floor is 6"):
                await session.truncate(0, 5)
            assert await session.max_transaction_id(0) == 6

    run(scenario())


def test_the_override_needs_mutual_tls(storage_node: LocalStorageNode, cluster_key: str) -> None:
    """Without mutual TLS there is no admin certificate: the override is refused, with what it needs."""
    run(commit(storage_node, cluster_key, 10, low_water_mark=9))
    before = run(log_of(storage_node, cluster_key))

    async def override() -> None:
        async with StorageAdminClient(storage_node.admin_address, cluster_key, NUM_PARTITIONS) as admin:
            await admin.truncate_below_committed(0, -1, operator="no certificate")

    with pytest.raises(StorageStreamError, match=r"PERMISSION_DENIED.*urn:waltz:role:admin over mutual TLS"):
        run(override())
    assert run(log_of(storage_node, cluster_key)) == before


def test_only_an_admin_certificate_truncates_committed_transactions(
    start_storage: Callable[..., LocalStorageNode], cluster_key: str, tmp_path: Path
) -> None:
    """Mutual TLS with role certificates: a server certificate's store session is held to the floor
    like any other; the override is refused to the server, operator and client roles and done for
    the admin role, which the node's audit line names."""
    files: ClusterCertificates = make_cluster_certificates(tmp_path / "tls")
    node = start_storage(env=files.storage_env())
    admin_tls = files.tls("admin")

    async def setup() -> None:
        async with StorageAdminClient(
            node.admin_address, cluster_key, NUM_PARTITIONS, tls=admin_tls
        ) as admin:
            await admin.assign_partition(0, True)
        await commit(node, cluster_key, 10, low_water_mark=9, tls=files.tls("node"))

    run(setup())
    before = run(log_of(node, cluster_key, admin_tls))

    async def server_session() -> None:
        async with StorageSessionClient(
            node.address, cluster_key, NUM_PARTITIONS, 3, tls=files.tls("node")
        ) as s:
            with pytest.raises(StorageRpcError, match="the floor is 9"):
                await s.truncate(0, -1)
            with pytest.raises(StorageRpcError, match="the floor is 9"):
                await s.set_low_water_mark(0, -1)

    run(server_session())

    async def override(role: str) -> None:
        async with StorageAdminClient(
            node.admin_address, cluster_key, NUM_PARTITIONS, tls=files.tls(role)
        ) as admin:
            await admin.truncate_below_committed(0, 4, operator=f"as {role}")

    for role, refusal in (
        ("node", "the storage admin service needs"),
        ("operator", "truncate_below_committed needs a certificate with the role urn:waltz:role:admin"),
        ("client", "the storage admin service needs"),
    ):
        with pytest.raises(StorageStreamError, match=f"PERMISSION_DENIED.*{refusal}"):
            run(override(role))
    assert run(log_of(node, cluster_key, admin_tls)) == before

    async def as_admin() -> None:
        async with StorageAdminClient(
            node.admin_address, cluster_key, NUM_PARTITIONS, tls=admin_tls
        ) as admin:
            answer = await admin.truncate_below_committed(0, 4, operator="ops@example", reason="poison at 5")
        assert (answer.previous_max_transaction_id, answer.max_transaction_id) == (9, 4)
        assert (answer.previous_low_water_mark, answer.low_water_mark) == (9, 4)
        assert await log_of(node, cluster_key, admin_tls) == (4, 4, records(0, 5))
        # The next recovery starts from there: the mark set again, the log continued.
        async with StorageSessionClient(
            node.address, cluster_key, NUM_PARTITIONS, 4, tls=files.tls("node")
        ) as s:
            await s.set_low_water_mark(0, 4)
            await s.append(0, records(5, 2))
            with pytest.raises(StorageRpcError, match="the floor is 4"):
                await s.truncate(0, 3)

    run(as_admin())
    log_path = node.process.log_path
    assert log_path is not None
    audit = [line for line in log_path.read_text().splitlines() if "AUDIT truncate-below-committed" in line]
    assert len(audit) == 1, audit
    line = audit[0]
    assert " WARNING " in line and "waltz.services.storage.audit" in line
    assert (
        "partition 0 truncated from transaction 9 to 4 (5 record(s) removed), low-water mark 9 -> 4" in line
    )
    assert "CN=waltz-admin" in line and "'ops@example'" in line and "'poison at 5'" in line
