"""The health of ZooKeeper as the console shows it: its session, and each server of the ensemble.

Design: docs/design/console.md "ZooKeeper health". The console's own session says whether the
ensemble serves it (and how long a read takes); each server of the connect string is asked the
``srvr`` four-letter word for its mode (leader, follower, standalone), latency, connections and
last zxid. A server that does not whitelist ``srvr`` (``4lw.commands.whitelist``) is reported as
answering, without those details.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooClient

__all__ = ["EnsembleServer", "ZooKeeperHealth", "probe_ensemble", "read_round_trip"]

#: Bytes of a ``srvr`` reply read at most (a few hundred in practice).
MAX_REPLY = 16_384


@dataclass(frozen=True, slots=True)
class EnsembleServer:
    """One ZooKeeper server of the connect string.

    Attributes:
        address: ``host:port`` as in the connect string.
        reachable: it answered on its client port.
        mode: ``leader``, ``follower``, ``observer`` or ``standalone``; None when unknown.
        version: its version line, or None.
        latency: ``min/avg/max`` request latency in ms, as it reports it, or None.
        connections: its client connections, or None.
        zxid: its last zxid (hex), or None.
        error: why it did not answer (or did not say more), or None.
    """

    address: str
    reachable: bool
    mode: str | None = None
    version: str | None = None
    latency: str | None = None
    connections: int | None = None
    zxid: str | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class ZooKeeperHealth:
    """ZooKeeper seen from the console.

    Attributes:
        connect_string: the connect string.
        session_state: the console's session: ``CONNECTED``, ``SUSPENDED`` or ``LOST``.
        round_trip_ms: milliseconds a read of the cluster root took, or None when it failed.
        servers: each server of the connect string.
    """

    connect_string: str
    session_state: str
    round_trip_ms: float | None
    servers: tuple[EnsembleServer, ...]

    @property
    def healthy(self) -> bool:
        """The session is connected and a majority of the servers answer."""
        up = sum(1 for s in self.servers if s.reachable)
        return self.session_state == "CONNECTED" and up > len(self.servers) // 2

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "connect_string": self.connect_string,
            "session_state": self.session_state,
            "round_trip_ms": self.round_trip_ms,
            "healthy": self.healthy,
            "servers": [
                {
                    "address": s.address,
                    "reachable": s.reachable,
                    "mode": s.mode,
                    "version": s.version,
                    "latency": s.latency,
                    "connections": s.connections,
                    "zxid": s.zxid,
                    "error": s.error,
                }
                for s in self.servers
            ],
        }


def _addresses(connect_string: str) -> list[tuple[str, int]]:
    hosts = connect_string.split("/", 1)[0]
    found = []
    for item in hosts.split(","):
        host, _, port = item.strip().rpartition(":")
        if not host:
            host, port = item.strip(), "2181"
        found.append((host.strip("[]"), int(port) if port.isdigit() else 2181))
    return found


def _parse_srvr(address: str, reply: str) -> EnsembleServer:
    values: dict[str, str] = {}
    for line in reply.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            values[key.strip().lower()] = value.strip()
    if "mode" not in values:
        return EnsembleServer(address, True, error=reply.strip()[:200] or "empty srvr reply")
    connections = values.get("connections", "")
    return EnsembleServer(
        address,
        True,
        mode=values["mode"],
        version=values.get("zookeeper version", "").split(",", 1)[0] or None,
        latency=values.get("latency min/avg/max"),
        connections=int(connections) if connections.isdigit() else None,
        zxid=values.get("zxid"),
    )


async def _srvr(host: str, port: int, timeout: float) -> EnsembleServer:
    address = f"{host}:{port}"
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(host, port)
            try:
                writer.write(b"srvr")
                await writer.drain()
                reply = await reader.read(MAX_REPLY)
            finally:
                writer.close()
    except (OSError, TimeoutError) as exc:
        return EnsembleServer(address, False, error=f"{type(exc).__name__}: {exc}".rstrip(": "))
    return _parse_srvr(address, reply.decode("utf-8", errors="replace"))


def read_round_trip(zk: KazooClient, path: str) -> float | None:
    """Milliseconds an ``exists`` of ``path`` takes on the session (blocking), or None if it failed."""
    started = time.perf_counter()
    try:
        zk.exists(path)
    except Exception:  # any failure of the session is what this measures
        return None
    return (time.perf_counter() - started) * 1000.0


async def probe_ensemble(
    zk: KazooClient, connect_string: str, root: str, *, timeout: float
) -> ZooKeeperHealth:
    """Look at ZooKeeper: the session's state and a read's round trip, and each server's ``srvr``.

    Args:
        zk: the console's started kazoo client.
        connect_string: its connect string (``host:port[,host:port...][/chroot]``).
        root: a znode to read for the round trip (the cluster root).
        timeout: seconds for each server and for the read.
    """
    servers = asyncio.gather(*(_srvr(host, port, timeout) for host, port in _addresses(connect_string)))
    try:
        async with asyncio.timeout(timeout):
            round_trip = await asyncio.to_thread(read_round_trip, zk, root)
    except TimeoutError:
        round_trip = None
    return ZooKeeperHealth(connect_string, str(zk.state), round_trip, tuple(await servers))
