"""The process's shared event loop (docs/design/client.md, "The client's parts"): the synchronous
tools that call gRPC's asyncio layer run on it, so that reading replicas beside a client leaves no
"Event loop is closed" error of gRPC's poller on the log."""

from __future__ import annotations

import asyncio
import logging

import pytest

from tests.client.client_helpers import Append, MemoryStore
from waltz import WaltzClient, WaltzClientConfig
from waltz.client.event_loop import run_on_shared_loop, shared_event_loop
from waltz.local.cluster import LocalCluster


def test_replica_reads_on_loops_of_their_own_beside_a_client_log_no_error(
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
