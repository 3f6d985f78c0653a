"""The machine's limits: fsyncs per second, and records per second through one gRPC stream.

What no log on this machine can beat, beside the figures of the design's two costs: a durable
write (docs/design/storage.md, "Durability"; group commit:
docs/decisions/0001-group-commit-on-storage-nodes.md) and a stream message between processes
(docs/design/server.md, "Quorum writes and batching").

- fsync: append a 200-byte record to a file in the temporary directory and ``os.fsync`` it, one
  record per fsync; then 100 records per fsync (group commit). Latency is per fsync.
- gRPC stream: a ``grpc.aio`` server in another process acknowledges every message of one
  bidirectional stream; the client sends messages of ``batch`` 200-byte records with up to
  ``window`` messages unacknowledged. Latency is per message, from send to acknowledgement.
"""

from __future__ import annotations

import collections
import multiprocessing
import os
import struct
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc

from benchmarks.peers.common import result, serve_stream
from waltz.local.processes import free_port, wait_for_port
from waltz.perf.stats import RunStats

RECORD = 200
_METHOD = "/peerbench.Sink/Stream"


def fsync_case(records: int, per_fsync: int) -> dict[str, Any]:
    """Append ``records`` records of 200 bytes to a temporary file, fsync after every ``per_fsync``.

    Args:
        records: records in all.
        per_fsync: records written before each fsync.

    Returns:
        The result row (``common.result``'s keys; a "transaction" is a record).
    """
    stats = RunStats()
    chunk = b"r" * (RECORD * per_fsync)
    fd, path = tempfile.mkstemp(prefix="waltz-peer-fsync-")
    try:
        stats.started = time.time()
        for _ in range(max(1, records // per_fsync)):
            begun = time.perf_counter()
            os.write(fd, chunk)
            os.fsync(fd)
            stats.latency.record(time.perf_counter() - begun)
            stats.committed += per_fsync
            stats.payload_bytes += len(chunk)
        stats.ended = time.time()
    finally:
        os.close(fd)
        os.unlink(path)
    what = "fsyncs/s" if per_fsync == 1 else f"records/s, {per_fsync} per fsync"
    return result(
        "machine: fsync",
        f"{RECORD} B appends, {what}",
        f"{per_fsync} record(s) per write+fsync, file in {tempfile.gettempdir()}",
        None,
        stats,
    )


def _serve(port: int) -> None:
    async def stream(requests: Any, context: Any) -> Any:
        async for message in requests:
            yield struct.pack(">q", len(message))

    serve_stream(port, "peerbench.Sink", "Stream", stream)


def grpc_case(records: int, batch: int, window: int = 64, timeout: float = 300.0) -> dict[str, Any]:
    """Stream ``records`` records in messages of ``batch`` through one gRPC stream to another process.

    Args:
        records: records in all.
        batch: records per message.
        window: messages sent and not yet acknowledged, at most.
        timeout: seconds the stream may take.

    Returns:
        The result row (``common.result``'s keys; a "transaction" is a record).
    """
    port = free_port()
    context = multiprocessing.get_context("spawn")
    server = context.Process(target=_serve, args=(port,), daemon=True, name="peer-grpc-sink")
    server.start()
    stats = RunStats()
    try:
        wait_for_port("127.0.0.1", port, timeout=30, what="the gRPC sink")
        channel = grpc.insecure_channel(
            f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", 64 << 20)]
        )
        call = channel.stream_stream(_METHOD, request_serializer=None, response_deserializer=None)
        slots = threading.Semaphore(window)
        sent: collections.deque[float] = collections.deque()
        message = b"r" * (RECORD * batch)
        messages = max(1, records // batch)

        def requests() -> Iterator[bytes]:
            for _ in range(messages):
                if not slots.acquire(timeout=timeout):
                    return
                sent.append(time.perf_counter())
                yield message

        stats.started = time.time()
        for _ack in call(requests(), timeout=timeout):
            stats.latency.record(time.perf_counter() - sent.popleft())
            stats.committed += batch
            stats.payload_bytes += len(message)
            slots.release()
        stats.ended = time.time()
        channel.close()
    finally:
        server.kill()
        server.join(5)
    return result(
        "machine: gRPC stream",
        f"1 bidi stream, {batch} record(s) of {RECORD} B per message",
        f"batch {batch}, window {window} messages, no linger; server in another process",
        None,
        stats,
    )
