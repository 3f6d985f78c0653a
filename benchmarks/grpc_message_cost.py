"""The CPU one stream message costs: a gRPC (grpcio asyncio) bidirectional stream against a plain
asyncio TCP connection, back to back and paced, and what grpcio's threaded (sync) server spends on
the same stream.

Every hop of a Waltz commit is a stream message (client -> server -> storage nodes and back, then
the feed), so what one message costs a process bounds what a commit costs once batching has
nothing left to merge: at low load every transaction travels alone (docs/design/server.md,
"Quorum writes and batching"). This measures that floor on the machine at hand, with nothing of
Waltz in the way.

Two echo server processes listen on loopback ports of their own: one runs a grpcio asyncio server
and an asyncio TCP server on one event loop, the other a grpcio threaded server (``grpc.server``, a
handler thread per stream). The client is the same grpcio asyncio stream for both gRPC servers, so
the two gRPC rows differ only in the server they talk to. The client sends
``--messages`` messages of ``--size`` bytes one at a time, each answered before the next leaves
(a ping-pong), waiting ``gap`` milliseconds between them for each of ``--gaps``; it prints, per
transport and gap, the CPU time (user + system) the client process and the server process spent
per round trip, in microseconds, and the median round trip. A gap of 0 is the busy case; gaps of
milliseconds are the half-loaded services of a cluster, where each message wakes the process.

    .venv/bin/python -m benchmarks.grpc_message_cost [--messages 2000] [--size 300] [--gaps 0,1,5,15]

gRPC runs on the transport Waltz's processes use (``GRPC_EXPERIMENTS`` as ``waltz.tuning`` sets it,
printed first); export ``GRPC_EXPERIMENTS`` to measure another (empty: gRPC's defaults).

Prints a table; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import resource
import statistics
import time
from collections.abc import AsyncIterator
from typing import Any

from waltz.tuning import grpc_experiments_in_effect, tune_grpc_transport

# Before grpc is imported, here and in the echo processes (which import this module again and
# inherit the variable): the transport Waltz's own processes run on
# (docs/decisions/0080-grpc-core-without-the-event-engine.md). An exported GRPC_EXPERIMENTS is kept
# (empty: gRPC's own defaults).
tune_grpc_transport()

import grpc  # noqa: E402 - after the transport is chosen
from grpc import aio  # noqa: E402

SERVICE = "bench.Echo"
METHOD = "Session"
#: Seconds a series may take beyond its gaps before the run gives up.
SERIES_TIMEOUT = 60.0
#: Round trips before each measured series (connection set-up, first allocations).
WARMUP = 100


def _identity(message: bytes) -> bytes:
    return message


def _echo_handlers(echo: Any) -> tuple[grpc.GenericRpcHandler[bytes, bytes], ...]:
    """The echo stream's handlers for a server of either kind, ``echo`` its behaviour (an async
    generator for the asyncio server, a generator for the threaded one)."""
    handler = grpc.stream_stream_rpc_method_handler(
        echo, request_deserializer=_identity, response_serializer=_identity
    )
    return (grpc.method_handlers_generic_handler(SERVICE, {METHOD: handler}),)


async def _serve(ports: Any) -> None:
    async def echo(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        async for message in requests:
            yield message

    server = aio.server()
    server.add_generic_rpc_handlers(_echo_handlers(echo))
    grpc_port = server.add_insecure_port("127.0.0.1:0")
    await server.start()

    async def tcp_echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(data)
        writer.close()

    tcp = await asyncio.start_server(tcp_echo, "127.0.0.1", 0)
    tcp_port = tcp.sockets[0].getsockname()[1]
    ports.send((grpc_port, tcp_port))
    await server.wait_for_termination()


def _serve_threaded(ports: Any) -> None:
    """A grpcio threaded server of the same echo stream: its port goes to ``ports``; it serves
    until the process is terminated."""
    from concurrent.futures import ThreadPoolExecutor

    def echo(requests: Any, context: Any) -> Any:
        yield from requests

    server = grpc.server(ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers(_echo_handlers(echo))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    ports.send(port)
    server.wait_for_termination()


def _server_main(ports: Any) -> None:
    asyncio.run(_serve(ports))


def _cpu_seconds(pid: int | None = None) -> float:
    """CPU seconds (user + system) of this process, or of ``pid`` (read from /proc)."""
    if pid is None:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class _GrpcPeer:
    def __init__(self, port: int) -> None:
        self._channel = aio.insecure_channel(f"127.0.0.1:{port}")
        self._call: Any = None

    async def open(self) -> None:
        """Wait for the channel and open the stream."""
        await self._channel.channel_ready()
        method = self._channel.stream_stream(
            f"/{SERVICE}/{METHOD}", request_serializer=_identity, response_deserializer=_identity
        )
        self._call = method(None)

    async def round_trip(self, message: bytes) -> None:
        """Send one message and read its echo."""
        await self._call.write(message)
        await self._call.read()

    async def close(self) -> None:
        """End the stream and close the channel."""
        await self._call.done_writing()
        await self._channel.close(None)


class _TcpPeer:
    def __init__(self, port: int) -> None:
        self._port = port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        """Connect."""
        self._reader, self._writer = await asyncio.open_connection("127.0.0.1", self._port)

    async def round_trip(self, message: bytes) -> None:
        """Send one message and read its echo."""
        assert self._reader is not None and self._writer is not None
        self._writer.write(message)
        await self._reader.readexactly(len(message))

    async def close(self) -> None:
        """Close the connection."""
        assert self._writer is not None
        self._writer.close()
        await self._writer.wait_closed()


async def _series(
    peer: Any, messages: int, size: int, gap: float, server_pid: int
) -> tuple[float, float, float]:
    """(client µs, server µs, median round trip µs) per round trip over ``messages`` of them.

    Raises:
        TimeoutError: the series took :data:`SERIES_TIMEOUT` seconds longer than its gaps.
    """
    message = b"x" * size
    async with asyncio.timeout(SERIES_TIMEOUT + (WARMUP + messages) * gap):
        await peer.open()
        return await _timed(peer, messages, message, gap, server_pid)


async def _timed(
    peer: Any, messages: int, message: bytes, gap: float, server_pid: int
) -> tuple[float, float, float]:
    try:
        for _ in range(WARMUP):
            await peer.round_trip(message)
            if gap:
                await asyncio.sleep(gap)
        trips: list[float] = []
        client_before, server_before = _cpu_seconds(), _cpu_seconds(server_pid)
        for _ in range(messages):
            started = time.perf_counter()
            await peer.round_trip(message)
            trips.append(time.perf_counter() - started)
            if gap:
                await asyncio.sleep(gap)
        client = _cpu_seconds() - client_before
        server = _cpu_seconds(server_pid) - server_before
    finally:
        await peer.close()
    return client / messages * 1e6, server / messages * 1e6, statistics.median(trips) * 1e6


async def _measure(
    args: argparse.Namespace, ports: tuple[int, int, int], server_pids: tuple[int, int]
) -> None:
    grpc_port, tcp_port, threaded_port = ports
    asyncio_pid, threaded_pid = server_pids
    print(f"GRPC_EXPERIMENTS: {grpc_experiments_in_effect()}")
    print(f"{'transport':<22}{'gap ms':>8}{'client µs':>12}{'server µs':>12}{'round trip µs':>16}")
    for gap_ms in args.gaps:
        for name, make_peer, server_pid in (
            ("gRPC asyncio stream", lambda: _GrpcPeer(grpc_port), asyncio_pid),
            ("gRPC threaded server", lambda: _GrpcPeer(threaded_port), threaded_pid),
            ("asyncio TCP", lambda: _TcpPeer(tcp_port), asyncio_pid),
        ):
            peer = make_peer()
            client, server, trip = await _series(peer, args.messages, args.size, gap_ms / 1e3, server_pid)
            print(f"{name:<22}{gap_ms:>8g}{client:>12,.0f}{server:>12,.0f}{trip:>16,.0f}")


def main() -> None:
    """Parse the command line (``--help``), run the benchmark and print its figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--messages", type=int, default=2000, help="Measured round trips per series.")
    parser.add_argument("--size", type=int, default=300, help="Bytes per message.")
    parser.add_argument(
        "--gaps",
        type=lambda text: [float(part) for part in text.split(",")],
        default=[0.0, 1.0, 5.0, 15.0],
        help="Milliseconds between round trips, comma-separated (0: back to back).",
    )
    args = parser.parse_args()
    if args.messages < 1 or args.size < 1 or any(gap < 0 for gap in args.gaps):
        parser.error("--messages and --size must be positive and --gaps not negative")
    context = multiprocessing.get_context("spawn")
    servers = []
    try:
        ports: list[Any] = []
        for target in (_server_main, _serve_threaded):
            receive, send = context.Pipe(duplex=False)
            server = context.Process(target=target, args=(send,), daemon=True)
            server.start()
            send.close()  # the child's copy is the only writer: a server that dies ends the wait
            servers.append(server)
            try:
                started = receive.poll(30)
                port = receive.recv() if started else None
            except EOFError:  # it exited before sending its port
                port = None
            if port is None:
                raise SystemExit("an echo server did not start: it exited, or sent no port within 30 s")
            ports.append(port)
        (grpc_port, tcp_port), threaded_port = ports
        pids = (servers[0].pid, servers[1].pid)
        assert pids[0] is not None and pids[1] is not None
        asyncio.run(_measure(args, (grpc_port, tcp_port, threaded_port), (pids[0], pids[1])))
    finally:
        for server in servers:
            server.terminate()
            server.join(10)


if __name__ == "__main__":
    main()
