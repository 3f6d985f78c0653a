"""Roles of the peers of a mutual-TLS port, read from their certificates (docs/design/overview.md,
"Roles").

A certificate names its roles as subject alternative names of the form ``urn:waltz:role:<role>``
(one URI per role). With mutual TLS, every RPC of a Waltz server or storage node checks that its
peer's certificate carries a role that may make it:

- ``client``: the client service of servers (mount, append, feed, transaction data);
- ``server``: store sessions on storage nodes (a server's replica sessions);
- ``operator``: the read-only operations of the admin services (status, record reads, partition
  status, metrics; the storage admin open of an initialised node, which only checks the cluster
  key), and the nodes' ``/metrics`` and ``/health``;
- ``admin``: everything ``operator`` may do, and the operations that change or destroy the log:
  initialising an empty storage node (the admin open that creates its control file), appends
  without lock checks, partition assignment and file deletion, read and write switches, fences,
  truncations below the committed transactions (refused without mutual TLS too), store sessions
  of the recovery tools.

A node's own certificate (role ``server``) may also read ``/metrics`` and ``/health``
(:data:`METRICS_ROLES`).

Without mutual TLS a port has no peer identity to check (plaintext or server-only TLS): it
authorises nothing and every peer may call everything, which the nodes log at start-up.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
from collections.abc import AsyncIterator, Iterable
from typing import Any

import grpc

__all__ = [
    "ADMIN_ROLES",
    "CLIENT_ROLES",
    "INITIALISE_ROLES",
    "METRICS_ROLES",
    "OPERATOR_ROLES",
    "ROLE_URI_PREFIX",
    "STORE_SESSION_ROLES",
    "Role",
    "authorize",
    "denial",
    "peer_roles",
    "role_uri",
    "roles_of_certificate",
]

ROLE_URI_PREFIX = "urn:waltz:role:"

#: Seconds a refused streaming RPC waits for its first request before it ends.
REFUSAL_READ_TIMEOUT = 5.0


class Role(enum.Enum):
    """What the holder of a certificate may do (see the module docstring)."""

    CLIENT = "client"
    SERVER = "server"
    OPERATOR = "operator"
    ADMIN = "admin"


#: Roles that may use a server's client service.
CLIENT_ROLES = frozenset({Role.CLIENT})
#: Roles that may open store sessions on a storage node's storage port.
STORE_SESSION_ROLES = frozenset({Role.SERVER, Role.ADMIN})
#: Roles that may make the read-only admin requests.
OPERATOR_ROLES = frozenset({Role.OPERATOR, Role.ADMIN})
#: Roles that may make the admin requests that change or destroy the log.
ADMIN_ROLES = frozenset({Role.ADMIN})
#: Roles that may initialise an empty storage node (the admin open that creates its control file).
INITIALISE_ROLES = ADMIN_ROLES
#: Roles that may read a node's ``/metrics`` and ``/health``: the operators' (a scraper holds an
#: ``operator`` certificate) and the nodes' own; not applications (``client``).
METRICS_ROLES = frozenset({Role.OPERATOR, Role.ADMIN, Role.SERVER})


def role_uri(role: Role) -> str:
    """The subject alternative name URI that gives a certificate ``role``."""
    return ROLE_URI_PREFIX + role.value


@functools.lru_cache(maxsize=256)
def roles_of_certificate(pem: bytes) -> frozenset[Role]:
    """The roles a PEM certificate names (``urn:waltz:role:<role>`` URIs; unknown roles ignored).

    Raises:
        ValueError: ``pem`` is not a PEM certificate.
    """
    from cryptography import x509  # imported here: only mutual-TLS ports need it

    certificate = x509.load_pem_x509_certificate(pem)
    try:
        names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return frozenset()
    known = {role.value: role for role in Role}
    roles = set()
    for uri in names.get_values_for_type(x509.UniformResourceIdentifier):
        if uri.startswith(ROLE_URI_PREFIX):
            role = known.get(uri.removeprefix(ROLE_URI_PREFIX))
            if role is not None:
                roles.add(role)
    return frozenset(roles)


def peer_roles(context: grpc.aio.ServicerContext[Any, Any]) -> frozenset[Role] | None:
    """The roles of an RPC's peer, or None when it presented no certificate (no mutual TLS)."""
    certificates = list(context.auth_context().get("x509_pem_cert", ()))
    if not certificates:
        return None
    return roles_of_certificate(bytes(certificates[0]))


def denial(roles: frozenset[Role] | None, allowed: Iterable[Role], what: str) -> str | None:
    """Why a peer with ``roles`` may not do ``what`` (None: it may; no roles known: it may).

    Args:
        roles: the peer's roles (:func:`peer_roles`); None without mutual TLS.
        allowed: the roles any one of which allows it.
        what: the operation, for the message (e.g. "a store session").
    """
    allowed = frozenset(allowed)
    if roles is None or roles & allowed:
        return None
    needed = " or ".join(sorted(role_uri(role) for role in allowed))
    held = ", ".join(sorted(role.value for role in roles)) or "none"
    return (
        f"{what} needs a certificate with the role {needed} (this certificate's roles: {held}); "
        'see docs/operations.md, "Roles"'
    )


async def authorize(
    context: grpc.aio.ServicerContext[Any, Any],
    allowed: Iterable[Role],
    what: str,
    requests: AsyncIterator[Any] | None = None,
) -> None:
    """End the RPC with PERMISSION_DENIED unless its peer holds one of ``allowed`` (or has no
    certificate: no mutual TLS, nothing to check).

    Args:
        requests: a streaming RPC's request stream: its first message is read before the RPC
            ends, so that the peer sees the refusal rather than a broken stream.

    Raises:
        grpc.aio.AbortError: the peer may not (raised by ``context.abort``).
    """
    message = denial(peer_roles(context), allowed, what)
    if message is not None:
        if requests is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(anext(requests), REFUSAL_READ_TIMEOUT)
        await context.abort(grpc.StatusCode.PERMISSION_DENIED, message)
