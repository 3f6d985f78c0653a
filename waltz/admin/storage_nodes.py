"""Talking to storage nodes through their admin port, with a time limit, on behalf of the cluster tool.

Design: docs/design/storage.md "Admin port". Every call opens one admin stream
(:class:`~waltz.protocol.storage_client.StorageAdminClient`: the admin open initialises a new node
for the cluster, or checks that the node belongs to it), runs some requests and closes the stream,
all within ``timeout`` seconds, so an unreachable or hung node never blocks a command. The admin
port never takes part in a store session, so nothing here fences a server.

Errors are split by what the user must do next: :class:`StorageUnreachableError` (the node did not
answer: start it, or fix its address) and :class:`~waltz.errors.StorageRpcError` (the node answered
and refused, e.g. ``CLUSTER_KEY_MISMATCH`` when it belongs to another cluster).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

import grpc

from waltz.errors import StorageRpcError, WaltzError
from waltz.metadata.values import ClusterParams
from waltz.protocol.channels import CLUSTER_TLS_SETTINGS, TlsConfig, probe_tcp, tls_settings_hint
from waltz.protocol.event_loop import run_on_shared_loop
from waltz.protocol.storage_client import StorageAdminClient, StorageStreamError

__all__ = [
    "DEFAULT_STORAGE_TIMEOUT",
    "NodeOutcome",
    "StorageAccessDeniedError",
    "StorageUnreachableError",
    "call_admin",
    "call_admin_on_nodes",
    "describe_failure",
    "probe_tcp",
    "run_admin",
]

log = logging.getLogger(__name__)

#: Seconds a command waits for one storage node (connect, admin open and its requests).
DEFAULT_STORAGE_TIMEOUT = 10.0

T = TypeVar("T")


#: What a storage node's admin port that does not answer asks of the operator first.
UNREACHABLE_HINT = "check that the node runs and that its admin port is right (waltz cluster list)"


class StorageUnreachableError(WaltzError, ConnectionError):
    """A storage node's admin port did not answer (refused, reset, or no answer in time).

    Attributes:
        admin_address: the ``host:admin_port`` that was tried.
    """

    _what = "is unreachable"

    def __init__(
        self,
        admin_address: str,
        reason: str,
        hint: str = UNREACHABLE_HINT,
    ) -> None:
        super().__init__(f"storage node admin port {admin_address} {self._what}: {reason}; {hint}")
        self.admin_address = admin_address


class StorageAccessDeniedError(StorageUnreachableError):
    """A storage node's admin port refused the request for the caller's role (mutual TLS).

    The node answered: its certificate check let the caller in, but the certificate does not name
    a role that may do this (docs/design/overview.md "Roles"). A kind of
    :class:`StorageUnreachableError` for the callers that only tell reached nodes from the others.
    """

    _what = "refused this certificate"

    def __init__(self, admin_address: str, reason: str) -> None:
        super().__init__(
            admin_address,
            reason,
            "use a certificate of the operator role to read, or of the admin role to change a node "
            "(cluster.ssl.certFile, cluster.ssl.keyFile)",
        )


async def call_admin(
    admin_address: str,
    cluster_key: str,
    num_partitions: int,
    work: Callable[[StorageAdminClient], Awaitable[T]],
    *,
    timeout: float = DEFAULT_STORAGE_TIMEOUT,
    tls: TlsConfig | None = None,
    initialise: bool = True,
    tls_settings: tuple[str, str] = CLUSTER_TLS_SETTINGS,
) -> T:
    """Open an admin stream to a storage node, run ``work`` on it, and close it, within ``timeout``.

    Args:
        admin_address: ``host:admin_port`` of the node.
        cluster_key: the cluster key (UUID text) sent in the admin open.
        num_partitions: the cluster's number of partitions, sent in the admin open.
        work: a coroutine function receiving the opened client.
        timeout: seconds for the whole call.
        tls: client TLS files, or None for plaintext.
        initialise: the admin open may initialise a node without a control file (False for a
            caller that only reads: such a node then answers ``NOT_INITIALIZED``).
        tls_settings: the settings ``tls`` came from, named by a failure's TLS hint
            (``cluster.ssl``; ``client.ssl`` for a client's tools).

    Returns:
        What ``work`` returned.

    Raises:
        StorageUnreachableError: the node did not answer, or not within ``timeout``.
        StorageAccessDeniedError: the node refused the caller's certificate role (a kind of
            StorageUnreachableError).
        StorageRpcError: the node refused a request (``CLUSTER_KEY_MISMATCH`` on the open when it
            belongs to another cluster or has another number of partitions).
    """

    async def run() -> T:
        async with StorageAdminClient(
            admin_address, cluster_key, num_partitions, tls=tls, initialise=initialise
        ) as admin:
            return await work(admin)

    hint = UNREACHABLE_HINT
    said = tls_settings_hint(tls, tls_settings)
    if said:
        hint = f"{hint}; {said}"
    try:
        return await asyncio.wait_for(run(), timeout)
    except TimeoutError:
        raise StorageUnreachableError(admin_address, f"no answer within {timeout:g}s", hint) from None
    except StorageRpcError:
        raise
    except StorageStreamError as exc:
        if exc.status is grpc.StatusCode.PERMISSION_DENIED:
            raise StorageAccessDeniedError(admin_address, str(exc)) from exc
        raise StorageUnreachableError(admin_address, str(exc), hint) from exc
    except (ConnectionError, OSError, grpc.RpcError) as exc:
        raise StorageUnreachableError(admin_address, str(exc), hint) from exc


def run_admin(
    admin_address: str,
    params: ClusterParams,
    work: Callable[[StorageAdminClient], Awaitable[T]],
    *,
    timeout: float = DEFAULT_STORAGE_TIMEOUT,
    tls: TlsConfig | None = None,
    initialise: bool = True,
    tls_settings: tuple[str, str] = CLUSTER_TLS_SETTINGS,
) -> T:
    """:func:`call_admin` for synchronous callers (on an event loop of its own).

    Raises:
        StorageUnreachableError, StorageRpcError: as :func:`call_admin`.
    """
    return run_on_shared_loop(
        call_admin(
            admin_address,
            str(params.cluster_key),
            params.num_partitions,
            work,
            timeout=timeout,
            tls=tls,
            initialise=initialise,
            tls_settings=tls_settings,
        )
    )


@dataclass(frozen=True, slots=True)
class NodeOutcome(Generic[T]):
    """The result of a call on one storage node: a value, or the error that stopped it.

    Attributes:
        value: what the call returned (None when it failed).
        error: :class:`StorageUnreachableError` or :class:`~waltz.errors.StorageRpcError`, or None.
    """

    value: T | None = None
    error: StorageUnreachableError | StorageRpcError | None = None

    @property
    def ok(self) -> bool:
        """True when the call succeeded."""
        return self.error is None

    @property
    def failure(self) -> str | None:
        """A one-line description of the error (:func:`describe_failure`), or None."""
        return None if self.error is None else describe_failure(self.error)

    @property
    def reachable(self) -> bool:
        """True unless the node did not answer (a refusal is an answer)."""
        return not isinstance(self.error, StorageUnreachableError)


async def call_admin_on_nodes(
    admin_addresses: Mapping[str, str],
    cluster_key: str,
    num_partitions: int,
    work: Callable[[str, StorageAdminClient], Awaitable[T]],
    *,
    timeout: float = DEFAULT_STORAGE_TIMEOUT,
    tls: TlsConfig | None = None,
    initialise: bool = True,
    log_failures: bool = True,
) -> dict[str, NodeOutcome[T]]:
    """Run :func:`call_admin` on several storage nodes at once; one node's failure stops no other
    (``initialise`` as for :func:`call_admin`; ``log_failures`` False: a caller that reports the
    failures itself, logged here at DEBUG only).

    Args:
        admin_addresses: storage connect string -> ``host:admin_port``.
        cluster_key: the cluster key (UUID text).
        num_partitions: the cluster's number of partitions.
        work: a coroutine function receiving the connect string and the opened client.
        timeout: seconds for each node's call (they run concurrently).
        tls: client TLS files, or None for plaintext.

    Returns:
        Storage connect string -> outcome, in the order of ``admin_addresses``.
    """

    async def one(storage: str, address: str) -> NodeOutcome[T]:
        async def bound(admin: StorageAdminClient) -> T:
            return await work(storage, admin)

        try:
            value = await call_admin(
                address, cluster_key, num_partitions, bound, timeout=timeout, tls=tls, initialise=initialise
            )
        except (StorageUnreachableError, StorageRpcError) as exc:
            log.log(
                logging.WARNING if log_failures else logging.DEBUG,
                "storage node %s (admin %s): %s",
                storage,
                address,
                exc,
            )
            return NodeOutcome(error=exc)
        return NodeOutcome(value=value)

    storages = list(admin_addresses)
    results = await asyncio.gather(*(one(s, admin_addresses[s]) for s in storages))
    return dict(zip(storages, results, strict=True))


def describe_failure(error: BaseException) -> str:
    """A one-line description of a storage node failure for reports."""
    if isinstance(error, StorageRpcError):
        hint = ""
        if error.code == "CLUSTER_KEY_MISMATCH":
            hint = (
                " (the node belongs to another cluster or has another number of partitions: "
                "give this cluster a fresh storage directory)"
            )
        return f"refused: {error.code}: {error.remote_message}{hint}"
    return str(error)
