"""TLS between a server's store partitions and the storage nodes (certificates from files)."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
import support
from kazoo.client import KazooClient
from support.storage import run
from support.tls import make_certificates

from waltz.local.nodes import LocalStorageNode
from waltz.metadata.values import (
    ClusterParams,
    ConnectionMetadata,
    GroupDescriptor,
    ReplicaAssignments,
)
from waltz.metadata.zk import ClusterZk
from waltz.protocol.channels import TlsConfig
from waltz.protocol.records import ReqId
from waltz.protocol.storage_client import StorageAdminClient
from waltz.services.server.store.config import StoreConfig
from waltz.services.server.store.store_partition import StorePartition


def test_store_sessions_over_tls(
    request: pytest.FixtureRequest, tmp_path: Path, zk_client: KazooClient, zk_root: str
) -> None:
    files = make_certificates(tmp_path)
    env = {
        "WALTZ_STORAGE_TLS_CERT_FILE": str(files["server"]),
        "WALTZ_STORAGE_TLS_KEY_FILE": str(files["server-key"]),
        "WALTZ_STORAGE_TLS_CA_FILE": str(files["ca"]),
    }
    tls = TlsConfig(ca_file=files["ca"], cert_file=files["client"], key_file=files["client-key"])
    nodes = [
        LocalStorageNode(tmp_path / f"s{i}", name=f"storage-{i}", log_path=tmp_path / f"s{i}.log", env=env)
        for i in range(3)
    ]
    params = ClusterParams("tls", 1, uuid.uuid4())
    key = str(params.cluster_key)
    zk = ClusterZk(zk_client, zk_root)
    try:
        for node in nodes:
            support.add_failure_logs(request.node, f"{node.process.name} log", node.process.log_tail)
            node.start()
        zk.create(
            params,
            ReplicaAssignments({n.address: (0,) for n in nodes}),
            GroupDescriptor({n.address: 0 for n in nodes}),
            ConnectionMetadata({n.address: n.admin_port for n in nodes}),
        )

        async def scenario() -> None:
            for node in nodes:
                async with StorageAdminClient(node.admin_address, key, 1, tls=tls) as admin:
                    await admin.assign_partition(0, True)
            config = StoreConfig(connect_timeout=2.0, request_timeout=5.0, retry_interval=0.2, tls=tls)
            partition = StorePartition(0, 1, zk, key, 1, config)
            partition.start()
            ids = await asyncio.gather(
                *(partition.submit(ReqId(1, 1, 0, i), 0, b"sealed") for i in range(20))
            )
            assert list(ids) == list(range(20))
            await partition.close()
            # Without the client certificate nothing reaches the storage nodes: no session writes.
            plain = StorePartition(0, 2, zk, key, 1, StoreConfig(connect_timeout=1.0, retry_interval=0.2))
            plain.start()
            with pytest.raises(TimeoutError):
                await plain.wait_writable(3.0)
            await plain.close()

        run(scenario())
    finally:
        for node in nodes:
            node.close()
