"""A TCP proxy of our own for fault tests: forwards loopback connections and cuts them on demand.

It runs an asyncio loop on a background thread. ``cut()`` closes every live connection at once, in
whatever state it is (a request half sent, a response half received); new connections are accepted
again right away, like after a network blip.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Callable


class TcpProxy:
    """Forwards ``127.0.0.1:<port>`` to the address ``target()`` returns when a connection opens."""

    def __init__(self, target: Callable[[], tuple[str, int]]) -> None:
        self._target = target
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port: int = probe.getsockname()[1]
        self._loop = asyncio.new_event_loop()
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.base_events.Server | None = None
        self.connections = 0
        self.cuts = 0
        started = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(started,), name="tcp-proxy", daemon=True)
        self._thread.start()
        if not started.wait(10):
            raise RuntimeError("the TCP proxy did not start")

    def _run(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._accept, "127.0.0.1", self.port)
        )
        started.set()
        self._loop.run_forever()

    async def _accept(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        host, port = self._target()
        try:
            server_reader, server_writer = await asyncio.open_connection(host, port)
        except OSError:
            client_writer.close()
            return
        self.connections += 1
        self._writers.update((client_writer, server_writer))

        async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                while chunk := await reader.read(65536):
                    writer.write(chunk)
                    await writer.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                self._writers.discard(writer)
                writer.close()

        await asyncio.gather(pipe(client_reader, server_writer), pipe(server_reader, client_writer))

    def cut(self) -> None:
        """Close every live connection now (both directions, mid-stream)."""

        def close_all() -> None:
            for writer in list(self._writers):
                transport = writer.transport
                with contextlib.suppress(Exception):
                    transport.abort()
            self._writers.clear()

        self._loop.call_soon_threadsafe(close_all)
        self.cuts += 1

    def close(self) -> None:
        """Stop accepting, cut everything and stop the thread."""
        self.cut()

        async def stop() -> None:
            if self._server is not None:
                self._server.close()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
