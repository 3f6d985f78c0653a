"""Fixtures of the admin tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import support

from waltz.local.nodes import LocalStorageNode


@pytest.fixture
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LocalStorageNode]:
    """One started storage node with no cluster yet, its log in the report of a failed test."""
    node = LocalStorageNode(
        tmp_path / "storage-0", name="storage-0", log_path=tmp_path / "storage-0.log", insecure=True
    )
    support.add_failure_logs(request.node, "storage-0 log", node.process.log_tail)
    try:
        node.start()
        yield node
    finally:
        node.close()
