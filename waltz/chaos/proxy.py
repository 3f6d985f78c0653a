"""A TCP fault proxy: forwards loopback connections, and cuts, blocks or delays them on demand.

``waltz chaos`` puts one in front of every server (clients reach it through the server's
``server.advertisedEndpoint``) and one in front of every storage node (servers reach it through the
connect string registered in ZooKeeper), so that it can cut the network between client and server
and between server and storage, or slow it down (docs/chaos.md "What runs"). It grew from the test
proxy ``tests/support/proxy.py``.

The proxy runs an asyncio loop on a thread of its own::

    with FaultProxy(lambda: ("127.0.0.1", storage.port), name="storage-0") as proxy:
        proxy.cut()                 # abort every live connection now (mid-message)
        proxy.block()               # abort them, and refuse new ones until unblock()
        proxy.set_delay(0.2)        # deliver every byte 0.2 s after it was read (both directions)
        proxy.unblock(); proxy.set_delay(0.0)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Self

from waltz.local.processes import free_port

if TYPE_CHECKING:
    from waltz.local.cluster import LocalCluster
    from waltz.local.nodes import LocalStorageNode

__all__ = ["ClusterProxies", "FaultProxy", "forward_database"]

log = logging.getLogger(__name__)

#: Bytes read at once from a socket.
_CHUNK = 256 * 1024
#: Chunks read ahead of a delayed writer before reading pauses (bounds memory under delay).
_MAX_QUEUED = 256


class FaultProxy:
    """Forwards ``<host>:<port>`` to the address ``target()`` returns when a connection opens.

    Delivery keeps the byte order of each direction; a delay holds every chunk for that long after
    it was read (added latency, not a bandwidth limit). All methods are thread-safe.

    Args:
        target: returns ``(host, port)`` to connect to; called for every new connection, so the
            target may move (a restarted node on another port).
        name: a label for logs (``server-1``, ``storage-0``).
        port: the port to listen on (a free loopback port when None). A proxy that must keep its
            address across a cluster restart is kept alive, or created again with its old port.
        host: the address to listen on (127.0.0.1; a network lab's bridge address lets the lab's
            hosts reach a service of this machine that listens on loopback only).

    Raises:
        RuntimeError: the proxy's thread did not start listening within 10 s.
    """

    def __init__(
        self,
        target: Callable[[], tuple[str, int]],
        *,
        name: str = "proxy",
        port: int | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        self._target = target
        self.name = name
        self.host = host
        if port is None:
            port = free_port(host)
        self.port: int = port
        self._loop = asyncio.new_event_loop()
        self._transports: set[asyncio.WriteTransport] = set()
        self._server: asyncio.Server | None = None
        self._blocked = False
        self._delay = 0.0
        self._closed = False
        self._lock = threading.Lock()
        self.connections = 0
        """Connections forwarded so far."""
        self.refused = 0
        """Connections refused while blocked (or because the target refused them)."""
        self.cuts = 0
        """Calls of :meth:`cut` and :meth:`block`."""
        started = threading.Event()
        failure: list[BaseException] = []
        self._thread = threading.Thread(
            target=self._run, args=(started, failure), name=f"fault-proxy-{name}", daemon=True
        )
        self._thread.start()
        if not started.wait(10) or failure:
            self._loop.call_soon_threadsafe(self._loop.stop)
            raise RuntimeError(f"fault proxy {name} did not listen on port {port}: {failure or 'timeout'}")

    @property
    def address(self) -> str:
        """``<host>:<port>``: where to connect instead of the target."""
        return f"{self.host}:{self.port}"

    @property
    def blocked(self) -> bool:
        """True between :meth:`block` and :meth:`unblock`."""
        return self._blocked

    @property
    def delay(self) -> float:
        """Seconds every chunk is held back (0: none)."""
        return self._delay

    def _run(self, started: threading.Event, failure: list[BaseException]) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._server = self._loop.run_until_complete(
                asyncio.start_server(self._accept, self.host, self.port, reuse_address=True)
            )
        except OSError as exc:
            failure.append(exc)
            started.set()
            return
        started.set()
        try:
            self._loop.run_forever()
            pending = asyncio.all_tasks(self._loop)
            for task in pending:
                task.cancel()
            self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        finally:
            self._loop.close()

    async def _accept(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        if self._blocked:
            self.refused += 1
            client_writer.transport.abort()
            return
        try:
            host, port = self._target()  # the node's address now (it may have restarted elsewhere)
            server_reader, server_writer = await asyncio.open_connection(host, port)
        except OSError:
            self.refused += 1
            client_writer.transport.abort()
            return
        if self._blocked:  # blocked while connecting
            self.refused += 1
            client_writer.transport.abort()
            server_writer.transport.abort()
            return
        self.connections += 1
        transports = (client_writer.transport, server_writer.transport)
        self._transports.update(transports)
        try:
            await asyncio.gather(
                self._pipe(client_reader, server_writer), self._pipe(server_reader, client_writer)
            )
        except asyncio.CancelledError:
            # The proxy is closing (a delayed chunk may still be waiting). Ending normally keeps
            # asyncio's stream callback (Python 3.11) from logging the cancellation as an error.
            pass
        finally:
            for transport in transports:
                self._transports.discard(transport)
                transport.abort()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Copy one direction; with a delay, a queue between reading and writing keeps the order."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(_MAX_QUEUED)

        async def read() -> None:
            try:
                while chunk := await reader.read(_CHUNK):
                    await queue.put((time.monotonic() + self._delay, chunk))
            except (ConnectionError, OSError):
                pass
            finally:
                await queue.put((0.0, b""))

        async def write() -> None:
            try:
                while True:
                    due, chunk = await queue.get()
                    if not chunk:
                        break
                    wait = due - time.monotonic()
                    if wait > 0:
                        await asyncio.sleep(wait)
                    writer.write(chunk)
                    await writer.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                writer.transport.abort()

        reading = asyncio.ensure_future(read())
        try:
            await write()
        finally:
            reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reading

    def _abort_all(self) -> None:
        for transport in list(self._transports):
            with contextlib.suppress(Exception):
                transport.abort()
        self._transports.clear()

    def _call(self, action: Callable[[], None]) -> None:
        with self._lock:
            if not self._closed:
                self._loop.call_soon_threadsafe(action)

    def cut(self) -> None:
        """Abort every live connection now, in both directions, wherever their messages are.

        New connections are accepted again at once (a network blip).
        """
        self.cuts += 1
        self._call(self._abort_all)

    def block(self) -> None:
        """Abort every live connection and refuse new ones until :meth:`unblock` (a partition)."""
        self._blocked = True
        self.cuts += 1
        self._call(self._abort_all)

    def unblock(self) -> None:
        """Accept connections again."""
        self._blocked = False

    def set_delay(self, seconds: float) -> None:
        """Hold every chunk read from now on for ``seconds`` before writing it (0: no delay).

        Raises:
            ValueError: ``seconds`` is negative.
        """
        if seconds < 0:
            raise ValueError(f"a delay cannot be negative, got {seconds}")
        self._delay = seconds

    def close(self) -> None:
        """Stop listening, abort every connection and stop the thread. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True

        async def stop() -> None:
            if self._server is not None:
                self._server.close()
            self._abort_all()

        if self._thread.is_alive():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "blocked" if self._blocked else f"delay {self._delay:g}s"
        return f"FaultProxy({self.name}, {self.address}, {state}, {self.connections} connections)"


def forward_database(db_url: str, host: str) -> tuple[FaultProxy, str]:
    """A forwarder listening on ``host`` to the database server of ``db_url``, and the URL through it.

    A lab's hosts cannot reach this machine's loopback; a forwarder on the lab's bridge address
    stands in for a database host (the server sees connections from this machine).

    Args:
        db_url: a SQLAlchemy URL of a database server (PostgreSQL 5432, MySQL and MariaDB 3306
            when it names no port; no host means this machine's 127.0.0.1 over TCP).
        host: the address the forwarder listens on.

    Returns:
        ``(forwarder, url)``: the running forwarder (close it when done) and ``db_url`` with its
        host and port replaced by the forwarder's.
    """
    from sqlalchemy.engine import make_url

    url = make_url(db_url)
    port = url.port or (5432 if url.get_backend_name() == "postgresql" else 3306)
    forwarder = FaultProxy(lambda: (url.host or "127.0.0.1", port), name="database", host=host)
    return forwarder, url.set(host=forwarder.host, port=forwarder.port).render_as_string(hide_password=False)


class ClusterProxies:
    """A fault proxy in front of every server and every storage node of a local cluster.

    Clients reach a server through its proxy because the server advertises it
    (:meth:`server_args`); servers reach a storage node through its proxy because the connect string
    registered in ZooKeeper is the proxy's (:meth:`storage_connect_string`). The proxies follow the
    nodes across restarts (they look the node's address up at each connection), so a cluster can be
    stopped and started again behind the same proxies. With ``enabled`` False there are none, and
    the nodes are reached directly.

    Args:
        servers: the cluster's number of servers.
        storages: its number of storage nodes.
        enabled: make the proxies (False: a no-op set).

    Raises:
        RuntimeError: a proxy could not start (the ones started are closed).
    """

    def __init__(self, servers: int, storages: int, *, enabled: bool) -> None:
        self.cluster: LocalCluster | None = None
        """The cluster the proxies forward to (set by its maker before it starts)."""
        self.clients: list[FaultProxy] = []
        self.storages: list[FaultProxy] = []
        if not enabled:
            return
        try:
            for j in range(servers):
                self.clients.append(FaultProxy(self._server_target(j), name=f"server-{j}"))
            for i in range(storages):
                self.storages.append(FaultProxy(self._storage_target(i), name=f"storage-{i}"))
        except BaseException:
            self.close()
            raise

    def _running(self) -> LocalCluster:
        if self.cluster is None:
            raise ConnectionRefusedError("no cluster behind the fault proxies yet")
        return self.cluster

    def _server_target(self, index: int) -> Callable[[], tuple[str, int]]:
        def target() -> tuple[str, int]:
            server = self._running().servers[index]
            return server.host, server.port

        return target

    def _storage_target(self, index: int) -> Callable[[], tuple[str, int]]:
        def target() -> tuple[str, int]:
            node = self._running().storages[index]
            return node.host, node.port

        return target

    def server_args(self, index: int) -> list[str]:
        """Extra ``waltz server start`` options of server ``index`` (its advertised endpoint)."""
        if not self.clients:
            return []
        return ["--advertised-endpoint", self.clients[index].address]

    def storage_connect_string(self, node: LocalStorageNode) -> str:
        """The connect string registered in ZooKeeper for a storage node (its proxy's address)."""
        if not self.storages:
            return node.address
        index = int(node.process.name.rsplit("-", 1)[1])
        return self.storages[index].address

    def heal(self) -> None:
        """Unblock every proxy and remove every delay."""
        for proxy in self.clients + self.storages:
            proxy.unblock()
            proxy.set_delay(0.0)

    def close(self) -> None:
        """Close every proxy. Idempotent."""
        for proxy in self.clients + self.storages:
            proxy.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
