"""Fixtures for storage node tests: real storage processes over real sockets."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import support
from support.storage import NUM_PARTITIONS, run

from waltz.local.nodes import LocalStorageNode
from waltz.protocol.storage_client import StorageAdminClient


@pytest.fixture
def cluster_key() -> str:
    return str(uuid.uuid4())


@pytest.fixture
def start_storage(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Callable[..., LocalStorageNode]]:
    """Start storage node processes (killed at teardown, even when the test fails).

    A failed test's report shows the tail of each node's log.
    """
    nodes: list[LocalStorageNode] = []

    def start(directory: Path | None = None, name: str = "storage", **kwargs: Any) -> LocalStorageNode:
        node = LocalStorageNode(
            directory or tmp_path / f"{name}-{len(nodes)}",
            name=name,
            log_path=tmp_path / f"{name}-{len(nodes)}.log",
            **kwargs,
            insecure=True,
        )
        nodes.append(node)
        support.add_failure_logs(request.node, f"{name} log", node.process.log_tail)
        node.start()
        return node

    yield start
    for node in nodes:
        node.close()


@pytest.fixture
def storage_node(start_storage: Callable[..., LocalStorageNode], cluster_key: str) -> LocalStorageNode:
    """A running storage node initialised for ``cluster_key`` with partitions 0 and 1 assigned."""
    node = start_storage()

    async def init() -> None:
        async with StorageAdminClient(node.admin_address, cluster_key, NUM_PARTITIONS) as admin:
            await admin.assign_partition(0, True)
            await admin.assign_partition(1, True)

    run(init())
    return node
