"""The process's shared event loop (docs/design/client.md, "The client's parts"): the synchronous
tools that call gRPC's asyncio layer run on it, so that reading replicas beside a client leaves no
"Event loop is closed" error of gRPC's poller on the log."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.client.client_helpers import Append, MemoryStore
from waltz import WaltzClient, WaltzClientConfig
from waltz.admin.storage_nodes import call_admin_on_nodes
from waltz.errors import StorageRpcError
from waltz.local.cluster import LocalCluster
from waltz.local.nodes import LocalStorageNode
from waltz.protocol.event_loop import run_on_shared_loop, shared_event_loop
from waltz.protocol.storage_client import StorageAdminClient, StorageSessionClient


def test_replica_reads_beside_a_client_log_no_event_loop_error(
    cluster: LocalCluster,
    client_config: WaltzClientConfig,
    log_start: dict[int, int],
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = MemoryStore(log_start)
    caplog.set_level(logging.WARNING, logger="asyncio")
    with WaltzClient(store, client_config) as client:
        for i in range(20):
            client.submit(Append(i % 2, b"x", header=i)).result(30)
        marks = {pid: client.get_high_water_mark(pid) for pid in (0, 1)}
        for _ in range(30):
            digests = cluster.replica_digests(marks)
            assert all(len(d) == 1 for d in digests.values()), digests
    errors = [r for r in caplog.records if r.name == "asyncio" and r.levelno >= logging.ERROR]
    assert errors == [], "\n".join(r.getMessage() + "\n" + str(r.exc_info) for r in errors)


def test_run_on_shared_loop_returns_the_result_and_raises_the_error() -> None:
    async def answer() -> int:
        await asyncio.sleep(0)
        return 42

    async def refuse() -> None:
        raise ValueError("refused")

    assert run_on_shared_loop(answer()) == 42
    with pytest.raises(ValueError, match="refused"):
        run_on_shared_loop(refuse())


def test_run_on_shared_loop_refuses_the_loops_own_thread() -> None:
    loop, _ = shared_event_loop()

    async def nested() -> str:
        async def inner() -> int:
            return 1

        try:
            run_on_shared_loop(inner())
        except RuntimeError as exc:
            return str(exc)
        return "ran"

    outcome = asyncio.run_coroutine_threadsafe(nested(), loop).result(10)
    assert outcome == "run_on_shared_loop called on the shared event loop's own thread"


#: The tasks a storage stream runs on the loop: its reader, and gRPC's request and status tasks.
STREAM_TASKS = (
    "_OrderedStream._read",
    "_StreamRequestMixin._consume_request_iterator",
    "_AioCall._handle_status_once_received",
)


def _stream_tasks() -> set[asyncio.Task[Any]]:
    async def pending() -> set[asyncio.Task[Any]]:
        await asyncio.sleep(0.3)  # what a close sets going has ended by then
        return {t for t in asyncio.all_tasks() if any(name in repr(t.get_coro()) for name in STREAM_TASKS)}

    return run_on_shared_loop(pending())


@pytest.fixture
def keyed_node(tmp_path: Path) -> Iterator[LocalStorageNode]:
    """A started storage node that an admin open with a cluster key of its own initialised (so
    that any other key is refused with ``CLUSTER_KEY_MISMATCH``)."""
    node = LocalStorageNode(
        tmp_path / "storage", name="storage", log_path=tmp_path / "storage.log", insecure=True
    )
    with node:

        async def take(storage: str, admin: StorageAdminClient) -> None:
            await admin.assign_partition(0, True)

        taken = run_on_shared_loop(
            call_admin_on_nodes({node.address: node.admin_address}, str(uuid.uuid4()), 2, take)
        )
        assert taken[node.address].failure is None
        yield node


def test_an_admin_open_the_node_refuses_leaves_no_stream_behind(keyed_node: LocalStorageNode) -> None:
    """A refused admin open (``CLUSTER_KEY_MISMATCH``) closes its stream: on the process's one
    loop, nothing of it stays pending."""
    before = _stream_tasks()

    async def nothing(storage: str, admin: StorageAdminClient) -> None:
        return None

    for _ in range(3):
        refused = run_on_shared_loop(
            call_admin_on_nodes({keyed_node.address: keyed_node.admin_address}, str(uuid.uuid4()), 2, nothing)
        )
        assert "CLUSTER_KEY_MISMATCH" in str(refused[keyed_node.address].failure)
    assert _stream_tasks() - before == set()


def test_a_refused_open_closes_its_own_stream_without_a_context_manager(keyed_node: LocalStorageNode) -> None:
    """``open()`` called on its own (as the server's stream pool and the committed reads call it),
    refused with ``CLUSTER_KEY_MISMATCH``, closes the stream before it raises: nothing of it stays
    pending on the loop, and the client refuses any further request as closed."""
    before = _stream_tasks()

    async def refused() -> list[str]:
        outcomes = []
        for _ in range(3):
            session = StorageSessionClient(keyed_node.address, str(uuid.uuid4()), 2, 1)
            admin = StorageAdminClient(keyed_node.admin_address, str(uuid.uuid4()), 2)
            for opening in (session.open(), admin.open()):
                with pytest.raises(StorageRpcError) as refusal:
                    await opening
                outcomes.append(refusal.value.code)
            with pytest.raises(ConnectionError, match="closed"):
                await session.open_session(0)
            with pytest.raises(ConnectionError, match="closed"):
                await admin.assign_partition(0, True)
        return outcomes

    assert run_on_shared_loop(refused()) == ["CLUSTER_KEY_MISMATCH"] * 6
    assert _stream_tasks() - before == set()
