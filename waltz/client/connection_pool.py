"""The network clients of one Waltz client: one live :class:`ServerConnection` per server endpoint.

Source: docs/design/client.md "The client's parts" (a network client map keyed by endpoint) and
"Reconnect" (a broken network client is replaced by a new one with the next sequence number). Runs
on the client's event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from waltz.client.connection import MessagesHandler, ServerConnection
from waltz.protocol.channels import TlsConfig

__all__ = ["CONNECT_TIMEOUT", "ConnectionPool"]

log = logging.getLogger(__name__)

#: Seconds to wait for a server to accept a connection.
CONNECT_TIMEOUT = 3.0


class ConnectionPool:
    """Connections by endpoint; each new one gets the next network client sequence number.

    Args:
        on_messages: called with each batch of server messages received on any connection.
        on_lost: called once when a connection breaks (after it left the pool).
        tls: TLS files for the connections, or None for plaintext.
        max_message_bytes: the gRPC message size limit.
    """

    def __init__(
        self,
        *,
        on_messages: MessagesHandler,
        on_lost: Callable[[ServerConnection], None],
        tls: TlsConfig | None,
        max_message_bytes: int,
    ) -> None:
        self._on_messages = on_messages
        self._on_lost = on_lost
        self._tls = tls
        self._max_message_bytes = max_message_bytes
        self._connections: dict[str, ServerConnection] = {}
        self._connecting: dict[str, asyncio.Task[ServerConnection]] = {}
        self._network_seq = 0
        self._closed = False
        self._closing: set[asyncio.Task[None]] = set()

    async def get(self, endpoint: str) -> ServerConnection:
        """A live connection to ``endpoint``; a new network client if there is none.

        Concurrent callers share one connection attempt.

        Raises:
            ConnectionError: the server did not accept a connection in time, or the pool is closed.
        """
        existing = self._connections.get(endpoint)
        if existing is not None and not existing.closed:
            return existing
        task = self._connecting.get(endpoint)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._connect(endpoint))
            # Callers may stop waiting (their own timeout): the failure is theirs to report, not
            # asyncio's "exception was never retrieved".
            task.add_done_callback(_retrieve_exception)
            self._connecting[endpoint] = task
        return await asyncio.shield(task)

    async def _connect(self, endpoint: str) -> ServerConnection:
        try:
            if self._closed:
                raise ConnectionError("the client is closed")
            self._network_seq += 1
            connection = ServerConnection(
                endpoint,
                self._network_seq,
                on_messages=self._on_messages,
                on_closed=self._closed_connection,
                tls=self._tls,
                max_message_bytes=self._max_message_bytes,
            )
            await connection.open(CONNECT_TIMEOUT)
            self._connections[endpoint] = connection
            log.debug("connected to %s (network client %d)", endpoint, connection.seq_num)
            return connection
        finally:
            self._connecting.pop(endpoint, None)

    def _closed_connection(self, connection: ServerConnection, error: BaseException | None) -> None:
        if self._connections.get(connection.endpoint) is connection:
            del self._connections[connection.endpoint]
        try:
            self._on_lost(connection)
        finally:
            task = asyncio.get_running_loop().create_task(connection.close())  # free its channel
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    def abort_all(self, reason: str) -> None:
        """Break every connection now, as a network failure would (fault injection)."""
        for connection in list(self._connections.values()):
            connection.abort(ConnectionError(reason))

    async def close(self) -> None:
        """Close every connection (without reporting them lost). Idempotent."""
        self._closed = True
        for task in list(self._connecting.values()):
            task.cancel()
        connections, self._connections = list(self._connections.values()), {}
        for connection in connections:
            await connection.close()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)


def _retrieve_exception(task: asyncio.Task[ServerConnection]) -> None:
    if not task.cancelled():
        task.exception()
