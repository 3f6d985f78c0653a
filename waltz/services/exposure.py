"""Where a node may serve without mutual TLS (docs/operations.md, "Roles"; docs/design/overview.md,
"Roles").

A storage node or server bound to a loopback address (``127.0.0.0/8``, ``::1``, ``localhost``) is
reachable from this host only, and may serve without client certificates, with a warning. Bound
to any other address (a routable one, ``0.0.0.0``, ``::``, a host name) it refuses to start
unless mutual TLS is configured (certificate, key and CA file: every peer then presents a
certificate naming its roles), or the node's ``insecure`` setting says, on purpose, that it
serves without; that node then logs so at every start.
"""

from __future__ import annotations

import ipaddress

__all__ = ["is_loopback", "plaintext_refusal"]


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address, ``[v6]`` form included, or ``localhost``) is loopback only.

    Host names other than ``localhost`` count as not loopback: what they resolve to can change.
    """
    name = host.strip().strip("[]")
    if name.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def plaintext_refusal(
    prefix: str, env_prefix: str, host: str, *, mutual_tls: bool, insecure: bool
) -> str | None:
    """Why a node bound to ``host`` may not start as configured, or None when it may.

    Args:
        prefix: the settings' key prefix (``storage``, ``server``).
        env_prefix: the environment variables' prefix (``WALTZ_STORAGE_``, ``WALTZ_SERVER_``).
        host: the address the node's ports bind to.
        mutual_tls: certificate, key and CA file are all set.
        insecure: the ``<prefix>.insecure`` setting.

    Returns:
        The refusal's message, naming the settings that lift it; None when ``host`` is loopback,
        mutual TLS is on, or ``insecure`` is set.
    """
    if mutual_tls or insecure or is_loopback(host):
        return None
    settings = f"{prefix}.ssl.certFile, {prefix}.ssl.keyFile and {prefix}.ssl.caFile"
    return (
        f"{prefix}.host {host!r} is not a loopback address, and mutual TLS is not configured: a node "
        f"other hosts can reach serves only with client certificates and roles. Set {settings} "
        '(docs/operations.md, "Roles"), '
        f"or {prefix}.insecure=true ({env_prefix}INSECURE=true) to serve without them on purpose"
    )
