"""Helpers shared by the peer benchmarks: the result record every case returns, and a raw stream
server for the cases that run their own processes (``bench_limits``, ``bench_skeleton``).

The row's keys are what ``run_all.py`` prints (docs/benchmarks.md, "The benchmark scripts").
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from waltz.perf.loadgen import LoadSpec
from waltz.perf.stats import RunStats

#: Conflict retries of one transaction before a benchmark gives it up as failed (every loop of a
#: benchmark is bounded; with 1,000 locks and 200 in flight a transaction retries about 0.2 times).
MAX_RETRIES = 1000


class TooManyRetriesError(RuntimeError):
    """A transaction conflicted :data:`MAX_RETRIES` times in a row: counted as failed."""


def result(
    system: str, config: str, settings: str, spec: LoadSpec | None, stats: RunStats, **extra: Any
) -> dict[str, Any]:
    """One row of the results table, JSON-ready.

    Args:
        system: the system's name (``waltz-py``, ``etcd``...).
        config: its topology (``1 partition, 1 server, RF 3``).
        settings: its batch/linger/durability settings, printed beside the figure.
        spec: the load offered (None for the machine-limit cases).
        stats: what was measured.
        extra: more keys (e.g. ``projection_lag_s``).

    Returns:
        ``system``, ``config``, ``settings``, ``load``, the figures of ``stats.summary()`` and the
        extra keys.
    """
    return {
        "system": system,
        "config": config,
        "settings": settings,
        "load": spec.describe() if spec is not None else "",
        **stats.summary(),
        **extra,
    }


#: Message size limit of the benchmarks' own gRPC servers and channels, both ways.
GRPC_OPTIONS = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]


def serve_stream(
    port: int, service: str, method: str, handler: Callable[[AsyncIterator[bytes], Any], Any]
) -> None:
    """Serve one raw-bytes bidirectional stream method (``/service/method``) on 127.0.0.1:``port``
    with ``grpc.aio`` until the process ends (the target of a benchmark's server process).

    Args:
        port: the port to listen on.
        service: the service's full name.
        method: the method's name.
        handler: the method's handler: it takes the request iterator and the context.
    """

    async def main() -> None:
        server = grpc.aio.server(options=GRPC_OPTIONS)
        server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    service, {method: grpc.stream_stream_rpc_method_handler(handler)}
                ),
            )
        )
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        await server.wait_for_termination()

    asyncio.run(main())
