"""Fixtures for storage node tests: real storage processes over real sockets."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from waltz.protocol.storage_client import StorageAdminClient
from waltz.services.local import LocalStorageNode

T = TypeVar("T")

NUM_PARTITIONS = 4


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to completion from a synchronous test."""
    return asyncio.run(coroutine)


@pytest.fixture
def cluster_key() -> str:
    return str(uuid.uuid4())


@pytest.fixture
def start_storage(tmp_path: Path) -> Iterator[Callable[..., LocalStorageNode]]:
    """Start storage node processes (killed at teardown, even when the test fails)."""
    nodes: list[LocalStorageNode] = []

    def start(directory: Path | None = None, name: str = "storage", **kwargs: Any) -> LocalStorageNode:
        node = LocalStorageNode(
            directory or tmp_path / f"{name}-{len(nodes)}",
            name=name,
            log_path=tmp_path / f"{name}-{len(nodes)}.log",
            **kwargs,
        )
        nodes.append(node)
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
