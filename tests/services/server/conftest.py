"""Fixtures for store tests: a cluster in ZooKeeper and real storage node processes."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
import support
from kazoo.client import KazooClient

from waltz.local.nodes import LocalStorageNode
from waltz.metadata.values import (
    ClusterParams,
    ConnectionMetadata,
    GroupDescriptor,
    ReplicaAssignments,
)
from waltz.metadata.zk import ClusterZk
from waltz.protocol.storage_client import StorageAdminClient


@dataclass
class StoreCluster:
    """A cluster's znodes plus its storage node processes."""

    zk: ClusterZk
    params: ClusterParams
    storages: list[LocalStorageNode]

    @property
    def cluster_key(self) -> str:
        return str(self.params.cluster_key)

    def storage(self, address: str) -> LocalStorageNode:
        return next(s for s in self.storages if s.address == address)


def make_store_cluster(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    zk_client: KazooClient,
    zk_root: str,
    storages: int = 3,
    partitions: int = 2,
    storage_env: Mapping[str, str] | None = None,
) -> Iterator[StoreCluster]:
    nodes = [
        LocalStorageNode(
            tmp_path / f"storage-{i}",
            name=f"storage-{i}",
            log_path=tmp_path / f"storage-{i}.log",
            env=storage_env,
            insecure=True,
        )
        for i in range(storages)
    ]
    try:
        for node in nodes:
            support.add_failure_logs(request.node, f"{node.process.name} log", node.process.log_tail)
            node.start()
        params = ClusterParams("test", partitions, uuid.uuid4())
        zk = ClusterZk(zk_client, zk_root)
        zk.create(
            params,
            ReplicaAssignments({n.address: tuple(range(partitions)) for n in nodes}),
            GroupDescriptor({n.address: 0 for n in nodes}),
            ConnectionMetadata({n.address: n.admin_port for n in nodes}),
        )

        async def assign() -> None:
            for node in nodes:
                async with StorageAdminClient(
                    node.admin_address, str(params.cluster_key), partitions
                ) as admin:
                    for pid in range(partitions):
                        await admin.assign_partition(pid, True)

        asyncio.run(assign())
        yield StoreCluster(zk, params, nodes)
    finally:
        for node in nodes:
            node.close()


@pytest.fixture
def store_cluster(
    request: pytest.FixtureRequest, tmp_path: Path, zk_client: KazooClient, zk_root: str
) -> Iterator[StoreCluster]:
    """Three storage node processes and a two-partition cluster in ZooKeeper, replicas everywhere."""
    yield from make_store_cluster(request, tmp_path, zk_client, zk_root)
