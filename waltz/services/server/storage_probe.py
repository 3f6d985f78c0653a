"""Before a server joins its cluster: can it open a connection to the storage nodes at all?

Source: docs/design/server.md "What a server does" (the check before the membership). A server whose
``storage.ssl.*`` settings do not match the storage nodes' (plaintext against mutual TLS, another
CA) would otherwise register, be given partitions by the cluster manager and hold them unwritable:
its store sessions never open. The check tells such a misconfiguration from nodes that are merely
down: a node that accepts TCP connections but completes no gRPC connection with these settings
counts against the server; a node that refuses TCP (stopped, starting) counts for nothing. Only
when some nodes accept TCP and none of them completes a connection does the server refuse to
start. A node that completes the connection is then asked, with an empty store session stream,
whether the server's certificate may open store sessions (the server role): when every node that
answered refuses it, the server refuses to start at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterable

import grpc

from waltz.errors import ConfigurationError
from waltz.protocol import storage_pb2, storage_pb2_grpc
from waltz.protocol.channels import TlsConfig, missing_tls_file, open_channel, probe_tcp

__all__ = ["StorageUnusableError", "check_storage_connections"]

log = logging.getLogger(__name__)

#: Seconds each storage node has to accept the TCP connection, then the gRPC one.
PROBE_TIMEOUT = 5.0
#: Seconds the check tries again (a proxy that accepts TCP while its node starts) before it refuses.
PROBE_PERIOD = 20.0


class StorageUnusableError(ConfigurationError):
    """Storage nodes accept TCP connections, but none completes a connection with the server's
    ``storage.ssl.*`` settings."""


async def _no_requests() -> AsyncIterator[storage_pb2.StorageRequests]:
    return
    yield  # an async generator that yields nothing


async def _connects(address: str, tls: TlsConfig | None, timeout: float) -> bool | str:
    """Whether a connection to the node completes (False: not within ``timeout``); once it does,
    an empty store session stream asks the node whether this server's certificate may open store
    sessions at all: the node's refusal (its PERMISSION_DENIED text) is returned in place of True.
    Anything else the empty stream ends with leaves the connection counted as complete."""
    channel = open_channel(address, tls)
    try:
        try:
            await asyncio.wait_for(channel.channel_ready(), timeout)
        except TimeoutError:
            return False
        # No open request: an allowed peer's stream just ends.
        call = storage_pb2_grpc.StorageServiceStub(channel).Session(_no_requests(), timeout=timeout)
        try:
            async for _ in call:
                pass
        except grpc.aio.AioRpcError as exc:
            if exc.code() is grpc.StatusCode.PERMISSION_DENIED:
                return exc.details() or "PERMISSION_DENIED"
        return True
    finally:
        await channel.close(None)


async def check_storage_connections(
    storages: Iterable[str],
    tls: TlsConfig | None,
    *,
    timeout: float = PROBE_TIMEOUT,
    period: float = PROBE_PERIOD,
) -> None:
    """Refuse to start when the storage nodes are up but take no connection of this server.

    Args:
        storages: the storage nodes' connect strings (``host:port`` of their storage port).
        tls: the server's TLS files for storage connections (``storage.ssl.*``), or None.
        timeout: seconds for each node's TCP connection, then for its gRPC connection.
        period: seconds to try again while nodes accept TCP but no connection completes.

    Raises:
        StorageUnusableError: a ``storage.ssl.*`` file is missing; or every node that completed a
            connection refused the certificate's role for store sessions; or, for ``period``
            seconds, at least one node accepted TCP connections and none of those completed a
            connection (the message names the nodes and the settings to check).
    """
    if tls is not None:
        files = {"caFile": tls.ca_file, "certFile": tls.cert_file, "keyFile": tls.key_file}
        missing = missing_tls_file("storage.ssl", files)
        if missing is not None:
            raise StorageUnusableError(missing)
    addresses = sorted(set(storages))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + period
    while True:
        refusals = await asyncio.gather(*(probe_tcp(a, timeout) for a in addresses))
        up = [a for a, refused in zip(addresses, refusals, strict=True) if refused is None]
        if not up:
            if addresses:
                log.info(
                    "no storage node accepts connections yet (%s): starting anyway", ", ".join(addresses)
                )
            return
        connected = await asyncio.gather(*(_connects(a, tls, timeout) for a in up))
        if any(verdict is True for verdict in connected):
            return
        refused = {a: verdict for a, verdict in zip(up, connected, strict=True) if isinstance(verdict, str)}
        if refused:
            # Definitive: the nodes took the connection and refused the certificate's role.
            address, reason = sorted(refused.items())[0]
            raise StorageUnusableError(
                f"the storage nodes {', '.join(sorted(refused))} refuse this server's store sessions "
                f"(storage.ssl.certFile, WALTZ_STORE_TLS_CERT_FILE): {address} says: {reason}. Give the "
                "server a certificate of the server role. The server does not join the cluster, where it "
                "would be given partitions it could not write"
            )
        if loop.time() >= deadline:
            break
        log.warning(
            "the storage nodes %s accept TCP connections but none completed a connection: trying again "
            "for up to %.0fs",
            ", ".join(up),
            max(0.0, deadline - loop.time()),
        )
        await asyncio.sleep(1.0)
    if tls is None:
        settings = (
            "this server connects to them without TLS (storage.ssl.* unset); storage nodes that serve "
            "mutual TLS take a certificate of the server role: set storage.ssl.caFile, certFile and "
            "keyFile (WALTZ_STORE_TLS_CA_FILE, WALTZ_STORE_TLS_CERT_FILE, WALTZ_STORE_TLS_KEY_FILE)"
        )
    else:
        settings = (
            "check storage.ssl.caFile (the CA of the nodes' certificates), certFile and keyFile (a "
            "certificate of the server role), and that the nodes serve TLS"
        )
    raise StorageUnusableError(
        f"the storage nodes {', '.join(up)} accept TCP connections but none completed a connection "
        f"in {period:g}s: {settings}. The server does not join the cluster, where it would be "
        "given partitions it could not write"
    )
